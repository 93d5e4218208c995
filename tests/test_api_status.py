"""Submission status and the dashboard, end to end: a real API on 127.0.0.1 with real wallets, the dev
chain and both database backends; plus the state machine, the upgrade of a database made at
revision 0001 with a report in it, and the charts."""

from __future__ import annotations

import re
import time

import bittensor as bt
import httpx
import pytest
from alembic import command
from bittensor.sp_core import Keypair
from markupsafe import escape
from sqlalchemy import event, insert

from api_fixtures import COMMIT, FORK, ApiServer, api_config, commit_of, refused
from quasar import scoring
from quasar.api import dashboard
from quasar.api import status as status_module
from quasar.api.charts import Series, bar_chart, compact, line_chart, nice_ceiling
from quasar.api.client import ApiClient, Claim
from quasar.api.db import Database, EvaluationReport, IpBan, Submission, ValidationFailure
from quasar.api.rules import commitment_hash, new_salt
from quasar.api.schemas import RoundPoint
from quasar.api.service import SubmissionService
from quasar.api.status import StatusReader, best_per_round, submission_state
from quasar.consensus import Consensus, Electorate, Quorum, Report, decide
from quasar.originality import CopyOf

SECRET_FORK = "https://github.com/secretminer/hidden-kernels"
SECRET_COMMIT = "feedfacefeedfacefeedfacefeedfacefeedface"
LENGTHS_OK = [
    {"seq_len": 512, "status": "ok", "tokens_per_sec": 3.1e5, "peak_vram_mb": 900.0, "correct": True},
    {"seq_len": 1024, "status": "ok", "tokens_per_sec": 2.9e5, "peak_vram_mb": 1500.0, "correct": True},
]
LENGTHS_WRONG = [
    {"seq_len": 512, "status": "ok", "tokens_per_sec": 9e5, "peak_vram_mb": 700.0, "correct": True},
    {"seq_len": 1024, "status": "ok", "tokens_per_sec": 8.8e5, "peak_vram_mb": 800.0, "correct": False},
]
WRONG_REASON = "T=1024: the output differs from the reference (relative error 0.41 > 0.01)"


def test_a_submission_moves_through_its_states_with_each_validators_verdict(start_api):
    api = start_api(evaluation_lease_s=60.0)
    a, b, v1, v2 = (api.client(name) for name in ("a", "b", "v1", "v2"))
    b_hotkey = api.wallets["b"].hotkey.ss58_address

    salt = new_salt()
    committed = b.commit(commitment_hash(salt, SECRET_FORK, SECRET_COMMIT), 1_000_000)
    status = a.submission_status(committed.submission_id)
    assert (status.state, status.revealed, status.method) == ("committed", False, "commit_reveal")
    assert status.commitment_hash == commitment_hash(salt, SECRET_FORK, SECRET_COMMIT)
    assert (status.reveal_from_block, status.league) == (committed.reveal_from_block, "1M")
    assert (status.fork_url, status.commit_hash, status.claimed_tokens_per_sec, status.reports) == (
        None,
        None,
        None,
        [],
    )

    api.chain.advance(100)
    b.reveal(committed.submission_id, salt, Claim(SECRET_FORK, SECRET_COMMIT, 2.5e5))
    direct = a.submit_kernel(Claim(FORK, COMMIT, 3e5, benchmarks={512: 3.2e5}), 1024)
    assert a.submission_status(direct.submission_id).state == "queued"
    revealed = a.submission_status(committed.submission_id)
    assert (revealed.state, revealed.fork_url, revealed.commit_hash) == ("revealed", SECRET_FORK, SECRET_COMMIT)

    v1.fetch_work()
    assert a.submission_status(direct.submission_id).state == "being_evaluated"
    assert a.submission_status(direct.submission_id).validators_evaluating == 1
    api.clock.offset += 61  # v1's lease ran out without a report: back in the queue
    assert a.submission_status(direct.submission_id).state == "queued"
    v1.fetch_work()
    v2.fetch_work()

    v1.report(
        direct.submission_id,
        "passed",
        correct=True,
        logits_ok=True,
        measured_tokens_per_sec=2.9e5,
        benchmarks={512: 3.1e5, 1024: 2.9e5},
        lengths=LENGTHS_OK,
    )
    v1.report(
        committed.submission_id,
        "failed",
        correct=False,
        logits_ok=None,
        measured_tokens_per_sec=8.8e5,
        lengths=LENGTHS_WRONG,
        reasons=[WRONG_REASON],
    )
    passed = a.submission_status(direct.submission_id)
    assert (passed.state, passed.measured_tokens_per_sec, passed.validators_evaluating) == ("passed", 2.9e5, 1)
    assert passed.weighted_score == pytest.approx(2.9e5 * 0.5)
    assert passed.claimed_benchmarks == {512: 3.2e5}
    [verdict] = passed.reports
    assert verdict.validator_hotkey == api.wallets["v1"].hotkey.ss58_address and verdict.logits_ok is True
    assert [(x.seq_len, x.tokens_per_sec, x.peak_vram_mb, x.correct) for x in verdict.lengths] == [
        (512, 3.1e5, 900.0, True),
        (1024, 2.9e5, 1500.0, True),
    ]
    assert verdict.reported_at == pytest.approx(api.clock(), abs=30)

    failed = a.submission_status(committed.submission_id)
    assert (failed.state, failed.weighted_score) == ("failed", 0.0)
    assert failed.reports[0].reasons == [WRONG_REASON] and failed.reports[0].lengths[1].correct is False

    # The second validator disagrees: the consensus (strict majority correct) still fails it.
    v2.report(committed.submission_id, "passed", correct=True, logits_ok=True, measured_tokens_per_sec=8.8e5)
    both = a.submission_status(committed.submission_id)
    assert both.state == "failed" and [r.verdict for r in both.reports] == ["failed", "passed"]
    assert both.reports[1].lengths == []

    page = a.miner_submissions(b_hotkey)
    assert (page.total, [s.submission_id for s in page.submissions]) == (1, [committed.submission_id])


