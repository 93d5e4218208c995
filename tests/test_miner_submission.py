"""Submissions through a real submission API on 127.0.0.1 with a dev chain: direct and commit-reveal,
resubmission only on improvement, restarts that resume a pending reveal, and the state file."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from api_fixtures import SLOW_BLOCKS, ApiServer, api_config
from quasar.api.client import ApiClient, Claim
from quasar.api.devdb import free_port, start_api_process
from quasar.api.rules import commitment_hash
from quasar.chain.devchain import DevChain
from quasar.evaluate.report import FAIL, OK, OOM, PASS, EvaluationReport, LengthResult
from quasar.localnet.host import make_wallet
from quasar.miner.github import Git, write_askpass
from quasar.miner.runner import _check_services, remote_url
from quasar.miner.state import Measurement, MinerState, MinerStateError, PendingReveal, StateStore
from quasar.miner.strategies import SLOWER, Attempt
from quasar.miner.submission import (
    COMMIT_REVEAL,
    DIRECT,
    Submitter,
    choose_target_length,
    is_improvement,
    measurement_from_report,
)
from quasar.miner.workspace import ForkClone, Workspace
from quasar.starter_fork import write_starter_fork
from test_miner_standins import CHUNK_FILE, bare_has
from tests.gitrepo import git
from tests.processes import libfaketime


class Setup:
    """An API, a dev chain, a miner wallet, its workspace clone of a local bare fork, its state."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        wallets = tmp_path / "wallets"
        self.api_wallet, self.miner, self.validator = (make_wallet(wallets, n) for n in ("api", "miner", "v1"))
        self.chain_path = tmp_path / "devchain.sqlite3"
        self.chain = DevChain(self.chain_path, netuid=24, block_time_s=SLOW_BLOCKS)
        self.chain.register_wallet(self.miner)
        self.chain.register_wallet(self.validator, stake=1e4, validator_permit=True)
        config = api_config(self.api_wallet.hotkey.ss58_address, allow_local_forks=True)
        self.server = ApiServer(config, self.chain, f"sqlite:///{tmp_path}/api.sqlite3").__enter__()
        self.hotkey = self.miner.hotkey.ss58_address
        source = tmp_path / "source"
        write_starter_fork(source)
        self.bare = tmp_path / "remotes" / "alice" / "flash-linear-attention.git"
        git(None, "clone", "-q", "--bare", str(source), str(self.bare))
        self.fork_url = remote_url("file://" + str(tmp_path / "remotes"), "alice/flash-linear-attention")
        self.workspace = Workspace(tmp_path / "workspaces", self.hotkey)
        self.workspace.acquire()
        runner = Git(write_askpass(self.workspace.askpass), "alice", "", "Alice", "alice@example.invalid")
        self.clone = ForkClone(self.workspace.fork, runner, self.fork_url, "main")
        self.clone.sync()
        self.store = StateStore(self.workspace.state_file)
        self.clients: list[ApiClient] = []

    def client(self, wallet) -> ApiClient:
        client = ApiClient(self.server.url, wallet, api_hotkey=self.api_wallet.hotkey.ss58_address)
        self.clients.append(client)
        return client

    def submitter(self, mode: str, state: MinerState | None = None, min_gain: float = 0.02) -> Submitter:
        """A submitter as a freshly started miner builds it: its state loaded from disk."""
        state = state or self.store.load(self.hotkey)
        chain = DevChain(self.chain_path)  # the miner's own connection to the chain
        return Submitter(
            self.client(self.miner),
            chain,
            state,
            self.store,
            mode,
            self.fork_url,
            publish=self.clone.push,
            min_gain=min_gain,
        )

    def new_commit(self, note: str) -> str:
        path = self.clone.path / CHUNK_FILE
        path.write_text(path.read_text() + f"\n# {note}\n")
        return self.clone.commit([CHUNK_FILE], note)

    def work(self) -> list:
        return self.client(self.validator).fetch_work().items

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.server.__exit__(None, None, None)
        self.workspace.release()


@pytest.fixture
def setup(tmp_path):
    running = Setup(tmp_path)
    yield running
    running.close()


