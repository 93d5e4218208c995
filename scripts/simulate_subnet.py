#!/usr/bin/env python
"""A whole subnet in compressed time against the real submission API: does the work schedule keep up?

Starts the API (``quasar.api.app``, the protocol it ships with) in a process of its own over a fresh
SQLite file or throwaway PostgreSQL server, on an embedded dev chain, with every clock sped up
``--speedup`` times: the chain's blocks, the API's rate limits, leases and rounds, and the
validators' clocks. Then, for ``--rounds`` rounds of ``--round-blocks`` blocks:

- ``--miners`` hotkeys submit at their limit (``SUBMISSIONS_PER_HOUR``, signed, each from an
  address of its own behind the API's trusted proxy): the honest ones a kernel a little faster each
  time, claiming a little under what it runs at; ``--spammers`` of them slow but correct kernels,
  claimed honestly; ``--copiers`` of them the round's leader's kernel, as its commit (refused) and
  as the same files under a commit of their own, claiming 3% more;
- ``--validators`` validators run the validator's own loop (``quasar.validator.loop.Validator``:
  fetch, evaluate, check logits, report, set weights) with ``--workers`` devices each, the same
  code path as on GPUs but for the evaluation: a stand-in that takes ``--eval-seconds`` (simulated)
  and measures a kernel's true speed with 1% noise; logit checks pass.

After the last round the miners stop and the validators get one more round to drain the queue. Reported per round,
from the API's database and the simulation's ground truth: the queue (ready submissions a
validator has not reported on, sampled); the time from an honest submission to the first
evaluation of it or of a newer submission of its hotkey (which superseded it), median, p95 and
max; the GPU time used, of the validators' devices, and spent on submissions that could not place
(copies, and those whose upper bound, claim x multiplier, was below the leaderboard's fourth place
when their evaluation started); whether every validator evaluated every honest hotkey's newest
submission within one round (each honest submission, or a newer one of its hotkey, reported on by
each validator within a round of it); and whether the API's top four are the true top four (the
four best among the submissions that at least two validators reported on, ranked by the subnet's
rules with each kernel's true speed as its measurement).
``--without-spammers-too`` first runs the same subnet without the spammers (the same honest miners
and copiers) and compares the honest miners' median wait.

    python scripts/simulate_subnet.py --backend both --validators 3 --workers 8 --eval-seconds 25 \\
        --rounds 6 --speedup 100 --without-spammers-too

(a full subnet: 256 uids, the validators' and 253 miners'.)

Traffic goes to loopback only.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import logging
import math
import multiprocessing
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from bittensor.sp_core import Keypair
from rich.console import Console
from rich.table import Table
from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import bittensor as bt  # noqa: E402

from quasar import config, scheduling, scoring  # noqa: E402
from quasar.api.__main__ import GIL_SWITCH_INTERVAL_S  # noqa: E402
from quasar.api.client import ApiClient, ApiClientError  # noqa: E402
from quasar.api.db import Database, EvaluationReport, Submission  # noqa: E402
from quasar.api.devdb import TemporaryPostgres, free_port  # noqa: E402
from quasar.chain.devchain import MAX_NEURONS, DevChain  # noqa: E402
from quasar.inference.client import LogitCheck  # noqa: E402
from quasar.validator.devices import Device  # noqa: E402
from quasar.validator.evaluator import EvaluationOutcome  # noqa: E402
from quasar.validator.loop import Validator  # noqa: E402
from quasar.validator.state import EvaluationKey, EvaluationResult, ValidatorState  # noqa: E402

TARGET = 1_000_000  # every kernel is submitted at 1M (multiplier 3)
BLOCK_S = 12.0  # simulated seconds per block, as on Bittensor
HONEST, SPAM, COPY = "honest", "spam", "copy"
NOISE = 0.01  # a validator's measurement: the true speed within 1%
FOURTH_PLACE_EVERY_S = 60.0  # simulated seconds between two samples of the leaderboard and the queue
NETUID = 24
MEMORY_DIR = Path("/dev/shm")


class SimClock:
    """Simulated unix time: ``start`` plus ``speedup`` times the real time since ``real_start``."""

    def __init__(self, start: float, real_start: float, speedup: float):
        self.start, self.real_start, self.speedup = start, real_start, speedup

    def __call__(self) -> float:
        return self.start + (time.time() - self.real_start) * self.speedup

    def real_seconds(self, simulated: float) -> float:
        return simulated / self.speedup


def serve_api(database_url: str, chain_path: str, api_hotkey: str, port: int, clock: tuple[float, float, float],
              round_blocks: int, submissions_per_hour: int) -> None:
    """The API process: the app with the simulation's clock, served as ``python -m quasar.api`` serves it."""
    import uvicorn

    from quasar.api.app import create_app
    from quasar.api.protocol import protocol_factory
    from quasar.api.service import ApiConfig

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)

    settings = config.resolve({}, environ={}, dotenv_path=None)
    api_config = ApiConfig(
        api_hotkey=api_hotkey, blocks_until_reveal=settings.blocks_until_reveal,
        reveal_window_blocks=settings.reveal_window_blocks, round_blocks=round_blocks,
        submissions_per_hour=submissions_per_hour, evaluation_lease_s=settings.evaluation_lease_s,
        trusted_proxies=("127.0.0.1",), allow_local_forks=False, tie_epsilon=settings.tie_epsilon,
        quorum_stake_share=settings.quorum_stake_share, quorum_min_validators=settings.quorum_min_validators)
    app = create_app(api_config, DevChain(chain_path), database_url, clock=SimClock(*clock))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", log_config=None, access_log=False,
                proxy_headers=False, http=protocol_factory(settings.api_max_header_bytes, settings.api_header_timeout))


