"""quasar bench simulate-subnet (quasar/bench/simulate_subnet.py), small and fast: a real API process
on SQLite, the validators' own loop with stand-in GPUs, honest, spamming and copying miners; what it
reports, at 80 columns; and its figures on made-up reports, against a plain count."""

from __future__ import annotations

from quasar.bench.subnet_figures import RevealedSubmission, evaluations_of_newest, fourth_place_at, percentile
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
