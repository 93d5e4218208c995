"""``quasar step1``, a miner's first step: bring a fork checkout to the suite's QuasarAttention kernel.

    quasar step1 --repo-path ~/flash-linear-attention [--seq-len 1M]
    quasar step1 --skip-setup --repo-path FORK --push

1. Setup (skipped with ``--skip-setup``): the fork is a git checkout with a commit identity,
   torch and triton import, and the evaluation device (``--device``, else DEVICE) is there.
2. The suite's kernel files (the starter fork's ``fla/ops/quasar/`` and ``fla/layers/quasar.py``)
   are written into the fork, after checking that every other ``fla`` module they import exists
   in the fork with the names they use (nothing is written otherwise).
3. The local validator (the same evaluation a validator runs) checks the fork at EVAL_SEQ_LENS'
   default lengths and ``--seq-len``.
4. On a pass the written files are committed (pushed with ``--push``); on a fail they are put back
   as they were (kept with ``--keep-on-failure``). Exit status 0 on a pass, 1 on a fail, 2 for
   bad arguments or a fork that cannot take the files.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from quasar import astparse
from quasar.config.values import format_seq_lens
from quasar.errors import QuasarError
from quasar.evaluate.cli import add_evaluation_arguments, options_from, positive_int, refusal, start
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import DEFAULT_SEQ_LENS, EvaluationInputError, ProgressEvent, check_lengths
from quasar.evaluate.report import render_report
from quasar.scoring import LEAGUES
from quasar.starter_fork import kernel_files, template_root
from quasar.terminal import WrappingParser

logger = logging.getLogger(__name__)
# Step 1 validates at the top league's length, where a miner aims (docs/rules.md section 5).
DEFAULT_TARGET = LEAGUES[-1].min_length

COMMIT_MESSAGE = "QuasarAttention: the QUASAR suite's context-parallel chunk kernels"


class Step1Error(QuasarError, RuntimeError):
    """The fork cannot take the kernel (the message says what is missing or wrong)."""


@dataclasses.dataclass
class WrittenFiles:
    """What ``write_kernel`` changed: each path and its previous bytes (None: it did not exist),
    and the folders it created, outermost first."""

    previous: dict[PurePosixPath, bytes | None]
    created_folders: list[PurePosixPath] = dataclasses.field(default_factory=list)

    @property
    def paths(self) -> list[PurePosixPath]:
        return sorted(self.previous)


def _template_bytes(path: PurePosixPath) -> bytes:
    node = template_root()
    for part in path.parts:
        node = node / part
    return node.read_bytes()


def _defined_names(source: Path) -> set[str]:
    """Names a module defines or imports at its top level (what ``from module import X`` finds)."""
    tree = astparse.parse(source.read_text(), filename=str(source))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            for child in ast.walk(node):
                if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                    names.add(child.name)
                elif isinstance(child, ast.Assign):
                    names.update(n.id for t in child.targets for n in ast.walk(t) if isinstance(n, ast.Name))
                elif isinstance(child, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in child.names)
    return names


def module_file(root: Path, module: str) -> Path | None:
    """The file of the dotted ``module`` in the tree at ``root`` (``a/b.py`` or ``a/b/__init__.py``), if any."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def missing_support(repo: Path) -> list[str]:
    """What the kernel files import from the fork's other ``fla`` modules and the fork lacks,
    one message per module (empty when everything resolves)."""
    written = {".".join(p.with_suffix("").parts) for p in kernel_files()}
    written |= {m.rsplit(".", 1)[0] for m in written if m.endswith(".__init__")}
    needed: dict[str, set[str]] = {}
    for path in kernel_files():
        if path.suffix != ".py":
            continue
        tree = astparse.parse(_template_bytes(path).decode(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fla"):
                if node.module not in written:
                    needed.setdefault(node.module, set()).update(a.name for a in node.names)
    problems = []
    for module, names in sorted(needed.items()):
        source = module_file(repo, module)
        if source is None:
            problems.append(f"{module.replace('.', '/')}.py is missing (needed for {', '.join(sorted(names))})")
            continue
        lacking = sorted(names - _defined_names(source))
        if lacking:
            problems.append(f"{source.relative_to(repo)} does not define {', '.join(lacking)}")
    return problems


def write_kernel(repo: Path) -> WrittenFiles:
    """Write the kernel files into ``repo``; returns what was there before. Raises Step1Error
    (writing nothing) when the fork lacks a module or name they import."""
    problems = missing_support(repo)
    if problems:
        raise Step1Error("the fork cannot take the kernel files: " + "; ".join(problems))
    written = WrittenFiles({})
    for path in kernel_files():
        target = repo / path
        written.previous[path] = target.read_bytes() if target.is_file() else None
        written.created_folders += [folder for folder in reversed(path.parents) if not (repo / folder).exists()]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_template_bytes(path))
    return written


def restore(repo: Path, written: WrittenFiles) -> None:
    """Put back what ``write_kernel`` replaced and remove what it created (files, then folders)."""
    for path, content in written.previous.items():
        target = repo / path
        if content is None:
            target.unlink(missing_ok=True)
        else:
            target.write_bytes(content)
    for folder in reversed(written.created_folders):
        try:
            (repo / folder).rmdir()
        except OSError:
            logger.warning("kept %s: it is not empty", folder)


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if result.returncode != 0:
        raise Step1Error(f"git {' '.join(args)} failed in {repo}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip()


def commit(repo: Path, written: WrittenFiles, message: str = COMMIT_MESSAGE) -> str | None:
    """Commit the written files (only those); returns the new commit id, or None when nothing changed."""
    paths = [str(p) for p in written.paths]
    git(repo, "add", "--", *paths)
    if subprocess.run(["git", "diff", "--cached", "--quiet", "--", *paths], cwd=repo).returncode == 0:
        return None
    git(repo, "commit", "-q", "-m", message, "--", *paths)
    return git(repo, "rev-parse", "HEAD")


def check_setup(repo: Path) -> list[str]:
    """What is wrong with the environment for step 1 (empty when all is well); the device is
    checked before, with the other evaluation options (options_from)."""
    problems = []
    try:
        git(repo, "rev-parse", "--is-inside-work-tree")
    except Step1Error:
        return [f"{repo} is not a git checkout"]
    for key in ("user.name", "user.email"):
        if subprocess.run(["git", "config", key], cwd=repo, capture_output=True).returncode != 0:
            problems.append(f"git {key} is not set (git config --global {key} ...)")
    for module in ("torch", "triton"):
        if importlib.util.find_spec(module) is None:
            problems.append(f"python package {module} is not installed")
    return problems


def main(argv: Sequence[str] | None = None, prog: str = "quasar step1") -> int:
    """Step 1; exit status 0 on a pass, 1 on a fail, 2 for bad arguments or a fork that cannot take the files."""
    parser = WrappingParser(
        prog=prog,
        description="Step 1 for a miner: bring a fork checkout to the "
        "suite's QuasarAttention kernel, validate it, commit.",
    )
    parser.add_argument("--repo-path", type=Path, required=True, help="the fork, checked out")
    parser.add_argument("--skip-setup", action="store_true", help="skip the environment checks")
    parser.add_argument(
        "--seq-len",
        type=positive_int,
        default=DEFAULT_TARGET,
        metavar="N",
        help=f"target length of the local validation (default {format_seq_lens([DEFAULT_TARGET])})",
    )
    parser.add_argument("--push", action="store_true", help="git push after the commit")
    parser.add_argument("--keep-on-failure", action="store_true", help="leave the files written when validation fails")
    add_evaluation_arguments(parser)
    args, settings = start(parser, argv)
    console = Console()
    repo = args.repo_path.expanduser().resolve()
    if not repo.is_dir():
        parser.error(f"--repo-path {str(repo)!r} is not a directory")
    try:  # refused before the fork is touched (a device this host lacks, a CPU run at 1M)
        options = options_from(args, DEFAULT_SEQ_LENS, settings)
        check_lengths(options.seq_lens, args.seq_len, options.device)
    except EvaluationInputError as error:
        parser.error(refusal(error, "--seq-len N"))
    if not args.skip_setup:
        problems = check_setup(repo)
        if problems:
            for problem in problems:
                console.print(f"[red]setup:[/red] {problem}")
            return 2
        console.print("setup: git checkout, torch, triton and the device are ready")
    try:
        written = write_kernel(repo)
    except Step1Error as error:
        console.print(f"[red]{error}[/red]")
        return 2
    console.print(f"wrote {len(written.paths)} files into {repo}")

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("local validation", total=None)

            def show(event: ProgressEvent) -> None:
                where = f"T={event.seq_len:,}: " if event.seq_len else ""
                progress.update(
                    task, description=f"{where}{event.stage}", completed=event.done, total=event.total or None
                )

            report = evaluate(repo, args.seq_len, args.claimed, options, progress=show)
    except EvaluationInputError as error:
        restore(repo, written)
        parser.error(str(error))
    render_report(report, console)
    if not report.passed:
        if not args.keep_on_failure:
            restore(repo, written)
            console.print("validation failed: the fork's files were put back as they were")
        return 1
    try:
        commit_id = commit(repo, written)
        console.print(f"committed {commit_id}" if commit_id else "the fork already had this kernel: nothing to commit")
        if args.push:
            git(repo, "push", "origin", "HEAD")
            console.print("pushed to origin")
    except Step1Error as error:
        console.print(f"[red]{error}[/red]")
        return 2
    return 0
