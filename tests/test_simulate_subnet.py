"""quasar bench simulate-subnet (quasar/bench/simulate_subnet.py), small and fast: a real API process
on SQLite, the validators' own loop with stand-in GPUs, honest, spamming and copying miners; what it
reports, at 80 columns; and its figures on made-up reports, against a plain count."""

from __future__ import annotations

from quasar.bench.subnet_figures import (
    LAG_LIMIT,
    RevealedSubmission,
    RoundFigures,
    RunFigures,
    evaluations_of_newest,
    fourth_place_at,
    idle_with_work,
    lag_verdict,
    percentile,
)
from tests.processes import bench_figures


def test_a_small_subnet_runs_and_reports_every_round(tmp_path):
    run, [figures] = bench_figures(
        "simulate-subnet",
        [
            "--miners",
            "12",
            "--spammers",
            "2",
            "--copiers",
            "1",
            "--validators",
            "2",
            "--workers",
            "3",
            "--eval-seconds",
            "25",
            "--rounds",
            "2",
            "--round-blocks",
            "20",
            "--submissions-per-hour",
            "30",
            "--speedup",
            "100",
        ],
        tmp_path / "figures.json",
    )
    assert all(len(line) <= 80 for line in run.stdout.splitlines()), run.stdout
    assert (figures["miners"], figures["spammers"], figures["copiers"]) == (12, 2, 1)
    assert [item["round_id"] for item in figures["rounds"]] == [0, 1]
    for item in figures["rounds"]:
        assert item["submissions"] > 0 and item["waits_min"] is not None
        assert 0 < item["gpu_hours"] <= item["gpu_capacity_hours"] * 1.05
        assert item["gpu_hours_not_placeable"] <= item["gpu_hours"]
        assert len(item["top4"]) == 4 and len(item["true_top4"]) == 4
        assert 0 <= item["idle_with_work"] <= 1
    # With this much capacity and a round to drain, every honest submission (or a newer one of its
    # hotkey) was evaluated.
    assert all(item["unevaluated"] == 0 for item in figures["rounds"])
    assert "round" in run.stdout and "top 4" in run.stdout


def row(submission_id: int, hotkey: str, ready_at: float) -> RevealedSubmission:
    return RevealedSubmission(submission_id, hotkey, "ready", ready_at, 1_000_000, 0, ready_at, 50_000.0)


def test_a_validator_evaluating_a_newer_submission_evaluated_the_older_one_too():
    submissions = {1: row(1, "a", 0.0), 2: row(2, "a", 60.0), 3: row(3, "a", 120.0), 4: row(4, "b", 10.0)}
    reports = {2: {"v1": 100.0}, 3: {"v1": 90.0, "v2": 300.0}, 4: {"v2": 50.0}}
    seen = evaluations_of_newest(submissions, reports, ["v1", "v2"])
    assert seen[1] == {"v1": 90.0, "v2": 300.0}  # the earliest report on it or anything newer of a
    assert seen[2] == {"v1": 90.0, "v2": 300.0} and seen[3] == {"v1": 90.0, "v2": 300.0}
    assert seen[4] == {"v2": 50.0}  # b's alone


def test_the_fourth_place_is_the_last_one_sampled_before_and_percentiles_are_nearest_rank():
    samples = [(10.0, None), (20.0, 5.0), (30.0, 7.0)]
    assert [fourth_place_at(samples, when) for when in (5.0, 10.0, 25.0, 99.0)] == [None, None, 5.0, 7.0]
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.95) == 4.0 and percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0


def test_devices_idle_while_work_waited_are_counted_against_the_machine_not_the_schedule():
    """A loaded machine's loops turn devices round late: that idle time, while the API had more work
    for the validator than it holds, is measured, and late pairs in such a round are not blamed on
    the schedule (nor is the criterion relaxed: a round that kept up while lagging holds)."""
    workers, eval_s = 2, 25.0
    # v1's queue is long for the first 100 s, then short; v2's is short throughout.
    samples = [(0.0, {"v1": 50, "v2": 3}), (100.0, {"v1": 4, "v2": 3})]
    # v1: one device busy from 0 to 50 (two evaluations), the other never; v2 idle: nothing waits for it.
    starts = {"v1": [0.0, 25.0], "v2": []}
    assert idle_with_work(samples, starts, workers, eval_s, until=200.0) == 2 * 100.0 - 50.0
    # An evaluation running across a sample's end counts in each part.
    assert idle_with_work(samples, {"v1": [90.0]}, workers, eval_s, until=200.0) == 200.0 - 10.0

    def one_round(round_id: int, late: int, idle: float) -> RoundFigures:
        return RoundFigures(
            round_id, 10, 0, (1.0, 2.0, 3.0), 0, 5.0, 9, 1.0, 0.5, 2.0, idle, late == 0, 80.0, late, [], []
        )

    def run_of(*rounds: RoundFigures) -> RunFigures:
        return RunFigures("sqlite", 9, 0, 0, 2, workers, eval_s, 360, 40.0, 1.0, list(rounds), 0, {}, 1.0)

    assert lag_verdict(run_of(one_round(0, 0, 0.5), one_round(1, 0, 0.0))) is None  # kept up, even lagging
    assert lag_verdict(run_of(one_round(0, 3, LAG_LIMIT / 2))) is None  # late, devices busy: the schedule's
    verdict = lag_verdict(run_of(one_round(0, 52, 0.4), one_round(1, 0, 0.0), one_round(4, 3, 0.3)))
    assert verdict is not None and verdict.startswith("not shown: late pairs in round(s) 1 (40% idle), 5 (30% idle)")
