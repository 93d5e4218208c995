"""Timing a fork: calibration of the harness's own cost, each length's warm-up, the timed requests
in rounds over the lengths (the correctness request among them) and the figures they give
(docs/evaluation.md, "Timing", "Stability").
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from quasar.evaluate.options import EvaluationOptions, ProgressCallback, ProgressEvent
from quasar.evaluate.report import ERROR, OK, OOM, LengthResult, Timings
from quasar.evaluate.sandbox import SandboxedChild
from quasar.evaluate.session import (
    ChildFailure,
    Request,
    Session,
    SharedOutput,
    capture,
    harness_cost,
    length_peak,
    mib,
    read_memory,
    receive_output,
    run_request,
)

# Calibration of the harness's own cost per request, before fork code is loaded, at each length's
# count of forwards: the minimum of CALIBRATION_RUNS after CALIBRATION_WARMUP.
CALIBRATION_WARMUP = 2

CALIBRATION_RUNS = 7

# The timed requests of every length run in this many rounds over the lengths (see the docstring).
TIMED_ROUNDS = 4

# A forward time is never reported below this (calibration noise at tiny lengths).
MIN_FORWARD_NS = 1000


@dataclass
class LengthRun:
    """One length's state: its report entry, timed requests (the correctness request among them),
    the correctness request's output and repeat; the warm-up's request time (plans the timed
    rounds) and the least harness cost seen."""

    result: LengthResult
    timed: list[Request] = field(default_factory=list)
    check: Request | None = None
    output: torch.Tensor | SharedOutput | None = None
    repeat: Request | None = None
    request_s: float = 0.0
    cost_ns: int = 0
    # Where the correctness output goes in the shared area.
    output_offset: int = 0
    # The correctness request's seeds (drawn before the child exists) and the round it runs in,
    # drawn by this process: nothing the child sees tells it apart from the timed requests.
    check_seeds: tuple[int, int] = (0, 0)
    check_round: int = 0
    # Seeds drawn ahead for the timed requests, in order (lengths of one forward a request; see
    # ReferenceWork), and the expected fingerprints and norms the parent computed for some of them.
    seed_pool: list[tuple[int, int]] = field(default_factory=list)
    precomputed: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def calibrate(
    session: Session, runs: dict[int, LengthRun], counts: dict[int, int], timings: Timings, progress: ProgressCallback
) -> dict[int, int]:
    """Nanoseconds of everything a request of ``counts[T]`` forwards does but the layer, per length
    (trusted: no fork code yet): the minimum round trip of :data:`CALIBRATION_RUNS`. A length
    whose input does not even fit in memory is marked OOM, with every longer one skipped."""
    started = time.monotonic()
    costs: dict[int, int] = {}
    lengths = sorted(runs)
    for index, length in enumerate(lengths):
        progress(ProgressEvent("calibrate", length, index, len(lengths)))
        try:
            samples = [
                harness_cost(session, length, counts[length], session.deadline)
                for _ in range(CALIBRATION_WARMUP + CALIBRATION_RUNS)
            ]
        except ChildFailure as failure:
            if failure.status != OOM:
                raise
            runs[length].result.status, runs[length].result.error = OOM, failure.message
            break
        costs[length] = min(samples[CALIBRATION_WARMUP:])
    timings.calibration_s = time.monotonic() - started
    return costs


def per_forward_ns(request: Request, count: int, cost_ns: int) -> int:
    return max((request.round_trip_ns - cost_ns) // count, MIN_FORWARD_NS)


def prepare_length(
    session: Session,
    run: LengthRun,
    options: EvaluationOptions,
    count: int,
    timings: Timings,
    progress: ProgressCallback,
    warmup_since: float,
) -> None:
    """Warm-up (with the capture) and peak memory at one length.

    The first warm-up request runs one forward, eagerly: the fork's kernels compile there (a
    request of ``count`` eager forwards cost the host about 1.5 ms each at 512 to 2,048 tokens
    on an H100 machine, a few tenths of a second a length). Then the child captures a request of
    ``count`` forwards, and every later warm-up request runs ``count``: at least one, in all
    ``warmup_runs`` requests and, on CUDA, until ``warmup_seconds`` have passed since
    ``warmup_since`` (the monotonic time the evaluation's first warm-up began); the last one's
    round trip is kept in ``run.request_s`` to plan the timed rounds. The correctness request
    runs later, among the timed ones (:func:`time_round`).
    """
    length = run.result.seq_len
    deadline = time.monotonic() + options.length_timeout_s
    before = read_memory(session, deadline, reset=True)

    started = time.monotonic()
    warmup_s = options.warmup_seconds if options.device.startswith("cuda") else 0.0
    # The first request runs one forward eagerly (the fork's kernels compile and tune at this
    # length); then the child captures a request of count forwards in a CUDA graph, which the
    # rest of the warm-up replays.
    runs = max(options.warmup_runs, 2)
    progress(ProgressEvent("warmup", length, 0, runs))
    timings.first_forward_s += run_request(session, length, 1, deadline, f"warm-up at T={length}").round_trip_ns / 1e9
    run.result.timing = capture(session, length, count, deadline)
    done = 1
    while done < runs or time.monotonic() - warmup_since < warmup_s:
        progress(ProgressEvent("warmup", length, done, max(runs, done + 1)))
        run.request_s = run_request(session, length, count, deadline, f"warm-up at T={length}").round_trip_ns / 1e9
        done += 1
    timings.warmup_s += time.monotonic() - started
    run.result.peak_vram_mb = mib(length_peak(before, read_memory(session, deadline, reset=False)))


def correctness_request(
    session: Session, run: LengthRun, count: int, deadline: float, timings: Timings, progress: ProgressCallback
) -> Request:
    """The correctness request: a timed request like the others, on the seeds drawn for it; then
    (untimed) its last forward's whole output and a repeat of it on the same seeds. Only once the
    request has run does the child learn it was the one checked in full."""
    length = run.result.seq_len
    progress(ProgressEvent("correctness", length, 0, 1))
    request = run_request(session, length, count, deadline, f"timed run at T={length}", seeds=run.check_seeds)
    started = time.monotonic()
    run.check = request
    run.output = receive_output(session, length, run.output_offset, deadline)
    timings.output_s += time.monotonic() - started
    run.repeat = run_request(session, length, count, deadline, f"repeat run at T={length}", seeds=run.check_seeds)
    timings.correctness_s += time.monotonic() - started
    return request


def round_quota(options: EvaluationOptions, request_s: float, done: int, rounds_left: int) -> tuple[int, int]:
    """``(least, planned)`` timed requests of one length in a round, ``done`` already timed and
    ``rounds_left`` rounds to go (this one included): the part of ``min_timed_runs`` and
    ``max_timed_runs`` left, spread over those rounds, and between them the round's share of
    ``timed_seconds`` at the warm-up's pace."""
    least = math.ceil(max(options.min_timed_runs - done, 0) / rounds_left)
    most = max(least, min(math.ceil((options.max_timed_runs - done) / rounds_left), options.max_timed_runs - done))
    wanted = math.ceil(options.timed_seconds / TIMED_ROUNDS / max(request_s, 1e-9))
    return least, max(least, min(most, wanted))


def time_round(
    session: Session,
    run: LengthRun,
    options: EvaluationOptions,
    count: int,
    rounds_left: int,
    timings: Timings,
    progress: ProgressCallback,
) -> None:
    """One round of timed requests at one length, each followed by a calibration of the same count
    (their minimum lowers ``run.cost_ns``). The planned number comes from the warm-up's pace,
    which a busy host can make far too small, so the wall clock also ends the round once its
    share of ``timed_seconds`` has passed and its least number is met. In the round drawn for it
    (``run.check_round``, or an earlier one that takes every request left), the correctness
    request takes a place drawn among the planned ones (or the round's last, should the round end
    before it)."""
    length = run.result.seq_len
    deadline = time.monotonic() + options.length_timeout_s
    least, planned = round_quota(options, run.request_s, len(run.timed), rounds_left)
    # The correctness request is due from its round on, or in a round that takes every request
    # left under max_timed_runs (the bounds can be met before its round comes).
    due = run.check is None and (
        TIMED_ROUNDS - rounds_left >= run.check_round or len(run.timed) + planned >= options.max_timed_runs
    )
    check_at = secrets.randbelow(planned) if due and planned > 0 else None
    total = len(run.timed) + planned * rounds_left
    started = time.monotonic()
    for index in range(planned):
        out_of_time = index >= least and time.monotonic() - started >= options.timed_seconds / TIMED_ROUNDS
        if out_of_time and check_at is None:
            break
        progress(ProgressEvent("timed", length, min(len(run.timed), total - 1), total))
        if out_of_time or index == check_at:
            check_at = None
            request = correctness_request(session, run, count, deadline, timings, progress)
        else:
            position = sum(1 for timed in run.timed if timed.position is not None)
            pooled = position < len(run.seed_pool)
            request = run_request(
                session,
                length,
                count,
                deadline,
                f"timed run at T={length}",
                seeds=run.seed_pool[position] if pooled else None,
            )
            request.position = position if pooled else None
        timings.timed_s += request.round_trip_ns / 1e9
        run.timed.append(request)
        run.cost_ns = min(run.cost_ns, harness_cost(session, length, count, deadline))


def finish_length(run: LengthRun, count: int) -> None:
    """The length's figures from its timed requests: each one's time per forward, credited after
    subtracting the harness's cost (never more than half the fastest round trip)."""
    length = run.result.seq_len
    cost_ns = min(run.cost_ns, min(r.round_trip_ns for r in run.timed) // 2)
    for request in run.timed:
        request.forward_ns = per_forward_ns(request, count, cost_ns)
    forward = sorted(r.forward_ns for r in run.timed)
    median_ns = statistics.median(forward)
    run.result.status = OK
    run.result.timed_runs = len(forward)
    run.result.forwards_per_request = count
    run.result.median_ms = median_ns / 1e6
    run.result.tokens_per_sec = length / (median_ns / 1e9)
    run.result.tokens_per_sec_min = length / (forward[-1] / 1e9)
    run.result.tokens_per_sec_max = length / (forward[0] / 1e9)
    run.result.cv = statistics.pstdev(forward) / statistics.fmean(forward)
    run.result.subtracted_us = cost_ns / count / 1e3


def time_rounds(
    session: Session,
    child: SandboxedChild,
    runs: dict[int, LengthRun],
    prepared: list[int],
    counts: dict[int, int],
    options: EvaluationOptions,
    timings: Timings,
    progress: ProgressCallback,
) -> str | None:
    """The timed requests of the prepared lengths in :data:`TIMED_ROUNDS` rounds over them (a
    length that fails drops out); None, or why the child can serve no more."""
    for round_index in range(TIMED_ROUNDS):
        for length in prepared:
            run = runs[length]
            if run.result.error is not None:
                continue
            failed = length_step(
                run, time_round, session, run, options, counts[length], TIMED_ROUNDS - round_index, timings, progress
            )
            if failed is not None and not child_usable(child, failed):
                return f"the evaluation stopped at T={length}"
    return None


def length_step(run: LengthRun, step: Callable[..., None], *args: object) -> str | None:
    """Run one step of a length, ``step(*args)``: None, or the status of its failure, with which
    the length is marked (its reason kept, its runs dropped)."""
    try:
        step(*args)
    except ChildFailure as failure:
        run.result.status = failure.status
        run.result.error = failure.message
        run.timed, run.check, run.output, run.repeat = [], None, None, None
        return failure.status
    return None


def child_usable(child: SandboxedChild, failed: str) -> bool:
    """Whether the child can serve other lengths after a failure of ``failed`` status: it is
    running and the failure was an error or out of memory (a timeout leaves it busy)."""
    return failed in (ERROR, OOM) and child.process is not None and child.process.poll() is None


# The claim a miner should submit: the speed this share of timed requests reached or beat.
CLAIM_QUANTILE = 0.75


def recommended_claim(seq_len: int, forward_ns: Sequence[int]) -> float:
    """A safe claim at ``seq_len`` from the timed forwards' durations (nanoseconds).

    A submission is scored at ``min(claimed, measured)`` and fails below ``0.9 × claimed``, so a
    claim should sit close under the median: the slowest run would waste most of the score on a
    noisy machine. The speed three in four requests reached is at or under the median, and a
    validator measuring within 10% of it still passes the claim check.
    """
    ordered = sorted(forward_ns)
    return seq_len / (ordered[math.ceil(CLAIM_QUANTILE * len(ordered)) - 1] / 1e9)
