"""``quasar step2``, a miner's second step: tune the QuasarAttention kernel's tunables on this GPU.

    quasar step2 --repo-path FORK [--seq-lens 65536,262144,1M] [--commit]
    quasar step2 --repo-path FORK --grid '[{"segment_chunks": 8}, {}]'

Every configuration of the grid (default: segment sizes 16, 32, 64 chunks x the WY pass's warps
and register cap, 1 warp uncapped or 2 warps uncapped or capped at 168, x its two inverses) is
written as ``fla/ops/quasar/tuning.json`` into a scratch copy of the fork and evaluated by the
harness (sandboxed, checked against the reference) at every ``--seq-lens`` (the longest is the
target). The fastest configuration that passes at the target is written into the fork's
``tuning.json``, replacing it whole, per-chip ``devices`` entries included, so that it applies on
every chip (committed with ``--commit``). Prints a table of tokens/sec per configuration and
length, and saves a plot of tokens/sec against sequence length (``--plot``, PNG) and the raw
results (``--results``, JSON).

The tunables and their meaning: the fork's ``fla/ops/quasar/tuning.py`` (written by step 1).
Exit status 0 when a passing configuration was found, 1 when none passed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from quasar.evaluate.cli import add_evaluation_arguments, options_from, parse_seq_lens, start
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import EvaluationInputError
from quasar.evaluate.report import OK
from quasar.starter_fork import tuning_contract

TUNING_PATH = Path("fla/ops/quasar/tuning.json")
DEFAULT_SEQ_LENS = (65_536, 262_144, 1_000_000)
# The tunables that moved the layer most on an H100 and an H200 (benchmarks/RESULTS.md): segment
# size, the WY pass's warps with its register cap (one warp with the compiler's registers; two:
# uncapped, or 168, the shipped cap) and how it inverts its diagonal blocks.
DEFAULT_GRID = [
    {"segment_chunks": chunks, "wy_warps": warps, "wy_maxnreg": maxnreg, "wy_inverse": inverse}
    for chunks, (warps, maxnreg), inverse in itertools.product(
        (16, 32, 64), ((1, 0), (2, 0), (2, 168)), ("substitution", "product"))
]


@dataclasses.dataclass
class SweepResult:
    """One configuration's evaluation: tokens/sec per length (None where it did not pass)."""

    tuning: dict
    passed: bool
    tokens_per_sec: dict[int, float | None]
    reasons: list[str]


def parse_grid(text: str) -> list[dict]:
    """A JSON list of tunable dicts, each checked against the contract; ValueError says which entry is bad."""
    try:
        grid = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--grid is not valid JSON: {error}") from None
    if not isinstance(grid, list) or not grid:
        raise ValueError("--grid must be a non-empty JSON list of objects")
    contract = tuning_contract()
    for index, entry in enumerate(grid):
        contract.parse_tuning(entry, f"--grid entry {index}")
    return grid


def evaluate_tuning(repo: Path, tuning: dict, seq_lens: tuple[int, ...], options, scratch: Path) -> SweepResult:
    """Evaluate the fork with ``tuning`` written into a scratch copy of it."""
    copy = scratch / "fork"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    (copy / TUNING_PATH).write_text(json.dumps(tuning, indent=1) + "\n")
    target = max(seq_lens)
    report = evaluate(copy, target, None, dataclasses.replace(options, seq_lens=tuple(x for x in seq_lens if x != target)))
    speeds = {}
    for length in seq_lens:
        item = report.lengths.get(str(length))
        good = item is not None and item.status == OK and item.correct and item.tokens_per_sec
        speeds[length] = item.tokens_per_sec if good else None
    return SweepResult(tuning, report.passed, speeds, list(report.reasons))


def best_result(results: list[SweepResult]) -> SweepResult | None:
    """The passing result fastest at the longest length."""
    passing = [r for r in results if r.passed and r.tokens_per_sec[max(r.tokens_per_sec)]]
    return max(passing, key=lambda r: r.tokens_per_sec[max(r.tokens_per_sec)], default=None)


def describe(tuning: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(tuning.items())) or "defaults"


