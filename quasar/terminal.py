"""What people read in a terminal: tables that fit 80 columns, short forms of long figures, and
tables shown beside log lines without being folded into a log record's message column.

Most miners and validators work over SSH in an 80-column terminal, so every table the suite prints
while running keeps to :data:`TABLE_WIDTH` and every figure in it stays whole on its line.
"""

from __future__ import annotations

import argparse
import io
import logging
import math
import re
import shutil
import sys
import textwrap
from typing import NoReturn

from rich import box
from rich.console import Console, RenderableType
from rich.logging import RichHandler
from rich.table import Table

# The width tables are laid out for when they are written into a log (pm2, systemd, a file).
TABLE_WIDTH = 80

# A flag and the value after it ("--device cpu"), kept on one line: the reader copies them together.
_FLAG_AND_VALUE = re.compile(r"(?<![\w-])(--[\w.-]+) (?=[^\s-])")
# A figure and its unit ("3.7 s", "16,384 MiB"), kept on one line: "(3.7" ending one line and "s)"
# opening the next reads as two things.
_FIGURE_AND_UNIT = re.compile(r"(?<=\d) (?=(?:ms|s|KiB|MiB|GiB)\b)")
_KEPT_TOGETHER = "\u00a0"  # textwrap breaks lines only at ASCII white space


def short_hotkey(hotkey: str) -> str:
    """``5F3sa2TJ…hv8K``: enough of an ss58 address to tell miners apart in a table."""
    return f"{hotkey[:8]}…{hotkey[-4:]}" if len(hotkey) > 14 else hotkey


def compact_rate(value: float | None) -> str:
    """Tokens/s in M (two decimals) or k (one): ``61.96 M``, ``812.3 k``; ``-`` for none."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e6:
        return f"{value / 1e6:,.2f} M"
    return f"{value / 1e3:.1f} k" if abs(value) >= 1e3 else f"{value:.0f}"


def compact_table(title: str | None = None, **options) -> Table:
    """A table with one rule under its header and no outer frame: the most columns 80 fit."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, **options)


def rendered_text(renderable: RenderableType, width: int = TABLE_WIDTH) -> str:
    """``renderable`` as plain text laid out for ``width`` columns (no colour, no trailing blanks)."""
    out = io.StringIO()
    Console(file=out, width=width, no_color=True, color_system=None, force_terminal=False).print(renderable)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip().splitlines())


def _terminal_console() -> Console | None:
    """The console of the root logger's rich handler (a terminal), if it has one."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, RichHandler):
            return handler.console
    return None


def log_table(logger: logging.Logger, message: str, table: RenderableType) -> None:
    """Log ``message`` at INFO and show ``table`` below it.

    On a terminal the table is printed on the log's console at full width, not inside the
    record's message column (where it would wrap every row); in a plain log (pm2, files) it
    follows the message in the same record, laid out for :data:`TABLE_WIDTH` columns.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    console = _terminal_console()
    if console is not None:
        logger.info("%s", message)
        console.print(table)
    else:
        logger.info("%s\n%s", message, rendered_text(table))


def wrapped(message: str, width: int | None = None, indent: str = "") -> str:
    """``message`` as one paragraph wrapped at words to ``width`` (the terminal's), at most
    :data:`TABLE_WIDTH` columns, its lines after the first indented by ``indent``: a word longer
    than a line (a path, a URL) whole on its own, a flag on the line of its value, a figure on the
    line of its unit. A message printed on one line is split by the terminal mid-word, through the
    flag or path the reader should copy."""
    width = min(width or shutil.get_terminal_size().columns, TABLE_WIDTH)
    joined = _FLAG_AND_VALUE.sub(rf"\1{_KEPT_TOGETHER}", " ".join(message.split()))
    joined = _FIGURE_AND_UNIT.sub(_KEPT_TOGETHER, joined)
    text = textwrap.fill(joined, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return text.replace(_KEPT_TOGETHER, " ")


def shell_command(command: str, indent: str = "") -> str:
    """``command``, to copy into a shell, in lines of at most :data:`TABLE_WIDTH` columns continued
    with a backslash, each flag on the line of its value, the lines after the first indented four
    more than ``indent``: a longer line the terminal splits mid-word, or through a path."""
    joined = _FLAG_AND_VALUE.sub(rf"\1{_KEPT_TOGETHER}", " ".join(command.split()))
    lines = textwrap.wrap(
        joined,
        TABLE_WIDTH - 2,  # room for the " \\" that continues it
        initial_indent=indent,
        subsequent_indent=indent + "    ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return " \\\n".join(lines).replace(_KEPT_TOGETHER, " ")


class WrappingParser(argparse.ArgumentParser):
    """An argument parser whose refusals are :func:`wrapped`: the commands refuse a bad setting or
    a missing one in words naming it, where it came from and the cure, often longer than a line."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and ``PROG: error: MESSAGE`` wrapped at words, exit with status 2."""
        self.print_usage(sys.stderr)
        self.exit(2, wrapped(f"{self.prog}: error: {message}") + "\n")
