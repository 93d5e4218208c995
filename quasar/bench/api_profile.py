"""``quasar bench api-profile``: where a request's milliseconds go in the submission API, py-spy on
a real server under a steady load.

Starts ``python -m quasar.api serve`` (one worker) from the checkout ``--tree`` (default this one;
another commit's tree for a before/after comparison) over a fresh SQLite file and a dev chain, sends
``--rate`` signed ``POST /submit_kernel`` a second (or ``GET --path`` requests) for ``--seconds``,
and records the server with ``py-spy record --gil`` (samples only the thread holding the GIL: the
Python CPU time) at ``--hz``. Prints each component's share of the samples and its milliseconds per
request, and the server's whole CPU time per request (user + system, from /proc, which also counts
work outside the GIL: SQLite's C code, syscalls).

    pip install py-spy   # not a dependency of the project
    quasar bench api-profile --rate 100 --seconds 10

Loopback only; needs root or ptrace permission for py-spy.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from bittensor import http_auth
from bittensor.sp_core import Keypair

from quasar.api.devdb import start_api_process
from quasar.chain.devchain import DevChain
from quasar.log import setup_logging

# The checkout this package is in: the default tree whose quasar.api is profiled.
CHECKOUT = Path(__file__).resolve().parents[2]

# (component, substrings of a frame): a sample counts for the first component any of its frames matches.
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nonce store, its own transaction", ("DatabaseNonceStore.check_and_store",)),
    ("IP ban check, its own read transaction", ("SubmissionService.check_not_banned",)),
    ("signature verification (sr25519)", ("http_auth.py",)),
    ("chain lookups (registration, block)", ("devchain.py", "chaincache.py", "require_registered")),
    ("cached read (quasar.api.readcache)", ("BlockCache.response",)),
    ("service and its database work (SQLAlchemy, sqlite3)", ("service.py", "quasar/api/db.py")),
    ("body parsing and validation (FastAPI, pydantic)", ("request_body_to_args", "_get_body", "raw_body")),
    ("dependency resolution (FastAPI)", ("solve_dependencies",)),
    ("response serialization (FastAPI, pydantic)", ("serialize_response", "jsonable_encoder")),
    (
        "thread-pool hand-offs (anyio, executor)",
        ("anyio/", "run_in_threadpool", "concurrent/futures/", "run_in_executor"),
    ),
    ("logging", ("logging/__init__.py",)),
    ("submission fast lane: body, JSON, response (quasar.api.fastlane)", ("fastlane.py",)),
    ("routing and middleware (Starlette, FastAPI)", ("starlette/", "fastapi/")),
    ("HTTP parsing and socket I/O (uvicorn)", ("uvicorn/protocols",)),
    ("event loop", ("asyncio/", "uvloop")),
)


def breakdown(raw: Path, hz: float, requests: int) -> list[tuple[str, int, float]]:
    """(component, samples, ms per request) from py-spy's raw (collapsed stack) output."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if "readcache.py" in stack and "routing.py" not in stack and "fastlane.py" not in stack:
            component = "cached read answered before routing"  # the middleware served it, no app below
        else:
            component = next((name for name, keys in COMPONENTS if any(k in stack for k in keys)), "other")
        counts[component] += int(n)
    return [(name, n, 1000 * n / hz / requests) for name, n in counts.most_common()]


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench api-profile") -> int:
    """Profile the server under the load; the breakdown on stdout."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Where a request's milliseconds go in the submission "
        "API: py-spy on a real server under a steady load.",
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=CHECKOUT,
        help="checkout whose quasar.api to run (default the one this command is from)",
    )
    parser.add_argument("--rate", type=float, default=100.0, help="requests a second (steady, one at a time each)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hz", type=float, default=250.0, help="py-spy samples a second")
    parser.add_argument("--path", default=None, help="GET this path instead of signed submissions")
    parser.add_argument("--json", type=Path, help="also write the breakdown to this JSON file")
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw profile (collapsed stacks) here")
    args = parser.parse_args(argv)
    if shutil.which("py-spy") is None:
        parser.error("py-spy is not on PATH: pip install py-spy")
    setup_logging(quiet=True)
    with tempfile.TemporaryDirectory(prefix="quasar-profile-") as folder:
        workdir = Path(folder)
        chain = DevChain(workdir / "devchain.sqlite3", block_time_s=12.0)
        key = Keypair.create_from_seed(secrets.token_bytes(32))
        chain.register(key.ss58_address, key.ss58_address)
        api_hotkey = Keypair.create_from_seed(secrets.token_bytes(32)).ss58_address
        server, url = start_api_process(
            workdir, f"sqlite:///{workdir}/api.sqlite3", chain.path, api_hotkey, checkout=args.tree.resolve()
        )
        try:
            count = int(args.rate * args.seconds)
            statuses: collections.Counter[int] = collections.Counter()
            raw = workdir / "profile.txt"
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--pid",
                    str(server.pid),
                    "--gil",
                    "--rate",
                    str(int(args.hz)),
                    "--duration",
                    str(int(args.seconds)),
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # py-spy attached
            before = cpu_seconds(server.pid)

            def client(offset: int, step: int) -> None:
                with httpx.Client(timeout=30) as http:
                    start = time.monotonic()
                    for n in range(offset, count, step):
                        delay = start + n / args.rate - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        if args.path:
                            statuses[http.get(url + args.path).status_code] += 1
                            continue
                        body = json.dumps(
                            {
                                "fork_url": "https://github.com/miner/flash-linear-attention",
                                "commit_hash": f"{n + 1:040x}",
                                "target_sequence_length": 1_000_000,
                                "tokens_per_sec": 5e4,
                            }
                        ).encode()
                        headers = http_auth.sign(
                            key, method="POST", path="/submit_kernel", body=body, receiver_ss58=api_hotkey
                        )
                        statuses[
                            http.post(
                                url + "/submit_kernel",
                                content=body,
                                headers={**headers, "Content-Type": "application/json"},
                            ).status_code
                        ] += 1

            clients = [threading.Thread(target=client, args=(i, 4)) for i in range(4)]
            for thread in clients:
                thread.start()
            for thread in clients:
                thread.join()
            after = cpu_seconds(server.pid)
            user, system = after[0] - before[0], after[1] - before[1]
            spy.wait(timeout=args.seconds + 60)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=30)
        rows = breakdown(raw, args.hz, count)
        if args.raw:
            shutil.copyfile(raw, args.raw)
    samples = sum(n for _, n, _ in rows)
    print(f"{count} requests at {args.rate:g}/s from {args.tree}: statuses {dict(statuses)}")
    print(
        f"server CPU {1000 * (user + system) / count:.2f} ms a request (user {1000 * user / count:.2f}, system "
        f"{1000 * system / count:.2f}); Python holding the GIL {1000 * samples / args.hz / count:.2f} ms, of which:"
    )
    for name, n, ms in rows:
        print(f"  {ms:6.3f} ms  {100 * n / samples:5.1f}%  {name}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "requests": count,
                    "rate": args.rate,
                    "cpu_ms_per_request": 1000 * (user + system) / count,
                    "user_ms_per_request": 1000 * user / count,
                    "components": [{"name": n, "samples": s, "ms": m} for n, s, m in rows],
                },
                indent=2,
            )
        )
    return 0
