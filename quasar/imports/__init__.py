"""Import validation of a QUASAR fork (docs/rules.md section 4 step 2), by parsing, never by substring.

``python -m quasar.imports REPO [--profile core|strict] [--require-cu] [--json]`` checks a fork
checked out at REPO; exit status 0 iff it passes, 1 if not, 2 for a usage error. Every message
names the file, the line where there is one, and the rule. From code: :func:`validate_repo` for a
checkout, :func:`check_source` and :func:`check_required_imports` for one file's text.

What is checked, and the module of this package that checks it:

* Files (rules ``missing-file``, ``unreadable-file``, ``encoding``, ``syntax-error``,
  ``symlink-outside-repo``, ``shadowed-source``; in ``repository``, the cookie and the parse in
  ``parsing``, which files in ``validate``). The five targets ``fla/ops/quasar/{chunk,
  chunk_intra_token_parallel, forward_substitution, fused_recurrent, gate}.py`` and
  ``fla/layers/quasar.py`` must exist, be UTF-8 (a PEP 263 cookie naming another encoding is
  refused: ``utf-7`` can hide code in what reads as a comment) and parse. Every other ``*.py``
  under ``fla/ops/quasar/`` is checked too, sub-folders included. A symlink leaving the repository
  is reported and never read; one into ``fla/ops/gla`` or ``fla/ops/kda`` is a forbidden import.
  What Python would load instead of the checked source is an error: a package folder or an
  extension module (``chunk*.so``) beside a checked ``.py``, and as ``unverifiable-import``
  ``*.pyc`` outside ``__pycache__`` and unchecked-hash ``.pyc`` files inside it.
* Forbidden imports (``forbidden-import``; in ``forbidden_imports``, re-exports followed by
  ``reexports``, constants folded by ``folding``), anywhere in those files, functions, classes and
  ``if TYPE_CHECKING:`` blocks included: whatever loads or names ``fla.ops.gla``, ``fla.ops.kda``
  or a module below them: ``import``, ``import … as``, ``from … import``, ``from fla.ops import
  kda``, relative forms (resolved against the file's own module; going above ``fla`` is a
  ``bad-relative-import``), attribute paths through imported names (``import fla.ops`` then
  ``fla.ops.kda``), ``getattr`` with a constant name, ``sys.modules`` with a constant key, names
  that another module of the fork (in ``fla`` or beside it: the fork's folder is first on the
  path) binds from them, followed through the fork's own files
  (``from fla.ops import chunk_kda`` when ``fla/ops/__init__.py`` imports it from ``.kda``, and
  then ``from fla.ops import *`` too), and the dynamic importers
  (``importlib.import_module``, ``__import__``, ``importlib.__import__``, ``builtins.__import__``,
  ``importlib.util.find_spec``, ``runpy.run_module``, and the file loaders
  ``importlib.util.spec_from_file_location``, ``importlib.machinery.*FileLoader``,
  ``runpy.run_path``) whose arguments fold to constants: literals, ``+`` of literals, f-strings
  of literals, ``"sep".join([literals])``, and for paths ``__file__`` with ``os.path`` /
  ``pathlib`` joins. Aliases are followed (``from importlib import import_module as im``,
  ``im = importlib.import_module``).
* Code that cannot be verified (``unverifiable-import``, an error as well; in ``forbidden_imports``,
  the names it watches listed in ``sensitive_names``): a dynamic import whose target does not fold
  to a constant; ``exec``/``eval``/``compile`` and other ways to run code built at run time
  (``marshal``, ``pickle``, ``types.FunctionType``, ``ctypes.pythonapi``, string annotations
  evaluated by ``typing.get_type_hints``, ``timeit`` statements …); other calls into the import
  machinery (``importlib``, ``imp``, ``pkgutil``, ``runpy``, ``zipimport``) outside a short list of
  harmless ones, and importers in disguise (``pydoc.locate``, entry points' ``load``,
  ``logging.config``, ``mock.patch``); an importer or ``getattr`` used other than by calling it
  (``map(__import__, names)``); changes to ``sys.path``, ``sys.meta_path``, ``sys.path_hooks``,
  ``sys.modules`` or ``builtins``; ``getattr`` with a computed name on ``fla``, ``fla.ops``,
  ``builtins``, ``sys`` or ``importlib`` or on any module of the fork (every name it binds is a
  look-up away), and a computed key (``[key]`` or ``.get(key)``) into ``sys.modules``, ``globals()``
  or the ``__dict__`` of those modules; those modules, ``sys.modules`` or ``globals()`` passed on to
  code whose use of them cannot be followed; introspection that reaches interpreter internals
  (``__subclasses__``, ``__globals__``, ``f_globals``, a built-in function's ``__self__`` …); a
  name that another module of the fork binds in a way ``reexports`` cannot follow (by an expression
  that may load a module at run time, to the import machinery, inside a function, by a ``match``
  pattern or a module ``__getattr__``, in a module it cannot read: the file Python would import is
  the one read, a package before a module, and an extension module, a sourceless ``.pyc`` or a
  coding cookie other than UTF-8 is unreadable; functions, classes, constants and ordinary calls
  are followed or pass). Comments, strings and docstrings are text, never imports.
* Bounds on the check's work (``unverifiable-import`` too, naming the bound; in
  ``forbidden_imports``, ``reexports`` and ``budget``): a name of a file may stand for at most 16
  modules or objects, the file's names for 20,000 in all, imports and assignments together; a path
  into the fork has at most 32 names; the whole check of a fork has a time budget
  (``CHECK_BUDGET_S``, 60 s), checked between its steps, after which it stops with an error on the
  file it was on.
* Required imports (``missing-required-import``, profile ``core`` by default or ``strict``; in
  ``required``, module level defined in ``parsing``): ``chunk.py`` imports every name of the profile
  at module level. Module level means a statement of the module body, also inside a module-level
  ``if`` (not under ``if TYPE_CHECKING:`` or a test that is constantly false: ``not True``,
  ``0 == 1``; nor in the ``else`` of one constantly true), ``with``, or the body, ``else`` or
  ``finally`` of a ``try`` (not its ``except`` handlers, which run only when the import failed), and
  never after a ``raise`` of its block. Inside a function or class does not count. Combined lines,
  aliases and relative forms count; ``from fla.utils import *`` does not. ``import
  torch.nn.functional as F`` is met by importing that module under any name, also as ``from torch.nn
  import functional``.
* At least one ``*.cu`` file in the repository, ``.git`` aside (``no-cu-file``; found in
  ``repository``, weighed in ``validate``): a warning, an error with ``require_cu``.

Names are followed without regard to scope or order: a name bound anywhere in a file to a
forbidden module or to the import machinery counts everywhere in that file. Only the files above
are checked; the rest of the fork (upstream's ``fla/ops/__init__.py`` imports gla and kda itself)
is read only to follow re-exports, and what its code does on import (``fla/layers/__init__.py``
runs before the layer, and could rebind a checked module's names) is not checked. This is a rule
on source text, not a sandbox: Python is too
dynamic for any static check to be complete, so what this package cannot follow it refuses. The
fork still runs only in the validator's sandbox, where the correctness check catches wrong kernels.

The other modules: ``layout`` (the fork's paths and module names), ``findings`` (:class:`Rule`,
:class:`Finding`, :class:`ImportReport`), ``cli`` (the command line).
"""

from quasar.imports.budget import CHECK_BUDGET_S
from quasar.imports.cli import main
from quasar.imports.findings import Finding, ImportReport, Rule
from quasar.imports.forbidden_imports import check_source
from quasar.imports.layout import (
    CHUNK_FILE,
    FORBIDDEN_MODULES,
    LAYER_FILE,
    QUASAR_DIR,
    TARGET_FILES,
    module_name_for,
    resolve_relative,
)
from quasar.imports.reexports import ReexportIndex
from quasar.imports.repository import MAX_SOURCE_BYTES
from quasar.imports.required import PROFILES, RequiredImport, check_required_imports
from quasar.imports.validate import validate_repo

__all__ = [
    "CHECK_BUDGET_S",
    "CHUNK_FILE",
    "FORBIDDEN_MODULES",
    "LAYER_FILE",
    "MAX_SOURCE_BYTES",
    "PROFILES",
    "QUASAR_DIR",
    "TARGET_FILES",
    "Finding",
    "ImportReport",
    "ReexportIndex",
    "RequiredImport",
    "Rule",
    "check_required_imports",
    "check_source",
    "main",
    "module_name_for",
    "resolve_relative",
    "validate_repo",
]
