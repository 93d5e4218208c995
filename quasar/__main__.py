"""``python -m quasar SUBCOMMAND``: the suite's small tools, one subcommand each.

A subcommand is a :class:`Subcommand` in :data:`SUBCOMMANDS`: its name, a one-line help, a
function adding its arguments to its parser, and a function running it that returns the exit
status. Add one by appending to the tuple.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Subcommand:
    """One ``python -m quasar`` subcommand."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _starter_fork_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dest", metavar="DIR", type=Path, help="new or empty folder to write the fork into")


def _starter_fork_run(args: argparse.Namespace) -> int:
    from quasar.starter_fork import StarterForkError, write_starter_fork

    try:
        commit = write_starter_fork(args.dest)
    except StarterForkError as exc:
        print(f"starter-fork: {exc}", file=sys.stderr)
        return 1
    print(f"starter fork: {args.dest.resolve()}")
    print(f"commit:       {commit}")
    return 0


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        name="starter-fork",
        help="write the project's starter fork of flash-linear-attention (a git repository) into DIR",
        add_arguments=_starter_fork_arguments,
        run=_starter_fork_run,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m quasar``, one sub-parser per entry of :data:`SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(prog="python -m quasar", description="QUASAR node suite tools.")
    subparsers = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    for subcommand in SUBCOMMANDS:
        sub = subparsers.add_parser(subcommand.name, help=subcommand.help, description=subcommand.help)
        subcommand.add_arguments(sub)
        sub.set_defaults(run=subcommand.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the process arguments), run the subcommand, return its exit status."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
