"""Lock files. Those their holder removes on release (the fork cache's per-key locks, the sandbox
uids, the sandbox folders' claims): a process that locked such a file just as its holder removed it
holds the lock of no file, and must see that before it trusts the lock. And those that keep one
process at a time on a folder or file (the miner's workspace, the validator's state): their holder
writes its pid in them, for the refusal of the next one to name it; one that cannot be taken at
all is refused with the cure for its errno (:func:`lock_refusal`)."""

from __future__ import annotations

import errno
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


def lock_for_this_process(fd: int) -> str | None:
    """Lock the file open as ``fd`` for this process alone, without waiting, and write this
    process's pid into it; None once done. Where another process holds the lock: the pid it wrote
    there ("unknown" where it wrote none yet), and the file is neither locked nor written here."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return None


def lock_file_cure(error: OSError, process: str, setting: str) -> str:
    """What makes a lock file that ``error`` refused usable: the cure for its errno. ``process`` is
    the one refused ("this miner"), ``setting`` the setting of the folder the lock file is in."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free space on its disk, or give {process} a {setting} on a disk it can write"
    if error.errno == errno.ENOLCK:  # flock on NFS without its lock service
        return (
            f"its file system does not lock files (NFS without its lock service): give {process} a {setting} on "
            "a local disk"
        )
    if error.errno == errno.EROFS:
        return (
            f"its disk is mounted read-only: mount it read-write, or give {process} a {setting} on a disk it can write"
        )
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"give {process} a {setting} that its user can write"
    return f"give {process} a {setting} on a disk it can write"


def lock_refusal(error: OSError, what: str, process: str, setting: str, doing: str | None = None) -> str:
    """The refusal of a lock file or its folder, which ``error`` stopped: "cannot {doing} {what}",
    the error and its cure (:func:`lock_file_cure`). ``doing`` is what was refused ("open",
    "create"); where not given, taking the lock: "lock" where the file system cannot lock, else
    "write" (its pid)."""
    if doing is None:
        doing = "lock" if error.errno == errno.ENOLCK else "write"
    return f"cannot {doing} {what}: {error.strerror}; {lock_file_cure(error, process, setting)}"
