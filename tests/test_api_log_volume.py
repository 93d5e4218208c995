"""What the submission API logs per submission and per report: pm2 keeps every line, and a busy
subnet sends about 2,500 submissions an hour and each validator's GPUs about 140 reports an hour
each (docs/validator.md, "Logs")."""

from __future__ import annotations

import logging

import pytest

from api_fixtures import FORK, ApiServer, Clock, api_config, commit_of
from quasar.api import schemas
from quasar.api.client import ApiClient, ApiClientError, Claim
from quasar.api.db import Database
from quasar.api.devdb import PostgresUnavailable, TemporaryPostgres
from quasar.api.service import SubmissionService
from quasar.log import REPEAT_EVERY_S


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_twenty_minutes_of_submissions_and_reports_are_counted_every_ten_minutes_not_logged_each(
    database, chain, wallets, caplog
):
    """Three miners submit and two validators report on each submission, a minute apart, for 20
    minutes: 60 submissions and 120 reports. At INFO the API says how many every REPEAT_EVERY_S
    (two lines here), not a line each (180); each is logged at DEBUG."""
    caplog.set_level(logging.INFO, logger="quasar.api")
    clock = Clock()
    service = SubmissionService(api_config(wallets["api"].hotkey.ss58_address), chain, database, clock=clock)
    miners = [wallets[name].hotkey.ss58_address for name in ("a", "b", "c")]
    validators = [wallets[name].hotkey.ss58_address for name in ("v1", "v2")]
    for minute in range(20):
        for n, hotkey in enumerate(miners):
            request = schemas.SubmitKernelRequest(
                fork_url=f"https://github.com/m{n}/fla",
                commit_hash=f"{minute * 3 + n + 1:040x}",
                target_sequence_length=1_000_000,
                tokens_per_sec=10.0,
            )
            service.submit_direct(hotkey, f"192.0.2.{n + 1}", request)
        for validator in validators:
            for item in service.fetch_work(validator, 3).items:
                report = schemas.ReportRequest(
                    submission_id=item.submission_id, verdict="passed", correct=True, measured_tokens_per_sec=10.0
                )
                service.report(validator, report)
        clock.offset += 60.0
    said = [record.getMessage() for record in caplog.records if record.levelno >= logging.INFO]
    assert said == [
        f"submissions in the last {REPEAT_EVERY_S:.0f} s: 31 direct, from 3 hotkey(s)",
        f"reports in the last {REPEAT_EVERY_S:.0f} s: 61 passed, from 2 hotkey(s)",
    ], (len(said), said[:2])


def test_a_database_out_of_reach_is_said_once_not_at_every_request(chain, wallets, caplog):
    """PostgreSQL stopped under a running API: each request that needs it is answered 503, and the
    cause is logged once (then every REPEAT_EVERY_S with how many more requests it refused), not a
    line per request: miners and validators keep asking, many requests a second on a busy subnet."""
    server = TemporaryPostgres(durable=False)
    try:
        server.start()
    except PostgresUnavailable as error:
        pytest.skip(f"PostgreSQL unavailable: {error} (./scripts/test.sh installs it)")
    try:
        database_url = server.create_database("quasar_outage")
        Database(database_url).upgrade()
        api_hotkey = wallets["api"].hotkey.ss58_address
        with (
            ApiServer(api_config(api_hotkey), chain, database_url) as api,
            ApiClient(api.url, wallets["a"], api_hotkey=api_hotkey, timeout=20) as miner,
        ):
            server.stop()
            caplog.set_level(logging.INFO, logger="quasar.api")
            for n in range(20):
                with pytest.raises(ApiClientError) as refused:
                    miner.submit_kernel(Claim(FORK, commit_of(n + 1), 1e5), 1_000_000)
                assert refused.value.status == 503, refused.value
    finally:
        server.stop()
    said = [record.getMessage() for record in caplog.records if "database error" in record.getMessage()]
    assert len(said) == 1, said
