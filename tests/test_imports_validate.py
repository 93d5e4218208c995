"""The whole check of a fork (quasar/imports/validate.py): which files are checked, and which rule
applies to which file."""

from __future__ import annotations

import logging

import pytest

from quasar.imports.findings import Rule
from quasar.imports.validate import validate_repo
from tests.import_forks import CHUNK, CORE_ONE_LINE, FORK_FILES, LAYER, check_one_change, make_fork


def test_clean_fork_passes_both_profiles(tmp_path):
    fork = make_fork(tmp_path)
    for profile in ("core", "strict"):
        report = validate_repo(fork, profile=profile, require_cu=True)
        assert report.ok, report.errors
        assert report.errors == () and report.warnings == ()
    assert set(report.checked_files) >= {CHUNK, LAYER, "fla/ops/quasar/gate.py", "fla/ops/quasar/__init__.py"}


def test_a_clean_check_is_logged_at_debug_and_one_with_findings_at_info(tmp_path, caplog):
    """A miner checks each candidate's imports twice (before its evaluation and in the harness): a
    clean check's line at INFO was 0.5 KB of the 0.75 KB a candidate tried wrote to pm2's log."""
    caplog.set_level(logging.INFO, logger="quasar.imports")
    fork = make_fork(tmp_path)
    assert validate_repo(fork, profile="core", require_cu=True).ok
    assert caplog.records == []
    for cu in fork.rglob("*.cu"):
        cu.unlink()
    assert validate_repo(fork, profile="core", require_cu=False).warnings
    assert [record.getMessage().endswith("0 errors, 1 warnings") for record in caplog.records] == [True]


@pytest.mark.parametrize(
    "relative",
    [
        "fla/ops/quasar/gate.py",
        "fla/ops/quasar/fused_recurrent.py",
        "fla/ops/quasar/__init__.py",
        "fla/ops/quasar/helpers.py",
        "fla/ops/quasar/kernels/deep/extra.py",
        LAYER,
    ],
)
def test_forbidden_import_in_every_checked_file(tmp_path, relative):
    check_one_change(tmp_path, relative, "from fla.ops.kda import chunk_kda  # <-\n", Rule.FORBIDDEN_IMPORT)


def test_files_outside_the_checked_set_are_not_checked(tmp_path):
    # fla/ops/__init__.py and fla/ops/kda/chunk.py import kda themselves; that is upstream's business.
    report = validate_repo(make_fork(tmp_path, {"fla/models/other.py": "import fla.ops.kda\n"}))
    assert report.ok, report.errors


def test_required_imports_elsewhere_do_not_count(tmp_path):
    gate = FORK_FILES["fla/ops/quasar/gate.py"] + CORE_ONE_LINE
    report = validate_repo(make_fork(tmp_path, {CHUNK: "import torch\n", "fla/ops/quasar/gate.py": gate}))
    assert {(f.path, f.rule) for f in report.errors} == {(CHUNK, Rule.MISSING_REQUIRED_IMPORT)}
    assert len(report.errors) == 5


def test_a_path_that_is_not_a_directory_is_refused(tmp_path):
    fork = make_fork(tmp_path / "fork")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        validate_repo(fork / "fla/ops/quasar/chunk.py")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        validate_repo(tmp_path / "no-such-fork")