def test_an_unrevealed_commitment_leaks_nothing_and_expires(start_api):
    api = start_api(reveal_window_blocks=10)
    b = api.client("b")
    b_hotkey = api.wallets["b"].hotkey.ss58_address
    committed = b.commit(commitment_hash(new_salt(), SECRET_FORK, SECRET_COMMIT), 500_000)
    # The API never stored the URL or commit, and no view derives them: every public page and endpoint.
    paths = [
        f"/submissions/{committed.submission_id}",
        f"/miners/{b_hotkey}/submissions",
        "/",
        f"/dashboard/miners/{b_hotkey}",
        f"/dashboard/submissions/{committed.submission_id}",
        "/pending_reveals",
        "/leaderboard",
    ]
    for path in paths:
        response = httpx.get(api.url + path)
        assert response.status_code == 200, (path, response.text)
        for secret in ("secretminer", "hidden-kernels", SECRET_COMMIT):
            assert secret not in response.text, path
    page = httpx.get(f"{api.url}/dashboard/submissions/{committed.submission_id}").text
    assert "Not revealed" in page and "committed" in page
    api.chain.advance(110)
    assert b.submission_status(committed.submission_id).state == "expired"


def test_miner_submissions_are_paged_newest_first(start_api):
    api = start_api()
    a = api.client("a")
    a_hotkey = api.wallets["a"].hotkey.ss58_address
    ids = [a.submit_kernel(Claim(FORK, commit_of(n + 1), 1e4), 500_000).submission_id for n in range(5)]
    api.client("c").submit_kernel(Claim(FORK, commit_of(99), 1e4), 500_000)
    first = a.miner_submissions(a_hotkey, limit=2)
    assert (first.total, [s.submission_id for s in first.submissions]) == (5, ids[::-1][:2])
    rest = a.miner_submissions(a_hotkey, limit=10, offset=2)
    assert [s.submission_id for s in rest.submissions] == ids[::-1][2:]
    assert a.miner_submissions(api.wallets["b"].hotkey.ss58_address).total == 0


