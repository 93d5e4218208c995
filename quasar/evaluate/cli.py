"""``quasar evaluate REPO --target N``: evaluate a checked-out fork as a validator would.

Exit status: 0 when the verdict is pass, 1 when it is fail, 2 for bad arguments. The flags and the
start-up of the miner's other evaluating tools (``quasar local-validator``, ``step1``, ``step2``)
are here too: :func:`add_evaluation_arguments`, :func:`start` and :func:`options_from`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from quasar import config
from quasar.config import values
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import DEFAULT_SEQ_LENS, EvaluationInputError, EvaluationOptions, options_from_settings
from quasar.evaluate.report import render_report
from quasar.log import setup_logging


def parse_seq_lens(text: str) -> tuple[int, ...]:
    """``"512,1024,2k,1M"`` -> ``(512, 1024, 2000, 1000000)`` (:func:`quasar.config.values.parse_seq_lens`),
    with argparse's error type."""
    try:
        return values.parse_seq_lens(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_int(text: str) -> int:
    try:
        value = parse_seq_lens(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if len(value) != 1 or value[0] < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value[0]


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_evaluation_arguments(parser: argparse.ArgumentParser) -> None:
    """The evaluation's flags, shared by every tool that evaluates a fork."""
    parser.add_argument("--claimed", type=positive_float, metavar="TPS", help="claimed tokens/sec at the target")
    parser.add_argument(
        "--device", help="cuda, cuda:N or cpu (cpu: tests and small lengths only; default: the DEVICE setting, cuda)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=3600.0,
        metavar="SECONDS",
        help="limit for the whole evaluation (default 3600)",
    )
    parser.add_argument(
        "--length-timeout",
        type=positive_float,
        default=900.0,
        metavar="SECONDS",
        help="limit for one length: warm-up, timed runs and check (default 900)",
    )
    parser.add_argument(
        "--warmup", type=int, default=3, metavar="N", help="warm-up requests per length (default 3, at least 2)"
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        metavar="N",
        help="timed runs per length (default: as many as fit in 2 s, 10 to 200)",
    )
    parser.add_argument("--import-profile", choices=("core", "strict"), default="core")
    parser.add_argument("--require-cu", action="store_true", help="a missing *.cu file is an error")
    parser.add_argument(
        "--allow-unsandboxed",
        action="store_true",
        help="run the fork without namespaces where they are unavailable (it can then "
        "read this user's files and use the network)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--debug", action="store_true", help="log at debug level")


def start(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> tuple[argparse.Namespace, config.Settings]:
    """Parse ``argv``, resolve the settings (quasar/config.py: environment, then .env; a bad one
    exits through ``parser.error``, naming it) and set up logging: warnings only (the tools show
    their own progress) unless ``--debug``, the settings' secrets masked."""
    args = parser.parse_args(argv)
    try:
        settings = config.resolve()
    except config.SettingsError as error:
        parser.error(str(error))
    setup_logging(args.debug, settings.secrets(), quiet=True)
    return args, settings


def options_from(args: argparse.Namespace, seq_lens: Sequence[int], settings: config.Settings) -> EvaluationOptions:
    """EvaluationOptions from parsed flags; the rest (the device unless given, the timed seconds,
    the load limit and the sandbox's) from ``settings``, as a validator's. Raises
    EvaluationInputError."""
    repeats = {"min_timed_runs": args.repeats, "max_timed_runs": args.repeats} if args.repeats else {}
    return options_from_settings(
        settings,
        allow_unsandboxed=args.allow_unsandboxed,
        seq_lens=tuple(seq_lens),
        device=args.device or settings.device,
        timeout_s=args.timeout,
        length_timeout_s=args.length_timeout,
        import_profile=args.import_profile,
        require_cu=args.require_cu,
        warmup_runs=max(args.warmup, 0),
        **repeats,
    )


def main(argv: Sequence[str] | None = None, prog: str = "quasar evaluate") -> int:
    """Evaluate the fork; exit status 0 on a pass, 1 on a fail, 2 for bad arguments."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Evaluate a checked-out fork: import check, sandboxed benchmark, correctness, claim and score.",
    )
    parser.add_argument("repo", help="path of the checked-out fork")
    parser.add_argument("--target", type=positive_int, required=True, metavar="N", help="target sequence length")
    parser.add_argument(
        "--seq-lens",
        type=parse_seq_lens,
        default=DEFAULT_SEQ_LENS,
        metavar="LIST",
        help=f"lengths run besides the target (default {values.format_seq_lens(DEFAULT_SEQ_LENS)})",
    )
    add_evaluation_arguments(parser)
    args, settings = start(parser, argv)
    try:
        report = evaluate(args.repo, args.target, args.claimed, options_from(args, args.seq_lens, settings))
    except EvaluationInputError as error:
        parser.error(str(error))
    if args.json:
        print(report.to_json())
    else:
        render_report(report)
    return 0 if report.passed else 1
