"""The command line (quasar/imports/cli.py, run as ``python -m quasar.imports``): the table or the
JSON, and exit status 0 iff the fork passes, 1 if not, 2 for a usage error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.import_forks import CHUNK, CORE_ONE_LINE, make_fork

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quasar.imports", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_cli_json_and_exit_codes(tmp_path):
    clean = make_fork(tmp_path / "clean", {"fla/ops/quasar/quasar_stub.cu": None})
    result = run_cli(str(clean), "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload == {"ok": True, "errors": [], "warnings": [".: no-cu-file: the repository has no *.cu file"]}

    result = run_cli(str(clean), "--json", "--require-cu", "--profile", "strict")
    assert result.returncode == 1
    assert json.loads(result.stdout)["errors"] == [".: no-cu-file: the repository has no *.cu file"]

    bad = make_fork(
        tmp_path / "bad", {CHUNK: CORE_ONE_LINE + "import importlib\nimportlib.import_module('fla.ops.' + 'kda')\n"}
    )
    result = run_cli(str(bad), "--json", "--profile", "strict")
    assert result.returncode == 1
    payload = json.loads(result.stdout)
    assert set(payload) == {"ok", "errors", "warnings"} and payload["ok"] is False
    assert any(
        e.startswith(f"{CHUNK}:4: forbidden-import: forbidden dynamic import of fla.ops.kda") for e in payload["errors"]
    )
    assert len(payload["errors"]) == 8  # the dynamic import and the seven strict-only lines
    assert all(isinstance(e, str) and e.startswith(CHUNK) for e in payload["errors"])


def test_cli_human_output_and_usage_errors(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/gate.py": "from fla.ops import kda\n"})
    result = run_cli(str(fork))
    assert result.returncode == 1
    assert (
        "FAIL" in result.stdout and "fla/ops/quasar/gate.py:1" in result.stdout and "forbidden-import" in result.stdout
    )
    (fork / "fla/ops/quasar/gate.py").write_text("import torch\n")
    result = run_cli(str(fork))
    assert result.returncode == 0 and "PASS" in result.stdout
    result = run_cli(str(tmp_path / "no-such-repo"))
    assert result.returncode == 2 and "is not a directory" in result.stderr
    assert run_cli().returncode == 2
    assert run_cli(str(fork), "--profile", "loose").returncode == 2
