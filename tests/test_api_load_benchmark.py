"""``quasar bench api-load`` (quasar/bench/api_load.py), briefly and at low rates: the real server
with two workers on SQLite, signed submissions and every route of the read mix (the dashboard's
pages included) answered, nothing acknowledged lost, and its table legible at 80 columns."""

from __future__ import annotations

import time

from rich.console import Console

from quasar.bench.api_load import machine_speed_ms, start_for_block_change
from quasar.bench.api_load_figures import Figures, figures_table, timeline
from quasar.bench.api_load_traffic import Stream, read_targets
from quasar.chain.devchain import DevChain
from tests.processes import bench_figures


def test_load_benchmark_runs_every_read_and_loses_nothing(tmp_path):
    backend = "sqlite"  # the PostgreSQL path of the API is the one the other API tests run on both backends
    run, [figures] = bench_figures(
        "api-load",
        [
            "--backend",
            backend,
            "--workers",
            "2",
            "--seconds",
            "2",
            "--warmup",
            "1",
            "--rate",
            "20",
            "--read-rate",
            "50",
            "--submitters",
            "4",
            "--readers",
            "4",
            "--timeline",
        ],
        tmp_path / "figures.json",
    )
    assert figures["backend"] == backend and figures["workers"] == 2
    assert figures["lost"] == 0 and figures["errors"] == {} and figures["read_errors"] == {}
    assert figures["submissions_per_sec"] > 5 and figures["reads_per_sec"] > 10
    assert max(len(line) for line in run.stdout.splitlines()) <= 80, run.stdout
    assert "read p99 ms" in run.stdout and "0 of 1" in run.stdout  # 20/s is below the target
    # One row per second of the warm-up and of the window; every second had requests of both kinds.
    assert figures["warmup_s"] == 1 and [row[0] for row in figures["timeline"]] == [-1, 0, 1]
    assert all(0 < row[1] <= row[2] < 10_000 and 0 < row[3] <= row[4] < 10_000 for row in figures["timeline"])
    assert "latency by second of the window" in run.stdout
    assert figures["machine_ms"] > 0 and "reference loop ms" in run.stdout
    assert figures["primed_s"] > 0 and figures["block_change_s"] == 1.0  # the middle of a 2 s window
    assert "1 *" in run.stdout  # the block change's second is marked in the timeline


def test_figures_table_takes_medians_per_configuration_within_80_columns():
    runs = [
        Figures(
            backend=backend,
            workers=workers,
            seconds=10.0,
            offered_rate=330.0,
            submissions_per_sec=rate,
            p50_ms=5.0,
            p99_ms=p99,
            max_ms=2 * p99,
            errors={"503": 1} if p99 > 100 else {},
            lost=0,
            offered_read_rate=1100.0,
            reads_per_sec=1100.0,
            read_p50_ms=1.0,
            read_p99_ms=4.0,
            read_errors={},
            server_cpu_ms_per_request=0.7,
            client_cpu_share=0.2,
            load_average=1.5,
        )
        for backend in ("sqlite", "postgresql")
        for workers in (1, 2, 4)
        for rate, p99 in ((330.0, 20.0), (329.0, 30.0), (310.0, 140.0))
    ]
    console = Console(width=80, record=True)
    console.print(figures_table(runs))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    rows = {
        line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
        for line in text.splitlines()
        if line.startswith("│")
    }
    assert rows["submit/s"] == ["329"] * 6 and rows["submit p99 ms"] == ["30.0"] * 6
    assert rows["submit errors"] == ["503: 1"] * 6 and rows["targets met"] == ["2 of 3"] * 6


def test_the_timeline_puts_each_request_in_the_second_it_was_scheduled_in():
    submitted = Stream(latencies=[0.010, 0.030, 0.500, 0.002], scheduled=[0.1, 0.9, 1.2, 1.9])
    read = Stream(latencies=[0.001, 0.004], scheduled=[0.5, 2.5])
    rows = timeline(submitted, read, 3.0)
    assert [row[0] for row in rows] == [0, 1, 2]
    assert rows[0][1:] == (20.0, 30.0, 1.0, 1.0)  # median of 10 and 30 ms; nearest-rank p99
    assert rows[1][1:3] == (251.0, 500.0) and rows[1][3] != rows[1][3]  # no read in second 1: NaN
    assert rows[2][1] != rows[2][1] and rows[2][3:] == (4.0, 4.0)


def test_the_warm_up_is_in_the_timeline_and_not_in_the_window():
    submitted = Stream(latencies=[0.200, 0.010, 0.030], scheduled=[-0.5, 0.3, -1.0])
    assert submitted.in_window() == [0.010]
    rows = timeline(submitted, Stream(latencies=[0.002], scheduled=[0.7]), 1.0, warmup=1.0)
    assert [row[0] for row in rows] == [-1, 0]
    assert rows[0][1] == 115.0 and rows[0][3] != rows[0][3]  # the warm-up's two; no read then
    assert rows[1][1:] == (10.0, 10.0, 2.0, 2.0)


def test_the_reference_loop_takes_longer_for_more_iterations():
    short, long = min(machine_speed_ms(100_000) for _ in range(3)), min(machine_speed_ms(400_000) for _ in range(3))
    assert 0 < short < long


def test_the_read_targets_are_every_page_of_the_mix_once():
    targets = read_targets([("5Alice", 1), ("5Bob", 2), ("5Alice", 1)])
    assert len(targets) == len(set(targets))
    assert {"/leaderboard", "/", "/dashboard/miners/5Bob", "/dashboard/submissions/2"} <= set(targets)


def test_the_traffic_is_timed_to_meet_a_block_change_in_the_window(tmp_path):
    chain = DevChain(tmp_path / "chain.sqlite3", netuid=24, block_time_s=0.4)
    earliest = time.time() + 0.5
    start, at = start_for_block_change(chain, earliest, warmup=0.3, seconds=2.0)
    assert start >= earliest and at == 1.0  # the middle of a 2 s window (shorter than 2 x 3 s)
    time.sleep(max(0.0, start + 0.3 + at - 0.1 - time.time()))
    before = chain.current_block()
    time.sleep(0.2)
    assert chain.current_block() == before + 1  # the block changed around second `at` of the window
