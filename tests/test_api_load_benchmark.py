"""scripts/api_load_benchmark.py, briefly and at low rates: the real server with two workers on SQLite,
signed submissions and every route of the read mix (the dashboard's pages included) answered,
nothing acknowledged lost, and its table legible at 80 columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from api_load_benchmark import Figures, figures_table  # noqa: E402


def test_load_benchmark_runs_every_read_and_loses_nothing(tmp_path):
    backend = "sqlite"  # the PostgreSQL path of the API is the one the other API tests run on both backends
    figures_file = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "scripts/api_load_benchmark.py", "--backend", backend, "--workers", "2", "--seconds", "2",
         "--rate", "20", "--read-rate", "50", "--submitters", "4", "--readers", "4", "--json", str(figures_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "80"})
    assert run.returncode == 0, run.stdout + run.stderr
    [figures] = json.loads(figures_file.read_text())
    assert figures["backend"] == backend and figures["workers"] == 2
    assert figures["lost"] == 0 and figures["errors"] == {} and figures["read_errors"] == {}
    assert figures["submissions_per_sec"] > 5 and figures["reads_per_sec"] > 10
    assert max(len(line) for line in run.stdout.splitlines()) <= 80, run.stdout
    assert "read p99 ms" in run.stdout and "0 of 1" in run.stdout  # 20/s is below the target


def test_figures_table_takes_medians_per_configuration_within_80_columns():
    runs = [Figures(backend=backend, workers=workers, seconds=10.0, offered_rate=330.0, submissions_per_sec=rate,
                    p50_ms=5.0, p99_ms=p99, max_ms=2 * p99, errors={"503": 1} if p99 > 100 else {}, lost=0,
                    offered_read_rate=1100.0, reads_per_sec=1100.0, read_p50_ms=1.0, read_p99_ms=4.0, read_errors={},
                    server_cpu_ms_per_request=0.7, client_cpu_share=0.2, load_average=1.5)
            for backend in ("sqlite", "postgresql") for workers in (1, 2, 4)
            for rate, p99 in ((330.0, 20.0), (329.0, 30.0), (310.0, 140.0))]
    console = Console(width=80, record=True)
    console.print(figures_table(runs))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in text.splitlines() if line.startswith("│")}
    assert rows["submit/s"] == ["329"] * 6 and rows["submit p99 ms"] == ["30.0"] * 6
    assert rows["submit errors"] == ["503: 1"] * 6 and rows["targets met"] == ["2 of 3"] * 6
