"""``python -m neurons.miner`` (or ``python neurons/miner.py``): the same as ``quasar miner``
(:mod:`quasar.miner.cli`)."""

import sys

from quasar.miner.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m neurons.miner"))