@dataclass
class Kernel:
    """The ground truth of one submitted kernel."""

    hotkey: str
    kind: str
    true_speed: float  # tokens/s at the target
    content: str  # what its kernel files hash to (copies share their original's)
    submission_id: int | None = None


@dataclass
class World:
    """What the simulation knows that the subnet does not: each kernel's truth, and the GPU time."""

    kernels: dict[tuple[str, str], Kernel] = field(default_factory=dict)  # (fork URL, commit) -> truth
    evaluations: list[tuple[str, str, float]] = field(default_factory=list)  # (fork URL, commit, sim time)
    refused_copies: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class StandInEvaluation:
    """One evaluation on a stand-in GPU: done ``real_s`` seconds after it started."""

    def __init__(self, key: EvaluationKey, device: Device, done_at: float, result: EvaluationResult):
        self.key, self.device = key, device
        self._done_at, self._result = done_at, result
        self._outcome: EvaluationOutcome | None = None

    def poll(self) -> EvaluationOutcome | None:
        if self._outcome is None and time.monotonic() >= self._done_at:
            self._outcome = EvaluationOutcome(result=self._result)
        return self._outcome

    def cancel(self) -> None:
        self._done_at = time.monotonic()

    def kill(self) -> None:
        self.cancel()


class StandInEvaluator:
    """The validator's evaluator with the GPU replaced: it takes ``eval_s`` simulated seconds and
    measures the kernel's true speed within ``NOISE``; the kernel files' content hash is the truth's."""

    def __init__(self, world: World, clock: SimClock, eval_s: float, rng: random.Random):
        self.world, self.clock, self.eval_s, self.rng = world, clock, eval_s, rng

    def start(self, key: EvaluationKey, device: Device) -> StandInEvaluation:
        with self.world.lock:
            kernel = self.world.kernels[(key.fork_url, key.commit_hash)]
            self.world.evaluations.append((key.fork_url, key.commit_hash, self.clock()))
            measured = kernel.true_speed * (1 + self.rng.gauss(0, NOISE))
        result = EvaluationResult(correct=True, measured_tokens_per_sec=measured, benchmarks={TARGET: measured},
                                  content_hash=hashlib.sha256(kernel.content.encode()).hexdigest())
        return StandInEvaluation(key, device, time.monotonic() + self.clock.real_seconds(self.eval_s), result)