def test_a_miners_dashboard_page_pages_through_all_its_submissions(start_api, monkeypatch):
    monkeypatch.setattr(dashboard, "MINER_SUBMISSIONS", 2)
    api = start_api()
    a = api.client("a")
    ids = [a.submit_kernel(Claim(FORK, commit_of(n + 1), 1e4), 500_000).submission_id for n in range(5)]
    url = f"{api.url}/dashboard/miners/{api.wallets['a'].hotkey.ss58_address}"

    def shown(page: int) -> tuple[list[int], list[str], str]:
        html = httpx.get(url, params={"page": page}).text
        listed = [int(n) for n in re.findall(r'<td class="num"><a href="/dashboard/submissions/(\d+)"', html)]
        links = re.findall(r'<a href="(\?page=\d+)" rel="(?:prev|next)"', html)
        note = re.search(r'<p class="note" id="pages">([^<]*)', html)
        return listed, links, note[1].split(" ·")[0] if note else "no note of pages"

    assert shown(1) == (ids[:2:-1], ["?page=2"], "Submissions 1–2 of 5, newest first")
    assert shown(2) == (ids[2:0:-1], ["?page=1", "?page=3"], "Submissions 3–4 of 5, newest first")
    assert shown(3) == ([ids[0]], ["?page=2"], "Submissions 5–5 of 5, newest first")
    assert httpx.get(url).text == httpx.get(url, params={"page": 1}).text
    past = httpx.get(url, params={"page": 4})
    assert past.status_code == 404 and "no page 4 of" in past.text and "they fill 3" in past.text
    assert httpx.get(url, params={"page": 0}).status_code == 422


def test_a_miners_history_reads_its_newest_rounds_only_however_many_it_played(start_api, monkeypatch):
    """A month of rounds must not make a miner's page cost more with each round: its history (the
    chart) judges the newest HISTORY_ROUNDS rounds (docs/api.md, "How long things are kept"), while
    every submission it made stays listed."""
    monkeypatch.setattr(status_module, "HISTORY_ROUNDS", 4, raising=False)
    api = start_api(round_blocks=1)
    a, v1 = api.client("a"), api.client("v1")
    a_hotkey = api.wallets["a"].hotkey.ss58_address
    played = []
    for n in range(10):  # one evaluated submission a round, ten rounds
        accepted = a.submit_kernel(Claim(FORK, commit_of(n + 1), 1e4), 1024)
        v1.fetch_work()
        v1.report(accepted.submission_id, "passed", True, True, 1e4 + n, lengths=LENGTHS_OK)
        played.append(a.submission_status(accepted.submission_id).round_id)
        api.chain.advance(1)
    config = api_config(api.wallets["api"].hotkey.ss58_address, round_blocks=1)
    reader = StatusReader(SubmissionService(config, api.chain, api.server.database))
    history = reader.history(a_hotkey)
    page = reader.submissions(a_hotkey, 100, 0)
    assert [point.round_id for point in history.rounds] == played[-3:]  # the current round has none
    assert [point.measured_tokens_per_sec for point in history.rounds] == [1e4 + 7, 1e4 + 8, 1e4 + 9]
    assert page.total == 10 and len(page.submissions) == 10


