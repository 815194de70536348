"""Configs as code: functions that return validated configs. A variant calls its base and changes
a few fields; nothing is built at import time."""
