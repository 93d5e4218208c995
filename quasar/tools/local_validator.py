"""``quasar local-validator``: the same evaluation a validator runs, before you submit.

    quasar local-validator --repo-path ~/flash-linear-attention --seq-len 100000 --claimed 2.4e6
    quasar local-validator --repo-path ~/flash-linear-attention --full

``--seq-len N`` runs that one length (it is the target); ``--full`` runs 512, 1024, 2048, 100k,
500k and 1M, as memory allows (an out-of-memory ends the run there), with the target 1M unless
``--target`` says otherwise. Shows progress while it runs, then the report as tables (or JSON
with ``--json``) and the best target among the lengths that passed. Exit status 0 when the
verdict is pass, 1 when it is fail, 2 for bad arguments.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from quasar.config.values import format_seq_lens
from quasar.evaluate.cli import add_evaluation_arguments, options_from, positive_int, refusal, start
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import EvaluationInputError, ProgressEvent
from quasar.evaluate.report import OK, EvaluationReport, render_report
from quasar.terminal import WrappingParser

FULL_SEQ_LENS = (512, 1024, 2048, 100_000, 500_000, 1_000_000)
STAGE_NAMES = {
    "import-check": "import check",
    "start": "starting the sandbox",
    "calibrate": "calibrating the harness",
    "load": "loading the fork's layer",
    "warmup": "warm-up (compilation, autotuning)",
    "timed": "timed runs",
    "correctness": "correctness run",
    "reference": "checking against the reference",
    "done": "done",
}


def best_target(report: EvaluationReport) -> tuple[int, float] | None:
    """The passing length with the highest tokens/sec × league multiplier, and that product."""
    from quasar.scoring import league_for

    scored = [
        (item.seq_len, item.tokens_per_sec * league_for(item.seq_len).multiplier)
        for item in report.lengths.values()
        if item.status == OK and item.correct and item.tokens_per_sec
    ]
    return max(scored, key=lambda pair: pair[1]) if scored else None


class ProgressDisplay:
    """Turns the harness's progress events into rich progress bars."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.task = progress.add_task("starting", total=None)

    def __call__(self, event: ProgressEvent) -> None:
        stage = STAGE_NAMES.get(event.stage, event.stage)
        where = f"T={event.seq_len:,}: " if event.seq_len else ""
        total = event.total or None
        self.progress.update(self.task, description=f"{where}{stage}", completed=event.done, total=total)


def main(argv: Sequence[str] | None = None, prog: str = "quasar local-validator") -> int:
    """Evaluate the fork with progress bars; exit status 0 on a pass, 1 on a fail, 2 for bad arguments."""
    parser = WrappingParser(
        prog=prog, description="A miner's local validator: the same evaluation a validator runs, before you submit."
    )
    parser.add_argument("--repo-path", required=True, help="your fork, checked out")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seq-len", type=positive_int, metavar="N", help="run this one length (the target)")
    which.add_argument("--full", action="store_true", help=f"run {format_seq_lens(FULL_SEQ_LENS)} as memory allows")
    parser.add_argument(
        "--target",
        type=positive_int,
        metavar="N",
        help=f"target length with --full (default {format_seq_lens(FULL_SEQ_LENS[-1:])})",
    )
    add_evaluation_arguments(parser)
    args, settings = start(parser, argv)
    if args.full:
        seq_lens: tuple[int, ...] = FULL_SEQ_LENS
        target = args.target or FULL_SEQ_LENS[-1]
    else:
        if args.target is not None:
            parser.error("--target goes with --full; with --seq-len the length is the target")
        seq_lens, target = (), args.seq_len

    console = Console(stderr=args.json)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        options = options_from(args, seq_lens, settings)
        with Progress(*columns, console=console, transient=True) as progress:
            report = evaluate(args.repo_path, target, args.claimed, options, progress=ProgressDisplay(progress))
    except EvaluationInputError as error:
        parser.error(refusal(error, "--seq-len N", "--full" if args.full else ""))
    if args.json:
        print(report.to_json())
        return 0 if report.passed else 1
    render_report(report, console)
    best = best_target(report)
    if best is not None and len(report.lengths) > 1:
        console.print(
            f"best target among the lengths run: T={best[0]:,} (tokens/s × league multiplier = {best[1]:,.0f})"
        )
    return 0 if report.passed else 1
