"""The shell scripts a new user meets first (scripts/setup_venv.sh, scripts/in_venv.sh through
START_MINER_INFERENCE.sh and START_SERVER.sh): what they say fits an 80-column terminal."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def copy_scripts(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, directory / name)


def run(directory: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(directory / script)],
        env={"PATH": os.environ["PATH"], "HOME": str(directory)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_server_started_without_a_venv_says_how_to_make_one_within_80_columns(tmp_path):
    copy_scripts(tmp_path, "START_MINER_INFERENCE.sh", "scripts/in_venv.sh")
    result = run(tmp_path, "START_MINER_INFERENCE.sh")
    assert result.returncode == 1 and "./scripts/setup_venv.sh" in result.stderr
    assert all(len(line) <= 80 for line in result.stderr.splitlines()), result.stderr


def test_setup_venv_says_it_installs_within_80_columns(tmp_path):
    """Its first words to a new user were 82 columns wide. A stand-in .venv whose pip fails ends
    the run right after them."""
    copy_scripts(tmp_path, "scripts/setup_venv.sh", "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 3\n")
    python.chmod(0o755)
    result = run(tmp_path, "scripts/setup_venv.sh")
    assert result.returncode == 3 and "setup_venv: installing" in result.stderr
    assert all(len(line) <= 80 for line in result.stderr.splitlines()), result.stderr
