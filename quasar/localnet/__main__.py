"""``python -m quasar.localnet``: the same as ``quasar localnet`` (:mod:`quasar.localnet.cli`)."""

import sys

from quasar.localnet.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m quasar.localnet"))
