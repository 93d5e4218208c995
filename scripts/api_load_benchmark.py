#!/usr/bin/env python
"""Load benchmark of the submission API: many concurrent signed submitters against a real server.

Starts ``python -m quasar.api serve`` on 127.0.0.1 (as operators run it) over a fresh SQLite file
and/or a fresh throwaway PostgreSQL server, registers the submitters' hotkeys on a dev chain, and
has every submitter send signed ``POST /submit_kernel`` requests back to back. Reports throughput
(acknowledged requests/sec), latency percentiles, errors, and lost submissions: acknowledged ones
missing from the database afterwards (must be 0).

    python scripts/api_load_benchmark.py --backend both --submitters 32 --requests 40

Traffic goes to loopback only and stops after submitters x requests requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from bittensor import http_auth
from bittensor.sp_core import Keypair
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quasar.api.db import Database, Submission  # noqa: E402
from quasar.api.devdb import TemporaryPostgres, start_api_process  # noqa: E402
from quasar.chain.devchain import DevChain  # noqa: E402


@dataclass(frozen=True)
class Figures:
    """One backend's run."""

    backend: str
    submitters: int
    requests: int
    acknowledged: int
    errors: dict[str, int]
    seconds: float
    requests_per_sec: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    lost: int


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(fraction * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


async def run_submitters(url: str, api_hotkey: str, keys: list[Keypair], requests_each: int,
                         progress: Progress) -> tuple[list[float], dict[int, tuple[str, str]], dict[str, int]]:
    latencies: list[float] = []
    acknowledged: dict[int, tuple[str, str]] = {}
    errors: dict[str, int] = {}
    task = progress.add_task("requests", total=len(keys) * requests_each)
    limits = httpx.Limits(max_connections=len(keys), max_keepalive_connections=len(keys))
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async def submitter(index: int, key: Keypair) -> None:
            for n in range(requests_each):
                commit = f"{index + 1:08x}{n:032x}"
                body = json.dumps({"fork_url": f"https://github.com/miner{index}/flash-linear-attention",
                                   "commit_hash": commit, "target_sequence_length": 1_000_000,
                                   "tokens_per_sec": 50_000.0}, separators=(",", ":")).encode()
                headers = http_auth.sign(key, method="POST", path="/submit_kernel", body=body,
                                         receiver_ss58=api_hotkey)
                headers["Content-Type"] = "application/json"
                started = time.perf_counter()
                try:
                    response = await client.post(url + "/submit_kernel", content=body, headers=headers)
                    outcome = str(response.status_code)
                except httpx.HTTPError as error:
                    response, outcome = None, type(error).__name__
                latencies.append(time.perf_counter() - started)
                if response is not None and response.status_code == 201:
                    acknowledged[response.json()["submission_id"]] = (key.ss58_address, commit)
                else:
                    errors[outcome] = errors.get(outcome, 0) + 1
                progress.advance(task)

        await asyncio.gather(*(submitter(i, key) for i, key in enumerate(keys)))
    return latencies, acknowledged, errors


def run_backend(backend: str, submitters: int, requests_each: int, console: Console) -> Figures:
    with tempfile.TemporaryDirectory(prefix="quasar-load-") as folder:
        workdir = Path(folder)
        postgres = TemporaryPostgres(durable=True).start() if backend == "postgresql" else None
        try:
            database_url = postgres.create_database("quasar_load") if postgres else f"sqlite:///{workdir}/api.sqlite3"
            chain = DevChain(workdir / "devchain.sqlite3", netuid=24, block_time_s=12.0)
            keys = [Keypair.create_from_seed(secrets.token_bytes(32)) for _ in range(submitters)]
            for key in keys:
                chain.register(key.ss58_address, key.ss58_address)
            api_hotkey = Keypair.create_from_seed(secrets.token_bytes(32)).ss58_address
            try:
                process, url = start_api_process(workdir, database_url, chain.path, api_hotkey)
            except RuntimeError as error:
                raise SystemExit(str(error)) from None
            try:
                with Progress(TextColumn(f"[bold]{backend}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=console) as progress:
                    started = time.perf_counter()
                    latencies, acknowledged, errors = asyncio.run(
                        run_submitters(url, api_hotkey, keys, requests_each, progress))
                    seconds = time.perf_counter() - started
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
            database = Database(database_url)
            with database.read() as session:
                stored = {row.id: (row.hotkey, row.commit_hash) for row in session.scalars(select(Submission))}
            database.dispose()
        finally:
            if postgres:
                postgres.stop()
    lost = sum(1 for sid, entry in acknowledged.items() if stored.get(sid) != entry)
    ordered = sorted(latencies)
    return Figures(backend=backend, submitters=submitters, requests=len(latencies), acknowledged=len(acknowledged),
                   errors=errors, seconds=seconds, requests_per_sec=len(acknowledged) / seconds,
                   p50_ms=1000 * statistics.median(ordered), p99_ms=1000 * percentile(ordered, 0.99),
                   max_ms=1000 * ordered[-1], lost=lost)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--submitters", type=int, default=32, help="concurrent signed submitters (hotkeys)")
    parser.add_argument("--requests", type=int, default=40, help="submissions per submitter")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if not (1 <= args.submitters <= 256 and 1 <= args.requests <= 10_000):
        parser.error("--submitters must be 1..256 (subnet size) and --requests 1..10000")
    console = Console()
    backends = ("sqlite", "postgresql") if args.backend == "both" else (args.backend,)
    results = [run_backend(backend, args.submitters, args.requests, console) for backend in backends]

    table = Table(title=f"submission API under load: {args.submitters} signed submitters x {args.requests} "
                        f"POST /submit_kernel, server and clients on one machine")
    for column in ("backend", "requests", "acknowledged", "req/s", "p50 ms", "p99 ms", "max ms", "errors", "lost"):
        table.add_column(column, justify="left" if column in ("backend", "errors") else "right")
    for r in results:
        table.add_row(r.backend, str(r.requests), str(r.acknowledged), f"{r.requests_per_sec:,.0f}",
                      f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}", f"{r.max_ms:.1f}",
                      ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())) or "none", str(r.lost))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if any(r.lost for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
