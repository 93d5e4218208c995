"""The API's security rules across worker processes: ``python -m quasar.api serve --workers 2`` on a real
port, SQLite and PostgreSQL. Each request here goes on a fresh connection, and the kernel spreads fresh
connections over the workers' sockets (SO_REUSEPORT), so both workers serve them; the test checks that
they did. A replayed nonce, the per-hotkey rate limit and the IP ban must hold however the requests
fall on the workers: their state is in the database."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from api_fixtures import COMMIT, FORK
from quasar.api.devdb import start_api_process
from quasar.api.rules import commitment_hash, new_salt
from quasar.auth import sign_request

WORKERS = 2
REQUESTS = 16  # fresh connections per check: all of them on one of two workers has odds of 2**-15


@dataclass
class Served:
    url: str
    pid: int
    api_hotkey: str


@pytest.fixture
def serve(tmp_path, chain, wallets, database_url) -> Iterator:
    started: list = []

    def start(**options) -> Served:
        api_hotkey = wallets["api"].hotkey.ss58_address
        process, url = start_api_process(tmp_path, database_url, chain.path, api_hotkey, workers=WORKERS, **options)
        started.append(process)
        return Served(url, process.pid, api_hotkey)

    yield start
    for process in started:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def worker_pids(server_pid: int) -> set[int]:
    """The worker processes of the server (its children running uvicorn)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    return {int(pid) for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()}


def serving_pid(local_port: int, pids: set[int]) -> int | None:
    """The worker holding the accepted end of our connection from ``local_port`` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == local_port:
                inodes.add(fields[9])
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd).removeprefix("socket:[").removesuffix("]") in inodes:
                    return pid
            except OSError:
                continue
    return None


def on_fresh_connections(requests: list, pids: set[int]) -> tuple[list[httpx.Response], set[int]]:
    """Send each (method, url, body, headers) on a connection of its own, all at once; the responses
    and the workers that served them."""

    def send(request) -> tuple[httpx.Response, int | None]:
        method, url, body, headers = request
        with httpx.Client(timeout=30) as client:
            response = client.request(method, url, content=body, headers=headers)
            stream = response.extensions["network_stream"]
            local_port = stream.get_extra_info("client_addr")[1]
            return response, serving_pid(local_port, pids)

    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(send, requests))
    return [response for response, _ in results], {pid for _, pid in results if pid is not None}


def signed(served: Served, wallet, path: str, payload: dict, **headers: str) -> tuple:
    request = sign_request(wallet, "POST", served.url + path, served.api_hotkey, payload)
    return "POST", request.url, request.body, {**request.headers, **headers}


def submission(n: int) -> dict:
    return {"fork_url": FORK, "commit_hash": f"{n:040x}", "target_sequence_length": 500_000, "tokens_per_sec": 1e4}


def test_a_replay_is_refused_by_every_worker(serve, wallets):
    served = serve()
    pids = worker_pids(served.pid)
    assert len(pids) == WORKERS
    replayed = signed(served, wallets["a"], "/submit_kernel", submission(1))
    responses, serving = on_fresh_connections([replayed] * REQUESTS, pids)
    assert serving == pids  # both workers answered the same signed request
    assert sorted(r.status_code for r in responses) == [201] + [401] * (REQUESTS - 1)
    assert all("already accepted" in r.json()["detail"] for r in responses if r.status_code == 401)
    assert httpx.get(served.url + "/get_submission_stats").json()["submissions"] == 1


def test_the_rate_limit_holds_across_workers(serve, wallets):
    served = serve(submissions_per_hour=5)
    pids = worker_pids(served.pid)
    requests = [signed(served, wallets["a"], "/submit_kernel", submission(n + 1)) for n in range(REQUESTS)]
    responses, serving = on_fresh_connections(requests, pids)
    assert serving == pids
    assert sorted(r.status_code for r in responses) == [201] * 5 + [429] * (REQUESTS - 5)
    other = on_fresh_connections([signed(served, wallets["b"], "/submit_kernel", submission(99))], pids)[0]
    assert other[0].status_code == 201  # per hotkey


def test_an_ip_ban_holds_across_workers(serve, chain, wallets):
    # The proxy at 127.0.0.1 is trusted, so X-Forwarded-For names the client.
    served = serve(trusted_proxies="127.0.0.1")
    pids = worker_pids(served.pid)
    banned, elsewhere = {"X-Forwarded-For": "203.0.113.9"}, {"X-Forwarded-For": "198.51.100.4"}
    salt = new_salt()
    committed = on_fresh_connections(
        [
            signed(
                served,
                wallets["b"],
                "/commit_submission",
                {"commitment_hash": commitment_hash(salt, FORK, COMMIT), "target_sequence_length": 500_000},
                **banned,
            )
        ],
        pids,
    )
    submission_id = committed[0][0].json()["submission_id"]
    chain.advance(100)
    wrong = [
        signed(
            served,
            wallets["b"],
            "/reveal_submission",
            {
                "submission_id": submission_id,
                "commitment_salt": salt,
                "fork_url": FORK,
                "commit_hash": f"{n + 1:040x}",
                "tokens_per_sec": 1e4,
            },
            **banned,
        )
        for n in range(5)
    ]
    refusals, first = on_fresh_connections(wrong, pids)
    assert [r.status_code for r in refusals] == [400] * 5  # five failed validations, on either worker
    after = [
        signed(served, wallets[name], "/submit_kernel", submission(n + 10), **banned)
        for n, name in enumerate(["a", "b", "c"] * 4)
    ]
    responses, later = on_fresh_connections(after, pids)
    assert first | later == pids
    assert [r.status_code for r in responses] == [403] * len(after)
    assert all("IP 203.0.113.9 is banned" in r.json()["detail"] for r in responses)
    unaffected = on_fresh_connections(
        [signed(served, wallets["a"], "/submit_kernel", submission(50), **elsewhere)], pids
    )[0]
    assert unaffected[0].status_code == 201
