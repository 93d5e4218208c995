"""The submission API's SQLite database after days of a full subnet, and what a miner's history costs.

A full subnet: 256 miners submitting 10 times an hour (12 submissions a 72-minute round), of which
the newest 4 a round are reported on by each of 3 validators and the rest superseded. The rows go
straight into the API's own schema (Database.upgrade), round by round; at each checkpoint day the
script times, on the same database and block, the newest round's leaderboard and agreement, a
miner's newest submissions, the reports of a validator that sent none, and a miner's history as
StatusReader.history reads it (its newest HISTORY_ROUNDS rounds) and as it was read before (every
round the miner played, judged the same way). Figures: benchmarks/RESULTS.md, "A month of
submissions".

    python benchmarks/api_month.py /tmp/api_month.sqlite3 1 7 14 30
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator

from bittensor.sp_core import Keypair

from quasar import config
from quasar.api.db import Database, Submission
from quasar.api.judging import evaluated_submissions
from quasar.api.service import ApiConfig, SubmissionService
from quasar.api.status import HISTORY_ROUNDS, StatusReader
from quasar.chain import Chain, Metagraph, NeuronInfo

MINERS, VALIDATORS, PER_ROUND, EVALUATED = 256, 3, 12, 4
ROUND_BLOCKS, BLOCK_S = 360, 12.0
ROUNDS_PER_DAY = round(86400 / (ROUND_BLOCKS * BLOCK_S))
HOTKEYS = [Keypair.create_from_seed(bytes([i % 256, i // 256]) * 16).ss58_address for i in range(MINERS)]
LENGTHS = json.dumps(
    [
        {"seq_len": t, "status": "ok", "tokens_per_sec": 1e6, "peak_vram_mb": 1000, "correct": True}
        for t in (512, 1024, 2048, 65536)
    ]
)


class FixedChain(Chain):
    """The subnet's 256 miners and 3 validators with equal stake, at a block the script sets."""

    netuid, block_time_s = 1, BLOCK_S

    def __init__(self) -> None:
        self.block = 1
        miners = [NeuronInfo(i, HOTKEYS[i], "ck", 0.0, False, None) for i in range(MINERS)]
        validators = [NeuronInfo(MINERS + v, f"validator{v}", "ck", 100.0, True, None) for v in range(VALIDATORS)]
        self.neurons = tuple(miners + validators)

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


def fill(path: str, rounds: range, ids: Iterator[int]) -> None:
    """Rounds ``rounds`` of the full subnet's submissions and reports, in the API's tables."""
    connection = sqlite3.connect(path)
    with connection:
        for round_id in rounds:
            submissions, reports = [], []
            for miner in range(MINERS):
                for k in range(PER_ROUND):
                    sid = next(ids)
                    block = round_id * ROUND_BLOCKS + k * 30
                    evaluated = k >= PER_ROUND - EVALUATED
                    submissions.append(
                        (sid, HOTKEYS[miner], "direct", "ready" if evaluated else "superseded", 65536, block * BLOCK_S)
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
    connection.close()


def timed(call: Callable[..., object], *args: object, repeats: int = 7) -> str:
    """Median, fastest and slowest of ``repeats`` calls ``call(*args)``, in milliseconds."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call(*args)
        times.append((time.perf_counter() - started) * 1000)
    return f"median {statistics.median(times):.0f} ms ({min(times):.0f}–{max(times):.0f}, n={repeats})"


def main(path: str, days: list[int]) -> None:
    """Fill ``path`` up to each of ``days`` and print the history's cost there."""
    database = Database(f"sqlite:///{path}")
    database.upgrade()
    chain = FixedChain()
    settings = config.resolve({"api_hotkey": "api"}, environ={}, dotenv_path=None)
    service = SubmissionService(ApiConfig.from_settings(settings), chain, database)
    reader = StatusReader(service)
    hotkey = HOTKEYS[7]

    def every_round() -> object:
        with database.read() as session:
            evaluated = evaluated_submissions(session, Submission.hotkey == hotkey)
            return service.judge(session, evaluated, service.electorate())

    ids, filled = itertools.count(1), 0
    for day in days:
        fill(path, range(filled, day * ROUNDS_PER_DAY), ids)
        filled = day * ROUNDS_PER_DAY
        chain.block = filled * ROUND_BLOCKS - 10  # late in the newest round filled
        newest = filled - 1
        print(
            f"day {day}: {filled} rounds, {filled * MINERS * PER_ROUND} submissions, "
            f"{os.path.getsize(path) / 1e6:.0f} MB; a miner's history, every round: {timed(every_round)}; "
            f"newest {HISTORY_ROUNDS} rounds: {timed(lambda: reader.history(hotkey))}; "
            f"the round's leaderboard: {timed(service.judged_round, newest)}; "
            f"its validators' agreement: {timed(service.validator_agreement, newest)}; "
            f"a miner's newest 20 submissions: {timed(lambda: reader.submissions(hotkey, 20, 0))}; "
            f"the reports of a validator with none: {timed(service.validator_reports, 'validator9', 0, 100)}",
            flush=True,
        )
    database.dispose()


if __name__ == "__main__":
    main(sys.argv[1], [int(day) for day in sys.argv[2:]])
