"""The whole check of a fork: which files are checked, and every rule run on them in turn."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from quasar.imports.budget import CHECK_BUDGET_S, Deadline, OverBudget
from quasar.imports.findings import Finding, ImportReport, Rule
from quasar.imports.forbidden_imports import find_forbidden_imports
from quasar.imports.layout import CHUNK_FILE, LAYER_FILE, QUASAR_DIR, TARGET_FILES, module_name_for
from quasar.imports.parsing import parse_source
from quasar.imports.reexports import ReexportIndex
from quasar.imports.repository import ForkTree
from quasar.imports.required import missing_required_imports, require_known_profile

logger = logging.getLogger(__name__)


def _check_file(repo: ForkTree, relative: str, profile: str, reexports: ReexportIndex, deadline: Deadline) -> None:
    """Every rule on one checked file; findings go to ``repo.findings``."""
    source = repo.read_source(relative)
    if source is None:
        return
    repo.check_shadowing(relative)
    module_name = module_name_for(relative)
    parsed = parse_source(source, relative)
    if isinstance(parsed, Finding):
        repo.findings.append(parsed)
        return
    repo.findings.extend(find_forbidden_imports(parsed, source, module_name, relative, reexports, deadline))
    if relative == CHUNK_FILE:
        repo.findings.extend(missing_required_imports(parsed, module_name, relative, profile))


def validate_repo(
    repo_path: str | os.PathLike, profile: str = "core", require_cu: bool = False, budget_s: float = CHECK_BUDGET_S
) -> ImportReport:
    """Check a fork checked out at ``repo_path`` against docs/rules.md section 4 step 2.

    The five target files, the layer and every other ``*.py`` under ``fla/ops/quasar/`` are
    checked; ``chunk.py`` also for the required imports of ``profile``. A check still running
    after ``budget_s`` seconds stops with an ``unverifiable-import`` error on the file it was on.
    Raises NotADirectoryError when ``repo_path`` is not a directory and ValueError for an unknown
    profile; everything wrong with the fork itself is a finding in the report.
    """
    require_known_profile(profile)
    if not os.path.isdir(repo_path):
        raise NotADirectoryError(f"repository path {os.fspath(repo_path)!r} is not a directory")
    deadline = Deadline(budget_s)
    repo = ForkTree(Path(repo_path))
    reexports = ReexportIndex(repo.locate_module, deadline)
    findings = repo.findings

    targets = [f"{QUASAR_DIR}/{name}" for name in TARGET_FILES]
    checked = sorted(set(targets) | {LAYER_FILE} | set(repo.python_files_under(QUASAR_DIR)))
    repo.check_namespace_shadowing()
    repo.check_bytecode_cache("fla/layers/__pycache__", stem="quasar.")
    for relative in checked:
        try:
            deadline.check()
            _check_file(repo, relative, profile, reexports, deadline)
        except OverBudget:
            findings.append(deadline.finding(relative))
            break

    warnings: list[Finding] = []
    if not repo.has_cu_file():
        cu = Finding(".", None, Rule.NO_CU_FILE, "the repository has no *.cu file")
        (findings if require_cu else warnings).append(cu)
    errors = tuple(sorted(set(findings), key=lambda f: (f.path, f.line or 0, f.rule.value, f.message)))
    # A clean check at DEBUG: a miner checks every candidate twice, and pm2 keeps every line.
    level = logging.INFO if errors or warnings else logging.DEBUG
    logger.log(level, "import check of %s: %d errors, %d warnings", repo.root, len(errors), len(warnings))
    return ImportReport(errors=errors, warnings=tuple(warnings), checked_files=tuple(checked))
