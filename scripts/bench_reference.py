#!/usr/bin/env python3
"""The same as ``quasar bench reference`` (:mod:`quasar.bench.reference`), under its older name."""

import sys

from quasar.bench.reference import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/bench_reference.py"))
