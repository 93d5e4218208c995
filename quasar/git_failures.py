"""What git's error output says went wrong in a fork's clone: the fork (its repository or commit
missing) or this host (its disk or memory, the network to the fork's host). quasar/forks.py turns
the answer into the error a validator records or retries (docs/validator.md, "This validator's
faults and the fork's")."""

from __future__ import annotations

from dataclasses import dataclass

# This host's disk, memory or process table failed git: the system's error (strerror) that ends one
# of its lines, looked for in all git said before anything else. Only a whole last part counts, so
# a path of the fork's in a message (quoted, or followed by the real error) never reads as one.
_HOST_ERRORS = frozenset(
    {
        "no space left on device",
        "read-only file system",
        "disk quota exceeded",
        "cannot allocate memory",
        "resource temporarily unavailable",
    }
)
_OUT_OF_MEMORY = "out of memory, malloc failed"  # git's own: "fatal: Out of memory, malloc failed (tried ...)"
# The way to the fork's host failed: curl got no answer, or an HTTP error other than the 404 and
# 401 GitHub gives a missing or private repository (those match _REPO_MISSING first); or the
# connection was cut mid-transfer.
_NETWORK_FAULTS = ("unable to access", "rpc failed", "early eof", "remote end hung up unexpectedly")
# The server does not have the requested object.
_COMMIT_MISSING = ("not our ref", "unadvertised object", "couldn't find remote ref", "no such remote ref")
# The repository itself cannot be read (missing, private, mistyped).
_REPO_MISSING = (
    "not found",
    "terminal prompts disabled",
    "does not appear to be a git repository",
    "could not read from remote repository",
    "could not read username",
)

HOST = "host"
NETWORK = "network"
COMMIT_MISSING = "commit missing"
REPO_MISSING = "repository missing"


@dataclass(frozen=True)
class GitFailure:
    """What went wrong (HOST, NETWORK, COMMIT_MISSING, REPO_MISSING or None: another failure)
    and the line of git's output that says so best (its last, or the host fault's)."""

    kind: str | None
    detail: str


def classify(command: str, stderr: str) -> GitFailure:
    """Read the error output ``stderr`` of ``git COMMAND``; a missing commit or repository, or the
    network, is told only by ``fetch`` (the other commands work on the clone alone, and print the
    fork's paths)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    lowered = stderr.lower()
    host_fault = next((line for line in lines if _is_host_error(line)), None)
    if host_fault is not None:
        return GitFailure(HOST, host_fault)
    detail = lines[-1] if lines else "no message"
    if command == "fetch" and any(text in lowered for text in _COMMIT_MISSING):
        return GitFailure(COMMIT_MISSING, detail)
    if command == "fetch" and any(text in lowered for text in _REPO_MISSING):
        return GitFailure(REPO_MISSING, detail)
    if command == "fetch" and any(text in lowered for text in _NETWORK_FAULTS):
        return GitFailure(NETWORK, detail)
    return GitFailure(None, detail)


def _is_host_error(line: str) -> bool:
    said = line.rsplit(": ", 1)[-1].strip().lower()
    return said in _HOST_ERRORS or said.startswith(_OUT_OF_MEMORY)
