"""What keeps one sandboxed evaluation from reaching another on the same host.

A validator with several GPUs runs several sandboxes side by side, and its host may run other
services; each sandbox gets limits of its own (:class:`Confinement`), set up by the parent before
the child starts and undone when it is closed:

- **its own uid** (as root): a uid from :data:`UID_BASE` … ``UID_BASE + UID_SLOTS - 1``, held by
  an exclusive ``flock`` on a file named after it for the sandbox's life, so no two live sandboxes
  share one. Per-uid limits and per-uid kernel state (the process count behind ``RLIMIT_NPROC``,
  the user keyring, signals) are then the sandbox's own, never shared with ``nobody`` or another
  sandbox.
- **its own cgroup** where the host lets this process make one (cgroup v1 hierarchies of the
  ``pids`` and ``memory`` controllers that it can write, or a cgroup v2 directory whose
  ``cgroup.subtree_control`` enables ``memory``, and ``pids`` where the host has it: its own
  cgroup, or ``SANDBOX_CGROUP``): the memory limit bounds its memory, the tmpfs it writes
  included, and ``pids.max`` its processes and threads (else the uid's ``RLIMIT_NPROC`` does);
  sandbox_init.py joins it before anything else runs in the sandbox.
- otherwise, **a watchdog**: a thread of the parent that sums the memory of the sandbox's
  processes every :data:`WATCHDOG_SECONDS`, anonymous and shared (shared mappings, and the memory
  files they hold open), and kills the sandbox above the limit (its tmpfs are bounded by their
  sizes) or once a process of its own uid lowered its out-of-memory preference, and processes are
  bounded by the uid's ``RLIMIT_NPROC``.

``describe()`` says which of these hold, for the report's ``sandbox`` line.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from quasar.errors import QuasarError
from quasar.evaluate.oom_preference import OOM_SCORE_ADJ, lowered_oom_preference
from quasar.lock_files import same_file, unheld

logger = logging.getLogger(__name__)

# A range of uids no distribution or container runtime hands out (subordinate ranges start at
# 100000 and grow by 65536 per user; systemd's dynamic users stay under 65536).
UID_BASE = 0x7E000000
UID_SLOTS = 1 << 16
UID_LOCK_DIRECTORIES = ("/run/lock/quasar-sandbox-uids", "/tmp/quasar-sandbox-uids")
WATCHDOG_SECONDS = 0.25
CGROUP_PREFIX = "quasar-sandbox-"


class ConfinementError(QuasarError):
    """A limit could not be set up; the message names which."""


@dataclass
class UidLease:
    """A uid held for one sandbox: released by removing the lock file, then closing it (so the
    lock directory holds a file per live sandbox, not one per uid ever leased)."""

    uid: int
    lock_fd: int
    path: Path

    def release(self) -> None:
        if self.lock_fd >= 0:
            self.path.unlink(missing_ok=True)
            os.close(self.lock_fd)
            self.lock_fd = -1


def _lock_directory() -> Path:
    for candidate in UID_LOCK_DIRECTORIES:
        path = Path(candidate)
        try:
            path.mkdir(mode=0o700, parents=False, exist_ok=True)
        except OSError:
            continue
        if path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.geteuid():
            return path
    raise ConfinementError(f"no directory for the sandbox uid locks ({', '.join(UID_LOCK_DIRECTORIES)})")


def lease_uid(attempts: int = 64) -> UidLease:
    """A uid of the sandbox range that no live sandbox on this host holds (root only)."""
    directory = _lock_directory()
    for _ in range(attempts):
        uid = UID_BASE + secrets.randbelow(UID_SLOTS)
        path = directory / str(uid)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise ConfinementError(f"locking sandbox uid {uid}: {error}") from None
        if not same_file(path, fd):  # its holder released and removed it meanwhile: the lock is of no file
            os.close(fd)
            continue
        return UidLease(uid, fd, path)
    raise ConfinementError(f"no free sandbox uid after {attempts} tries")


def remove_unheld_uid_locks() -> int:
    """Remove the uid lock files no live sandbox holds; returns how many. A release removes its
    own file, but a parent killed by SIGKILL releases nothing: its file stayed for good, one per
    kill, up to UID_SLOTS. Safe beside :func:`lease_uid` in other processes: a file is removed
    only while locked here, and a lease that locked it meanwhile sees it gone and tries again."""
    removed = 0
    for candidate in UID_LOCK_DIRECTORIES:
        directory = Path(candidate)
        try:
            if directory.is_symlink() or directory.stat().st_uid != os.geteuid():
                continue
            names = [name for name in os.listdir(directory) if name.isdigit()]
        except OSError:
            continue
        for name in names:
            path = directory / name
            try:
                with unheld(path, follow=False) as fd:
                    if fd is not None:
                        path.unlink()
                        removed += 1
            except OSError:  # removed meanwhile
                continue
    return removed


# --- cgroups ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    version: int
    point: str
    controllers: frozenset[str]


def _mounts() -> list[_Mount]:
    found = []
    with open("/proc/self/mountinfo") as lines:
        for line in lines:
            fields = line.split()
            separator = fields.index("-")
            fstype, options = fields[separator + 1], fields[separator + 3]
            point = fields[4].encode().decode("unicode_escape")
            if fstype == "cgroup2":
                found.append(_Mount(2, point, frozenset()))
            elif fstype == "cgroup":
                found.append(_Mount(1, point, frozenset(options.split(","))))
    return found


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per v1 controller, and ``""`` for the v2 one."""
    own = {}
    with open("/proc/self/cgroup") as lines:
        for line in lines:
            _, controllers, where = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = where
    return own


