"""``quasar bench harness``: five-run agreement of the evaluation harness on the starter fork.

    quasar bench harness --out DIR [--device cuda] [--runs 5] [--budget-seconds 300]
        [--lens 512,1024,2048,100k] [--target 1M] [--timed-seconds S] [--warmup-seconds S]
        [--tokens-per-request N] [--no-pin] [--tuning JSON] [--fork PATH]
        [--triton-seed-dir DIR] [--process-per-evaluation | --worker]

Runs up to ``--runs`` separate evaluations (each a fresh sandbox) of the starter fork at
``--lens`` with target ``--target`` (default 512, 1024, 2048, 100k and 1M), and after each one
prints the running agreement per length: the medians so far and their spread
``max / min - 1``, which must stay within 2% on one H100, and beside them each evaluation's
best (its fastest timed request) and their spread. A new evaluation is not started when the
last one's duration would overrun ``--budget-seconds``. Each report is written to DIR as JSON as
soon as it exists, with ``summary.json`` rewritten after each; the overhead table is last,
then where the evaluations' time went, step by step (each progress event of the harness to the
next, summed per step and length: the median over evaluations). ``--tuning`` sets tunables of the
starter fork's ``tuning.json`` (checked against the contract; they apply on every chip), to compare
tunings in the harness. ``--fork PATH`` evaluates the files of another tree instead of the starter
fork (an older starter tree, a miner's fork), to compare trees in the harness.
``--process-per-evaluation`` runs each evaluation in a fresh interpreter (``evaluate`` alone);
``--worker`` runs each as a validator does: its worker process (quasar/validator/worker.py) clones
the fork from a local git repository, starting the sandboxed child and the reference work while it
clones, then evaluates; ``wall`` is then the worker's whole life, from its start to its result.
By default the evaluations share this process.

On one H100 an evaluation of the five default lengths took 25–30 s (benchmarks/RESULTS.md; most
of its overhead the fork's Triton compilation and the child's start, both on one pinned core),
so five fit in under three minutes, and the default ``--budget-seconds 300`` ends the run within
six even if they are slower.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from rich.console import Console
from rich.table import Table

from quasar.evaluate.cli import parse_seq_lens
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import DEFAULT_TOKENS_PER_REQUEST, EvaluationOptions, ProgressEvent
from quasar.evaluate.report import EvaluationReport
from quasar.evaluate.sandbox import SandboxPolicy
from quasar.evaluate.start import evaluation_lengths
from quasar.evaluate.triton_seed import ensure_seed
from quasar.log import setup_logging
from quasar.starter_fork import KERNEL_DIR, copy_starter_tree, tuning_contract
from quasar.starter_fork.writer import commit_new_repository
from quasar.validator.devices import Device
from quasar.validator.evaluator import SubprocessEvaluator
from quasar.validator.records import EvaluationKey


def parse_target(text: str) -> int:
    """One length with the suffixes --lens accepts (``100k``, ``1M``)."""
    lengths = parse_seq_lens(text)
    if len(lengths) != 1:
        raise argparse.ArgumentTypeError(f"expected one length, got {text!r}")
    return lengths[0]


def spread(values: list[float]) -> float:
    """``max / min - 1`` of positive values."""
    return max(values) / min(values) - 1


def parse_tuning(text: str) -> dict:
    """``--tuning``: a JSON object of tunables, checked against the starter fork's contract."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from None
    try:
        tuning_contract().parse_tuning(values, "--tuning")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return values


def copy_fork_tree(source: Path, dest: Path) -> list[PurePosixPath]:
    """Copy the files of the tree ``source`` (its ``.git`` left out) into the new folder ``dest``;
    return their relative paths."""
    if not (source / "fla" / "layers" / "quasar.py").is_file():
        raise SystemExit(f"--fork {source}: not a fork's tree (no fla/layers/quasar.py)")
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".git"))
    return sorted(PurePosixPath(path.relative_to(dest).as_posix()) for path in dest.rglob("*") if path.is_file())


