"""A validator's reports as its primary process imports them (quasar/validator/loop.py, phase 7):
``GET /validators/{hotkey}/reports?after_id=`` read with a running cursor (the last report id
seen) against the reference, every report of the hotkey read afresh, while the hotkey's workers
report concurrently."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from api_fixtures import api_config
from quasar.api import schemas
from quasar.api.service import SubmissionService


def submit(service: SubmissionService, hotkey: str, ip: str, n: int) -> int:
    request = schemas.SubmitKernelRequest(
        fork_url="https://github.com/m/fla",
        commit_hash=f"{n:040x}",
        target_sequence_length=1_000_000,
        tokens_per_sec=10.0,
    )
    return service.submit_direct(hotkey, ip, request).submission_id


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_report_cursor_sees_every_report_a_worker_commits_after_a_later_one(database, chain, wallets):
    service = SubmissionService(api_config(wallets["api"].hotkey.ss58_address), chain, database, clock=time.time)
    validator = wallets["v1"].hotkey.ss58_address  # three quarters of the stake: its word settles
    slow = submit(service, wallets["a"].hotkey.ss58_address, "192.0.2.1", 1)
    quick = submit(service, wallets["b"].hotkey.ss58_address, "192.0.2.2", 2)
    assert {item.submission_id for item in service.fetch_work(validator, 2).items} == {slow, quick}

    # Worker 1's failed report takes its id, then waits for the miner's IP (its failure is charged
    # there): another request of that IP holds it meanwhile.
    held, release = threading.Event(), threading.Event()

    def hold_the_ip(session) -> None:
        held.set()
        release.wait(10)

    holder = threading.Thread(target=lambda: database.write(hold_the_ip, locks=["ip:192.0.2.1"]))
    holder.start()
    assert held.wait(5)
    failing = schemas.ReportRequest(submission_id=slow, verdict="failed", correct=False, reasons=["wrong output"])
    worker_1 = threading.Thread(target=lambda: service.report(validator, failing))
    worker_1.start()
    # Its report's row is flushed (its id taken) once it waits for the IP's lock.
    waiting = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with database.engine.connect() as connection:
            if connection.execute(waiting).scalar_one():
                break
        time.sleep(0.01)
    else:
        pytest.fail("worker 1's report never waited for the IP's lock")

    # Worker 2 reports meanwhile; the primary imports what it finds and moves its cursor. Worker 2's
    # report either commits at once, with the higher id, or waits for worker 1's to commit first.
    passing = schemas.ReportRequest(submission_id=quick, verdict="passed", correct=True, measured_tokens_per_sec=10.0)
    worker_2 = threading.Thread(target=lambda: service.report(validator, passing))
    worker_2.start()
    while worker_2.is_alive() and time.monotonic() < deadline + 10:
        with database.engine.connect() as connection:
            if connection.execute(waiting).scalar_one() >= 2:
                break
        time.sleep(0.01)
    seen = service.validator_reports(validator, 0, 100).reports
    after = max((report.report_id for report in seen), default=0)
    release.set()
    for thread in (holder, worker_1, worker_2):
        thread.join()
    seen += service.validator_reports(validator, after, 100).reports

    every = service.validator_reports(validator, 0, 100).reports
    assert sorted(r.report_id for r in seen) == sorted(r.report_id for r in every), (
        [(r.report_id, r.submission_id) for r in every],
        after,
    )