def measurement(commit: str, claim: float, target: int = 4096) -> Measurement:
    return Measurement(
        commit=commit,
        target_seq_len=target,
        tokens_per_sec=claim * 1.05,
        claim=claim,
        benchmarks={512: claim * 1.2, target: claim * 1.05},
        vram_mb=321,
    )


def test_direct_submission_pushes_then_submits_the_claim(setup):
    commit = setup.new_commit("faster")
    assert not bare_has(setup.bare, commit)
    submitter = setup.submitter(DIRECT)
    assert submitter.submit_if_better(measurement(commit, 1000.0))
    assert bare_has(setup.bare, commit)
    [item] = setup.work()
    assert (item.hotkey, item.commit_hash, item.target_sequence_length) == (setup.hotkey, commit, 4096)
    assert item.claimed_tokens_per_sec == 1000.0 and item.vram_mb == 321
    assert item.benchmarks == {512: 1200.0, 4096: 1050.0}
    assert item.fork_url == setup.fork_url
    saved = setup.store.load(setup.hotkey).last_submission
    assert saved.submission_id == item.submission_id and saved.measurement.commit == commit


def test_resubmits_only_on_improvement(setup):
    first = setup.new_commit("first")
    submitter = setup.submitter(DIRECT, min_gain=0.02)
    assert submitter.submit_if_better(measurement(first, 1000.0))
    assert not submitter.submit_if_better(measurement(first, 1000.0))  # the same again
    noise = setup.new_commit("noise")
    assert not submitter.submit_if_better(measurement(noise, 1015.0))  # within the minimum improvement
    better = setup.new_commit("better")
    assert submitter.submit_if_better(measurement(better, 1100.0))
    longer = setup.new_commit("longer")
    assert submitter.submit_if_better(measurement(longer, 400.0, target=1_000_000))  # 400 x 3.0 > 1100 x 0.5
    sent = setup.client(setup.miner).miner_submissions(setup.hotkey).submissions
    assert [item.commit_hash for item in reversed(sent)] == [first, better, longer]
    # The newest supersedes the older ones no validator reported on (docs/rules.md section 3).
    assert [item.commit_hash for item in setup.work()] == [longer]


def test_a_direct_submission_sent_before_a_crash_is_recognised(setup):
    commit = setup.new_commit("sent")
    setup.clone.push(commit)
    claim = measurement(commit, 1000.0)
    accepted = setup.client(setup.miner).submit_kernel(Claim(setup.fork_url, commit, 1000.0), 4096)
    submitter = setup.submitter(DIRECT)
    assert submitter.submit_if_better(claim)
    assert submitter.state.last_submission.submission_id == accepted.submission_id
    assert len(setup.work()) == 1


def test_a_commit_that_cannot_be_pushed_is_not_submitted(setup, caplog):
    elsewhere = setup.tmp / "elsewhere"
    git(None, "clone", "-q", setup.fork_url, str(elsewhere))
    (elsewhere / "README.md").write_text("pushed by someone else\n")
    git(elsewhere, "commit", "-q", "-am", "elsewhere")
    git(elsewhere, "push", "-q", "origin", "main")
    commit = setup.new_commit("diverged")  # on top of the old head: the push is not a fast-forward
    submitter = setup.submitter(DIRECT)
    assert not submitter.submit_if_better(measurement(commit, 1000.0))
    assert "git push was rejected" in caplog.text and "never force-pushes" in caplog.text
    assert setup.work() == [] and submitter.state.last_submission is None
    assert not bare_has(setup.bare, commit)


