#!/usr/bin/env python3
"""The same as ``quasar bench harness`` (:mod:`quasar.bench.harness`), under its older name."""

import sys

from quasar.bench.harness import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/bench_harness.py"))
