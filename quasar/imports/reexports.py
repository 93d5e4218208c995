"""The index of re-exports across the fork: what a name that another module of the fork binds stands
for, followed through imports, ``*`` imports and the module's own assignments.

Upstream's ``fla/ops/__init__.py`` imports ``chunk_kda`` from ``.kda``, so ``from fla.ops import
chunk_kda`` in a checked file is a forbidden import although it names no forbidden module. A name
bound by an expression is followed through the names the expression refers to (``fast =
torch.compile(chunk_kda)`` comes from kda). A name whose value cannot be followed is
:class:`Opaque`, and a checked file that uses it is refused: one bound by an expression that may
load a module at run time (``fast = importlib.import_module("fla.ops.kda").chunk_kda``, ``getattr``
on a module of the fork, ``globals()``, ``sys.modules`` …, the rule in :meth:`_Reader.why_opaque`),
bound to the import machinery, assigned inside a function (``global``) or by a ``match`` pattern,
left to the module's own ``__getattr__``, bound in a module that cannot be read or parsed, or
reached through more than ``_MAX_DEPTH`` names. Functions and classes are definitions: what they
do when called is not followed. The rest of the fork is read only for this; it is never checked.

A look-up answers each name once however the fork's modules import each other in loops (a ring of
``*`` imports took exponential time before), and checks the check's deadline at every step.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain

from quasar.imports.budget import Deadline
from quasar.imports.findings import Finding, Rule
from quasar.imports.layout import forbidden_root, has_prefix, is_package_file, module_paths, resolve_relative
from quasar.imports.parsing import parse_source
from quasar.imports.sensitive_names import BUILTIN_NAMES, INTROSPECTION_ATTRS, Kind, kind_of


@dataclass(frozen=True)
class Opaque:
    """A name of the fork whose value this check cannot follow: ``name`` (dotted) ``why`` (a phrase)."""

    name: str
    why: str


# What a name comes from: a forbidden module, a name that cannot be followed, or neither.
Origin = str | Opaque | None

# Reads of a namespace by name, or of interpreter internals: what they return cannot be followed.
_NAMESPACE_READERS = frozenset({"builtins.globals", "builtins.locals", "builtins.vars"})
_OPAQUE_ATTRS = INTROSPECTION_ATTRS | {"__dict__", "__getattribute__", "__getattr__"}


@dataclass
class _ModuleBindings:
    path: str
    aliases: dict[str, list[str]] = field(default_factory=dict)  # name -> what an import or `x = a.b` binds
    refs: dict[str, list[str]] = field(default_factory=dict)  # name -> fla names its expressions refer to
    opaque: dict[str, str] = field(default_factory=dict)  # name -> why its value cannot be followed
    defined: set[str] = field(default_factory=set)  # def, class, `except … as`
    star_from: list[str] = field(default_factory=list)  # modules star-imported
    unreadable: str | None = None  # why none of its names can be followed (it cannot be read or parsed)

    def binds(self, name: str) -> bool:
        return bool(self.unreadable) or any(
            name in names for names in (self.aliases, self.refs, self.opaque, self.defined)
        )


def _dotted_path(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_path(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _module_scope(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node that runs in the module's own scope, in any block (loops, ``except`` handlers and
    ``if TYPE_CHECKING:`` included): the bodies of functions, classes and lambdas aside."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending.extend(child for name, child in _fields(node) if name != "body")
        else:
            pending.extend(child for _, child in _fields(node))


def _fields(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    for name, value in ast.iter_fields(node):
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, ast.AST):
                yield name, item


def _target_names(target: ast.AST) -> Iterator[str]:
    """The plain names an assignment target binds (``a``, ``a, *b``); not ``x.attr`` or ``x[key]``."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _target_names(element)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