class Timeline:
    """The harness's progress events with the seconds since the evaluation began; :meth:`steps`
    turns them into the time from each step's first event to the next step's, per length."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.events: list[tuple[float, str, int | None]] = []

    def __call__(self, event: ProgressEvent) -> None:
        self.events.append((time.monotonic() - self.started, event.stage, event.seq_len))

    def steps(self) -> dict[str, float]:
        """Seconds per step, keyed ``stage`` or ``stage@T``, in the order the steps first came."""
        found: dict[str, float] = {}
        for (at, stage, length), (after, _, _) in zip(self.events, self.events[1:], strict=False):
            key = stage if length is None else f"{stage}@{length}"
            found[key] = found.get(key, 0.0) + after - at
        return found


def evaluate_with_steps(fork: Path, target: int, options: EvaluationOptions) -> tuple[dict, dict[str, float]]:
    """One evaluation: its report (as a dict) and its :meth:`Timeline.steps`."""
    timeline = Timeline()
    report = evaluate(fork, target, None, options, progress=timeline)
    return report.to_dict(), timeline.steps()


def evaluate_in_fresh_process(fork: Path, target: int, options: EvaluationOptions) -> tuple[dict, dict[str, float]]:
    """:func:`evaluate_with_steps` in a new interpreter (spawned), as a validator's worker runs it."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(evaluate_with_steps, (fork, target, options))


def evaluate_in_worker(
    fork: Path, commit: str, target: int, options: EvaluationOptions, work_dir: Path
) -> tuple[dict, dict[str, float]]:
    """One evaluation by the validator's own worker process, as the validator starts it; its
    report (as a dict) and no steps (the worker's progress stays in its process)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] if options.device == "cuda" else ""
    device = Device("cuda" if options.device == "cuda" else "cpu", visible)
    running = SubprocessEvaluator(work_dir, options, allow_local=True).start(
        EvaluationKey(str(fork), commit, target), device
    )
    while (outcome := running.poll()) is None:
        time.sleep(0.05)
    if outcome.result is None or outcome.result.report is None:
        raise SystemExit(f"the worker gave no report: {outcome}")
    return outcome.result.report, {}


def steps_table(steps: list[dict[str, float]]) -> Table:
    table = Table(title="where the time went: seconds per step (median, min-max over evaluations)")
    for column in ("step", "median", "range"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for key in steps[0]:
        values = [found.get(key, 0.0) for found in steps]
        table.add_row(key, f"{statistics.median(values):.2f}", f"{min(values):.2f}-{max(values):.2f}")
    return table


def agreement(reports: list[EvaluationReport]) -> dict[str, dict]:
    """Per length measured in every report: the medians (tokens/s), their spread and the runs' figures."""
    found: dict[str, dict] = {}
    for key in reports[0].lengths:
        items = [report.lengths[key] for report in reports]
        medians = [item.tokens_per_sec for item in items if item.tokens_per_sec]
        bests = [item.tokens_per_sec_max or 0.0 for item in items]
        if len(medians) < len(items):
            found[key] = {"medians": None, "statuses": [item.status for item in items]}
            continue
        found[key] = {
            "medians": medians,
            "spread": spread(medians),
            "bests": bests,
            "best_spread": spread(bests),
            "cv_max": max(item.cv or 0.0 for item in items),
            "forwards_per_request": [item.forwards_per_request for item in items],
            "timed_requests": [item.timed_runs for item in items],
            "verified": [item.runs_verified for item in items],
            "rel_error_max": max(item.rel_error or 0.0 for item in items),
            "subtracted_us": [item.subtracted_us for item in items],
        }
    return found