def test_commit_reveal_keeps_the_code_private_until_the_reveal(setup):
    commit = setup.new_commit("secret kernel")
    submitter = setup.submitter(COMMIT_REVEAL)
    assert submitter.submit_if_better(measurement(commit, 1000.0))
    pending = setup.store.load(setup.hotkey).pending_reveal
    assert pending.submission_id is not None and len(pending.salt) >= 32
    assert pending.commitment_hash == commitment_hash(pending.salt, setup.fork_url, commit)
    assert pending.reveal_from_block == setup.chain.current_block() + 100
    assert not bare_has(setup.bare, commit)  # nobody can read it yet
    assert setup.work() == []
    assert not submitter.advance()  # too early
    assert not submitter.submit_if_better(measurement(setup.new_commit("later"), 2000.0))  # one at a time

    setup.chain.advance(100)
    assert submitter.advance()
    assert bare_has(setup.bare, commit)
    [item] = setup.work()
    assert (item.submission_id, item.commit_hash) == (pending.submission_id, commit)
    assert item.claimed_tokens_per_sec == 1000.0
    state = setup.store.load(setup.hotkey)
    assert state.pending_reveal is None and state.last_submission.mode == COMMIT_REVEAL


def test_a_restart_resumes_the_pending_reveal(setup):
    commit = setup.new_commit("before restart")
    setup.submitter(COMMIT_REVEAL).submit_if_better(measurement(commit, 1000.0))
    setup.chain.advance(150)
    restarted = setup.submitter(COMMIT_REVEAL)  # a new process: state from disk only
    assert restarted.state.pending_reveal is not None
    assert restarted.advance()
    [item] = setup.work()
    assert item.commit_hash == commit


def test_a_measurement_waiting_for_a_pending_reveal_is_said_once(setup, caplog):
    """A miner restarted with a pending reveal (an upgrade from d6da05d) offers its baseline at the
    start of the cycle and again at its end: 'a commit-reveal is pending' was said twice."""
    commit = setup.new_commit("pending")
    setup.submitter(COMMIT_REVEAL).submit_if_better(measurement(commit, 1000.0))
    restarted = setup.submitter(COMMIT_REVEAL)
    caplog.set_level(logging.INFO, logger="quasar.miner.submission")
    baseline = measurement(commit, 1100.0)
    assert not restarted.submit_if_better(baseline)
    assert not restarted.submit_if_better(baseline)
    kept = measurement(setup.new_commit("kept while pending"), 1300.0)
    assert not restarted.submit_if_better(kept)
    said = [record.getMessage() for record in caplog.records if "is pending" in record.getMessage()]
    assert said == [f"a commit-reveal is pending ({commit[:12]}); the next submission waits for its reveal"] * 2


def test_a_commitment_whose_answer_was_lost_is_found_not_resent(setup):
    commit = setup.new_commit("answer lost")
    salt = "ab" * 32
    digest = commitment_hash(salt, setup.fork_url, commit)
    state = MinerState(
        hotkey=setup.hotkey, pending_reveal=PendingReveal(salt, setup.fork_url, digest, measurement(commit, 900.0), 0.0)
    )
    setup.store.save(state)  # saved before sending, as the submitter does
    sent = setup.client(setup.miner).commit(digest, 4096)  # sent; the miner crashed before the answer
    restarted = setup.submitter(COMMIT_REVEAL)
    assert not restarted.advance()
    assert restarted.state.pending_reveal.submission_id == sent.submission_id
    assert len(setup.client(setup.miner).pending_reveals(setup.hotkey).pending) == 1
    setup.chain.advance(100)
    assert restarted.advance()
    assert [item.submission_id for item in setup.work()] == [sent.submission_id]


def test_a_commitment_that_never_left_is_sent_again_with_its_salt(setup):
    commit = setup.new_commit("never sent")
    salt = "cd" * 32
    digest = commitment_hash(salt, setup.fork_url, commit)
    setup.store.save(
        MinerState(
            hotkey=setup.hotkey,
            pending_reveal=PendingReveal(salt, setup.fork_url, digest, measurement(commit, 900.0), 0.0),
        )
    )
    restarted = setup.submitter(COMMIT_REVEAL)
    assert not restarted.advance()
    [listed] = setup.client(setup.miner).pending_reveals(setup.hotkey).pending
    assert listed.commitment_hash == digest
    setup.chain.advance(100)
    assert restarted.advance()
    assert setup.work()[0].commit_hash == commit