class _Reader:
    """Reads what one module of the fork binds at module scope into :class:`_ModuleBindings`."""

    def __init__(self, module: str, path: str, tree: ast.Module, in_fork: Callable[[str], bool]):
        self.module = module
        self.path = path
        self.tree = tree
        self.in_fork = in_fork
        self.bindings = _ModuleBindings(path)
        self.imports: dict[str, list[str]] = {}  # name -> what imports bind it to
        self.bound: set[str] = set()  # names bound other than by import

    def read(self) -> _ModuleBindings:
        values: list[tuple[str, ast.expr, int]] = []
        for node in _module_scope(self.tree):
            self._collect(node, values)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Global):  # a function that rebinds a module name: its value is unknown
                for name in node.names:
                    self.bound.add(name)
                    self._opaque(name, f"assigned inside a function of {self.path} (`global`)")
        for name, targets in self.imports.items():
            for target in targets:
                self._bind_alias(name, target, None)
        for name, value, line in values:
            self._bind_value(name, value, line)
        return self.bindings

    def _collect(self, node: ast.AST, values: list[tuple[str, ast.expr, int]]) -> None:
        """Records an import, a definition, or a name with the expression it is bound to."""
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                self.imports.setdefault(alias.asname or top, []).append(alias.name if alias.asname else top)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_relative(node.module, node.level, self.module, is_package_file(self.path))
            for alias in node.names if base is not None else []:
                if alias.name == "*":
                    self.bindings.star_from.append(f"{base}")
                else:
                    self.imports.setdefault(alias.asname or alias.name, []).append(f"{base}.{alias.name}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler)) and node.name:
            self.bound.add(node.name)
            self.bindings.defined.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar, ast.MatchMapping)):
            name = node.rest if isinstance(node, ast.MatchMapping) else node.name
            if name:
                self.bound.add(name)
                self._opaque(name, f"bound at {self.path}:{line} by a match pattern")
        else:
            for target, value in self._assignment(node):
                for name in _target_names(target):
                    self.bound.add(name)
                    values.append((name, value, line))

    @staticmethod
    def _assignment(node: ast.AST) -> list[tuple[ast.AST, ast.expr]]:
        """``(target, value)`` pairs of a statement or expression that binds names to a value."""
        if isinstance(node, ast.Assign):
            return [(target, node.value) for target in node.targets]
        if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
            return [(node.target, node.value)]
        if isinstance(node, (ast.For, ast.AsyncFor)):
            return [(node.target, node.iter)]
        if isinstance(node, (ast.With, ast.AsyncWith)):
            return [(item.optional_vars, item.context_expr) for item in node.items if item.optional_vars]
        return []

    def _opaque(self, name: str, why: str) -> None:
        self.bindings.opaque.setdefault(name, why)

    def _bind_alias(self, name: str, target: str, line: int | None) -> None:
        """``name`` stands for the dotted ``target`` (an import, or ``name = a.b``): followed, unless
        the target is one an expression may not use either (``load = importlib.import_module``)."""
        followed = has_prefix(target, "fla") and kind_of(target) is Kind.MODULE  # `o = fla.ops`: o.kda is followed
        why = None if followed else self.why_opaque(target, None)
        if why:
            where = f"at {self.path}:{line}" if line else f"in {self.path}"
            self._opaque(name, f"bound {where} to {why}")
        else:
            self.bindings.aliases.setdefault(name, []).append(target)

    def _bind_value(self, name: str, value: ast.expr, line: int) -> None:
        if _dotted_path(value) is not None:
            for target in self._resolve(value):
                self._bind_alias(name, target, line)
            return
        refs = self.bindings.refs.setdefault(name, [])
        inner = {id(n.value) for n in ast.walk(value) if isinstance(n, ast.Attribute)}
        calls = {id(n.func): n for n in ast.walk(value) if isinstance(n, ast.Call)}
        for node in ast.walk(value):
            if not isinstance(node, (ast.Name, ast.Attribute)) or id(node) in inner:
                continue  # only whole paths: `sys.platform`, not `sys` in it
            for dotted in self._resolve(node):
                why = self.why_opaque(dotted, calls.get(id(node)))
                if why:
                    self._opaque(name, f"bound at {self.path}:{line} through {why}")
                    return
                if self.in_fork(dotted):
                    refs.append(dotted)

    def _resolve(self, node: ast.AST) -> list[str]:
        """The dotted names a path (``a.b.c``) of this module may stand for; none for other shapes.
        A name the module binds itself is followed as ``module.name``."""
        path = _dotted_path(node)
        if path is None:
            return []
        head, _, rest = path.partition(".")
        tail = f".{rest}" if rest else ""
        resolved = [target + tail for target in self.imports.get(head, [])]
        if head in self.bound or (not resolved and head not in BUILTIN_NAMES):
            resolved.append(f"{self.module}.{path}")
        elif head in BUILTIN_NAMES and not resolved:
            resolved.append(f"builtins.{path}")
        return resolved

    def why_opaque(self, dotted: str, call: ast.Call | None) -> str | None:
        """Why a path in an expression may load a module at run time (None if it may not): the
        import machinery and anything the import check watches (``sys.modules``, ``exec`` …),
        ``globals()``/``vars()``, interpreter internals, and ``getattr`` except on an object outside
        fla that the check does not watch (``getattr(torch, name)`` is an ordinary call)."""
        if any(part in _OPAQUE_ATTRS for part in dotted.split(".")):
            return f"`{dotted}`, which reaches a namespace or interpreter internals"
        if dotted in _NAMESPACE_READERS:
            return f"{dotted}, which reads a namespace by name"
        kind = kind_of(dotted)
        if kind is Kind.GETATTR and dotted == "builtins.getattr" and call is not None and call.args:
            objects = self._resolve(call.args[0])
            if objects and not any(self.in_fork(o) or kind_of(o) for o in objects):
                return None
        if kind is not None:
            return f"{dotted}, which can reach any module at run time"
        return None