def agreement_table(reports: list[EvaluationReport], found: dict[str, dict]) -> Table:
    table = Table(
        title=f"agreement of {len(reports)} evaluation(s) ({reports[0].device_name}); bound 2%; "
        "best = an evaluation's fastest timed request; spread = max / min - 1"
    )
    columns = (
        "T",
        "medians (tokens/s)",
        "spread",
        "bests (tokens/s)",
        "spread of bests",
        "cv of requests (max)",
        "forwards/request",
        "requests",
        "forwards verified",
        "rel error (max)",
        "subtracted µs/forward",
    )
    for column in columns:
        table.add_column(column, justify="left" if "(tokens/s)" in column else "right")
    for key, row in found.items():
        if row["medians"] is None:
            table.add_row(f"{int(key):,}", f"not measured in every run: {row['statuses']}", *["-"] * (len(columns) - 2))
            continue
        colour = {name: "green" if row[name] <= 0.02 else "red" for name in ("spread", "best_spread")}
        table.add_row(
            f"{int(key):,}",
            " · ".join(f"{m:,.0f}" for m in row["medians"]),
            f"[{colour['spread']}]{row['spread']:.2%}[/]",
            " · ".join(f"{b:,.0f}" for b in row["bests"]),
            f"[{colour['best_spread']}]{row['best_spread']:.2%}[/]",
            f"{row['cv_max']:.3f}",
            ",".join(map(str, row["forwards_per_request"])),
            ",".join(map(str, row["timed_requests"])),
            ",".join(map(str, row["verified"])),
            f"{row['rel_error_max']:.2e}",
            ",".join(f"{u:.0f}" for u in row["subtracted_us"]),
        )
    return table


def overhead_table(reports: list[EvaluationReport], walls: list[float]) -> Table:
    table = Table(
        title="seconds per evaluation (wall: as this script waited for it; total: evaluate's own; "
        "overhead = total - timed)"
    )
    for column in (
        "evaluation",
        "verdict",
        "wall",
        "total",
        "timed",
        "overhead",
        "started before",
        "startup",
        "calibration",
        "load",
        "warm-up",
        "first forwards",
        "correctness",
        "output",
        "reference",
    ):
        table.add_column(column)
    for index, (report, wall) in enumerate(zip(reports, walls, strict=True)):
        t = report.timings
        table.add_row(
            str(index),
            report.verdict,
            *(
                f"{v:.1f}"
                for v in (
                    wall,
                    t.total_s,
                    t.timed_s,
                    t.overhead_s,
                    t.started_before_s,
                    t.startup_s,
                    t.calibration_s,
                    t.load_s,
                    t.warmup_s,
                    t.first_forward_s,
                    t.correctness_s,
                    t.output_s,
                    t.reference_s,
                )
            ),
        )
    return table


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench harness") -> int:
    """Run the evaluations; exit status 0 when every one passed."""
    started = time.monotonic()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Five-run agreement of the evaluation harness on the starter fork, for benchmarks/RESULTS.md.",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--lens",
        type=parse_seq_lens,
        default=(512, 1024, 2048, 100_000),
        help="lengths besides the target, e.g. 512,1024,2048,100k",
    )
    parser.add_argument("--target", type=parse_target, default=1_000_000, help="target length, e.g. 100000 or 1M")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=300.0,
        help="start no evaluation that would end after this (by the last one's duration)",
    )
    defaults = EvaluationOptions()
    parser.add_argument(
        "--timed-seconds",
        type=float,
        default=defaults.timed_seconds,
        help="timed requests per length fill this long (default %(default)s)",
    )
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=defaults.warmup_seconds,
        help="warm-up on CUDA from the first length's start, at least (default %(default)s)",
    )
    parser.add_argument(
        "--tokens-per-request",
        type=int,
        default=None,
        help=f"forwards per request make this many tokens (default {DEFAULT_TOKENS_PER_REQUEST} on CUDA)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave the child and the timing thread on the CPUs the OS picks (for comparison)",
    )
    parser.add_argument(
        "--tuning",
        type=parse_tuning,
        default=None,
        help="tunables written over the starter fork's tuning.json, e.g. '{\"num_stages\": 1}'",
    )
    parser.add_argument(
        "--fork",
        type=Path,
        default=None,
        help="a fork's tree to evaluate instead of the starter fork (its files are copied)",
    )
    fresh = parser.add_mutually_exclusive_group()
    fresh.add_argument(
        "--process-per-evaluation", action="store_true", help="each evaluation (evaluate alone) in a fresh interpreter"
    )
    fresh.add_argument(
        "--worker",
        action="store_true",
        help="each evaluation by the validator's worker process, cloning the fork from a local repository",
    )
    parser.add_argument(
        "--triton-seed-dir",
        default="",
        help="give every evaluation the Triton cache seed kept here, built first if missing "
        "(quasar/evaluate/triton_seed.py); default: none, every evaluation compiles everything",
    )
    parser.add_argument("--allow-unsandboxed", action="store_true")
    args = parser.parse_args(argv)
    setup_logging()
    code = run(args, " ".join([prog, *(argv if argv is not None else sys.argv[1:])]))
    print(f"{prog}: {time.monotonic() - started:.0f} s")
    return code


