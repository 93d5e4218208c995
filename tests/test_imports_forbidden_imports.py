"""The forbidden-import checker (quasar/imports/forbidden_imports.py): every form of import of gla/kda
is found, what cannot be followed is refused, and look-alikes pass.

Most cases change one line of a clean fork (tests/import_forks.py) and check the report names the
right file, line and rule. A reference test executes random import statements for real in a
subprocess and compares what got loaded with the static verdict.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quasar.imports import validate_repo
from quasar.imports.findings import Finding, Rule
from quasar.imports.forbidden_imports import check_source
from quasar.imports.reexports import ReexportIndex
from tests.import_forks import (
    CHUNK,
    FORK_FILES,
    LAYER,
    STRICT_CHUNK,
    check_one_change,
    error_keys,
    make_fork,
    marked_lines,
)

# --- forbidden imports in every form ------------------------------------------------------------------

FORBIDDEN_CASES = {
    "import": "import fla.ops.gla  # <-\n",
    "import-submodule": "import fla.ops.kda.chunk  # <-\n",
    "import-as": "import fla.ops.kda as k  # <-\n",
    "import-among-others": "import os, fla.ops.gla, sys  # <-\n",
    "from-import": "from fla.ops.gla import chunk_gla  # <-\n",
    "from-submodule-import": "from fla.ops.kda.chunk import helper  # <-\n",
    "from-ops-import-kda": "from fla.ops import kda  # <-\n",
    "from-ops-import-gla-as": "from fla.ops import gla as g  # <-\n",
    "from-ops-import-together": "from fla.ops import (  # <-\n    utils,\n    kda,\n)\n",
    "relative-parent": "from .. import kda  # <-\n",
    "relative-sibling-package": "from ..gla import chunk_gla  # <-\n",
    "relative-submodule": "from ..kda.chunk import helper  # <-\n",
    "relative-from-top": "from ...ops.kda import chunk_kda  # <-\n",
    "reexported-name": "from fla.ops import chunk_kda  # <-\n",
    "reexported-name-relative": "from .. import chunk_gla as cg  # <-\n",
    "star-from-reexporting-package": "from fla.ops import *  # <-\n",
    "star-dynamic": "__import__('fla.ops', fromlist=['*'])  # <-\n",
    "inside-function": "def f():\n    from fla.ops.kda import chunk_kda  # <-\n    return chunk_kda()  # <-\n",
    "inside-class": "class C:\n    import fla.ops.gla as backend  # <-\n",
    "type-checking-block": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fla.ops.gla import x  # <-\n",
    "try-except": "try:\n    import fla.ops.kda  # <-\nexcept ImportError:\n    pass\n",
    "importlib": "import importlib\nimportlib.import_module('fla.ops.kda')  # <-\n",
    "importlib-concat": "import importlib\nmod = importlib.import_module('fla.ops.' + 'kda')  # <-\n",
    "importlib-fstring": "import importlib\nimportlib.import_module(f\"{'fla'}.ops.{'gla'}\")  # <-\n",
    "importlib-join": "import importlib\nimportlib.import_module('.'.join(['fla', 'ops', 'kda']))  # <-\n",
    "importlib-relative": "import importlib\nimportlib.import_module('.kda', 'fla.ops')  # <-\n",
    "importlib-relative-two-levels": "import importlib\nimportlib.import_module('..kda', 'fla.ops.quasar')  # <-\n",
    "importlib-keyword": "import importlib\nimportlib.import_module(name='fla.ops.gla.chunk')  # <-\n",
    "import-module-alias": "from importlib import import_module as im\nim('fla.ops.gla')  # <-\n",
    "import-module-assigned": "import importlib\nload = importlib.import_module\nload('fla.ops.kda')  # <-\n",
    "dunder-import": "__import__('fla.ops.kda')  # <-\n",
    "dunder-import-fromlist": "__import__('fla.ops', fromlist=['gla'])  # <-\n",
    "dunder-import-relative": "__import__('', globals(), None, ['kda'], 2)  # <-\n",
    "dunder-import-attribute": "__import__('fla').ops.kda  # <-\n",
    "builtins-import": "import builtins\nbuiltins.__import__('fla.ops.kda')  # <-\n",
    "importlib-dunder-import": "import importlib\nimportlib.__import__('fla.ops.gla')  # <-\n",
    "globals-builtins": "globals()['__builtins__']['__import__']('fla.ops.kda')  # <-\n",
    "find-spec": "import importlib.util\nimportlib.util.find_spec('fla.ops.kda')  # <-\n",
    "attribute-path": "import fla.ops\nfla.ops.kda.chunk_kda()  # <-\n",
    "attribute-via-from": "from fla import ops\nops.gla  # <-\n",
    "getattr-constant": "import fla.ops\nbackend = getattr(fla.ops, 'kd' + 'a')  # <-\n",
    "sys-modules": "import sys\nsys.modules['fla.ops.kda']  # <-\n",
    "object-getattribute": "import fla.ops\nobject.__getattribute__(fla.ops, 'kda')  # <-\n",
    "vars-builtins": "vars()['__builtins__']['__import__']('fla.ops.kda')  # <-\n",
    "locals-builtins": "locals()['__builtins__']['__import__']('fla.ops.gla')  # <-\n",
    # __import__ of a dotted name returns its top package.
    "dunder-import-dotted-attribute": "__import__('fla.ops.quasar').ops.kda  # <-\n",
    "file-loader-module": (
        "import importlib.util\nspec = importlib.util.spec_from_file_location(  # <-\n    'k', 'fla/ops/gla.py')\n"
    ),
    "file-loader-named-kda": (
        "import importlib.util\nspec = importlib.util.spec_from_file_location(  # <-\n"
        "    'fla.ops.kda', 'fla/ops/quasar/gate.py')\n"
    ),
    "file-loader-backslashes": (
        "import importlib.util\nspec = importlib.util.spec_from_file_location(  # <-\n"
        "    'k', 'fla\\\\ops\\\\kda\\\\chunk.py')\n"
    ),
    "file-loader": (
        "import importlib.util\nimport os\n"
        "spec = importlib.util.spec_from_file_location(  # <-\n"
        "    'k', os.path.join(os.path.dirname(__file__), '..', 'kda', 'chunk.py'))\n"
    ),
}


@pytest.mark.parametrize("snippet", FORBIDDEN_CASES.values(), ids=FORBIDDEN_CASES.keys())
def test_forbidden_import_in_chunk(tmp_path, snippet):
    report = check_one_change(tmp_path, CHUNK, snippet, Rule.FORBIDDEN_IMPORT)
    message = str(report.errors[0])
    assert message.startswith(f"{CHUNK}:{marked_lines(FORK_FILES[CHUNK] + snippet)[0]}: forbidden-import:")
    assert "fla.ops.kda" in message or "fla.ops.gla" in message


def test_relative_import_from_the_layer_resolves_against_fla_layers(tmp_path):
    check_one_change(tmp_path, LAYER, "from ..ops import gla  # <-\n", Rule.FORBIDDEN_IMPORT)


def test_the_message_names_file_line_rule_and_statement(tmp_path):
    text = FORK_FILES[CHUNK] + "from fla.ops import kda\n"
    report = validate_repo(make_fork(tmp_path, {CHUNK: text}))
    line = len(text.splitlines())
    assert [str(f) for f in report.errors] == [
        f"{CHUNK}:{line}: forbidden-import: forbidden import of fla.ops.kda (`from fla.ops import kda`)"
    ]


# --- what cannot be verified -------------------------------------------------------------------------

UNVERIFIABLE_CASES = {
    "importlib-variable": "import importlib\nname = 'fla.ops.kda'\nimportlib.import_module(name)  # <-\n",
    "importlib-computed": "import importlib\nimportlib.import_module('fla.ops.' + 'kda'.upper())  # <-\n",
    "importlib-relative-variable-package": "import importlib\nimportlib.import_module('..kda', __package__)  # <-\n",
    "importlib-star-args": "import importlib\nargs = ['fla.ops.kda']\nimportlib.import_module(*args)  # <-\n",
    "dunder-import-variable": "def load(name):\n    return __import__(name)  # <-\n",
    "dunder-import-fromlist-variable": "items = ['kda']\n__import__('fla.ops', fromlist=items)  # <-\n",
    "exec": "exec('from fla.ops import kda')  # <-\n",
    "eval": "value = eval('1 + 1')  # <-\n",
    "compile": "code = compile('import fla', 'x', 'exec')  # <-\n",
    "exec-via-getattr": "import builtins\ngetattr(builtins, 'ex' + 'ec')('x = 1')  # <-\n",
    "sys-path-insert": "import sys\nsys.path.insert(0, 'fla/ops')  # <-\nimport kda\n",
    "sys-path-assign": "import sys\nsys.path = ['fla/ops'] + sys.path  # <-\n",
    "sys-modules-assign": "import sys\nsys.modules['x'] = sys  # <-\n",
    "sys-modules-values": "import sys\nmods = list(sys.modules.values())  # <-\n",
    "sys-modules-computed": "import sys\nkey = 'fla.ops.kda'\nsys.modules[key]  # <-\n",
    "sys-modules-get-computed": "import sys\nkey = 'fla.ops.kda'\nsys.modules.get(key)  # <-\n",
    "builtins-dict-get-computed": "import builtins\nname = '__import__'\nbuiltins.__dict__.get(name)  # <-\n",
    "getattr-computed": "import fla.ops\nname = 'kda'\ngetattr(fla.ops, name)  # <-\n",
    "getattribute-computed": "import fla.ops\nname = 'kda'\nfla.ops.__getattribute__(name)  # <-\n",
    "module-passed-on": "import inspect\nimport fla.ops\ninspect.getmembers(fla.ops)  # <-\n",
    "importer-passed-on": "import importlib\nmods = list(map(importlib.import_module, ['os']))  # <-\n",
    "importer-in-class-attribute": "import importlib\nclass Loader:\n    load = importlib.import_module  # <-\n",
    "machinery": "from importlib.machinery import PathFinder\nPathFinder.find_spec('kda', ['fla/ops'])  # <-\n",
    "pkgutil": "import pkgutil\nlist(pkgutil.walk_packages(['fla/ops']))  # <-\n",
    "file-loader-variable": "import importlib.util\np = 'x.py'\nimportlib.util.spec_from_file_location('m', p)  # <-\n",
    "subclasses": "loaders = ().__class__.__base__.__subclasses__()  # <-\n",
    # A built-in function's __self__ is its module: print's is builtins, with its __import__.
    "builtin-function-self": "print.__self__.__import__('fla.ops.kda')  # <-\n",
    "builtin-function-self-getattr": "getattr(len, '__self__').__import__('fla.ops.gla')  # <-\n",
    "frame-globals": "import sys\nsys._getframe().f_globals  # <-\n",
    "builtins-assign": "import builtins\nbuiltins.__import__ = print  # <-\n",
    "setattr-builtins": "import builtins\nsetattr(builtins, 'x', 1)  # <-\n",
    "marshal": "import marshal\nmarshal.loads(b'')  # <-\n",
    # Code runners and importers in disguise: each runs or imports a string built at run time.
    "type-hints-eval": "import typing\ndef f(x: 'int'): pass\nhints = typing.get_type_hints(f)  # <-\n",
    "annotations-eval": "import inspect\ndef f(x: 'int'): pass\nh = inspect.get_annotations(f, eval_str=1)  # <-\n",
    "timeit-exec": "from timeit import Timer\nTimer('import os').timeit(1)  # <-\n",
    "pydoc-locate": "import pydoc\nname = 'os'\nthing = pydoc.locate(name)  # <-\n",
    "entry-point-load": "from importlib.metadata import EntryPoint\nEntryPoint('x', 'os:sep', 'g').load()  # <-\n",
    "logging-config-resolve": "import logging.config\nlogging.config.BaseConfigurator({}).resolve('os.sep')  # <-\n",
    "mock-patch": "from unittest import mock\npatcher = mock.patch('os.sep', '/')  # <-\n",
    "builtins-computed-key": "key = '__import__'\n__builtins__[key]('fla.ops.kda')  # <-\n",
    "importer-through-getattr": "import importlib\ngetattr(importlib.import_module, '__call__')('fla.ops.kda')  # <-\n",
    "builtins-item-assign": "__builtins__['open'] = print  # <-\n",
    "getattribute-keywords": "import fla.ops\nfla.ops.__getattribute__(**{'name': 'kda'})  # <-\n",
    "dunder-import-star-fromlist": "rest = [None, None, ['kda']]\n__import__('fla.ops', *rest)  # <-\n",
    "attrgetter-computed": "import operator\nname = 'kda'\nlookup = operator.attrgetter(name)  # <-\n",
    "delattr-builtins": "import builtins\ndelattr(builtins, 'open')  # <-\n",
    "getattr-introspection": "subclasses = getattr(object, '__subclasses__')  # <-\n",
    "getattr-starred": "getattr(*[print], 'x')  # <-\n",
    "code-runner-inspected": "name = '__self__'\ngetattr(exec, name).__import__('fla.ops.kda')  # <-\n",
    "module-passed-to-print": "import fla.ops\nprint(fla.ops)  # <-\n",
    "module-as-getattr-default": "import fla.ops\nbackend = getattr(None, 'missing', fla.ops)  # <-\n",
    # The module also lands in an attribute, where `holder.ops.kda` would not be followed.
    "module-stored-beside-a-name": (
        "import fla.ops\nclass Holder:\n    pass\nholder = Holder()\nalias = holder.ops = fla.ops  # <-\n"
    ),
}


@pytest.mark.parametrize("snippet", UNVERIFIABLE_CASES.values(), ids=UNVERIFIABLE_CASES.keys())
def test_unverifiable_code_is_an_error(tmp_path, snippet):
    report = check_one_change(tmp_path, CHUNK, snippet, Rule.UNVERIFIABLE_IMPORT)
    assert "cannot be verified" in report.errors[0].message


# A module of the fork that the check does not check binds kda's function (upstream's fla/ops/__init__.py
# does): a name looked up in it, or in a module it binds, by a computed name reaches that function.
HELPERS = {"fla/ops/utils/helpers.py": "import fla.ops as o\nfrom fla.ops.kda import chunk_kda\nhelper = 1\n"}
COMPUTED = "''.join(reversed('adk_knuhc'))"
FORK_MODULE_LOOKUPS = {
    "getattr": f"from fla.ops.utils import helpers\nout = getattr(helpers, {COMPUTED})  # <-\n",
    "dict-key": f"import fla.ops.utils.helpers as h\nout = h.__dict__[{COMPUTED}]  # <-\n",
    "vars-key": f"import fla.ops.utils.helpers as h\nout = vars(h)[{COMPUTED}]  # <-\n",
    "getattribute": f"import fla.ops.utils.helpers as h\nout = h.__getattribute__({COMPUTED})  # <-\n",
    "dict-items": "import fla.ops.utils.helpers as h\nout = [v for k, v in h.__dict__.items()]  # <-\n",
    "passed-on": "import inspect\nimport fla.ops.utils.helpers as h\nout = inspect.getmembers(h)  # <-\n",
    "module-it-binds": f"from fla.ops.utils import helpers\nout = getattr(helpers.o, {COMPUTED})  # <-\n",
    "package-of-submodules": f"import fla.ops.utils as u\nout = getattr(u, {COMPUTED})  # <-\n",
}


@pytest.mark.parametrize("snippet", FORK_MODULE_LOOKUPS.values(), ids=FORK_MODULE_LOOKUPS.keys())
def test_computed_lookup_on_a_module_of_the_fork_that_binds_kda(tmp_path, snippet):
    text = FORK_FILES[CHUNK] + snippet
    report = validate_repo(make_fork(tmp_path, {**HELPERS, CHUNK: text}))
    assert error_keys(report) == {(CHUNK, line, Rule.UNVERIFIABLE_IMPORT) for line in marked_lines(text)}


def test_a_module_beside_fla_taken_by_from_import_and_assigned_is_followed(tmp_path):
    beside = {"kernels/__init__.py": "", "kernels/util.py": "from fla.ops.kda import chunk_kda\n"}
    text = FORK_FILES[CHUNK] + "from kernels import util\nbackend = util\nbackend.chunk_kda()  # <-\n"
    report = validate_repo(make_fork(tmp_path, {**beside, CHUNK: text}))
    assert error_keys(report) == {(CHUNK, line, Rule.FORBIDDEN_IMPORT) for line in marked_lines(text)}


def test_a_call_of_a_modules_own_getattr_is_followed_to_it(tmp_path):
    # The name comes from helpers' module __getattr__, whose value the check cannot follow.
    helpers = "def __getattr__(name):\n    import fla.ops.kda as k\n    return getattr(k, name)\n"
    text = FORK_FILES[CHUNK] + "from fla.ops.utils import helpers\nout = helpers.__getattr__('chunk_kda')  # <-\n"
    report = validate_repo(make_fork(tmp_path, {"fla/ops/utils/helpers.py": helpers, CHUNK: text}))
    assert error_keys(report) == {(CHUNK, line, Rule.UNVERIFIABLE_IMPORT) for line in marked_lines(text)}


@pytest.mark.parametrize("lookup", ["h.__dict__.get('chunk_kda')", "vars(h).get('chunk_kda')"])
def test_constant_lookup_in_the_namespace_of_a_module_of_the_fork(tmp_path, lookup):
    text = FORK_FILES[CHUNK] + f"import fla.ops.utils.helpers as h\nout = {lookup}  # <-\n"
    report = validate_repo(make_fork(tmp_path, {**HELPERS, CHUNK: text}))
    assert error_keys(report) == {(CHUNK, line, Rule.FORBIDDEN_IMPORT) for line in marked_lines(text)}


def test_constant_lookups_on_modules_of_the_fork_pass(tmp_path):
    text = (
        FORK_FILES[CHUNK]
        + "from fla.ops.utils import helpers\nout = (getattr(helpers, 'helper'), vars(helpers).get('helper'))\n"
    )
    assert validate_repo(make_fork(tmp_path, {**HELPERS, CHUNK: text})).ok


def test_relative_import_above_the_top_level_package(tmp_path):
    check_one_change(tmp_path, CHUNK, "from .... import anything  # <-\n", Rule.BAD_RELATIVE_IMPORT)


# --- look-alikes and ordinary code that must pass -------------------------------------------------------

PASSING_SNIPPETS = {
    "gla-utils": "import fla.ops.gla_utils\nfrom fla.ops.gla_utils import helper\n",
    "from-ops-lookalikes": "from fla.ops import gla_utils, kda_like as gla\ngla.helper\n",
    "comment": "# from fla.ops.kda import x\n# import fla.ops.gla\n",
    "strings-and-docstrings": (
        "def f():\n    '''Uses `from fla.ops.gla import chunk_gla` in the paper.'''\n"
        "    return 'import fla.ops.kda; __import__(\"fla.ops.gla\")'\n"
    ),
    "quasar-gla-module": "from . import gate as gla\nfrom fla.ops.quasar import gate\n",
    "star-from-clean-module": "from fla.ops.utils.index import *\nfrom fla.utils import *\n",
    "local-names": "kda = 1\ngla = kda + 1\n\n\ndef f(kda):\n    return kda.gla\n",
    "constant-dynamic-imports": (
        "import importlib\nimport importlib.metadata\n"
        "cuda = importlib.import_module('fla.ops.quasar.' + 'gate')\n"
        "version = importlib.metadata.version('torch')\n"
    ),
    "ordinary-dynamic-code": (
        "import re\nimport torch\nfast = torch.compile(lambda x: x)\npattern = re.compile('x')\n"
        "name = 'float16'\ndtype = getattr(torch, name)\ncfg = {}\nvalue = cfg.get(name)\n"
    ),
    "extension-loader": (
        "import importlib.util\nimport os\n"
        "spec = importlib.util.spec_from_file_location(\n"
        "    'chunk_cuda', os.path.join(os.path.dirname(__file__), 'chunk_cuda.so'))\n"
        "module = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(module)\n"
    ),
    "sys-modules-read": "import sys\nloaded = 'fla.ops.quasar' in sys.modules\nsys.modules.get('torch')\n",
    "optional-import": "try:\n    import chunk_cuda_ext as ext\nexcept ImportError:\n    ext = None\n",
    "sys-setting": "import sys\nsys.tracebacklimit = 0\n",
    "file-loader-through-a-folder": (
        "import importlib.util\nspec = importlib.util.spec_from_file_location('g', 'fla/ops/kda/../quasar/gate.py')\n"
    ),
    "globals-write": "globals()['helper'] = 1\n",
    # Only names that may stand for modules count toward a name's 16: a parameter's fields do not.
    "fields-of-a-parameter": "def f(options):\n" + "".join(f"    value = options.field{i}\n" for i in range(20)),
}


@pytest.mark.parametrize("snippet", PASSING_SNIPPETS.values(), ids=PASSING_SNIPPETS.keys())
def test_look_alikes_pass(tmp_path, snippet):
    report = validate_repo(make_fork(tmp_path, {CHUNK: FORK_FILES[CHUNK] + snippet}), profile="strict")
    assert report.ok, "\n".join(map(str, report.errors))


# --- the pure function ---------------------------------------------------------------------------


def test_check_source_reports_each_line_once_and_in_order():
    source = "import fla.ops.gla\n\nfrom fla.ops import kda\nkda.chunk_kda()\nexec('x')\n"
    findings = check_source(source, "fla.ops.quasar.chunk", CHUNK)
    assert [(f.line, f.rule) for f in findings] == [
        (1, Rule.FORBIDDEN_IMPORT),
        (3, Rule.FORBIDDEN_IMPORT),
        (4, Rule.FORBIDDEN_IMPORT),
        (5, Rule.UNVERIFIABLE_IMPORT),
    ]
    assert all(isinstance(f, Finding) and f.path == CHUNK for f in findings)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=300),
        st.lists(
            st.sampled_from(STRICT_CHUNK.splitlines(keepends=True) + list(FORBIDDEN_CASES.values())), max_size=30
        ).map("".join),
    )
)
def test_check_source_never_raises(text):
    for finding in check_source(text, "fla.ops.quasar.chunk", CHUNK):
        assert finding.path == CHUNK and isinstance(finding.rule, Rule)


def test_pathologically_nested_source_is_a_finding():
    deep = "x = " + "+".join(["'a'"] * 5000) + "\nimport importlib\nimportlib.import_module(x)\n"
    findings = check_source(deep, "fla.ops.quasar.chunk", CHUNK)
    assert findings and all(f.rule in (Rule.UNVERIFIABLE_IMPORT, Rule.SYNTAX_ERROR) for f in findings)


# --- the static verdict against what Python really imports ------------------------------------------

REFERENCE_MODULES = [
    "fla", "fla.ops", "fla.ops.gla", "fla.ops.gla.chunk", "fla.ops.kda", "fla.ops.kda.chunk",
    "fla.ops.gla_utils", "fla.ops.kda_like", "fla.ops.quasar", "fla.ops.quasar.gate",
    "fla.ops.utils", "fla.ops.utils.index", "fla.utils",
]  # fmt: skip

# Runs each statement for real as module fla.ops.quasar.probe of a fake fork, from a clean slate,
# and says whether fla.ops.gla or fla.ops.kda (or a module below them) got loaded.
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
verdicts = []
for statement in json.load(sys.stdin):
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        del sys.modules[name]
    exec(statement, {"__name__": "fla.ops.quasar.probe", "__package__": "fla.ops.quasar"})
    roots = ("fla.ops.gla", "fla.ops.kda")
    verdicts.append(any(m in roots or m.startswith(tuple(r + "." for r in roots)) for m in sys.modules))
print(json.dumps(verdicts))
"""
# The fake fork for the probe: every module defines `helper`, nothing imports gla/kda by itself.
REFERENCE_FORK = {
    "fla/__init__.py": "helper = 1\n",
    "fla/utils.py": "helper = 1\n",
    "fla/ops/__init__.py": "helper = 1\n",
    "fla/ops/quasar/__init__.py": "helper = 1\n",
    CHUNK: "helper = 1\n",
    "fla/ops/quasar/gate.py": "helper = 1\n",
}