def render_table(results: list[SweepResult], best: SweepResult | None) -> Table:
    lengths = sorted(results[0].tokens_per_sec)
    table = Table(title="tokens/sec by configuration (M = 10^6)")
    table.add_column("configuration")
    for length in lengths:
        table.add_column(f"T={length:,}", justify="right")
    table.add_column("verdict")
    for result in results:
        cells = [f"{v / 1e6:.2f} M" if v else "-" for v in (result.tokens_per_sec[n] for n in lengths)]
        verdict = ("best" if result is best else "pass") if result.passed else "fail"
        table.add_row(describe(result.tuning), *cells, verdict)
    return table


def save_plot(results: list[SweepResult], path: Path) -> None:
    """tokens/sec against sequence length, one line per configuration (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for result in results:
        points = sorted((n, v) for n, v in result.tokens_per_sec.items() if v)
        if points:
            axes.plot([n for n, _ in points], [v / 1e6 for _, v in points], marker="o", label=describe(result.tuning))
    axes.set_xscale("log")
    axes.set_xlabel("sequence length (tokens)")
    axes.set_ylabel("M tokens/sec")
    axes.set_title("QuasarAttention layer forward")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None, prog: str = "quasar step2") -> int:
    """Step 2; exit status 0 when a passing configuration was found, 1 when none passed, 2 for bad arguments."""
    parser = argparse.ArgumentParser(prog=prog, description="Step 2 for a miner: tune the QuasarAttention "
                                                            "kernel's tunables on this GPU.")
    parser.add_argument("--repo-path", type=Path, required=True, help="the fork (after step 1), checked out")
    parser.add_argument("--seq-lens", type=parse_seq_lens, default=DEFAULT_SEQ_LENS, metavar="LIST",
                        help="lengths to time; the longest is the target (default 65536,262144,1M)")
    parser.add_argument("--grid", default=None, metavar="JSON", help="configurations to try (JSON list of objects)")
    parser.add_argument("--plot", type=Path, default=Path("kernel_tuning.png"), help="PNG to write")
    parser.add_argument("--results", type=Path, default=None, help="JSON file for the raw results")
    parser.add_argument("--commit", action="store_true", help="commit the fork's new tuning.json")
    add_evaluation_arguments(parser)
    args, settings = start(parser, argv)
    repo = args.repo_path.expanduser().resolve()
    if not (repo / "fla" / "ops" / "quasar" / "tuning.py").is_file():
        parser.error(f"{repo} has no fla/ops/quasar/tuning.py: run quasar step1 first")
    try:
        grid = parse_grid(args.grid) if args.grid else DEFAULT_GRID
    except ValueError as error:
        parser.error(str(error))
    console = Console()
    options = options_from(args, (), settings)
    results: list[SweepResult] = []
    with tempfile.TemporaryDirectory(prefix="quasar-tuning-") as scratch:
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("tuning", total=len(grid))
            for tuning in grid:
                progress.update(task, description=describe(tuning))
                try:
                    results.append(evaluate_tuning(repo, tuning, tuple(args.seq_lens), options, Path(scratch)))
                except EvaluationInputError as error:
                    parser.error(str(error))
                progress.advance(task)
    best = best_result(results)
    console.print(render_table(results, best))
    for result in results:
        for reason in result.reasons if not result.passed else ():
            console.print(f"  {describe(result.tuning)}: {reason}")
    save_plot(results, args.plot)
    console.print(f"plot: {args.plot}")
    if args.results:
        args.results.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    if best is None:
        console.print("[red]no configuration passed; the fork's tuning.json is unchanged[/red]")
        return 1
    (repo / TUNING_PATH).write_text(json.dumps(best.tuning, indent=1) + "\n")
    console.print(f"best: {describe(best.tuning)} -> {repo / TUNING_PATH}")
    if args.commit:
        subprocess.run(["git", "add", "--", str(TUNING_PATH)], cwd=repo, check=True)
        subprocess.run(["git", "commit", "-q", "-m", f"Kernel tuning: {describe(best.tuning)}", "--", str(TUNING_PATH)],
                       cwd=repo, check=True)
        console.print("committed the new tuning.json")
    return 0
