"""``quasar bench api-load``: load benchmark of the submission API, signed submissions and public
reads at fixed rates, at once.

Starts ``python -m quasar.api serve --workers N`` on 127.0.0.1 (as operators run it) over a fresh
SQLite file and/or a fresh throwaway PostgreSQL server (fsync on), registers the submitters' hotkeys
on a dev chain, seeds the leaderboard (a validator reports on one submission per submitter), then
for ``--seconds``:

- ``--submitters`` hotkeys send ``btauth/1``-signed ``POST /submit_kernel`` requests, together
  ``--rate`` a second, each on its own keep-alive connection;
- ``--readers`` connections send ``GET`` requests of the read mix (``READ_MIX``), together
  ``--read-rate`` a second.

The client and its schedules are in quasar/bench/api_load_traffic.py, the figures and their tables
in quasar/bench/api_load_figures.py.

Open loop: every request has a scheduled send time, and its latency is measured from that time to
the last byte of the answer, so a request that waits for its connection (because the server is
behind) counts the wait.

The window measures a server that has been up for a while, at its hardest moment: before the
traffic, every target of the read mix is asked for once on each of ``PRIME_CONNECTIONS``
connections, so that each worker has every page rendered once, as a server that has been up has
(the time it took is reported; ``--cold`` skips it); the traffic is timed so that the chain moves
to a new block at second ``BLOCK_CHANGE_AT_S`` of the window, when every page in use is rendered
again while the requests keep coming. The same traffic runs for ``--warmup`` seconds before the
window (the connections open): its requests are answered and checked for loss like the others,
and shown in the timeline (negative seconds), but they are not in the window's figures.
``--cold --warmup 0`` measures from a cold start.

Every request is signed before the traffic starts, each with a fresh nonce that is its scheduled
send time (so each is fresh when sent), and its own body; the server verifies every one. The
client speaks HTTP/1.1 on raw asyncio streams, a small share of the CPU that the server and
client share. Reported: acknowledged requests a second, latency percentiles, errors,
lost submissions (acknowledged but missing from the database afterwards; must be 0), the
server's CPU time per request, and how long a fixed Python loop took just before the run (this
machine's speed at the time: on a shared machine it varies with the neighbours).

    quasar bench api-load --backend both --workers 1 2 4 --repeat 3

Traffic goes to loopback only and stops after the timed window.
"""

import argparse
import asyncio
import json
import os
import resource
import secrets
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bittensor.sp_core import Keypair
from rich.console import Console
from sqlalchemy import select

from quasar.api.client import ApiClient, Claim
from quasar.api.db import Database, Submission
from quasar.api.devdb import TemporaryPostgres, start_api_process
from quasar.bench.api_load_figures import (
    READ_TARGET,
    TARGETS,
    Figures,
    figures_table,
    percentile,
    timeline,
    timeline_table,
)
from quasar.bench.api_load_traffic import (
    Stream,
    connection,
    prime_reads,
    read_schedules,
    read_targets,
    submission_schedules,
)
from quasar.chain.devchain import DevChain
from quasar.log import setup_logging

# By default requests are offered this much above a target rate: a run's acknowledged rate is a
# little under its offered rate (the window ends with the last answer), and the target is a floor.
OFFER_ABOVE_TARGET = 1.1
# Seconds between signing the requests and the start of the traffic.
START_MARGIN_S = 1.0
# Seconds of traffic before the timed window: long enough for every connection to be open (the
# pages were rendered before the traffic: PRIME_CONNECTIONS).
DEFAULT_WARMUP_S = 2.0
# The second of the timed window at which the chain moves to the next block (its middle if shorter).
BLOCK_CHANGE_AT_S = 3.0


def machine_speed_ms(iterations: int = 1_000_000) -> float:
    """Milliseconds a fixed pure-Python loop takes here now: on a shared machine the CPU time a
    process gets per second varies with its neighbours (not shown by the load average), and runs
    are comparable only at similar figures."""
    started = time.perf_counter()
    total = 0
    for n in range(iterations):
        total += n * n % 7
    return (time.perf_counter() - started) * 1e3


