"""The inference server's bounded worker (quasar/inference/server.py), which keeps running counts of
the jobs running or waiting (in all and per caller), against a model that lists every job and
counts them afresh, on random sequences of requests, jobs ending, and clients leaving while their
job waits or runs."""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass, field

import pytest

from quasar.inference.server import BoundedWorker, WorkerBusy

CALLERS = ("v1", "v2", "v3")


@dataclass
class Job:
    caller: str
    go: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    task: asyncio.Future = field(init=False)
    left: bool = False  # its client hung up
    left_before_start: bool = False

    def run(self) -> str:
        self.started.set()
        self.go.wait(10)
        return self.caller

    @property
    def holds_a_place(self) -> bool:
        """The model's rule: a job holds its place until it ends, or its client left before it began."""
        return not self.left_before_start and not (self.started.is_set() and self.go.is_set())


async def settled(worker: BoundedWorker, jobs: list[Job]) -> None:
    """Wait for the event loop and the worker's thread to catch up: each released place given back,
    and the next waiting job begun if nothing runs."""
    for _ in range(2000):
        holding = [job for job in jobs if job.holds_a_place]
        runs = any(job.started.is_set() for job in holding)
        if worker.pending == len(holding) and (runs or not holding):
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"the worker counts {worker.pending} places, the model {len(holding)}")


@pytest.mark.parametrize("seed", [1, 2])
def test_the_workers_running_counts_match_the_jobs_counted_afresh(seed):
    rng = random.Random(seed)
    queue_size, per_caller = rng.randint(1, 4), rng.randint(1, 3)
    worker = BoundedWorker(queue_size, per_caller)
    jobs: list[Job] = []

    async def scenario() -> None:
        for step in range(120):
            action = rng.random()
            holding = [job for job in jobs if job.holds_a_place]
            if action < 0.5:
                job = Job(rng.choice(CALLERS))
                full = len(holding) >= queue_size + 1
                over = sum(1 for other in holding if other.caller == job.caller) >= per_caller
                job.task = asyncio.ensure_future(worker.run(job.run, job.caller))
                await asyncio.sleep(0)
                if full or over:
                    assert job.task.done() and isinstance(job.task.exception(), WorkerBusy), (step, full, over)
                    assert ("queue full" in str(job.task.exception())) == full, step
                else:
                    assert not job.task.done(), step
                    jobs.append(job)
            elif action < 0.8:
                running = [job for job in holding if job.started.is_set()]
                if running:
                    running[0].go.set()
                    if not running[0].left:
                        assert await running[0].task == running[0].caller, step
            else:
                waiting = [job for job in holding if not job.left]
                if waiting:
                    job = rng.choice(waiting)
                    job.left = True
                    job.left_before_start = not job.started.is_set()
                    job.task.cancel()  # the client hung up
            await settled(worker, jobs)
            counted: dict[str, int] = {}
            for job in jobs:
                if job.holds_a_place:
                    counted[job.caller] = counted.get(job.caller, 0) + 1
            assert worker._callers == counted, step
        for job in jobs:
            job.go.set()
        await settled(worker, jobs)
        assert worker.pending == 0 and worker._callers == {}

    asyncio.run(scenario())
    worker.shutdown()
