"""``python -m quasar.evaluate REPO --target N``: evaluate a checked-out fork as a validator would.

Exit status: 0 when the verdict is pass, 1 when it is fail, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from quasar.config import SettingsError
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import DEFAULT_SEQ_LENS, EvaluationInputError, EvaluationOptions, options_from_settings
from quasar.evaluate.report import render_report


def parse_seq_lens(text: str) -> tuple[int, ...]:
    """``"512,1024,2k,1M"`` -> ``(512, 1024, 2000, 1000000)``; argparse-friendly errors."""
    lengths = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        scale = {"k": 1000, "m": 1_000_000}.get(part[-1:], 1) if part else 1
        digits = part[:-1] if scale != 1 else part
        if not digits.isdigit():
            raise argparse.ArgumentTypeError(f"expected comma-separated lengths such as 512,1024,100k, got {text!r}")
        lengths.append(int(digits) * scale)
    return tuple(lengths)


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
    """Flags shared with scripts/local_validator.py."""
    parser.add_argument("--claimed", type=positive_float, metavar="TPS", help="claimed tokens/sec at the target")
    parser.add_argument("--device", help="cuda, cuda:N or cpu (cpu: tests and small lengths only; default: the "
                                         "DEVICE setting, cuda)")
    parser.add_argument("--timeout", type=positive_float, default=3600.0, metavar="SECONDS",
                        help="limit for the whole evaluation (default 3600)")
    parser.add_argument("--length-timeout", type=positive_float, default=900.0, metavar="SECONDS",
                        help="limit for one length: warm-up, timed runs and check (default 900)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N", help="warm-up requests per length (default 3, at least 2)")
    parser.add_argument("--repeats", type=positive_int, metavar="N",
                        help="timed runs per length (default: as many as fit in 2 s, 10 to 200)")
    parser.add_argument("--import-profile", choices=("core", "strict"), default="core")
    parser.add_argument("--require-cu", action="store_true", help="a missing *.cu file is an error")
    parser.add_argument("--allow-unsandboxed", action="store_true",
                        help="run the fork without namespaces where they are unavailable (it can then "
                             "read this user's files and use the network)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--debug", action="store_true", help="log at debug level")


def options_from(args: argparse.Namespace, seq_lens: Sequence[int]) -> EvaluationOptions:
    """EvaluationOptions from parsed flags; the rest (the device unless given, the timed seconds,
    the load limit and the sandbox's) from the settings (quasar/config.py: environment, then
    .env), as a validator's. Raises SettingsError."""
    from quasar import config

    settings = config.resolve()
    repeats = {"min_timed_runs": args.repeats, "max_timed_runs": args.repeats} if args.repeats else {}
    return options_from_settings(
        settings, allow_unsandboxed=args.allow_unsandboxed, seq_lens=tuple(seq_lens),
        device=args.device or settings.device, timeout_s=args.timeout, length_timeout_s=args.length_timeout,
        import_profile=args.import_profile, require_cu=args.require_cu, warmup_runs=max(args.warmup, 0), **repeats,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m quasar.evaluate",
        description="Evaluate a checked-out fork: import check, sandboxed benchmark, correctness, claim and score.",
    )
    parser.add_argument("repo", help="path of the checked-out fork")
    parser.add_argument("--target", type=positive_int, required=True, metavar="N", help="target sequence length")
    parser.add_argument("--seq-lens", type=parse_seq_lens, default=DEFAULT_SEQ_LENS, metavar="LIST",
                        help=f"lengths run besides the target (default {','.join(map(str, DEFAULT_SEQ_LENS))})")
    add_evaluation_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        report = evaluate(args.repo, args.target, args.claimed, options_from(args, args.seq_lens))
    except (EvaluationInputError, SettingsError) as error:
        parser.error(str(error))
    if args.json:
        print(report.to_json())
    else:
        render_report(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
