"""The submission fast lane (quasar/api/fastlane.py) against its reference, the FastAPI route.

Two real servers on 127.0.0.1, one with the lane and one without, each on a fresh database of the
same backend, the same chain and the same fixed service clock, get the same random sequence of
requests to ``POST /submit_kernel``: valid submissions, duplicates, rate-limited ones, unregistered
hotkeys, fields the model refuses or the service refuses, broken JSON, other content types, query
strings, tampered and replayed signatures, unsigned requests, and at the end a banned IP. Every
answer must be the same (status, the headers that carry meaning, body bytes), and so must what the
two databases hold afterwards.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid

import httpx
import pytest
from bittensor import http_auth
from sqlalchemy import select

from api_fixtures import ApiServer, api_config, commit_of
from quasar.api.db import IpBan, Submission, UsedNonce

REQUESTS = 160
MINERS = ("a", "b", "c")
COMPARED_HEADERS = ("content-type", "content-length", "retry-after")


@pytest.fixture(params=["sqlite", "postgresql"])
def two_databases(request, tmp_path) -> tuple[str, str]:
    """Two fresh, empty databases on one backend: (with the lane, without)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/lane.sqlite3", f"sqlite:///{tmp_path}/route.sqlite3"
    server = request.getfixturevalue("postgres")
    return tuple(server.create_database(f"quasar_{uuid.uuid4().hex[:12]}") for _ in range(2))


def random_payload(rng: random.Random, miner: int) -> dict | list | str:
    """A submission body of miner number ``miner``: mostly valid, else refused by the model or by the service."""
    # A small pool of commits per miner (duplicates happen), and one shared by all (copies happen).
    commit = rng.randrange(6) + 100 * miner if rng.random() < 0.85 else 1000 + rng.randrange(3)
    payload = {
        "fork_url": "https://github.com/miner/flash-linear-attention",
        "commit_hash": commit_of(commit),
        "target_sequence_length": rng.choice([4096, 1_000_000]),
        "tokens_per_sec": round(rng.uniform(1e3, 1e8), rng.randrange(0, 4)),
    }
    if rng.random() < 0.3:
        payload["vram_mb"] = rng.randrange(0, 100_000)
    if rng.random() < 0.3:
        payload["benchmarks"] = {str(length): rng.uniform(1, 1e8) for length in rng.sample([512, 1024, 65536], 2)}
    broken = rng.random()
    if broken < 0.06:
        payload["tokens_per_sec"] = -rng.uniform(0, 10)  # the model refuses it
    elif broken < 0.10:
        del payload[rng.choice(list(payload))]  # a field missing
    elif broken < 0.13:
        payload["unexpected"] = 1  # extra fields are refused
    elif broken < 0.17:
        payload["commit_hash"] = "abc"  # the model takes it, the service refuses it
    elif broken < 0.20:
        payload["fork_url"] = rng.choice(["https://gitlab.com/a/b", "/tmp/local-fork", "github.com/only"])
    elif broken < 0.22:
        return [payload]
    elif broken < 0.24:
        payload["target_sequence_length"] = "many"
    return payload


def random_request(
    rng: random.Random, wallets, api_hotkey: str, sent: list[tuple[str, dict, bytes]]
) -> tuple[str, dict, bytes]:
    """(path with query, headers, body) of one request; sometimes a replay of one already sent."""
    if sent and rng.random() < 0.05:
        return rng.choice(sent)
    name = "stranger" if rng.random() < 0.05 else rng.choice(MINERS)
    wallet = wallets[name]
    body = json.dumps(random_payload(rng, (*MINERS, "stranger").index(name)), separators=(",", ":")).encode()
    if rng.random() < 0.03:
        body = body[: rng.randrange(1, len(body))]  # not JSON any more
    path = "/submit_kernel?round=1" if rng.random() < 0.04 else "/submit_kernel"
    headers = http_auth.sign(wallet, method="POST", path=path, body=body, receiver_ss58=api_hotkey)
    headers["Content-Type"] = "application/json"
    kind = rng.random()
    if kind < 0.04:
        headers["Content-Type"] = "text/plain"
    elif kind < 0.06:
        del headers["Content-Type"]
    elif kind < 0.10:
        body = body.replace(b"miner", b"minor")  # signed bytes changed
    elif kind < 0.13:
        headers = {"Content-Type": "application/json"}  # unsigned
    return path, headers, body


