"""Processes in the tests: what /proc says of the running ones, Python children of the repository
whose output the tests read, a START script in a copy of the checkout and what it said, a stop
signal sent where Python drops what its handler raises, libfaketime for children whose clock is
off, and Python children run as another Unix user."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
# A command's prefix that runs it as nobody (uid and gid 65534, no supplementary groups).
AS_NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
# Tests that run a child as another Unix user: only root may switch users, with setpriv.
needs_another_user = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="runs a child as another Unix user (root, setpriv)"
)


def libfaketime() -> str:
    """The path of libfaketime, to preload in a child whose clock a test moves (scripts/test.sh
    installs it); the test is skipped where it is missing."""
    if not LIBFAKETIME.exists():
        pytest.skip("libfaketime missing (Debian package faketime)")
    return str(LIBFAKETIME)


def proc_files(field: str) -> Iterator[tuple[int, bytes]]:
    """``(pid, content of /proc/PID/field)`` for each running process; one that exits (or whose file
    this process may not read) while the list is read is passed over."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                yield int(name), Path(f"/proc/{name}/{field}").read_bytes()
            except OSError:
                continue


def run_python(
    args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd`` with ``env`` (None: this process's) and ``stdin``; its output
    captured as text. It must end within ``timeout`` seconds (else TimeoutExpired)."""
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout
    )


def open_to_other_users(folder: Path) -> None:
    """Let other Unix users into ``folder`` and every folder above it (read and enter): pytest's
    temporary folders are its user's alone."""
    for each in (folder, *folder.parents):
        if each.stat().st_mode & 0o005 != 0o005:
            each.chmod(each.stat().st_mode | 0o005)


def run_python_as_nobody(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` as nobody (:data:`AS_NOBODY`), its output captured as text."""
    return subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def script_results(script: str, args: list[str], timeout: float, **environ: str) -> dict:
    """Run ``script`` (``python -c``) with ``args`` in the repository, which is on its PYTHONPATH,
    and ``environ`` added to this process's environment; the JSON object its last line printed. A
    failed run fails the test with the end of its stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **environ}
    result = run_python(["-c", script, *args], REPO_ROOT, timeout, env)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def start_script_copy(directory: Path, script: str) -> Path:
    """``directory`` made a copy of the checkout for a START script: ``script`` and the checks it
    sources, beside this checkout's .venv (the test is skipped without one)."""
    if not (REPO_ROOT / ".venv" / "bin" / "activate").is_file():
        pytest.skip("needs the project's .venv")
    (directory / "scripts").mkdir(parents=True)
    shutil.copy(REPO_ROOT / script, directory / script)
    shutil.copy(REPO_ROOT / "scripts" / "start_checks.sh", directory / "scripts" / "start_checks.sh")
    os.symlink(REPO_ROOT / ".venv", directory / ".venv")
    return directory


def neuron_stand_in(directory: Path, role: str, printed: str) -> None:
    """A stand-in neurons/ROLE.py in ``directory``, which a START script there starts: it reads its
    settings as ROLE does and prints ``printed`` (print's arguments, in terms of ``settings``)."""
    (directory / "neurons").mkdir(exist_ok=True)
    (directory / "neurons" / "__init__.py").write_text("")
    (directory / "neurons" / f"{role}.py").write_text(
        "import argparse\n"
        "from quasar import config\n"
        "parser = argparse.ArgumentParser()\n"
        f"config.add_arguments(parser, {role!r})\n"
        "_, settings = config.parse_args(parser)\n"
        f"print({printed})\n"
    )


def run_start_script(directory: Path, script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``bash DIRECTORY/SCRIPT ARGS`` (a START script in a copy of the checkout) with only PATH,
    HOME (``directory``) and ``env`` in its environment; its output captured as text."""
    base = {"PATH": os.environ["PATH"], "HOME": str(directory)}
    return subprocess.run(
        ["bash", str(directory / script), *args], env={**base, **env}, capture_output=True, text=True, timeout=120
    )


def said(result: subprocess.CompletedProcess) -> str:
    """What a START script wrote to stderr, its words on one line (the scripts wrap them at 80 columns)."""
    return " ".join(result.stderr.split())


def bench_figures(tool: str, flags: list[str], figures_file: Path) -> tuple[subprocess.CompletedProcess[str], list]:
    """``quasar bench TOOL FLAGS --json FIGURES_FILE`` in the repository at 80 columns, which must
    succeed within four minutes; the run and the figures it wrote."""
    command = ["-m", "quasar", "bench", tool, *flags, "--json", str(figures_file)]
    run = run_python(command, REPO_ROOT, 240, {**os.environ, "COLUMNS": "80"})
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads(figures_file.read_text())


def signal_in_a_finaliser(signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to this process from inside a finaliser: its handler runs there, and Python
    drops the exception it raises ("Exception ignored in ..."), as for a signal landing in a
    weakref callback of the garbage collector."""

    class Finalised:
        def __del__(self) -> None:
            os.kill(os.getpid(), signum)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the handler runs here, inside the finaliser
                pass

    Finalised()
