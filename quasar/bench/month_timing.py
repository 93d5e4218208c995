"""What the month benchmarks share (``quasar bench api-month``, ``validator-month``): timed calls,
their progress bar, their options, their checks and the folder their files go to."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@dataclass
class Timing:
    """Milliseconds of ``n`` calls of one read."""

    median_ms: float
    min_ms: float
    max_ms: float
    n: int

    def cell(self, digits: int) -> str:
        """The median, then the fastest–slowest, for a table's cell."""
        return f"{self.median_ms:.{digits}f} ms\n{self.min_ms:.{digits}f}–{self.max_ms:.{digits}f}"

    def line(self, digits: int) -> str:
        """:meth:`cell` on one line, the fastest–slowest in brackets."""
        return self.cell(digits).replace("\n", " (") + ")"


def timed(call: Callable[[], Any], repeats: int) -> tuple[Timing, Any]:
    """``repeats`` calls of ``call`` timed, and what the last one returned."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - started) * 1000)
    return Timing(statistics.median(times), min(times), max(times), repeats), result


def progress_bar(console: Console) -> Progress:
    """A bar of counted steps with its description and the time elapsed; gone when done."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console, transient=True)


def counts(text: str) -> int:
    """A positive whole number (the options' type)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


class _Increasing(argparse.Action):
    """Takes a list of counts only when each is larger than the one before."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values != sorted(set(values)):
            parser.error(f"{option_string}: each must be larger than the one before (the rows are added to): {values}")
        setattr(namespace, self.dest, values)


def add_increasing_counts(
    parser: argparse.ArgumentParser, flag: str, help: str, default: list[int] | None = None
) -> None:
    """Add the option ``flag N [N ...]``: the sizes to measure at, each larger than the one before,
    as a month benchmark adds the rows of one size to those of the size before it."""
    parser.add_argument(flag, type=counts, nargs="+", metavar="N", default=default, action=_Increasing, help=help)


def json_file(text: str) -> Path:
    """``--json``: a file in a folder that is there, checked before the measuring (minutes at a
    month's size), whose figures a write refused after it would lose."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file to write")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"there is no folder {path.parent} to write {path.name} in")
    return path


def files_folder(keep: Path | None, names: Sequence[str]) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """Where the databases go: ``keep`` (made if missing), refused when it holds one of ``names``
    already (its rows would be mixed with the new ones), else a temporary folder."""
    if keep is None:
        temporary = tempfile.TemporaryDirectory(prefix="quasar-bench-")
        return Path(temporary.name), temporary
    for name in names:
        for suffix in ("", "-wal", "-shm"):
            if (keep / f"{name}{suffix}").exists():
                raise SystemExit(
                    f"{keep / name}{suffix} is there from an earlier run: remove it or --keep another folder"
                )
    try:
        keep.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SystemExit(f"--keep {keep}: cannot make that folder ({error.strerror})") from None
    return keep, None
