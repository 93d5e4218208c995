"""Lock files their holder removes on release (the fork cache's per-key locks, the sandbox uids,
the sandbox folders' claims): a process that locked such a file just as its holder removed it holds
the lock of no file, and must see that before it trusts the lock."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` is still the file open as ``fd`` (not removed, nor replaced by another)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


@contextmanager
def unheld(path: Path, follow: bool = True) -> Iterator[int | None]:
    """For a sweep of the lock files killed holders left: ``path`` open and locked here when no live
    process holds it and it is still the file at ``path``, else None (held, removed meanwhile, not
    to be opened; with ``follow`` false, a symbolic link). The caller removes what the file claims,
    then the file, while the lock is held."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except OSError:  # removed meanwhile, or another user's
        fd = -1
    if fd < 0:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            taken = same_file(path, fd)
        except BlockingIOError:
            taken = False  # its holder is alive
        yield fd if taken else None
    finally:
        os.close(fd)