class CountedService:
    """The API's service on ``api``'s database (``config`` as api_config takes it), counting SQLite's
    virtual machine instructions, in tens, while ``instructions`` is read: a cost of what it reads
    that does not depend on the machine's load."""

    def __init__(self, api, **config):
        self.database = Database(api.server.database.url)
        self.instructions = 0
        event.listen(
            self.database.engine, "connect", lambda connection, _record: connection.set_progress_handler(self._tick, 10)
        )
        self.service = SubmissionService(
            api_config(api.wallets["api"].hotkey.ss58_address, **config), api.chain, self.database
        )

    def _tick(self) -> int:
        self.instructions += 1
        return 0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_submissions_status_costs_the_same_however_many_ready_submissions_came_before(start_api):
    """A status read looks up the submissions sharing its kernel content by their ids; with none to
    look up it asks nothing, as SQLite's planner answers an empty list of ids by reading every ready
    submission ever made: a month of a full subnet made each read 40 ms slower, and growing. Cost
    counted in SQLite's virtual machine instructions, which do not depend on the machine's load."""
    api = start_api(round_blocks=1)
    a, b, v1 = api.client("a"), api.client("b"), api.client("v1")
    first = a.submit_kernel(Claim(FORK, commit_of(1), 1e4), 1024).submission_id
    v1.fetch_work()
    v1.report(first, "passed", True, True, 1e4, lengths=LENGTHS_OK, content_hash="ab" * 32)
    counted = CountedService(api, round_blocks=1)
    reader = StatusReader(counted.service)

    def status_cost() -> int:
        counted.instructions = 0
        assert reader.submission(first) is not None
        return counted.instructions

    costs = [status_cost()]
    for n in range(150):  # ready submissions of later rounds: none is superseded
        api.chain.advance(3)
        b.submit_kernel(Claim("https://github.com/bob/fla", commit_of(1000 + n), 1e4), 1024)
    costs.append(status_cost())
    counted.database.dispose()
    assert costs[1] <= 1.2 * costs[0] + 10, costs


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_validators_reports_are_read_at_one_cost_however_many_others_reported(start_api):
    """GET /validators/{hotkey}/reports (a primary reads its hotkey's there at every step, and
    anyone may ask) walks that validator's reports by an index: a hotkey with none read every
    report ever stored, 0.27 s after 30 days of a full subnet, and growing. Cost counted in
    SQLite's virtual machine instructions."""
    api = start_api(round_blocks=1)
    a, v1 = api.client("a"), api.client("v1")
    counted = CountedService(api, round_blocks=1)
    quiet = api.wallets["v2"].hotkey.ss58_address  # a validator that never reports

    def reports_cost() -> int:
        counted.instructions = 0
        assert counted.service.validator_reports(quiet, 0, 100).reports == []
        return counted.instructions

    costs = []
    for n in range(120):
        if n in (1, 119):
            costs.append(reports_cost())
        accepted = a.submit_kernel(Claim(FORK, commit_of(n + 1), 1e4), 1024)
        v1.fetch_work()
        v1.report(accepted.submission_id, "passed", True, True, 1e4, lengths=LENGTHS_OK)
        api.chain.advance(3)
    counted.database.dispose()
    assert costs[1] <= 1.2 * costs[0] + 10, costs


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_subnets_counts_are_read_once_a_block_however_many_ask(start_api):
    """GET /get_submission_stats counts whole tables (0.2 s after 30 days of a full subnet), and
    anyone may ask it at will: the subnet's counts are read once a chain block, each request adding
    only its hotkey's count, so a request's cost does not grow with the tables; the next block
    counts afresh. Cost counted in SQLite's virtual machine instructions."""
    api = start_api(round_blocks=1)
    a, b = api.client("a"), api.client("b")
    counted = CountedService(api, round_blocks=1)
    a_hotkey, b_hotkey = api.wallets["a"].hotkey.ss58_address, api.wallets["b"].hotkey.ss58_address

    def second_request_cost(submitted: int) -> int:
        api.chain.advance(1)
        assert counted.service.stats(a_hotkey).submissions == submitted  # the block's first request counts
        counted.instructions = 0
        stats = counted.service.stats(b_hotkey)
        assert (stats.submissions, stats.hotkey_submissions) == (submitted, 0)
        return counted.instructions

    costs = []
    for n in range(200):
        if n in (10, 199):
            costs.append(second_request_cost(n))
        a.submit_kernel(Claim(FORK, commit_of(n + 1), 1e4), 1024)
    counted.database.dispose()
    assert costs[1] <= 1.2 * costs[0] + 10, costs
    assert b.stats().submissions == 200  # the server's service had not counted at this block


def test_the_subnets_counts_count_each_hotkey_that_submitted_once(start_api):
    """The hotkeys of GET /get_submission_stats are counted by walking the hotkey index (a count of
    distinct hotkeys read every submission): none on an empty database, each hotkey once."""
    api = start_api()
    a, b = api.client("a"), api.client("b")
    assert a.stats().hotkeys == 0
    for n in range(3):
        a.submit_kernel(Claim(FORK, commit_of(n + 1), 1e4), 1024)
    b.submit_kernel(Claim(FORK, commit_of(9), 1e4), 1024)
    b.commit(commitment_hash(new_salt(), FORK, commit_of(10)), 1024)
    api.chain.advance(1)  # the subnet's counts are read once a block
    stats = a.stats()
    assert (stats.hotkeys, stats.submissions) == (2, 5)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_pending_reveals_cost_the_same_however_many_commitments_were_never_revealed(start_api):
    """GET /pending_reveals reads the commitments whose reveal window is open by an index of state
    and block: it read every commitment never revealed (a miner may commit and never reveal, ten
    times an hour), 46 ms after 400,000. Cost counted in SQLite's virtual machine instructions."""
    api = start_api(blocks_until_reveal=1, reveal_window_blocks=1)
    a = api.client("a")
    counted = CountedService(api, blocks_until_reveal=1, reveal_window_blocks=1)

    def pending_cost() -> int:
        counted.instructions = 0
        assert len(counted.service.pending_reveals(None, 100).pending) == 1  # the newest one's window is open
        return counted.instructions

    costs = []
    for n in range(150):
        a.commit(commitment_hash(new_salt(), FORK, commit_of(n + 1)), 1024)
        if n in (10, 149):
            costs.append(pending_cost())
        api.chain.advance(5)  # its window closes unrevealed
    counted.database.dispose()
    assert costs[1] <= 1.2 * costs[0] + 10, costs


