"""A miner whose submission API moves to another database: a fresh one (a new server, a switch between
SQLite and PostgreSQL, a database lost), whose ids start at 1 again, or a backup older than the
miner's last submission, whose ids go back and are given to other submissions. An id names a
submission only within one database: the miner asks the API whether it still holds its submission
(docs/miner.md, "When the API's database is replaced or restored"). A real API over SQLite files on
127.0.0.1, the dev chain, the miner's workspace clone of a local bare fork, and the miner's own
submitter, wait between cycles and verdict log."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from api_fixtures import ApiServer, api_config
from quasar.api.client import ApiClient, Claim
from quasar.localnet.host import make_wallet
from quasar.miner.loop import Evaluator, LoopConfig, Miner
from quasar.miner.status import VerdictWatcher
from quasar.miner.strategies import TuningStrategy
from quasar.miner.submission import COMMIT_REVEAL, DIRECT, Submitter
from servers import serving
from test_miner_standins import bare_has
from test_miner_submission import Setup, measurement
from tests.evaluate_runs import FAST_CPU


class Moving(Setup):
    """:class:`Setup` with a second miner, ``other``, and an API the subnet owner can move."""

    def __init__(self, tmp_path: Path):
        super().__init__(tmp_path)
        self.other = make_wallet(tmp_path / "wallets", "other")
        self.chain.register_wallet(self.other)
        self.database = tmp_path / "api.sqlite3"

    def backup(self) -> Path:
        """A copy of the API's database as it is now (SQLite's online backup)."""
        copy = self.tmp / f"backup-{len(list(self.tmp.glob('backup-*')))}.sqlite3"
        with sqlite3.connect(self.database) as live, sqlite3.connect(copy) as saved:
            live.backup(saved)
        return copy

    def move(self, database: Path, *clients: ApiClient) -> None:
        """The API started again over ``database`` (a fresh file, or a backup), at a new address the
        miner follows (quasar.api.lookup.ApiFollower retargets its client)."""
        self.server.__exit__(None, None, None)
        config = api_config(self.api_wallet.hotkey.ss58_address, allow_local_forks=True)
        self.server = ApiServer(config, self.chain, f"sqlite:///{database}").__enter__()
        self.database = database
        for client in clients:
            client.retarget(self.server.url, None)

    def others_submission(self, commit: str) -> int:
        with ApiClient(self.server.url, self.other, api_hotkey=self.api_wallet.hotkey.ss58_address) as client:
            return client.submit_kernel(Claim(self.fork_url, commit, 500.0), 4096).submission_id

    def held(self) -> list[tuple[int, str | None, str]]:
        """The API's submissions of the miner, oldest first: id, commit, state."""
        listed = self.client(self.validator).miner_submissions(self.hotkey).submissions
        return [(item.submission_id, item.commit_hash, item.state) for item in reversed(listed)]


@pytest.fixture
def setup(tmp_path):
    running = Moving(tmp_path)
    yield running
    running.close()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def running_miner(setup: Moving, submitter: Submitter) -> Miner:
    """The miner's loop around ``submitter``, for its wait between cycles (no cycle is run)."""
    config = LoopConfig(iterations=0, interval_s=0, min_improvement=0.02)
    return Miner(setup.clone, [TuningStrategy()], Evaluator(FAST_CPU), submitter, submitter.state, setup.store, config)


def test_a_submission_a_fresh_database_lacks_is_submitted_again(setup, caplog):
    """Before: the miner kept the fresh database's submission 1 (another miner's) as its own and,
    its best being what it had submitted, never submitted again: unranked until it found a faster
    kernel."""
    caplog.set_level(logging.INFO, logger="quasar.miner")
    commit = setup.new_commit("submitted before the move")
    best = measurement(commit, 1000.0)
    submitter = setup.submitter(DIRECT)
    submitter.clock = clock = Clock()
    submitter.state.best = best
    assert submitter.submit_if_better(best)
    miner = running_miner(setup, submitter)
    miner.wait(threading.Event(), 0.01)
    assert setup.held() == [(1, commit, "queued")]  # the API holds it: nothing is sent again

    setup.move(setup.tmp / "fresh.sqlite3", submitter.client)
    assert setup.others_submission("9" * 40) == 1
    clock.now += 299
    miner.wait(threading.Event(), 0.01)
    assert setup.held() == []  # asked every 5 minutes, not at every step of the wait
    clock.now += 1
    miner.wait(threading.Event(), 0.01)
    [(submission_id, held_commit, _)] = setup.held()
    assert (submission_id, held_commit) == (2, commit)
    assert setup.store.load(setup.hotkey).last_submission.submission_id == 2
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"the API no longer holds submission 1 ({commit[:12]} at T=4096)" in warning
    clock.now += 300
    miner.wait(threading.Event(), 0.01)
    assert len(setup.held()) == 1


def test_a_submission_an_older_backup_lacks_is_submitted_again_not_left_on_the_older_one(setup):
    """Before: the restored backup held the miner's older, slower submission only, and the miner
    never sent its newer one again (the id it held named another miner's submission)."""
    older, newer = setup.new_commit("older"), setup.new_commit("newer")
    submitter = setup.submitter(DIRECT)
    submitter.confirm_every_s = 0
    assert submitter.submit_if_better(measurement(older, 1000.0))
    backup = setup.backup()
    submitter.state.best = measurement(newer, 1500.0)
    assert submitter.submit_if_better(submitter.state.best)
    assert submitter.state.last_submission.submission_id == 2

    setup.move(backup, submitter.client)
    assert setup.others_submission("9" * 40) == 2
    assert not submitter.advance()
    assert [(held_id, commit) for held_id, commit, _ in setup.held()] == [(1, older), (3, newer)]
    assert setup.store.load(setup.hotkey).last_submission.submission_id == 3