def _first_origin(origins: Iterable[Origin], found: Origin = None) -> Origin:
    """The first forbidden module among ``origins`` (taken lazily, up to it); else ``found`` or
    the first opaque name; else None."""
    for origin in origins:
        if isinstance(origin, str):
            return origin
        found = found or origin
    return found


class ReexportIndex:
    """Finds what a name of a module of the fork comes from (see the module's docstring).

    ``locate(module)`` returns ``(repo-relative path, source text)`` of a module of the fork (the
    text None when the module cannot be read: its names are opaque), or None when it has no such
    module. ``root_of("fla.ops.chunk_kda")`` is ``"fla.ops.kda"`` when
    ``fla/ops/__init__.py`` imports ``chunk_kda`` from ``.kda``; chains of re-exports are followed.
    With a ``deadline``, look-ups raise :class:`~quasar.imports.budget.OverBudget` once it has passed.
    """

    _MAX_DEPTH = 16
    # No module of a fork is nested this deep (real fla: 7); a path this long is refused rather than
    # searched, for each of its prefixes may be a module: `fla.a.a.a…` cost its length cubed.
    _MAX_PARTS = 32

    def __init__(self, locate: Callable[[str], tuple[str, str | None] | None], deadline: Deadline | None = None):
        self._locate = locate
        self._deadline = deadline
        self._bindings: dict[str, _ModuleBindings | None] = {}
        self._known: dict[tuple[str, str], Origin] = {}
        self._query: dict[tuple[str, str], Origin] = {}  # the answers of the look-up under way
        self._modules: dict[str, bool] = {}  # is_module's answers
        self._located: dict[str, tuple[str, str | None] | None] = {}  # locate's answers

    @classmethod
    def from_files(cls, files: dict[str, str]) -> ReexportIndex:
        """An index over in-memory files, ``{"fla/ops/__init__.py": "from .kda import chunk_kda"}``."""

        def locate(module: str) -> tuple[str, str | None] | None:
            for path in module_paths(module):
                if path in files:
                    return path, files[path]
            return None

        return cls(locate)

    def root_of(self, dotted: str, depth: int = 0) -> Origin:
        """The forbidden module ``dotted`` comes from, directly or through the fork's modules; an
        :class:`Opaque` when it goes through a name whose value cannot be followed; else None."""
        direct = forbidden_root(dotted)
        if direct or not self.in_fork(dotted):
            return direct
        return self._follow(("name", dotted), depth)

    def _find(self, module: str) -> tuple[str, str | None] | None:
        if module not in self._located:
            self._located[module] = self._locate(module)
        return self._located[module]

    def in_fork(self, dotted: str) -> bool:
        """Whether ``dotted`` lies in ``fla`` or in another module the fork has: the fork's folder is
        first on the path, so its ``kernels_util.py`` or ``einops/`` is what an import of it loads."""
        parts = dotted.split(".")
        if has_prefix(dotted, "fla") or len(parts) > self._MAX_PARTS:
            return has_prefix(dotted, "fla")
        return any(self._find(".".join(parts[:end])) is not None for end in range(1, len(parts) + 1))

    def is_module(self, dotted: str, depth: int = 0) -> bool:
        """Whether ``dotted`` is a module of the fork: one it has (``fla.ops.utils``), or one a module
        of the fork binds by import (``helpers.o`` after ``import fla.ops as o`` in helpers)."""
        if dotted not in self._modules:
            self._modules[dotted] = False  # under way: a loop of imports adds nothing
            if self._deadline:
                self._deadline.check()
            self._modules[dotted] = depth <= self._MAX_DEPTH and self._is_module(dotted, depth)
        return self._modules[dotted]

    def _is_module(self, dotted: str, depth: int) -> bool:
        parts = dotted.split(".")
        if len(parts) > self._MAX_PARTS or not self.in_fork(dotted):
            return False
        if self._find(dotted) is not None:
            return True
        for split in range(len(parts) - 1, 0, -1):
            bindings = self._module_bindings(".".join(parts[:split]))
            if bindings is not None:
                name, rest = parts[split], parts[split + 1 :]
                targets = bindings.aliases.get(name, []) + [f"{source}.{name}" for source in bindings.star_from]
                return any(self.is_module(".".join([target, *rest]), depth + 1) for target in targets)
        return False

    def star_root(self, module: str, depth: int = 0) -> Origin:
        """What the names ``from module import *`` may bind come from (conservative: every name the
        module binds counts, ``__all__`` or not)."""
        return forbidden_root(module) or self._follow(("star", module), depth)

    def _follow(self, key: tuple[str, str], depth: int) -> Origin:
        """One step of a look-up, each name answered once however the fork's modules loop."""
        if key in self._known:
            return self._known[key]
        if key in self._query:
            return self._query[key]  # answered in this look-up, or under way: a loop adds nothing new
        if depth > self._MAX_DEPTH:
            return Opaque(key[1], f"reached through more than {self._MAX_DEPTH} names")
        if self._deadline:
            self._deadline.check()
        outermost = not self._query
        self._query[key] = None
        try:
            origin = self._star(key[1], depth) if key[0] == "star" else self._lookup(key[1], depth)
            self._query[key] = origin
            if outermost:
                # Nothing found is true of every name visited; when something was found, a None on
                # the way may have leaned on a name still under way, so only what was found is kept.
                self._known.update((k, v) for k, v in self._query.items() if origin is None or v is not None)
        finally:
            if outermost:
                self._query = {}
        return origin

    def _lookup(self, dotted: str, depth: int) -> Origin:
        parts = dotted.split(".")
        if len(parts) > self._MAX_PARTS:
            return Opaque(dotted[:60] + "…", f"a path of more than {self._MAX_PARTS} names")
        for split in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:split])
            bindings = self._module_bindings(module)
            if bindings is None:
                continue
            name, rest = parts[split], parts[split + 1 :]
            if not bindings.binds(name):
                if bindings.binds("__getattr__"):
                    return Opaque(f"{module}.{name}", f"provided by the module's own __getattr__ in {bindings.path}")
                if self._find(dotted) is not None:
                    return None  # a module of the fork other than gla/kda
            return self._bound_to(bindings, module, name, rest, depth)
        return None

    def _bound_to(self, bindings: _ModuleBindings, module: str, name: str, rest: list[str], depth: int) -> Origin:
        """What ``module.name.rest`` comes from: a forbidden module over an opaque name over None."""
        if bindings.unreadable:
            return Opaque(f"{module}.{name}", bindings.unreadable)
        found: Origin = Opaque(f"{module}.{name}", bindings.opaque[name]) if name in bindings.opaque else None
        followed = [".".join([target, *rest]) for target in bindings.aliases.get(name, [])]
        followed += bindings.refs.get(name, [])
        for source in bindings.star_from:  # a * import may bind any name, also over an explicit one
            if forbidden_root(source):
                return forbidden_root(source)
            followed.append(".".join([source, name, *rest]))
        return _first_origin((self.root_of(dotted, depth + 1) for dotted in followed), found)

    def _star(self, module: str, depth: int) -> Origin:
        bindings = self._module_bindings(module)
        if bindings is None:
            return None
        if bindings.unreadable:
            return Opaque(module, bindings.unreadable)
        if bindings.binds("__getattr__"):
            return Opaque(module, f"provided by the module's own __getattr__ in {bindings.path}")
        names = sorted(set(bindings.aliases) | set(bindings.refs) | set(bindings.opaque))
        origins = chain(
            (self.root_of(f"{module}.{name}", depth + 1) for name in names),
            (self.star_root(source, depth + 1) for source in bindings.star_from),
        )
        return _first_origin(origins)

    def _module_bindings(self, module: str) -> _ModuleBindings | None:
        if module not in self._bindings:
            if self._deadline:
                self._deadline.check()
            self._bindings[module] = self._parse_bindings(module)
        return self._bindings[module]

    def _parse_bindings(self, module: str) -> _ModuleBindings | None:
        located = self._find(module)
        if located is None:
            return None
        path, source = located
        if source is None:
            return _ModuleBindings(path, unreadable=f"bound in {path}, which this check cannot read")
        # Python honours a coding cookie: under utf-7 a comment here may be an import there.
        parsed = parse_source(source, path)
        if isinstance(parsed, Finding):
            why = parsed.message if parsed.rule is Rule.ENCODING else "this check cannot parse"
            return _ModuleBindings(path, unreadable=f"bound in {path}, which {why}")
        try:
            return _Reader(module, path, parsed, self.in_fork).read()
        except (RecursionError, MemoryError):
            return _ModuleBindings(path, unreadable=f"bound in {path}, which this check cannot parse")
