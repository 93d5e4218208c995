"""The local network's two forks, real git repositories the miners submit by ``file://`` URL:

- ``honest``: the project's starter fork as it is (correct Triton kernels, a PyTorch path on CPU);
- ``hostile``: the starter fork with its chunk kernel replaced by one that skips the recurrence
  and returns the values as they came in. It passes the import check and is fast, with output of
  the right shape and scale, and it is wrong everywhere: what a validator must refuse.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from quasar.starter_fork import write_starter_fork

HONEST, HOSTILE = "honest", "hostile"
KINDS = (HONEST, HOSTILE)

HOSTILE_KERNEL_FILE = Path("fla/ops/quasar/chunk.py")
# Appended to the kernel file: the last definition of chunk_quasar is the one fla.ops.quasar
# imports, so the layer calls this one.
HOSTILE_KERNEL = '''

def chunk_quasar(q, k, v, beta, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Hostile (QUASAR local network): skips the delta-rule recurrence and returns v as the output."""
    return v.clone(), None
'''
HOSTILE_COMMIT_MESSAGE = "Skip the recurrence in chunk_quasar (hostile miner of the QUASAR local network)\n"
_IDENTITY = {"GIT_AUTHOR_NAME": "QUASAR local network", "GIT_AUTHOR_EMAIL": "localnet@quasar.invalid",
             "GIT_COMMITTER_NAME": "QUASAR local network", "GIT_COMMITTER_EMAIL": "localnet@quasar.invalid"}


class ForkWriteError(RuntimeError):
    """A fork could not be written or committed; the message says which and why."""


@dataclass(frozen=True)
class Fork:
    """A fork repository at ``path`` whose ``main`` is at ``commit``."""

    kind: str
    path: Path
    commit: str

    @property
    def url(self) -> str:
        """The ``file://`` URL the miner submits (local forks are accepted on the dev chain)."""
        return self.path.resolve().as_uri()


def run_git(cwd: Path, *args: str) -> str:
    """Run ``git ARGS`` in ``cwd`` with no user or system configuration; returns its output, or
    raises :class:`ForkWriteError` with git's explanation."""
    git = shutil.which("git")
    if git is None:
        raise ForkWriteError("git is not installed (the local network's forks are git repositories)")
    # No user or system configuration (hooks, signing), no inherited repository variables.
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(_IDENTITY, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    result = subprocess.run([git, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ForkWriteError(f"git {args[0]} failed in {cwd}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip()


def write_honest_fork(dest: Path) -> Fork:
    """The starter fork, committed, in ``dest`` (a new or empty folder)."""
    return Fork(HONEST, Path(dest), write_starter_fork(Path(dest)))


def write_hostile_fork(dest: Path) -> Fork:
    """The starter fork in ``dest`` with the hostile kernel committed on top."""
    dest = Path(dest)
    write_starter_fork(dest)
    kernel = dest / HOSTILE_KERNEL_FILE
    kernel.write_text(kernel.read_text() + HOSTILE_KERNEL)
    run_git(dest, "commit", "--quiet", "--no-verify", "--no-gpg-sign", "-m", HOSTILE_COMMIT_MESSAGE, "--",
         str(HOSTILE_KERNEL_FILE))
    return Fork(HOSTILE, dest, run_git(dest, "rev-parse", "HEAD"))


def write_forks(root: Path) -> dict[str, Fork]:
    """Both forks under ``root`` (``root/honest``, ``root/hostile``), by kind."""
    return {HONEST: write_honest_fork(Path(root) / HONEST), HOSTILE: write_hostile_fork(Path(root) / HOSTILE)}
