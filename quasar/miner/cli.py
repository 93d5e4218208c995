"""``quasar miner`` (``python -m neurons.miner``): the miner neuron; ``quasar status``: what became
of its submissions.

The miner forks the QUASAR kernels on GitHub, optimizes them on this machine's GPU, commits and
pushes improvements, submits them to the submission API (``VALIDATOR_API_URL``, else the one the
subnet owner published on chain), and publishes the inference endpoint on chain. Settings: ``.env``,
the environment and the flags (``quasar config``). The inference server is the miner's axon:
``--axon.port`` is another spelling of ``--inference.port`` (``MINER_INFERENCE_PORT``, where it
listens), and what is published on chain is ``AXON_EXTERNAL_IP:AXON_EXTERNAL_PORT`` (by default this
machine's outward address and that port), which is what validators call.

``quasar status [--submission ID]`` (same wallet and API flags; also ``quasar miner status``)
prints this miner's recent submissions and one in detail: state, each validator's verdict, reasons
and figures.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from quasar import config
from quasar.log import setup_logging
from quasar.terminal import WrappingParser

MINER_DESCRIPTION = "The QUASAR miner: mines (run, the default) or shows its submissions (status)."
STATUS_DESCRIPTION = (
    "This miner's recent submissions and one in detail: state, each validator's verdict, reasons and figures."
)


def _add_submission_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--submission", type=int, default=None, metavar="ID", help=help_text)


def build_parser(prog: str = "quasar miner", add_help: bool = True) -> argparse.ArgumentParser:
    """The miner's command line (``add_help=False``: without -h/--help, for one who adds its own)."""
    parser = WrappingParser(
        prog=prog,
        usage="%(prog)s [-h] [run | status [--submission ID]] [FLAGS]",
        description=MINER_DESCRIPTION,
        add_help=add_help,
    )
    parser.add_argument("command", nargs="?", choices=("run", "status"), default="run", help=argparse.SUPPRESS)
    _add_submission_argument(parser, "status: show only submission ID, in detail")
    config.add_arguments(parser, "miner")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "quasar miner") -> int:
    """Run the miner (or, with the ``status`` command, print its submissions); the exit status."""
    # Imported here: the START scripts' checks build the parser without the SDK (build_parser).
    from quasar.miner.runner import run_miner
    from quasar.miner.status import run_status

    parser = build_parser(prog)
    args, settings = config.parse_args(parser, argv)
    setup_logging(settings.debug, secrets=settings.secrets())
    if args.command == "status":
        return run_status(settings, args.submission)
    if args.submission is not None:
        parser.error("--submission goes with the status command")
    return run_miner(settings)


def status_main(argv: Sequence[str] | None = None, prog: str = "quasar status") -> int:
    """Print the miner's submissions; exit status 1 when the wallet cannot be read or the API
    refuses or cannot be reached."""
    from quasar.miner.status import run_status

    parser = WrappingParser(prog=prog, description=STATUS_DESCRIPTION)
    _add_submission_argument(parser, "show only submission ID, in detail")
    config.add_arguments(parser, "miner")
    args, settings = config.parse_args(parser, argv)
    setup_logging(settings.debug, secrets=settings.secrets())
    return run_status(settings, args.submission)
