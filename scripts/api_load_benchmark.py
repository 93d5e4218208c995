#!/usr/bin/env python3
"""The same as ``quasar bench api-load`` (:mod:`quasar.bench.api_load`), under its older name."""

import sys

from quasar.bench.api_load import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/api_load_benchmark.py"))
