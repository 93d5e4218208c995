"""Timing (quasar/evaluate/timing.py): the rounds' quotas, the correctness request's place, the claim."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from quasar.evaluate import timing, workload
from quasar.evaluate.report import Timings


@pytest.mark.parametrize("trial", range(20))
def test_timed_rounds_meet_the_bounds_on_the_total_and_share_the_time(trial):
    from dataclasses import replace

    from quasar.evaluate.options import EvaluationOptions
    from quasar.evaluate.timing import TIMED_ROUNDS, round_quota

    rng = random.Random()
    least_total = rng.randint(1, 30)
    options = replace(
        EvaluationOptions(),
        min_timed_runs=least_total,
        max_timed_runs=rng.randint(least_total, 300),
        timed_seconds=rng.uniform(0.1, 5.0),
    )
    request_s = rng.choice([1e-4, 1e-3, 0.02, 0.5, 3.0])
    done = 0
    for round_index in range(TIMED_ROUNDS):
        least, planned = round_quota(options, request_s, done, TIMED_ROUNDS - round_index)
        assert 0 <= least <= planned
        # A round runs between its least and its planned number (the wall clock ends it in between).
        done += rng.randint(least, planned)
    assert options.min_timed_runs <= done <= options.max_timed_runs
    # Unhurried rounds run the share of the time that fits, within the bounds.
    done = 0
    for round_index in range(TIMED_ROUNDS):
        done += round_quota(options, request_s, done, TIMED_ROUNDS - round_index)[1]
    fits = math.ceil(options.timed_seconds / TIMED_ROUNDS / request_s) * TIMED_ROUNDS
    assert done == max(options.min_timed_runs, min(options.max_timed_runs, fits)) or (
        options.min_timed_runs <= done <= options.max_timed_runs and abs(done - fits) < TIMED_ROUNDS
    )


def test_recommended_claim_is_the_speed_three_in_four_requests_reached():
    rng = random.Random()
    durations = [rng.randint(1_000_000, 5_000_000) for _ in range(rng.randint(1, 200))]
    claim = timing.recommended_claim(4096, durations)
    reached = sum(4096 / (d / 1e9) >= claim for d in durations)
    assert reached >= 0.75 * len(durations)
    assert 4096 / (min(durations) / 1e9) >= claim >= 4096 / (max(durations) / 1e9)
    assert claim <= 4096 / (statistics.median(durations) / 1e9)


def test_the_timed_requests_run_in_four_rounds():
    assert timing.TIMED_ROUNDS == 4  # docs/evaluation.md, "Limits"


def test_the_claim_is_the_fastest_speed_three_in_four_requests_reached():
    # Of 8 requests of 1 to 8 ms, 6 took 6 ms or less.
    durations = [8_000_000, 1_000_000, 7_000_000, 2_000_000, 6_000_000, 3_000_000, 5_000_000, 4_000_000]
    assert timing.recommended_claim(4096, durations) == 4096 / 6e-3


def test_a_lengths_figures_come_from_the_median_of_its_forward_times():
    from quasar.evaluate.report import LengthResult
    from quasar.evaluate.session import Request

    run = timing.LengthRun(LengthResult(seq_len=1000))
    round_trips = [3_000_000, 1_000_000, 10_000_000, 2_000_000]
    run.timed = [Request(i, i, torch.zeros(2, *workload.FINGERPRINT_SHAPE), ns) for i, ns in enumerate(round_trips)]
    run.cost_ns = 800_000  # more than half the fastest round trip: half of it is subtracted
    timing.finish_length(run, count=2)
    forward = [1_250_000, 250_000, 4_750_000, 750_000]  # (round trip - 500,000) / 2
    assert [request.forward_ns for request in run.timed] == forward
    result = run.result
    assert result.status == "ok" and result.timed_runs == 4 and result.forwards_per_request == 2
    assert result.median_ms == 1.0 and result.tokens_per_sec == pytest.approx(1_000_000)
    assert result.tokens_per_sec_min == pytest.approx(1000 / 4.75e-3)
    assert result.tokens_per_sec_max == pytest.approx(1000 / 0.25e-3)
    assert result.cv == pytest.approx(statistics.pstdev(forward) / statistics.fmean(forward))
    assert result.subtracted_us == 250.0
    # A forward time is never credited below the floor, whatever the calibration subtracted.
    tiny = Request(0, 0, torch.zeros(2, *workload.FINGERPRINT_SHAPE), 5_000)
    assert timing.per_forward_ns(tiny, 2, 4_500) == timing.MIN_FORWARD_NS


@pytest.mark.parametrize("timed", [(3, 3), (10, 10), (10, 200), (4, 6)])
def test_the_correctness_request_runs_once_in_every_round_it_may_be_drawn_for(monkeypatch, timed):
    # Whatever round is drawn for it, and however the bounds on the timed requests fall in the
    # rounds, the correctness request runs exactly once, among the timed requests, and their
    # number stays within min_timed_runs and max_timed_runs.
    from quasar.evaluate.options import EvaluationOptions
    from quasar.evaluate.report import LengthResult
    from quasar.evaluate.session import Request
    from quasar.evaluate.timing import TIMED_ROUNDS, LengthRun, time_rounds

    made = []

    def run_request(session, length, count, deadline, what, seeds=None):
        made.append("timed")
        return Request(1, 1, torch.zeros(count, *workload.FINGERPRINT_SHAPE), 1_000_000)

    def correctness_request(session, run, count, deadline, timings, progress):
        made.append("check")
        run.check = Request(*run.check_seeds, torch.zeros(count, *workload.FINGERPRINT_SHAPE), 1_000_000)
        return run.check

    monkeypatch.setattr(timing, "run_request", run_request)
    monkeypatch.setattr(timing, "correctness_request", correctness_request)
    monkeypatch.setattr(timing, "harness_cost", lambda *args: 1000)
    least, most = timed
    options = EvaluationOptions(device="cpu", min_timed_runs=least, max_timed_runs=most, timed_seconds=0.01)
    for check_round in range(TIMED_ROUNDS):
        for request_s in (1e-9, 10.0):  # a pace that fills every quota, and one that meets only the least
            made.clear()
            run = LengthRun(
                LengthResult(seq_len=64, forwards_per_request=1),
                request_s=request_s,
                cost_ns=10**6,
                check_seeds=(5, 6),
                check_round=check_round,
            )
            assert time_rounds(None, None, {64: run}, [64], {64: 1}, options, Timings(), lambda event: None) is None
            assert made.count("check") == 1, (check_round, request_s, made)
            assert least <= len(run.timed) <= most and run.check in run.timed, (check_round, request_s, made)
