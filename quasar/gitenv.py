"""The environment variables the suite runs git with.

Wherever the suite runs git (a validator cloning a fork, a miner committing, the starter fork and the
local network writing their repositories), git must not read the user's or the machine's
configuration: hooks, commit signing, ``autocrlf`` or a credential helper there would change or
block what the suite does. Where the suite commits, it names the author and the committer itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

# git reads neither /etc/gitconfig nor ~/.gitconfig (nor $XDG_CONFIG_HOME/git/config).
NO_USER_CONFIGURATION: Mapping[str, str] = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def identity(name: str, email: str, date: str | None = None) -> dict[str, str]:
    """The variables that make ``name <email>`` a commit's author and its committer (at ``date``,
    an ISO 8601 time, when given: the same files then give the same commit id)."""
    variables = {}
    for role in ("AUTHOR", "COMMITTER"):
        variables[f"GIT_{role}_NAME"] = name
        variables[f"GIT_{role}_EMAIL"] = email
        if date is not None:
            variables[f"GIT_{role}_DATE"] = date
    return variables


def committing_environment(name: str, email: str, date: str | None = None) -> dict[str, str]:
    """This process's environment without its ``GIT_*`` variables (no inherited repository,
    author or configuration), with :data:`NO_USER_CONFIGURATION` and :func:`identity`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(NO_USER_CONFIGURATION)
    env.update(identity(name, email, date))
    return env


def run_git(cwd: Path, *args: str, env: Mapping[str, str], error: type[Exception]) -> str:
    """Run ``git ARGS`` in ``cwd`` with ``env``; its output, stripped. A missing git or a failing
    command raises ``error`` with git's own explanation."""
    git = shutil.which("git")
    if git is None:
        raise error("git is not installed (the suite writes and commits repositories with it)")
    result = subprocess.run([git, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise error(f"git {args[0]} failed in {cwd}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip()
