"""The check of one file for forbidden and unverifiable imports (rules ``forbidden-import``,
``unverifiable-import`` and ``bad-relative-import``, as the package docstring states them): an AST
visitor that resolves every name, attribute, subscript and call to the dotted names it may stand
for, without regard to scope or order, and reports what loads or names ``fla.ops.gla``/
``fla.ops.kda`` and what it cannot follow.
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Sequence
from pathlib import PurePosixPath

from quasar.imports.budget import CHECK_BUDGET_S, Deadline, OverBudget
from quasar.imports.findings import Finding, Rule
from quasar.imports.folding import fold_int, fold_path, fold_str, fold_str_list
from quasar.imports.layout import forbidden_root, is_package_file, resolve_relative
from quasar.imports.parsing import parse_source
from quasar.imports.reexports import Opaque, ReexportIndex
from quasar.imports.sensitive_names import (
    BUILTIN_NAMES,
    GETATTR_LIKE,
    GLOBALS,
    INTROSPECTION_ATTRS,
    MODULE_IMPORTERS,
    PATH_LOADERS,
    PATH_PARAMS,
    SENSITIVE_MODULES,
    SENSITIVE_ROOTS,
    STATE_OBJECTS,
    Kind,
    kind_of,
)

# Bounds on what a file's names may stand for: each reference costs as many look-ups as its name
# has aliases, so one name aliased 19,000 times made every bare use of it cost 19,000 (real fla: 2).
_MAX_ALIASES_PER_NAME = 16
_MAX_ALIAS_ENTRIES = 20_000  # imports and assignments together (real fla: 120 in its largest file)
_MAX_ALIAS_PASSES = 10


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # lines as the parser counts them


def _snippet(lines: Sequence[str], node: ast.AST) -> str:
    """``node``'s source on one line, cut to 100 characters. Read from ``lines`` (the file's, split
    once) and only as far as needed: ``ast.get_source_segment`` split the whole file at every call,
    so a file with many findings took its size times their number."""
    start, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    start_column, end_column = getattr(node, "col_offset", None), getattr(node, "end_col_offset", None)
    if start is None or end is None or start_column is None or end_column is None:
        text = ast.unparse(node)
    else:
        parts, size = [], 0
        for number in range(start, min(end, len(lines)) + 1):
            line = lines[number - 1].encode()  # columns count UTF-8 bytes
            line = line[:end_column] if number == end else line
            parts.append(line[start_column:] if number == start else line)
            size += sum(map(len, parts[-1].split()))
            if size > 400:  # at least 100 characters once whitespace is collapsed
                break
        text = b"".join(parts).decode(errors="replace")
    text = " ".join(text.split())
    return text if len(text) <= 100 else text[:97] + "..."


class _TooComplex(Exception):
    """Raised when a file's names cannot be followed within reasonable bounds; says why, and where."""

    def __init__(self, why: str, line: int | None = None):
        super().__init__(why)
        self.line = line