def answer(response: httpx.Response) -> tuple:
    return (response.status_code, tuple(response.headers.get(name) for name in COMPARED_HEADERS), response.content)


def stored(server: ApiServer) -> tuple[list, int]:
    with server.database.read() as session:
        rows = session.execute(select(Submission).order_by(Submission.id)).scalars().all()
        nonces = len(session.execute(select(UsedNonce)).all())
        return [{c.name: getattr(row, c.name) for c in Submission.__table__.columns} for row in rows], nonces


def test_the_lane_answers_every_submission_as_the_route_does(two_databases, chain, wallets, caplog):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    api_hotkey = wallets["api"].hotkey.ss58_address
    config = api_config(api_hotkey, submissions_per_hour=20)  # 429s, and room for 409s before them
    now = time.time()
    lane_url, route_url = two_databases
    caplog.set_level(logging.DEBUG, logger="quasar.api.intake")
    with (
        ApiServer(config, chain, lane_url, clock=lambda: now) as lane,
        ApiServer(config, chain, route_url, clock=lambda: now, fast_lane=False) as route,
        httpx.Client(timeout=30) as http,
    ):
        sent: list[tuple[str, dict, bytes]] = []
        statuses: dict[int, int] = {}

        def send_both(path: str, headers: dict, body: bytes) -> None:
            answers = [answer(http.post(server.url + path, headers=headers, content=body)) for server in (lane, route)]
            assert answers[0] == answers[1], (seed, path, headers, body)
            statuses[answers[0][0]] = statuses.get(answers[0][0], 0) + 1

        for _ in range(REQUESTS):
            request = random_request(rng, wallets, api_hotkey, sent)
            send_both(*request)
            sent.append(request)
        for server in (lane, route):  # the IP is banned from here on
            server.database.write(
                lambda session: session.add(
                    IpBan(client_ip="127.0.0.1", banned_at=now, banned_until=now + 3600, reason="test")
                )
            )
        for _ in range(10):
            send_both(*random_request(rng, wallets, api_hotkey, sent))
        assert stored(lane) == stored(route), seed
    # Every kind of answer came up, and the lane (its own threads) made the submissions it answered.
    assert {201, 401, 403, 409, 422, 429} <= set(statuses), (seed, statuses)
    threads = {record.threadName.split("_")[0] for record in caplog.records if "direct, round" in record.getMessage()}
    assert "submit" in threads and len(threads) == 2, threads


@pytest.mark.parametrize("lane", [True, False])
def test_a_stale_submission_is_counted_for_the_apis_clock_once(lane, chain, wallets, tmp_path, monkeypatch):
    """A submission signed a minute ago, refused for the time alone, is counted once toward the
    warning that the API's clock is off (quasar/api/clockwatch.py), its registration read once:
    with the lane as without it. The lane counted it, then passed it to the route, which counted it
    again: two reads of the chain, and two threads, per stale request."""
    reads: list[str] = []
    is_registered = chain.is_registered
    monkeypatch.setattr(chain, "is_registered", lambda hotkey: reads.append(hotkey) or is_registered(hotkey))
    api_hotkey = wallets["api"].hotkey.ss58_address
    body = json.dumps(
        {"fork_url": "https://github.com/miner/flash-linear-attention", "commit_hash": commit_of(1)}
        | {"target_sequence_length": 4096, "tokens_per_sec": 1e5}
    ).encode()
    headers = http_auth.sign(
        wallets["a"],
        method="POST",
        path="/submit_kernel",
        body=body,
        receiver_ss58=api_hotkey,
        nonce_ns=time.time_ns() - 60 * 10**9,
    )
    with ApiServer(api_config(api_hotkey), chain, f"sqlite:///{tmp_path}/api.sqlite3", fast_lane=lane) as server:
        answer = httpx.post(
            f"{server.url}/submit_kernel", content=body, headers=headers | {"Content-Type": "application/json"}
        )
    assert answer.status_code == 401 and "s behind this server's clock" in answer.json()["detail"], answer.text
    assert reads == [wallets["a"].hotkey.ss58_address]