class PassingLogitChecker:
    """Logit checks are not what this simulation measures: every miner passes."""

    def check(self, endpoint_url: str, miner_hotkey: str) -> LogitCheck:
        return LogitCheck(passed=True, reason="simulated")


@dataclass
class Miner:
    name: str
    kind: str
    key: Keypair
    address: str
    speed: float  # its kernel's true speed now (honest and spam)
    rng: random.Random  # its own choices: when it starts, how it improves, what it claims


def new_wallet(root: Path, name: str) -> bt.Wallet:
    """A real bittensor wallet (unencrypted keys) under ``root``."""
    wallet = bt.Wallet(name=name, hotkey="default", path=str(root))
    wallet.create_new_coldkey(use_password=False, overwrite=True, suppress=True)
    wallet.create_new_hotkey(use_password=False, overwrite=True, suppress=True)
    return wallet


def new_commit(rng: random.Random) -> str:
    return f"{rng.getrandbits(160):040x}"


class Miners:
    """Every miner submitting at its limit, from one scheduler thread and a pool of HTTP threads."""

    def __init__(self, miners: list[Miner], url: str, api_hotkey: str, world: World, clock: SimClock,
                 interval_s: float, threads: int = 8):
        self.miners, self.url, self.api_hotkey, self.world, self.clock = miners, url, api_hotkey, world, clock
        self.interval_s = interval_s
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="miner")
        self.local = threading.local()
        self.stopping = threading.Event()
        self.errors: dict[str, int] = defaultdict(int)

    def client(self, miner: Miner) -> ApiClient:
        """This thread's client for ``miner`` (signed by its key, from its own address)."""
        clients = getattr(self.local, "clients", None)
        if clients is None:
            clients = self.local.clients = {}
        if miner.name not in clients:
            clients[miner.name] = ApiClient(self.url, miner.key, api_hotkey=self.api_hotkey, http=httpx.Client(
                timeout=60, headers={"X-Forwarded-For": miner.address}))
        return clients[miner.name]

    def run(self, until: float) -> None:
        """Submit until simulated time ``until`` (each miner at its limit, starting at a random moment)."""
        due = [(self.clock() + miner.rng.uniform(0, self.interval_s), n) for n, miner in enumerate(self.miners)]
        heapq.heapify(due)
        while due and not self.stopping.is_set():
            when, n = heapq.heappop(due)
            if when >= until:
                break
            self.stopping.wait(max(0.0, self.clock.real_seconds(when - self.clock())))
            self.pool.submit(self.submit, self.miners[n])
            # At the limit: never more than SUBMISSIONS_PER_HOUR inside any hour.
            heapq.heappush(due, (when + self.interval_s * self.miners[n].rng.uniform(1.0, 1.05), n))

    def submit(self, miner: Miner) -> None:
        try:
            if miner.kind == COPY:
                self.copy(miner)
            else:
                self.submit_own(miner)
        except ApiClientError as error:
            self.errors[f"{miner.kind} {error.status}"] += 1
        except Exception as error:  # noqa: BLE001  (one miner's failure must not stop the others)
            self.errors[f"{miner.kind} {type(error).__name__}"] += 1

    def submit_own(self, miner: Miner) -> None:
        if miner.kind == HONEST:
            miner.speed *= 1 + miner.rng.uniform(0.0, 0.004)  # a little faster each time
        fork, commit = f"https://github.com/{miner.name}/flash-linear-attention", new_commit(miner.rng)
        kernel = Kernel(miner.key.ss58_address, miner.kind, miner.speed, f"{miner.name}:{commit}")
        with self.world.lock:
            self.world.kernels[(fork, commit)] = kernel
        claim = miner.speed * (miner.rng.uniform(0.97, 0.99) if miner.kind == HONEST else 1.0)
        kernel.submission_id = self.client(miner).submit_kernel(fork, commit, TARGET, claim).submission_id

    def copy(self, miner: Miner) -> None:
        """The round's leader's kernel: as its own commit (the API refuses it), then the same files
        under a commit of the copier's own, claimed 3% higher."""
        client = self.client(miner)
        board = client.leaderboard()
        if not board.entries:
            return
        leader = client.submission_status(board.entries[0].submission_id)
        with self.world.lock:
            original = self.world.kernels[(leader.fork_url, leader.commit_hash)]
        try:
            client.submit_kernel(f"https://github.com/{miner.name}/fla", leader.commit_hash, TARGET,
                                 leader.claimed_tokens_per_sec * 1.03)
        except ApiClientError as error:
            if error.status != 409:
                raise
            with self.world.lock:
                self.world.refused_copies += 1
        fork, commit = f"https://github.com/{miner.name}/flash-linear-attention", new_commit(miner.rng)
        kernel = Kernel(miner.key.ss58_address, COPY, original.true_speed, original.content)
        with self.world.lock:
            self.world.kernels[(fork, commit)] = kernel
        kernel.submission_id = client.submit_kernel(fork, commit, TARGET,
                                                    leader.claimed_tokens_per_sec * 1.03).submission_id

    def close(self) -> None:
        self.stopping.set()
        self.pool.shutdown(wait=True)


