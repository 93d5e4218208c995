"""What every optimization strategy shares: the candidate edit, its checks, and the history record.

A strategy proposes a :class:`Candidate`: full new contents for files under ``fla/ops/quasar/``
(the only folder a miner may change, docs/rules.md section 1). Every candidate is checked when it is
made, whatever strategy made it: paths stay inside ``fla/ops/quasar/`` (no ``..``, no absolute
paths, no links, only source-like file types), sizes are bounded, and Python files must pass
the import validator's forbidden-import check (``quasar.imports.check_source``) before anything
is written. Applying it keeps the originals so it can be rolled back exactly.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from quasar.errors import QuasarError
from quasar.imports import QUASAR_DIR, check_source, module_name_for

ALLOWED_SUFFIXES = (".py", ".json", ".cu", ".cuh", ".cpp", ".h", ".hpp")
MAX_FILE_BYTES = 1 << 20
MAX_FILES = 16
MAX_DESCRIPTION = 200
_PATH_CHARACTERS = re.compile(r"[A-Za-z0-9_.\-/]+")

# Outcomes of an attempt.
KEPT = "kept"  # passed and faster: committed
SLOWER = "slower"  # passed, not faster by the minimum improvement: rolled back
FAILED = "failed"  # the evaluation failed it (import check, correctness, crash): rolled back
REJECTED = "rejected"  # refused before evaluation (rules of an edit)
ERROR = "error"  # the strategy could not propose (unreachable endpoint, unusable reply)
OUTCOMES = (KEPT, SLOWER, FAILED, REJECTED, ERROR)
# Write failures of the disk, not of an edit (a full or read-only disk): the cycle fails, the edit is tried later.
HOST_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


class StrategyError(QuasarError):
    """A strategy could not make a candidate this time (the message says why)."""


class EditRejected(StrategyError):
    """An edit breaks the rules for candidates; the message names the file and the rule."""


def printable_line(text: str) -> str:
    """``text`` as one line of printable characters: what an agent wrote reaches logs, terminals and
    commit messages, where escape sequences and direction overrides would act; they become spaces."""
    return " ".join("".join(char if char.isprintable() else " " for char in text).split())


def check_edit_path(path: str) -> str:
    """The repo-relative POSIX ``path`` if a candidate may write it, else :class:`EditRejected`."""
    if not isinstance(path, str) or not path:
        raise EditRejected(f"edit path {path!r}: expected a relative path under {QUASAR_DIR}/")
    if len(path) > 200 or not _PATH_CHARACTERS.fullmatch(path):
        raise EditRejected(f"edit path {path[:80]!r}: only letters, digits, '_', '.', '-' and '/' are allowed")
    parts = PurePosixPath(path).parts
    if path.startswith("/") or any(part in (".", "..") for part in path.split("/")) or "" in path.split("/"):
        raise EditRejected(f"edit path {path!r}: must be a plain relative path (no '..', '.', '//' or leading '/')")
    if parts[:3] != tuple(QUASAR_DIR.split("/")) or len(parts) < 4:
        raise EditRejected(f"edit path {path!r} is outside {QUASAR_DIR}/: a miner may change only the QUASAR kernels")
    if "__pycache__" in parts:
        raise EditRejected(f"edit path {path!r}: bytecode caches are not sources")
    if not path.endswith(ALLOWED_SUFFIXES):
        raise EditRejected(f"edit path {path!r}: file type not allowed (allowed: {', '.join(ALLOWED_SUFFIXES)})")
    return path


def check_changes(changes: Mapping[str, str | None]) -> dict[str, str | None]:
    """Check every path and content of an edit; raises :class:`EditRejected` naming the first problem.

    A content of None deletes the file. Python sources must parse and import nothing forbidden.
    """
    if not changes:
        raise EditRejected("the edit changes no file")
    if len(changes) > MAX_FILES:
        raise EditRejected(f"the edit changes {len(changes)} files; at most {MAX_FILES} are allowed")
    checked: dict[str, str | None] = {}
    for path, content in sorted(changes.items()):
        path = check_edit_path(path)
        if content is not None:
            if not isinstance(content, str):
                raise EditRejected(f"{path}: new content must be text")
            if "\0" in content:
                raise EditRejected(f"{path}: new content contains a NUL character")
            try:
                encoded = content.encode("utf-8")
            except UnicodeEncodeError:
                raise EditRejected(f"{path}: new content is not UTF-8 text (a lone surrogate)") from None
            if len(encoded) > MAX_FILE_BYTES:
                raise EditRejected(f"{path}: new content is larger than {MAX_FILE_BYTES >> 10} KiB")
            if path.endswith(".py"):
                findings = check_source(content, module_name_for(path), path)
                if findings:
                    shown = "; ".join(str(finding) for finding in findings[:3])
                    raise EditRejected(f"import check: {shown}")
        checked[path] = content
    return checked


def changes_digest(changes: Mapping[str, str | None]) -> str:
    """sha256 over an edit's paths and contents (what makes two edits the same)."""
    digest = hashlib.sha256()
    for path, content in sorted(changes.items()):
        digest.update(path.encode() + b"\0")
        digest.update(b"-" if content is None else b"+" + content.encode("utf-8", errors="replace"))
        digest.update(b"\0")
    return digest.hexdigest()