def test_bad_status_requests_are_4xx_naming_what_was_wrong(start_api):
    api = start_api()
    a = api.client("a")
    refused(lambda: a.submission_status(12345), 404, "no submission 12345")
    refused(lambda: a.submission_status(0), 422, "path.submission_id")
    refused(lambda: a.miner_submissions("not-a-hotkey"), 422, "path.hotkey")
    refused(lambda: a.miner_submissions(api.wallets["a"].hotkey.ss58_address, limit=0), 422, "query.limit")
    refused(lambda: a.miner_submissions(api.wallets["a"].hotkey.ss58_address, offset=-1), 422, "query.offset")
    for path, status, text in (
        ("/dashboard/submissions/999", 404, "no submission 999"),
        ("/dashboard/submissions/abc", 422, "Not a submission id"),
        ("/dashboard/miners/nobody", 422, "Not a hotkey"),
    ):
        response = httpx.get(api.url + path)
        assert response.status_code == status and text in response.text, path

    submitted = a.submit_kernel(Claim(FORK, COMMIT, 1e4), 1024)
    api.client("v1").fetch_work()
    for lengths, fragment in (
        ([LENGTHS_OK[0], LENGTHS_OK[0]], "each seq_len may appear once"),
        ([{**LENGTHS_OK[0], "status": "fast"}], "body.lengths.0.status"),
        ([{**LENGTHS_OK[0], "peak_vram_mb": -1}], "body.lengths.0.peak_vram_mb"),
        ([{**LENGTHS_OK[0], "gpu": "H100"}], "body.lengths.0.gpu: Extra inputs are not permitted"),
    ):
        refused(
            lambda: api.client("v1").report(submitted.submission_id, "failed", False, lengths=lengths), 422, fragment
        )


def test_dashboard_pages_show_the_round_and_escape_what_miners_wrote(start_api):
    api = start_api()
    a, c, v1 = api.client("a"), api.client("c"), api.client("v1")
    honest = a.submit_kernel(Claim(FORK, COMMIT, 2.8e5), 1024)
    hostile = c.submit_kernel(Claim("https://github.com/carol/fla", commit_of(0xC), 8e5), 1024)
    v1.fetch_work()
    v1.report(honest.submission_id, "passed", True, True, 2.9e5, lengths=LENGTHS_OK)
    attack = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    v1.report(
        hostile.submission_id, "failed", False, None, 8.8e5, lengths=LENGTHS_WRONG, reasons=[WRONG_REASON, attack]
    )

    api.chain.advance(1)  # reports count from the block after they arrive
    index = httpx.get(api.url + "/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    rows = re.findall(r"<tr>\s*<td class=\"num place\">(\d)</td>", index.text)
    assert rows == ["1"] and api.wallets["a"].hotkey.ss58_address in index.text
    assert '<meta name="viewport"' in index.text and "round" in index.text
    shares = " / ".join(f"{share * 100:g}" for share in scoring.PLACE_SHARES)
    assert f"places 1–{len(scoring.PLACE_SHARES)} share {shares}% of the weight" in index.text
    not_begun = httpx.get(api.url + "/", params={"round": 7})
    assert not_begun.status_code == 422 and "round: round 7 has not begun; the current round is 0" in not_begun.text
    bad_round = httpx.get(api.url + "/", params={"round": -1})
    assert bad_round.status_code == 422 and "query.round" in bad_round.json()["detail"]
    page = httpx.get(f"{api.url}/dashboard/submissions/{hostile.submission_id}").text
    assert str(escape(WRONG_REASON)) in page and "<svg" in page and "failed" in page
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    miner = httpx.get(f"{api.url}/dashboard/miners/{api.wallets['a'].hotkey.ss58_address}").text
    assert "<svg" in miner and f"/dashboard/submissions/{honest.submission_id}" in miner
    # No external resource: every URL a page names is on this server.
    for html in (index.text, page, miner):
        assert not re.search(r"(src|href)=\"(https?:)?//", html)
    api.chain.advance(8 * httpx.get(api.url + "/health").json()["round_blocks"])
    earlier = httpx.get(api.url + "/", params={"round": 7})  # a past round now
    assert earlier.status_code == 200 and "Leaderboard · round 7" in earlier.text
    assert "No eligible submission in round 7" in earlier.text