def run(args: argparse.Namespace, command: str) -> int:
    """The evaluations ``args`` ask for (``command``: the command line, kept in summary.json)."""
    console = Console(width=180)
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="starter-"))
    fork = scratch / "fork"
    paths = copy_starter_tree(fork) if args.fork is None else copy_fork_tree(args.fork, fork)
    if args.tuning is not None:
        # The tunables asked for apply on every chip: the shipped per-chip entries (devices) are dropped.
        tuning_file = fork / KERNEL_DIR / "tuning.json"
        shipped = {key: value for key, value in json.loads(tuning_file.read_text()).items() if key != "devices"}
        tuning_file.write_text(json.dumps({**shipped, **args.tuning}, indent=1) + "\n")
    commit = commit_new_repository(fork, paths, "bench_harness") if args.worker else ""
    options = EvaluationOptions(
        seq_lens=tuple(args.lens),
        device=args.device,
        timed_seconds=args.timed_seconds,
        warmup_seconds=args.warmup_seconds,
        tokens_per_request=args.tokens_per_request,
        pin_cpus=False if args.no_pin else None,
        policy=SandboxPolicy(allow_unsandboxed=args.allow_unsandboxed),
        triton_seed_dir=args.triton_seed_dir,
    )
    if args.triton_seed_dir:
        # Built here, before the first evaluation, so that every evaluation's figures are alike.
        seeding = time.monotonic()
        lengths = evaluation_lengths(options.seq_lens, args.target)
        seeded = ensure_seed(args.triton_seed_dir, options.device, lengths, options.policy)
        console.print(f"Triton cache seed: {seeded.triton_seed or 'none'} ({time.monotonic() - seeding:.1f} s)")
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "options": {k: v for k, v in vars(options).items() if k != "policy"},
        "tuning": args.tuning,
        "fork": str(args.fork) if args.fork else "starter",
        "process_per_evaluation": args.process_per_evaluation,
        "worker": args.worker,
    }
    started = time.monotonic()
    reports: list[EvaluationReport] = []
    steps: list[dict[str, float]] = []
    walls: list[float] = []
    last_s = 0.0
    for index in range(args.runs):
        if reports and time.monotonic() - started + last_s > args.budget_seconds:
            console.print(f"[yellow]budget of {args.budget_seconds:.0f} s reached: {len(reports)} evaluation(s)[/]")
            break
        begun = time.monotonic()
        if args.worker:
            found_report, found_steps = evaluate_in_worker(fork, commit, args.target, options, scratch / "work")
        else:
            run_one = evaluate_in_fresh_process if args.process_per_evaluation else evaluate_with_steps
            found_report, found_steps = run_one(fork, args.target, options)
        last_s = time.monotonic() - begun
        walls.append(last_s)
        report = EvaluationReport.from_dict(found_report)
        reports.append(report)
        steps.append(found_steps)
        (args.out / f"evaluation_{index}.json").write_text(report.to_json())
        console.print(
            f"evaluation {index}: {report.verdict} in {last_s:.0f} s; CPUs: {report.cpu_pinning}; "
            f"reasons: {report.reasons}"
        )
        found = agreement(reports)
        console.print(agreement_table(reports, found))
        summary = {
            "meta": meta,
            "agreement": found,
            "timings": [report.to_dict()["timings"] for report in reports],
            "walls": walls,
            "steps": steps,
            "cpu_pinning": [report.cpu_pinning for report in reports],
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    console.print(overhead_table(reports, walls))
    if steps[0]:
        console.print(steps_table(steps))
    console.print(f"sandbox: {reports[0].sandbox}; date {meta['date']}")
    return 0 if all(report.passed for report in reports) else 1