@dataclass
class Cgroup:
    """The cgroup directories of one sandbox (one per v1 controller, or one v2 directory)."""

    version: int
    directories: dict[str, Path]
    memory_bytes: int
    max_processes: int

    @property
    def procs_files(self) -> list[str]:
        """The files sandbox_init writes ``0`` to, to join every directory."""
        return sorted({str(directory / "cgroup.procs") for directory in self.directories.values()})

    def _write(self, controller: str, name: str, value: str) -> None:
        (self.directories[controller] / name).write_text(value)

    def apply_limits(self) -> None:
        if "pids" in self.directories:
            self._write("pids", "pids.max", str(self.max_processes))
        if self.version == 2:
            self._write("memory", "memory.max", str(self.memory_bytes))
            try:
                self._write("memory", "memory.swap.max", "0")
            except OSError:
                pass  # no swap accounting here
        else:
            self._write("memory", "memory.limit_in_bytes", str(self.memory_bytes))
            try:
                self._write("memory", "memory.memsw.limit_in_bytes", str(self.memory_bytes))
            except OSError:
                pass  # no swap accounting here

    def oom_kills(self) -> int:
        """How many of the sandbox's processes the memory limit killed."""
        try:
            if self.version == 2:
                events = (self.directories["memory"] / "memory.events").read_text().split()
                return int(events[events.index("oom_kill") + 1]) if "oom_kill" in events else 0
            control = (self.directories["memory"] / "memory.oom_control").read_text().split()
            return int(control[control.index("oom_kill") + 1]) if "oom_kill" in control else 0
        except (OSError, ValueError):
            return 0

    def peak_bytes(self) -> int | None:
        """The most memory the sandbox held at once, where the kernel says."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.directories["memory"] / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def remove(self) -> None:
        """Kill whatever is left in the cgroups and remove them."""
        for directory in self.directories.values():
            remove_cgroup_directory(directory)


def remove_cgroup_directory(directory: Path) -> None:
    """Kill whatever is left in the cgroup ``directory`` and remove it (one already gone is no error)."""
    for _ in range(50):
        try:
            pids = [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]
        except OSError:
            break
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)
    try:
        directory.rmdir()
    except OSError as error:
        if error.errno != errno.ENOENT:
            logger.warning("could not remove the sandbox cgroup %s: %s", directory, error)


def _new_cgroup(version: int, directories: dict[str, Path], memory_bytes: int, max_processes: int) -> Cgroup:
    """Make a sandbox's cgroup folders and set its limits; raises OSError, having removed what it made."""
    cgroup = Cgroup(version, directories, memory_bytes, max_processes)
    made: list[Path] = []
    try:
        for directory in dict.fromkeys(directories.values()):
            directory.mkdir(mode=0o755)
            made.append(directory)
        cgroup.apply_limits()
    except OSError:
        # Only the folders made here: one never made cannot be removed either on a read-only
        # cgroup tree (a container's), and would be warned of at every sandbox.
        for directory in made:
            remove_cgroup_directory(directory)
        raise
    return cgroup


