"""``quasar evaluate REPO --target N``: evaluate a checked-out fork as a validator would.

Exit status: 0 when the verdict is pass, 1 when it is fail, 2 for bad arguments. The flags and the
start-up of the miner's other evaluating tools (``quasar local-validator``, ``step1``, ``step2``)
are here too: :func:`add_evaluation_arguments`, :func:`start` and :func:`options_from`
(``quasar check-sandbox`` takes :func:`add_common_arguments` and :func:`start`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from quasar import config
from quasar.config import values
from quasar.evaluate.gpus import GpuOrderError, missing_gpu_here, use_pci_bus_order
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import (
    CPU_MAX_SEQ_LEN,
    BeyondCpuLimit,
    EvaluationInputError,
    EvaluationOptions,
    options_from_settings,
)
from quasar.evaluate.report import render_report
from quasar.log import setup_logging

# ``"512,1024,2k,1M"`` -> ``(512, 1024, 2000, 1000000)``, as the EVAL_SEQ_LENS setting reads it.
parse_seq_lens = config.seq_lens_type()


def positive_int(text: str) -> int:
    """One length (``2048``, ``100k``, ``1M``), at least 1."""
    try:
        (value,) = values.parse_seq_lens(text)
    except ValueError:  # not a length, below 1, or not exactly one
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def device_name(text: str) -> str:
    """``--device``, checked as DEVICE is: cpu, cuda or cuda:N."""
    try:
        return values.parse_device(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# What an evaluation does where neither a flag nor a setting says otherwise (the flags' help names it).
_DEFAULTS = EvaluationOptions()


def _setting(key: str) -> str:
    return config.OPTIONS_BY_KEY[key].default


def add_evaluation_arguments(parser: argparse.ArgumentParser) -> None:
    """The evaluation's flags, shared by every tool that evaluates a fork."""
    parser.add_argument("--claimed", type=positive_float, metavar="TPS", help="claimed tokens/sec at the target")
    parser.add_argument(
        "--device",
        type=device_name,
        help="cuda, cuda:N or cpu (cpu: tests and small lengths only; default: the DEVICE setting, "
        f"{_setting('device')})",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help=f"limit for the whole evaluation (default: the EVAL_TIMEOUT setting, {_setting('eval_timeout')})",
    )
    parser.add_argument(
        "--length-timeout",
        type=positive_float,
        metavar="SECONDS",
        help=f"limit for a length's warm-up, and for each of its timed rounds (default {_DEFAULTS.length_timeout_s:g})",
    )
    parser.add_argument(
        "--warmup", type=int, metavar="N", help=f"warm-up requests per length (default {_DEFAULTS.warmup_runs})"
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        metavar="N",
        help=f"timed runs per length (default: as many as fit in the EVAL_TIMED_SECONDS setting, "
        f"{_setting('eval_timed_seconds')} s, {_DEFAULTS.min_timed_runs} to {_DEFAULTS.max_timed_runs})",
    )
    parser.add_argument("--import-profile", choices=("core", "strict"), default="core")
    parser.add_argument("--require-cu", action="store_true", help="a missing *.cu file is an error")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_common_arguments(parser)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every tool that runs a fork and starts through :func:`start`, ``quasar
    check-sandbox`` included: ``--allow-unsandboxed`` and ``--debug`` (which :func:`start` reads)."""
    parser.add_argument(
        "--allow-unsandboxed",
        action="store_true",
        help="where the sandbox cannot be built, run the fork without it, as a miner's "
        "MINER_ALLOW_UNSANDBOXED does (the fork can then read this user's files and use the "
        "network; a validator never does)",
    )
    parser.add_argument("--debug", action="store_true", help="log at debug level")


def start(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> tuple[argparse.Namespace, config.Settings]:
    """Parse ``argv``, resolve the settings (quasar/config.py: environment, then .env; a bad one
    exits through ``parser.error``, naming it) and set up logging: warnings only (the tools show
    their own progress) unless ``--debug``, the settings' secrets masked. On CUDA, GPUs are
    numbered in PCI bus order, as the sandbox names them (gpus.py); another CUDA_DEVICE_ORDER is
    refused through ``parser.error``."""
    args = parser.parse_args(argv)
    try:
        settings = config.resolve()
    except config.SettingsError as error:
        parser.error(str(error))
    if (getattr(args, "device", None) or settings.device).startswith("cuda"):
        try:
            use_pci_bus_order(os.environ)
        except GpuOrderError as error:
            parser.error(str(error))
    setup_logging(args.debug, settings.secrets(), quiet=True)
    return args, settings


def options_from(args: argparse.Namespace, seq_lens: Sequence[int], settings: config.Settings) -> EvaluationOptions:
    """EvaluationOptions from parsed flags; what they leave out from ``settings``, as a validator's
    (the device, the evaluation's limit, the timed seconds, the load limit, the sandbox's), and
    the rest as :class:`EvaluationOptions` has it. Raises EvaluationInputError, for a device this
    host lacks too, naming the flag or the DEVICE setting it came from, as a bad setting is named."""
    device = args.device or settings.device
    no_gpu = missing_gpu_here(device)
    if no_gpu is not None:
        raise EvaluationInputError(
            f"{config.named_setting('device', {'device': args.device})}: {device}, but {no_gpu} "
            "(--device cpu runs small lengths, for tests only: not a benchmark)"
        )
    given: dict[str, object] = {}
    if args.repeats:
        given.update(min_timed_runs=args.repeats, max_timed_runs=args.repeats)
    if args.timeout is not None:
        given.update(timeout_s=args.timeout)
    if args.length_timeout is not None:
        given.update(length_timeout_s=args.length_timeout)
    if args.warmup is not None:
        given.update(warmup_runs=max(args.warmup, 0))
    return options_from_settings(
        settings,
        allow_unsandboxed=args.allow_unsandboxed,
        seq_lens=tuple(seq_lens),
        device=device,
        import_profile=args.import_profile,
        require_cu=args.require_cu,
        **given,
    )


def refusal(error: EvaluationInputError, lengths_flag: str, instead_of: str = "") -> str:
    """What a tool says for ``error``: a length past the CPU's limit with the cure, ``lengths_flag``
    (the tool's flag for its lengths, which its defaults pass) given lengths within the limit, in
    place of ``instead_of`` where a flag of its own asked for the longer ones."""
    if not isinstance(error, BeyondCpuLimit):
        return str(error)
    verb, place = ("run", f" instead of {instead_of}") if instead_of else ("give", "")
    return f"{error}; {verb} {lengths_flag} of {CPU_MAX_SEQ_LEN} or less{place}"


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
        metavar="LIST",
        help=f"lengths run besides the target (default: the EVAL_SEQ_LENS setting, {_setting('eval_seq_lens')})",
    )
    add_evaluation_arguments(parser)
    args, settings = start(parser, argv)
    seq_lens = settings.eval_seq_lens if args.seq_lens is None else args.seq_lens
    try:
        report = evaluate(args.repo, args.target, args.claimed, options_from(args, seq_lens, settings))
    except EvaluationInputError as error:
        parser.error(str(error))
    if args.json:
        print(report.to_json())
    else:
        render_report(report)
    return 0 if report.passed else 1
