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

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import secrets
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from bittensor import http_auth
from bittensor.sp_core import Keypair
from rich.console import Console
from rich.table import Table
from sqlalchemy import select

from quasar.api.client import ApiClient
from quasar.api.db import Database, Submission
from quasar.api.devdb import TemporaryPostgres, start_api_process
from quasar.chain.devchain import DevChain
from quasar.log import setup_logging

# The public reads (path, share of the read rate): one line per route. The dashboard's miner and
# submission pages take each seeded miner and submission in turn.
READ_MIX: tuple[tuple[str, int], ...] = (
    ("/leaderboard", 1),
    ("/get_current_round", 1),
    ("/", 1),
    ("/dashboard/miners/{hotkey}", 1),
    ("/dashboard/submissions/{submission_id}", 1),
)
TARGETS = {  # backend: (submissions/s, submission p99 ms); reads: 1,000/s under 50 ms on both
    "sqlite": (300, 100.0),
    "postgresql": (200, 150.0),
}
READ_TARGET = (1000, 50.0)
BACKEND_LABELS = {"sqlite": "SQLite", "postgresql": "PG"}
# By default requests are offered this much above a target rate: a run's acknowledged rate is a
# little under its offered rate (the window ends with the last answer), and the target is a floor.
OFFER_ABOVE_TARGET = 1.1
# Seconds between signing the requests and the start of the traffic.
START_MARGIN_S = 1.0
# Seconds of traffic before the timed window: long enough for every connection to be open (the
# pages were rendered before the traffic: PRIME_CONNECTIONS).
DEFAULT_WARMUP_S = 2.0
# Connections that ask for every read target before the traffic: the kernel spreads connections
# over the workers, so with eight each of up to four workers very likely gets at least one.
PRIME_CONNECTIONS = 8
# The second of the timed window at which the chain moves to the next block (its middle if shorter).
BLOCK_CHANGE_AT_S = 3.0
# Seconds before its first request that a connection opens (within the warm-up).
CONNECT_AHEAD_S = 1.0


@dataclass
class Stream:
    """One kind of traffic's outcome: each answer's latency (s) and when it was scheduled (s into
    the timed window; negative in the warm-up), statuses and acknowledged submissions (warm-up
    included), answers ok in the window and the window's last answer (loop time)."""

    latencies: list[float] = field(default_factory=list)
    scheduled: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    acknowledged: dict[int, tuple[str, str]] = field(default_factory=dict)
    ok: int = 0
    last_done: float = 0.0

    def in_window(self) -> list[float]:
        """The latencies of the requests scheduled in the timed window, ascending."""
        return sorted(latency for latency, at in zip(self.latencies, self.scheduled) if at >= 0)


@dataclass(frozen=True)
class Figures:
    """One run of one backend with one number of workers."""

    backend: str
    workers: int
    seconds: float
    offered_rate: float
    submissions_per_sec: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: dict[str, int]
    lost: int
    offered_read_rate: float
    reads_per_sec: float
    read_p50_ms: float
    read_p99_ms: float
    read_errors: dict[str, int]
    server_cpu_ms_per_request: float
    client_cpu_share: float
    load_average: float
    primed_s: float | None = None  # seconds the first renders took before the traffic; None: --cold
    block_change_s: float = 0.0  # second of the window at which the chain moved to the next block
    machine_ms: float = 0.0  # the reference loop's time before the run (machine_speed_ms)
    warmup_s: float = 0.0
    # (second of the window, negative in the warm-up; submission p50, p99, read p50, p99 in ms) of the
    # requests scheduled in it
    timeline: tuple[tuple[int, float, float, float, float], ...] = ()


def machine_speed_ms(iterations: int = 1_000_000) -> float:
    """Milliseconds a fixed pure-Python loop takes here now: on a shared machine the CPU time a
    process gets per second varies with its neighbours (not shown by the load average), and runs
    are comparable only at similar figures."""
    started = time.perf_counter()
    total = 0
    for n in range(iterations):
        total += n * n % 7
    return (time.perf_counter() - started) * 1e3


def timeline(
    submitted: Stream, read: Stream, seconds: float, warmup: float = 0.0
) -> tuple[tuple[int, float, float, float, float], ...]:
    """Latency percentiles (ms) of the requests scheduled in each second of the warm-up (negative
    seconds) and of the window: where slow requests were (a start-up, a block change), which the
    whole run's p99 hides."""
    rows = []
    for second in range(-math.ceil(warmup), math.ceil(seconds)):
        cells = []
        for stream in (submitted, read):
            inside = sorted(
                latency for latency, at in zip(stream.latencies, stream.scheduled) if math.floor(at) == second
            )
            cells += [1000 * statistics.median(inside), 1000 * percentile(inside, 0.99)] if inside else [math.nan] * 2
        rows.append((second, *cells))
    return tuple(rows)


