"""The measurements behind benchmarks/RESULTS.md (quasar/bench/): ``quasar bench floor`` (the
layer's passes at copy speed), ``reference`` (the validator's reference work) and ``harness``
(the harness's agreement over evaluations), on the CPU."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from quasar.bench import floor as bench_floor
from quasar.bench import harness as bench
from quasar.bench import reference as bench_reference
from quasar.evaluate.report import EvaluationReport, LengthResult
from quasar.starter_fork import (
    copy_starter_tree,
)

# --- the passes at copy speed (quasar bench floor) ---


def test_bench_floor_counts_the_bytes_of_the_starter_layers_passes():
    from quasar.reference import QuasarAttentionReference

    layer = QuasarAttentionReference(**bench_floor.LAYER)
    hidden, heads = layer.hidden_size, layer.o_proj.in_features
    # The starter layer's input product: W_q | W_k | W_v | W_g1 stacked.
    projections = sum(linear.out_features for linear in (layer.q_proj, layer.k_proj, layer.v_proj, layer.g_proj[0]))
    today = {found.name: found for found in bench_floor.pass_bytes(**bench_floor.LAYER, fused=False)}
    assert (today["cast"].read, today["cast"].write) == (4 * hidden, 2 * hidden)
    assert (today["input product"].read, today["input product"].write) == (2 * hidden, 2 * projections)
    assert today["output product"].read == 2 * heads and today["output product"].write == 2 * hidden
    # benchmarks/RESULTS.md's table of what each pass moves at 1M (issue 16, eighth session).
    assert sum(found.read + found.write for found in today.values()) == 25_856
    fused = {found.name: found for found in bench_floor.pass_bytes(**bench_floor.LAYER, fused=True)}
    assert "cast" not in fused and fused["input product, fp32 in"].read == 4 * hidden
    assert fused["conv k, v + WY"].write == today["WY"].write + 2 * heads  # k, written for the later passes
    # Fused: no cast, the product reads fp32 (1,024 more), no conv pass, the WY pass writes k.
    assert sum(found.read + found.write for found in fused.values()) == 25_856 - 3_072 + 1_024 - 4_096 + 1_024


def test_bench_floor_times_both_sequences_and_prints_them_in_80_columns(tmp_path, capsys):
    assert (
        bench_floor.main(
            ["--out", str(tmp_path), "--device", "cpu", "--lengths", "200", "--tile", "128", "--runs", "2"]
        )
        == 0
    )
    found = json.loads((tmp_path / "floor.json").read_text())["lengths"]["200"]
    for sequence, fused in (("today", False), ("fused", True)):
        expected = bench_floor.pass_bytes(**bench_floor.LAYER, fused=fused)
        rows = found[sequence]["passes"]
        assert [row["name"] for row in rows] == [each.name for each in expected]
        for row in rows:
            assert row["seconds"] > 0
            assert row["bytes_per_second"] == pytest.approx((row["read"] + row["write"]) * 200 / row["seconds"])
        assert found[sequence]["tokens_per_second"] == pytest.approx(200 / found[sequence]["seconds"])
    printed = capsys.readouterr().out
    assert "today, T = 200" in printed and all(len(line) <= 80 for line in printed.splitlines())


def test_a_stand_in_moves_its_bytes_tile_by_tile():
    x = torch.randn(300, bench_floor.LAYER["hidden_size"])
    passes = bench_floor.pass_bytes(**bench_floor.LAYER, fused=False)
    tiles = bench_floor.Tiles(x, 128, passes)
    tiles.run(["cast", "input product", "output product"], 128)
    # The last tile's cast holds the input's last 44 rows; every output row was written.
    assert torch.equal(tiles.x_bf16[:44], x[256:].to(torch.bfloat16))
    assert torch.isfinite(tiles.out.float()).all()


# --- the validator's reference work (quasar bench reference) ---


def test_bench_reference_times_each_length_and_writes_its_figures(tmp_path, capsys):
    from quasar.evaluate.verification import requests_to_verify

    assert (
        bench_reference.main(
            ["--out", str(tmp_path), "--device", "cpu", "--lens", "64,96", "--tokens-per-request", "256"]
        )
        == 0
    )
    found = json.loads((tmp_path / "reference.json").read_text())
    assert [row["length"] for row in found["lengths"]] == [64, 96]
    # Every forward of the requests a length's verification draws (the correctness request among
    # them), more at the longest length, the target.
    run = bench_reference.made_up_run(64, torch.Generator().manual_seed(1), 256)
    assert run.check in run.timed and len(run.timed) == bench_reference.TIMED_REQUESTS
    assert found["lengths"][0]["forwards"] == requests_to_verify(run, False) * run.result.forwards_per_request
    target_run = bench_reference.made_up_run(96, torch.Generator().manual_seed(1), 256)
    target_forwards = requests_to_verify(target_run, True) * target_run.result.forwards_per_request
    assert found["lengths"][1]["forwards"] == target_forwards
    assert all(row["seconds"] > 0 for row in found["lengths"])
    printed = capsys.readouterr().out
    assert "the parent's reference per length" in printed and all(len(line) <= 80 for line in printed.splitlines())


# --- the harness's agreement over evaluations (quasar bench harness) ---


def test_bench_harness_reports_the_spread_of_medians_and_of_bests():
    import io

    from rich.console import Console

    def report(median: float, best: float) -> EvaluationReport:
        item = LengthResult(
            seq_len=512,
            status="ok",
            tokens_per_sec=median,
            tokens_per_sec_max=best,
            tokens_per_sec_min=median / 2,
            cv=0.1,
            rel_error=0.01,
            forwards_per_request=64,
            subtracted_us=1.5,
        )
        missing = LengthResult(seq_len=1024, status="oom")
        return EvaluationReport(
            verdict="pass",
            reasons=[],
            repo="r",
            target_seq_len=1024,
            seq_lens=[512, 1024],
            device="cuda",
            device_name="gpu",
            import_check=None,
            lengths={"512": item, "1024": missing},
        )

    reports = [report(100.0, 200.0), report(104.0, 201.0), report(101.0, 202.0)]
    found = bench.agreement(reports)
    assert found["512"]["medians"] == [100.0, 104.0, 101.0] and found["512"]["bests"] == [200.0, 201.0, 202.0]
    assert found["512"]["spread"] == pytest.approx(0.04) and found["512"]["best_spread"] == pytest.approx(0.01)
    assert found["1024"] == {"medians": None, "statuses": ["oom"] * 3}
    console = Console(file=io.StringIO(), width=300)
    console.print(bench.agreement_table(reports, found))
    text = console.file.getvalue()
    assert "100 · 104 · 101" in text and "4.00%" in text and "200 · 201 · 202" in text and "1.00%" in text
    assert bench.parse_target("1M") == 1_000_000 and bench.parse_target("100000") == 100_000
    with pytest.raises(Exception, match="one length"):
        bench.parse_target("512,1024")

    # The steps: each event to the next, summed per stage and length, in the order they came.
    timeline = bench.Timeline()
    timeline.events = [
        (0.0, "start", None),
        (4.5, "calibrate", 512),
        (5.0, "warmup", 512),
        (5.5, "warmup", 512),
        (9.0, "timed", 512),
        (10.0, "warmup", 512),
        (10.25, "done", None),
    ]
    assert timeline.steps() == {"start": 4.5, "calibrate@512": 0.5, "warmup@512": 4.25, "timed@512": 1.0}
    console = Console(file=io.StringIO(), width=80)
    console.print(bench.steps_table([timeline.steps(), {"start": 3.5}]))
    text = console.file.getvalue()
    assert "warmup@512" in text and "4.00" in text and "3.50-4.50" in text
    assert bench.parse_tuning('{"num_stages": 1}') == {"num_stages": 1}
    with pytest.raises(Exception, match="unknown tunable 'stages'"):
        bench.parse_tuning('{"stages": 1}')


def test_bench_harness_evaluates_another_trees_files(tmp_path):
    tree = tmp_path / "older"
    starter = sorted(copy_starter_tree(tree))
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    copied = bench.copy_fork_tree(tree, tmp_path / "copy")
    assert copied == starter
    assert not (tmp_path / "copy" / ".git").exists()
    layer = Path("fla") / "layers" / "quasar.py"
    assert (tmp_path / "copy" / layer).read_bytes() == (tree / layer).read_bytes()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="not a fork's tree"):
        bench.copy_fork_tree(tmp_path / "empty", tmp_path / "copy2")
