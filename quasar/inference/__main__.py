"""``python -m quasar.inference``: the same as ``quasar inference`` (:mod:`quasar.inference.cli`)."""

import sys

from quasar.inference.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m quasar.inference"))
