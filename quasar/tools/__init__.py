"""The tools miners and validators run by hand on their own machine, each a ``quasar`` command:
``install_kernel`` (``quasar step1``), ``tune_kernel`` (``quasar step2``), ``local_validator``
(``quasar local-validator``) and ``check_sandbox`` (``quasar check-sandbox``)."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import textwrap
from typing import NoReturn

from quasar.terminal import TABLE_WIDTH

# A flag and the value after it ("--device cpu"), kept on one line: the reader copies them together.
_FLAG_AND_VALUE = re.compile(r"(?<![\w-])(--[\w.-]+) (?=[^\s-])")
_KEPT_TOGETHER = "\u00a0"  # textwrap breaks lines only at ASCII white space


class ToolParser(argparse.ArgumentParser):
    """An argument parser whose refusals are wrapped at words to the terminal, at most 80 columns.

    The tools refuse with the harness's words (no CUDA here, a length the CPU cannot run), often
    longer than a line: argparse prints them on one line, which the terminal splits mid-word,
    through a flag or a path the reader should copy; a flag stays on the line of its value."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and ``PROG: error: MESSAGE`` wrapped at words, exit with status 2."""
        self.print_usage(sys.stderr)
        width = min(shutil.get_terminal_size().columns, TABLE_WIDTH)
        joined = _FLAG_AND_VALUE.sub(rf"\1{_KEPT_TOGETHER}", f"{self.prog}: error: {message}")
        text = textwrap.fill(joined, width, break_long_words=False, break_on_hyphens=False)
        self.exit(2, text.replace(_KEPT_TOGETHER, " ") + "\n")