def test_the_leaderboards_card_counts_the_places_a_full_subnet_fills_not_every_ranked_miner(start_api):
    api = start_api()
    ranked = len(scoring.PLACE_SHARES) + 3
    miners = [Keypair.create_from_seed(bytes([7, n]) * 16).ss58_address for n in range(ranked)]
    at = api.clock()
    with api.server.database.engine.begin() as connection:
        for number, hotkey in enumerate(miners, start=1):
            api.chain.register(hotkey, hotkey)
            connection.execute(
                insert(Submission.__table__).values(
                    id=number, **old_ready_submission(hotkey, "10.0.0.1", at) | {"commit_hash": commit_of(number)}
                )
            )
            connection.execute(
                insert(EvaluationReport.__table__).values(
                    submission_id=number,
                    validator_hotkey=api.wallets["v1"].hotkey.ss58_address,
                    reported_at=at,
                    verdict="passed",
                    correct=True,
                    logits_ok=True,
                    measured_tokens_per_sec=1000.0 + 100 * number,
                    reasons=[],
                    lengths=[],
                )
            )
    api.chain.advance(1)
    index = httpx.get(api.url + "/").text
    assert len(re.findall(r'<td class="num place">', index)) == ranked  # every ranked miner is listed
    card = re.search(r'Placed miners</div>\s*<div class="value">([^<]*)</div>\s*<div class="sub">([^<]*)', index)
    assert card is not None and card[1] == f"{len(scoring.PLACE_SHARES)} / {len(scoring.PLACE_SHARES)}", card[1]
    assert card[2].startswith(f"{ranked} ranked · "), card[2]


def test_dashboard_pages_are_rendered_once_per_chain_block(start_api):
    api = start_api()
    a, v1 = api.client("a"), api.client("v1")
    hotkey = api.wallets["a"].hotkey.ss58_address
    submitted = a.submit_kernel(Claim(FORK, COMMIT, 2.8e5), 1024)
    pages = ("/", f"/dashboard/miners/{hotkey}", f"/dashboard/submissions/{submitted.submission_id}")
    before = {path: httpx.get(api.url + path) for path in pages}
    assert all(response.status_code == 200 for response in before.values())
    assert all(response.headers["cache-control"] == "no-store" for response in before.values())
    v1.fetch_work()
    v1.report(submitted.submission_id, "failed", False, None, 9e5, lengths=LENGTHS_WRONG, reasons=[WRONG_REASON])
    same_block = {path: httpx.get(api.url + path) for path in pages}
    assert {path: r.text for path, r in same_block.items()} == {path: r.text for path, r in before.items()}
    assert same_block["/"].headers["content-type"] == before["/"].headers["content-type"]
    missing = httpx.get(f"{api.url}/dashboard/submissions/{submitted.submission_id + 1}")
    assert missing.status_code == 404  # an error page is not kept: the submission may arrive within the block
    a.submit_kernel(Claim("https://github.com/alice/fla-2", commit_of(0xB), 3e5), 1024)
    assert httpx.get(f"{api.url}/dashboard/submissions/{submitted.submission_id + 1}").status_code == 200
    api.chain.advance(1)
    # The next block: the page is rendered again; until it is, the previous block's page is sent.
    shown = str(escape(WRONG_REASON))
    assert shown not in same_block[pages[2]].text
    deadline = time.monotonic() + 10
    while shown not in (page := httpx.get(f"{api.url}/dashboard/submissions/{submitted.submission_id}").text):
        assert page == same_block[pages[2]].text and time.monotonic() < deadline
        time.sleep(0.01)
    # The JSON reads are exact: the next block's body from its first request on.
    block = httpx.get(api.url + "/get_current_round").json()["current_block"]
    api.chain.advance(1)
    assert httpx.get(api.url + "/get_current_round").json()["current_block"] == block + 1