def start_for_block_change(chain: DevChain, earliest: float, warmup: float, seconds: float) -> tuple[float, float]:
    """A wall-clock time, not before ``earliest``, at which to start the traffic so that the chain
    moves to a new block at second ``BLOCK_CHANGE_AT_S`` of the window (the middle of a shorter
    one); returns (that time, that second). Waits for a block change to know the chain's phase."""
    block = chain.current_block()
    while chain.current_block() == block:
        time.sleep(0.005)
    changed = time.time()
    at = min(BLOCK_CHANGE_AT_S, seconds / 2)
    start = changed + chain.block_time_s - at - warmup
    while start < earliest:
        start += chain.block_time_s
    return start, at


def seed_leaderboard(url: str, api_hotkey: str, keys: list[Keypair], validator: Keypair) -> list[tuple[str, int]]:
    """One evaluated submission per submitter, so the leaderboard ranks something and the dashboard
    has miner and submission pages; their (hotkey, submission id)."""
    seeded = []
    for index, key in enumerate(keys):
        with ApiClient(url, key, api_hotkey=api_hotkey) as miner:
            claim = Claim(
                f"https://github.com/miner{index}/flash-linear-attention", f"{index + 1:040x}", 60_000.0 + index
            )
            accepted = miner.submit_kernel(claim, 1_000_000)
        seeded.append((key.ss58_address, accepted.submission_id))
    with ApiClient(url, validator, api_hotkey=api_hotkey) as client:
        for item in client.fetch_work(limit=len(keys)).items:
            client.report(item.submission_id, "passed", True, True, 55_000.0 + item.submission_id)
    return seeded


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children (the API's worker processes)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    try:
        pids += [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for each in pids:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def run_once(backend: str, workers: int, args: argparse.Namespace, console: Console) -> Figures:
    with tempfile.TemporaryDirectory(prefix="quasar-load-") as folder:
        workdir = Path(folder)
        postgres = TemporaryPostgres(durable=True).start() if backend == "postgresql" else None
        try:
            database_url = postgres.create_database("quasar_load") if postgres else f"sqlite:///{workdir}/api.sqlite3"
            chain = DevChain(workdir / "devchain.sqlite3", block_time_s=12.0)
            keys = [Keypair.create_from_seed(secrets.token_bytes(32)) for _ in range(args.submitters)]
            for key in keys:
                chain.register(key.ss58_address, key.ss58_address)
            validator = Keypair.create_from_seed(secrets.token_bytes(32))
            chain.register(validator.ss58_address, validator.ss58_address, stake=1e4, validator_permit=True)
            api_hotkey = Keypair.create_from_seed(secrets.token_bytes(32)).ss58_address
            try:
                process, url = start_api_process(workdir, database_url, chain.path, api_hotkey, workers=workers)
            except RuntimeError as error:
                raise SystemExit(str(error)) from None
            try:
                seeded = seed_leaderboard(url, api_hotkey, keys, validator)
                primed_s = None if args.cold else prime_reads(url, read_targets(seeded))
                host = url.removeprefix("http://")
                port = int(host.rsplit(":", 1)[1])
                total = args.warmup + args.seconds
                wall_start, block_change_s = start_for_block_change(
                    chain, time.time() + START_MARGIN_S + args.rate * total * 60e-6, args.warmup, args.seconds
                )
                submissions = submission_schedules(keys, api_hotkey, host, args.rate, total, wall_start)
                reads = read_schedules(args.readers, host, args.read_rate, total, seeded)
                load_average = os.getloadavg()[0]
                machine_ms = machine_speed_ms()
                submitted, read = Stream(), Stream()
                at_window: dict[str, float] = {}

                async def window_opens(when: float) -> None:
                    """The CPU counters when the timed window starts (the warm-up's work is not in the figures)."""
                    await asyncio.sleep(max(0.0, when - asyncio.get_running_loop().time()))
                    usage = resource.getrusage(resource.RUSAGE_SELF)
                    at_window.update(
                        server=process_tree_cpu_s(process.pid),
                        client=usage.ru_utime + usage.ru_stime,
                        wall=time.perf_counter(),
                    )

                async def traffic() -> float:
                    loop = asyncio.get_running_loop()
                    start = loop.time() + (wall_start - time.time())
                    tasks = [connection(port, s, submitted, start, args.warmup) for s in submissions]
                    tasks += [connection(port, s, read, start, args.warmup) for s in reads]
                    await asyncio.gather(window_opens(start + args.warmup), *tasks)
                    return start + args.warmup

                primed = "cold: no page rendered before" if primed_s is None else f"first renders {primed_s:.2f} s"
                console.print(
                    f"[bold]{backend}[/], {workers} worker(s): {args.seconds:g} s of {args.rate:g} "
                    f"submissions/s and {args.read_rate:g} reads/s after {args.warmup:g} s of warm-up, "
                    f"a new block at second {block_change_s:g} ({primed}; load average "
                    f"{load_average:.2f}, reference loop {machine_ms:.0f} ms)"
                )
                window_start = asyncio.run(traffic())
                elapsed = time.perf_counter() - at_window["wall"]
                usage = resource.getrusage(resource.RUSAGE_SELF)
                client_cpu = usage.ru_utime + usage.ru_stime - at_window["client"]
                server_cpu = process_tree_cpu_s(process.pid) - at_window["server"]
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
    lost = sum(1 for sid, entry in submitted.acknowledged.items() if stored.get(sid) != entry)
    window = max(submitted.last_done, read.last_done) - window_start
    ordered, read_ordered = submitted.in_window(), read.in_window()
    requests = len(ordered) + len(read_ordered)
    return Figures(
        backend=backend,
        workers=workers,
        seconds=window,
        offered_rate=args.rate,
        warmup_s=args.warmup,
        submissions_per_sec=submitted.ok / window,
        p50_ms=1000 * statistics.median(ordered),
        p99_ms=1000 * percentile(ordered, 0.99),
        max_ms=1000 * ordered[-1],
        errors=submitted.errors,
        lost=lost,
        offered_read_rate=args.read_rate,
        reads_per_sec=read.ok / window,
        read_p50_ms=1000 * statistics.median(read_ordered) if read_ordered else float("nan"),
        read_p99_ms=1000 * percentile(read_ordered, 0.99),
        read_errors=read.errors,
        server_cpu_ms_per_request=1000 * server_cpu / max(1, requests),
        client_cpu_share=client_cpu / elapsed,
        load_average=load_average,
        primed_s=primed_s,
        block_change_s=block_change_s,
        machine_ms=machine_ms,
        timeline=timeline(submitted, read, args.seconds, args.warmup),
    )


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench api-load") -> int:
    """Run the load; exit status 1 when an acknowledged submission was lost."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Load benchmark of the submission API: signed "
        "submissions and public reads at fixed rates, at once.",
    )
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="API worker processes (one run each)")
    parser.add_argument("--submitters", type=int, default=32, help="signed submitters (hotkeys), one connection each")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help=f"submissions a second in all (default: {OFFER_ABOVE_TARGET:g} x the backend's target of "
        f"{TARGETS['sqlite'][0]} SQLite, {TARGETS['postgresql'][0]} PostgreSQL)",
    )
    parser.add_argument("--readers", type=int, default=32, help="connections for the reads")
    parser.add_argument(
        "--read-rate",
        type=float,
        default=OFFER_ABOVE_TARGET * READ_TARGET[0],
        help=f"reads a second in all (0: none; default {OFFER_ABOVE_TARGET:g} x the target of {READ_TARGET[0]:,})",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the timed window")
    parser.add_argument(
        "--warmup",
        type=float,
        default=DEFAULT_WARMUP_S,
        help="seconds of the same traffic before the timed window, not in its figures",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="do not ask for every read target before the traffic (with --warmup 0: measure from a cold start)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each backend and number of workers")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument(
        "--timeline", action="store_true", help="also show each run's latency percentiles by second of the window"
    )
    args = parser.parse_args(argv)
    if not (
        1 <= args.submitters <= 256 and 1 <= args.readers <= 256 and 0 < args.seconds <= 60 and 0 <= args.warmup <= 60
    ):
        parser.error("--submitters and --readers must be 1..256, --seconds 0..60, --warmup 0..60")
    setup_logging(quiet=True)
    console = Console()
    backends = ("sqlite", "postgresql") if args.backend == "both" else (args.backend,)
    results = []
    for backend in backends:
        run_args = argparse.Namespace(**{**vars(args), "rate": args.rate or OFFER_ABOVE_TARGET * TARGETS[backend][0]})
        for workers in args.workers:
            for _ in range(args.repeat):
                results.append(run_once(backend, workers, run_args, console))

    console.print(
        f"submission API under load: {args.submitters} signed submitters and {args.readers} readers "
        f"at fixed rates for {args.seconds:g} s, server and clients on one machine"
    )
    console.print(figures_table(results))
    if args.timeline:
        for run in results:
            console.print(timeline_table(run))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if any(r.lost for r in results) else 0
