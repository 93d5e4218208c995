"""``quasar bench inference`` (quasar/bench/inference.py) end to end on the CPU with a tiny random
Qwen2 saved to disk and loaded by the server's loader: every pair timed in each dtype, and the
printed table and the JSON saying the same figures; the counts it draws from them."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from quasar.bench import inference as bench
from quasar.config import OPTIONS_BY_KEY


def default(key: str) -> int:
    return int(OPTIONS_BY_KEY[key].default)


def table_cells(printed: str) -> list[list[str]]:
    """The rows of rich's table, each as its cells' text."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in printed.splitlines() if line.startswith("│")]


def test_bench_inference_times_each_pair_in_each_dtype_and_its_table_and_json_agree(tmp_path, capsys):
    output = tmp_path / "figures" / "inference.json"
    argv = ["--device", "cpu", "--tiny", "--dtypes", "float32,bfloat16", "--runs", "2", "--warmup", "0"]
    assert bench.main([*argv, "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    found = json.loads(output.read_text())
    assert all(len(line) <= 80 for line in printed.splitlines()), printed
    assert found["device"] == "cpu" and found["logits_timeout_s"] == float(OPTIONS_BY_KEY["logits_timeout"].default)
    assert [entry["dtype"] for entry in found["dtypes"]] == ["float32", "bfloat16"]
    rows = table_cells(printed)
    assert len(rows) == sum(len(entry["pairs"]) for entry in found["dtypes"])
    summary = " ".join(printed.split())
    for entry in found["dtypes"]:
        pairs = [(row["prompt_len"], row["gen_len"]) for row in entry["pairs"]]
        # A validator's largest challenge first, the server's limits last, two between.
        assert pairs[0] == (default("logits_max_prompt_len"), default("logits_max_gen_len"))
        assert pairs[-1] == (default("inference_max_prompt_len"), default("inference_max_gen_len"))
        assert len(pairs) == 4 and pairs == sorted(set(pairs))
        for row in entry["pairs"]:
            assert len(row["runs_s"]) == 2 and all(seconds > 0 for seconds in row["runs_s"])
            assert row["median_s"] == statistics.median(row["runs_s"])
            assert (row["min_s"], row["max_s"]) == (min(row["runs_s"]), max(row["runs_s"]))
            shown = [
                entry["dtype"],
                f"{row['prompt_len']:,}",
                str(row["gen_len"]),
                f"{row['median_s']:.3f}",
                f"{row['min_s']:.3f}–{row['max_s']:.3f}",
                f"{1000 * row['median_s'] / row['gen_len']:.1f}",
            ]
            assert shown in rows, (shown, rows)
        limit, challenge = entry["pairs"][-1]["median_s"], entry["pairs"][0]["median_s"]
        assert (entry["limit_median_s"], entry["challenge_median_s"]) == (limit, challenge)
        assert entry["fit_in_timeout"] == math.floor(found["logits_timeout_s"] / limit) > 0
        ahead = entry["ahead_to_miss"]
        assert (ahead - 1) * limit + challenge <= found["logits_timeout_s"] < ahead * limit + challenge
        assert (
            f"{entry['dtype']}: {entry['fit_in_timeout']} requests at ({pairs[-1][0]:,}, {pairs[-1][1]}) fit in "
            f"LOGITS_TIMEOUT (30 s); {ahead} of them ahead of a ({pairs[0][0]}, {pairs[0][1]}) challenge make it miss."
        ) in summary


@pytest.mark.parametrize(
    ("limit", "challenge", "fit", "ahead"),
    [
        (3.1, 0.4, 9, 10),  # 9 ahead end at 27.9 s, the challenge at 28.3 s: in time; 10 ahead: not
        (4.0, 2.0, 7, 8),  # 7 ahead and the challenge end at 30 s exactly: in time
        (31.0, 0.4, 0, 1),  # one request at the limits outlasts the timeout alone
        (3.0, 31.0, 10, 0),  # the challenge misses with nothing ahead of it
    ],
)
def test_the_requests_that_fit_and_those_that_make_a_challenge_miss(limit, challenge, fit, ahead):
    rows = [{"median_s": challenge}, {"median_s": limit}]
    assert bench.verdict(rows, 30.0) == {
        "limit_median_s": limit,
        "challenge_median_s": challenge,
        "fit_in_timeout": fit,
        "ahead_to_miss": ahead,
    }


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["--dtypes", "float32,float64"], "REFERENCE_DTYPE expected one of float32, bfloat16, float16, got 'float64'"),
        (["--device", "gpu"], "DEVICE expected cpu, cuda or cuda:N, got 'gpu'"),
        (["--device", "cuda:99"], "--device cuda:99: "),  # no GPU, or fewer than 100
    ],
)
def test_a_dtype_or_device_the_settings_or_this_machine_do_not_allow_is_refused_naming_it(argv, refusal, capsys):
    with pytest.raises(SystemExit) as exited:
        bench.main(["--tiny", *argv])
    assert exited.value.code == 2
    assert refusal in capsys.readouterr().err