def old_ready_submission(hotkey: str, client_ip: str, at: float) -> dict:
    """A direct submission ready at block 0 (``at`` unix seconds), as a row of the columns the
    submissions table has had since revision 0001: the upgrade tests write it under the old schema."""
    return dict(
        hotkey=hotkey,
        method="direct",
        state="ready",
        target_sequence_length=1024,
        submitted_at=at,
        submitted_block=0,
        ready_at=at,
        ready_block=0,
        round_id=0,
        fork_url=FORK,
        commit_hash=COMMIT,
        claimed_tokens_per_sec=1000.0,
        client_ip=client_ip,
    )


def test_a_database_made_at_revision_0001_upgrades_and_its_old_reports_read(database_url, chain, wallets):
    old = Database(database_url)
    try:
        command.upgrade(old._alembic(), "0001")
        with old.engine.begin() as connection:
            connection.execute(
                insert(Submission.__table__).values(
                    id=1, **old_ready_submission(wallets["a"].hotkey.ss58_address, "10.0.0.1", 1.7e9)
                )
            )
            # The table as 0001 made it (no lengths column): the insert names only the columns it had.
            connection.execute(
                insert(EvaluationReport.__table__).values(
                    id=1,
                    submission_id=1,
                    validator_hotkey=wallets["v1"].hotkey.ss58_address,
                    reported_at=1.7e9,
                    verdict="passed",
                    correct=True,
                    logits_ok=True,
                    measured_tokens_per_sec=990.0,
                    benchmarks={"512": 2000.0, "1024": 990.0},
                    reasons=["cpu: not a benchmark"],
                )
            )
    finally:
        old.dispose()
    with ApiServer(api_config(wallets["api"].hotkey.ss58_address), chain, database_url) as server:
        status = httpx.get(server.url + "/submissions/1").json()
        assert status["state"] == "passed" and status["reports"][0]["reasons"] == ["cpu: not a benchmark"]
        assert [
            (x["seq_len"], x["tokens_per_sec"], x["peak_vram_mb"], x["status"]) for x in status["reports"][0]["lengths"]
        ] == [(512, 2000.0, None, None), (1024, 990.0, None, None)]
        assert "cpu: not a benchmark" in httpx.get(server.url + "/dashboard/submissions/1").text


def proxied_client(url: str, wallet: bt.Wallet, api_hotkey: str, forwarded_for: str) -> ApiClient:
    """A client of the API at ``url`` behind its trusted proxy, which names ``forwarded_for`` as the caller."""
    return ApiClient(url, wallet, api_hotkey=api_hotkey, http=httpx.Client(headers={"X-Forwarded-For": forwarded_for}))


def test_a_database_at_revision_0003_keeps_its_failures_and_bans_counting_by_normalised_address(
    database_url, chain, wallets
):
    old = Database(database_url)
    now = time.time()
    try:
        command.upgrade(old._alembic(), "0003")
        with old.engine.begin() as connection:
            submission_id = connection.execute(
                insert(Submission.__table__)
                .values(**old_ready_submission(wallets["b"].hotkey.ss58_address, "::ffff:203.0.113.7", now))
                .returning(Submission.__table__.c.id)
            ).scalar_one()
            connection.execute(
                insert(ValidationFailure.__table__),
                [
                    dict(
                        client_ip="::ffff:203.0.113.7",
                        failed_at=now - n,
                        submission_id=submission_id,
                        kind="evaluation",
                        reason="failed",
                        dedupe_key=None,
                    )
                    for n in range(4)
                ],
            )
            connection.execute(
                insert(IpBan.__table__).values(
                    client_ip="2001:db8:1:2::5", banned_at=now, banned_until=now + 3600, reason="five failures"
                )
            )
    finally:
        old.dispose()
    config_ = api_config(wallets["api"].hotkey.ss58_address, trusted_proxies=("127.0.0.1",))
    with (
        ApiServer(config_, chain, database_url) as server,
        proxied_client(server.url, wallets["b"], config_.api_hotkey, "203.0.113.7") as ipv4,
        proxied_client(server.url, wallets["a"], config_.api_hotkey, "2001:db8:1:2::99") as ipv6,
    ):
        # The /64 of the address banned before the upgrade is banned.
        refused(lambda: ipv6.submit_kernel(Claim(FORK, commit_of(7), 1.0), 1024), 403, "IP 2001:db8:1:2::/64 is banned")
        # The four failures recorded IPv4-mapped count with a fifth from the plain address: banned.
        salt = new_salt()
        committed = ipv4.commit(commitment_hash(salt, FORK, commit_of(8)), 1024)
        chain.advance(100)
        refused(lambda: ipv4.reveal(committed.submission_id, salt, Claim(FORK, commit_of(9), 1.0)), 400)
        refused(lambda: ipv4.submit_kernel(Claim(FORK, commit_of(10), 1.0), 1024), 403, "IP 203.0.113.7 is banned")


