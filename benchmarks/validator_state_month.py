"""The validator's state file after many finished, checked and reported evaluations: what each step
of the loop spends in its queries (what to evaluate, check and report; how many are open) and the
epoch's read of every finished submission, with the step's indexes and without them (as before).
Rows go straight into the state's own schema (ValidatorState.open). Figures: benchmarks/RESULTS.md,
"A month of submissions".

    python benchmarks/validator_state_month.py /tmp/validator_state.sqlite3 10000 50000 100000 200000
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from quasar.validator.state import ValidatorState
from quasar.validator.state_files import FINISHED, PASSED, REPORTED

STEP_INDEXES = ("evaluations_by_status", "submissions_by_logits", "submissions_by_report_state")


def fill(state: ValidatorState, ids: range) -> None:
    """Evaluations ``ids``, finished and reported, one submission each, of 256 hotkeys."""
    with state._write() as db:
        for i in ids:
            url, commit = f"https://github.com/m{i % 256}/flash-linear-attention", f"{i:040x}"
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
                (i + 1, f"hotkey{i % 256}", url, commit, i, i // 1000, i, i, PASSED, REPORTED),
            )


def timed(call: Callable[[], object], repeats: int) -> str:
    """Median, fastest and slowest of ``repeats`` calls, in milliseconds."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return f"median {statistics.median(times):.1f} ms ({min(times):.1f}–{max(times):.1f}, n={repeats})"


def step(state: ValidatorState) -> None:
    """The queries of one step of the loop (pending_evaluations twice: fetching and starting)."""
    state.pending_evaluations(time.time())
    state.pending_evaluations(time.time())
    state.needing_logit_check()
    state.ready_to_report()
    state.open_submissions()


def main(path: Path, sizes: list[int]) -> None:
    """Fill ``path`` up to each of ``sizes`` evaluations and print what the queries cost there."""
    path.unlink(missing_ok=True)
    with ValidatorState.open(path) as state:
        filled = 0
        for size in sizes:
            fill(state, range(filled, size))
            filled = size
            indexed = timed(lambda: step(state), 5)
            for index in STEP_INDEXES:
                state._connection.execute(f"DROP INDEX {index}")
            scanned = timed(lambda: step(state), 5)
            state._connection.executescript(
                "CREATE INDEX evaluations_by_status ON evaluations (status);"
                "CREATE INDEX submissions_by_logits ON submissions (logits);"
                "CREATE INDEX submissions_by_report_state ON submissions (report_state);"
            )
            print(
                f"{size} evaluations, {os.path.getsize(path) / 1e6:.0f} MB: a step's queries, indexed {indexed}; "
                f"scanning every row (before) {scanned}; the epoch's read of every finished submission "
                f"{timed(state.scored, 1)}",
                flush=True,
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(size) for size in sys.argv[2:]])
