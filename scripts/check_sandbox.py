#!/usr/bin/env python3
"""The same as ``quasar check-sandbox`` (:mod:`quasar.tools.check_sandbox`), under its older name."""

import sys

from quasar.tools.check_sandbox import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/check_sandbox.py"))