def timeline_table(run: Figures) -> Table:
    table = Table(
        title=f"{BACKEND_LABELS[run.backend]} x{run.workers}: latency by second of the window (ms)",
        caption="* the chain moved to a new block in this second",
    )
    for heading in ("second", "submit p50", "submit p99", "read p50", "read p99"):
        table.add_column(heading, justify="right")
    for second, *cells in run.timeline:
        mark = " *" if second == math.floor(run.block_change_s) else ""
        table.add_row(f"{second}{mark}", *(f"{cell:,.0f}" for cell in cells))
    return table


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(fraction * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def http_request(method: str, path: str, host: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[int, bytes]:
    """Send one request on a keep-alive connection; the status and the body of the answer."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length) if length else b""


async def connection(
    port: int,
    schedule: Sequence[tuple[float, bytes, tuple[str, str] | None]],
    stream: Stream,
    start: float,
    warmup: float,
) -> None:
    """Send ``schedule`` (send time after ``start``, request bytes, submission identity) in order;
    the timed window starts ``warmup`` seconds after ``start``. The connection opens
    ``CONNECT_AHEAD_S`` before the first request (the server closes a connection that has sent no
    request within ``API_HEADER_TIMEOUT``)."""
    loop = asyncio.get_running_loop()
    if schedule:
        await asyncio.sleep(max(0.0, start + schedule[0][0] - CONNECT_AHEAD_S - loop.time()))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for offset, request, identity in schedule:
            due = start + offset
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                status, body = await exchange(reader, writer, request)
            except (OSError, asyncio.IncompleteReadError) as error:
                stream.errors[type(error).__name__] = stream.errors.get(type(error).__name__, 0) + 1
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                continue
            done = loop.time()
            stream.latencies.append(done - due)
            stream.scheduled.append(offset - warmup)
            if offset >= warmup:
                stream.last_done = max(stream.last_done, done)
                stream.ok += status in (200, 201)
            if status in (200, 201):
                if identity is not None:
                    stream.acknowledged[json.loads(body)["submission_id"]] = identity
            else:
                stream.errors[str(status)] = stream.errors.get(str(status), 0) + 1
    finally:
        writer.close()


def submission_schedules(
    keys: list[Keypair], api_hotkey: str, host: str, rate: float, seconds: float, wall_start: float
) -> list[list[tuple[float, bytes, tuple[str, str]]]]:
    """Per submitter, its requests at ``rate`` in all, each signed now with its send time as nonce."""
    schedules: list[list[tuple[float, bytes, tuple[str, str]]]] = [[] for _ in keys]
    for n in range(int(rate * seconds)):
        index = n % len(keys)
        key, offset = keys[index], n / rate
        commit = f"{index + 1:08x}{n:032x}"
        body = json.dumps(
            {
                "fork_url": f"https://github.com/miner{index}/flash-linear-attention",
                "commit_hash": commit,
                "target_sequence_length": 1_000_000,
                "tokens_per_sec": 50_000.0,
            },
            separators=(",", ":"),
        ).encode()
        headers = http_auth.sign(
            key,
            method="POST",
            path="/submit_kernel",
            body=body,
            receiver_ss58=api_hotkey,
            nonce_ns=int((wall_start + offset) * 1e9),
        )
        request = http_request("POST", "/submit_kernel", host, body, {**headers, "Content-Type": "application/json"})
        schedules[index].append((offset, request, (key.ss58_address, commit)))
    return schedules


def read_schedules(
    readers: int, host: str, rate: float, seconds: float, seeded: Sequence[tuple[str, int]]
) -> list[list[tuple[float, bytes, None]]]:
    """Per reader connection, its GETs of the read mix at ``rate`` in all; the dashboard's pages of
    the ``seeded`` (hotkey, submission id) pairs in turn."""
    mix = [path for path, share in READ_MIX for _ in range(share)]
    schedules: list[list[tuple[float, bytes, None]]] = [[] for _ in range(readers)]
    for n in range(int(rate * seconds)):
        hotkey, submission_id = seeded[(n // len(mix)) % len(seeded)]
        path = mix[n % len(mix)].format(hotkey=hotkey, submission_id=submission_id)
        schedules[n % readers].append((n / rate, http_request("GET", path, host), None))
    return schedules


def read_targets(seeded: Sequence[tuple[str, int]]) -> list[str]:
    """Every path the read mix asks for, once each."""
    paths = (
        path.format(hotkey=hotkey, submission_id=submission_id)
        for hotkey, submission_id in seeded
        for path, _ in READ_MIX
    )
    return list(dict.fromkeys(paths))


def prime_reads(url: str, paths: Sequence[str], connections: int = PRIME_CONNECTIONS) -> float:
    """Ask for every one of ``paths`` on each of ``connections`` connections in turn, so that each
    worker has rendered every page (or read it from the one that did); the seconds it took."""
    started = time.perf_counter()
    clients = [httpx.Client(base_url=url, timeout=60) for _ in range(connections)]
    try:
        for client in clients:
            for path in paths:
                client.get(path).raise_for_status()
    finally:
        for client in clients:
            client.close()
    return time.perf_counter() - started


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
            accepted = miner.submit_kernel(
                f"https://github.com/miner{index}/flash-linear-attention",
                f"{index + 1:040x}",
                1_000_000,
                60_000.0 + index,
            )
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
            chain = DevChain(workdir / "devchain.sqlite3", netuid=24, block_time_s=12.0)
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


def meets_targets(r: Figures) -> bool:
    rate, p99 = TARGETS[r.backend]
    return (
        r.submissions_per_sec >= rate
        and r.p99_ms < p99
        and r.lost == 0
        and not r.errors
        and (
            r.offered_read_rate == 0
            or (r.reads_per_sec >= READ_TARGET[0] and r.read_p99_ms < READ_TARGET[1] and not r.read_errors)
        )
    )


def figures_table(results: Sequence[Figures]) -> Table:
    """A column per backend and number of workers, a row per figure: the median of its runs (errors
    and lost submissions summed), so six configurations fit 80 columns; the JSON keeps every run."""
    groups: dict[tuple[str, int], list[Figures]] = {}
    for r in results:
        groups.setdefault((r.backend, r.workers), []).append(r)
    table = Table(show_header=True, header_style="bold")
    table.add_column("figure")
    for backend, workers in groups:
        table.add_column(f"{BACKEND_LABELS[backend]}\n×{workers}", justify="right")

    def median(value: Callable[[Figures], float], form: str) -> Callable[[list[Figures]], str]:
        return lambda runs: format(statistics.median(value(r) for r in runs), form)

    def errors(counts: Callable[[Figures], dict[str, int]]) -> Callable[[list[Figures]], str]:
        def cell(runs: list[Figures]) -> str:
            total: dict[str, int] = {}
            for r in runs:
                for key, count in counts(r).items():
                    total[key] = total.get(key, 0) + count
            return ", ".join(f"{k}: {v}" for k, v in sorted(total.items())) or "none"

        return cell

    rows = (
        ("submit/s", median(lambda r: r.submissions_per_sec, ",.0f")),
        ("submit p50 ms", median(lambda r: r.p50_ms, ".1f")),
        ("submit p99 ms", median(lambda r: r.p99_ms, ".1f")),
        ("submit max ms", median(lambda r: r.max_ms, ".1f")),
        ("submit errors", errors(lambda r: r.errors)),
        ("lost", lambda runs: str(sum(r.lost for r in runs))),
        ("reads/s", median(lambda r: r.reads_per_sec, ",.0f")),
        ("read p50 ms", median(lambda r: r.read_p50_ms, ".1f")),
        ("read p99 ms", median(lambda r: r.read_p99_ms, ".1f")),
        ("read errors", errors(lambda r: r.read_errors)),
        ("server CPU ms/req", median(lambda r: r.server_cpu_ms_per_request, ".2f")),
        ("load average", median(lambda r: r.load_average, ".2f")),
        ("reference loop ms", median(lambda r: r.machine_ms, ".0f")),
        ("targets met", lambda runs: f"{sum(meets_targets(r) for r in runs)} of {len(runs)}"),
    )
    for name, cell in rows:
        table.add_row(name, *(cell(runs) for runs in groups.values()))
    return table


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
        help="submissions a second in all (default: 1.1 x the backend's target of 300 SQLite, 200 PostgreSQL)",
    )
    parser.add_argument("--readers", type=int, default=32, help="connections for the reads")
    parser.add_argument(
        "--read-rate",
        type=float,
        default=OFFER_ABOVE_TARGET * READ_TARGET[0],
        help="reads a second in all (0: none; default 1.1 x the target of 1,000)",
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
