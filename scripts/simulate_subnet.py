#!/usr/bin/env python3
"""The same as ``quasar bench simulate-subnet`` (:mod:`quasar.bench.simulate_subnet`), under its older name."""

import sys

from quasar.bench.simulate_subnet import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/simulate_subnet.py"))
