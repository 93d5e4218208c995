#!/usr/bin/env python3
"""The same as ``quasar bench floor`` (:mod:`quasar.bench.floor`), under its older name."""

import sys

from quasar.bench.floor import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/bench_floor.py"))
