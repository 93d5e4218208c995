"""``python -m quasar.evaluate``: the same as ``quasar evaluate`` (:mod:`quasar.evaluate.cli`)."""

import sys

from quasar.evaluate.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m quasar.evaluate"))
