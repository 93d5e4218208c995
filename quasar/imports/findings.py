"""What the import validator reports: the rules by name, one :class:`Finding` per broken rule, and
the :class:`ImportReport` of a whole fork."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Rule(StrEnum):
    """The rule a finding breaks; its value is the name printed in messages."""

    MISSING_FILE = "missing-file"
    UNREADABLE_FILE = "unreadable-file"
    SYMLINK_OUTSIDE_REPO = "symlink-outside-repo"
    SHADOWED_SOURCE = "shadowed-source"
    ENCODING = "encoding"
    SYNTAX_ERROR = "syntax-error"
    FORBIDDEN_IMPORT = "forbidden-import"
    UNVERIFIABLE_IMPORT = "unverifiable-import"
    BAD_RELATIVE_IMPORT = "bad-relative-import"
    MISSING_REQUIRED_IMPORT = "missing-required-import"
    NO_CU_FILE = "no-cu-file"


@dataclass(frozen=True)
class Finding:
    """One broken rule: repo-relative path, 1-based line (None when no line applies), rule, message."""

    path: str
    line: int | None
    rule: Rule
    message: str

    @property
    def location(self) -> str:
        """``path:line``, or the path alone when no line applies."""
        return f"{self.path}:{self.line}" if self.line else self.path

    def __str__(self) -> str:
        return f"{self.location}: {self.rule.value}: {self.message}"


@dataclass(frozen=True)
class ImportReport:
    """The result of :func:`quasar.imports.validate_repo`; ``ok`` iff there is no error."""

    errors: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    checked_files: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict:
        """The ``--json`` shape: ``{"ok": bool, "errors": [str], "warnings": [str]}``."""
        return {
            "ok": self.ok,
            "errors": [str(f) for f in self.errors],
            "warnings": [str(f) for f in self.warnings],
        }