def _v2_parent(configured: str | None, mounts: list[_Mount], own: dict[str, str]) -> tuple[Path | None, str]:
    points = [mount.point for mount in mounts if mount.version == 2]
    if configured:
        return Path(configured), ""
    if not points or "" not in own:
        return None, "no cgroup v2 here"
    return Path(points[0]) / own[""].lstrip("/"), ""


def make_cgroup(
    name: str,
    memory_bytes: int,
    max_processes: int,
    configured: str | None = None,
) -> tuple[Cgroup | None, str]:
    """A new cgroup for one sandbox with its limits set, or None and why not. Tried in turn:
    ``configured`` (a v2 directory to make it in), writable v1 ``pids`` and ``memory``
    hierarchies, this process's own v2 cgroup with both controllers enabled for its children."""
    try:
        mounts = _mounts()
        own = _own_cgroups()
    except (OSError, ValueError) as error:
        return None, f"cgroups unreadable: {error}"
    reasons = []
    if not configured:
        v1 = {
            controller: next((m for m in mounts if m.version == 1 and controller in m.controllers), None)
            for controller in ("pids", "memory")
        }
        if all(v1.values()) and all(controller in own for controller in v1):
            directories = {
                controller: Path(mount.point) / own[controller].lstrip("/") / name
                for controller, mount in v1.items()
                if mount is not None
            }
            try:
                return _new_cgroup(1, directories, memory_bytes, max_processes), ""
            except OSError as error:
                reasons.append(f"cgroup v1: {error.strerror or error}")
        else:
            reasons.append("no cgroup v1 pids and memory hierarchies")
    parent, why = _v2_parent(configured, mounts, own)
    if parent is None:
        reasons.append(why)
        return None, "; ".join(reasons)
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
    except OSError as error:
        reasons.append(f"cgroup v2 {parent}: {error.strerror or error}")
        return None, "; ".join(reasons)
    if "memory" not in enabled:
        reasons.append(
            f"cgroup v2 {parent} does not enable memory for its children "
            "(set SANDBOX_CGROUP to a delegated cgroup that does)"
        )
        return None, "; ".join(reasons)
    directory = parent / name
    # pids where the host has the controller; else processes are bounded by the sandbox uid's RLIMIT_NPROC.
    controllers = {"memory": directory, **({"pids": directory} if "pids" in enabled else {})}
    try:
        return _new_cgroup(2, controllers, memory_bytes, max_processes), ""
    except OSError as error:
        reasons.append(f"cgroup v2 {directory}: {error.strerror or error}")
        return None, "; ".join(reasons)


# --- the watchdog ------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc/PID/task/TID/children)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
            except OSError:
                continue
    return found


FileKey = tuple[int, int]


def resident_bytes(pid: int) -> int:
    """The memory one process holds, its share of pages it shares with others: anonymous and
    shared (Pss_Anon + Pss_Shmem: forked processes share their parent's pages until they write
    them, and a shared mapping's pages are split among the processes that map them), else RssAnon
    + RssShmem where the kernel has no Pss_Anon; 0 if it is gone."""
    for path, fields in (
        (f"/proc/{pid}/smaps_rollup", ("Pss_Anon:", "Pss_Shmem:")),
        (f"/proc/{pid}/status", ("RssAnon:", "RssShmem:")),
    ):
        try:
            with open(path) as lines:
                found = [int(line.split()[1]) * 1024 for line in lines if line.startswith(fields)]
        except (OSError, ValueError):
            return 0
        if found:
            return sum(found)
    return 0


