"""``quasar bench dashboard-pages``: the dashboard's pages over a database that ``quasar bench
api-month --days N --keep DIR`` wrote, each page's HTML size and server time (a request's whole
time on 127.0.0.1), served by the API's app over the chain the benchmark used (its miners and 3
validators, late in the newest round).

A page is rendered once per chain block and target, so "first render" is ``--repeats`` distinct
targets each asked for the first time (past rounds, miners, the last page of other miners'
submissions, submissions) and "already rendered" as many repeats of one of them: the median,
fastest and slowest of each. Figures: benchmarks/RESULTS.md, "The dashboard after days of a full
subnet".

    quasar bench api-month --days 2 --keep /tmp/month
    quasar bench dashboard-pages /tmp/month/api_month.sqlite3 --days 2
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Self

from rich.console import Console
from rich.table import Table

from quasar.api.app import create_app
from quasar.api.dashboard import MINER_SUBMISSIONS
from quasar.api.devdb import ThreadedServer
from quasar.bench.api_month import (
    BLOCK_S,
    PER_ROUND,
    ROUND_BLOCKS,
    ROUNDS_PER_DAY,
    SUBNET_MINERS,
    FixedChain,
    api_config,
    hotkeys,
)
from quasar.bench.month_timing import Timing, counts, json_file, progress_bar, timed
from quasar.log import setup_logging


@dataclass
class PageFigures:
    """One kind of page: the largest HTML of its targets, and their first and repeated renders."""

    page: str
    kilobytes: float
    first: Timing
    kept: Timing


class PageServer(ThreadedServer):
    """The API's app over ``chain`` and the database at ``path``, served on a free port of 127.0.0.1."""

    def __init__(self, path: Path, chain: FixedChain) -> None:
        app = create_app(api_config(), chain, f"sqlite:///{path}", clock=lambda: chain.block * BLOCK_S)
        super().__init__(app, start_timeout_s=60)

    def __enter__(self) -> Self:
        try:
            return super().__enter__()
        except RuntimeError as error:
            raise SystemExit(str(error)) from None

    def get(self, path: str) -> int:
        """``path``'s body size in bytes; SystemExit naming it unless it answers 200."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise SystemExit(f"{path}: HTTP {response.status}")
        return len(body)


def page_targets(days: int, miners: int, repeats: int) -> dict[str, list[str]]:
    """Each kind of page and its ``repeats`` distinct targets in the database api-month wrote."""
    keys = hotkeys(miners)
    newest = days * ROUNDS_PER_DAY - 1
    last_page = math.ceil((newest + 1) * PER_ROUND / MINER_SUBMISSIONS)
    # api-month's ids run round by round, miner by miner, PER_ROUND a miner, the newest EVALUATED of
    # each reported on: the newest round's last (reported) submission of the first miners.
    reported = [(newest * miners + n) * PER_ROUND + PER_ROUND for n in range(repeats)]
    return {
        "/ (leaderboard)": [f"/?round={newest - n}" for n in range(repeats)],
        "/dashboard/validators": [f"/dashboard/validators?round={newest - n}" for n in range(repeats)],
        "/dashboard/miners/{hotkey}": [f"/dashboard/miners/{key}" for key in keys[:repeats]],
        "/dashboard/miners/{hotkey}?page=last": [
            f"/dashboard/miners/{key}?page={last_page}" for key in keys[repeats : 2 * repeats]
        ],
        "/dashboard/submissions/{id}": [f"/dashboard/submissions/{sid}" for sid in reported],
    }


def measure(path: Path, days: int, miners: int, repeats: int, console: Console) -> list[PageFigures]:
    """Serve the database at ``path`` (written by api-month for ``days`` and ``miners``) and time each page."""
    chain = FixedChain(hotkeys(miners))
    chain.block = days * ROUNDS_PER_DAY * ROUND_BLOCKS - 10  # late in the newest round, as api-month left it
    targets = page_targets(days, miners, repeats)
    figures = []
    with PageServer(path, chain) as server, progress_bar(console) as progress:
        task = progress.add_task("pages", total=len(targets))
        for page, paths in targets.items():
            firsts, sizes = [], []
            for each in paths:
                first, size = timed(functools.partial(server.get, each), 1)
                firsts.append(first.median_ms)
                sizes.append(size)
            kept, _ = timed(functools.partial(server.get, paths[0]), repeats)
            spread = Timing(statistics.median(firsts), min(firsts), max(firsts), len(firsts))
            figures.append(PageFigures(page, max(sizes) / 1000, spread, kept))
            progress.advance(task)
    return figures


def table(figures: Sequence[PageFigures], days: int, miners: int) -> Table:
    """The pages as a table that fits 80 columns."""
    result = Table(
        title=f"The dashboard after {days} day(s) of {miners} miners: median (fastest–slowest)",
        header_style="bold",
    )
    result.add_column("page")
    result.add_column("HTML", justify="right")
    result.add_column("first render", justify="right")
    result.add_column("already rendered", justify="right")
    for each in figures:
        result.add_row(each.page, f"{each.kilobytes:,.0f} kB", each.first.cell(1), each.kept.cell(1))
    return result


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench dashboard-pages") -> int:
    """Time the dashboard's pages over an api-month database and print the table."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("database", type=Path, help="the api_month.sqlite3 that api-month --keep left")
    parser.add_argument("--days", type=counts, required=True, help="the --days api-month wrote it for (its last)")
    parser.add_argument(
        "--miners",
        type=counts,
        default=SUBNET_MINERS,
        help=f"the --miners it was written for (default {SUBNET_MINERS})",
    )
    parser.add_argument("--repeats", type=counts, default=7, help="targets of each page and repeats of one (default 7)")
    parser.add_argument("--json", type=json_file, metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)
    if not args.database.is_file():
        parser.error(f"no database at {args.database}: write one with quasar bench api-month --keep DIR")
    if 2 * args.repeats > args.miners:
        parser.error(f"--repeats {args.repeats} needs {2 * args.repeats} miners' pages; the database has {args.miners}")
    setup_logging(quiet=True)
    console = Console()
    figures = measure(args.database, args.days, args.miners, args.repeats, console)
    console.print(table(figures, args.days, args.miners))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(each) for each in figures], indent=2) + "\n")
    return 0