def test_an_expired_reveal_window_drops_the_commitment(setup):
    commit = setup.new_commit("too late")
    submitter = setup.submitter(COMMIT_REVEAL)
    submitter.submit_if_better(measurement(commit, 1000.0))
    setup.chain.advance(100 + 1000)
    assert not submitter.advance()
    assert setup.store.load(setup.hotkey).pending_reveal is None
    assert not bare_has(setup.bare, commit)
    assert submitter.submit_if_better(measurement(commit, 1000.0))  # it may be committed afresh


def test_an_unreachable_api_is_retried_later(setup):
    commit = setup.new_commit("offline")
    submitter = setup.submitter(COMMIT_REVEAL)
    submitter.client = ApiClient(
        "http://127.0.0.1:9", setup.miner, api_hotkey=setup.api_wallet.hotkey.ss58_address, http=httpx.Client(timeout=2)
    )
    submitter.submit_if_better(measurement(commit, 1000.0))
    pending = setup.store.load(setup.hotkey).pending_reveal
    assert pending is not None and pending.submission_id is None  # the salt is kept for the retry
    submitter.client = setup.client(setup.miner)
    submitter.advance()
    assert setup.store.load(setup.hotkey).pending_reveal.submission_id is not None


@contextmanager
def skewed_api(setup: Setup, tmp_path: Path, offset: Path) -> Iterator[str]:
    """The API in a process of its own over ``setup``'s chain, its clock moved by the libfaketime
    offset in the file ``offset`` (read at every clock read); yields its URL."""
    faked = {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "DONT_FAKE_MONOTONIC": "1",
    }
    api_hotkey = setup.api_wallet.hotkey.ss58_address
    process, url = start_api_process(
        tmp_path, f"sqlite:///{tmp_path}/skewed-api.sqlite3", setup.chain_path, api_hotkey, settings=faked
    )
    try:
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_a_reveal_refused_for_the_clock_keeps_the_commitment_for_a_later_reveal(setup, tmp_path):
    """The miner's clock runs 120 s ahead of the API's when its reveal is due (here the API's clock
    steps 120 s back): the API refuses the reveal (401), after the miner pushed the commit. The
    miner dropped the commitment: its kernel public and submitted nowhere. It keeps it and reveals
    once the clocks agree again, within the window."""
    offset = tmp_path / "api-clock-offset"
    offset.write_text("+0\n")
    api_hotkey = setup.api_wallet.hotkey.ss58_address
    with skewed_api(setup, tmp_path, offset) as url:
        submitter = setup.submitter(COMMIT_REVEAL)
        submitter.client = ApiClient(url, setup.miner, api_hotkey=api_hotkey)
        setup.clients.append(submitter.client)
        commit = setup.new_commit("revealed late")
        assert submitter.submit_if_better(measurement(commit, 1000.0))
        setup.chain.advance(100)
        offset.write_text("-120\n")
        assert not submitter.advance()
        assert bare_has(setup.bare, commit)  # pushed before the refusal
        pending = setup.store.load(setup.hotkey).pending_reveal
        assert pending is not None and pending.measurement.commit == commit
        offset.write_text("+0\n")
        assert submitter.advance()
        with ApiClient(url, setup.validator, api_hotkey=api_hotkey) as validator:
            [item] = validator.fetch_work().items
        assert item.commit_hash == commit


def test_a_commitment_refused_for_the_clock_is_said_once_not_at_every_retry(setup, tmp_path, caplog):
    """The miner's clock 120 s ahead of the API's: its commitment is refused (401) and kept, and
    sent again at each advance (every 15 s while the miner waits). Each try logged the refusal and
    that it sends the commitment again: 11,520 lines a day. Said once, then every 10 minutes; once
    accepted, a later refusal is said at once."""
    offset = tmp_path / "api-clock-offset"
    offset.write_text("-120\n")
    with skewed_api(setup, tmp_path, offset) as url:
        submitter = setup.submitter(COMMIT_REVEAL)
        submitter.client = ApiClient(url, setup.miner, api_hotkey=setup.api_wallet.hotkey.ss58_address)
        setup.clients.append(submitter.client)
        with caplog.at_level(logging.INFO, logger="quasar.miner.submission"):
            submitter.submit_if_better(measurement(setup.new_commit("kept"), 1000.0))
            for _ in range(4):
                assert not submitter.advance()
            refusals = [record.getMessage() for record in caplog.records if "not accepted now" in record.getMessage()]
            assert len(refusals) == 1 and "signed 1" in refusals[0], refusals
            assert len([record for record in caplog.records if "sending it again" in record.getMessage()]) <= 1
            offset.write_text("+0\n")
            assert not submitter.advance()
            assert setup.store.load(setup.hotkey).pending_reveal.submission_id is not None


