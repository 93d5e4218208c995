"""Import validation of a QUASAR fork (docs/rules.md section 4 step 2), by parsing, never by substring.

``python -m quasar.imports REPO [--profile core|strict] [--require-cu] [--json]`` checks a fork
checked out at REPO; exit status 0 iff it passes, 1 if not, 2 for a usage error. Every message
names the file, the line where there is one, and the rule.

What is checked:

* Files (rules ``missing-file``, ``unreadable-file``, ``encoding``, ``syntax-error``,
  ``symlink-outside-repo``, ``shadowed-source``). The five targets ``fla/ops/quasar/{chunk,
  chunk_intra_token_parallel, forward_substitution, fused_recurrent, gate}.py`` and
  ``fla/layers/quasar.py`` must exist, be UTF-8 (a PEP 263 cookie naming another encoding is
  refused: ``utf-7`` can hide code in what reads as a comment) and parse. Every other ``*.py``
  under ``fla/ops/quasar/`` is checked too, sub-folders included. A symlink leaving the repository
  is reported and never read; one into ``fla/ops/gla`` or ``fla/ops/kda`` is a forbidden import.
  What Python would load instead of the checked source is an error: a package folder or an
  extension module (``chunk*.so``) beside a checked ``.py``, ``*.pyc`` outside ``__pycache__``
  and unchecked-hash ``.pyc`` files inside it.
* Forbidden imports (``forbidden-import``), anywhere in those files, functions, classes and
  ``if TYPE_CHECKING:`` blocks included: whatever loads or names ``fla.ops.gla``, ``fla.ops.kda``
  or a module below them: ``import``, ``import … as``, ``from … import``, ``from fla.ops import
  kda``, relative forms (resolved against the file's own module; going above ``fla`` is a
  ``bad-relative-import``), attribute paths through imported names (``import fla.ops`` then
  ``fla.ops.kda``), ``getattr`` with a constant name, ``sys.modules`` with a constant key, names
  that another module of the fork binds from them, followed through the fork's own files
  (``from fla.ops import chunk_kda`` when ``fla/ops/__init__.py`` imports it from ``.kda``, and
  then ``from fla.ops import *`` too), and the dynamic importers
  (``importlib.import_module``, ``__import__``, ``importlib.__import__``, ``builtins.__import__``,
  ``importlib.util.find_spec``, ``runpy.run_module``, and the file loaders
  ``importlib.util.spec_from_file_location``, ``importlib.machinery.*FileLoader``,
  ``runpy.run_path``) whose arguments fold to constants: literals, ``+`` of literals, f-strings
  of literals, ``"sep".join([literals])``, and for paths ``__file__`` with ``os.path`` /
  ``pathlib`` joins. Aliases are followed (``from importlib import import_module as im``,
  ``im = importlib.import_module``).
* Code that cannot be verified (``unverifiable-import``), an error as well: a dynamic import
  whose target does not fold to a constant; ``exec``/``eval``/``compile`` and other ways to run
  code built at run time (``marshal``, ``pickle``, ``types.FunctionType``, ``ctypes.pythonapi``);
  other calls into the import machinery (``importlib``, ``imp``, ``pkgutil``, ``runpy``,
  ``zipimport``) outside a short list of harmless ones; an importer or ``getattr`` used other than
  by calling it (``map(__import__, names)``); changes to ``sys.path``, ``sys.meta_path``,
  ``sys.path_hooks``, ``sys.modules`` or ``builtins``; ``getattr`` with a computed name on
  ``fla``, ``fla.ops``, ``builtins``, ``sys`` or ``importlib``; those modules, ``sys.modules``
  or ``globals()`` passed on to code whose use of them cannot be followed; introspection that
  reaches interpreter internals (``__subclasses__``, ``__globals__``, ``f_globals`` …).
  Comments, strings and docstrings are text, never imports.
* Required imports (``missing-required-import``, profile ``core`` by default or ``strict``):
  ``chunk.py`` imports every name of the profile at module level. Module level means a statement
  of the module body, also inside a module-level ``if`` (not under ``if TYPE_CHECKING:`` or a
  constant false test), ``with``, or the body, ``else`` or ``finally`` of a ``try`` (not its
  ``except`` handlers, which run only when the import failed). Inside a function or class does
  not count. Combined lines, aliases and relative forms count; ``from fla.utils import *`` does
  not. ``import torch.nn.functional as F`` is met by importing that module under any name, also
  as ``from torch.nn import functional``.
* At least one ``*.cu`` file in the repository, ``.git`` aside (``no-cu-file``): a warning, an
  error with ``require_cu``.

Names are followed without regard to scope or order: a name bound anywhere in a file to a
forbidden module or to the import machinery counts everywhere in that file. Only the files above
are checked; the rest of the fork (upstream's ``fla/ops/__init__.py`` imports gla and kda itself)
is read only to follow re-exports. This is a rule on source text, not a sandbox: Python is too
dynamic for any static check to be complete, so what this module cannot follow it refuses. The
fork still runs only in the validator's sandbox, where the correctness check catches wrong kernels.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import logging
import os
import posixpath
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath

from rich.console import Console
from rich.table import Table
from rich.text import Text

logger = logging.getLogger(__name__)

QUASAR_DIR = "fla/ops/quasar"
TARGET_FILES = (
    "chunk.py",
    "chunk_intra_token_parallel.py",
    "forward_substitution.py",
    "fused_recurrent.py",
    "gate.py",
)
CHUNK_FILE = f"{QUASAR_DIR}/chunk.py"
LAYER_FILE = "fla/layers/quasar.py"
FORBIDDEN_MODULES = ("fla.ops.gla", "fla.ops.kda")
# A kernel source file is a few hundred KB at most; larger ones are refused rather than parsed.
MAX_SOURCE_BYTES = 4 * 1024 * 1024


class Rule(str, Enum):
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
        return f"{self.path}:{self.line}" if self.line else self.path

    def __str__(self) -> str:
        return f"{self.location}: {self.rule.value}: {self.message}"


@dataclass(frozen=True)
class ImportReport:
    """The result of :func:`validate_repo`; ``ok`` iff there is no error."""

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


@dataclass(frozen=True)
class RequiredImport:
    """``import module`` (``name`` None) or ``from module import name``; ``alias`` is only how the guide writes it."""

    module: str
    name: str | None = None
    alias: str | None = None

    def __str__(self) -> str:
        text = f"import {self.module}" if self.name is None else f"from {self.module} import {self.name}"
        return f"{text} as {self.alias}" if self.alias else text


_FLA_UTILS_CORE = (
    "autocast_custom_bwd",
    "autocast_custom_fwd",
    "autotune_cache_kwargs",
    "check_shared_mem",
    "input_guard",
)
PROFILES: dict[str, tuple[RequiredImport, ...]] = {
    "core": tuple(RequiredImport("fla.utils", name) for name in _FLA_UTILS_CORE),
    # The twelve lines of the miner guide, in its order.
    "strict": (
        RequiredImport("torch"),
        RequiredImport("torch.nn.functional", alias="F"),
        RequiredImport("triton"),
        RequiredImport("triton.language", alias="tl"),
        RequiredImport("fla.ops.utils.index", "prepare_chunk_indices"),
        RequiredImport("fla.ops.quasar.forward_substitution", "forward_substitution_kernel"),
        RequiredImport("fla.utils", "IS_AMD"),
        *(RequiredImport("fla.utils", name) for name in _FLA_UTILS_CORE),
    ),
}

# --- module names ---------------------------------------------------------------------------


def module_name_for(relative_path: str) -> str:
    """The dotted module of a repo-relative ``.py`` path: ``fla/ops/quasar/__init__.py`` is ``fla.ops.quasar``."""
    parts = list(PurePosixPath(relative_path).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve_relative(module: str | None, level: int, current_module: str, is_package: bool) -> str | None:
    """The absolute module of ``from {'.' * level}{module} import …`` written in ``current_module``.

    None when the import climbs above the top-level package (Python raises ImportError there).
    """
    if level == 0:
        return module or ""
    package = current_module.split(".") if is_package else current_module.split(".")[:-1]
    keep = len(package) - (level - 1)
    if keep < 1:
        return None
    parts = package[:keep] + (module.split(".") if module else [])
    return ".".join(parts)


def _forbidden_root(dotted: str) -> str | None:
    for root in FORBIDDEN_MODULES:
        if dotted == root or dotted.startswith(root + "."):
            return root
    return None


# --- constant folding -------------------------------------------------------------------------


def _fold_str(node: ast.AST | None) -> str | None:
    """The string an expression always evaluates to, when it is built only from string literals."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif (
                isinstance(value, ast.FormattedValue)
                and value.format_spec is None
                and value.conversion in (-1, ord("s"))
                and (inner := _fold_str(value.value)) is not None
            ):
                parts.append(inner)
            else:
                return None
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold_str(node.left), _fold_str(node.right)
        return None if left is None or right is None else left + right
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and len(node.args) == 1
        and not node.keywords
        and isinstance(node.args[0], (ast.List, ast.Tuple))
    ):
        separator = _fold_str(node.func.value)
        items = [_fold_str(element) for element in node.args[0].elts]
        if separator is None or any(item is None for item in items):
            return None
        return separator.join(items)  # type: ignore[arg-type]
    return None


