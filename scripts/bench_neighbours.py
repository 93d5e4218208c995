#!/usr/bin/env python3
"""The same as ``quasar bench neighbours`` (:mod:`quasar.bench.neighbours`), under its older name."""

import sys

from quasar.bench.neighbours import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/bench_neighbours.py"))
