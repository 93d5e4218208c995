"""The repository walk and the file rules: which files a fork has, and whether Python would load
the checked source (rules ``missing-file``, ``unreadable-file``, ``encoding`` of the bytes,
``symlink-outside-repo``, ``shadowed-source``, bytecode as ``unverifiable-import``, and whether
the fork has a ``*.cu`` file).

Every read goes through :class:`ForkTree`, which never follows a link out of the repository.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from quasar.imports.findings import Finding, Rule
from quasar.imports.layout import FORBIDDEN_MODULES, QUASAR_DIR

# A source file is refused rather than parsed above this: parsing takes about 1 GB of memory and
# 5 s a MiB of a hostile file (``x=[0,0,...]``), in the validator's process; fla's largest source
# is 80 KB, the starter fork's largest kernel file 24 KB.
MAX_SOURCE_BYTES = 512 * 1024


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class ForkTree:
    """Reads a fork's files without following links out of it; collects findings on the way."""

    def __init__(self, root: Path):
        self.root = Path(os.path.realpath(root))
        self.forbidden_dirs = {
            root_module: self.root / root_module.replace(".", "/") for root_module in FORBIDDEN_MODULES
        }
        self.findings: list[Finding] = []

    def real(self, relative: str) -> Path:
        """Where ``relative`` leads once every link is followed (it may be outside the repository)."""
        return Path(os.path.realpath(self.root / relative))

    def escapes(self, relative: str) -> bool:
        """Records and returns whether ``relative`` resolves outside the repo or into gla/kda."""
        real = self.real(relative)
        if not _inside(real, self.root):
            message = "is a symlink to a path outside the repository; not followed"
            self.findings.append(Finding(relative, None, Rule.SYMLINK_OUTSIDE_REPO, message))
            return True
        for root_module, directory in self.forbidden_dirs.items():
            if _inside(real, directory):
                inside = directory.relative_to(self.root).as_posix()
                message = f"is a symlink into {inside}: forbidden import of {root_module}"
                self.findings.append(Finding(relative, None, Rule.FORBIDDEN_IMPORT, message))
                return True
        return False

    def read_source(self, relative: str) -> str | None:
        """The UTF-8 text of a file to check, or None after recording why it cannot be had."""
        path = self.root / relative
        if not os.path.lexists(path):
            self.findings.append(Finding(relative, None, Rule.MISSING_FILE, "is missing"))
            return None
        if self.escapes(relative):
            return None
        real = self.real(relative)
        if not real.is_file():
            why = "is a dangling symlink" if path.is_symlink() and not real.exists() else "is not a regular file"
            self.findings.append(Finding(relative, None, Rule.UNREADABLE_FILE, why))
            return None
        try:
            if real.stat().st_size > MAX_SOURCE_BYTES:
                message = f"is larger than {MAX_SOURCE_BYTES} bytes; not checked"
                self.findings.append(Finding(relative, None, Rule.UNREADABLE_FILE, message))
                return None
            data = real.read_bytes()
        except OSError as error:
            self.findings.append(Finding(relative, None, Rule.UNREADABLE_FILE, f"cannot be read: {error.strerror}"))
            return None
        try:
            return data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as error:
            line = data.count(b"\n", 0, error.start) + 1
            message = f"is not valid UTF-8 (byte {data[error.start]:#04x} at offset {error.start})"
            self.findings.append(Finding(relative, line, Rule.ENCODING, message))
            return None

    def locate_module(self, module: str) -> tuple[str, str | None] | None:
        """A module's path and source for the re-export index; None when the fork has no such module.
        The path is the file Python's path finder would import (:meth:`_loaded_file`); the source is
        None when it cannot be had (compiled, too large, a link out, unreadable): Python may still
        import it, so the index follows none of its names."""
        path = module.replace(".", "/")
        parent, _, stem = path.rpartition("/")
        relative = self._loaded_file(path, "__init__") or self._loaded_file(parent, stem)
        if relative is None:
            return None
        real = self.real(relative)
        try:
            if relative.endswith(".py") and _inside(real, self.root) and real.stat().st_size <= MAX_SOURCE_BYTES:
                return relative, real.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            pass
        return relative, None

    def _loaded_file(self, directory: str, stem: str) -> str | None:
        """The file Python imports for ``stem`` in ``directory``, in its path finder's order: an
        extension module, then source, then sourceless bytecode (``helpers/__init__.py`` before
        ``helpers.py`` follows from asking for the package first). Links count where they lead."""
        try:
            names = sorted(os.listdir(self.root / directory))
        except OSError:
            return None
        extension = re.compile(rf"^{re.escape(stem)}(\.[^.]+)?\.(so|pyd)$")
        candidates = [n for n in names if extension.match(n)] + [f"{stem}.py", f"{stem}.pyc"]
        for name in candidates:
            relative = f"{directory}/{name}" if directory else name
            if name in names and os.path.isfile(self.root / relative):
                return relative
        return None

    def _entries(self, directory: str) -> list[os.DirEntry]:
        """A folder's entries by name; none after recording why it cannot be listed."""
        try:
            return sorted(os.scandir(self.root / directory), key=lambda e: e.name)
        except OSError as error:
            self.findings.append(Finding(directory, None, Rule.UNREADABLE_FILE, f"cannot be listed: {error.strerror}"))
            return []

    def python_files_under(self, top: str) -> list[str]:
        """Every ``.py`` under ``top`` (links inside the repo followed once), checking bytecode on the way."""
        found: list[str] = []
        pending, seen = [top], set()
        while pending:
            directory = pending.pop()
            if not os.path.isdir(self.root / directory) or self.escapes(directory):
                continue
            real = self.real(directory)
            if real in seen:
                continue
            seen.add(real)
            for entry in self._entries(directory):
                relative = f"{directory}/{entry.name}"
                if entry.name == "__pycache__":
                    self.check_bytecode_cache(relative)
                elif entry.is_dir():
                    pending.append(relative)
                elif entry.name.endswith(".py"):
                    found.append(relative)
                elif entry.name.endswith((".pyc", ".pyo")):
                    message = "is compiled bytecode Python can import without its source; not verifiable"
                    self.findings.append(Finding(relative, None, Rule.UNVERIFIABLE_IMPORT, message))
        return sorted(found)

    def check_bytecode_cache(self, directory: str, stem: str = "") -> None:
        """Unchecked-hash ``.pyc`` files in a ``__pycache__``: Python runs them whatever the source says."""
        if not os.path.isdir(self.root / directory) or self.escapes(directory):
            return
        for entry in self._entries(directory):
            if not entry.name.endswith(".pyc") or not entry.name.startswith(stem):
                continue
            relative = f"{directory}/{entry.name}"
            if self.escapes(relative):
                continue
            try:
                with open(self.real(relative), "rb") as handle:
                    header = handle.read(16)
            except OSError:
                continue
            # PEP 552: bit 0 says hash-based, bit 1 says check the source; hash-based and unchecked is the danger.
            flags = int.from_bytes(header[4:8], "little") if len(header) >= 8 else 0
            if flags & 0b01 and not flags & 0b10:
                message = "is an unchecked-hash .pyc: Python runs it instead of the source; not verifiable"
                self.findings.append(Finding(relative, None, Rule.UNVERIFIABLE_IMPORT, message))

    def check_shadowing(self, relative: str) -> None:
        """A package folder or an extension module that Python would import instead of ``relative``."""
        directory, _, filename = relative.rpartition("/")
        stem = filename.removesuffix(".py")
        try:
            siblings = os.listdir(self.root / directory)
        except OSError:
            return
        package = self.root / directory / stem
        try:
            is_package = package.is_dir() and any(n.startswith("__init__.") for n in os.listdir(package))
        except OSError:
            is_package = False
        if is_package:
            message = f"is shadowed by the package {directory}/{stem}/, which Python imports instead"
            self.findings.append(Finding(relative, None, Rule.SHADOWED_SOURCE, message))
        extension = re.compile(rf"^{re.escape(stem)}(\.[^.]+)?\.(so|pyd)$")
        for sibling in sorted(siblings):
            if extension.match(sibling):
                message = f"is shadowed by the extension module {directory}/{sibling}, which Python imports instead"
                self.findings.append(Finding(relative, None, Rule.SHADOWED_SOURCE, message))

    def check_namespace_shadowing(self) -> None:
        """Without ``__init__.py``, ``fla/ops/quasar/`` is a namespace package a ``quasar`` module beats."""
        ops = self.root / "fla/ops"
        if (self.root / QUASAR_DIR / "__init__.py").exists() or not ops.is_dir():
            return
        try:
            siblings = sorted(os.listdir(ops))
        except OSError:
            return
        for sibling in siblings:
            if re.match(r"^quasar(\.[^.]+)?\.(py|so|pyd|pyc)$", sibling):
                message = f"has no __init__.py, so fla/ops/{sibling} is imported instead of it"
                self.findings.append(Finding(QUASAR_DIR, None, Rule.SHADOWED_SOURCE, message))

    def has_cu_file(self) -> bool:
        """Whether a ``*.cu`` file lies in the repository, ``.git`` aside (a link counts if it stays inside)."""
        for directory, subdirectories, files in os.walk(self.root):
            subdirectories[:] = [d for d in subdirectories if d != ".git"]
            for name in files:
                if name.endswith(".cu"):
                    real = Path(os.path.realpath(os.path.join(directory, name)))
                    if _inside(real, self.root) and real.is_file():
                        return True
        return False