class _ForbiddenImportChecker:
    """Finds forbidden and unverifiable imports in one parsed file (the rules: ``quasar.imports``)."""

    def __init__(
        self,
        tree: ast.Module,
        source: str,
        module_name: str,
        filename: str,
        reexports: ReexportIndex,
        deadline: Deadline,
    ):
        self.tree = tree
        self.lines = _LINE.findall(source)
        self.module_name = module_name
        self.filename = filename
        self.is_package = is_package_file(filename)
        self.reexports = reexports
        self.parents: dict[ast.AST, ast.AST] = {}
        self.aliases: dict[str, set[str]] = {}
        self.alias_entries = 0
        self.deadline = deadline
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
        if isinstance(root, Opaque):
            shown = dotted if len(dotted) <= 100 else dotted[:97] + "..."
            via = "" if dotted == root.name else f"{shown} comes from {root.name}, and "
            self._opaque(node, f"{via}the value of {root.name}", root)
            return True
        via = "" if forbidden_root(dotted) else f" ({dotted} comes from {root})"
        self._report(node, Rule.FORBIDDEN_IMPORT, f"{what} {root}{via} (`{_snippet(self.lines, node)}`)", root)
        return True

    def _opaque(self, node: ast.AST, subject: str, opaque: Opaque) -> None:
        """Reports a use of a name of the fork whose value the re-export index cannot follow;
        ``subject`` says how the use reaches it."""
        self._unverifiable(node, f"{subject} cannot be followed: it is {opaque.why}", opaque.name)

    def _unverifiable(self, node: ast.AST, why: str, subject: str) -> None:
        message = f"cannot be verified: {why} (`{_snippet(self.lines, node)}`)"
        self._report(node, Rule.UNVERIFIABLE_IMPORT, message, subject)

    def _kind(self, dotted: str) -> Kind | None:
        """:func:`kind_of`, the fork's own modules counting as sensitive modules."""
        return kind_of(dotted, self.reexports.is_module)

    # name resolution

    def _import_base(self, node: ast.ImportFrom) -> str | None:
        return resolve_relative(node.module, node.level, self.module_name, self.is_package)

    def _resolve_name(self, name: str) -> frozenset[str]:
        if name == "__builtins__":
            return frozenset({"builtins"})
        default = f"builtins.{name}" if name in BUILTIN_NAMES else name
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
            key = fold_str(node.slice)
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
        if base == GLOBALS:
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
            name = fold_str(args[1])
            if name is not None:
                result |= {f"{base}.{name}" for base in self._resolve(args[0])}
        getattribute = node.func if isinstance(node.func, ast.Attribute) else None
        if getattribute and getattribute.attr in ("__getattribute__", "__getattr__") and len(args) == 1:
            if (name := fold_str(args[0])) is not None:
                result |= {f"{base}.{name}" for base in self._resolve(getattribute.value)}
        if "builtins.vars" in functions:
            if args:
                result |= {f"{base}.__dict__" for base in self._resolve(args[0])}
            else:
                result.add(GLOBALS)
        if functions & {"builtins.globals", "builtins.locals"}:
            result.add(GLOBALS)
        for function in functions:
            base = function.removesuffix(".get")
            if base != function and self._kind(base) is Kind.STATE and args and (key := fold_str(args[0])) is not None:
                result |= self._subscript(base, key)
            elif function in MODULE_IMPORTERS:
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

    def _add_aliases(self, name: str, targets: set[str], line: int) -> bool:
        """Adds what ``name`` may stand for; whether that was new. Refuses a file past the bounds."""
        known = self.aliases.setdefault(name, set())
        new = targets - known
        if not new:
            return False
        known |= new
        self.alias_entries += len(new)
        if len(known) > _MAX_ALIASES_PER_NAME:
            raise _TooComplex(
                f"the name `{name}` is bound to more than {_MAX_ALIASES_PER_NAME} different modules or objects", line
            )
        if self.alias_entries > _MAX_ALIAS_ENTRIES:
            raise _TooComplex(
                f"the file binds its names to more than {_MAX_ALIAS_ENTRIES:,} modules or objects in all", line
            )
        return True

    def _collect_aliases(self) -> None:
        roots = set(SENSITIVE_ROOTS)
        for node in ast.walk(self.tree):
            self.deadline.check()
            if isinstance(node, ast.Import):
                for alias in node.names:
                    roots.add(alias.name.split(".")[0])
                    if alias.asname:
                        self._add_aliases(alias.asname, {alias.name}, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = self._import_base(node)
                if base is None:
                    continue
                roots.add(base.split(".")[0])
                for alias in node.names:
                    if alias.name != "*":
                        self._add_aliases(alias.asname or alias.name, {f"{base}.{alias.name}"}, node.lineno)
        assignments: list[tuple[int, int, list[str], ast.expr]] = []
        for node in ast.walk(self.tree):
            self.deadline.check()
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
                names, value = self._alias_assignment(node)
                if names and value is not None:
                    assignments.append((node.lineno, node.col_offset, names, value))
        assignments.sort(key=lambda item: item[:2])
        # Source order settles forward chains in one pass; a chain still growing after that is refused.
        for _ in range(_MAX_ALIAS_PASSES):
            changed = False
            for line, _column, names, value in assignments:
                self.deadline.check()
                targets = {d for d in self._resolve_uncached(value) if d.split(".")[0] in roots}
                for name in names:
                    if self._add_aliases(name, targets, line):
                        changed = True
                        self.cache.clear()
            if not changed:
                return
        raise _TooComplex("the file's names are too tangled to follow")

    def _alias_assignment(self, node: ast.AST | None) -> tuple[list[str], ast.expr | None]:
        """``(names, value)`` when ``node`` binds plain names to ``value`` outside a class body."""
        targets: list[ast.expr]
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            return [], None
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if isinstance(self.parents.get(node), ast.ClassDef) or len(names) != len(targets):
            return [], None
        return names, value

    # the walk

    def run(self) -> list[Finding]:
        try:
            for parent in ast.walk(self.tree):
                self.deadline.check()
                self.parents.update((child, parent) for child in ast.iter_child_nodes(parent))
            self._collect_aliases()
            for node in ast.walk(self.tree):
                self.deadline.check()
                self._visit(node)
        except _TooComplex as error:
            message = f"cannot be verified: {error}"
            self.findings = {(): Finding(self.filename, error.line, Rule.UNVERIFIABLE_IMPORT, message)}
        except RecursionError:
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
        if isinstance(node, ast.Attribute) and node.attr in INTROSPECTION_ATTRS:
            self._unverifiable(node, f"`{node.attr}` reaches interpreter internals", node.attr)
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and fold_str(node.slice) is None:
            for base in self._resolve(node.value):
                if self._kind(base) is Kind.STATE or base == "builtins":
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
        if isinstance(root, Opaque):
            self._opaque(node, f"`*` takes the names {module} binds, and the value of {root.name}", root)
        elif root:
            message = f"forbidden import of {root}: `*` takes the names {module} binds from it"
            self._report(node, Rule.FORBIDDEN_IMPORT, f"{message} (`{_snippet(self.lines, node)}`)", root)

    def _visit_reference(self, node: ast.AST) -> None:
        resolved = self._resolve(node)
        for dotted in resolved:
            if self._forbidden(node, dotted, "forbidden reference to"):
                break
        for dotted in sorted(resolved):
            kind = self._kind(dotted)
            if kind and not self._use_is_followed(node, kind):
                self._unverifiable(node, f"{dotted} is passed on where its use cannot be followed", dotted)

    def _use_is_followed(self, node: ast.AST, kind: Kind) -> bool:
        """Whether the use of a sensitive object or callable at ``node`` is one this checker follows."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            return True
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return True
        if self._alias_assignment(parent)[1] is node:
            return True
        if kind not in (Kind.MODULE, Kind.STATE):
            return False
        if isinstance(parent, ast.Expr) or (isinstance(parent, ast.Subscript) and parent.value is node):
            return True
        if isinstance(parent, ast.Compare):
            return True
        if isinstance(parent, ast.Call) and node is not parent.func:
            functions = self._resolve(parent.func)
            if any(kind_of(f) is Kind.MODULE_IMPORTER for f in functions):
                return True  # __import__(name, globals()): only __package__ is read, and the name is checked
            inspectors = GETATTR_LIKE | {"builtins.vars", "builtins.hasattr"}
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
                if dotted in STATE_OBJECTS or head in (SENSITIVE_MODULES - {"sys"}) | STATE_OBJECTS:
                    self._unverifiable(target, f"changes {dotted}", dotted)
        elif isinstance(target, ast.Subscript):
            for base in self._resolve(target.value):
                if base in STATE_OBJECTS - {GLOBALS} or base == "builtins":
                    self._unverifiable(target, f"changes {base}", base)

    def _visit_call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("__getattribute__", "__getattr__"):
            owners = sorted(d for d in self._resolve(node.func.value) if self._kind(d) in (Kind.MODULE, Kind.STATE))
            if owners and (len(node.args) != 1 or fold_str(node.args[0]) is None):
                self._unverifiable(node, f"{node.func.attr} with a computed name on {owners[0]}", owners[0])
        for function in sorted(self._resolve(node.func)):
            kind = self._kind(function)
            state = function.removesuffix(".get")
            if state != function and self._kind(state) is Kind.STATE and self._constant_key(node) is None:
                self._unverifiable(node, f"a computed key into {state}", state)  # as `sys.modules[key]`
            if kind is Kind.CODE:
                self._unverifiable(node, f"{function} runs code built at run time", function)
            elif kind is Kind.MODULE_IMPORTER:
                self._check_module_importer(node, function)
            elif kind is Kind.PATH_LOADER:
                self._check_path_loader(node, function)
            elif kind is Kind.GETATTR:
                self._check_getattr(node, function)
            elif kind is Kind.IMPORT_STATE:
                self._unverifiable(node, f"{function} reads or changes the import system's state", function)
            elif kind is Kind.MACHINERY:
                self._unverifiable(node, f"{function} is import machinery this check does not follow", function)

    def _constant_key(self, node: ast.Call) -> str | None:
        """The key of a ``mapping.get(key, …)`` call when it is a constant; else None."""
        args = self._bind(node, ("key", "default"))
        return None if args is None else fold_str(args.get("key"))

    def _bind(self, node: ast.Call, params: Sequence[str]) -> dict[str, ast.expr] | None:
        """Arguments by parameter name; None when ``*args``/``**kwargs`` hide them."""
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return None
        bound = dict(zip(params, node.args, strict=False))  # extra positionals are the caller's TypeError
        bound.update({k.arg: k.value for k in node.keywords if k.arg})
        return bound

    def _dynamic_targets(self, node: ast.Call, function: str) -> tuple[str, list[str]] | None:
        """``(absolute module name, fromlist)`` of a dynamic import when both are constants."""
        params = MODULE_IMPORTERS[function]
        args = self._bind(node, params)
        if args is None:
            return None
        name = fold_str(args.get(params[0]))
        fromlist = fold_str_list(args.get("fromlist"))
        level = fold_int(args.get("level"), 0)
        if name is None or fromlist is None or level is None:
            return None
        if function.endswith("__import__"):
            absolute = resolve_relative(name, level, self.module_name, self.is_package) if level else name
        elif name.startswith("."):
            package = fold_str(args.get("package"))
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
        params = PATH_LOADERS[function]
        args = self._bind(node, params)
        if args is None:
            self._unverifiable(node, f"the file {function} loads is not a constant", function)
            return
        label = fold_str(args.get(params[0])) if params[0] not in PATH_PARAMS else None
        if label is not None and self._forbidden(node, label, "forbidden dynamic import of"):
            return
        path_node = next((args[p] for p in params if p in PATH_PARAMS and p in args), None)
        if path_node is None:
            return
        path = fold_path(path_node, self.filename, self._resolve)
        if path is None:
            self._unverifiable(node, f"the file {function} loads is not a constant", function)
            return
        path = posixpath.normpath(path.replace("\\", "/"))
        for part in PurePosixPath(path).parts:
            if part in ("gla", "kda", "gla.py", "kda.py"):
                root = f"fla.ops.{part.removesuffix('.py')}"
                message = f"forbidden dynamic import of {root}: loads {path} (`{_snippet(self.lines, node)}`)"
                self._report(node, Rule.FORBIDDEN_IMPORT, message, root)
                return

    def _check_getattr(self, node: ast.Call, function: str) -> None:
        if function in ("operator.attrgetter", "operator.methodcaller"):
            if not node.args or fold_str(node.args[0]) is None:
                self._unverifiable(node, f"{function} with a computed name", function)
            return
        if len(node.args) < 2 or any(isinstance(a, ast.Starred) for a in node.args):
            self._unverifiable(node, f"{function} with arguments that cannot be read", function)
            return
        objects = self._resolve(node.args[0])
        sensitive = sorted(d for d in objects if self._kind(d) in (Kind.MODULE, Kind.STATE))
        name = fold_str(node.args[1])
        if function in ("builtins.setattr", "builtins.delattr"):
            if sensitive:
                self._unverifiable(node, f"{function} changes {sensitive[0]}", function)
        elif name is None and sensitive:
            self._unverifiable(node, f"{function} with a computed name on {sensitive[0]}", function)
        elif name in INTROSPECTION_ATTRS:
            self._unverifiable(node, f"`{name}` reaches interpreter internals", name)


def find_forbidden_imports(
    tree: ast.Module, source: str, module_name: str, filename: str, reexports: ReexportIndex, deadline: Deadline
) -> list[Finding]:
    """Forbidden and unverifiable imports in one parsed file, by line.

    ``source`` is the text ``tree`` was parsed from (messages quote it); ``module_name`` the file's
    dotted module (relative imports resolve against it); ``filename`` its repo-relative path.
    Raises :class:`~quasar.imports.budget.OverBudget` once ``deadline`` has passed.
    """
    return _ForbiddenImportChecker(tree, source, module_name, filename, reexports, deadline).run()


def check_source(
    source: str,
    module_name: str,
    filename: str,
    reexports: ReexportIndex | None = None,
    budget_s: float = CHECK_BUDGET_S,
) -> list[Finding]:
    """Forbidden and unverifiable imports in one file's text (parse problems as findings too).

    ``module_name`` is the file's dotted module (relative imports resolve against it); a
    ``filename`` ending in ``__init__.py`` makes it a package. ``reexports`` finds names other
    modules bind from gla/kda; without it only direct references count. A check that runs past
    ``budget_s`` seconds is an ``unverifiable-import`` finding.
    """
    deadline = Deadline(budget_s)
    parsed = parse_source(source, filename)
    if isinstance(parsed, Finding):
        return [parsed]
    try:
        return find_forbidden_imports(
            parsed, source, module_name, filename, reexports or ReexportIndex.from_files({}), deadline
        )
    except OverBudget:
        return [deadline.finding(filename)]
