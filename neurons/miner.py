"""QUASAR miner: ``python -m neurons.miner --wallet.name … --wallet.hotkey … --subtensor.network … --netuid …``.

Forks the QUASAR kernels on GitHub, optimizes them on this machine's GPU, commits and pushes
improvements, submits them to the submission API (``VALIDATOR_API_URL``, else the one the subnet
owner published on chain), and publishes the inference endpoint on chain. Settings: ``.env``, the
environment and the flags below (``python -m quasar.config``). The inference server is the miner's
axon: ``--axon.port`` is another spelling of ``--inference.port`` (``MINER_INFERENCE_PORT``, where it
listens), and what is published on chain is ``AXON_EXTERNAL_IP:AXON_EXTERNAL_PORT`` (by default
this machine's outward address and that port), which is what validators call.

``python -m neurons.miner status [--submission ID]`` (same wallet and API flags) prints this miner's
recent submissions and one in detail: state, each validator's verdict, reasons and figures.
"""

from __future__ import annotations

import argparse
import sys

from quasar import config
from quasar.log import setup_logging
from quasar.miner.runner import run_miner
from quasar.miner.status import run_status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m neurons.miner", usage="%(prog)s [-h] [run | status [--submission ID]] [FLAGS]",
        description="The QUASAR miner: mines (run, the default) or shows its submissions (status).")
    parser.add_argument("command", nargs="?", choices=("run", "status"), default="run", help=argparse.SUPPRESS)
    parser.add_argument("--submission", type=int, default=None, metavar="ID",
                        help="status: show only submission ID, in detail")
    config.add_arguments(parser, "miner")
    args, settings = config.parse_args(parser, argv)
    setup_logging(settings.debug, secrets=settings.secrets())
    if args.command == "status":
        return run_status(settings, args.submission)
    if args.submission is not None:
        parser.error("--submission goes with the status command")
    return run_miner(settings)


if __name__ == "__main__":
    sys.exit(main())
