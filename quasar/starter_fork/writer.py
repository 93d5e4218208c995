"""Write the starter fork: copy the template tree and commit it as a fresh git repository.

The commit's author, committer, date and message are fixed, so the same template always gives
the same commit id: a starter fork can be recognised by its commit.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
from importlib.resources import files
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from quasar.errors import QuasarError
from quasar.gitenv import committing_environment, run_git

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

logger = logging.getLogger(__name__)

AUTHOR_NAME = "QUASAR starter"
AUTHOR_EMAIL = "starter@quasar.invalid"
COMMIT_DATE = "2025-01-01T00:00:00+00:00"
COMMIT_MESSAGE = "QUASAR starter fork: QuasarAttention with correct Triton kernels\n"
BRANCH = "main"

# Never part of the template even if someone imported it in place.
_SKIPPED_NAMES = {"__pycache__", ".pytest_cache"}
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


class StarterForkError(QuasarError, RuntimeError):
    """The starter fork could not be written (the message says why)."""


def template_root() -> Traversable:
    """The template tree shipped as package data (``quasar/starter_fork/tree``)."""
    return files(__package__) / "tree"


def template_files() -> list[PurePosixPath]:
    """Paths of every file of the template, relative to its root, sorted."""
    found: list[PurePosixPath] = []

    def walk(node: Traversable, prefix: PurePosixPath) -> None:
        for child in node.iterdir():
            if child.name in _SKIPPED_NAMES or child.name.endswith(_SKIPPED_SUFFIXES):
                continue
            if child.is_dir():
                walk(child, prefix / child.name)
            else:
                found.append(prefix / child.name)

    walk(template_root(), PurePosixPath())
    return sorted(found)


# What step 1 writes into a miner's fork (scripts/step1_first_optimization.py): the kernels and the layer.
KERNEL_DIR = PurePosixPath("fla/ops/quasar")
LAYER_FILE = PurePosixPath("fla/layers/quasar.py")


def kernel_files() -> list[PurePosixPath]:
    """The template's QuasarAttention files (``fla/ops/quasar/`` and ``fla/layers/quasar.py``), sorted."""
    return [p for p in template_files() if p == LAYER_FILE or KERNEL_DIR in p.parents]


@functools.cache
def tuning_contract():
    """The template's ``fla/ops/quasar/tuning.py`` (the tunables' contract: ``parse_tuning``,
    ``DEFAULTS``), loaded by path: a fork's own copy is never imported into this process."""
    source = Path(str(template_root() / KERNEL_DIR / "tuning.py"))
    spec = importlib.util.spec_from_file_location("quasar_kernel_tuning_contract", source)
    assert spec is not None and spec.loader is not None, source
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _check_destination(dest: Path) -> None:
    if dest.exists() and not dest.is_dir():
        raise StarterForkError(f"{dest} exists and is not a folder; choose a new or empty folder")
    if dest.is_dir() and any(dest.iterdir()):
        raise StarterForkError(f"{dest} exists and is not empty; choose a new or empty folder")


def copy_starter_tree(dest: Path) -> list[PurePosixPath]:
    """Copy the template files into ``dest`` (new or empty folder); return their relative paths."""
    dest = Path(dest)
    _check_destination(dest)
    root = template_root()
    paths = template_files()
    for relative in paths:
        target = dest.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(root.joinpath(*relative.parts).read_bytes())
    return paths


def _git(dest: Path, *args: str) -> str:
    env = committing_environment(AUTHOR_NAME, AUTHOR_EMAIL, COMMIT_DATE)
    return run_git(dest, *args, env=env, error=StarterForkError)


def write_starter_fork(dest: Path) -> str:
    """Write the starter fork into ``dest`` (a new or empty folder) and commit it on ``main``.

    Returns the commit id (40 hex digits). Raises :class:`StarterForkError` when ``dest`` is
    not empty or git fails.
    """
    dest = Path(dest)
    _check_destination(dest)
    dest.mkdir(parents=True, exist_ok=True)
    paths = copy_starter_tree(dest)
    commit = commit_new_repository(dest, paths, COMMIT_MESSAGE)
    logger.info("starter fork written to %s (%d files), commit %s", dest, len(paths), commit)
    return commit


def commit_new_repository(dest: Path, paths: list[PurePosixPath], message: str) -> str:
    """Make ``dest`` a git repository on ``main`` whose one commit (fixed identity and date) holds
    ``paths``; returns the commit id."""
    _git(dest, "init", "--quiet")
    _git(dest, "symbolic-ref", "HEAD", f"refs/heads/{BRANCH}")
    _git(dest, "add", "--", *(str(p) for p in paths))
    _git(dest, "commit", "--quiet", "--no-verify", "--no-gpg-sign", "-m", message)
    return _git(dest, "rev-parse", "HEAD")
