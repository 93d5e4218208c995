"""What a sandbox leaves behind when its parent dies without closing it, and its removal.

A sandbox's parent (a validator's evaluation worker, a miner, ``quasar evaluate``) removes its
temporary directory and its cgroups when it closes the sandbox. A parent killed by SIGKILL (the
validator's deadline on a worker, the OOM killer, ``kill -9``) closes nothing: its child dies with
it (the parent-death signal), but the directory (the fork's copy, the harness, the Triton cache
seed's copy) and the empty cgroups stayed on the host for good, one set per kill.

So each sandbox's directory is *claimed*: a lock file beside it (``quasar-eval-TOKEN.lock`` next to
``quasar-eval-TOKEN``), held with ``flock`` by the parent for the sandbox's life and listing the
cgroups made for it. The lock is released by the kernel when its holder dies, however it dies;
:func:`sweep`, run at every sandbox's start, removes the directory and cgroups of every claim no
live process holds and this process's user owns (another user's file could list any folder with a
``cgroup.procs`` naming any process; that user's own next sandbox removes it), and the sandbox
uids' lock files no live sandbox holds
(confinement.remove_unheld_uid_locks). A ``quasar-eval-*`` directory with no lock file (left by an older version of
this code) is removed once it is older than :data:`UNCLAIMED_AGE_S`, longer than any evaluation.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from quasar.evaluate.confinement import CGROUP_PREFIX, remove_cgroup_directory, remove_unheld_uid_locks
from quasar.lock_files import unheld

logger = logging.getLogger(__name__)

PREFIX = "quasar-eval-"
LOCK_SUFFIX = ".lock"
# A sandbox directory without a lock file this old belongs to no running evaluation.
UNCLAIMED_AGE_S = 24 * 3600.0


class Claim:
    """A new sandbox directory under ``root`` (the temporary folder by default), held by this
    process until :meth:`release`; :meth:`record_cgroups` adds the sandbox's cgroups to it."""

    def __init__(self, root: str | os.PathLike | None = None):
        root = Path(root if root is not None else tempfile.gettempdir())
        token = secrets.token_hex(8)
        self.lock_path = root / f"{PREFIX}{token}{LOCK_SUFFIX}"
        self.workdir = root / f"{PREFIX}{token}"
        # The lock file appears under its name already locked (made and locked under a hidden
        # name, then renamed), so a sweep never sees it unheld while its holder lives.
        fd, hidden = tempfile.mkstemp(prefix=f".{PREFIX}", dir=root)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(hidden, self.lock_path)
            os.mkdir(self.workdir, 0o700)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(hidden)
            self.lock_path.unlink(missing_ok=True)
            raise
        self._fd = fd

    def record_cgroups(self, directories) -> None:
        """Note the sandbox's cgroup directories, for a sweep to remove should this process die."""
        text = "".join(f"{directory}\n" for directory in directories)
        if text and self._fd >= 0:
            os.lseek(self._fd, 0, os.SEEK_END)
            os.write(self._fd, text.encode())

    def release(self) -> None:
        """Delete the directory and the lock file, then let go of the lock (once)."""
        if self._fd < 0:
            return
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.lock_path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def _remove_cgroups(listed: str) -> None:
    for line in listed.splitlines():
        directory = Path(line)
        if directory.is_absolute() and directory.name.startswith(CGROUP_PREFIX) and directory.is_dir():
            remove_cgroup_directory(directory)


def sweep(root: str | os.PathLike | None = None, now: float | None = None) -> list[Path]:
    """Remove every sandbox directory under ``root`` (and its cgroups) that no live process
    claims, and every unheld sandbox uid lock file; returns the directories removed."""
    root = Path(root if root is not None else tempfile.gettempdir())
    now = time.time() if now is None else now
    removed = []
    for lock_path in root.glob(f"{PREFIX}*{LOCK_SUFFIX}"):
        with unheld(lock_path) as fd:
            if fd is None:
                continue  # its sandbox is alive, or its holder released it meanwhile
            if os.fstat(fd).st_uid != os.geteuid():
                continue  # another user's: its cgroup list could name any process to kill
            _remove_cgroups(os.pread(fd, 1 << 16, 0).decode(errors="replace"))
            workdir = lock_path.with_name(lock_path.name[: -len(LOCK_SUFFIX)])
            shutil.rmtree(workdir, ignore_errors=True)
            lock_path.unlink(missing_ok=True)
            removed.append(workdir)
    for workdir in root.glob(f"{PREFIX}*"):
        if workdir.name.endswith(LOCK_SUFFIX) or workdir.with_name(workdir.name + LOCK_SUFFIX).exists():
            continue
        try:
            unclaimed = (
                workdir.is_dir() and not workdir.is_symlink() and now - workdir.stat().st_mtime > UNCLAIMED_AGE_S
            )
        except OSError:
            continue
        if unclaimed:
            shutil.rmtree(workdir, ignore_errors=True)
            removed.append(workdir)
    if removed:
        logger.warning(
            "removed %d sandbox folder(s) left by evaluations whose process was killed: %s",
            len(removed),
            ", ".join(str(path) for path in removed),
        )
    uids = remove_unheld_uid_locks()
    if uids:
        logger.warning("removed %d sandbox uid lock file(s) left by evaluations whose process was killed", uids)
    return removed