@dataclass
class RoundFigures:
    round_id: int
    submissions: int  # honest
    superseded: int  # honest, replaced by a newer one of their hotkey before any report
    # honest: from a submission to the first evaluation of it or of a newer one of its hotkey,
    # median / p95 / max minutes
    waits_min: tuple[float, float, float] | None
    unevaluated: int  # honest, neither it nor a newer one of its hotkey evaluated at the end
    queue_mean: float  # ready submissions some validator has not reported on, sampled
    queue_max: int
    gpu_hours: float
    gpu_hours_not_placeable: float
    gpu_capacity_hours: float  # the validators' devices for the round
    newest_within_round: bool  # every validator evaluated every honest hotkey's newest within a round
    newest_worst_min: float
    newest_late: int  # (honest submission, validator) pairs past a round
    top4: list[str]
    true_top4: list[str]

    @property
    def top4_true(self) -> bool:
        return self.top4 == self.true_top4


@dataclass
class RunFigures:
    backend: str
    miners: int
    spammers: int
    copiers: int
    validators: int
    workers: int
    eval_seconds: float
    round_blocks: int
    speedup: float
    wall_s: float
    rounds: list[RoundFigures]
    refused_copies: int
    miner_errors: dict[str, int]
    honest_wait_median_min: float | None


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def sample_queue(database: Database, validators: list[str], first_round: int) -> int:
    """The longest queue over the validators: ready submissions of the scheduled rounds it has not reported on."""
    longest = 0
    with database.read() as session:
        ready = session.scalars(select(Submission.id).where(Submission.state == "ready",
                                                            Submission.round_id >= first_round)).all()
        reported = session.execute(select(EvaluationReport.validator_hotkey, EvaluationReport.submission_id)
                                   .where(EvaluationReport.submission_id.in_(ready))).all() if ready else []
    done = defaultdict(set)
    for validator, submission_id in reported:
        done[validator].add(submission_id)
    for validator in validators:
        longest = max(longest, len(set(ready) - done[validator]))
    return longest


def evaluations_of_newest(submissions: dict[int, Submission], by_submission: dict[int, dict[str, float]],
                          validators: list[str]) -> dict[int, dict[str, float]]:
    """Per submission and validator: when the validator first reported on it or on a newer
    submission of the same hotkey (by ready time); a validator missing had done neither."""
    by_hotkey: dict[str, list[Submission]] = defaultdict(list)
    for row in submissions.values():
        by_hotkey[row.hotkey].append(row)
    evaluated_by: dict[int, dict[str, float]] = {}
    for rows in by_hotkey.values():
        earliest: dict[str, float] = {}
        for row in sorted(rows, key=lambda row: (row.ready_at, row.id), reverse=True):
            for validator in validators:
                at = by_submission.get(row.id, {}).get(validator)
                if at is not None:
                    earliest[validator] = min(at, earliest.get(validator, math.inf))
            evaluated_by[row.id] = dict(earliest)
    return evaluated_by


