"""``python -m neurons.validator``: the same as ``quasar validator`` (:mod:`quasar.validator.cli`)."""

import sys

from quasar.validator.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m neurons.validator"))