def _fold_str_list(node: ast.AST | None) -> list[str] | None:
    """A list/tuple of foldable strings; ``None`` (the constant) and a missing argument are ``[]``."""
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return []
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_fold_str(element) for element in node.elts]
        return None if any(item is None for item in items) else items  # type: ignore[return-value]
    return None


def _fold_int(node: ast.AST | None, default: int) -> int | None:
    if node is None:
        return default
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


# --- what names mean ----------------------------------------------------------------------------

_BUILTIN_NAMES = frozenset(dir(builtins))
_GLOBALS = "<globals>"  # what globals(), locals() and vars() without arguments resolve to

# Modules whose attributes lead to forbidden modules or to the import system.
_SENSITIVE_MODULES = frozenset(
    {"fla", "fla.ops", "builtins", "sys", "importlib", "importlib.util", "importlib.machinery"}
)
# Mappings and lists that hold or steer imports; reading them with a constant key is fine.
_STATE_OBJECTS = frozenset(
    {"sys.modules", "sys.path", "sys.meta_path", "sys.path_hooks", "sys.path_importer_cache", _GLOBALS}
    | {f"{module}.__dict__" for module in _SENSITIVE_MODULES}
)
_READ_ONLY_STATE_ATTRS = frozenset({"get", "keys", "__contains__", "index", "count"})

_CODE_RUNNERS = frozenset(
    {
        "builtins.exec",
        "builtins.eval",
        "builtins.compile",
        "marshal.load",
        "marshal.loads",
        "pickle.load",
        "pickle.loads",
        "pickle.Unpickler",
        "types.FunctionType",
        "types.LambdaType",
        "types.CodeType",
    }
)
_CODE_RUNNER_PREFIXES = ("code", "codeop", "ctypes.pythonapi")

