"""``quasar bench validator-month``: the validator's state file after many finished, checked and
reported evaluations, and what its reads cost there.

Evaluations of 256 hotkeys, one submission each, finished, logit-checked and reported, go straight
into the state's own schema (ValidatorState.open). At each count given the benchmark times what
each step of the loop spends in its queries (what to evaluate, check and report; how many are
open), 5 times with the step's indexes and 5 times with them dropped (as before they were made;
they are made again from the schema's own text), and once the epoch's read of every finished
submission (``scored()``). Each time is the median, fastest and slowest of the calls. Figures:
benchmarks/RESULTS.md, "A month of submissions".

    quasar bench validator-month --evaluations 10000 50000 100000 200000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from quasar.bench.month_timing import Timing, add_increasing_counts, files_folder, json_file, progress_bar, timed
from quasar.log import setup_logging
from quasar.validator.state import ValidatorState
from quasar.validator.state_files import FINISHED, PASSED, REPORTED

STEP_INDEXES = ("evaluations_by_status", "submissions_by_logits", "submissions_by_report_state")
HOTKEYS, STEP_REPEATS, SCORED_REPEATS = 256, 5, 1
STATE_FILE = "validator_state.sqlite3"


@dataclass
class StateFigures:
    """The state file after ``evaluations``: its size, a step's queries with the step's indexes
    and without them, and the epoch's ``scored()``; ``scored_rows``: the submissions it read."""

    evaluations: int
    megabytes: float
    indexed: Timing
    scanned: Timing
    scored: Timing
    scored_rows: int


def fill(state: ValidatorState, ids: range) -> None:
    """Evaluations ``ids``, finished and reported, one submission each, of 256 hotkeys."""
    with state._write() as db:
        for i in ids:
            url, commit = f"https://github.com/m{i % HOTKEYS}/flash-linear-attention", f"{i:040x}"
            db.execute(
                "INSERT INTO evaluations (fork_url, commit_hash, target_sequence_length, status, attempts, correct, "
                "measured_tokens_per_sec, benchmarks, reasons, notes, content_hash, created_at, started_at, "
                "finished_at) VALUES (?, ?, 65536, ?, 1, 1, 1e6, '{\"65536\": 1000000.0}', '[]', '[]', ?, ?, ?, ?)",
                (url, commit, FINISHED, f"{i:064x}", i, i, i),
            )
            db.execute(
                "INSERT INTO submissions (submission_id, hotkey, fork_url, commit_hash, target_sequence_length, "
                "claimed_tokens_per_sec, submitted_at, round_id, counts_from_block, fetched_at, logits, report_state) "
                "VALUES (?, ?, ?, ?, 65536, 1e6, ?, ?, ?, ?, ?, ?)",
                (i + 1, f"hotkey{i % HOTKEYS}", url, commit, i, i // 1000, i, i, PASSED, REPORTED),
            )


def step(state: ValidatorState) -> None:
    """The queries of one step of the loop (pending_evaluations twice: fetching and starting)."""
    state.pending_evaluations(time.time())
    state.pending_evaluations(time.time())
    state.needing_logit_check()
    state.ready_to_report()
    state.open_submissions()


@contextlib.contextmanager
def without_step_indexes(connection: sqlite3.Connection) -> Iterator[None]:
    """:data:`STEP_INDEXES` dropped, then made again as the schema wrote them."""
    made = [
        connection.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)).fetchone()[0]
        for name in STEP_INDEXES
    ]
    for name in STEP_INDEXES:
        connection.execute(f"DROP INDEX {name}")
    try:
        yield
    finally:
        for sql in made:
            connection.execute(sql)


def measure(path: Path, sizes: Sequence[int], console: Console) -> list[StateFigures]:
    """Fill ``path`` up to each of ``sizes`` evaluations and time the queries there."""
    found, filled = [], 0
    with ValidatorState.open(path) as state, progress_bar(console) as progress:
        task = progress.add_task("evaluations", total=len(sizes))
        for size in sizes:
            progress.update(task, description=f"{size:,} evaluations")
            fill(state, range(filled, size))
            filled = size
            indexed, _ = timed(lambda: step(state), STEP_REPEATS)
            with without_step_indexes(state._connection):
                scanned, _ = timed(lambda: step(state), STEP_REPEATS)
            scored, rows = timed(state.scored, SCORED_REPEATS)
            found.append(StateFigures(size, path.stat().st_size / 1e6, indexed, scanned, scored, len(rows)))
            progress.advance(task)
    return found


def figures_table(figures: Sequence[StateFigures]) -> Table:
    """One row a count of evaluations: the file, and the median (fastest–slowest) of each read."""
    table = Table(
        title=f"The validator's state file: {HOTKEYS} hotkeys' evaluations, finished and reported; a "
        f"step's queries {STEP_REPEATS} times each way, scored() {SCORED_REPEATS} time: median "
        "(fastest–slowest)",
        title_justify="left",
        header_style="bold",
    )
    for heading in ("evaluations", "file", "a step's queries, indexed", "scanning every row (before)", "scored()"):
        table.add_column(heading, justify="right")
    for each in figures:
        table.add_row(
            f"{each.evaluations:,}",
            f"{each.megabytes:,.0f} MB",
            each.indexed.line(1),
            each.scanned.line(1),
            f"{each.scored.median_ms:,.0f} ms",
        )
    return table


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench validator-month") -> int:
    """Measure the state file at each count of evaluations and print the table."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].replace("``", ""))
    add_increasing_counts(
        parser,
        "--evaluations",
        default=[10_000, 50_000, 100_000, 200_000],
        help="the counts of evaluations at which to time the queries (default 10000 50000 100000 200000)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help=f"write the state file ({STATE_FILE}) into DIR and keep it (default: a temporary folder, removed after)",
    )
    parser.add_argument("--json", type=json_file, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    setup_logging(quiet=True)
    console = Console()
    folder, temporary = files_folder(args.keep, [STATE_FILE])
    try:
        figures = measure(folder / STATE_FILE, args.evaluations, console)
    finally:
        if temporary:
            temporary.cleanup()
    console.print(figures_table(figures))
    if args.json:
        args.json.write_text(json.dumps([asdict(each) for each in figures], indent=1))
    return 0
