"""``quasar bench api-month``: the submission API's SQLite database after days of a full subnet,
what its reads cost there, and ``GET /pending_reveals`` as commitments never revealed pile up.

``--days``: a full subnet, ``--miners`` (256) submitting 10 times an hour (12 submissions a
72-minute round), of which the newest 4 a round are reported on by each of 3 validators and the
rest superseded. The rows go straight into the API's own schema (Database.upgrade), round by round;
at each day given, on the same database and block (late in the newest round), 7 timed calls each
of: a miner's history as it was read before (every round the miner played, judged) and as
StatusReader.history reads it (its newest HISTORY_ROUNDS rounds), the newest round's leaderboard
and its validators' agreement, a miner's newest 20 submissions, and the reports of a validator
that sent none.

``--commitments``: on a file of its own, 256 hotkeys committing and never revealing, 10
commitments a block, the chain 5 blocks past the newest; at each count given, 5 timed calls of the
pending reveals (``service.pending_reveals``).

Each time is the median, fastest and slowest of the calls; a file's size is the database's own,
without its write-ahead log. What it shares with validator-month is in quasar/bench/month_timing.py.
Figures: benchmarks/RESULTS.md, "A month of submissions".

    quasar bench api-month --days 1 7 14 30
    quasar bench api-month --commitments 10000 100000 400000
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bittensor.sp_core import Keypair
from rich.console import Console
from rich.table import Table

from quasar import config
from quasar.api.db import Database, Submission
from quasar.api.judging import evaluated_submissions
from quasar.api.service import ApiConfig, SubmissionService
from quasar.api.status import HISTORY_ROUNDS, StatusReader
from quasar.bench.month_timing import (
    Timing,
    add_increasing_counts,
    counts,
    files_folder,
    json_file,
    progress_bar,
    timed,
)
from quasar.chain import Chain, Metagraph, NeuronInfo
from quasar.log import setup_logging

SUBNET_MINERS, VALIDATORS, PER_ROUND, EVALUATED = 256, 3, 12, 4
# The rows' rounds are the API's (ROUND_BLOCKS at its default, as api_config serves it); a block of 12 s, finney's.
ROUND_BLOCKS, BLOCK_S = int(config.OPTIONS_BY_KEY["round_blocks"].default), 12.0
ROUNDS_PER_DAY = round(86400 / (ROUND_BLOCKS * BLOCK_S))
DAY_REPEATS, COMMITMENT_REPEATS = 7, 5
# Commitments a chain block, and the hotkeys they come from in turn.
COMMITMENTS_PER_BLOCK, COMMITTERS = 10, 256
LENGTHS = json.dumps(
    [
        {"seq_len": t, "status": "ok", "tokens_per_sec": 1e6, "peak_vram_mb": 1000, "correct": True}
        for t in (512, 1024, 2048, 65536)
    ]
)
DATABASE_FILE, COMMITMENTS_FILE = "api_month.sqlite3", "api_commitments.sqlite3"
# The reads timed at each day: (JSON key, the table's heading).
READS = (
    ("history_every_round", "history, every round"),
    ("history_newest_rounds", f"history, newest {HISTORY_ROUNDS} rounds"),
    ("leaderboard", "round's leaderboard"),
    ("agreement", "validators' agreement"),
    ("newest_20", "miner's newest 20"),
    ("validator_with_none", "reports of a validator with none"),
)


def hotkeys(count: int) -> list[str]:
    """The first ``count`` miners' hotkeys, the same in every run."""
    return [Keypair.create_from_seed(bytes([i % 256, i // 256]) * 16).ss58_address for i in range(count)]


class FixedChain(Chain):
    """The subnet's miners and 3 validators with equal stake, at a block the benchmark sets."""

    netuid, block_time_s = 1, BLOCK_S

    def __init__(self, miners: Sequence[str]) -> None:
        self.block = 1
        neurons = [NeuronInfo(i, hotkey, "ck", 0.0, False, None) for i, hotkey in enumerate(miners)]
        neurons += [NeuronInfo(len(miners) + v, f"validator{v}", "ck", 100.0, True, None) for v in range(VALIDATORS)]
        self.neurons = tuple(neurons)

    def current_block(self) -> int:
        return self.block

    def metagraph(self) -> Metagraph:
        return Metagraph(self.netuid, self.block, self.neurons)

    def owner_uid(self) -> int | None:
        return 0

    def hyperparameters(self):
        raise NotImplementedError

    def publish_endpoint(self, wallet, host: str, port: int) -> None:
        raise NotImplementedError

    def set_weights(self, wallet, weights, version_key, hotkeys=None):
        raise NotImplementedError

    def api_location(self):
        raise NotImplementedError

    def publish_api_location(self, wallet, location) -> None:
        raise NotImplementedError


@dataclass
class DayFigures:
    """The database after ``day`` days: its rows, its size and each of :data:`READS` timed;
    ``judged``: the newest round's submissions the leaderboard judged, ``history_rounds``: the
    rounds of the bounded history (what the timed reads found)."""

    day: int
    rounds: int
    submissions: int
    reports: int
    megabytes: float
    reads: dict[str, Timing]
    judged: int
    history_rounds: int


@dataclass
class CommitmentFigures:
    """The pending reveals after ``commitments`` never revealed: ``shown`` of them listed."""

    commitments: int
    shown: int
    timing: Timing


def api_config() -> ApiConfig:
    """The API's settings at their defaults (no .env, no environment), as the benchmark serves it."""
    return ApiConfig.from_settings(config.resolve({"api_hotkey": "api"}, environ={}, dotenv_path=None))


def service_over(path: Path, chain: Chain) -> tuple[Database, SubmissionService]:
    """The API's service over a fresh SQLite file at ``path``, upgraded to the newest schema."""
    database = Database(f"sqlite:///{path}")
    database.upgrade()
    return database, SubmissionService(api_config(), chain, database)


def fill_round(connection: sqlite3.Connection, miners: Sequence[str], round_id: int, ids: Iterator[int]) -> None:
    """Round ``round_id`` of the subnet's submissions and reports, in the API's tables."""
    submissions, reports = [], []
    for miner, hotkey in enumerate(miners):
        for k in range(PER_ROUND):
            sid = next(ids)
            block = round_id * ROUND_BLOCKS + k * 30
            evaluated = k >= PER_ROUND - EVALUATED
            submissions.append(
                (sid, hotkey, "direct", "ready" if evaluated else "superseded", 65536, block * BLOCK_S)
                + (block, block * BLOCK_S, block, round_id, f"https://github.com/m{miner}/fla", f"{sid:040x}")
                + (1e6 + sid, None, None, "10.0.0.1", None if evaluated else sid + 1)
            )
            for v in range(VALIDATORS if evaluated else 0):
                reports.append(
                    (sid, f"validator{v}", block * BLOCK_S + 100, "passed", True, True, 1e6 + sid)
                    + (None, "[]", LENGTHS, f"{sid:064x}")
                )
    connection.executemany(
        "INSERT INTO submissions (id, hotkey, method, state, target_sequence_length, submitted_at, "
        "submitted_block, ready_at, ready_block, round_id, fork_url, commit_hash, claimed_tokens_per_sec, "
        "vram_mb, benchmarks, client_ip, superseded_by) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        submissions,
    )
    connection.executemany(
        "INSERT INTO evaluation_reports (submission_id, validator_hotkey, reported_at, verdict, correct, "
        "logits_ok, measured_tokens_per_sec, benchmarks, reasons, lengths, content_hash) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        reports,
    )


def measure_days(path: Path, days: Sequence[int], miners: int, console: Console) -> list[DayFigures]:
    """Fill ``path`` up to each of ``days`` and time :data:`READS` there."""
    keys = hotkeys(miners)
    chain = FixedChain(keys)
    database, service = service_over(path, chain)
    reader = StatusReader(service)
    hotkey = keys[min(7, miners - 1)]

    def every_round() -> object:
        with database.read() as session:
            evaluated = evaluated_submissions(session, Submission.hotkey == hotkey)
            return service.judge(session, evaluated, service.electorate())

    found, ids, filled = [], itertools.count(1), 0
    connection = sqlite3.connect(path)
    with progress_bar(console) as progress:
        task = progress.add_task("rounds", total=max(days) * ROUNDS_PER_DAY)
        for day in days:
            progress.update(task, description=f"day {day}: writing rounds")
            with connection:
                for round_id in range(filled, day * ROUNDS_PER_DAY):
                    fill_round(connection, keys, round_id, ids)
                    progress.advance(task)
            filled = day * ROUNDS_PER_DAY
            chain.block = filled * ROUND_BLOCKS - 10  # late in the newest round filled
            newest = filled - 1
            progress.update(task, description=f"day {day}: timing the reads")
            calls: dict[str, Callable[[], Any]] = {
                "history_every_round": every_round,
                "history_newest_rounds": lambda: reader.history(hotkey),
                "leaderboard": functools.partial(service.judged_round, newest),
                "agreement": functools.partial(service.validator_agreement, newest),
                "newest_20": lambda: reader.submissions(hotkey, 20, 0),
                "validator_with_none": lambda: service.validator_reports("validator9", 0, 100),
            }
            reads, results = {}, {}
            for key, call in calls.items():
                reads[key], results[key] = timed(call, DAY_REPEATS)
            found.append(
                DayFigures(
                    day=day,
                    rounds=filled,
                    submissions=filled * miners * PER_ROUND,
                    reports=filled * miners * EVALUATED * VALIDATORS,
                    megabytes=path.stat().st_size / 1e6,
                    reads=reads,
                    judged=len(results["leaderboard"][0]),
                    history_rounds=len(results["history_newest_rounds"].rounds),
                )
            )
    connection.close()
    database.dispose()
    return found


def measure_commitments(path: Path, sizes: Sequence[int], console: Console) -> list[CommitmentFigures]:
    """Fill ``path`` up to each of ``sizes`` commitments never revealed and time the pending reveals there."""
    keys = hotkeys(COMMITTERS)
    chain = FixedChain(keys)
    database, service = service_over(path, chain)
    connection = sqlite3.connect(path)
    found, filled = [], 0
    with progress_bar(console) as progress:
        task = progress.add_task("commitments", total=len(sizes))
        for size in sizes:
            progress.update(task, description=f"{size:,} commitments")
            with connection:
                connection.executemany(
                    "INSERT INTO submissions (id, hotkey, method, state, commitment_hash, target_sequence_length, "
                    "submitted_at, submitted_block, client_ip) VALUES (?, ?, 'commit_reveal', 'committed', ?, 65536, "
                    "?, ?, '10.0.0.1')",
                    [
                        (i + 1, keys[i % COMMITTERS], f"{i:064x}", i * 1.2, i // COMMITMENTS_PER_BLOCK)
                        for i in range(filled, size)
                    ],
                )
            filled = size
            chain.block = filled // COMMITMENTS_PER_BLOCK + 5
            timing, pending = timed(lambda: service.pending_reveals(None, 100).pending, COMMITMENT_REPEATS)
            found.append(CommitmentFigures(filled, len(pending), timing))
            progress.advance(task)
    connection.close()
    database.dispose()
    return found


def days_table(figures: Sequence[DayFigures], miners: int) -> Table:
    """A column a day: the file, then each read's median and fastest–slowest."""
    table = Table(
        title=f"The API's database: {miners} miners, {PER_ROUND} submissions a round each, the newest "
        f"{EVALUATED} reported on by {VALIDATORS} validators; {DAY_REPEATS} calls a read: median, fastest–slowest",
        title_justify="left",
        header_style="bold",
    )
    table.add_column("after")
    for day in figures:
        table.add_column(f"day {day.day}", justify="right")
    table.add_row("submissions", *(f"{day.submissions:,}" for day in figures))
    table.add_row("file", *(f"{day.megabytes:,.0f} MB" for day in figures), end_section=True)
    for key, heading in READS:
        table.add_row(heading, *(day.reads[key].cell(0) for day in figures))
    return table


def commitments_table(figures: Sequence[CommitmentFigures]) -> Table:
    """One row a count of commitments: the pending reveals' median (fastest–slowest)."""
    table = Table(
        title=f"GET /pending_reveals: {COMMITTERS} hotkeys committing, never revealing; "
        f"{COMMITMENT_REPEATS} calls a count, median (fastest–slowest)",
        title_justify="left",
        header_style="bold",
    )
    table.add_column("commitments never revealed", justify="right")
    table.add_column("pending shown", justify="right")
    table.add_column("pending reveals", justify="right")
    for each in figures:
        table.add_row(f"{each.commitments:,}", str(each.shown), each.timing.line(1))
    return table


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench api-month") -> int:
    """Measure the days and the commitments asked for and print their tables."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].replace("``", ""))
    add_increasing_counts(
        parser, "--days", help="the days after which to time the reads (default 1 7 14 30, unless --commitments alone)"
    )
    parser.add_argument(
        "--miners", type=counts, default=SUBNET_MINERS, help=f"miners submitting (default {SUBNET_MINERS})"
    )
    add_increasing_counts(
        parser,
        "--commitments",
        help="also time the pending reveals after N commitments never revealed (e.g. 10000 100000 400000)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help=f"write the databases ({DATABASE_FILE}, {COMMITMENTS_FILE}) into DIR and keep them "
        "(default: a temporary folder, removed after)",
    )
    parser.add_argument("--json", type=json_file, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.miners > SUBNET_MINERS:
        parser.error(f"--miners: a subnet holds {SUBNET_MINERS} miners beside its validators")
    days = args.days or ([] if args.commitments else [1, 7, 14, 30])
    setup_logging(quiet=True)
    console = Console()
    folder, temporary = files_folder(args.keep, [DATABASE_FILE, COMMITMENTS_FILE])
    try:
        day_figures = measure_days(folder / DATABASE_FILE, days, args.miners, console) if days else []
        commitment_figures = (
            measure_commitments(folder / COMMITMENTS_FILE, args.commitments, console) if args.commitments else []
        )
    finally:
        if temporary:
            temporary.cleanup()
    if day_figures:
        console.print(days_table(day_figures, args.miners))
    if commitment_figures:
        console.print(commitments_table(commitment_figures))
    if args.json:
        figures = {"days": [asdict(f) for f in day_figures], "commitments": [asdict(f) for f in commitment_figures]}
        args.json.write_text(json.dumps(figures, indent=1))
    return 0
