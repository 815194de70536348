"""tests/kernels/interpreted holds the Triton kernels' tests: they need TRITON_INTERPRET=1 set
before `triton` is imported, so they run in their own pytest process
(test_triton_interpreted.py starts it) and are left out of this one."""

import os

collect_ignore = [] if os.environ.get("TRITON_INTERPRET") == "1" else ["interpreted"]
