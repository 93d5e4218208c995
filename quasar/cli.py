"""``quasar COMMAND``: the suite's one command line, a subcommand per tool, listed by role.

Each command is a :class:`Command`: its name, a one-line summary, and its entry point, a function
``(argv, prog) -> exit status`` in the module that holds the tool's code. Modules are imported
only when their command runs, so ``quasar --help`` starts without torch. ``quasar COMMAND --help``
is the tool's own help; the older spellings (``python -m neurons.miner``, ``python
scripts/local_validator.py``, ...) call the same entry points. Add a tool by adding a
:class:`Command` to a section of :data:`QUASAR` (and a README line).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import shutil
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import quasar

if TYPE_CHECKING:
    from quasar.config import Settings


@dataclass(frozen=True)
class Command:
    """One command: ``entry`` is ``"module:function"``, called as ``function(argv, prog=prog)``."""

    name: str
    summary: str
    entry: str

    def run(self, argv: Sequence[str], prog: str) -> int:
        """Import the command's module and call its entry point; its exit status."""
        module, _, function = self.entry.partition(":")
        return getattr(importlib.import_module(module), function)(list(argv), prog=prog)


@dataclass(frozen=True)
class Group:
    """Commands under one name (``quasar bench kernel``), in titled sections; ``version``: what
    ``--version`` prints (the top level only)."""

    name: str
    description: str
    sections: tuple[tuple[str, tuple[Command | Group, ...]], ...]
    version: str | None = None

    def members(self) -> dict[str, Command | Group]:
        """Every command and nested group by name."""
        return {member.name: member for _, members in self.sections for member in members}

    def help_text(self) -> str:
        """The description and the sections as help text, wrapped to the terminal as argparse wraps:
        a nested group's commands each on a line (``bench kernel``)."""
        sections = []
        for title, members in self.sections:
            lines = []
            for member in members:
                if isinstance(member, Group):
                    lines += [
                        (f"{member.name} {name}", command.summary)
                        for name, command in member.members().items()
                        if isinstance(command, Command)
                    ]
                else:
                    lines.append((member.name, member.summary))
            sections.append((title, lines))
        name_width = max(len(name) for _, lines in sections for name, _ in lines) + 2
        width = max(shutil.get_terminal_size().columns - 2, 60)
        text = [*textwrap.wrap(self.description, width), ""]
        for title, lines in sections:
            text.append(f"{title}:")
            for name, summary in lines:
                wrapped = textwrap.wrap(summary, width - 2 - name_width) or [""]
                text.append(f"  {name:<{name_width}}{wrapped[0]}")
                text.extend(" " * (2 + name_width) + line for line in wrapped[1:])
            text.append("")
        return "\n".join(text).rstrip("\n")

    def parser(self, prog: str) -> argparse.ArgumentParser:
        """``PROG COMMAND [ARGS ...]``: the command's arguments stay unparsed for its own parser."""
        parser = argparse.ArgumentParser(
            prog=prog,
            usage=f"{prog} [-h]{' [--version]' if self.version else ''} COMMAND [ARGS ...]",
            description=self.help_text(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if self.version:
            parser.add_argument("--version", action="version", version=self.version)
        parser.add_argument("command", metavar="COMMAND", help="one of the commands above")
        parser.add_argument(
            "args", nargs=argparse.REMAINDER, metavar="ARGS", help="the command's arguments and options"
        )
        return parser

    def run(self, argv: Sequence[str], prog: str) -> int:
        """Run the command ``argv`` names with the rest of ``argv``; its exit status."""
        parser = self.parser(prog)
        if not argv:
            parser.error(f"name a command (`{prog} --help` lists them)")
        args = parser.parse_args(argv)
        member = self.members().get(args.command)
        if member is None:
            parser.error(f"unknown command {args.command!r} (`{prog} --help` lists them)")
        return member.run(args.args, prog=f"{prog} {member.name}")


def show_settings(argv: Sequence[str], prog: str) -> int:
    """``quasar config``: print every setting with its default and meaning (``.env.example``'s
    text), or with ``--table ROLE`` the Markdown table of one process's settings (docs/)."""
    from quasar.config import ROLES, env_example, settings_table
    from quasar.log import setup_logging
    from quasar.terminal import WrappingParser

    parser = WrappingParser(
        prog=prog,
        description="Print every setting with its default and meaning, "
        f"as .env.example has them ({prog} > .env.example).",
    )
    parser.add_argument(
        "--table", choices=sorted(ROLES), metavar="PROCESS", help="the settings PROCESS reads, as the docs' table"
    )
    args = parser.parse_args(argv)
    setup_logging(quiet=True)
    print(settings_table(args.table) if args.table else env_example(), end="\n" if args.table else "")
    return 0


def neuron_settings(role: str, argv: Sequence[str]) -> Settings:
    """The settings ``python -m neurons.ROLE ARGV`` runs with (``role``: "miner" or "validator"):
    the neuron's own parser reads ``argv`` (a flag's prefix, its aliases, the last of a repeated
    one) and the same resolution adds the .env, the environment and the defaults. The START
    scripts' checks read these, so they check what the process will use. A -h/--help is read and
    left to the process; a bad flag or value exits through argparse, as the process would."""
    from quasar import config

    neurons = {"miner": "quasar.miner.cli", "validator": "quasar.validator.cli"}
    if role not in neurons:
        raise ValueError(f"unknown neuron {role!r}; expected one of {', '.join(neurons)}")
    parser = importlib.import_module(neurons[role]).build_parser(f"python -m neurons.{role}", add_help=False)
    # The spellings of argparse's help, so that the other flags' prefixes and the usage line of an
    # error read as the process's.
    parser.add_argument("-h", "--help", action="store_true")
    # A warning of the resolution (a retired setting) is the process's to log, once.
    logging.disable(logging.WARNING)
    try:
        _, settings = config.parse_args(parser, argv)
    finally:
        logging.disable(logging.NOTSET)
    return settings


def check_imports(argv: Sequence[str], prog: str) -> int:
    """``quasar imports``: the import validator's command line (its help names it ``python -m
    quasar.imports``, the spelling it keeps)."""
    from quasar.imports import main
    from quasar.log import setup_logging

    setup_logging(quiet=True)
    return main(list(argv))


BENCH = Group(
    name="bench",
    description="Measurements of the harness, the kernels and the API; their figures go to "
    "benchmarks/RESULTS.md with the device, date and command.",
    sections=(
        (
            "commands",
            (
                Command(
                    "harness", "agreement of repeated evaluations of the starter fork", "quasar.bench.harness:main"
                ),
                Command("kernel", "check and time the starter fork's kernels on one GPU", "quasar.bench.kernel:main"),
                Command("floor", "what the layer's passes cost at copy speed", "quasar.bench.floor:main"),
                Command("reference", "time the validator's float32 reference work", "quasar.bench.reference:main"),
                Command(
                    "inference",
                    "the miner's inference server's requests at its limits (one GPU)",
                    "quasar.bench.inference:main",
                ),
                Command(
                    "neighbours", "an honest evaluation beside a hostile one (2 GPUs)", "quasar.bench.neighbours:main"
                ),
                Command("api-load", "load benchmark of the submission API", "quasar.bench.api_load:main"),
                Command("api-profile", "where an API request's time goes (py-spy)", "quasar.bench.api_profile:main"),
                Command(
                    "simulate-subnet",
                    "a whole subnet against the API in compressed time",
                    "quasar.bench.simulate_subnet:main",
                ),
                Command(
                    "api-month",
                    "the API's database after days of a full subnet",
                    "quasar.bench.api_month:main",
                ),
                Command(
                    "validator-month",
                    "the validator's state file after many evaluations",
                    "quasar.bench.validator_month:main",
                ),
                Command(
                    "dashboard-pages",
                    "the dashboard's pages over api-month's database",
                    "quasar.bench.dashboard_pages:main",
                ),
            ),
        ),
    ),
)

QUASAR = Group(
    name="quasar",
    version=f"quasar {quasar.__version__}",
    description="The QUASAR node suite's tools. `quasar COMMAND --help` shows a command's options; "
    "settings come from .env, the environment and flags (`quasar config` lists them).",
    sections=(
        (
            "miner",
            (
                Command(
                    "starter-fork",
                    "write the starter fork into DIR, a fresh git repository",
                    "quasar.starter_fork.cli:main",
                ),
                Command(
                    "step1",
                    "put the suite's kernel into your fork, validate, commit",
                    "quasar.tools.install_kernel:main",
                ),
                Command("step2", "tune the kernel's tunables on this GPU", "quasar.tools.tune_kernel:main"),
                Command(
                    "local-validator",
                    "evaluate your fork as a validator will, with progress",
                    "quasar.tools.local_validator:main",
                ),
                Command(
                    "evaluate", "evaluate a checked-out fork: the report as tables or JSON", "quasar.evaluate.cli:main"
                ),
                Command(
                    "status", "your submissions, each validator's verdict and reasons", "quasar.miner.cli:status_main"
                ),
                Command("miner", "run the miner neuron: fork, optimize, push, submit", "quasar.miner.cli:main"),
                Command(
                    "inference", "the miner's inference server (its axon) for validators", "quasar.inference.cli:main"
                ),
            ),
        ),
        (
            "validator",
            (
                Command(
                    "validator", "run the validator neuron: evaluate, report, set weights", "quasar.validator.cli:main"
                ),
                Command(
                    "check-sandbox",
                    "what this machine's evaluation sandbox enforces",
                    "quasar.tools.check_sandbox:main",
                ),
            ),
        ),
        (
            "API and chain",
            (
                Command("api", "the submission API: serve, migrate, publish-url", "quasar.api.__main__:main"),
                Command(
                    "devchain", "the embedded dev chain (a subnet in one SQLite file)", "quasar.chain.devchain_cli:main"
                ),
            ),
        ),
        (
            "network",
            (Command("localnet", "a whole subnet on this machine: chain, API, neurons", "quasar.localnet.cli:main"),),
        ),
        ("measurement", (BENCH,)),
        (
            "other",
            (
                Command("imports", "check a fork's imports against the rules", "quasar.cli:check_imports"),
                Command("scoring", "rank a JSON file of results, print the weight split", "quasar.scoring:main"),
                Command("config", "every setting with its default (.env.example)", "quasar.cli:show_settings"),
            ),
        ),
    ),
)


def command_lines(group: Group = QUASAR) -> list[tuple[str, ...]]:
    """Every runnable command as its words after ``quasar`` (``("bench", "kernel")``), in listing order."""
    found: list[tuple[str, ...]] = []
    for _, members in group.sections:
        for member in members:
            if isinstance(member, Group):
                found += [(member.name, *words) for words in command_lines(member)]
            else:
                found.append((member.name,))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """``quasar COMMAND [ARGS...]``: run the command; its exit status."""
    return QUASAR.run(sys.argv[1:] if argv is None else argv, prog="quasar")
