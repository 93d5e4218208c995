#!/usr/bin/env python3
"""The same as ``quasar bench kernel`` (:mod:`quasar.bench.kernel`), under its older name."""

import sys

from quasar.bench.kernel import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/bench_kernel.py"))