def fourth_place_at(samples: list[tuple[float, float | None]], when: float) -> float | None:
    """The leaderboard's fourth place as last sampled at or before ``when`` (None: none yet)."""
    earlier = [fourth for at, fourth in samples if at <= when]
    return earlier[-1] if earlier else None


def figures_per_round(database: Database, world: World, validators: list[str], workers: int, first_round: int,
                      rounds: int, round_s: float, eval_s: float, leaderboards: dict[int, list[str]],
                      queue: dict[int, list[int]],
                      fourth_places: dict[int, list[tuple[float, float | None]]]
                      ) -> tuple[list[RoundFigures], list[float]]:
    """Each round's figures from the API's database and the ground truth (module docstring), and
    every honest submission's wait (minutes) until it, or a newer submission of its hotkey, was
    first evaluated; the simulation's rounds are numbered from 0, the chain's from ``first_round``."""
    with database.read() as session:
        submissions = {row.id: row for row in session.scalars(select(Submission).where(Submission.round_id.is_not(None)))}
        reports = session.execute(select(EvaluationReport.submission_id, EvaluationReport.validator_hotkey,
                                         EvaluationReport.reported_at)).all()
    by_submission: dict[int, dict[str, float]] = defaultdict(dict)
    for submission_id, validator, reported_at in reports:
        by_submission[submission_id][validator] = reported_at
    kernels = {kernel.submission_id: kernel for kernel in world.kernels.values() if kernel.submission_id is not None}
    evaluated_at = defaultdict(list)  # round -> (kernel, its upper bound, when its evaluation started)
    for fork, commit, when in world.evaluations:
        kernel = world.kernels[(fork, commit)]
        row = submissions.get(kernel.submission_id)
        if row is not None:
            bound = scheduling.upper_bound(row.claimed_tokens_per_sec, row.target_sequence_length)
            evaluated_at[row.round_id - first_round].append((kernel, bound, when))
    evaluated_by = evaluations_of_newest(submissions, by_submission, validators)
    figures, all_waits = [], []
    for round_id in range(rounds):
        mine = {sid: row for sid, row in submissions.items() if row.round_id == first_round + round_id}
        honest = [row for sid, row in mine.items() if kernels.get(sid) and kernels[sid].kind == HONEST]
        waits = sorted((min(evaluated_by[row.id].values()) - row.ready_at) / 60 for row in honest
                       if evaluated_by[row.id])
        all_waits += waits
        # The ranking a perfect measurement would give what the validators judged (a superseded
        # kernel never was), by the subnet's own rules; copies are not ranked.
        truth = [scoring.Result(hotkey=row.hotkey, submission_id=sid, submitted_at=row.submitted_at,
                                target_sequence_length=row.target_sequence_length,
                                claimed_tokens_per_sec=row.claimed_tokens_per_sec,
                                measured_tokens_per_sec=kernels[sid].true_speed, correct=True, logits_ok=True)
                 for sid, row in mine.items()
                 if sid in kernels and kernels[sid].kind != COPY
                 and len(by_submission.get(sid, ())) >= min(2, len(validators))]
        true_top4 = [placement.hotkey for placement in scoring.rank(truth).placements[:4]]
        spent = evaluated_at[round_id]
        not_placeable = []
        for kernel, bound, when in spent:
            fourth = fourth_place_at(fourth_places.get(round_id, []), when)
            if kernel.kind == COPY or (fourth is not None and bound < fourth):
                not_placeable.append(kernel)
        # Each validator, for each honest submission: how long until it evaluated it or a newer one
        # of the same hotkey (a newer one supersedes it: evaluating that is evaluating the newest).
        delays = [evaluated_by[row.id].get(validator, math.inf) - row.ready_at
                  for row in honest for validator in validators]
        worst = max(delays, default=0.0)
        samples = queue.get(round_id, [])
        figures.append(RoundFigures(
            round_id=round_id, submissions=len(honest),
            superseded=sum(1 for row in honest if row.state == "superseded"),
            waits_min=(statistics.median(waits), percentile(waits, 0.95), waits[-1]) if waits else None,
            unevaluated=sum(1 for row in honest if not evaluated_by[row.id]),
            queue_mean=statistics.fmean(samples) if samples else 0.0, queue_max=max(samples, default=0),
            gpu_hours=len(spent) * eval_s / 3600, gpu_hours_not_placeable=len(not_placeable) * eval_s / 3600,
            gpu_capacity_hours=len(validators) * workers * round_s / 3600,
            newest_within_round=worst <= round_s, newest_worst_min=worst / 60,
            newest_late=sum(1 for delay in delays if delay > round_s),
            top4=leaderboards.get(round_id, []), true_top4=true_top4))
    return figures, all_waits


