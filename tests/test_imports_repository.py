"""The repository walk and the file rules (quasar/imports/repository.py): missing, unreadable and
non-UTF-8 files, symlinks out of the repository or into gla/kda, modules and bytecode that Python
would load instead of the checked source, and the ``*.cu`` file."""

from __future__ import annotations

import py_compile
import re
from pathlib import Path

import pytest

from quasar.imports import repository, validate_repo
from quasar.imports.findings import Rule
from tests.import_forks import CHUNK, FORK_FILES, LAYER, error_keys, make_fork

CHUNK_TEXT = FORK_FILES[CHUNK]
RULES = Path(__file__).resolve().parents[1] / "docs" / "rules.md"
# The five target files as docs/rules.md section 4 step 2 names them (not read from the constant
# they check): the file names of its line "the five target files exist and parse: ...".
_RULES_LINE = re.search(r"the five target files exist and parse:(.*?)\(and", RULES.read_text(), re.S)
assert _RULES_LINE is not None, "docs/rules.md no longer names the five target files"
TARGET_FILES = tuple(re.findall(r"`([a-z_]+\.py)`", _RULES_LINE.group(1)))
assert len(TARGET_FILES) == 5, TARGET_FILES

# --- missing files, encodings ---------------------------------------------------------------------


@pytest.mark.parametrize("name", TARGET_FILES)
def test_each_missing_target_is_named(tmp_path, name):
    relative = f"fla/ops/quasar/{name}"
    report = validate_repo(make_fork(tmp_path, {relative: None}))
    assert [str(f) for f in report.errors] == [f"{relative}: missing-file: is missing"]


def test_missing_layer_file(tmp_path):
    report = validate_repo(make_fork(tmp_path, {LAYER: None}))
    assert error_keys(report) == {(LAYER, None, Rule.MISSING_FILE)}


def test_missing_quasar_folder_names_all_five(tmp_path):
    overrides = {f"fla/ops/quasar/{name}": None for name in TARGET_FILES}
    overrides.update({"fla/ops/quasar/__init__.py": None, "fla/ops/quasar/quasar_stub.cu": None})
    report = validate_repo(make_fork(tmp_path, overrides))
    assert {f.path for f in report.errors} == {f"fla/ops/quasar/{name}" for name in TARGET_FILES}


