#!/usr/bin/env python3
"""The same as ``quasar local-validator`` (:mod:`quasar.tools.local_validator`), under its older name."""

import sys

from quasar.tools.local_validator import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/local_validator.py"))
