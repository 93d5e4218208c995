"""``quasar starter-fork DIR``: write the project's starter fork into DIR and commit it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from quasar.log import setup_logging
from quasar.starter_fork.writer import StarterForkError, write_starter_fork


def main(argv: Sequence[str] | None = None, prog: str = "quasar starter-fork") -> int:
    """Write the fork; exit status 0, or 1 when DIR is not a new or empty folder."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write the project's starter fork of flash-linear-attention (correct kernels, "
        "CPU and CUDA) into DIR as a fresh git repository.",
    )
    parser.add_argument("dest", metavar="DIR", type=Path, help="new or empty folder to write the fork into")
    args = parser.parse_args(argv)
    setup_logging(quiet=True)
    try:
        commit = write_starter_fork(args.dest)
    except StarterForkError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print(f"starter fork: {args.dest.resolve()}")
    print(f"commit:       {commit}")
    return 0
