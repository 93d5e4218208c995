"""The miner's workspace: one folder per hotkey, and the clone of its fork inside it.

Layout, under ``WORKSPACE_ROOT``::

    <hotkey ss58>/
        miner.lock     held (flock) while a miner runs with this hotkey; holds its pid
        fork/          the clone of the miner's fork; the miner edits, commits and pushes here
        state.json     what the miner must remember across restarts (state.py)
        askpass.sh     git's credential helper (no secret in it; github.py)
        reports/       the last evaluation reports, as JSON (quasar evaluate renders them)

Two miners with different hotkeys never share a file; a second miner with the same hotkey
refuses to start, and so does one whose fork another hotkey's running miner uses (one GitHub
account has one fork of the upstream: their pushes to its branch would refuse each other's).
Between candidates the clone is always clean at its branch's head: a
candidate is applied, evaluated and then either committed or rolled back, and a crash in
between is repaired at the next start (:meth:`ForkClone.restore_clean`), as are the lock files
of a git command killed mid-way.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from quasar.errors import QuasarError
from quasar.imports import QUASAR_DIR
from quasar.lock_files import lock_for_this_process, lock_refusal
from quasar.miner.github import Git

logger = logging.getLogger(__name__)

HOTKEY_PATTERN = re.compile(r"[1-9A-HJ-NP-Za-km-z]{40,60}")


class WorkspaceError(QuasarError, RuntimeError):
    """The workspace cannot be used; the message says why and what to do."""


class WorkspaceLocked(WorkspaceError):
    """Another miner process runs with the same hotkey."""


class Workspace:
    """The folder of one hotkey under ``root``; :meth:`acquire` before using it."""

    def __init__(self, root: str | os.PathLike, hotkey: str):
        if not HOTKEY_PATTERN.fullmatch(hotkey):
            raise WorkspaceError(f"hotkey {hotkey!r} is not an ss58 address")
        self.hotkey = hotkey
        self.root = Path(os.path.expanduser(os.fspath(root))).absolute()
        self.path = self.root / hotkey
        self.fork = self.path / "fork"
        self.state_file = self.path / "state.json"
        self.lock_file = self.path / "miner.lock"
        self.askpass = self.path / "askpass.sh"
        self.reports = self.path / "reports"
        self._lock_fd: int | None = None

    def acquire(self) -> None:
        """Create the folder and take its lock; :class:`WorkspaceLocked` if another miner holds it."""
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as error:
            raise WorkspaceError(
                lock_refusal(error, f"the workspace {self.path}", *_LOCK_FILE_OWNER, doing="create")
            ) from None
        try:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as error:  # an earlier start's workspace on a disk now read-only, another user's
            raise WorkspaceError(lock_refusal(error, str(self.lock_file), *_LOCK_FILE_OWNER, doing="open")) from None
        try:
            holder = lock_for_this_process(fd)
            if holder is not None:
                os.close(fd)
                raise WorkspaceLocked(
                    f"another miner with hotkey {self.hotkey} is running (pid {holder}) and holds "
                    f"{self.lock_file}; two miners with one hotkey would overwrite each other's "
                    "fork and submissions, so this one stops"
                )
            self.reports.mkdir(exist_ok=True)
        except OSError as error:  # a full disk, a file system that cannot lock (NFS)
            os.close(fd)
            where = f"{error.filename or self.lock_file} in the workspace"
            raise WorkspaceError(lock_refusal(error, where, *_LOCK_FILE_OWNER)) from None
        self._lock_fd = fd

    def live_miner_on_fork(self, fork_url: str) -> str | None:
        """The hotkey of another miner running now under the same root whose saved state names
        ``fork_url`` (both would push to one branch: the second one's pushes are refused), else None.
        Whether it runs is read from the kernel's list of locks, not by locking its file, which
        would make that miner's own start, at that instant, find its lock taken."""
        held = _flock_holders()
        for lock_file in self.root.glob("*/miner.lock"):
            other = lock_file.parent
            if other == self.path or not HOTKEY_PATTERN.fullmatch(other.name):
                continue
            try:
                status = lock_file.stat()
                saved = json.loads((other / "state.json").read_text()).get("fork_url")
            except (OSError, ValueError, AttributeError):  # not yet saved, another user's, not a state
                continue
            if saved == fork_url and (os.major(status.st_dev), os.minor(status.st_dev), status.st_ino) in held:
                return other.name
        return None

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Workspace:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


# Who the workspace refuses, and the setting of its folder (quasar/lock_files.py's cures).
_LOCK_FILE_OWNER = ("this miner", "WORKSPACE_ROOT")


def _flock_holders() -> set[tuple[int, int, int]]:
    """(major, minor, inode) of every file some process holds an ``flock`` on; empty where the
    kernel's list cannot be read."""
    held: set[tuple[int, int, int]] = set()
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return held
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK":
            major, minor, inode = fields[5].split(":")
            held.add((int(major, 16), int(minor, 16), int(inode)))
    return held


class ForkClone:
    """The clone of the fork at ``remote_url`` in ``path``, working on ``branch``."""

    def __init__(self, path: Path, git: Git, remote_url: str, branch: str):
        self.path = path
        self.git = git
        self.remote_url = remote_url
        self.branch = branch

    def sync(self) -> str:
        """Clone the fork when missing; otherwise repair a half-applied candidate, fetch, and take
        commits pushed to the fork from elsewhere when the workspace has none of its own. Returns HEAD."""
        if not (self.path / ".git").is_dir():
            self._clone()
            return self.head()
        self._remove_stale_locks()
        current = self.git.run("remote", "get-url", "origin", cwd=self.path, check=False).stdout.strip()
        if current != self.remote_url:
            logger.warning("the workspace's remote was %s; switching it to %s", current or "(none)", self.remote_url)
            self.git.run("remote", "remove", "origin", cwd=self.path, check=False)
            self.git.run("remote", "add", "origin", self.remote_url, cwd=self.path)
        self.restore_clean()
        if (
            self.git.run("symbolic-ref", "--quiet", "--short", "HEAD", cwd=self.path, check=False).stdout.strip()
            != self.branch
        ):
            self.git.run("checkout", "--quiet", self.branch, cwd=self.path)
        self.fetch()
        self._take_remote_commits()
        return self.head()

    def _remove_stale_locks(self) -> None:
        """Remove the index's and refs' lock files a git command killed mid-way left (pm2's tree
        kill, the OOM killer): git refuses to write the index or a ref while its lock exists, so
        the miner could never sync or commit again. None of them is live here: the workspace lock
        keeps other miners out, and the miner runs its git commands one at a time, none while it
        syncs."""
        dot_git = self.path / ".git"
        locks = [dot_git / "index.lock", *(dot_git / "refs").rglob("*.lock")]
        stale = [path for path in locks if path.is_file()]
        for path in stale:
            path.unlink()
        if stale:
            logger.warning(
                "removed %d lock file(s) a stopped git command left in %s: %s",
                len(stale),
                dot_git,
                ", ".join(path.relative_to(dot_git).as_posix() for path in stale),
            )

    def _clone(self) -> None:
        partial = self.path.with_name(self.path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        logger.info("cloning %s (branch %s) into %s", self.remote_url, self.branch, self.path)
        self.git.run(
            "clone",
            "--quiet",
            "--branch",
            self.branch,
            "--",
            self.remote_url,
            str(partial),
            cwd=self.path.parent,
            network=True,
        )
        os.replace(partial, self.path)

    def _take_remote_commits(self) -> None:
        remote = f"origin/{self.branch}"
        if self.git.run("rev-parse", "--verify", "--quiet", remote, cwd=self.path, check=False).returncode != 0:
            return
        head = self.head()
        remote_head = self.git.output("rev-parse", remote, cwd=self.path)
        if head == remote_head or self._is_ancestor(remote_head, head):
            return
        if self._is_ancestor(head, remote_head):
            self.git.run("merge", "--quiet", "--ff-only", remote, cwd=self.path)
            logger.info("took the commits pushed to the fork's %s: now at %s", self.branch, remote_head)
        else:
            logger.warning(
                "the workspace and the fork's %s have diverged (%s here, %s there); pushes will be "
                "refused until that is resolved by hand in %s",
                self.branch,
                head[:12],
                remote_head[:12],
                self.path,
            )

    def _is_ancestor(self, older: str, newer: str) -> bool:
        return self.git.run("merge-base", "--is-ancestor", older, newer, cwd=self.path, check=False).returncode == 0

    def head(self) -> str:
        return self.git.output("rev-parse", "HEAD", cwd=self.path)

    def changed_paths(self) -> list[str]:
        """Paths that differ from HEAD (tracked changes and untracked files, ignored ones aside)."""
        status = self.git.run("status", "--porcelain=v1", "-z", "--untracked-files=all", cwd=self.path).stdout
        entries = status.split("\0")
        paths, index = [], 0
        while index < len(entries):
            entry = entries[index]
            index += 1
            if not entry:
                continue
            paths.append(entry[3:])
            if entry[0] in "RC":  # a rename's source follows as its own entry
                index += 1
        return sorted(paths)

    def restore_clean(self) -> list[str]:
        """Undo uncommitted changes under fla/ops/quasar/ (a candidate a crash left applied);
        returns the paths restored. Changes elsewhere are left alone, with a warning."""
        changed = self.changed_paths()
        ours = [p for p in changed if p.startswith(QUASAR_DIR + "/")]
        if ours:
            logger.warning("restoring %d file(s) a stopped run left changed: %s", len(ours), ", ".join(ours))
            self.git.run("reset", "--quiet", "--", QUASAR_DIR, cwd=self.path)
            self.git.run("checkout", "--quiet", "HEAD", "--", QUASAR_DIR, cwd=self.path)
            self.git.run("clean", "-f", "-d", "--quiet", "--", QUASAR_DIR, cwd=self.path)
        others = [p for p in changed if p not in ours]
        if others:
            logger.warning(
                "files outside %s differ from the last commit and are left as they are (the miner never "
                "commits them): %s",
                QUASAR_DIR,
                ", ".join(others[:10]),
            )
        return ours

    def commit(self, paths: list[str], message: str) -> str:
        """Commit exactly ``paths`` (changed, added or deleted) and return the new commit id."""
        self.git.run("add", "--all", "--", *paths, cwd=self.path)
        self.git.run("commit", "--quiet", "--no-verify", "-m", message, "--", *paths, cwd=self.path)
        return self.head()

    def fetch(self) -> None:
        self.git.run("fetch", "--quiet", "--no-tags", "origin", self.branch, cwd=self.path, network=True)

    def push(self, commit: str) -> None:
        """Make the fork's branch point at ``commit`` (a fast-forward; never forced)."""
        self.git.run("push", "--quiet", "origin", f"{commit}:refs/heads/{self.branch}", cwd=self.path, network=True)
        logger.info("pushed %s to %s (%s)", commit[:12], self.remote_url, self.branch)

    def remote_has(self, commit: str) -> bool:
        """Whether the fork's branch (as last fetched) contains ``commit``."""
        remote = f"origin/{self.branch}"
        return self._is_ancestor(commit, remote)
