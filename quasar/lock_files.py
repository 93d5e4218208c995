"""Lock files their holder removes on release (the fork cache's per-key locks, the sandbox uids,
the sandbox folders' claims): a process that locked such a file just as its holder removed it holds
the lock of no file, and must see that before it trusts the lock."""

from __future__ import annotations

import os
from pathlib import Path


def same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` is still the file open as ``fd`` (not removed, nor replaced by another)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
