"""git for the tests, one way: run apart from this machine's and its user's configuration, with a
fixed author, so a test's repositories and commits do not depend on who runs the suite."""

from __future__ import annotations

import subprocess
from pathlib import Path

from quasar.gitenv import committing_environment

IDENTITY = {"name": "Miner", "email": "miner@example.invalid"}


def git_environment() -> dict[str, str]:
    """This process's environment without its GIT_* variables, no system or global git
    configuration, and :data:`IDENTITY` as author and committer."""
    return committing_environment(IDENTITY["name"], IDENTITY["email"])


def git(repo: Path | None, *args: str) -> str:
    """``git ARGS`` in ``repo`` (None: the current directory); its stdout, stripped. A failure
    raises CalledProcessError with git's stderr."""
    done = subprocess.run(["git", *args], cwd=repo, env=git_environment(), capture_output=True, text=True, check=True)
    return done.stdout.strip()


def set_identity(repo: Path) -> None:
    """The identity a miner's checkout has in its own configuration (``quasar step1`` checks it;
    the tools commit with it, outside :func:`git_environment`)."""
    git(repo, "config", "user.name", IDENTITY["name"])
    git(repo, "config", "user.email", IDENTITY["email"])


def commit_all(repo: Path, message: str) -> str:
    """Commit everything in ``repo`` (made a repository first if it is not one); the commit id."""
    if not (repo / ".git").exists():
        git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--no-verify", "--no-gpg-sign", "-m", message)
    return head(repo)


def head(repo: Path) -> str:
    """The commit ``HEAD`` names in ``repo``, a checkout or a bare repository."""
    return git(repo, "rev-parse", "HEAD")
