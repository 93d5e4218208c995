"""scripts/api_load_benchmark.py, briefly and at low rates: the real server with two workers, signed
submissions and every route of the read mix (the dashboard's pages included) answered, nothing
acknowledged lost, and its table legible at 80 columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api_fixtures import postgres  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_load_benchmark_runs_every_read_and_loses_nothing(backend, request, tmp_path):
    if backend == "postgresql":
        request.getfixturevalue("postgres")  # skips (or fails under CI) without a PostgreSQL server
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
    assert "read p99 ms" in run.stdout and "missed" in run.stdout  # 20/s is below the target