# Importers taking a module name: their parameters, by position.
_MODULE_IMPORTERS = {
    "importlib.import_module": ("name", "package"),
    "importlib.util.find_spec": ("name", "package"),
    "builtins.__import__": ("name", "globals", "locals", "fromlist", "level"),
    "importlib.__import__": ("name", "globals", "locals", "fromlist", "level"),
    "runpy.run_module": ("mod_name", "init_globals", "run_name", "alter_sys"),
}
# Loaders taking a file path: their parameters, by position; the path is the one in _PATH_PARAMS.
_PATH_LOADERS = {
    "importlib.util.spec_from_file_location": ("name", "location"),
    "importlib.machinery.SourceFileLoader": ("fullname", "path"),
    "importlib.machinery.SourcelessFileLoader": ("fullname", "path"),
    "importlib.machinery.ExtensionFileLoader": ("fullname", "path"),
    "runpy.run_path": ("path_name", "init_globals", "run_name"),
}
_PATH_PARAMS = ("location", "path", "path_name")
_GETATTR_LIKE = frozenset(
    {
        "builtins.getattr",
        "builtins.setattr",
        "builtins.delattr",
        "builtins.object.__getattribute__",
        "builtins.type.__getattribute__",
        "operator.attrgetter",
        "operator.methodcaller",
    }
)
_MACHINERY_MODULES = ("importlib", "imp", "pkgutil", "runpy", "zipimport")
_HARMLESS_MACHINERY = (
    "importlib.metadata",
    "importlib.resources",
    "importlib.reload",
    "importlib.invalidate_caches",
    "importlib.util.module_from_spec",
    "importlib.util.resolve_name",
    "pkgutil.iter_modules",
    "pkgutil.get_data",
)
# Attributes that reach interpreter internals, from which any module can be loaded.
_INTROSPECTION_ATTRS = frozenset(
    {"__subclasses__", "__globals__", "__builtins__", "__loader__", "f_globals", "f_builtins", "f_locals"}
)
# Roots of dotted names worth remembering through assignments (besides this file's imports).
_SENSITIVE_ROOTS = frozenset(
    {"fla", "builtins", "sys", "site", "operator", "marshal", "pickle", "types", "code", "codeop", "ctypes", _GLOBALS}
    | set(_MACHINERY_MODULES)
)
_MAX_ALIAS_ENTRIES = 20_000
_MAX_ALIAS_PASSES = 10


def _has_prefix(dotted: str, prefix: str) -> bool:
    return dotted == prefix or dotted.startswith(prefix + ".")


def _kind(dotted: str) -> str | None:
    """How a resolved name matters: a sensitive object, or the kind of call it makes; None if harmless."""
    if dotted in _SENSITIVE_MODULES:
        return "module"
    if dotted in _STATE_OBJECTS:
        return "state"
    if dotted in _CODE_RUNNERS or any(_has_prefix(dotted, p) for p in _CODE_RUNNER_PREFIXES):
        return "code"
    if dotted in _MODULE_IMPORTERS:
        return "module-importer"
    if dotted in _PATH_LOADERS:
        return "path-loader"
    if dotted in _GETATTR_LIKE:
        return "getattr"
    for state in _STATE_OBJECTS:
        if dotted.startswith(state + "."):
            attribute = dotted[len(state) + 1 :]
            return None if attribute in _READ_ONLY_STATE_ATTRS else "import-state"
    if dotted == "site.addsitedir":
        return "import-state"
    if any(_has_prefix(dotted, p) for p in _HARMLESS_MACHINERY):
        return None
    if any(_has_prefix(dotted, p) for p in _MACHINERY_MODULES):
        return "machinery"
    return None


# --- names other modules of the fork bind from gla/kda ----------------------------------------------


@dataclass
class _ModuleBindings:
    imported: dict[str, str]  # module-level name -> the dotted thing it is bound to
    defined: set[str]  # module-level names bound by def, class or assignment
    star_from: list[str]  # modules star-imported at module level


