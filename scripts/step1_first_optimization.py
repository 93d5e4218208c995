#!/usr/bin/env python3
"""``python scripts/step1_first_optimization.py``: the same as ``quasar step1`` (:mod:`quasar.tools.install_kernel`)."""

import sys

from quasar.tools.install_kernel import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/step1_first_optimization.py"))