@pytest.mark.parametrize(
    ("api_offset", "said", "submissions_refused"),
    [
        ("-120", r"1(19|20)\.\d s ahead of", True),
        ("+600", r"(599|600)\.\d s behind", True),
        ("+5", r"[45]\.\d s behind", False),
        ("+1.5", r"1\.\d s behind", False),
        ("-5.5", r"5\.\d s ahead of", True),  # also refuses validators 5 s behind the API
    ],
)
def test_a_miner_whose_clock_is_off_the_apis_is_told_at_its_start(
    setup, tmp_path, caplog, api_offset, said, submissions_refused
):
    """A miner on a host whose clock was minutes off the API's learned it only from the API's 401 on
    its first submission, after a cycle of evaluations, and never from its inference server, which
    refused validators' checks (their clocks agree with the API's) at debug level: 5 s behind, the
    API takes its submissions and every validator's check of it fails; 1.5 s behind, a validator
    0.6 s ahead of the API fails it. Its start says so in one line: how far, which way, what is
    refused, and the cure; and that, with this host's clock synced, the API's is the one off."""
    offset = tmp_path / "api-clock-offset"
    offset.write_text(api_offset + "\n")
    with skewed_api(setup, tmp_path, offset) as url:
        with ApiClient(url, setup.miner) as client, caplog.at_level(logging.ERROR, logger="quasar.miner.runner"):
            _check_services(SimpleNamespace(miner_inference_port=free_port()), client, setup.hotkey)
    (line,) = [record.getMessage() for record in caplog.records if "clock" in record.getMessage()]
    assert re.search(rf"this host's clock is {said} the submission API's", line), line
    assert ("the API refuses this miner's submissions" in line) == submissions_refused, line
    assert "inference server on this host refuses logit checks of validators" in line, line
    assert "timedatectl set-ntp true" in line, line
    assert "(if timedatectl says this host's is synchronized, the submission API's is off)" in line, line


# --- rules without the API ---


def length(seq_len: int, tps: float | None, status: str = OK, correct: bool | None = True) -> LengthResult:
    return LengthResult(
        seq_len=seq_len,
        status=status,
        tokens_per_sec=tps,
        tokens_per_sec_min=tps and tps * 0.9,
        correct=correct,
        peak_vram_mb=100.0,
    )


def report(lengths: list[LengthResult], target: int, verdict: str = PASS) -> EvaluationReport:
    by_key = {str(item.seq_len): item for item in lengths}
    measured = by_key[str(target)].tokens_per_sec if str(target) in by_key else None
    return EvaluationReport(
        verdict=verdict,
        reasons=[] if verdict == PASS else ["x"],
        repo="r",
        target_seq_len=target,
        seq_lens=sorted(by_key, key=int),
        device="cuda",
        device_name="GPU",
        import_check=None,
        lengths=by_key,
        measured_tokens_per_sec=measured,
        recommended_claim=measured and measured * 0.9,
    )


def test_target_length_maximises_the_weighted_score_that_fits():
    probe = report(
        [
            length(100_000, 5e6),
            length(200_000, 4e6),
            length(300_000, 3.1e6),
            length(400_000, 2.4e6),
            length(500_000, None, OOM, None),
        ],
        500_000,
        FAIL,
    )
    assert choose_target_length(probe) == 300_000  # 3.1M x 1.0 beats 4M x 0.75, 2.4M x 1.25 and 5M x 0.5
    wrong = report([length(100_000, 5e6), length(1_000_000, 9e6, correct=False)], 1_000_000)
    assert choose_target_length(wrong) == 100_000  # a fast but wrong length never counts
    tie = report([length(200_000, 4e6), length(250_000, 4e6)], 250_000)
    assert choose_target_length(tie) == 200_000
    assert choose_target_length(report([length(100_000, None, OOM, None)], 100_000, FAIL)) is None