# --- pure parts ---


# The verdicts (v1's first) that bring three validators of equal stake, under a quorum of half
# the stake and two of them, to each consensus state.
VERDICTS = {"awaiting_quorum": (True,), "disputed": (True, False), "passed": (True, True), "failed": (False, False)}


def view(state: str) -> Consensus:
    """The consensus in ``state``, as consensus.decide reaches it from reports."""
    reports = [Report(f"v{n}", passed, None, 1000.0) for n, passed in enumerate(VERDICTS[state], 1)]
    reached = decide(reports, Electorate({"v1": 1.0, "v2": 1.0, "v3": 1.0}), Quorum(0.5, 2))
    assert reached.state == state
    return reached


COPIED = CopyOf(9, 3, "5Original", "content")


@pytest.mark.parametrize(
    "args, state",
    [
        (("commit_reveal", False, "waiting", 0, None, None), "committed"),
        (("commit_reveal", False, "open", 0, None, None), "committed"),
        (("commit_reveal", False, "expired", 0, None, None), "expired"),
        (("commit_reveal", True, None, 0, None, None), "revealed"),
        (("direct", True, None, 0, None, None), "queued"),
        (("direct", True, None, 2, None, None), "being_evaluated"),
        (("direct", True, None, 2, view("awaiting_quorum"), None), "awaiting_quorum"),
        (("direct", True, None, 0, view("disputed"), None), "disputed"),
        (("direct", True, None, 1, view("passed"), None), "passed"),
        (("commit_reveal", True, None, 0, view("failed"), None), "failed"),
        (("direct", True, None, 0, view("passed"), COPIED), "copy"),
        (("direct", True, None, 0, view("awaiting_quorum"), COPIED), "copy"),
        (("direct", True, None, 0, view("failed"), COPIED), "failed"),
    ],
)
def test_submission_state(args, state):
    assert submission_state(*args) == state


def test_best_point_per_round():
    points = [
        RoundPoint(round_id=2, submission_id=5, measured_tokens_per_sec=10.0, weighted_score=0.0, state="failed"),
        RoundPoint(round_id=2, submission_id=6, measured_tokens_per_sec=8.0, weighted_score=4.0, state="passed"),
        RoundPoint(round_id=1, submission_id=3, measured_tokens_per_sec=7.0, weighted_score=3.5, state="passed"),
    ]
    assert [(p.round_id, p.submission_id) for p in best_per_round(points)] == [(1, 3), (2, 6)]


def test_charts_scale_label_and_escape():
    assert [nice_ceiling(v) for v in (0, 0.7, 3, 7.5, 12, 95_000)] == [1.0, 1.0, 5, 10, 20, 100_000]
    assert [compact(v) for v in (950, 1_500, 2_340_000, 61_600_000)] == ["950", "1.5k", "2.34M", "61.6M"]
    svg = bar_chart("<b>t</b>", ["T=512", "T=1,024"], [Series("v<1>", [3e5, None], [False, True])], "tokens/s")
    assert svg.startswith("<svg") and "&lt;b&gt;t&lt;/b&gt;" in svg and "v&lt;1&gt;" in svg
    assert svg.count("<rect") == 2 and "n/a" in svg  # one bar and the legend's swatch
    wrong = bar_chart("t", ["T=512"], [Series("v", [1.0], [True])], "tokens/s")
    assert "#dc2626" in wrong
    line = line_chart("t", ["round 1", "round 2"], [1e5, 2e5], "tokens/s", failed=[True, False])
    assert line.count("<circle") == 2 and "<polyline" in line and "#dc2626" in line
