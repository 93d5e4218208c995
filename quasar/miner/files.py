"""The miner's files written whole or not at all: its state, its reports, git's credential helper."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(
    path: Path, text: str, what: str, mode: int = 0o600, durable: bool = False, says_kept: bool = False
) -> None:
    """Write ``text`` to ``path`` (mode ``mode``) through a temporary file beside it, renamed over
    it, so a reader finds the previous file or the new one whole; ``durable``: the file and the
    rename reach the disk before this returns (fsync). A write that fails (a full or read-only
    disk) removes the temporary file, leaves the previous one as it was and raises an OSError
    naming ``path``: "cannot WHAT (the system's reason)", followed by "; the previous one is kept"
    where ``says_kept``."""
    kept = "; the previous one is kept" if says_kept else ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise OSError(error.errno, f"cannot {what} ({error.strerror}){kept}", str(path)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise OSError(error.errno, f"cannot {what} ({error.strerror}){kept}", str(path)) from None
        raise
    if durable:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