def shared_mapping_bytes(pid: int, files: set[FileKey]) -> int:
    """One process's share of its shared mappings of the memory files ``files`` (device, inode)."""
    total, counted = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as lines:
            for line in lines:
                fields = line.split()
                if not fields[0].endswith(":"):
                    # A mapping: "start-end perms offset major:minor inode [path]".
                    major, minor = fields[3].split(":")
                    key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
                    counted = fields[1].endswith("s") and key in files
                elif counted and fields[0] == "Pss:":
                    total += int(fields[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return total


def open_memory_files(pid: int) -> dict[FileKey, int]:
    """The memory files (``memfd_create``) one process holds open: their (device, inode) and the
    bytes each holds, mapped or not."""
    found: dict[FileKey, int] = {}
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for descriptor in descriptors:
        path = f"/proc/{pid}/fd/{descriptor}"
        try:
            if os.readlink(path).startswith("/memfd:"):
                status = os.stat(path)
                found[(status.st_dev, status.st_ino)] = status.st_blocks * 512
        except OSError:
            continue
    return found


def sandbox_bytes(pids: list[int], outside: set[FileKey], exact_above: int = 0) -> int:
    """The memory the processes ``pids`` hold: each one's anonymous and shared memory, and the
    memory files they hold open, each file once and whole; ``outside`` names files that are not
    the sandbox's (the parent's shared area for outputs, held within a bound of its own).

    Read from the summaries alone, the processes' shares of their shared mappings of those files
    stay in: an upper bound. Where it is above ``exact_above`` (any, by default), they are taken
    out, each process's whole ``smaps`` read.
    """
    files: dict[FileKey, int] = {}
    for pid in pids:
        files.update(open_memory_files(pid))
    held = sum(size for key, size in files.items() if key not in outside)
    total = held + sum(resident_bytes(pid) for pid in pids)
    if total > exact_above:
        excluded = outside | files.keys()
        total -= sum(shared_mapping_bytes(pid, excluded) for pid in pids)
    return total


class MemoryWatchdog:
    """Kills the sandbox under ``root_pid`` once its processes hold more than ``limit_bytes`` of
    memory (:func:`sandbox_bytes`, checked every :data:`WATCHDOG_SECONDS`; ``outside``: the
    memory files that are not the sandbox's), or once a process of its own uid ``sandbox_uid``
    (where it has one) lowered its out-of-memory preference (:func:`lowered_oom_preference`):
    with no cgroup bounding all of its memory, the host's killer is what stands between it and
    the validator. ``tripped`` says why it killed it."""

    def __init__(
        self,
        root_pid: int,
        limit_bytes: int,
        kill,
        outside: frozenset[FileKey] = frozenset(),
        sandbox_uid: int | None = None,
    ) -> None:
        self.root_pid = root_pid
        self.limit_bytes = limit_bytes
        self.kill = kill
        self.outside = set(outside)
        self.sandbox_uid = sandbox_uid
        self.tripped = ""
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="quasar-sandbox-memory", daemon=True)
        self._thread.start()

    def check_oom_preference(self, pids: list[int] | None = None) -> bool:
        """Whether the sandbox was killed for a process's lowered out-of-memory preference: checked
        now, among ``pids`` (else every process of the sandbox), where it has a uid of its own."""
        if self.sandbox_uid is not None and not self.tripped:
            pids = descendants(self.root_pid) if pids is None else pids
            lowered = lowered_oom_preference(pids, self.sandbox_uid)
            if lowered is not None:
                self.tripped = (
                    f"a process of the fork lowered its out-of-memory preference (oom_score_adj) from "
                    f"{OOM_SCORE_ADJ} to {lowered[1]}, for the host's out-of-memory killer to take another "
                    "process before it; the child was killed"
                )
                self.kill()
        return bool(self.tripped)

    def _watch(self) -> None:
        while not self._stop.wait(WATCHDOG_SECONDS):
            pids = descendants(self.root_pid)
            if self.check_oom_preference(pids):
                return
            # Exact only above the limit: the exact sum reads every process's whole smaps.
            used = sandbox_bytes(pids, self.outside, exact_above=self.limit_bytes)
            self.peak_bytes = max(self.peak_bytes, used)
            if used > self.limit_bytes:
                self.tripped = (
                    f"the fork's processes used {used >> 20:,} MiB of memory, over the sandbox's "
                    f"limit of {self.limit_bytes >> 20:,} MiB; the child was killed"
                )
                self.kill()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Confinement:
    """The limits of one sandbox: its uid lease, its cgroup, or the watchdog that stands in for it."""

    memory_bytes: int
    max_processes: int
    uid: UidLease | None = None
    cgroup: Cgroup | None = None
    cgroup_note: str = ""
    watchdog: MemoryWatchdog | None = None
    # What killed_reason() said when the limits were released (their cgroup files are gone then).
    released_reason: str | None = None

    @classmethod
    def prepare(cls, root: bool, memory_bytes: int, max_processes: int, configured_cgroup: str | None) -> Confinement:
        """Lease a uid (as root) and make the cgroup where the host allows; what cannot be had is
        noted, never fatal (the watchdog and the uid's limits stand in)."""
        confinement = cls(memory_bytes, max_processes)
        try:
            if root:
                confinement.uid = lease_uid()
            confinement.cgroup, confinement.cgroup_note = make_cgroup(
                CGROUP_PREFIX + secrets.token_hex(6), memory_bytes, max_processes, configured_cgroup
            )
        except BaseException:
            confinement.release()
            raise
        return confinement

    def start_watchdog(self, root_pid: int, kill, shared_fd: int | None = None) -> None:
        """Without a cgroup, watch the memory of the processes under ``root_pid``; ``shared_fd``:
        the parent's shared area for outputs, which they map and write but is not theirs."""
        if self.cgroup is None and self.watchdog is None:
            outside: frozenset[FileKey] = frozenset()
            if shared_fd is not None:
                status = os.fstat(shared_fd)
                outside = frozenset({(status.st_dev, status.st_ino)})
            sandbox_uid = self.uid.uid if self.uid is not None else None
            self.watchdog = MemoryWatchdog(root_pid, self.memory_bytes, kill, outside, sandbox_uid)

    def killed_reason(self) -> str:
        """Why the limits killed the sandbox, or ``""``."""
        if self.released_reason is not None:
            return self.released_reason
        # A preference lowered after the watchdog's last look is seen here, as each reply is read.
        if self.watchdog is not None and self.watchdog.check_oom_preference():
            return self.watchdog.tripped
        if self.cgroup is not None and self.cgroup.oom_kills():
            return (
                f"the fork's processes ran out of the sandbox's {self.memory_bytes >> 20:,} MiB of memory "
                "and were killed"
            )
        return ""

    def describe(self) -> str:
        """What holds, for the report: ``own uid``, the cgroup's limits or the watchdog's."""
        parts = []
        if self.uid is not None:
            parts.append(f"own uid {self.uid.uid}")
        if self.cgroup is not None:
            tasks = (
                f"{self.max_processes:,} tasks"
                if "pids" in self.cgroup.directories
                else f"{self.max_processes:,} tasks by RLIMIT_NPROC"
                if self.uid is not None
                else "tasks not limited"
            )
            parts.append(f"cgroup v{self.cgroup.version} ({self.memory_bytes >> 20:,} MiB, {tasks})")
        else:
            tasks = f"{self.max_processes:,} tasks by RLIMIT_NPROC" if self.uid is not None else "tasks not limited"
            parts.append(f"memory watchdog ({self.memory_bytes >> 20:,} MiB; {tasks}; no cgroup: {self.cgroup_note})")
        return ", ".join(parts)

    def release(self) -> None:
        """Stop the watchdog, remove the cgroup (killing what is left in it), free the uid (once)."""
        if self.released_reason is not None:
            return
        self.released_reason = self.killed_reason()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.uid is not None:
            self.uid.release()
