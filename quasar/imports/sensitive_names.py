"""What dotted names mean to the import check: the objects that lead to forbidden modules or to the
import system, and the calls that import, load files, look up attributes by name or run code.

:func:`kind_of` sorts a resolved name (``importlib.import_module``, ``sys.modules``,
``builtins.exec`` …) into a :class:`Kind`; the forbidden-import checker decides from the kind what
a use of that name needs in order to be verifiable.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from enum import Enum

from quasar.imports.layout import has_prefix

BUILTIN_NAMES = frozenset(dir(builtins))
GLOBALS = "<globals>"  # what globals(), locals() and vars() without arguments resolve to

# Modules whose attributes lead to forbidden modules or to the import system.
SENSITIVE_MODULES = frozenset(
    {"fla", "fla.ops", "builtins", "sys", "importlib", "importlib.util", "importlib.machinery"}
)
# Mappings and lists that hold or steer imports; reading them with a constant key is fine.
STATE_OBJECTS = frozenset(
    {"sys.modules", "sys.path", "sys.meta_path", "sys.path_hooks", "sys.path_importer_cache", GLOBALS}
    | {f"{module}.__dict__" for module in SENSITIVE_MODULES}
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
# Also those that run a string as code: string annotations are evaluated, a timeit statement or a
# doctest executed, a profiler's or debugger's statement run.
_CODE_RUNNER_PREFIXES = (
    "code",
    "codeop",
    "ctypes.pythonapi",
    "typing.get_type_hints",
    "typing.ForwardRef",
    "typing_extensions.get_type_hints",
    "inspect.get_annotations",
    "timeit.Timer",
    "timeit.timeit",
    "timeit.repeat",
    "timeit.main",
    "doctest",
    "pdb.run",
    "pdb.runeval",
    "pdb.runctx",
    "cProfile.run",
    "cProfile.runctx",
    "profile.run",
    "profile.runctx",
    "trace.Trace",
)

# Importers taking a module name: their parameters, by position.
MODULE_IMPORTERS = {
    "importlib.import_module": ("name", "package"),
    "importlib.util.find_spec": ("name", "package"),
    "builtins.__import__": ("name", "globals", "locals", "fromlist", "level"),
    "importlib.__import__": ("name", "globals", "locals", "fromlist", "level"),
    "runpy.run_module": ("mod_name", "init_globals", "run_name", "alter_sys"),
}
# Loaders taking a file path: their parameters, by position; the path is the one in PATH_PARAMS.
PATH_LOADERS = {
    "importlib.util.spec_from_file_location": ("name", "location"),
    "importlib.machinery.SourceFileLoader": ("fullname", "path"),
    "importlib.machinery.SourcelessFileLoader": ("fullname", "path"),
    "importlib.machinery.ExtensionFileLoader": ("fullname", "path"),
    "runpy.run_path": ("path_name", "init_globals", "run_name"),
}
PATH_PARAMS = ("location", "path", "path_name")
GETATTR_LIKE = frozenset(
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
# Importers in disguise: each imports a module a string names (``pydoc.locate("a.b")``, an entry
# point's ``load()``, logging's configurator resolving ``"a.b"``, ``mock.patch("a.b")``).
_DISGUISED_IMPORTERS = (
    "pydoc",
    "logging.config",
    "unittest.mock.patch",
    "importlib.metadata.EntryPoint",
    "importlib.metadata.EntryPoints",
    "importlib.metadata.entry_points",
    "importlib.metadata.distribution",
    "importlib.metadata.distributions",
    "importlib.metadata.Distribution",
)
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
# Attributes that reach interpreter internals, from which any module can be loaded (a built-in
# function's __self__ is its module: print.__self__ is builtins).
INTROSPECTION_ATTRS = frozenset(
    {"__subclasses__", "__globals__", "__builtins__", "__loader__", "__self__", "f_globals", "f_builtins", "f_locals"}
)
# Roots of dotted names worth remembering through assignments (besides a file's own imports).
SENSITIVE_ROOTS = frozenset(
    {"fla", "builtins", "sys", "site", "operator", "marshal", "pickle", "types", "code", "codeop", "ctypes", GLOBALS}
    | set(_MACHINERY_MODULES)
    | {name.split(".")[0] for name in _CODE_RUNNER_PREFIXES + _DISGUISED_IMPORTERS}
)


class Kind(Enum):
    """How a resolved name matters to the check."""

    MODULE = "module"  # a module whose attributes lead to gla/kda or the import system
    STATE = "state"  # a mapping or list that holds or steers imports (sys.modules, globals() …)
    CODE = "code"  # runs code built at run time (exec, marshal.loads …)
    MODULE_IMPORTER = "module-importer"  # imports a module by name (importlib.import_module …)
    PATH_LOADER = "path-loader"  # loads a module from a file path (runpy.run_path …)
    GETATTR = "getattr"  # looks an attribute up by name (getattr, operator.attrgetter …)
    IMPORT_STATE = "import-state"  # reads or changes a state object other than by a constant key
    MACHINERY = "machinery"  # other import machinery, not followed


def _no_module(_dotted: str) -> bool:
    return False


def kind_of(dotted: str, is_fork_module: Callable[[str], bool] = _no_module) -> Kind | None:
    """How a resolved name matters: a sensitive object, or the kind of call it makes; None if harmless.

    ``is_fork_module`` says whether a name is a module of the fork (``fla``'s or another): one is
    sensitive too (any name it binds, submodules included, is one computed look-up away), and its
    ``__dict__`` a state object."""
    if dotted in SENSITIVE_MODULES or is_fork_module(dotted):
        return Kind.MODULE
    owner, namespace, attribute = dotted.partition(".__dict__")
    if namespace and attribute[:1] in ("", ".") and is_fork_module(owner):
        dotted = f"{GLOBALS}{attribute}"  # a module's namespace is read like globals()
    if dotted in STATE_OBJECTS:
        return Kind.STATE
    if dotted in _CODE_RUNNERS or any(has_prefix(dotted, p) for p in _CODE_RUNNER_PREFIXES):
        return Kind.CODE
    if dotted in MODULE_IMPORTERS:
        return Kind.MODULE_IMPORTER
    if dotted in PATH_LOADERS:
        return Kind.PATH_LOADER
    if dotted in GETATTR_LIKE:
        return Kind.GETATTR
    for state in STATE_OBJECTS:
        if dotted.startswith(state + "."):
            attribute = dotted[len(state) + 1 :]
            return None if attribute in _READ_ONLY_STATE_ATTRS else Kind.IMPORT_STATE
    if dotted == "site.addsitedir":
        return Kind.IMPORT_STATE
    if any(has_prefix(dotted, p) for p in _DISGUISED_IMPORTERS):
        return Kind.MACHINERY
    if any(has_prefix(dotted, p) for p in _HARMLESS_MACHINERY):
        return None
    if any(has_prefix(dotted, p) for p in _MACHINERY_MODULES):
        return Kind.MACHINERY
    return None