def run(backend: str, args: argparse.Namespace, spammers: int, console: Console) -> RunFigures:
    """One simulation on ``backend`` with ``spammers`` spamming hotkeys (0 or ``args.spammers``)."""
    round_s = args.round_blocks * BLOCK_S
    with tempfile.TemporaryDirectory(prefix="quasar-sim-") as folder:
        workdir = Path(folder)
        postgres = TemporaryPostgres(durable=False).start() if backend == "postgresql" else None
        try:
            database_url = postgres.create_database("quasar_sim") if postgres else f"sqlite:///{workdir}/api.sqlite3"
            Database(database_url).upgrade()
            chain = DevChain(workdir / "devchain.sqlite3", netuid=NETUID, block_time_s=BLOCK_S / args.speedup)
            api_key = Keypair.create_from_seed(secrets.token_bytes(32))
            wallets = [new_wallet(workdir / "wallets", f"validator{n}") for n in range(args.validators)]
            for wallet in wallets:  # equal stakes
                chain.register_wallet(wallet, stake=1e4, validator_permit=True)
            honest = args.miners - args.spammers - args.copiers  # the same honest miners with or without spam
            crowd_kinds = [(SPAM, i) for i in range(spammers)] + [(COPY, i) for i in range(args.copiers)]
            crowd_kinds += [(HONEST, i) for i in range(honest)]
            miners = []
            for n, (kind, i) in enumerate(crowd_kinds):
                name = f"{kind}{i}"
                own = random.Random(f"{args.seed}-{name}")  # the same miner in every run
                key = Keypair.create_from_seed(own.randbytes(32))
                chain.register(key.ss58_address, key.ss58_address)
                chain.publish_endpoint(key, f"192.0.2.{n % 250 + 1}", 8001)
                speed = 1e6 * math.exp(own.gauss(0, 0.35)) * (0.05 if kind == SPAM else 1.0)
                miners.append(Miner(name, kind, key, f"10.{n // 250}.{n % 250}.1", speed, random.Random(own.random())))
            clock = SimClock(time.time(), time.time(), args.speedup)
            port = free_port()
            server = multiprocessing.get_context("spawn").Process(
                target=serve_api, args=(database_url, str(chain.path), api_key.ss58_address, port,
                                        (clock.start, clock.real_start, clock.speedup), args.round_blocks,
                                        args.submissions_per_hour), daemon=True)
            server.start()
            url = f"http://127.0.0.1:{port}"
            wait_for_api(url, server)
            world = World()
            settings = config.resolve({"network": "devchain", "netuid": str(NETUID), "device": "cpu",
                                       "epoch_blocks": str(args.round_blocks)}, environ={}, dotenv_path=None)
            validators: list[Validator] = []
            # The validators' state files in memory where the host has it: their fsyncs are not what
            # this simulation measures, and 24 devices finishing every second of compressed time make
            # a hundred of them a second.
            states = Path(tempfile.mkdtemp(prefix="quasar-sim-validators-", dir=MEMORY_DIR if MEMORY_DIR.is_dir()
                                           else workdir))
            started_validators = threading.Barrier(args.validators + 1)

            def validate(index: int, wallet: bt.Wallet) -> None:
                """One validator's loop, in a thread of its own (its state file is this thread's)."""
                with ValidatorState.open(states / f"validator{index}.sqlite3") as state, \
                        ApiClient(url, wallet, api_hotkey=api_key.ss58_address, timeout=60) as api:
                    validator = Validator(
                        settings, chain, api, wallet, StandInEvaluator(world, clock, args.eval_seconds,
                                                                       random.Random(index)),
                        PassingLogitChecker(), state, devices=[Device(f"gpu{n}", str(n)) for n in range(args.workers)],
                        clock=clock, interval_s=clock.real_seconds(1.0))
                    validators.append(validator)
                    started_validators.wait()
                    validator.run_forever()

            loops = [threading.Thread(target=validate, args=(index, wallet), name=f"validator{index}", daemon=True)
                     for index, wallet in enumerate(wallets)]
            for loop in loops:
                loop.start()
            started_validators.wait()
            console.print(f"[bold]{backend}[/]: {len(miners)} miners ({spammers} spamming, {args.copiers} copying), "
                          f"{args.validators} validators x {args.workers} workers, {args.eval_seconds:g} s "
                          f"evaluations, {args.rounds} rounds of {args.round_blocks} blocks, {args.speedup:g}x")
            database = Database(database_url)
            block = chain.current_block()  # the first round starts now
            chain.advance(args.round_blocks - block % args.round_blocks)
            first_round = chain.current_block() // args.round_blocks
            started = time.monotonic()
            end = clock() + args.rounds * round_s
            crowd = Miners(miners, url, api_key.ss58_address, world, clock, 3600.0 / args.submissions_per_hour)
            submitting = threading.Thread(target=crowd.run, args=(end,), name="miners")
            submitting.start()
            queue: dict[int, list[int]] = defaultdict(list)
            fourth_places: dict[int, list[tuple[float, float | None]]] = defaultdict(list)
            leaderboards: dict[int, list[str]] = {}
            public = ApiClient(url)
            validator_hotkeys = [wallet.hotkey.ss58_address for wallet in wallets]
            while clock() < end + round_s:  # then a round for the validators to drain the queue
                current = chain.current_block() // args.round_blocks
                if clock() < end:
                    queue[current - first_round].append(sample_queue(database, validator_hotkeys, current - 1))
                board = public.leaderboard()
                fourth_places[board.round_id - first_round].append(
                    (clock(), scheduling.fourth_place(entry.weighted_score for entry in board.entries)))
                time.sleep(clock.real_seconds(FOURTH_PLACE_EVERY_S))
            submitting.join()
            crowd.close()
            for validator in validators:
                validator.request_stop()
            for loop in loops:
                loop.join(timeout=60)
            for offset in range(args.rounds):
                board = public.leaderboard(first_round + offset)
                leaderboards[offset] = [entry.hotkey for entry in board.entries[:4]]
            public.close()
            shutil.rmtree(states, ignore_errors=True)
            wall_s = time.monotonic() - started
            figures, waits = figures_per_round(database, world, validator_hotkeys, args.workers, first_round,
                                               args.rounds, round_s, args.eval_seconds, leaderboards, queue,
                                               fourth_places)
            database.dispose()
            server.terminate()
            server.join(timeout=30)
        finally:
            if postgres:
                postgres.stop()
    return RunFigures(backend=backend, miners=len(miners), spammers=spammers, copiers=args.copiers,
                      validators=args.validators, workers=args.workers, eval_seconds=args.eval_seconds,
                      round_blocks=args.round_blocks, speedup=args.speedup, wall_s=wall_s, rounds=figures,
                      refused_copies=world.refused_copies, miner_errors=dict(crowd.errors),
                      honest_wait_median_min=statistics.median(waits) if waits else None)