def test_utf8_cookie_and_bom_are_fine(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/gate.py": "# -*- coding: utf-8 -*-\nx = 'é'\n"})
    (fork / "fla/ops/quasar/fused_recurrent.py").write_bytes(b"\xef\xbb\xbfimport torch\n")
    assert validate_repo(fork).ok


def test_invalid_utf8_names_file_and_line(tmp_path):
    fork = make_fork(tmp_path)
    (fork / "fla/ops/quasar/gate.py").write_bytes(b"import torch\n\nx = '\xff'\n")
    report = validate_repo(fork)
    assert error_keys(report) == {("fla/ops/quasar/gate.py", 3, Rule.ENCODING)}
    assert "0xff" in report.errors[0].message


# --- links ----------------------------------------------------------------------------------------


def test_symlink_outside_the_repo_is_reported_and_not_followed(tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text("import fla.ops.kda\n")
    fork = make_fork(tmp_path / "fork", {"fla/ops/quasar/gate.py": None})
    (fork / "fla/ops/quasar/gate.py").symlink_to(outside)
    report = validate_repo(fork)
    assert error_keys(report) == {("fla/ops/quasar/gate.py", None, Rule.SYMLINK_OUTSIDE_REPO)}


def test_symlinked_folder_outside_the_repo(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.py").write_text("import fla.ops.kda\n")
    fork = make_fork(tmp_path / "fork")
    (fork / "fla/ops/quasar/vendored").symlink_to(tmp_path / "elsewhere")
    report = validate_repo(fork)
    assert error_keys(report) == {("fla/ops/quasar/vendored", None, Rule.SYMLINK_OUTSIDE_REPO)}


def test_symlink_into_kda_is_a_forbidden_import(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/gate.py": None})
    (fork / "fla/ops/quasar/gate.py").symlink_to(fork / "fla/ops/kda/chunk.py")
    (fork / "fla/ops/quasar/kernels").symlink_to(Path("../gla"))
    report = validate_repo(fork)
    assert error_keys(report) == {
        ("fla/ops/quasar/gate.py", None, Rule.FORBIDDEN_IMPORT),
        ("fla/ops/quasar/kernels", None, Rule.FORBIDDEN_IMPORT),
    }


def test_symlink_inside_the_repo_is_read_and_checked_as_the_linking_module(tmp_path):
    fork = make_fork(tmp_path, {"fla/shared/impl.py": "import torch\n"})
    (fork / "fla/ops/quasar/impl.py").symlink_to(fork / "fla/shared/impl.py")
    report = validate_repo(fork)
    assert "fla/ops/quasar/impl.py" in report.checked_files and report.ok
    # As fla.ops.quasar.impl, `from ..kda` is fla.ops.kda (as fla.shared.impl it would not be).
    (fork / "fla/shared/impl.py").write_text("from ..kda import chunk_kda\n")
    assert error_keys(validate_repo(fork)) == {("fla/ops/quasar/impl.py", 1, Rule.FORBIDDEN_IMPORT)}


# --- what cannot be read --------------------------------------------------------------------------


def test_target_that_is_a_folder(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/gate.py": None})
    (fork / "fla/ops/quasar/gate.py").mkdir()
    report = validate_repo(fork)
    assert error_keys(report) == {("fla/ops/quasar/gate.py", None, Rule.UNREADABLE_FILE)}


def test_oversized_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(repository, "MAX_SOURCE_BYTES", 100)
    report = validate_repo(make_fork(tmp_path))
    assert (CHUNK, None, Rule.UNREADABLE_FILE) in error_keys(report)


# --- what Python would load instead of the checked source -----------------------------------------


@pytest.mark.parametrize(
    "shadow",
    [
        "fla/ops/quasar/chunk/__init__.py",
        "fla/ops/quasar/chunk.cpython-311-x86_64-linux-gnu.so",
        "fla/ops/quasar/chunk.so",
    ],
)
def test_module_shadowing_the_checked_source(tmp_path, shadow):
    report = validate_repo(make_fork(tmp_path, {shadow: ""}))
    assert (CHUNK, None, Rule.SHADOWED_SOURCE) in error_keys(report)
    # An extension module is also what the layer's `from fla.ops.quasar import chunk_quasar` reaches, unread.
    assert {f.rule for f in report.errors} <= {Rule.SHADOWED_SOURCE, Rule.UNVERIFIABLE_IMPORT}


def test_quasar_module_beats_a_namespace_quasar_folder(tmp_path):
    report = validate_repo(make_fork(tmp_path, {"fla/ops/quasar/__init__.py": None, "fla/ops/quasar.py": ""}))
    assert error_keys(report) == {("fla/ops/quasar", None, Rule.SHADOWED_SOURCE)}


def test_bytecode_without_source_and_unchecked_pyc(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/evil_src.py": "import fla.ops.kda\n"})
    source = fork / "fla/ops/quasar/evil_src.py"
    py_compile.compile(str(source), cfile=str(fork / "fla/ops/quasar/evil.pyc"))
    cache = fork / "fla/ops/quasar/__pycache__"
    unchecked = py_compile.PycInvalidationMode.UNCHECKED_HASH
    py_compile.compile(str(source), cfile=str(cache / "gate.cpython-311.pyc"), invalidation_mode=unchecked)
    py_compile.compile(str(source), cfile=str(cache / "chunk.cpython-311.pyc"))  # timestamp-checked: harmless
    source.unlink()
    report = validate_repo(fork)
    assert error_keys(report) == {
        ("fla/ops/quasar/evil.pyc", None, Rule.UNVERIFIABLE_IMPORT),
        ("fla/ops/quasar/__pycache__/gate.cpython-311.pyc", None, Rule.UNVERIFIABLE_IMPORT),
    }


@pytest.mark.parametrize(
    ("planted", "text", "rule"),
    [
        ("fla/ops/utils/helpers/__init__.py", "from fla.ops.kda import chunk_kda as pick\n", Rule.FORBIDDEN_IMPORT),
        ("fla/ops/utils/helpers.cpython-311-x86_64-linux-gnu.so", "", Rule.UNVERIFIABLE_IMPORT),
        ("fla/ops/utils/helpers/__init__.abi3.so", "", Rule.UNVERIFIABLE_IMPORT),
    ],
)
def test_reexport_through_a_module_python_loads_instead_of_the_read_source(tmp_path, planted, text, rule):
    # Python imports a package folder before a module of the same name, and an extension module
    # before the source: the re-export index read the clean helpers.py, Python runs the other.
    clean = {"fla/ops/utils/helpers.py": "def pick(): return 'clean'\n"}
    use = CHUNK_TEXT + "from fla.ops.utils.helpers import pick\nout = pick\n"
    report = validate_repo(make_fork(tmp_path, {**clean, planted: text, CHUNK: use}))
    lines = use.count("\n")
    assert error_keys(report) == {(CHUNK, lines - 1, rule), (CHUNK, lines, rule)}


def test_reexport_through_sourceless_bytecode_elsewhere_in_the_fork(tmp_path):
    # fla/ops/utils/sneaky.pyc without a source is a module Python imports; the check cannot read it.
    fork = make_fork(tmp_path, {"fla/ops/utils/evil_src.py": "from fla.ops.kda import chunk_kda as pick\n"})
    py_compile.compile(str(fork / "fla/ops/utils/evil_src.py"), cfile=str(fork / "fla/ops/utils/sneaky.pyc"))
    (fork / "fla/ops/utils/evil_src.py").unlink()
    use = CHUNK_TEXT + "from fla.ops.utils.sneaky import pick\nout = pick\n"
    (fork / CHUNK).write_text(use)
    lines = use.count("\n")
    expected = {(CHUNK, lines - 1, Rule.UNVERIFIABLE_IMPORT), (CHUNK, lines, Rule.UNVERIFIABLE_IMPORT)}
    assert error_keys(validate_repo(fork)) == expected


def test_dangling_or_compiled_siblings_do_not_hide_a_clean_module(tmp_path):
    # Source beats bytecode, and a folder without __init__ is only a namespace portion: helpers.py is what runs.
    fork = make_fork(
        tmp_path,
        {
            "fla/ops/utils/helpers.py": "def pick(): return 'clean'\n",
            "fla/ops/utils/helpers/x.py": "from fla.ops.kda import chunk_kda\n",
            CHUNK: CHUNK_TEXT + "from fla.ops.utils.helpers import pick\nout = pick\n",
        },
    )
    (fork / "fla/ops/utils/helpers.pyc").write_bytes(b"")
    assert validate_repo(fork).ok


# --- the .cu file ---------------------------------------------------------------------------------


def test_cu_file_warning_by_default_error_when_required(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/quasar_stub.cu": None})
    report = validate_repo(fork)
    assert report.ok and [str(f) for f in report.warnings] == [".: no-cu-file: the repository has no *.cu file"]
    required = validate_repo(fork, require_cu=True)
    assert not required.ok and [f.rule for f in required.errors] == [Rule.NO_CU_FILE]
    (fork / "csrc").mkdir()
    (fork / "csrc" / "kernel.cu").write_text("")
    assert validate_repo(fork, require_cu=True).ok


def test_cu_file_in_git_folder_or_linked_from_outside_does_not_count(tmp_path):
    (tmp_path / "outside.cu").write_text("")
    fork = make_fork(tmp_path / "fork", {"fla/ops/quasar/quasar_stub.cu": None, ".git/hooks/x.cu": ""})
    (fork / "linked.cu").symlink_to(tmp_path / "outside.cu")
    assert not validate_repo(fork, require_cu=True).ok
