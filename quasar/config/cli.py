"""Settings on the command line: each process's flags and its ``--help``, ``.env.example``, and
the docs pages' tables of them."""

from __future__ import annotations

import argparse
import os
import shutil
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from quasar.config.options import GROUPS, OPTIONS, ROLES, Option
from quasar.config.settings import Settings, SettingsError, resolve
from quasar.config.values import parse_bool, parse_seq_lens

# --help lays the settings out for this many columns (an SSH terminal).
HELP_WIDTH = 80
_NAME_WIDTH = 27


def role_options(role: str | None) -> list[Option]:
    """The settings process ``role`` reads (every setting for None), in :data:`GROUPS` order."""
    if role is not None and role not in ROLES:
        raise ValueError(f"unknown process {role!r}; expected one of {', '.join(ROLES)}")
    keys = set(ROLES[role]) if role is not None else {option.key for option in OPTIONS}
    return sorted((option for option in OPTIONS if option.key in keys), key=lambda option: GROUPS.index(option.group))


def settings_help(role: str | None) -> str:
    """The settings of ``role`` under their group headings, one line each: the flag (or the
    environment variable where there is no flag), what it is and its default (on a line of its
    own below, where it does not fit beside the words)."""
    lines = ["settings (flag > environment > .env > default; all of them in .env.example):"]
    group = None
    for option in role_options(role):
        if option.group != group:
            group = option.group
            lines.append(f"{group}:")
        name = option.flag or option.env or option.key
        line = f"  {name:<{_NAME_WIDTH}} {option.brief}"
        if option.default and not option.secret:
            default = f"[{option.default}]"
            if len(line) + 1 + len(default) <= HELP_WIDTH:
                line += f" {default}"
            else:  # under the words, where it fits: the defaults that do not are paths and lists
                line += f"\n{' ' * (_NAME_WIDTH + 3)}{default}"
        lines.append(line)
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser, role: str | None = None) -> None:
    """Add the flags of the settings process ``role`` reads (every setting's for None) to ``parser``
    and list those settings in its --help; absent flags leave the value unset (None)."""
    # The settings list is laid out already; the description is wrapped here, as argparse would.
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    if parser.description:
        width = min(shutil.get_terminal_size().columns, HELP_WIDTH) - 2
        parser.description = textwrap.fill(" ".join(parser.description.split()), width)
    parser.epilog = settings_help(role) if not parser.epilog else f"{parser.epilog}\n\n{settings_help(role)}"
    for option in role_options(role):
        if option.flag is None:
            continue
        if option.parse is parse_bool:
            parser.add_argument(
                option.flag,
                *option.aliases,
                dest=option.key,
                action="store_const",
                const="true",
                default=None,
                help=argparse.SUPPRESS,
            )
        else:
            parser.add_argument(option.flag, *option.aliases, dest=option.key, default=None, help=argparse.SUPPRESS)


def parse_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike | None | Literal["default"] = "default",
) -> tuple[argparse.Namespace, Settings]:
    """Parse ``argv`` with ``parser`` (which must have :func:`add_arguments` applied) and resolve.

    A bad value exits through ``parser.error`` with the message naming the setting.
    """
    namespace = parser.parse_args(argv)
    try:
        settings = resolve(namespace, environ=environ, dotenv_path=dotenv_path)
    except SettingsError as error:
        parser.error(str(error))
    return namespace, settings


def seq_lens_type(minimum: int = 1) -> Callable[[str], tuple[int, ...]]:
    """An argparse ``type`` for a list of lengths: read as the settings read them
    (:func:`~quasar.config.values.parse_seq_lens`, each at least ``minimum``), its error as argparse's."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            return parse_seq_lens(text, minimum)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def settings_table(role: str) -> str:
    """The settings process ``role`` reads as a Markdown table between two marker lines, by group:
    the variable, the flag, the default and what it is. The docs page of each process holds its
    table (the tests compare it; ``quasar config --table ROLE`` prints it)."""
    lines = [
        f"<!-- the settings of {role}: quasar config --table {role} -->",
        "",
        "| group | variable | flag | default | what it is |",
        "| --- | --- | --- | --- | --- |",
    ]
    group = None
    for option in role_options(role):
        shown_group = option.group if option.group != group else ""
        group = option.group
        variable = f"`{option.env}`" if option.env else ""
        flag = " ".join(f"`{name}`" for name in (option.flag, *option.aliases) if name)
        default = f"`{option.default}`" if option.default and not option.secret else ""
        meaning = option.help.replace("|", "\\|")
        lines.append(f"| {shown_group} | {variable} | {flag} | {default} | {meaning} |")
    lines += ["", "<!-- end of the settings -->"]
    return "\n".join(lines)


def env_example() -> str:
    """The text of ``.env.example``: every setting with its default and meaning, its comments
    wrapped at words within :data:`HELP_WIDTH` columns (an editor over SSH, such as nano, shows a
    line's first 80 and hides the rest)."""
    lines = [
        "# QUASAR settings. Copy to .env and edit.",
        "# Precedence: default < .env < environment < flag. A process reads the current",
        "# folder's .env, else the checkout's; export QUASAR_DOTENV=FILE to read FILE",
        "# instead (QUASAR_DOTENV= empty: none).",
        "# Regenerate with: quasar config > .env.example",
        "",
    ]
    group = None
    for option in OPTIONS:
        if option.env is None:
            continue
        if option.group != group:
            group = option.group
            lines += [f"# --- {group} ---", ""]
        # "(flag" on the line of the flag it names (a no-break space, which textwrap does not break at).
        flag = f" (flag\u00a0{' or '.join((option.flag, *option.aliases))})" if option.flag else ""
        comment = textwrap.wrap(
            f"{option.help}{flag}",
            HELP_WIDTH,
            initial_indent="# ",
            subsequent_indent="# ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        lines += [line.replace("\u00a0", " ") for line in comment]
        lines.append(f"{option.env}={option.default}")
        lines.append("")
    return "\n".join(lines)
