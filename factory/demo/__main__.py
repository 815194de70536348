"""`python -m factory.demo`: see `factory.demo.runner`."""

import sys

from factory.demo.runner import main

sys.exit(main())
