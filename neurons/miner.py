"""QUASAR miner: ``python -m neurons.miner --wallet.name … --wallet.hotkey … --subtensor.network … --netuid …``.

Forks the QUASAR kernels on GitHub, optimizes them on this machine's GPU, commits and pushes
improvements, submits them to the submission API, and publishes the inference endpoint on
chain. Settings: ``.env``, the environment and the flags below (``python -m quasar.config``).
``--axon.port`` is accepted as the miner guide writes it; the port published on chain is the
inference server's (``MINER_INFERENCE_PORT``), which is what validators call.
"""

from __future__ import annotations

import argparse
import sys

from quasar import config
from quasar.log import setup_logging
from quasar.miner.runner import run_miner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neurons.miner", description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    _, settings = config.parse_args(parser, argv)
    setup_logging(settings.debug, secrets=settings.secrets())
    return run_miner(settings)


if __name__ == "__main__":
    sys.exit(main())