def _check_inside(repo: Path, path: str) -> Path:
    """``repo / path`` after checking no existing component on the way is a link or a non-folder."""
    current = repo
    for part in PurePosixPath(path).parts[:-1]:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise EditRejected(f"{path}: {current.relative_to(repo)} is a link or a file, not a folder")
    target = current / PurePosixPath(path).name
    if target.is_symlink():
        raise EditRejected(f"{path} is a symbolic link; candidates replace regular files only")
    if target.exists() and not target.is_file():
        raise EditRejected(f"{path} exists and is not a regular file")
    return target


@dataclass(frozen=True)
class Candidate:
    """An edit to try: ``changes`` maps paths under fla/ops/quasar/ to new contents (None deletes).

    ``key`` identifies what is tried (the same key is never evaluated twice); ``description``
    says in one line what the edit does. The edit is checked when the candidate is made.
    """

    strategy: str
    description: str
    changes: Mapping[str, str | None]
    key: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "changes", check_changes(self.changes))
        line = printable_line(self.description)[:MAX_DESCRIPTION] or "(no description)"
        object.__setattr__(self, "description", line)
        if not self.key:
            object.__setattr__(self, "key", f"{self.strategy}:{changes_digest(self.changes)}")

    @property
    def paths(self) -> list[str]:
        return sorted(self.changes)

    def apply(self, repo: Path) -> AppliedEdit:
        """Write the edit into the checkout at ``repo``; the result can roll it back. A file it cannot
        write is :class:`EditRejected`, unless the disk failed (:data:`HOST_ERRNOS`): that OSError
        is raised as it is."""
        repo = Path(repo)
        targets = {path: _check_inside(repo, path) for path in self.changes}
        originals = {path: target.read_bytes() if target.exists() else None for path, target in targets.items()}
        applied = AppliedEdit(repo, originals)
        try:
            for path, content in self.changes.items():
                target = targets[path]
                if content is None:
                    if target.exists():
                        target.unlink()
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content, encoding="utf-8")
        except OSError as error:
            applied.rollback()
            if error.errno in HOST_ERRNOS:
                raise  # the host's failure, not the edit's: rejected, it would never be tried again
            raise EditRejected(f"cannot write the edit: {error}") from None
        return applied


@dataclass
class AppliedEdit:
    """An edit written into a checkout, with the files as they were before it."""

    repo: Path
    originals: dict[str, bytes | None]

    def rollback(self) -> None:
        """Put every file the edit touched back as it was (deleting files it created)."""
        for path, content in self.originals.items():
            target = self.repo / path
            if content is None:
                if target.exists() or target.is_symlink():
                    target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)


@dataclass(frozen=True)
class Attempt:
    """One candidate tried (or a strategy's failure to propose one), as the history remembers it."""

    strategy: str
    key: str
    description: str
    outcome: str
    target_seq_len: int | None = None
    measured_tokens_per_sec: float | None = None
    best_tokens_per_sec: float | None = None
    reason: str = ""
    commit: str | None = None
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Attempt:
        """Rebuild from :meth:`to_dict`; raises ValueError naming a bad field."""
        if not isinstance(data, Mapping):
            raise ValueError("an attempt must be an object")
        strings = ("strategy", "key", "description", "outcome", "reason")
        for name in strings:
            if not isinstance(data.get(name, ""), str):
                raise ValueError(f"attempt field {name!r} must be a string")
        if data.get("outcome") not in OUTCOMES:
            raise ValueError(f"attempt field 'outcome' must be one of {', '.join(OUTCOMES)}")
        for name in ("measured_tokens_per_sec", "best_tokens_per_sec", "at"):
            value = data.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"attempt field {name!r} must be a number")
        target = data.get("target_seq_len")
        if target is not None and (isinstance(target, bool) or not isinstance(target, int)):
            raise ValueError("attempt field 'target_seq_len' must be an integer")
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


class Strategy(Protocol):
    """Something that proposes candidates for the fork checked out at ``repo_path``.

    ``propose`` returns None when it has nothing left to try (the loop then asks the other
    strategies), and raises :class:`StrategyError` when it failed this time (the loop records
    that and goes on; any other exception is recorded too, logged with its traceback, and the
    strategy sits out the rest of the cycle). The checkout is clean at the best commit whenever ``propose`` is called.
    """

    name: str

    def propose(self, repo_path: Path, history: Sequence[Attempt]) -> Candidate | None: ...
