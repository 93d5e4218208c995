#!/usr/bin/env python3
"""The same as ``quasar bench api-profile`` (:mod:`quasar.bench.api_profile`), under its older name."""

import sys

from quasar.bench.api_profile import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/api_profile.py"))