def test_a_revealed_commitment_an_older_backup_holds_unrevealed_is_committed_again(setup):
    """Before: the backup held the commitment as it was before the reveal; the miner, having
    revealed it, neither revealed nor submitted again, and it expired unrevealed."""
    commit = setup.new_commit("revealed after the backup")
    submitter = setup.submitter(COMMIT_REVEAL)
    submitter.confirm_every_s = 0
    submitter.state.best = measurement(commit, 1000.0)
    assert submitter.submit_if_better(submitter.state.best)
    backup = setup.backup()
    setup.chain.advance(100)
    assert submitter.advance()

    setup.move(backup, submitter.client)
    assert setup.held() == [(1, None, "committed")]
    assert not submitter.advance()
    pending = setup.store.load(setup.hotkey).pending_reveal
    assert pending.submission_id == 2 and pending.measurement.commit == commit
    setup.chain.advance(100)
    assert submitter.advance()
    assert setup.held()[-1][:2] == (2, commit)


def test_a_pending_commitment_a_fresh_database_lacks_is_committed_again_before_its_window(setup):
    """Before: the miner waited for the reveal window of a commitment the API no longer held, its
    id another miner's, and only then dropped it."""
    commit = setup.new_commit("pending at the move")
    submitter = setup.submitter(COMMIT_REVEAL)
    submitter.confirm_every_s = 0
    assert submitter.submit_if_better(measurement(commit, 1000.0))
    setup.chain.advance(50)
    setup.move(setup.tmp / "fresh.sqlite3", submitter.client)
    assert setup.others_submission("9" * 40) == 1
    assert not submitter.advance()
    pending = setup.store.load(setup.hotkey).pending_reveal
    assert pending.submission_id == 2 and pending.reveal_from_block == setup.chain.current_block() + 100
    assert setup.held() == [(2, None, "committed")]


def test_a_commitment_the_api_no_longer_holds_is_never_pushed_at_its_reveal(setup, caplog):
    """Before: at the reveal the miner pushed the commit, then the API answered 404 and the miner
    dropped the commitment: its commit public on GitHub and submitted nowhere, for anyone to submit
    first (a copy counts from the block it was made ready, a new commitment from its window's)."""
    commit = setup.new_commit("must stay private")
    submitter = setup.submitter(COMMIT_REVEAL)
    assert submitter.submit_if_better(measurement(commit, 1000.0))
    assert not submitter.advance()  # too early; the API holds it (asked now, next in 5 minutes)
    first_window = submitter.state.pending_reveal.reveal_from_block
    setup.move(setup.tmp / "fresh.sqlite3", submitter.client)
    setup.chain.advance(100)
    assert not submitter.advance()
    assert not bare_has(setup.bare, commit)
    pending = setup.store.load(setup.hotkey).pending_reveal
    assert pending is not None and pending.submission_id == 1 and pending.reveal_from_block == first_window + 100
    assert "the API no longer holds commitment 1" in caplog.text
    setup.chain.advance(100)
    assert submitter.advance()
    assert bare_has(setup.bare, commit) and [item[:2] for item in setup.held()] == [(1, commit)]


def test_an_api_that_cannot_say_whether_it_holds_the_submission_keeps_it(setup, tmp_path):
    """An API older than GET /submissions/{id} answers its framework's 404, and an API out of reach
    answers nothing: neither says the submission is gone, so nothing is submitted again."""
    commit = setup.new_commit("kept")
    submitter = setup.submitter(DIRECT)
    submitter.confirm_every_s = 0
    assert submitter.submit_if_better(measurement(commit, 1000.0))
    kept = submitter.state.last_submission
    older = Starlette(routes=[Route("/{path:path}", lambda request: JSONResponse({"detail": "Not Found"}, 404))])
    with serving(older) as port:
        submitter.client.retarget(f"http://127.0.0.1:{port}", setup.api_wallet.hotkey.ss58_address)
        assert not submitter.advance()
    assert not submitter.advance()  # the same port, closed now
    assert submitter.state.last_submission == kept


def test_a_verdict_on_a_new_submission_under_an_id_already_logged_is_logged(setup, caplog):
    """Before: the watcher knew a verdict by the submission's id and the validator; the restored
    backup gave the miner's next submission the id of one it had logged a verdict on, and the new
    verdict (a failure, with its reasons) was never logged."""
    caplog.set_level(logging.INFO, logger="quasar.miner.status")
    backup = setup.backup()
    miner, validator = setup.client(setup.miner), setup.client(setup.validator)
    watcher = VerdictWatcher(miner, setup.hotkey)
    first = miner.submit_kernel(Claim(setup.fork_url, "1" * 40, 1000.0), 4096).submission_id
    validator.fetch_work()
    validator.report(first, "passed", True, True, 1000.0)
    assert watcher.poll() == [(first, setup.validator.hotkey.ss58_address)]

    setup.move(backup, miner, validator)
    second = miner.submit_kernel(Claim(setup.fork_url, "2" * 40, 2000.0), 4096).submission_id
    assert second == first
    validator.fetch_work()
    validator.report(second, "failed", False, None, None, reasons=["the output differs from the reference"])
    assert watcher.poll() == [(second, setup.validator.hotkey.ss58_address)]
    assert "the output differs from the reference" in caplog.text
