"""The submission API end to end: a real server on 127.0.0.1, real wallets, the dev chain, and both
database backends (every test here runs on SQLite and on PostgreSQL)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import ANY

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from bittensor import http_auth

from api_fixtures import COMMIT, FORK, ApiServer, api_config, commit_of, refused
from quasar.api.client import ApiClientError, Claim
from quasar.api.db import Base, Database
from quasar.api.rules import commitment_hash, new_salt
from quasar.auth import sign_request
from quasar.config.values import MAX_SEQ_LEN


def send(
    api,
    wallet_name: str,
    method: str,
    path: str,
    payload=None,
    *,
    body: bytes | None = None,
    receiver: str | None = None,
    headers: dict | None = None,
) -> httpx.Response:
    """A signed request sent raw, so tests can tamper with any part of it."""
    request = sign_request(api.wallets[wallet_name], method, api.url + path, receiver or api.hotkey, payload)
    return httpx.request(
        method,
        request.url,
        content=request.body if body is None else body,
        headers={**request.headers, **(headers or {})},
        timeout=30,
    )


SUBMISSION = {"fork_url": FORK, "commit_hash": COMMIT, "target_sequence_length": 1_000_000, "tokens_per_sec": 5e4}


# --- the protocol ---


def test_whole_protocol_submit_commit_reveal_evaluate_rank_and_roll_over(start_api):
    api = start_api()
    a, b, c, v1, v2 = (api.client(name) for name in ("a", "b", "c", "v1", "v2"))
    assert a.health().api_hotkey == api.hotkey
    start_round = a.current_round()

    direct = a.submit_kernel(
        Claim(FORK, COMMIT, 100_000.0, vram_mb=70_000, benchmarks={512: 3e5, 1_000_000: 1e5}), 1_000_000
    )
    assert direct.state == "ready" and direct.round_id == start_round.round_id

    salt, fork_b, commit_b = new_salt(), "https://github.com/Bob/FLA.git", commit_of(0xB0B)
    committed = b.commit(commitment_hash(salt, fork_b, commit_b), 1_000_000)
    assert committed.reveal_from_block == committed.commit_block + 100
    assert [(p.submission_id, p.state) for p in a.pending_reveals().pending] == [(committed.submission_id, "waiting")]
    refused(
        lambda: b.reveal(committed.submission_id, salt, Claim(fork_b, commit_b, 80_000.0)),
        409,
        "too early",
        f"from block {committed.reveal_from_block}",
    )
    api.chain.advance(99)
    refused(lambda: b.reveal(committed.submission_id, salt, Claim(fork_b, commit_b, 80_000.0)), 409, "too early")
    api.chain.advance(1)
    revealed = b.reveal(committed.submission_id, salt, Claim(fork_b, commit_b, 80_000.0))
    assert revealed.submission_id == committed.submission_id and revealed.state == "ready"
    assert revealed.submitted_at == committed.submitted_at  # the commit's time is the submission time
    refused(lambda: b.reveal(committed.submission_id, salt, Claim(fork_b, commit_b, 80_000.0)), 409, "already revealed")
    assert a.pending_reveals().pending == []

    inflated = c.submit_kernel(Claim("https://github.com/carol/fla", commit_of(0xC), 500_000.0), 1_000_000)

    # Each validator gets every submission once, the highest upper bound (claim x multiplier) first; a
    # fetched one is held while leased.
    expected = [inflated.submission_id, direct.submission_id, committed.submission_id]
    work = v1.fetch_work(limit=10)
    assert [item.submission_id for item in work.items] == expected
    assert work.items[2].fork_url == "https://github.com/bob/fla" and work.items[2].commit_hash == commit_b
    assert work.items[1].benchmarks == {512: 3e5, 1_000_000: 1e5}
    assert v1.fetch_work().items == []
    assert [item.submission_id for item in v2.fetch_work(limit=2).items] == expected[:2]
    assert [item.submission_id for item in v2.fetch_work(limit=2).items] == expected[2:]

    # a measures 95k of its claimed 100k; b 90k over its claimed 80k (verified 80k); c's claim is 5x too high.
    measured = {
        (1, direct.submission_id): 95_000.0,
        (2, direct.submission_id): 97_000.0,
        (1, committed.submission_id): 90_000.0,
        (2, committed.submission_id): 88_000.0,
        (1, inflated.submission_id): 100_000.0,
        (2, inflated.submission_id): 100_000.0,
    }
    for index, validator in ((1, v1), (2, v2)):
        for submission_id in expected:
            figure = measured[(index, submission_id)]
            passed = submission_id != inflated.submission_id
            validator.report(
                submission_id,
                "passed" if passed else "failed",
                correct=True,
                logits_ok=True,
                measured_tokens_per_sec=figure,
                benchmarks={1_000_000: figure},
                reasons=[] if passed else ["measured 100,000 tok/s is below 0.9 x claimed 500,000"],
            )
    refused(lambda: v1.report(direct.submission_id, "passed", True, True, 1.0), 409, "already reported")
    assert v1.fetch_work().items == []  # reported: never handed to v1 again

    api.chain.advance(1)  # reports count from the block after they arrive
    board = a.leaderboard()
    assert [(e.place, e.hotkey, e.submission_id) for e in board.entries] == [
        (1, api.wallets["a"].hotkey.ss58_address, direct.submission_id),
        (2, api.wallets["b"].hotkey.ss58_address, committed.submission_id),
    ]
    first, second = board.entries
    # The consensus figure: the highest that validators holding more than half of the stake (v1: 3/4)
    # measured at least.
    assert first.measured_tokens_per_sec == 95_000.0 and first.weighted_score == pytest.approx(95_000.0 * 3)
    assert second.measured_tokens_per_sec == 90_000.0 and second.weighted_score == pytest.approx(80_000.0 * 3)
    assert (first.share, second.share, board.unassigned) == (0.6, 0.25, 0.15)
    assert board.evaluated_submissions == 3 and first.validators == 2

    stats = a.stats(hotkey=api.wallets["a"].hotkey.ss58_address)
    counts = (stats.submissions, stats.ready, stats.awaiting_reveal, stats.reports, stats.hotkey_submissions)
    assert counts == (3, 3, 0, 6, 1)

    # Round rollover: the next round starts on the chain's block, not the wall clock.
    now = a.current_round()
    api.chain.advance(now.blocks_left)
    rolled = a.current_round()
    assert rolled.round_id == now.round_id + 1 and rolled.start_block == now.end_block + 1 == rolled.current_block
    late = c.submit_kernel(Claim("https://github.com/carol/fla", commit_of(0xD), 90_000.0), 1_000_000)
    assert late.round_id == rolled.round_id
    assert a.leaderboard().entries == [] and a.leaderboard().round_id == rolled.round_id
    assert a.leaderboard(now.round_id) == board
    assert [item.submission_id for item in v1.fetch_work().items] == [late.submission_id]
    # c's earlier submission has reports: the newer one does not supersede it.
    assert a.submission_status(inflated.submission_id).state == "failed"


def test_a_step_back_of_the_apis_clock_does_not_put_a_later_submission_first_in_a_tie(start_api):
    """NTP steps the API host's clock back ten minutes between two submissions scoring within the tie
    margin: the earlier one still places first (ties go to the earlier submission, docs/rules.md)."""
    api = start_api()
    a, b, v1 = (api.client(name) for name in ("a", "b", "v1"))
    first = a.submit_kernel(Claim(FORK, COMMIT, 100_000.0), 1_000_000)
    api.clock.offset = -600.0
    later = b.submit_kernel(Claim("https://github.com/bob/fla", commit_of(0xB0B), 100_000.0), 1_000_000)
    committed = api.client("c").commit(commitment_hash(new_salt(), FORK, commit_of(0xC)), 1_000_000)
    assert first.submitted_at <= later.submitted_at <= committed.submitted_at
    assert {item.submission_id for item in v1.fetch_work().items} == {first.submission_id, later.submission_id}
    for submission_id, figure in ((first.submission_id, 99_500.0), (later.submission_id, 100_000.0)):
        v1.report(submission_id, "passed", correct=True, logits_ok=True, measured_tokens_per_sec=figure)
    api.chain.advance(1)
    assert [e.submission_id for e in a.leaderboard().entries] == [first.submission_id, later.submission_id]


def test_a_validators_reports_come_back_as_it_sent_them_with_their_submission(start_api):
    """What the processes of one validator hotkey import from each other (quasar/validator/loop.py):
    each of its reports as stored, with the submission it is on; another validator's report on the
    same submission is never passed off as its own."""
    api = start_api()
    a, v1, v2 = (api.client(name) for name in ("a", "v1", "v2"))
    accepted = a.submit_kernel(Claim(FORK + ".git", COMMIT.upper(), 100_000.0, benchmarks={512: 3e5}), 1_000_000)
    lengths = [{"seq_len": 1_000_000, "status": "ok", "tokens_per_sec": 95_000.0, "peak_vram_mb": 7e4, "correct": True}]
    for validator in (v1, v2):
        validator.fetch_work()
    v1.report(
        accepted.submission_id, "passed", True, True, 95_000.0, {1_000_000: 95_000.0}, ["note"], lengths, "AB" * 32
    )
    v2.report(accepted.submission_id, "failed", False, reasons=["wrong output at 512"])

    first, *others = a.validator_reports(api.wallets["v1"].hotkey.ss58_address).reports
    assert others == []
    submission = (
        first.submission_id,
        first.hotkey,
        first.fork_url,
        first.commit_hash,
        first.target_sequence_length,
        first.claimed_tokens_per_sec,
        first.submitted_at,
        first.round_id,
    )
    assert submission == (
        accepted.submission_id,
        api.wallets["a"].hotkey.ss58_address,
        FORK,  # as the API stored it: normalised
        COMMIT,
        1_000_000,
        100_000.0,
        accepted.submitted_at,
        accepted.round_id,
    )
    findings = (first.verdict, first.correct, first.logits_ok, first.measured_tokens_per_sec, first.benchmarks)
    assert findings == ("passed", True, True, 95_000.0, {1_000_000: 95_000.0})
    assert (first.reasons, first.content_hash) == (["note"], "ab" * 32)
    shown = a.submission_status(accepted.submission_id).reports
    assert [(item.verdict, item.reported_at) for item in shown] == [("passed", first.reported_at), ("failed", ANY)]
    assert [(item.seq_len, item.peak_vram_mb) for item in shown[0].lengths] == [(1_000_000, 7e4)]
    assert a.validator_reports(api.wallets["v1"].hotkey.ss58_address, after_id=first.report_id).reports == []


def test_leaderboard_and_round_are_cached_per_chain_block(start_api):
    api = start_api()
    a, v1 = api.client("a"), api.client("v1")
    submitted = a.submit_kernel(Claim(FORK, COMMIT, 100_000.0), 1_000_000)
    before = a.current_round()
    assert a.leaderboard().entries == [] and a.leaderboard(before.round_id).entries == []
    v1.fetch_work()
    v1.report(submitted.submission_id, "passed", correct=True, logits_ok=True, measured_tokens_per_sec=90_000.0)
    assert a.leaderboard().entries == []  # the same block: the body computed before the report
    assert a.current_round() == before
    api.chain.advance(1)
    assert [e.submission_id for e in a.leaderboard().entries] == [submitted.submission_id]
    assert [e.submission_id for e in a.leaderboard(before.round_id).entries] == [submitted.submission_id]
    assert a.current_round().current_block == before.current_block + 1


# --- identity and abuse ---


def test_replayed_request_is_refused_also_after_a_restart(start_api, chain, wallets, database_url):
    api = start_api()
    request = sign_request(wallets["a"], "POST", api.url + "/submit_kernel", api.hotkey, SUBMISSION)

    def replay(url):
        return httpx.post(url + "/submit_kernel", content=request.body, headers=request.headers, timeout=30)

    assert replay(api.url).status_code == 201
    again = replay(api.url)
    assert again.status_code == 401 and "already accepted" in again.json()["detail"]
    api.server.__exit__(None, None, None)
    with ApiServer(api_config(api.hotkey), chain, database_url) as restarted:
        after = replay(restarted.url)
        assert after.status_code == 401 and "already accepted" in after.json()["detail"]
        assert httpx.get(restarted.url + "/get_submission_stats").json()["submissions"] == 1


def test_forged_tampered_and_misdirected_requests_are_refused(start_api):
    api = start_api()
    a_hotkey = api.wallets["a"].hotkey.ss58_address
    # Signed by the stranger's key but claiming to be miner a.
    forged = send(api, "stranger", "POST", "/submit_kernel", SUBMISSION, headers={"X-Bittensor-Hotkey": a_hotkey})
    assert forged.status_code == 401 and "does not verify" in forged.json()["detail"]
    tampered = send(
        api, "a", "POST", "/submit_kernel", SUBMISSION, body=json.dumps({**SUBMISSION, "tokens_per_sec": 9e9}).encode()
    )
    assert tampered.status_code == 401 and "does not verify" in tampered.json()["detail"]
    elsewhere = send(api, "a", "POST", "/submit_kernel", SUBMISSION, receiver=api.wallets["v1"].hotkey.ss58_address)
    assert elsewhere.status_code == 401 and "different receiving hotkey" in elsewhere.json()["detail"]
    # Signed for another path (the signature binds method, path and query).
    other_path = sign_request(api.wallets["a"], "POST", api.url + "/commit_submission", api.hotkey, SUBMISSION)
    moved = httpx.post(api.url + "/submit_kernel", content=other_path.body, headers=other_path.headers)
    assert moved.status_code == 401
    unsigned = httpx.post(api.url + "/submit_kernel", json=SUBMISSION)
    assert unsigned.status_code == 401 and "X-Bittensor" in unsigned.json()["detail"]
    assert api.client("a").stats().submissions == 0


def test_unregistered_hotkeys_and_miners_on_validator_endpoints_are_forbidden(start_api):
    api = start_api()
    refused(lambda: api.client("stranger").submit_kernel(Claim(FORK, COMMIT, 1.0), 1000), 403, "not registered")
    refused(lambda: api.client("stranger").commit("ab" * 32, 1000), 403, "not registered")
    api.chain.register_wallet(api.wallets["stranger"])  # registration is read from the chain per request
    assert api.client("stranger").submit_kernel(Claim(FORK, COMMIT, 1.0), 1000).state == "ready"
    refused(lambda: api.client("a").fetch_work(), 403, "no validator permit")
    refused(lambda: api.client("a").report(1, "failed", False), 403, "no validator permit")
    api.chain.set_validator_permit(api.wallets["v1"].hotkey.ss58_address, False)
    refused(lambda: api.client("v1").fetch_work(), 403, "no validator permit")


def test_wrong_commitment_is_refused_and_counted_as_a_failure(start_api):
    api = start_api()
    b, v1 = api.client("b"), api.client("v1")
    salt = new_salt()
    committed = b.commit(commitment_hash(salt, FORK, COMMIT), 500_000)
    api.chain.advance(100)
    for wrong_salt, wrong_fork, wrong_commit in (
        (salt, FORK, commit_of(1)),
        (new_salt(), FORK, COMMIT),
        (salt, FORK + "2", COMMIT),
    ):
        refused(
            lambda: b.reveal(committed.submission_id, wrong_salt, Claim(wrong_fork, wrong_commit, 1e4)),
            400,
            "does not match commitment",
            "counted as a failed validation",
        )
    refused(
        lambda: api.client("a").reveal(committed.submission_id, salt, Claim(FORK, COMMIT, 1e4)), 404, "no commitment"
    )
    assert v1.fetch_work().items == []  # nothing was revealed
    assert b.reveal(committed.submission_id, salt, Claim(FORK, COMMIT, 1e4)).state == "ready"


def test_reveal_window_closes(start_api):
    api = start_api(reveal_window_blocks=10)
    b = api.client("b")
    salt = new_salt()
    committed = b.commit(commitment_hash(salt, FORK, COMMIT), 500_000)
    assert committed.reveal_until_block == committed.commit_block + 109
    api.chain.advance(110)
    refused(lambda: b.reveal(committed.submission_id, salt, Claim(FORK, COMMIT, 1e4)), 409, "closed at block")
    assert b.pending_reveals().pending == [] and b.stats().expired_commitments == 1


def test_five_failures_from_one_ip_ban_it_for_24_hours(start_api):
    # The proxy at 127.0.0.1 is trusted, so X-Forwarded-For tells the clients apart.
    api = start_api(trusted_proxies=("127.0.0.1",))
    banned_ip, other_ip = "203.0.113.7", "198.51.100.2"
    b = api.client("b", **{"X-Forwarded-For": f"10.9.9.9, {banned_ip}"})
    v1, v2 = api.client("v1"), api.client("v2")
    salt = new_salt()
    committed = b.commit(commitment_hash(salt, FORK, COMMIT), 500_000)
    api.chain.advance(100)
    for n in range(2):  # two failures: wrong reveals
        refused(lambda: b.reveal(committed.submission_id, salt, Claim(FORK, commit_of(n + 1), 1e4)), 400)
    for n in range(2):  # each reported on before the next (a newer one supersedes one without reports)
        submitted = b.submit_kernel(Claim(FORK, commit_of(100 + n), 1e4), 500_000).submission_id
        assert [item.submission_id for item in v1.fetch_work().items] == [submitted]
        v2.fetch_work()
        assert v1.report(submitted, "failed", correct=False, reasons=["output differs"]).failure_counted
        # A second validator failing the same submission does not count it twice.
        assert not v2.report(submitted, "failed", correct=False).failure_counted
    # Four failures, not banned yet; 23.5 hours on they still count: the window is 24 hours.
    ban_starts = 23.5 * 3600
    api.clock.offset = ban_starts
    last = b.submit_kernel(Claim(FORK, commit_of(998), 1e4), 500_000).submission_id
    v1.fetch_work()
    assert v1.report(last, "failed", correct=False).failure_counted
    detail = refused(lambda: b.submit_kernel(Claim(FORK, commit_of(999), 1e4), 500_000), 403, banned_ip, "banned until")
    assert "5 failed validations" in detail
    refused(lambda: b.commit("ab" * 32, 500_000), 403, "banned")
    # Another IP is not affected, whatever it claims further left in the header.
    other = api.client("a", **{"X-Forwarded-For": f"{banned_ip}, {other_ip}"})
    assert other.submit_kernel(Claim(FORK, commit_of(1000), 1e4), 500_000).state == "ready"
    api.clock.offset = ban_starts + 24 * 3600 - 60  # the ban lasts 24 hours
    refused(lambda: b.submit_kernel(Claim(FORK, commit_of(1001), 1e4), 500_000), 403, "banned")
    api.clock.offset = ban_starts + 24 * 3600 + 1
    assert b.submit_kernel(Claim(FORK, commit_of(1001), 1e4), 500_000).state == "ready"


def test_forwarded_for_is_ignored_without_trusted_proxies(start_api):
    api = start_api()
    v1 = api.client("v1")
    for n in range(5):
        spoofing = api.client("a", **{"X-Forwarded-For": f"192.0.2.{n}"})
        spoofing.submit_kernel(Claim(FORK, commit_of(n + 1), 1e4), 500_000)
        for item in v1.fetch_work().items:
            v1.report(item.submission_id, "failed", correct=False)
    fresh = api.client("c", **{"X-Forwarded-For": "192.0.2.200"})
    refused(lambda: fresh.submit_kernel(Claim(FORK, COMMIT, 1e4), 500_000), 403, "IP 127.0.0.1 is banned")


def test_rate_limit_per_hotkey(start_api):
    api = start_api(submissions_per_hour=3)
    a = api.client("a")
    for n in range(2):
        a.submit_kernel(Claim(FORK, commit_of(n + 1), 1e4), 500_000)
    a.commit("cd" * 32, 500_000)
    with pytest.raises(ApiClientError) as limited:
        a.submit_kernel(Claim(FORK, commit_of(9), 1e4), 500_000)
    assert limited.value.status == 429 and "at most 3 submissions per hour" in limited.value.detail
    assert api.client("b").submit_kernel(Claim(FORK, commit_of(10), 1e4), 500_000).state == "ready"  # per hotkey
    api.clock.offset = 3601
    assert a.submit_kernel(Claim(FORK, commit_of(9), 1e4), 500_000).state == "ready"


def test_duplicate_submission_conflicts(start_api):
    api = start_api()
    a = api.client("a")
    first = a.submit_kernel(Claim(FORK, COMMIT, 1e4), 500_000)
    refused(
        lambda: a.submit_kernel(Claim(FORK + ".git", COMMIT.upper(), 2e4), 500_000),
        409,
        f"submission {first.submission_id}",
    )


BAD_FIELDS = [
    ({"fork_url": "https://gitlab.com/a/b"}, "fork_url: fork URL host must be github.com"),
    ({"fork_url": "/srv/forks/fla"}, "fork_url: fork URL '/srv/forks/fla' is a local source"),
    ({"fork_url": "https://github.com/" + "a" * 600}, "body.fork_url: String should have at most 512"),
    ({"commit_hash": "main"}, "commit_hash: commit hash must be a full commit id"),
    ({"commit_hash": "a" * 65}, "body.commit_hash: String should have at most 64"),
    ({"target_sequence_length": 0}, "body.target_sequence_length: Input should be greater than or equal to 64"),
    # Targets no validator can evaluate (docs/rules.md section 3): every validator would fail them.
    ({"target_sequence_length": 63}, "body.target_sequence_length: Input should be greater than or equal to 64"),
    (
        {"target_sequence_length": MAX_SEQ_LEN + 1},
        f"body.target_sequence_length: Input should be less than or equal to {MAX_SEQ_LEN}",
    ),
    ({"target_sequence_length": 10**12}, "body.target_sequence_length: Input should be less than or equal"),
    ({"tokens_per_sec": -1}, "body.tokens_per_sec: Input should be greater than 0"),
    ({"benchmarks": {str(n + 1): 1.0 for n in range(40)}}, "body.benchmarks: Dictionary should have at most 32"),
    ({"benchmarks": {"long": 1.0}}, "body.benchmarks.long"),
    ({"miner_hotkey": "5F", "signature": "00"}, "body.miner_hotkey: Extra inputs are not permitted"),
]


def test_bad_fields_are_422_naming_the_field(start_api):
    api = start_api()
    for change, field in BAD_FIELDS:
        response = send(api, "a", "POST", "/submit_kernel", {**SUBMISSION, **change})
        assert response.status_code == 422, (change, response.text)
        assert field in response.json()["detail"], (change, response.text)
    assert api.client("a").stats().submissions == 0
    commit = {"commitment_hash": "ab" * 32, "target_sequence_length": MAX_SEQ_LEN + 1}
    response = send(api, "a", "POST", "/commit_submission", commit)
    assert response.status_code == 422 and f"less than or equal to {MAX_SEQ_LEN}" in response.text, response.text
    longest = send(api, "a", "POST", "/submit_kernel", {**SUBMISSION, "target_sequence_length": MAX_SEQ_LEN})
    assert longest.status_code == 201, longest.text


def test_non_finite_numbers_oversize_bodies_and_reports_are_refused(start_api):
    api = start_api()
    # A NaN in the JSON (Python's json accepts it) signed like any other body:
    body = json.dumps({**SUBMISSION, "tokens_per_sec": float("nan")}).encode()
    headers = http_auth.sign(
        api.wallets["a"], method="POST", path="/submit_kernel", body=body, receiver_ss58=api.hotkey
    )
    response = httpx.post(
        api.url + "/submit_kernel", content=body, headers={**headers, "Content-Type": "application/json"}
    )
    assert response.status_code == 422 and "finite number" in response.json()["detail"], response.text
    huge = send(api, "a", "POST", "/submit_kernel", {**SUBMISSION, "padding": "x" * 70_000})
    assert huge.status_code == 413 and "larger than 65536 bytes" in huge.json()["detail"]
    v1 = api.client("v1")
    submitted = api.client("a").submit_kernel(Claim(FORK, COMMIT, 1e4), 500_000)
    v1.fetch_work()
    for reasons, fragment in (
        (["x" * 1001], "at most 1000"),
        (["ok"] * 21, "at most 20"),
        (["nul\x00byte"], "control characters"),
    ):
        response = send(
            api,
            "v1",
            "POST",
            "/validator/report",
            {"submission_id": submitted.submission_id, "verdict": "failed", "correct": False, "reasons": reasons},
        )
        assert response.status_code == 422 and fragment in response.json()["detail"], response.text
    refused(lambda: v1.report(submitted.submission_id, "passed", correct=False), 422, "contradicts")
    refused(lambda: v1.report(10**6, "failed", correct=False), 404, "no submission 1000000")
    refused(lambda: api.client("v2").report(submitted.submission_id, "failed", correct=False), 409, "never fetched")


def test_leases_expire_and_refetching_is_bounded(start_api):
    api = start_api(evaluation_lease_s=60.0)
    v1, v2 = api.client("v1"), api.client("v2")
    submitted = api.client("a").submit_kernel(Claim(FORK, COMMIT, 1e4), 500_000)
    for attempt in range(3):
        items = v1.fetch_work().items
        assert [item.submission_id for item in items] == [submitted.submission_id], attempt
        assert v1.fetch_work().items == []
        api.clock.offset += 61  # the validator crashed: its lease runs out
    assert v1.fetch_work().items == []  # fetched three times without a report: not handed out again
    assert [item.submission_id for item in v2.fetch_work().items] == [submitted.submission_id]


def test_concurrent_writers_keep_the_rules(start_api):
    api = start_api(submissions_per_hour=5)
    a = api.client("a")
    barrier = threading.Barrier(16)

    def submit(n):
        barrier.wait()
        return send(api, "a", "POST", "/submit_kernel", {**SUBMISSION, "commit_hash": commit_of(n + 1)}).status_code

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(submit, range(16)))
    assert sorted(statuses) == [201] * 5 + [429] * 11
    assert a.stats().submissions == 5

    salt = new_salt()
    committed = api.client("b").commit(commitment_hash(salt, FORK, COMMIT), 500_000)
    api.chain.advance(100)
    barrier = threading.Barrier(8)
    payload = {
        "submission_id": committed.submission_id,
        "commitment_salt": salt,
        "fork_url": FORK,
        "commit_hash": COMMIT,
        "tokens_per_sec": 1e4,
    }

    def reveal(_):
        barrier.wait()
        return send(api, "b", "POST", "/reveal_submission", payload).status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(reveal, range(8)))
    assert sorted(statuses) == [200] + [409] * 7

    # Two validators failing the same submission at once: both reports stored, one failure charged.
    validators = [api.client("v1"), api.client("v2")]
    target = {validator.fetch_work(limit=1).items[0].submission_id for validator in validators}
    assert len(target) == 1
    barrier = threading.Barrier(2)

    def fail(validator):
        barrier.wait()
        return validator.report(*target, "failed", correct=False).failure_counted

    with ThreadPoolExecutor(2) as pool:
        assert sorted(pool.map(fail, validators)) == [False, True]


class FailingChain:
    """Wraps a chain; ``broken`` makes every call raise an unexpected error (not a ChainError)."""

    def __init__(self, inner):
        self.inner, self.broken = inner, False

    def __getattr__(self, name):
        if self.broken and name in ("current_block", "is_registered", "has_validator_permit"):
            raise RuntimeError("secret internal detail /home/op/.bittensor")
        return getattr(self.inner, name)


def test_unexpected_errors_are_a_plain_500_and_chain_outages_a_503(chain, wallets, database_url):
    flaky = FailingChain(chain)
    with ApiServer(api_config(wallets["api"].hotkey.ss58_address), flaky, database_url) as server:
        assert httpx.get(server.url + "/health").status_code == 200
        flaky.broken = True
        response = httpx.get(server.url + "/health")
        assert response.status_code == 500 and response.json() == {"detail": "internal error"}
        flaky.broken = False
        chain.path.unlink()  # the dev chain file is gone: a chain error, reported as 503
        (chain.path.parent / "devchain.sqlite3-wal").unlink(missing_ok=True)
        chain.path.mkdir()
        response = httpx.get(server.url + "/get_current_round")
        assert response.status_code == 503 and "chain is unavailable" in response.json()["detail"]


def test_schema_is_migrated_not_reset_and_matches_the_models(start_api, chain, wallets, database_url):
    api = start_api()
    api.client("a").submit_kernel(Claim(FORK, COMMIT, 1e4), 500_000)
    api.server.__exit__(None, None, None)
    with ApiServer(api_config(api.hotkey), chain, database_url) as restarted:
        assert httpx.get(restarted.url + "/get_submission_stats").json()["submissions"] == 1
        schema = httpx.get(restarted.url + "/openapi.json").json()
        for path in (
            "/submit_kernel",
            "/commit_submission",
            "/reveal_submission",
            "/pending_reveals",
            "/get_submission_stats",
            "/get_current_round",
            "/health",
            "/validator/pending",
            "/validator/report",
            "/leaderboard",
            "/submissions/{submission_id}",
            "/miners/{hotkey}/submissions",
        ):
            assert path in schema["paths"]
    database = Database(database_url)
    try:
        database.upgrade()
        with database.engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    finally:
        database.dispose()
