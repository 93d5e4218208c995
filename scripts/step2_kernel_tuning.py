#!/usr/bin/env python3
"""``python scripts/step2_kernel_tuning.py``: the same as ``quasar step2`` (:mod:`quasar.tools.tune_kernel`)."""

import sys

from quasar.tools.tune_kernel import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/step2_kernel_tuning.py"))