def test_measurement_takes_the_recommended_claim_of_a_passing_report():
    passed = report([length(512, 9000.0), length(4096, 8000.0)], 4096)
    taken = measurement_from_report(passed, "a" * 40)
    assert (taken.claim, taken.tokens_per_sec, taken.vram_mb) == (7200.0, 8000.0, 100)
    assert taken.benchmarks == {512: 9000.0, 4096: 8000.0}
    assert measurement_from_report(replace(passed, verdict=FAIL, reasons=["wrong"]), "a" * 40) is None


@pytest.mark.parametrize("share", [0.25, 0.8, 1.0])
def test_measurement_claims_its_share_of_the_recommended_claim(share):
    passed = report([length(4096, 8000.0)], 4096)
    taken = measurement_from_report(passed, "a" * 40, claim_share=share)
    assert taken.claim == pytest.approx(share * 7200.0)
    assert taken.tokens_per_sec == 8000.0  # what was measured does not change


@pytest.mark.parametrize("share", [0.0, -0.5, 1.01])
def test_a_claim_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="claim_share"):
        measurement_from_report(report([length(4096, 8000.0)], 4096), "a" * 40, claim_share=share)


def test_improvement_is_the_weighted_claim_beyond_the_minimum_gain():
    from quasar.miner.state import SubmissionRecord

    last = SubmissionRecord(1, DIRECT, "u", measurement("a" * 40, 1000.0, target=300_000), 0.0)
    assert is_improvement(measurement("b" * 40, 1021.0, target=300_000), last, 0.02)
    assert not is_improvement(measurement("b" * 40, 1019.0, target=300_000), last, 0.02)
    assert not is_improvement(measurement("a" * 40, 5000.0, target=300_000), last, 0.0)  # same commit and length
    assert is_improvement(measurement("a" * 40, 1000.0, target=1_000_000), last, 0.02)  # league x3
    assert is_improvement(measurement("a" * 40, 1.0), None, 0.02)


# --- the state file ---


def test_state_round_trips_and_is_written_atomically(tmp_path):
    store = StateStore(tmp_path / "state.json")
    hotkey = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
    state = store.load(hotkey)
    assert state == MinerState(hotkey=hotkey)
    state.best = measurement("a" * 40, 1000.0)
    state.pending_reveal = PendingReveal("ab" * 32, "https://github.com/a/b", "f" * 64, state.best, 1.0, 7, 107, 1106)
    state.record(Attempt("tuning", "k", "bv 32 -> 16", SLOWER, 4096, 900.0, 1000.0, "-10%"))
    store.save(state)
    assert store.load(hotkey) == state
    assert (tmp_path / "state.json").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is damaged"),
        ('{"format": 1, "hotkey": 5}', "state.hotkey: expected str"),
        ('{"format": 1, "hotkey": "h", "best": {"commit": "c"}}', "state.best.target_seq_len: expected int"),
        ('{"format": 1, "hotkey": "h", "attempts": [{"outcome": "won"}]}', "state.attempts[0]"),
        ('{"format": 2, "hotkey": "h"}', "format: expected 1"),
    ],
)
def test_a_damaged_state_file_is_a_clear_error(tmp_path, text, message):
    (tmp_path / "state.json").write_text(text)
    with pytest.raises(MinerStateError) as error:
        StateStore(tmp_path / "state.json").load("h")
    assert message in str(error.value) and str(tmp_path / "state.json") in str(error.value)


def test_a_state_of_another_hotkey_is_refused(tmp_path):
    store = StateStore(tmp_path / "state.json")
    store.save(MinerState(hotkey="someone"))
    with pytest.raises(MinerStateError, match="belongs to hotkey someone"):
        store.load("me")
    assert json.loads((tmp_path / "state.json").read_text())["hotkey"] == "someone"