class ReexportIndex:
    """Finds names that a module of the fork binds from ``fla.ops.gla``/``fla.ops.kda``.

    ``locate(module)`` returns ``(repo-relative path, source text)`` of a module of the fork, or
    None when it has no such module. ``root_of("fla.ops.chunk_kda")`` is ``"fla.ops.kda"`` when
    ``fla/ops/__init__.py`` imports ``chunk_kda`` from ``.kda``; chains of re-exports are followed.
    """

    _MAX_DEPTH = 16

    def __init__(self, locate: Callable[[str], tuple[str, str] | None]):
        self._locate = locate
        self._bindings: dict[str, _ModuleBindings | None] = {}
        self._roots: dict[str, str | None] = {}

    @classmethod
    def from_files(cls, files: dict[str, str]) -> ReexportIndex:
        """An index over in-memory files, ``{"fla/ops/__init__.py": "from .kda import chunk_kda"}``."""

        def locate(module: str) -> tuple[str, str] | None:
            for path in _module_paths(module):
                if path in files:
                    return path, files[path]
            return None

        return cls(locate)

    def root_of(self, dotted: str, depth: int = 0) -> str | None:
        """The forbidden module ``dotted`` comes from, directly or through re-exports; else None."""
        direct = _forbidden_root(dotted)
        if direct or depth > self._MAX_DEPTH or not _has_prefix(dotted, "fla"):
            return direct
        if dotted not in self._roots:
            self._roots[dotted] = None  # guards against import cycles
            self._roots[dotted] = self._lookup(dotted, depth)
        return self._roots[dotted]

    def star_root(self, module: str, depth: int = 0) -> str | None:
        """The forbidden module whose names ``from module import *`` may bind, if any (conservative:
        every name the module binds by import counts, ``__all__`` or not)."""
        direct = _forbidden_root(module)
        bindings = self._module_bindings(module) if not direct and depth <= self._MAX_DEPTH else None
        if direct or bindings is None:
            return direct
        for target in bindings.imported.values():
            if root := self.root_of(target, depth + 1):
                return root
        for source in bindings.star_from:
            if root := self.star_root(source, depth + 1):
                return root
        return None

    def _lookup(self, dotted: str, depth: int) -> str | None:
        if self._locate(dotted) is not None:
            return None  # a module of the fork other than gla/kda
        parts = dotted.split(".")
        for split in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:split])
            bindings = self._module_bindings(module)
            if bindings is None:
                continue
            name, rest = parts[split], parts[split + 1 :]
            if name in bindings.imported:
                return self.root_of(".".join([bindings.imported[name], *rest]), depth + 1)
            if name in bindings.defined:
                return None
            for source in bindings.star_from:
                root = _forbidden_root(source) or self.root_of(".".join([source, name, *rest]), depth + 1)
                if root:
                    return root
            return None
        return None

    def _module_bindings(self, module: str) -> _ModuleBindings | None:
        if module not in self._bindings:
            self._bindings[module] = self._parse_bindings(module)
        return self._bindings[module]

    def _parse_bindings(self, module: str) -> _ModuleBindings | None:
        located = self._locate(module)
        if located is None:
            return None
        path, source = located
        try:
            tree = _parse_ast(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        is_package = path.endswith("/__init__.py")
        bindings = _ModuleBindings({}, set(), [])
        for statement in _module_level_statements(tree.body):
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.asname:
                        bindings.imported[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        bindings.imported[top] = top
            elif isinstance(statement, ast.ImportFrom):
                base = resolve_relative(statement.module, statement.level, module, is_package)
                if base is None:
                    continue
                for alias in statement.names:
                    if alias.name == "*":
                        bindings.star_from.append(base)
                    else:
                        bindings.imported[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bindings.defined.add(statement.name)
            elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                value = _dotted_path(statement.value) if statement.value is not None else None
                for target in targets:
                    if isinstance(target, ast.Name):
                        if value and value.split(".")[0] in bindings.imported:
                            head, _, tail = value.partition(".")
                            bindings.imported[target.id] = ".".join(filter(None, [bindings.imported[head], tail]))
                        else:
                            bindings.defined.add(target.id)
        return bindings


def _module_paths(module: str) -> list[str]:
    """Where a module's source lies, repo-relative: ``a/b.py`` or ``a/b/__init__.py``."""
    path = module.replace(".", "/")
    return [f"{path}.py", f"{path}/__init__.py"]


def _dotted_path(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_path(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _never_runs(test: ast.expr) -> bool:
    """Tests whose body never runs: ``if TYPE_CHECKING:``, ``if typing.TYPE_CHECKING:``, ``if False:``."""
    if isinstance(test, ast.Constant):
        return not test.value
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _module_level_statements(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run when the module is imported, as documented in the module docstring."""
    try_types = (ast.Try, getattr(ast, "TryStar", ast.Try))
    for statement in body:
        yield statement
        if isinstance(statement, ast.If):
            if not _never_runs(statement.test):
                yield from _module_level_statements(statement.body)
            yield from _module_level_statements(statement.orelse)
        elif isinstance(statement, try_types):
            for block in (statement.body, statement.orelse, statement.finalbody):
                yield from _module_level_statements(block)
        elif isinstance(statement, ast.With):
            yield from _module_level_statements(statement.body)


# --- parsing ------------------------------------------------------------------------------------

_CODING_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def _is_utf8_name(encoding: str) -> bool:
    name = encoding.lower().replace("_", "-")
    return name in ("utf-8", "utf8") or name.startswith("utf-8-")


# CPython 3.11 keeps the AST constructor's recursion counter per interpreter, not per thread:
# two threads parsing at once (a validator evaluating several forks) can fail with
# "SystemError: AST constructor recursion depth mismatch". Parses are serialised.
_PARSE_LOCK = threading.Lock()


def _parse_ast(source: str, filename: str = "<unknown>") -> ast.Module:
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename)


def _parse(source: str, filename: str) -> ast.Module | Finding:
    """The module's AST, or the finding that says why it cannot be had."""
    for number, line in enumerate(re.split(r"\r\n|\r|\n", source, maxsplit=2)[:2], start=1):
        cookie = _CODING_COOKIE.match(line)
        if cookie and not _is_utf8_name(cookie.group(1)):
            message = f"declares the source encoding {cookie.group(1)!r}; only UTF-8 is accepted"
            return Finding(filename, number, Rule.ENCODING, message)
    if "\0" in source:  # a ValueError or a SyntaxError without a line, depending on the Python version
        line = source.count("\n", 0, source.find("\0")) + 1
        return Finding(filename, line, Rule.SYNTAX_ERROR, "does not parse: the source contains a null byte")
    try:
        return _parse_ast(source, filename)
    except SyntaxError as error:
        return Finding(filename, error.lineno, Rule.SYNTAX_ERROR, f"does not parse: {error.msg}")
    except (RecursionError, MemoryError):
        return Finding(filename, None, Rule.SYNTAX_ERROR, "does not parse: nested too deeply")


def _snippet(source: str, node: ast.AST) -> str:
    text = ast.get_source_segment(source, node) or ast.unparse(node)
    text = " ".join(text.split())
    return text if len(text) <= 100 else text[:97] + "..."


# --- the forbidden-import checker ---------------------------------------------------------------------


class _TooComplex(Exception):
    """Raised when a file's names cannot be followed within reasonable bounds."""


class _ForbiddenImportChecker:
    """Finds forbidden and unverifiable imports in one parsed file (see the module docstring)."""

    def __init__(self, tree: ast.Module, source: str, module_name: str, filename: str, reexports: ReexportIndex):
        self.tree = tree
        self.source = source
        self.module_name = module_name
        self.filename = filename
        self.is_package = PurePosixPath(filename).name == "__init__.py"
        self.reexports = reexports
        self.parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        self.aliases: dict[str, set[str]] = {}
        self.cache: dict[int, frozenset[str]] = {}
        self.findings: dict[tuple, Finding] = {}

    # findings

    def _report(self, node: ast.AST, rule: Rule, message: str, subject: str) -> None:
        line = getattr(node, "lineno", None)
        self.findings.setdefault((line, rule, subject), Finding(self.filename, line, rule, message))

    def _forbidden(self, node: ast.AST, dotted: str, what: str) -> bool:
        """Reports ``dotted`` when it is, or comes from, a forbidden module; ``what`` opens the message."""
        root = self.reexports.root_of(dotted)
        if root is None:
            return False
        via = "" if _forbidden_root(dotted) else f" ({dotted} comes from {root})"
        self._report(node, Rule.FORBIDDEN_IMPORT, f"{what} {root}{via} (`{_snippet(self.source, node)}`)", root)
        return True

    def _unverifiable(self, node: ast.AST, why: str, subject: str) -> None:
        message = f"cannot be verified: {why} (`{_snippet(self.source, node)}`)"
        self._report(node, Rule.UNVERIFIABLE_IMPORT, message, subject)

    # name resolution

    def _import_base(self, node: ast.ImportFrom) -> str | None:
        return resolve_relative(node.module, node.level, self.module_name, self.is_package)

    def _resolve_name(self, name: str) -> frozenset[str]:
        if name == "__builtins__":
            return frozenset({"builtins"})
        default = f"builtins.{name}" if name in _BUILTIN_NAMES else name
        return frozenset(self.aliases.get(name, set()) | {default})

    def _resolve(self, node: ast.AST) -> frozenset[str]:
        """The dotted names an expression may stand for (flow-insensitive, over-approximate)."""
        key = id(node)
        if key not in self.cache:
            self.cache[key] = self._resolve_uncached(node)
        return self.cache[key]

    def _resolve_uncached(self, node: ast.AST) -> frozenset[str]:
        if isinstance(node, ast.Name):
            return self._resolve_name(node.id)
        if isinstance(node, ast.Attribute):
            return frozenset(f"{base}.{node.attr}" for base in self._resolve(node.value))
        if isinstance(node, ast.Subscript):
            key = _fold_str(node.slice)
            if key is None:
                return frozenset()
            return frozenset().union(*(self._subscript(base, key) for base in self._resolve(node.value)))
        if isinstance(node, ast.Call):
            return self._resolve_call(node)
        return frozenset()

    def _subscript(self, base: str, key: str) -> frozenset[str]:
        """What ``base[key]`` stands for when ``base`` is a namespace mapping; else nothing."""
        if base == "sys.modules":
            return frozenset({key})
        if base == _GLOBALS:
            return self._resolve_name(key)
        if base == "builtins":
            return frozenset({f"builtins.{key}"})
        if base.endswith(".__dict__"):
            return frozenset({f"{base[: -len('.__dict__')]}.{key}"})
        return frozenset()

    def _resolve_call(self, node: ast.Call) -> frozenset[str]:
        functions = self._resolve(node.func)
        result: set[str] = set()
        args = node.args
        if functions & {"builtins.getattr", "builtins.object.__getattribute__"} and len(args) >= 2:
            name = _fold_str(args[1])
            if name is not None:
                result |= {f"{base}.{name}" for base in self._resolve(args[0])}
        is_getattribute = isinstance(node.func, ast.Attribute) and node.func.attr in ("__getattribute__", "__getattr__")
        if is_getattribute and len(args) == 1 and (name := _fold_str(args[0])) is not None:
            result |= {f"{base}.{name}" for base in self._resolve(node.func.value)}  # type: ignore[union-attr]
        if "builtins.vars" in functions:
            if args:
                result |= {f"{base}.__dict__" for base in self._resolve(args[0])}
            else:
                result.add(_GLOBALS)
        if functions & {"builtins.globals", "builtins.locals"}:
            result.add(_GLOBALS)
        for function in functions:
            base = function.removesuffix(".get")
            if base != function and base in _STATE_OBJECTS and args and (key := _fold_str(args[0])) is not None:
                result |= self._subscript(base, key)
            elif function in _MODULE_IMPORTERS:
                result |= self._imported_module(node, function)
        return frozenset(result)

    def _imported_module(self, node: ast.Call, function: str) -> set[str]:
        """The module a constant ``import_module``/``__import__`` call evaluates to."""
        targets = self._dynamic_targets(node, function)
        if targets is None:
            return set()
        name, fromlist = targets
        if function == "importlib.import_module":
            return {name}
        if function.endswith("__import__"):
            return {name} if fromlist else {name.split(".")[0]}
        return set()

    # aliases

    def _collect_aliases(self) -> None:
        roots = set(_SENSITIVE_ROOTS)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    roots.add(alias.name.split(".")[0])
                    if alias.asname:
                        self.aliases.setdefault(alias.asname, set()).add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = self._import_base(node)
                if base is None:
                    continue
                roots.add(base.split(".")[0])
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases.setdefault(alias.asname or alias.name, set()).add(f"{base}.{alias.name}")
        assignments = []
        for node in ast.walk(self.tree):
            names, value = self._alias_assignment(node)
            if names:
                assignments.append((node.lineno, node.col_offset, names, value))
        assignments.sort(key=lambda item: item[:2])
        # Source order settles forward chains in one pass; a chain still growing after that is refused.
        for _ in range(_MAX_ALIAS_PASSES):
            changed = False
            for _line, _column, names, value in assignments:
                targets = {d for d in self._resolve_uncached(value) if d.split(".")[0] in roots}
                for name in names:
                    known = self.aliases.setdefault(name, set())
                    if not targets <= known:
                        known |= targets
                        changed = True
                        self.cache.clear()
            if sum(len(v) for v in self.aliases.values()) > _MAX_ALIAS_ENTRIES:
                raise _TooComplex
            if not changed:
                return
        raise _TooComplex

    def _alias_assignment(self, node: ast.AST) -> tuple[list[str], ast.expr | None]:
        """``(names, value)`` when ``node`` binds plain names to ``value`` outside a class body."""
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif (isinstance(node, ast.AnnAssign) and node.value is not None) or isinstance(node, ast.NamedExpr):
            targets, value = [node.target], node.value
        else:
            return [], None
        if isinstance(self.parents.get(node), ast.ClassDef) or not all(isinstance(t, ast.Name) for t in targets):
            return [], None
        return [t.id for t in targets], value  # type: ignore[attr-defined]

    # the walk

    def run(self) -> list[Finding]:
        try:
            self._collect_aliases()
            for node in ast.walk(self.tree):
                self._visit(node)
        except (_TooComplex, RecursionError):
            message = "cannot be verified: the file's names are too tangled or nested to follow"
            self.findings = {(): Finding(self.filename, None, Rule.UNVERIFIABLE_IMPORT, message)}
        return sorted(self.findings.values(), key=lambda f: (f.line or 0, f.rule.value, f.message))

    def _visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                self._forbidden(node, alias.name, "forbidden import of")
        elif isinstance(node, ast.ImportFrom):
            self._visit_import_from(node)
        elif isinstance(node, ast.Call):
            self._visit_call(node)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                self._visit_store(target)
        if isinstance(node, ast.Attribute) and node.attr in _INTROSPECTION_ATTRS:
            self._unverifiable(node, f"`{node.attr}` reaches interpreter internals", node.attr)
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _fold_str(node.slice) is None:
            for base in self._resolve(node.value):
                if base in _STATE_OBJECTS or base == "builtins":
                    self._unverifiable(node, f"a computed key into {base}", base)
        if isinstance(node, ast.Call) or (
            isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) and isinstance(node.ctx, ast.Load)
        ):
            self._visit_reference(node)

    def _visit_import_from(self, node: ast.ImportFrom) -> None:
        base = self._import_base(node)
        if base is None:
            dots = "." * node.level
            message = f"relative import `from {dots}{node.module or ''} import …` climbs above the top-level package"
            self._report(node, Rule.BAD_RELATIVE_IMPORT, message, "relative")
            return
        if self._forbidden(node, base, "forbidden import of"):
            return
        for alias in node.names:
            if alias.name == "*":
                self._forbidden_star(node, base)
            else:
                self._forbidden(node, f"{base}.{alias.name}", "forbidden import of")

    def _forbidden_star(self, node: ast.AST, module: str) -> None:
        root = self.reexports.star_root(module)
        if root:
            message = f"forbidden import of {root}: `*` takes the names {module} binds from it"
            self._report(node, Rule.FORBIDDEN_IMPORT, f"{message} (`{_snippet(self.source, node)}`)", root)

    def _visit_reference(self, node: ast.AST) -> None:
        resolved = self._resolve(node)
        for dotted in resolved:
            if self._forbidden(node, dotted, "forbidden reference to"):
                break
        for dotted in sorted(resolved):
            kind = _kind(dotted)
            if kind and not self._use_is_followed(node, kind):
                self._unverifiable(node, f"{dotted} is passed on where its use cannot be followed", dotted)

    def _use_is_followed(self, node: ast.AST, kind: str) -> bool:
        """Whether the use of a sensitive object or callable at ``node`` is one this checker follows."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            return True
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return True
        if self._alias_assignment(parent)[1] is node:
            return True
        if kind not in ("module", "state"):
            return False
        if isinstance(parent, ast.Expr) or (isinstance(parent, ast.Subscript) and parent.value is node):
            return True
        if isinstance(parent, ast.Compare):
            return True
        if isinstance(parent, ast.Call) and node is not parent.func:
            functions = self._resolve(parent.func)
            if any(_kind(f) == "module-importer" for f in functions):
                return True  # __import__(name, globals()): only __package__ is read, and the name is checked
            inspectors = _GETATTR_LIKE | {"builtins.vars", "builtins.hasattr"}
            return bool(parent.args) and parent.args[0] is node and bool(functions & inspectors)
        return False

    def _visit_store(self, target: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._visit_store(element)
        elif isinstance(target, ast.Starred):
            self._visit_store(target.value)
        elif isinstance(target, ast.Attribute):
            for dotted in self._resolve(target):
                head = dotted.rsplit(".", 1)[0]
                if dotted in _STATE_OBJECTS or head in (_SENSITIVE_MODULES - {"sys"}) | _STATE_OBJECTS:
                    self._unverifiable(target, f"changes {dotted}", dotted)
        elif isinstance(target, ast.Subscript):
            for base in self._resolve(target.value):
                if base in _STATE_OBJECTS - {_GLOBALS} or base == "builtins":
                    self._unverifiable(target, f"changes {base}", base)

    def _visit_call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("__getattribute__", "__getattr__"):
            owners = sorted(d for d in self._resolve(node.func.value) if _kind(d) in ("module", "state"))
            if owners and (len(node.args) != 1 or _fold_str(node.args[0]) is None):
                self._unverifiable(node, f"{node.func.attr} with a computed name on {owners[0]}", owners[0])
        for function in sorted(self._resolve(node.func)):
            kind = _kind(function)
            if kind == "code":
                self._unverifiable(node, f"{function} runs code built at run time", function)
            elif kind == "module-importer":
                self._check_module_importer(node, function)
            elif kind == "path-loader":
                self._check_path_loader(node, function)
            elif kind == "getattr":
                self._check_getattr(node, function)
            elif kind == "import-state":
                self._unverifiable(node, f"{function} reads or changes the import system's state", function)
            elif kind == "machinery":
                self._unverifiable(node, f"{function} is import machinery this check does not follow", function)

    def _bind(self, node: ast.Call, params: Sequence[str]) -> dict[str, ast.expr] | None:
        """Arguments by parameter name; None when ``*args``/``**kwargs`` hide them."""
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return None
        bound = dict(zip(params, node.args, strict=False))  # extra positionals are the caller's TypeError
        bound.update({k.arg: k.value for k in node.keywords if k.arg})  # type: ignore[misc]
        return bound

    def _dynamic_targets(self, node: ast.Call, function: str) -> tuple[str, list[str]] | None:
        """``(absolute module name, fromlist)`` of a dynamic import when both are constants."""
        params = _MODULE_IMPORTERS[function]
        args = self._bind(node, params)
        if args is None:
            return None
        name = _fold_str(args.get(params[0]))
        fromlist = _fold_str_list(args.get("fromlist"))
        level = _fold_int(args.get("level"), 0)
        if name is None or fromlist is None or level is None:
            return None
        if function.endswith("__import__"):
            absolute = resolve_relative(name, level, self.module_name, self.is_package) if level else name
        elif name.startswith("."):
            package = _fold_str(args.get("package"))
            if package is None:
                return None
            stripped = name.lstrip(".")
            absolute = resolve_relative(stripped or None, len(name) - len(stripped), package, True)
        else:
            absolute = name
        return (absolute, fromlist) if absolute else None

    def _check_module_importer(self, node: ast.Call, function: str) -> None:
        targets = self._dynamic_targets(node, function)
        if targets is None:
            self._unverifiable(node, f"the module {function} imports is not a constant", function)
            return
        name, fromlist = targets
        for target in [name, *(f"{name}.{item}" for item in fromlist if item != "*")]:
            if self._forbidden(node, target, "forbidden dynamic import of"):
                return
        if "*" in fromlist:
            self._forbidden_star(node, name)

    def _check_path_loader(self, node: ast.Call, function: str) -> None:
        params = _PATH_LOADERS[function]
        args = self._bind(node, params)
        if args is None:
            self._unverifiable(node, f"the file {function} loads is not a constant", function)
            return
        label = _fold_str(args.get(params[0])) if params[0] not in _PATH_PARAMS else None
        if label is not None and self._forbidden(node, label, "forbidden dynamic import of"):
            return
        path_node = next((args[p] for p in params if p in _PATH_PARAMS and p in args), None)
        if path_node is None:
            return
        path = self._fold_path(path_node)
        if path is None:
            self._unverifiable(node, f"the file {function} loads is not a constant", function)
            return
        path = posixpath.normpath(path.replace("\\", "/"))
        for part in PurePosixPath(path).parts:
            if part in ("gla", "kda", "gla.py", "kda.py"):
                root = f"fla.ops.{part.removesuffix('.py')}"
                message = f"forbidden dynamic import of {root}: loads {path} (`{_snippet(self.source, node)}`)"
                self._report(node, Rule.FORBIDDEN_IMPORT, message, root)
                return

    def _fold_path(self, node: ast.AST) -> str | None:
        """A file path built from literals and ``__file__`` with ``os.path``/``pathlib`` operations."""
        text = _fold_str(node)
        if text is not None:
            return text
        if isinstance(node, ast.Name) and node.id == "__file__":
            return self.filename
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = self._fold_path(node.left), self._fold_path(node.right)
            return None if left is None or right is None else posixpath.join(left, right)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            inner = self._fold_path(node.value)
            return None if inner is None else posixpath.dirname(posixpath.normpath(inner))
        if not isinstance(node, ast.Call) or node.keywords:
            return None
        functions = self._resolve(node.func)
        parts = [self._fold_path(argument) for argument in node.args]
        if any(part is None for part in parts):
            return None
        path_functions = {"os.path.", "posixpath.", "pathlib.", "builtins.str", "os.fspath"}
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("resolve", "absolute") and not parts:
            return self._fold_path(node.func.value)
        if not any(f.startswith(tuple(path_functions)) for f in functions) or not parts:
            return None
        if any(f.endswith(".dirname") for f in functions):
            return posixpath.dirname(posixpath.normpath(parts[0]))  # type: ignore[arg-type]
        return posixpath.join(*parts)  # type: ignore[arg-type]

    def _check_getattr(self, node: ast.Call, function: str) -> None:
        if function in ("operator.attrgetter", "operator.methodcaller"):
            if not node.args or _fold_str(node.args[0]) is None:
                self._unverifiable(node, f"{function} with a computed name", function)
            return
        if len(node.args) < 2 or any(isinstance(a, ast.Starred) for a in node.args):
            self._unverifiable(node, f"{function} with arguments that cannot be read", function)
            return
        objects = self._resolve(node.args[0])
        sensitive = sorted(d for d in objects if _kind(d) in ("module", "state"))
        name = _fold_str(node.args[1])
        if function in ("builtins.setattr", "builtins.delattr"):
            if sensitive:
                self._unverifiable(node, f"{function} changes {sensitive[0]}", function)
        elif name is None and sensitive:
            self._unverifiable(node, f"{function} with a computed name on {sensitive[0]}", function)
        elif name in _INTROSPECTION_ATTRS:
            self._unverifiable(node, f"`{name}` reaches interpreter internals", name)


# --- required imports ---------------------------------------------------------------------------


def _provided_keys(statement: ast.stmt, module_name: str, is_package: bool) -> set[tuple]:
    keys: set[tuple] = set()
    if isinstance(statement, ast.Import):
        keys |= {("module", alias.name) for alias in statement.names}
    elif isinstance(statement, ast.ImportFrom):
        base = resolve_relative(statement.module, statement.level, module_name, is_package)
        if base:
            for alias in statement.names:
                if alias.name != "*":
                    keys |= {("name", base, alias.name), ("module", f"{base}.{alias.name}")}
    return keys


def _required_key(required: RequiredImport) -> tuple:
    return ("module", required.module) if required.name is None else ("name", required.module, required.name)


def _missing_required(tree: ast.Module, module_name: str, filename: str, profile: str) -> list[Finding]:
    is_package = PurePosixPath(filename).name == "__init__.py"
    at_module_level: set[tuple] = set()
    for statement in _module_level_statements(tree.body):
        at_module_level |= _provided_keys(statement, module_name, is_package)
    elsewhere: dict[tuple, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for key in _provided_keys(node, module_name, is_package):
                elsewhere[key] = min(elsewhere.get(key, node.lineno), node.lineno)
    findings = []
    for required in PROFILES[profile]:
        key = _required_key(required)
        if key in at_module_level:
            continue
        message = f"`{required}` is required at module level (profile {profile})"
        line = elsewhere.get(key)
        if line:
            message += "; it is imported here only inside a function, class or block that does not run on import"
        findings.append(Finding(filename, line, Rule.MISSING_REQUIRED_IMPORT, message))
    return findings


# --- pure entry points -------------------------------------------------------------------------


def check_source(source: str, module_name: str, filename: str, reexports: ReexportIndex | None = None) -> list[Finding]:
    """Forbidden and unverifiable imports in one file's text (parse problems as findings too).

    ``module_name`` is the file's dotted module (relative imports resolve against it); a
    ``filename`` ending in ``__init__.py`` makes it a package. ``reexports`` finds names other
    modules bind from gla/kda; without it only direct references count.
    """
    parsed = _parse(source, filename)
    if isinstance(parsed, Finding):
        return [parsed]
    index = reexports or ReexportIndex.from_files({})
    return _ForbiddenImportChecker(parsed, source, module_name, filename, index).run()


def check_required_imports(source: str, module_name: str, filename: str, profile: str = "core") -> list[Finding]:
    """Required imports of ``profile`` that ``source`` lacks at module level (or why it cannot be parsed)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    parsed = _parse(source, filename)
    if isinstance(parsed, Finding):
        return [parsed]
    return _missing_required(parsed, module_name, filename, profile)


# --- the repository ----------------------------------------------------------------------------


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class _Repo:
    """Reads a fork's files without following links out of it; collects findings on the way."""

    def __init__(self, root: Path):
        self.root = Path(os.path.realpath(root))
        self.forbidden_dirs = {
            root_module: self.root / root_module.replace(".", "/") for root_module in FORBIDDEN_MODULES
        }
        self.findings: list[Finding] = []

    def real(self, relative: str) -> Path:
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

    def locate_module(self, module: str) -> tuple[str, str] | None:
        """A module's path and source for the re-export index; quietly None when it cannot be had."""
        for relative in _module_paths(module):
            real = self.real(relative)
            try:
                if _inside(real, self.root) and real.is_file() and real.stat().st_size <= MAX_SOURCE_BYTES:
                    return relative, real.read_bytes().decode("utf-8", errors="replace")
            except OSError:
                return None
        return None

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
            try:
                entries = sorted(os.scandir(self.root / directory), key=lambda e: e.name)
            except OSError as error:
                self.findings.append(
                    Finding(directory, None, Rule.UNREADABLE_FILE, f"cannot be listed: {error.strerror}")
                )
                continue
            for entry in entries:
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
        try:
            entries = sorted(os.scandir(self.root / directory), key=lambda e: e.name)
        except OSError as error:
            self.findings.append(Finding(directory, None, Rule.UNREADABLE_FILE, f"cannot be listed: {error.strerror}"))
            return
        for entry in entries:
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
        for directory, subdirectories, files in os.walk(self.root):
            subdirectories[:] = [d for d in subdirectories if d != ".git"]
            for name in files:
                if name.endswith(".cu"):
                    real = Path(os.path.realpath(os.path.join(directory, name)))
                    if _inside(real, self.root) and real.is_file():
                        return True
        return False


def validate_repo(repo_path: str | os.PathLike, profile: str = "core", require_cu: bool = False) -> ImportReport:
    """Check a fork checked out at ``repo_path`` against docs/rules.md section 4 step 2.

    Raises NotADirectoryError when ``repo_path`` is not a directory and ValueError for an unknown
    profile; everything wrong with the fork itself is a finding in the report.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    if not os.path.isdir(repo_path):
        raise NotADirectoryError(f"repository path {os.fspath(repo_path)!r} is not a directory")
    repo = _Repo(Path(repo_path))
    reexports = ReexportIndex(repo.locate_module)
    findings = repo.findings

    targets = [f"{QUASAR_DIR}/{name}" for name in TARGET_FILES]
    checked = sorted(set(targets) | {LAYER_FILE} | set(repo.python_files_under(QUASAR_DIR)))
    repo.check_namespace_shadowing()
    repo.check_bytecode_cache("fla/layers/__pycache__", stem="quasar.")
    for relative in checked:
        source = repo.read_source(relative)
        if source is None:
            continue
        repo.check_shadowing(relative)
        module_name = module_name_for(relative)
        parsed = _parse(source, relative)
        if isinstance(parsed, Finding):
            findings.append(parsed)
            continue
        findings.extend(_ForbiddenImportChecker(parsed, source, module_name, relative, reexports).run())
        if relative == CHUNK_FILE:
            findings.extend(_missing_required(parsed, module_name, relative, profile))

    warnings: list[Finding] = []
    if not repo.has_cu_file():
        cu = Finding(".", None, Rule.NO_CU_FILE, "the repository has no *.cu file")
        (findings if require_cu else warnings).append(cu)
    errors = tuple(sorted(set(findings), key=lambda f: (f.path, f.line or 0, f.rule.value, f.message)))
    logger.info("import check of %s: %d errors, %d warnings", repo.root, len(errors), len(warnings))
    return ImportReport(errors=errors, warnings=tuple(warnings), checked_files=tuple(checked))


# --- command line ---------------------------------------------------------------------------


def _print_report(report: ImportReport, repo: str, profile: str) -> None:
    console = Console()
    if report.errors or report.warnings:
        table = Table(title=f"Import check of {repo} (profile {profile})")
        for column in ("level", "where", "rule", "message"):
            table.add_column(column, overflow="fold")
        for level, style, items in (("error", "red", report.errors), ("warning", "yellow", report.warnings)):
            for finding in items:
                table.add_row(
                    Text(level, style=style), Text(finding.location), Text(finding.rule.value), Text(finding.message)
                )
        console.print(table)
    verdict = Text("PASS", style="bold green") if report.ok else Text("FAIL", style="bold red")
    summary = (
        f" {len(report.checked_files)} files checked, {len(report.errors)} errors, {len(report.warnings)} warnings"
    )
    console.print(verdict + Text(summary))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m quasar.imports``: 0 iff the fork passes, 1 if not, 2 for a usage error."""
    parser = argparse.ArgumentParser(
        prog="python -m quasar.imports",
        description="Check a QUASAR fork's imports (docs/rules.md section 4 step 2).",
    )
    parser.add_argument("repo", help="path of the fork's checkout")
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="core", help="required-import profile (default core)"
    )
    parser.add_argument("--require-cu", action="store_true", help="a repository without a *.cu file fails")
    parser.add_argument(
        "--json", action="store_true", dest="as_json", help='print {"ok", "errors", "warnings"} as JSON'
    )
    args = parser.parse_args(argv)
    try:
        report = validate_repo(args.repo, profile=args.profile, require_cu=args.require_cu)
    except NotADirectoryError as error:
        parser.error(str(error))
    if args.as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_report(report, args.repo, args.profile)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
