"""The environment variables the suite runs git with.

Wherever the suite runs git (a validator cloning a fork, a miner committing, the starter fork and the
local network writing their repositories), git must not read the user's or the machine's
configuration: hooks, commit signing, ``autocrlf`` or a credential helper there would change or
block what the suite does. Where the suite commits, it names the author and the committer itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

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