def _split_literal(rng: random.Random, text: str) -> str:
    """``text`` as a constant expression of a random shape the validator must fold."""
    cut = rng.randrange(len(text) + 1)
    head, tail = text[:cut], text[cut:]
    shape = rng.randrange(4)
    if shape == 0:
        return repr(text)
    if shape == 1:
        return f"{head!r} + {tail!r}"
    if shape == 2:
        return f'f"{head}{{{tail!r}}}"'
    return f"'.'.join({text.split('.')!r})"


def _random_statement(rng: random.Random) -> str:
    module = rng.choice(REFERENCE_MODULES)
    parent, _, leaf = module.rpartition(".")
    form = rng.randrange(8)
    if form == 0:
        return f"import {module}"
    if form == 1:
        return f"import {module} as alias"
    if form == 2 and parent:
        return f"from {parent} import {leaf}"
    if form == 3:
        return f"from {module} import helper"
    if form == 4 and parent:
        # Relative to package fla.ops.quasar: one dot is fla.ops.quasar, two fla.ops, three fla.
        bases = {level: ".".join(["fla", "ops", "quasar"][: 4 - level]) for level in (1, 2, 3)}
        level = rng.choice([lvl for lvl, base in bases.items() if parent == base or parent.startswith(base + ".")])
        rest = parent[len(bases[level]) + 1 :]
        return f"from {'.' * level}{rest} import {leaf}"
    if form == 5:
        return f"importlib.import_module({_split_literal(rng, module)})"
    if form == 6 and parent:
        return f"__import__({_split_literal(rng, parent)}, fromlist=[{leaf!r}])"
    return f"__import__({_split_literal(rng, module)})"


def test_static_verdict_matches_real_imports(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    fork = make_fork(tmp_path, REFERENCE_FORK)
    statements = sorted({_random_statement(rng) for _ in range(160)})
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(fork)],
        input=json.dumps(["import importlib\n" + s for s in statements]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = json.loads(probe.stdout)
    index = ReexportIndex.from_files(REFERENCE_FORK)
    for statement, really_loaded in zip(statements, loaded, strict=True):
        findings = check_source(
            "import importlib\n" + statement, "fla.ops.quasar.probe", "fla/ops/quasar/probe.py", index
        )
        assert all(f.rule is Rule.FORBIDDEN_IMPORT for f in findings), (seed, statement, findings)
        assert bool(findings) == really_loaded, f"seed {seed}: {statement!r} loads gla/kda: {really_loaded}"
