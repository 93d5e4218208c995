"""A miner's fork as miners really have it: upstream flash-linear-attention's whole ``fla`` tree.

The files come from the ``flash-linear-attention`` and ``fla-core`` packages as pip installed them
(``scripts/setup_venv.sh`` puts them in ``.venv/upstream-fla``, off the import path; see
pyproject.toml's ``upstream-fla``), listed by their installed metadata; nothing of them is kept in
this repository. With ``quasar=True`` the starter fork's QuasarAttention files (what step 1 writes)
are laid over them. The tree is committed as a git repository, like a clone of a fork.

    python tests/upstream_fork.py DIR [--without-quasar]     (for runs on a GPU machine)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from importlib import metadata
from pathlib import Path, PurePosixPath

from quasar.starter_fork import commit_new_repository, kernel_files, template_root

UPSTREAM_DISTRIBUTIONS = ("flash-linear-attention", "fla-core")
COMMIT_MESSAGE = "upstream flash-linear-attention, as installed from its packages\n"


class UpstreamFlaMissing(RuntimeError):
    """The upstream packages are not installed where setup_venv.sh puts them."""


def upstream_site() -> Path:
    """Where setup_venv.sh installed the upstream packages (``QUASAR_UPSTREAM_FLA`` overrides)."""
    return Path(os.environ.get("QUASAR_UPSTREAM_FLA") or Path(sys.prefix) / "upstream-fla")


def upstream_files(site: Path | None = None) -> dict[PurePosixPath, Path]:
    """Every installed file of the upstream ``fla`` package (no bytecode): relative path -> file."""
    site = site or upstream_site()
    found: dict[PurePosixPath, Path] = {}
    names = set()
    for distribution in metadata.distributions(path=[str(site)]):
        name = distribution.metadata["Name"].lower()
        if name not in UPSTREAM_DISTRIBUTIONS:
            continue
        names.add(name)
        for file in distribution.files or []:
            relative = PurePosixPath(str(file))
            if relative.parts[0] == "fla" and relative.suffix != ".pyc":
                found[relative] = Path(distribution.locate_file(file))
    if names != set(UPSTREAM_DISTRIBUTIONS):
        raise UpstreamFlaMissing(
            f"{', '.join(sorted(set(UPSTREAM_DISTRIBUTIONS) - names))} not installed in {site} "
            "(./scripts/setup_venv.sh installs pyproject.toml's upstream-fla there)"
        )
    return found


def write_upstream_fork(dest: Path, quasar: bool = True) -> str:
    """Write the upstream ``fla`` tree into ``dest`` (new or empty), with the starter fork's
    QuasarAttention files over it when ``quasar``, and commit it; returns the commit id."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for relative, source in upstream_files().items():
        target = dest.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        paths.append(relative)
    if quasar:
        template = template_root()
        for relative in kernel_files():
            target = dest.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(template.joinpath(*relative.parts).read_bytes())
            paths.append(relative)
    return commit_new_repository(dest, sorted(set(paths)), COMMIT_MESSAGE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write upstream fla's tree as a fork (git repository).")
    parser.add_argument("dest", type=Path, help="a new or empty folder")
    parser.add_argument("--without-quasar", action="store_true", help="leave out the starter fork's QuasarAttention")
    args = parser.parse_args(argv)
    commit = write_upstream_fork(args.dest, quasar=not args.without_quasar)
    print(f"{args.dest}: {len(upstream_files())} upstream files, commit {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
