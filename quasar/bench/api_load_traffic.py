"""The open-loop client of ``quasar bench api-load`` (quasar/bench/api_load.py): HTTP/1.1 on raw
asyncio streams, one keep-alive connection per submitter or reader, and the requests each sends,
signed and scheduled before the traffic starts.

Every request has a scheduled send time, and its latency is measured from that time to the last
byte of the answer, so a request that waits for its connection (because the server is behind)
counts the wait.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from bittensor import http_auth
from bittensor.sp_core import Keypair

# The public reads (path, share of the read rate): one line per route. The dashboard's miner and
# submission pages take each seeded miner and submission in turn.
READ_MIX: tuple[tuple[str, int], ...] = (
    ("/leaderboard", 1),
    ("/get_current_round", 1),
    ("/", 1),
    ("/dashboard/miners/{hotkey}", 1),
    ("/dashboard/submissions/{submission_id}", 1),
)
# Connections that ask for every read target before the traffic: the kernel spreads connections
# over the workers, so with eight each of up to four workers very likely gets at least one.
PRIME_CONNECTIONS = 8
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


def prime_reads(url: str, paths: Sequence[str]) -> float:
    """Ask for every one of ``paths`` on each of :data:`PRIME_CONNECTIONS` connections in turn, so
    that each worker has rendered every page (or read it from the one that did); the seconds it took."""
    started = time.perf_counter()
    clients = [httpx.Client(base_url=url, timeout=60) for _ in range(PRIME_CONNECTIONS)]
    try:
        for client in clients:
            for path in paths:
                client.get(path).raise_for_status()
    finally:
        for client in clients:
            client.close()
    return time.perf_counter() - started
