"""Durability: ``python -m quasar.api serve`` (one process, and three workers) killed with SIGKILL, all
its processes at once, in the middle of signed traffic keeps every submission it acknowledged, on
SQLite and on PostgreSQL, and carries on after a restart."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from sqlalchemy import select

from quasar.api.client import ApiClient, ApiClientError, Claim
from quasar.api.db import Database, Submission
from quasar.api.devdb import start_api_process

MINERS = ("a", "b", "c")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 3])
def test_sigkill_mid_traffic_loses_no_acknowledged_submission(tmp_path, chain, wallets, database_url, workers):
    api_hotkey = wallets["api"].hotkey.ss58_address
    process, url = start_api_process(
        tmp_path, database_url, chain.path, api_hotkey, submissions_per_hour=100_000, workers=workers
    )
    acknowledged: dict[int, tuple[str, str]] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def miner(name: str) -> None:
        client = ApiClient(url, wallets[name], api_hotkey=api_hotkey, timeout=10)
        for n in range(10_000):
            if stop.is_set():
                break
            commit = f"{MINERS.index(name) + 1:x}{n + 1:039x}"
            try:
                accepted = client.submit_kernel(Claim("https://github.com/miner/fla", commit, 1e4), 500_000)
            except ApiClientError as error:
                assert error.status == 0, error  # refused outright: only once the server is gone
                break
            with lock:
                acknowledged[accepted.submission_id] = (wallets[name].hotkey.ss58_address, commit)
        client.close()

    threads = [threading.Thread(target=miner, args=(name,)) for name in MINERS]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(acknowledged) < 60 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)  # mid-traffic, every process: requests are in flight right now
    process.wait(timeout=30)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert len(acknowledged) >= 60

    process, url = start_api_process(
        tmp_path, database_url, chain.path, api_hotkey, submissions_per_hour=100_000, workers=workers
    )
    try:
        database = Database(database_url)
        with database.read() as session:
            stored = {row.id: (row.hotkey, row.commit_hash) for row in session.scalars(select(Submission))}
        database.dispose()
        missing = {sid: entry for sid, entry in acknowledged.items() if stored.get(sid) != entry}
        assert missing == {}, f"{len(missing)} acknowledged submissions lost"
        after = ApiClient(url, wallets["a"], api_hotkey=api_hotkey).submit_kernel(
            Claim("https://github.com/miner/fla", "f" * 40, 1e4), 500_000
        )
        assert after.submission_id > max(stored)  # ids are never reused
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
