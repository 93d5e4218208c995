"""The simulated subnet's world (quasar/bench/simulate_subnet.py): its clock, each kernel's truth,
the validators' stand-in GPUs and the miners submitting at their limit."""

from __future__ import annotations

import hashlib
import heapq
import random
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import bittensor as bt
import httpx
from bittensor.sp_core import Keypair

from quasar.api.client import ApiClient, ApiClientError, Claim
from quasar.inference.client import LogitCheck
from quasar.validator.devices import Device
from quasar.validator.evaluator import EvaluationOutcome
from quasar.validator.records import EvaluationKey, EvaluationResult

TARGET = 1_000_000  # every kernel is submitted at 1M (multiplier 3)
BLOCK_S = 12.0  # simulated seconds per block, as on Bittensor
HONEST, SPAM, COPY = "honest", "spam", "copy"
NOISE = 0.01  # a validator's measurement: the true speed within 1%


class SimClock:
    """Simulated unix time: ``start`` plus ``speedup`` times the real time since ``real_start``."""

    def __init__(self, start: float, real_start: float, speedup: float):
        self.start, self.real_start, self.speedup = start, real_start, speedup

    def __call__(self) -> float:
        return self.start + (time.time() - self.real_start) * self.speedup

    def real_seconds(self, simulated: float) -> float:
        return simulated / self.speedup


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
    # (fork URL, commit, sim time it started, the validator's hotkey)
    evaluations: list[tuple[str, str, float, str]] = field(default_factory=list)
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
    """``validator``'s evaluator with the GPU replaced: it takes ``eval_s`` simulated seconds and
    measures the kernel's true speed within ``NOISE``; the kernel files' content hash is the truth's."""

    def __init__(self, world: World, clock: SimClock, eval_s: float, rng: random.Random, validator: str):
        self.world, self.clock, self.eval_s, self.rng, self.validator = world, clock, eval_s, rng, validator

    def start(self, key: EvaluationKey, device: Device) -> StandInEvaluation:
        with self.world.lock:
            kernel = self.world.kernels[(key.fork_url, key.commit_hash)]
            self.world.evaluations.append((key.fork_url, key.commit_hash, self.clock(), self.validator))
            measured = kernel.true_speed * (1 + self.rng.gauss(0, NOISE))
        result = EvaluationResult(
            correct=True,
            measured_tokens_per_sec=measured,
            benchmarks={TARGET: measured},
            content_hash=hashlib.sha256(kernel.content.encode()).hexdigest(),
        )
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

    def __init__(
        self,
        miners: list[Miner],
        url: str,
        api_hotkey: str,
        world: World,
        clock: SimClock,
        interval_s: float,
        threads: int = 8,
    ):
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
            clients[miner.name] = ApiClient(
                self.url,
                miner.key,
                api_hotkey=self.api_hotkey,
                http=httpx.Client(timeout=60, headers={"X-Forwarded-For": miner.address}),
            )
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
        except Exception as error:  # one miner's failure must not stop the others
            self.errors[f"{miner.kind} {type(error).__name__}"] += 1

    def submit_own(self, miner: Miner) -> None:
        if miner.kind == HONEST:
            miner.speed *= 1 + miner.rng.uniform(0.0, 0.004)  # a little faster each time
        fork, commit = f"https://github.com/{miner.name}/flash-linear-attention", new_commit(miner.rng)
        kernel = Kernel(miner.key.ss58_address, miner.kind, miner.speed, f"{miner.name}:{commit}")
        with self.world.lock:
            self.world.kernels[(fork, commit)] = kernel
        claim = miner.speed * (miner.rng.uniform(0.97, 0.99) if miner.kind == HONEST else 1.0)
        kernel.submission_id = self.client(miner).submit_kernel(Claim(fork, commit, claim), TARGET).submission_id

    def copy(self, miner: Miner) -> None:
        """The round's leader's kernel: as its own commit (the API refuses it), then the same files
        under a commit of the copier's own, claimed 3% higher."""
        client = self.client(miner)
        board = client.leaderboard()
        if not board.entries:
            return
        leader = client.submission_status(board.entries[0].submission_id)
        # A ranked submission is revealed: its fork, commit and claim are public.
        fork_url, commit_hash, claimed = leader.fork_url, leader.commit_hash, leader.claimed_tokens_per_sec
        assert fork_url is not None and commit_hash is not None and claimed is not None, "the leader is not revealed"
        with self.world.lock:
            original = self.world.kernels[(fork_url, commit_hash)]
        try:
            client.submit_kernel(Claim(f"https://github.com/{miner.name}/fla", commit_hash, claimed * 1.03), TARGET)
        except ApiClientError as error:
            if error.status != 409:
                raise
            with self.world.lock:
                self.world.refused_copies += 1
        fork, commit = f"https://github.com/{miner.name}/flash-linear-attention", new_commit(miner.rng)
        kernel = Kernel(miner.key.ss58_address, COPY, original.true_speed, original.content)
        with self.world.lock:
            self.world.kernels[(fork, commit)] = kernel
        kernel.submission_id = client.submit_kernel(Claim(fork, commit, claimed * 1.03), TARGET).submission_id

    def close(self) -> None:
        self.stopping.set()
        self.pool.shutdown(wait=True)