def wait_for_api(url: str, server: multiprocessing.process.BaseProcess, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.is_alive():
            raise SystemExit("the API process exited")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"the API did not answer within {timeout_s:g} s")


def figures_table(run_figures: RunFigures) -> Table:
    """One row per round, in 80 columns."""
    table = Table(title=f"{run_figures.backend}: per round, in simulated time. queue: mean/max; p50 p95 max: "
                        f"minutes to an honest submission's first evaluation; GPU h: used/the devices'; no "
                        f"place: share of it on what could not place", title_justify="left")
    for column in ("round", "queue", "p50", "p95", "max", "GPU h", "no place", "newest", "top 4"):
        table.add_column(column, justify="left" if column in ("round", "newest", "top 4") else "right")
    for item in run_figures.rounds:
        waits = ("-", "-", "-") if item.waits_min is None else tuple(f"{value:.1f}" for value in item.waits_min)
        share = item.gpu_hours_not_placeable / item.gpu_hours if item.gpu_hours else 0.0
        table.add_row(str(item.round_id + 1), f"{item.queue_mean:.0f}/{item.queue_max}", *waits,
                      f"{item.gpu_hours:.3g}/{item.gpu_capacity_hours:.3g}", f"{share:.0%}",
                      "yes" if item.newest_within_round else f"no {item.newest_worst_min:.0f}m",
                      "true" if item.top4_true else "NOT")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="sqlite")
    parser.add_argument("--miners", type=int, default=None,
                        help="hotkeys submitting, spammers and copiers included (default: the rest of a full "
                             "subnet's 256 uids beside the validators)")
    parser.add_argument("--spammers", type=int, default=10, help="hotkeys submitting slow kernels at the limit")
    parser.add_argument("--copiers", type=int, default=5, help="hotkeys copying the round's leader")
    parser.add_argument("--validators", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="devices (GPUs) per validator")
    parser.add_argument("--eval-seconds", type=float, default=25.0, help="simulated seconds one evaluation takes")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-blocks", type=int, default=int(config.OPTIONS_BY_KEY["round_blocks"].default))
    parser.add_argument("--submissions-per-hour", type=int,
                        default=int(config.OPTIONS_BY_KEY["submissions_per_hour"].default))
    parser.add_argument("--speedup", type=float, default=50.0, help="simulated seconds per real second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--without-spammers-too", action="store_true",
                        help="also run without the spammers first, and compare the honest miners' median wait")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.miners is None:
        args.miners = MAX_NEURONS - args.validators
    if args.miners + args.validators > MAX_NEURONS:
        parser.error(f"a subnet holds {MAX_NEURONS} uids: --miners and --validators together at most that")
    # The validators' and the API's own lines (a superseded submission's refused report, ...) are
    # the subnet working as it should: the figures say what it did.
    logging.getLogger("quasar").setLevel(logging.ERROR)
    if args.spammers + args.copiers >= args.miners:
        parser.error("--miners must leave room for honest miners beside the spammers and copiers")
    # Many threads (the validators' loops, the miners) share this process: hand the interpreter
    # over as often as the API's own processes do, so none waits on the others for long.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    console = Console()
    results = []
    for backend in (("sqlite", "postgresql") if args.backend == "both" else (args.backend,)):
        if args.without_spammers_too:
            baseline = run(backend, args, 0, console)
            console.print(figures_table(baseline))
            results.append(baseline)
        figures = run(backend, args, args.spammers, console)
        console.print(figures_table(figures))
        console.print(f"{figures.refused_copies} copies of a leader's commit refused; miner errors: "
                      f"{figures.miner_errors or 'none'}; {figures.wall_s:.0f} s of wall time")
        if args.without_spammers_too and baseline.honest_wait_median_min and figures.honest_wait_median_min:
            delay = figures.honest_wait_median_min / baseline.honest_wait_median_min - 1
            console.print(f"the spammers delayed honest miners' median first evaluation by {delay:+.1%} "
                          f"({baseline.honest_wait_median_min:.1f} -> {figures.honest_wait_median_min:.1f} min)")
        results.append(figures)
    if args.json:
        args.json.write_text(json.dumps([asdict(item) for item in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
