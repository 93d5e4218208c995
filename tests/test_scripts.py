"""The shell scripts a new user meets first (scripts/setup_venv.sh, scripts/in_venv.sh through
START_MINER_INFERENCE.sh and START_SERVER.sh): what they say fits an 80-column terminal."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_setup_venv_in_a_non_ascii_path_under_lang_c_gives_a_python_that_starts(tmp_path):
    """A checkout at `~/GPU work/quasär suite` set up under LANG=C: setuptools' editable build
    failed writing the checkout's path into its .pth (UnicodeEncodeError: 'ascii'), and a .pth
    written in UTF-8 stopped every start of .venv's python (site reads .pth files in the locale's
    encoding: 'Fatal Python error: init_import_site'), also where an earlier setup under a UTF-8
    locale had written it and the install was current. The stand-in .venv is a real one that sees
    this checkout's installed packages, so only the project itself is installed, offline; the
    off-path groups, wheels the test does not have, are left empty."""
    project_site = ROOT / ".venv" / "lib" / "python3.11" / "site-packages"
    if not (project_site / "setuptools").is_dir():
        pytest.skip("needs the project's .venv (Python 3.11, with setuptools)")
    checkout = tmp_path / "GPU work" / "quas\u00e4r suite"
    copy_scripts(checkout, "scripts/setup_venv.sh", "README.md")
    for package in ("quasar", "neurons"):
        shutil.copytree(ROOT / package, checkout / package, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = (ROOT / "pyproject.toml").read_text()
    pyproject = re.sub(r"^(upstream-fla|gpu-image-triton) = \[.*\]$", r"\1 = []", pyproject, flags=re.M)
    (checkout / "pyproject.toml").write_text(pyproject)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(checkout / ".venv")], check=True)
    site = checkout / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "project-packages.pth").write_text(f"{project_site}\n")
    (tmp_path / "wheels").mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "LC_ALL": "C",
        "QUASAR_WHEELHOUSE": str(tmp_path / "wheels"),
        "PIP_NO_BUILD_ISOLATION": "0",  # pip's spelling of --no-build-isolation: setuptools is installed
    }

    def set_up_and_start() -> None:
        setup = subprocess.run(
            ["bash", str(checkout / "scripts" / "setup_venv.sh")], env=env, capture_output=True, text=True, timeout=120
        )
        assert setup.returncode == 0, setup.stderr[-3000:]
        started = subprocess.run(
            [str(checkout / ".venv" / "bin" / "python"), "-c", "import quasar; print(quasar.__file__)"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert started.returncode == 0, started.stderr[-3000:]
        assert started.stdout.strip() == str(checkout / "quasar" / "__init__.py")

    set_up_and_start()
    # A .venv set up before, under a UTF-8 locale: its .pth names the checkout in UTF-8, and the
    # install is current (its stamp), so only the repair runs.
    [editable] = site.glob("__editable__.quasar_subnet-*.pth")
    editable.write_text(f"{checkout}\n", encoding="utf-8")
    set_up_and_start()
