"""The validator's parts on their own: its state file (real SQLite), verdicts and weights from its
results, device and wallet checks, and reading what a worker wrote."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import bittensor as bt
import pytest
from bittensor.sp_core import Keypair

from quasar import forks, originality, scoring
from quasar.api.client import ApiClient
from quasar.api.devdb import start_api_process
from quasar.api.schemas import MAX_REASON_LENGTH, MAX_REASONS, ReportRequest
from quasar.chain.base import Metagraph, NeuronInfo
from quasar.chain.devchain import FINNEY, DevChain
from quasar.chain.wallets import WalletError, open_wallet
from quasar.config import resolve
from quasar.evaluate import EvaluationOptions, EvaluationReport, ImportCheck, LengthResult, SandboxPolicy
from quasar.localnet.host import make_wallet
from quasar.terminal import rendered_text, short_hotkey
from quasar.validator import state_files
from quasar.validator.devices import Device, ValidatorSetupError, device_warnings, evaluation_devices
from quasar.validator.evaluator import SubprocessEvaluator, WorkerEvaluation, outcome_from_worker, result_from_report
from quasar.validator.intake import submission_from_work
from quasar.validator.logit_check import why_logit_checks_wait
from quasar.validator.preflight import assess_subnet_rules, check_registration
from quasar.validator.records import EvaluationKey, EvaluationRecord, EvaluationResult, Submission, SubmissionRecord
from quasar.validator.results import (
    api_report,
    bounded_reasons,
    plan_weights,
    scoring_result,
    weights_refusal,
    weights_table,
)
from quasar.validator.state import EVALUATION_RETRY_DELAYS_S, MAX_ATTEMPTS, StateError, ValidatorState
from quasar.validator.weight_setting import MAX_NAMED_LEFT_OUT, RULES_READ_BLOCKS, WeightSetter
from quasar.validator.worker import HeadStart, options_from_json, options_to_json
from tests.evaluate_runs import FAST_CPU
from tests.github_network import GitHubProxy, make_github_certificate
from tests.gitrepo import commit_all
from tests.processes import libfaketime

URL = "https://github.com/miner/flash-linear-attention"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HOTKEYS = [Keypair.create_from_mnemonic(Keypair.generate_mnemonic()).ss58_address for _ in range(6)]
GOOD = EvaluationResult(
    correct=True,
    measured_tokens_per_sec=1000.0,
    benchmarks={512: 2000.0, 1024: 1000.0},
    notes=("cpu: not a benchmark",),
)
BAD = EvaluationResult(correct=False, measured_tokens_per_sec=None, reasons=("clone failed: not found",))


def submission(
    submission_id: int,
    hotkey: str = HOTKEYS[0],
    url: str = URL,
    commit: str = COMMIT,
    target: int = 1024,
    claimed: float = 900.0,
    submitted_at: float | None = None,
    block: int = 0,
) -> Submission:
    at = float(submission_id) if submitted_at is None else submitted_at
    values = (submission_id, hotkey, url, commit, target, claimed, at, 0, block)  # in the API's field order
    return Submission(**dict(zip(Submission.model_fields, values, strict=True)))


@pytest.fixture
def state(tmp_path):
    with ValidatorState.open(tmp_path / "state.sqlite3") as opened:
        yield opened


# --- state ---


def test_a_second_submission_of_a_finished_key_reuses_its_result(state):
    assert state.add_submission(submission(1), now=10.0)
    assert not state.add_submission(submission(1), now=11.0)  # fetched again: already known
    key = submission(1).key
    assert state.pending_evaluations() == [key]
    assert state.start_evaluation(key, "cuda:0", now=12.0) == 1
    state.finish_evaluation(key, GOOD, now=13.0)
    assert state.add_submission(submission(2, hotkey=HOTKEYS[1]), now=14.0)  # a copy by another hotkey
    assert state.pending_evaluations() == []
    records = state.needing_logit_check()
    assert [r.submission.submission_id for r in records] == [1, 2]
    assert all(r.evaluation.result == GOOD and r.evaluation.attempts == 1 for r in records)
    # Another target is another measurement.
    state.add_submission(submission(3, target=2048), now=15.0)
    assert state.pending_evaluations() == [EvaluationKey(URL, COMMIT, 2048)]


def test_evaluations_run_in_the_order_of_their_first_submission(state):
    for submission_id, commit in ((5, "a" * 40), (3, "b" * 40), (4, "a" * 40), (9, "c" * 40)):
        state.add_submission(submission(submission_id, commit=commit), now=1.0)
    assert [key.commit_hash for key in state.pending_evaluations()] == ["b" * 40, "a" * 40, "c" * 40]


def test_the_stages_of_a_submission(state):
    state.add_submission(submission(1), now=1.0)
    key = submission(1).key
    assert state.needing_logit_check() == [] and state.ready_to_report() == [] and state.open_submissions() == 1
    state.start_evaluation(key, "cpu", now=2.0)
    state.finish_evaluation(key, GOOD, now=3.0)
    assert [r.submission for r in state.needing_logit_check()] == [submission(1)]
    state.record_logits(1, state_files.PASSED, "cosine 1.0", now=4.0)
    (ready,) = state.ready_to_report()
    assert ready.logits_ok is True and state.scored() == [ready]
    state.record_report(1, state_files.REPORTED, "report 7", now=5.0)
    assert state.ready_to_report() == [] and state.open_submissions() == 0
    with pytest.raises(ValueError):
        state.record_logits(1, "maybe", "", now=6.0)


def test_failed_attempts_are_retried_then_abandoned(state):
    state.add_submission(submission(1), now=1.0)
    key = submission(1).key
    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert state.start_evaluation(key, "cuda:0", now=2.0) == attempt
        status = state.fail_attempt(key, f"worker crashed {attempt}", now=3.0)
        assert status == (state_files.ABANDONED if attempt == MAX_ATTEMPTS else state_files.PENDING)
    record = state.evaluation(key)
    assert (record.status, record.last_error) == (state_files.ABANDONED, "worker crashed 3")
    assert record.attempts == MAX_ATTEMPTS
    assert state.pending_evaluations() == [] and state.open_submissions() == 0 and state.scored() == []
    with pytest.raises(StateError, match="not pending"):
        state.start_evaluation(key, "cuda:0", now=4.0)


def test_a_failure_on_the_validators_side_waits_before_its_next_attempt(state):
    """GitHub down for a minute: the attempts followed each other at once, each failing, and the
    third abandoned the evaluation for good, a submission this validator then never evaluated."""
    state.add_submission(submission(1), now=1.0)
    key = submission(1).key
    state.start_evaluation(key, "cuda:0", now=10.0)
    state.fail_attempt(key, "the fork could not be fetched on this host: ... returned error: 503", now=18.0)
    assert state.pending_evaluations(now=20.0) == []
    assert state.pending_evaluations(now=10.0 + EVALUATION_RETRY_DELAYS_S[0]) == [key]
    assert state.pending_evaluations() == [key]  # without a time: every pending evaluation
    state.start_evaluation(key, "cuda:0", now=200.0)
    state.fail_attempt(key, "the fork could not be fetched on this host: ...", now=208.0)
    assert state.pending_evaluations(now=200.0 + EVALUATION_RETRY_DELAYS_S[0]) == []
    assert state.pending_evaluations(now=200.0 + EVALUATION_RETRY_DELAYS_S[1]) == [key]
    # A first attempt waits for nothing, beside one that waits.
    state.add_submission(submission(2, commit="b" * 40), now=300.0)
    assert state.pending_evaluations(now=300.0) == [submission(2, commit="b" * 40).key]


def test_a_failed_attempt_is_not_held_back_by_a_step_back_of_the_clock(state):
    """The host's clock ran an hour ahead when an attempt failed on this validator's side; NTP then
    stepped it back. The attempt began an hour 'later' than now, so its retry waited an hour and 2
    minutes, not 2 minutes. An attempt that began after now is due at once."""
    state.add_submission(submission(1), now=1.0)
    key = submission(1).key
    ahead = 3600.0 + 100.0
    state.start_evaluation(key, "cuda:0", now=ahead)
    state.fail_attempt(key, "the fork could not be fetched on this host: ... returned error: 503", now=ahead + 8.0)
    assert state.pending_evaluations(now=ahead + 20.0) == []  # the clock right: it waits
    assert state.pending_evaluations(now=100.0 + 20.0) == [key]  # the clock stepped back an hour


def test_a_cancelled_evaluation_does_not_count_as_an_attempt(state):
    state.add_submission(submission(1), now=1.0)
    key = submission(1).key
    state.start_evaluation(key, "cpu", now=2.0)
    state.cancel_evaluation(key)
    assert (state.evaluation(key).status, state.evaluation(key).attempts) == (state_files.PENDING, 0)


def test_reopening_after_a_crash_redoes_in_progress_work_but_keeps_results(tmp_path):
    path = tmp_path / "state.sqlite3"
    first, second = submission(1), submission(2, commit="e" * 40)
    crashed = ValidatorState.open(path)
    crashed.add_submission(first, now=1.0)
    crashed.add_submission(second, now=1.0)
    crashed.start_evaluation(first.key, "cpu", now=2.0)
    crashed.finish_evaluation(first.key, GOOD, now=3.0)
    crashed.start_evaluation(second.key, "cpu", now=4.0)
    assert crashed.evaluation(second.key).status == state_files.IN_PROGRESS
    crashed.close()  # what the kernel does for a killed process: the lock goes, the file stays
    with ValidatorState.open(path) as reopened:
        assert reopened.evaluation(first.key).status == state_files.FINISHED
        assert reopened.evaluation(first.key).result == GOOD
        interrupted = reopened.evaluation(second.key)
        assert (interrupted.status, interrupted.attempts) == (state_files.PENDING, 1)
        assert reopened.pending_evaluations() == [second.key]


# Runs one call of the state in a real process that SIGKILLs itself at the first statement after its
# first commit: where a kill (pm2's, the OOM killer's, a power loss) leaves a call made of several.
_KILLED_AFTER_FIRST_COMMIT = """
import os, signal, sys
from quasar.validator.state import ValidatorState
from quasar.validator.records import EvaluationResult, Submission
from quasar.validator.state_files import PASSED
state = ValidatorState.open(sys.argv[1])
committed = []
def trace(statement):
    if committed:
        os.kill(os.getpid(), signal.SIGKILL)
    if statement.strip().upper() == "COMMIT":
        committed.append(True)
state._connection.set_trace_callback(trace)
submission = Submission.model_validate_json(sys.argv[3])
if sys.argv[2] == "import":
    state.import_result(submission, EvaluationResult(True, 1000.0), PASSED, "report 7", 1.0)
else:
    state.add_refused_submission(submission, "fork_url: must use https", 1.0)
state.open_submissions()  # the validator's next statement: killed here at the latest
"""


@pytest.mark.parametrize("call", ["import", "refused"])
def test_a_kill_inside_an_import_or_a_refusal_leaves_nothing_to_evaluate_again(tmp_path, call):
    """A primary importing a report of its worker (import_result), or a validator recording a
    submission that breaks the fork rules (add_refused_submission), wrote it in several
    transactions: killed after the first, the restarted validator found the submission known
    (never imported again) with its evaluation pending, and evaluated it again (a GPU's minutes,
    the worker's figures replaced) or cloned a URL the rules refuse. Each is one transaction."""
    path = tmp_path / "state.sqlite3"
    ValidatorState.open(path).close()
    url = URL if call == "import" else "http://evil/x"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_FIRST_COMMIT, str(path), call, submission(1, url=url).model_dump_json()],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == -9, killed.stderr
    with ValidatorState.open(path) as restarted:
        assert restarted.pending_evaluations() == [], "the restarted validator evaluates it again"
        (record,) = restarted.submissions()
        assert record.evaluation.status == state_files.FINISHED
        if call == "import":
            assert (record.logits, record.report_state) == (state_files.PASSED, state_files.REPORTED)
            assert restarted.ready_to_report() == [] and restarted.needing_logit_check() == []
        else:
            assert record.evaluation.result.reasons == ("fork_url: must use https",)


def test_one_process_at_a_time(tmp_path):
    path = tmp_path / "state.sqlite3"
    with ValidatorState.open(path):
        holder = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from quasar.validator.state import ValidatorState, StateError\n"
                f"try:\n    ValidatorState.open({str(path)!r})\nexcept StateError as e:\n    print(e); sys.exit(3)",
            ],
            capture_output=True,
            text=True,
        )
    assert holder.returncode == 3
    assert "another validator process (pid " in holder.stdout and str(path) in holder.stdout
    with ValidatorState.open(path):  # released on close
        pass


def test_copies_of_another_hotkeys_kernel_are_left_out_of_what_ranks(state):
    """The validator's own weights never rank a copy: another hotkey's later submission of the same
    commit, or of the same kernel content under another commit (quasar/originality.py)."""
    kernel = "d" * 64
    forks = {
        1: (HOTKEYS[0], "a" * 40, kernel),
        2: (HOTKEYS[1], "b" * 40, kernel),
        3: (HOTKEYS[0], "c" * 40, kernel),
        4: (HOTKEYS[2], "e" * 40, "f" * 64),
    }
    for submission_id, (hotkey, commit, content) in forks.items():
        state.add_submission(submission(submission_id, hotkey=hotkey, commit=commit), now=1.0)
        key = submission(submission_id, commit=commit).key
        state.start_evaluation(key, "cpu", now=2.0)
        state.finish_evaluation(key, replace(GOOD, content_hash=content), now=3.0)
        state.record_logits(submission_id, state_files.PASSED, "ok", now=4.0)
    assert state.evaluation(submission(2, commit="b" * 40).key).result.content_hash == kernel
    # 2 copies 1's kernel; 3 is 1's own hotkey resubmitting it: not a copy.
    assert [record.submission.submission_id for record in state.scored()] == [1, 3, 4]


def test_a_commitment_to_a_kernel_already_submitted_is_the_copy_in_the_validators_weights(state):
    """The attack: Bob commits (commit-reveal, submission 1) to Alice's public kernel; Alice submits
    it directly (submission 2, block 110) before Bob's reveal window opens (block 200). Ordered by
    submission id, the validator would weigh Bob as the original and leave Alice out; the API sends
    the block each counts from, and the validator orders by it (docs/rules.md section 5)."""
    kernel = "d" * 64
    forks = {1: (HOTKEYS[1], "b" * 40, 200), 2: (HOTKEYS[0], "a" * 40, 110)}
    for submission_id, (hotkey, commit, block) in forks.items():
        state.add_submission(submission(submission_id, hotkey=hotkey, commit=commit, block=block), now=1.0)
        key = submission(submission_id, commit=commit).key
        state.start_evaluation(key, "cpu", now=2.0)
        state.finish_evaluation(key, replace(GOOD, content_hash=kernel), now=3.0)
        state.record_logits(submission_id, state_files.PASSED, "ok", now=4.0)
    assert [record.submission.submission_id for record in state.scored()] == [2]


def test_harness_reports_are_dropped_once_reported_and_old_and_the_ranking_keeps_its_figures(state):
    """Each evaluation stored its whole harness report for good: the state file grew by a report per
    evaluation for the validator's life. Reports go once every submission of an evaluation is
    reported and it finished REPORT_KEPT_S ago; the ranking reads none of them."""
    for submission_id, commit in ((1, "a" * 40), (2, "b" * 40), (3, "c" * 40)):
        state.add_submission(submission(submission_id, commit=commit), now=1.0)
        key = submission(submission_id, commit=commit).key
        state.start_evaluation(key, "cpu", now=2.0)
        state.finish_evaluation(key, replace(GOOD, report={"lengths": {}}), now=100.0 * submission_id)
        state.record_logits(submission_id, state_files.PASSED, "", now=400.0)
    state.add_submission(submission(4, hotkey=HOTKEYS[1], commit="a" * 40), now=401.0)  # a copy, unreported
    ranked = [(record.submission, record.evaluation, record.logits) for record in state.scored()]
    state.record_report(1, state_files.REPORTED, "report 1", now=402.0)
    state.record_report(2, state_files.REFUSED, "422", now=402.0)
    assert state.forget_reports(finished_before=250.0) == 1  # 1 waits for its copy's report, 3 is recent
    reports = {record.submission.submission_id: record.evaluation.result.report for record in state.submissions()}
    assert reports == {1: {"lengths": {}}, 2: None, 3: {"lengths": {}}, 4: {"lengths": {}}}
    state.record_report(4, state_files.REPORTED, "report 4", now=403.0)
    assert state.forget_reports(finished_before=250.0) == 1 and state.forget_reports(finished_before=250.0) == 0
    assert [(record.submission, record.evaluation, record.logits) for record in state.scored()] == ranked


def test_ranking_reads_no_harness_report_and_matches_the_full_read(tmp_path):
    """Every epoch ranks every finished submission ever stored: parsing each one's harness report
    made that seconds and hundreds of MB after a few thousand evaluations, growing without end."""
    rng = random.Random()
    path = tmp_path / "state.sqlite3"
    with ValidatorState.open(path) as state:
        for submission_id in range(1, 41):
            commit = f"{submission_id:040x}"
            state.add_submission(submission(submission_id, hotkey=rng.choice(HOTKEYS), commit=commit), now=1.0)
            key = submission(submission_id, commit=commit).key
            if rng.random() < 0.9:
                state.start_evaluation(key, "cpu", now=2.0)
                content = rng.choice(["a" * 64, "b" * 64, None])
                state.finish_evaluation(key, replace(GOOD, report={"n": submission_id}, content_hash=content), now=3.0)
                if rng.random() < 0.8:
                    state.record_logits(
                        submission_id, rng.choice([state_files.PASSED, state_files.FAILED]), "", now=4.0
                    )
        # The slow reference: every finished record read whole, copies and unchecked logits left out.
        known = state.submissions("e.status = ?", (state_files.FINISHED,))
        copies = originality.find_copies(
            originality.Fingerprint(
                r.submission.submission_id,
                r.submission.hotkey,
                r.submission.commit_hash,
                r.evaluation.result.content_hash,
                r.submission.counts_from_block,
            )
            for r in known
        )
        expected = [r for r in known if r.logits != state_files.UNCHECKED and r.submission.submission_id not in copies]
        without_reports = [
            replace(r, evaluation=replace(r.evaluation, result=replace(r.evaluation.result, report=None)))
            for r in expected
        ]
        assert state.scored() == without_reports and expected
    with sqlite3.connect(path) as db:
        db.execute("UPDATE evaluations SET report = '{not json'")
    with ValidatorState.open(path) as state:
        assert len(state.scored()) == len(expected)


def test_a_state_file_of_schema_1_gains_the_content_hash(tmp_path):
    path = tmp_path / "state.sqlite3"
    with ValidatorState.open(path) as state:
        state.add_submission(submission(1), now=1.0)
        state.start_evaluation(submission(1).key, "cpu", now=2.0)
        state.finish_evaluation(submission(1).key, GOOD, now=3.0)
    with sqlite3.connect(path) as db:  # as version 1 made it
        db.execute("ALTER TABLE evaluations DROP COLUMN content_hash")
        db.execute("ALTER TABLE submissions DROP COLUMN counts_from_block")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    with ValidatorState.open(path) as state:
        assert state.get_meta("schema_version") == str(state_files.SCHEMA_VERSION)
        assert state.evaluation(submission(1).key).result == GOOD  # kept, with no content hash


def test_a_state_file_of_schema_2_gains_the_block_submissions_count_from(tmp_path):
    path = tmp_path / "state.sqlite3"
    with ValidatorState.open(path) as state:
        state.add_submission(submission(1, block=7), now=1.0)
    with sqlite3.connect(path) as db:  # as version 2 made it
        db.execute("ALTER TABLE submissions DROP COLUMN counts_from_block")
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    with ValidatorState.open(path) as state:
        assert state.get_meta("schema_version") == str(state_files.SCHEMA_VERSION) == "3"
        # Fetched before the API sent the block: it counts from block 0, before any fetched since.
        assert [record.submission for record in state.submissions()] == [submission(1, block=0)]


def test_a_state_file_migrated_at_start_is_said_in_one_line_and_one_already_newest_in_none(tmp_path, caplog):
    """An upgrade from 5eac284 (schema 1) migrated the file saying only 'validator state: PATH', so
    an operator could not tell that the older validator now refuses it."""
    path = tmp_path / "state.sqlite3"
    with ValidatorState.open(path) as state:
        state.add_submission(submission(1), now=1.0)
        state.add_submission(submission(2), now=1.0)
    with sqlite3.connect(path) as db:  # as version 1 made it
        db.execute("ALTER TABLE evaluations DROP COLUMN content_hash")
        db.execute("ALTER TABLE submissions DROP COLUMN counts_from_block")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    caplog.set_level(logging.INFO, logger="quasar.validator.state")
    ValidatorState.open(path).close()
    said = [record.getMessage() for record in caplog.records if record.name == "quasar.validator.state"]
    assert said == [
        f"validator state {path}: migrated from schema version 1 to 3, its 2 submissions kept; "
        "a validator older than this one refuses the file now"
    ]
    caplog.clear()
    ValidatorState.open(path).close()
    assert not [record for record in caplog.records if record.name == "quasar.validator.state"]


@pytest.mark.parametrize("version", ["99", "three", ""])
def test_a_state_file_of_another_schema_is_refused(tmp_path, version):
    """A version that is no number (a file edited by hand) raised a bare ValueError from int()."""
    path = tmp_path / "state.sqlite3"
    with ValidatorState.open(path) as state:
        state.set_meta("schema_version", version)
    with pytest.raises(StateError, match=f"schema version {version}, this validator reads version 3"):
        ValidatorState.open(path)


def test_default_state_path_separates_networks_subnets_and_hotkeys(tmp_path):
    paths = {
        state_files.default_state_path(tmp_path, network, netuid, hotkey)
        for network in ("finney", "devchain")
        for netuid in (24, 3)
        for hotkey in HOTKEYS[:2]
    }
    assert len(paths) == 8 and all(path.parent == tmp_path for path in paths)


def test_refused_submission_is_finished_failed_at_once(state):
    assert state.add_refused_submission(submission(1, url="http://evil/x"), "fork_url: must use https", now=1.0)
    (record,) = state.needing_logit_check()
    assert record.evaluation.result.correct is False
    assert record.evaluation.result.reasons == ("fork_url: must use https",)


def test_work_items_are_checked_against_the_fork_rules():
    from quasar.api.schemas import WorkItem

    # The API's spelling of the fork and commit; every other field as the validator keeps it.
    sent = submission(1, url="https://GitHub.com/Miner/Flash-Linear-Attention.git", commit=COMMIT.upper())
    item = WorkItem(**sent.model_dump(), vram_mb=None, benchmarks=None, lease_expires_at=9.0)
    good, problem = submission_from_work(item, allow_local=False)
    assert problem is None and good == submission(1)
    _, problem = submission_from_work(item.model_copy(update={"fork_url": "file:///tmp/fork"}), allow_local=False)
    assert "local source" in problem
    _, problem = submission_from_work(item.model_copy(update={"commit_hash": "main"}), allow_local=False)
    assert "40 hexadecimal" in problem


def test_work_from_an_api_older_than_counts_from_block_is_still_taken():
    # An API not yet upgraded sends no counts_from_block: the work is taken, ordered by id as it was.
    from quasar.api.schemas import WorkBatch

    sent = submission(1, block=7).model_dump()
    del sent["counts_from_block"]
    item = {**sent, "vram_mb": None, "benchmarks": None, "lease_expires_at": 9.0}
    batch = WorkBatch.model_validate({"items": [item], "lease_seconds": 60.0})
    good, problem = submission_from_work(batch.items[0], allow_local=False)
    assert problem is None and good == submission(1, block=0)


# --- verdicts and weights ---


def record(
    submission_: Submission, result: EvaluationResult, logits: str = state_files.PASSED, reason: str = "ok"
) -> SubmissionRecord:
    evaluation = EvaluationRecord(submission_.key, state_files.FINISHED, 1, "cpu", None, result, 1.0, 2.0)
    return SubmissionRecord(submission_, evaluation, logits, reason, "unreported", None)


def test_api_report_passes_only_an_eligible_result():
    passed = api_report(record(submission(1, claimed=1000.0), GOOD))
    assert (passed.verdict, passed.correct, passed.logits_ok, passed.measured_tokens_per_sec) == (
        "passed",
        True,
        True,
        1000.0,
    )
    assert passed.benchmarks == {512: 2000.0, 1024: 1000.0}
    assert passed.reasons == ("logit check passed: ok", "cpu: not a benchmark")

    over_claimed = api_report(record(submission(2, claimed=1200.0), GOOD))
    assert over_claimed.verdict == "failed" and over_claimed.correct
    assert over_claimed.reasons[0].startswith("claim check: measured 1,000 tok/s is below 0.9")

    bad_logits = api_report(record(submission(3, claimed=1200.0), GOOD, state_files.FAILED, "cosine 0.5 < 0.99"))
    assert bad_logits.verdict == "failed" and bad_logits.logits_ok is False
    assert "logit check failed: cosine 0.5 < 0.99" in bad_logits.reasons
    assert any(reason.startswith("claim check") for reason in bad_logits.reasons)

    wrong = api_report(record(submission(4), BAD, state_files.SKIPPED, "not checked: the evaluation failed"))
    assert (wrong.verdict, wrong.correct, wrong.logits_ok, wrong.measured_tokens_per_sec) == (
        "failed",
        False,
        None,
        None,
    )
    assert wrong.reasons == ("clone failed: not found",)
    assert wrong.content_hash is None
    fingerprinted = api_report(record(submission(5, claimed=1000.0), replace(GOOD, content_hash="ef" * 32)))
    assert fingerprinted.content_hash == "ef" * 32


def test_api_report_carries_the_harness_figures_per_length():
    harness = report(verdict="pass", reasons=[], measured_tokens_per_sec=900.0)
    harness.lengths["512"].peak_vram_mb = 1536.0
    evaluated = replace(GOOD, report=harness.to_dict())
    sent = api_report(record(submission(1, claimed=1000.0), evaluated))
    assert sent.lengths == (
        {"seq_len": 512, "status": "ok", "tokens_per_sec": 4000.0, "peak_vram_mb": 1536.0, "correct": True},
        {"seq_len": 1024, "status": "oom", "tokens_per_sec": None, "peak_vram_mb": None, "correct": None},
    )
    assert ReportRequest(submission_id=1, verdict="failed", correct=False, lengths=list(sent.lengths)).lengths
    assert api_report(record(submission(2), BAD, state_files.SKIPPED, "not checked")).lengths is None


def test_reasons_are_bounded_to_what_the_api_accepts():
    reasons = bounded_reasons(["x" * 5000, "bad\x00char\r", *[f"r{i}" for i in range(40)], "  "])
    assert len(reasons) == MAX_REASONS and all(len(reason) <= MAX_REASON_LENGTH for reason in reasons)
    assert reasons[0].endswith("...") and reasons[1] == "bad char"
    assert reasons[-1] == f"... and {42 - MAX_REASONS + 1} more"


def test_a_forks_error_of_lone_surrogates_still_reaches_the_api():
    """A fork's reply may say ``"\\udcff"`` (JSON escapes any code point) and its error becomes a
    reason; the API refused such a report (422: not UTF-8) and the validator never sent it again,
    so the fork's failure went unrecorded."""
    reasons = bounded_reasons(["T=512: RuntimeError: \udcff\ud800"])
    body = json.dumps({"submission_id": 1, "verdict": "failed", "correct": False, "reasons": list(reasons)})
    assert ReportRequest.model_validate_json(body).reasons == ["T=512: RuntimeError: ??"]


def neuron(uid: int, hotkey: str) -> NeuronInfo:
    return NeuronInfo(uid, hotkey, hotkey, 0.0, False, None)


def test_plan_weights_maps_the_top_four_to_uids_and_burns_the_rest():
    graph = Metagraph(24, 100, (neuron(0, HOTKEYS[5]), neuron(3, HOTKEYS[0]), neuron(7, HOTKEYS[1])))
    results = [
        scoring_result(record(submission(1, HOTKEYS[0], claimed=900.0), GOOD)),
        scoring_result(record(submission(2, HOTKEYS[1], commit="f" * 40, claimed=500.0), GOOD)),
        scoring_result(record(submission(3, HOTKEYS[2], commit="d" * 40, claimed=990.0), GOOD)),  # deregistered
        scoring_result(record(submission(4, HOTKEYS[1], claimed=900.0), BAD, state_files.SKIPPED)),
    ]
    plan = plan_weights(results, graph, owner_uid=0, epsilon=0.01)
    assert plan.unregistered == (HOTKEYS[2],)
    assert plan.weights == {3: 0.60, 7: 0.25, 0: pytest.approx(0.15)}
    assert sum(plan.weights.values()) == pytest.approx(1.0)
    assert [p.hotkey for p in plan.ranking.placements] == [HOTKEYS[0], HOTKEYS[1]]
    table = rendered_text(weights_table(plan))
    assert short_hotkey(HOTKEYS[0]) in table and "subnet owner" in table and "0.15" in table


def test_without_an_owner_uid_the_placed_shares_are_set_alone():
    """The owner's hotkey holds no uid: places 1 and 2 (0.60 and 0.25) are set as 0.60/0.85 and
    0.25/0.85; the unassigned 0.15 is said, not set."""
    graph = Metagraph(24, 100, (neuron(3, HOTKEYS[0]), neuron(7, HOTKEYS[1])))
    results = [
        scoring_result(record(submission(1, HOTKEYS[0], claimed=900.0), GOOD)),
        scoring_result(record(submission(2, HOTKEYS[1], commit="f" * 40, claimed=500.0), GOOD)),
    ]
    plan = plan_weights(results, graph, owner_uid=None, epsilon=0.01)
    assert plan.weights == {3: pytest.approx(0.60 / 0.85), 7: pytest.approx(0.25 / 0.85)}
    assert plan.dropped == pytest.approx(0.15) and plan.owner_uid is None
    assert plan.hotkeys == {3: HOTKEYS[0], 7: HOTKEYS[1]}
    table = rendered_text(weights_table(plan))
    assert "owner's hotkey holds no uid" in table and "not set" in table and "0.7059" in table
    empty = plan_weights([], graph, owner_uid=None, epsilon=0.01)
    assert empty.weights == {} and empty.dropped == pytest.approx(1.0)
    burned = plan_weights([], graph, owner_uid=7, epsilon=0.01)
    assert burned.weights == {7: pytest.approx(1.0)} and burned.hotkeys == {7: HOTKEYS[1]} and burned.dropped == 0


def test_an_owner_placed_as_a_miner_gets_its_share_beside_the_unfilled_places():
    """docs/rules.md section 5: first, with one other miner placed, the owner's uid gets 0.60 + 0.15."""
    graph = Metagraph(24, 100, (neuron(0, HOTKEYS[5]), neuron(7, HOTKEYS[1])))
    results = [
        scoring_result(record(submission(1, HOTKEYS[5], claimed=900.0), GOOD)),
        scoring_result(record(submission(2, HOTKEYS[1], commit="f" * 40, claimed=500.0), GOOD)),
    ]
    plan = plan_weights(results, graph, owner_uid=0, epsilon=0.01)
    assert plan.weights == {0: pytest.approx(0.75), 7: 0.25}


def test_plan_weights_ranks_with_the_validators_tie_margin():
    # Scoring 0.5% above the earlier submission: tied within a 1% margin (the earlier first), not at 0.
    graph = Metagraph(24, 100, (neuron(0, HOTKEYS[5]), neuron(3, HOTKEYS[0]), neuron(7, HOTKEYS[1])))
    results = [
        scoring_result(record(submission(1, HOTKEYS[0], claimed=995.0), GOOD)),  # measured 1000
        scoring_result(record(submission(2, HOTKEYS[1], commit="f" * 40, claimed=1000.0), GOOD)),
    ]
    assert plan_weights(results, graph, owner_uid=0, epsilon=0.01).weights[3] == 0.60
    assert plan_weights(results, graph, owner_uid=0, epsilon=0.0).weights[7] == 0.60


def test_a_split_the_subnets_limits_would_change_is_refused():
    graph = Metagraph(24, 100, tuple(neuron(uid, hotkey) for uid, hotkey in enumerate(HOTKEYS)))
    results = [scoring_result(record(submission(1, HOTKEYS[1], claimed=900.0), GOOD))]
    plan = plan_weights(results, graph, owner_uid=0, epsilon=0.01)  # 0.60 to uid 1, 0.40 to uid 0
    assert weights_refusal(plan, FINNEY, len(graph.neurons), setter_uid=5) is None
    capped = replace(FINNEY, max_weight_limit=32768)
    assert "the largest weight, 0.6000, is above the subnet's max_weight_limit (32768" in weights_refusal(
        plan, capped, len(graph.neurons), setter_uid=5
    )
    assert weights_refusal(plan, replace(FINNEY, max_weight_limit=39321), 6, setter_uid=5) is None  # 0.6 exactly
    # One unit of the limit less (0.59998) and 0.6 is above it: the chain's limit, not a margin around it.
    assert "is above the subnet's max_weight_limit (39320" in weights_refusal(
        plan, replace(FINNEY, max_weight_limit=39320), 6, setter_uid=5
    )
    needs_three = replace(FINNEY, min_allowed_weights=3)
    assert "at least 3 uids (min_allowed_weights 3) and this epoch's split names 2" in weights_refusal(
        plan, needs_three, len(graph.neurons), setter_uid=5
    )
    assert weights_refusal(plan, needs_three, 2, setter_uid=5) is None  # capped by a subnet of two
    alone = plan_weights([], graph, owner_uid=5, epsilon=0.01)  # the validator is the owner: a self-weight
    assert weights_refusal(alone, capped, len(graph.neurons), setter_uid=5) is None
    assert "above the subnet's max_weight_limit" in weights_refusal(alone, capped, len(graph.neurons), setter_uid=4)


def test_the_subnets_rules_are_checked_against_the_validator_at_start():
    check = assess_subnet_rules(FINNEY, version_key=100, epoch_blocks=360, block_time_s=12.0, subnet_size=256)
    assert check.problems == ()
    assert check.notes == (
        "commit-reveal is on: weights are committed, and the chain applies them when it reveals "
        "them, 1 epoch(s) of 360 blocks later (about 72 min at 12 s a block)",
    )
    old = assess_subnet_rules(replace(FINNEY, weights_version_key=101), 100, 360, 12.0, 256)
    (problem,) = old.problems
    assert "this QUASAR's weights version key is 100, below the subnet's WeightsVersionKey 101" in problem
    assert "git pull, then ./scripts/setup_venv.sh" in problem
    capped = assess_subnet_rules(replace(FINNEY, max_weight_limit=30000), 100, 360, 12.0, 256)
    assert "caps a uid at 0.4578 of the weights, below first place's 0.60" in capped.problems[0]
    many = assess_subnet_rules(replace(FINNEY, min_allowed_weights=8), 100, 360, 12.0, 256)
    assert "needs weights on at least 8 uids" in many.problems[0]
    assert assess_subnet_rules(replace(FINNEY, min_allowed_weights=8), 100, 360, 12.0, 5).problems == ()
    fast = assess_subnet_rules(replace(FINNEY, tempo=20), 100, 360, 0.25, 256)
    assert fast.notes[0].endswith("1 epoch(s) of 20 blocks later (about 5 s at 0.25 s a block)")
    # Every 5 blocks (rate limit 5) in an epoch of 360 blocks: 72 commits an epoch, of which the
    # chain takes 10 (its cap is per epoch: every 36 blocks fits, 35 does not).
    crowded = assess_subnet_rules(replace(FINNEY, weights_rate_limit=5), 100, 5, 12.0, 256)
    assert crowded.notes[0] == (
        "committing every 5 blocks makes up to 72 commits an epoch (tempo 360), more than the "
        "chain takes from a hotkey in one (10): the rest of the epoch's are refused; EPOCH_BLOCKS "
        "of at least 36 avoids it"
    )
    assert (
        "commits an epoch"
        not in assess_subnet_rules(replace(FINNEY, weights_rate_limit=5), 100, 36, 12.0, 256).notes[0]
    )
    assert "commits an epoch" in assess_subnet_rules(replace(FINNEY, weights_rate_limit=5), 100, 35, 12.0, 256).notes[0]
    quick = assess_subnet_rules(
        replace(FINNEY, commit_reveal_enabled=False, max_weight_limit=50000, min_allowed_weights=3), 100, 5, 0.25, 256
    )
    assert quick.problems == ()
    assert quick.notes == (
        "max_weight_limit 50000 caps a uid at 0.7630 of the weights: an epoch whose split gives one uid more (the "
        "owner's burn when few miners place) is not submitted",
        "min_allowed_weights 3: an epoch whose split names fewer than 3 uids is not submitted",
        "EPOCH_BLOCKS 5 is shorter than the subnet's weights rate limit (100 blocks): weights go out every 100 "
        "blocks at most",
    )


def test_plan_weights_agrees_with_scoring_on_random_results():
    """The uid weights are the scoring module's hotkey shares, moved to uids, plus the burn."""
    rng = random.Random(7)
    for _ in range(50):
        graph = Metagraph(24, 1, tuple(neuron(uid, hotkey) for uid, hotkey in enumerate(HOTKEYS)))
        results = []
        for submission_id in range(1, rng.randint(0, 12) + 1):
            measured = rng.choice([0.0, rng.uniform(1, 1000)])
            results.append(
                scoring.Result(
                    hotkey=rng.choice(HOTKEYS[1:]),
                    submission_id=submission_id,
                    submitted_at=rng.uniform(0, 100),
                    target_sequence_length=rng.choice([1024, 300_000, 1_000_000]),
                    claimed_tokens_per_sec=rng.uniform(1, 1000),
                    measured_tokens_per_sec=measured,
                    correct=rng.random() < 0.8,
                    logits_ok=rng.choice([True, False, None]),
                )
            )
        plan = plan_weights(results, graph, owner_uid=0, epsilon=0.01)
        ranking = scoring.rank(results, epsilon=0.01)
        expected = {HOTKEYS.index(hotkey): share for hotkey, share in ranking.weights.items()}
        if ranking.unassigned:
            expected[0] = ranking.unassigned
        assert plan.weights == pytest.approx(expected)
        assert sum(plan.weights.values()) == pytest.approx(1.0)


# --- devices, wallet, registration ---


def test_evaluation_devices():
    assert evaluation_devices("cpu", 0, None) == [Device("cpu", "")]
    assert evaluation_devices("cuda", 2, None) == [Device("cuda:0", "0"), Device("cuda:1", "1")]
    assert evaluation_devices("cuda", 2, "3,5") == [Device("cuda:0", "3"), Device("cuda:1", "5")]
    assert evaluation_devices("cuda:1", 2, "3,5") == [Device("cuda:1", "5")]
    assert [device.torch_device for device in evaluation_devices("cuda", 2, None)] == ["cuda", "cuda"]
    with pytest.raises(ValidatorSetupError, match="torch sees no CUDA device.*DEVICE=cpu"):
        evaluation_devices("cuda", 0, None)
    with pytest.raises(ValidatorSetupError, match="CUDA_VISIBLE_DEVICES='' lists 0 GPU"):
        evaluation_devices("cuda", 0, "")
    with pytest.raises(ValidatorSetupError, match="CUDA_VISIBLE_DEVICES='3,5' lists 2 GPU.*uses 1"):
        evaluation_devices("cuda", 1, "3,5")  # a listed id that does not exist (tests/test_gpu_numbering.py)
    with pytest.raises(ValidatorSetupError, match=r"DEVICE is cuda:2 but torch sees 2 CUDA device\(s\)"):
        evaluation_devices("cuda:2", 2, None)


def test_cpu_is_a_warning_off_the_dev_chain():
    assert device_warnings("devchain", "cpu") == []
    assert device_warnings("finney", "cuda") == []
    (warning,) = device_warnings("finney", "cpu")
    assert "not benchmarks" in warning and "finney" in warning


def wallet_settings(tmp_path, name="validator"):
    return resolve(
        {"wallet_path": str(tmp_path), "wallet_name": name, "wallet_hotkey": "default"}, environ={}, dotenv_path=None
    )


def test_open_wallet_names_the_missing_file(tmp_path):
    with pytest.raises(WalletError, match=f"hotkey file {tmp_path}/validator/hotkeys/default does not exist"):
        open_wallet(wallet_settings(tmp_path), "validator")
    wallet = bt.Wallet(name="validator", hotkey="default", path=str(tmp_path))
    wallet.create_new_hotkey(use_password=False, overwrite=True, suppress=True)
    # The hotkey alone is enough: the coldkey need not be on a validator's machine.
    assert open_wallet(wallet_settings(tmp_path), "validator").hotkey.ss58_address == wallet.hotkey.ss58_address
    (tmp_path / "validator" / "hotkeys" / "default").write_text("not a key")
    with pytest.raises(WalletError, match="cannot read hotkey file"):
        open_wallet(wallet_settings(tmp_path), "validator")


def test_open_wallet_expands_the_home_folder_in_every_role(tmp_path, monkeypatch):
    """WALLET_PATH=~/wallets means the same folder for the miner, its inference server and the validator."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("quasar_miner", "quasar_validator"):
        bt.Wallet(name=name, hotkey="default", path=str(tmp_path / "wallets")).create_new_hotkey(
            use_password=False, overwrite=True, suppress=True
        )
    settings = resolve({"wallet_path": "~/wallets"}, environ={}, dotenv_path=None)
    for role in ("miner", "validator"):
        wallet = open_wallet(settings, role)
        assert Path(wallet.hotkey_file.path).is_relative_to(tmp_path / "wallets"), wallet.hotkey_file.path


def test_registration_is_required_a_permit_is_warned_about(tmp_path, caplog):
    """Each cure is a command of the chain in use: on the dev chain, which btcli does not know
    (`unknown network 'devchain'`) and which stakes only at registration, the validator registers
    with stake and a permit, and one registered without them registers again so."""
    chain = DevChain(tmp_path / "chain.sqlite3", netuid=24)
    settings = resolve(
        {"network": "devchain", "devchain_path": str(chain.path), "wallet_name": "v"}, environ={}, dotenv_path=None
    )
    devchain = f"quasar devchain --path {chain.path}"
    with pytest.raises(ValidatorSetupError) as unregistered:
        check_registration(chain, HOTKEYS[0], settings)
    assert str(unregistered.value) == (
        f"hotkey {HOTKEYS[0]} is not registered on subnet 24 of devchain: register it first "
        f"({devchain} register --hotkey {HOTKEYS[0]} --coldkey COLDKEY --stake STAKE --validator)"
    )
    chain.register(HOTKEYS[0], HOTKEYS[1])
    check_registration(chain, HOTKEYS[0], settings)
    assert "has no validator permit" in caplog.text and "btcli" not in caplog.text
    assert (
        f"({devchain} deregister --hotkey {HOTKEYS[0]}, then {devchain} register --hotkey {HOTKEYS[0]} "
        f"--coldkey {HOTKEYS[1]} --stake STAKE --validator: the dev chain stakes only at registration)"
    ) in caplog.text
    chain.deregister(HOTKEYS[0])
    caplog.clear()
    finney = resolve({"wallet_name": "v"}, environ={}, dotenv_path=None)
    with pytest.raises(
        ValidatorSetupError,
        match="register it first \\(btcli subnets register --netuid 24 --wallet v "
        "--wallet-hotkey default --network finney\\)",
    ):
        check_registration(chain, HOTKEYS[0], finney)
    chain.register(HOTKEYS[0], HOTKEYS[1])
    check_registration(chain, HOTKEYS[0], finney)
    assert "has no validator permit" in caplog.text
    assert (
        "btcli stake add --netuid 24 --wallet v --wallet-hotkey default --amount-tao AMOUNT --network finney"
    ) in caplog.text


# --- what workers write ---


def report(**changes) -> EvaluationReport:
    lengths = {
        "512": LengthResult(seq_len=512, status="ok", tokens_per_sec=4000.0, correct=True),
        "1024": LengthResult(seq_len=1024, status="oom", error="OOM at T=1024, peak 80,000 MiB"),
    }
    base = EvaluationReport(
        verdict="fail",
        reasons=["OOM at T=1024, peak 80,000 MiB", "the target length T=1024 was not measured"],
        repo="/fork",
        target_seq_len=1024,
        seq_lens=[512, 1024],
        device="cuda",
        device_name="H100",
        import_check=ImportCheck(ok=True, profile="core"),
        lengths=lengths,
    )
    return replace(base, **changes)


def test_a_report_becomes_a_result_and_a_broken_sandbox_an_error():
    outcome = outcome_from_worker(json.loads(json.dumps({"outcome": "evaluated", "report": report().to_dict()})))
    assert outcome.error is None and outcome.result.correct is False
    assert outcome.result.benchmarks == {512: 4000.0} and outcome.result.measured_tokens_per_sec is None
    assert outcome.result.reasons[0] == "OOM at T=1024, peak 80,000 MiB"
    assert outcome.result.report["device_name"] == "H100"

    passed = result_from_report(report(verdict="pass", reasons=[], measured_tokens_per_sec=900.0))
    assert passed.result.correct and passed.result.measured_tokens_per_sec == 900.0
    # The kernel content hash travels with the report; anything but 64 lowercase hex digits is dropped.
    for written, kept in (("ab" * 32, "ab" * 32), ("AB" * 32, None), ("ab" * 31, None), (7, None)):
        hashed = outcome_from_worker({"outcome": "evaluated", "report": report().to_dict(), "content_hash": written})
        assert hashed.result.content_hash == kept

    broken = result_from_report(report(reasons=["sandbox unavailable: unshare: operation not permitted"]))
    assert broken.result is None and "unshare" in broken.error


def test_a_length_this_machine_could_not_verify_is_the_validators_error_and_a_fork_cannot_claim_it():
    """The float32 reference runs in the validator's own process: a length whose reference its GPU
    could not hold was failed as the fork's and reported against the miner (shown on an H100 by
    tests/test_evaluate_reference_memory_gpu.py). A fork's own message saying the same, quoted
    after its failed stage, stays the fork's failure."""
    here = "T=65536: the float32 reference does not fit in the memory of cuda here, so this length cannot be verified"
    mine = result_from_report(report(reasons=[here]))
    assert mine.result is None and mine.error == here
    quoted = f"T=65536: warm-up at T=65536 failed: {here}"
    forks = result_from_report(report(reasons=[quoted]))
    assert forks.error is None and forks.result.reasons == (quoted,)


def test_worker_outcomes_for_clone_failures_refusals_and_garbage():
    clone = outcome_from_worker({"outcome": "clone_failed", "error": "commit abc not found in https://github.com/a/b"})
    assert clone.result.correct is False and clone.result.reasons == (
        "clone failed: commit abc not found in https://github.com/a/b",
    )
    unreachable = outcome_from_worker({"outcome": "clone_unavailable", "error": "git fetch could not reach x"})
    assert unreachable.result is None and unreachable.error == "the fork could not be fetched on this host: " + (
        "git fetch could not reach x"
    )
    refused = outcome_from_worker(
        {"outcome": "refused", "error": "sequence length 100000000: expected 64 to 8000000", "content_hash": "cd" * 32}
    )
    assert refused.result.reasons[0].startswith("cannot evaluate: sequence length 100000000")
    not_here = outcome_from_worker({"outcome": "not_here", "error": "sequence length 100000: CPU runs are limited"})
    assert not_here.result is None and not_here.error.endswith("sequence length 100000: CPU runs are limited")
    assert refused.result.content_hash == "cd" * 32 and clone.result.content_hash is None
    for garbage in (
        [],
        {"outcome": "evaluated", "report": "x"},
        {"outcome": "weird"},
        {"outcome": "evaluated", "report": {"verdict": "pass"}},
    ):
        outcome = outcome_from_worker(garbage)
        assert outcome.result is None and outcome.error


def test_a_worker_that_cannot_reach_github_is_this_validators_error_not_the_forks_failure(tmp_path, monkeypatch):
    """GitHub answering 503 (or the network to it failing) was recorded as the fork's 'clone
    failed' and reported: the miner lost its submission for this validator's network."""
    ca, certificate, key = make_github_certificate(tmp_path / "certificates")
    evaluator = SubprocessEvaluator(tmp_path / "work", FAST_CPU, allow_local=False)
    key_of = EvaluationKey("https://github.com/alice/fork", "ab" * 20, 64)
    for mode, fault_of_the_fork in ((503, False), (404, True)):
        with GitHubProxy(mode, certificate, key) as proxy:
            monkeypatch.setenv("https_proxy", proxy.url)  # the worker's git inherits it, as an operator's
            monkeypatch.setenv("GIT_SSL_CAINFO", str(ca))
            running = evaluator.start(key_of, Device("cpu", ""))
            deadline = time.monotonic() + 60
            while (outcome := running.poll()) is None:
                assert time.monotonic() < deadline, "the worker did not finish"
                time.sleep(0.05)
        if fault_of_the_fork:
            assert outcome.result is not None and outcome.result.reasons[0].startswith("clone failed: repository")
        else:
            assert outcome.result is None, outcome.result
            assert "could not be fetched on this host" in outcome.error and "returned error: 503" in outcome.error


def test_a_worker_killed_past_its_deadline_leaves_no_clone_in_the_fork_cache(tmp_path):
    """A worker removes its clone as it ends; one killed at its deadline (or by the OOM killer)
    left the checkout, an interrupted clone's partial directory and its lock file for good."""
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "kernel.py").write_text("x = 1\n")
    commit = commit_all(fork, "fork")
    cache = tmp_path / "work" / "forks"
    checkout = forks.clone_at_commit(str(fork), commit, cache, allow_local=True).path
    (cache / (checkout.name + ".partial-abc")).mkdir()
    (cache / (checkout.name + ".lock")).touch()
    (fork / "kernel.py").write_text("x = 2\n")
    other = forks.clone_at_commit(str(fork), commit_all(fork, "another commit"), cache, allow_local=True).path
    worker = subprocess.Popen(["sleep", "60"], start_new_session=True)
    running = WorkerEvaluation(
        EvaluationKey(str(fork), commit, 64),
        Device("cpu", ""),
        worker,
        tmp_path / "job.json",
        tmp_path / "result.json",
        deadline=time.monotonic() - 1,
        checkout=forks.clone_dir_for(cache, str(fork), commit, allow_local=True),
    )
    assert running.poll() is None  # past its deadline: killed
    worker.wait(10)
    outcome = running.poll()
    assert outcome is not None and "ran past its limit" in outcome.error
    assert sorted(path.name for path in cache.iterdir()) == [other.name], "the killed worker's clone is left"


def test_a_validator_killed_outright_leaves_no_clone_past_its_restart(tmp_path):
    """Its workers die with it (their parent-death signal) before removing their clones, and no
    worker's end is ever seen to remove them: each kill left a fork's checkout in the cache for good."""
    evaluator = SubprocessEvaluator(tmp_path / "work", EvaluationOptions(), allow_local=True)
    evaluator.discard_leftover_clones()  # nothing there yet
    for checkout in ("ab" * 20, "cd" * 20 + ".partial-x1"):
        (evaluator.cache_dir / checkout / "fla").mkdir(parents=True)
    (evaluator.cache_dir / ("cd" * 20 + ".lock")).touch()
    evaluator.discard_leftover_clones()
    assert not evaluator.cache_dir.exists()


def test_the_lock_files_an_earlier_version_kept_are_not_said_to_be_clones_of_unended_evaluations(tmp_path, caplog):
    """5eac284 kept a key's lock file beside its clone after the evaluation ended: upgraded, the
    validator said 'removing 2 clones left ... by evaluations that did not end' of two lock files."""
    evaluator = SubprocessEvaluator(tmp_path / "work", EvaluationOptions(), allow_local=True)
    evaluator.cache_dir.mkdir(parents=True)
    for key in ("ab" * 20, "cd" * 20):
        (evaluator.cache_dir / (key + ".lock")).write_text("")
    caplog.set_level(logging.INFO, logger="quasar.validator.evaluator")
    evaluator.discard_leftover_clones()
    assert [record.getMessage() for record in caplog.records] == [
        f"removing what {evaluator.cache_dir} holds, left by an earlier run: "
        "0 clone(s) of evaluations that did not end, 2 lock file(s)"
    ]
    assert not evaluator.cache_dir.exists()


def test_evaluation_options_survive_the_trip_to_the_worker():
    options = EvaluationOptions(
        seq_lens=(512, 2048),
        device="cuda",
        timeout_s=10.0,
        warmup_runs=1,
        policy=SandboxPolicy(extra_readonly_paths=("/opt/x",), pytorch_cuda_alloc_conf=""),
    )
    assert options_from_json(json.loads(json.dumps(options_to_json(options)))) == options


def test_a_target_the_evaluation_refuses_starts_no_sandbox_and_no_output_area_before_the_clone():
    """The API takes targets up to 10^8; the harness refuses those past MAX_SEQ_LEN, but the
    worker's head start made the sandbox's output area for them first, 2 KiB a token in the worker
    (outside the sandbox's memory limit), and on a GPU filled it at once: 32 GiB just past the
    limit (seen growing past 3 GiB in 4 s), 205 GB at 10^8, any miner's submission a host's OOM."""
    from quasar.evaluate.options import MAX_SEQ_LEN

    def head_start(target: int) -> HeadStart:
        return HeadStart({"target_sequence_length": target, "options": options_to_json(FAST_CPU)})

    refused = head_start(MAX_SEQ_LEN + 64)
    try:
        assert refused.sandbox is None and refused.take() == (None, None)
    finally:
        refused.close()
    accepted = head_start(64)  # a target the evaluation takes still gets its head start
    try:
        assert accepted.sandbox is not None and accepted.sandbox.area is not None
        assert accepted.sandbox.area.size == 2048 * (64 + sum(FAST_CPU.seq_lens))
    finally:
        accepted.close()


def test_each_epochs_weights_log_stays_as_long_as_miners_leave_the_subnet(tmp_path, caplog):
    """A validator ranks every hotkey it measured, whatever its round, and leaves out those no
    longer registered; naming all of them in each epoch's log made that line longer by every miner
    that ever left (37 kB after 30 days of 25 a day). It names the ones gone since the last weights,
    at most MAX_NAMED_LEFT_OUT, and counts the rest: ten simulated days log lines no longer than
    one, but for the count's digits."""
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=1e6)
    validator, miner = make_wallet(tmp_path, "validator"), make_wallet(tmp_path, "miner")
    chain.register_wallet(validator, stake=1e4, validator_permit=True)
    chain.register_wallet(miner)
    settings = resolve(
        {"network": "local", "netuid": "24", "device": "cpu", "epoch_blocks": "360", "eval_seq_lens": ""},
        environ={},
        dotenv_path=None,
    )
    caplog.set_level("INFO", logger="quasar.validator.weight_setting")

    def result(hotkey: str, n: int) -> scoring.Result:
        return scoring.Result(hotkey, n, float(n), 4096, 1000.0, 1000.0, correct=True, logits_ok=True)

    gone: list[str] = []
    longest = []
    with ValidatorState.open(tmp_path / "state.sqlite3") as state:
        setter = WeightSetter(settings, chain, validator, state)
        for day in range(10):
            gone += [Keypair.create_from_seed(bytes([day, i]) + bytes(30)).ss58_address for i in range(25)]
            results = [result(miner.hotkey.ss58_address, 0)] + [result(h, n + 1) for n, h in enumerate(gone)]
            caplog.clear()
            for _ in range(20):  # an epoch every 72 minutes
                block = chain.advance(settings.epoch_blocks + 1)
                assert setter.due(block) and setter.set_weights(block, results)
            lines = [record.getMessage() for record in caplog.records]
            longest.append(max(len(line) for line in lines))
            left_out = [line for line in lines if "no longer registered" in line]
            assert len(left_out) == 1 and f"{len(gone)} in all" in left_out[0], left_out
            named = {hotkey for hotkey in gone if hotkey in left_out[0]}
            assert len(named) == MAX_NAMED_LEFT_OUT and named <= set(gone[-25:]), left_out  # of the day's
    assert longest[-1] <= longest[0] + 5, longest  # the count's digits alone


@pytest.mark.parametrize(
    ("epoch_blocks", "factor", "epochs"),
    [
        (360, 1000, 10),  # the owner's lowest activity cutoff, one tempo: 360 blocks
        (7200, FINNEY.activity_cutoff_factor, 25),  # an operator's weights once a day, the default cutoff
    ],
)
@pytest.mark.parametrize("commit_reveal", [True, False])
def test_the_validator_stays_active_in_every_epoch_whatever_the_cutoff_and_epoch_blocks(
    tmp_path, caplog, epoch_blocks, factor, epochs, commit_reveal
):
    """The chain's epoch counts a validator only while its LastUpdate (its last weights, or commit:
    never the reveal) is at most activity_cutoff blocks old (run_epoch's inactive mask); the owner
    may lower the cutoff to one tempo. A validator checking every EPOCH_BLOCKS from its last
    setting, its steps 7 blocks apart (a step that reports for a minute), set weights every 364
    blocks against a cutoff of 360 and was left out of an epoch whenever one fell in the 3 blocks
    between (at 720, first set at 357); one that set EPOCH_BLOCKS 7200 was left out of 6 or 7 of
    the 20 epochs of each day. It sets weights often enough to stay counted."""
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=1e6)
    chain.set_hyperparameters(commit_reveal_enabled=commit_reveal)
    validator, miner = make_wallet(tmp_path, "validator"), make_wallet(tmp_path, "miner")
    chain.register_wallet(validator, stake=1e4, validator_permit=True)
    chain.register_wallet(miner)
    chain.advance(357)  # past the weights rate limit counted from the registration
    rules = chain.set_hyperparameters(activity_cutoff_factor=factor)
    settings = resolve(
        {"network": "local", "netuid": "24", "device": "cpu", "epoch_blocks": str(epoch_blocks), "eval_seq_lens": ""},
        environ={},
        dotenv_path=None,
    )
    caplog.set_level("INFO", logger="quasar.validator.weight_setting")
    results = [scoring.Result(miner.hotkey.ss58_address, 0, 0.0, 4096, 1000.0, 1000.0, correct=True, logits_ok=True)]
    hotkey = validator.hotkey.ss58_address
    updates = [chain.last_update(hotkey)]
    with ValidatorState.open(tmp_path / "state.sqlite3") as state:
        setter = WeightSetter(settings, chain, validator, state)
        block = chain.current_block()
        while block < epochs * rules.tempo:
            if setter.due(block):
                setter.set_weights(block, results)
                if chain.last_update(hotkey) != updates[-1]:
                    updates.append(chain.last_update(hotkey))
            block = chain.advance(7)
    # An epoch at block e meets the LastUpdate set before e (its block's extrinsics come after it).
    left_out = [
        (e, last)
        for e in range(rules.tempo, block, rules.tempo)
        if (last := max(u for u in updates if u < e)) + rules.activity_cutoff < e
    ]
    print(f"activity_cutoff {rules.activity_cutoff}; LastUpdate changed at blocks {updates}")
    print("epochs leaving the validator out (epoch block, LastUpdate):", left_out)
    assert left_out == []
    if epoch_blocks > rules.activity_cutoff:
        assert "the subnet's activity_cutoff is" in caplog.text


@contextmanager
def cutoff_setter(tmp_path: Path) -> Iterator[tuple[DevChain, WeightSetter]]:
    """A weight setter of EPOCH_BLOCKS 360 on a dev chain whose activity cutoff is one tempo (360
    blocks), after its first look: weights every 324 blocks, nine tenths of the cutoff."""
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=1e6)
    validator = make_wallet(tmp_path, "validator")
    chain.register_wallet(validator, stake=1e4, validator_permit=True)
    settings = resolve(
        {"network": "local", "netuid": "24", "device": "cpu", "epoch_blocks": "360", "eval_seq_lens": ""},
        environ={},
        dotenv_path=None,
    )
    with ValidatorState.open(tmp_path / "state.sqlite3") as state:
        setter = WeightSetter(settings, chain, validator, state)
        chain.set_hyperparameters(activity_cutoff_factor=1000)
        assert setter.due(chain.current_block()) and setter.interval == 324
        yield chain, setter


def test_a_chain_that_cannot_say_its_activity_cutoff_leaves_the_interval_as_it_was(tmp_path, caplog):
    with cutoff_setter(tmp_path) as (chain, setter):
        block = chain.advance(10)
        with sqlite3.connect(chain.path) as connection:
            connection.execute("DELETE FROM meta WHERE key = 'hyperparameters'")
        assert setter.due(block) and setter.interval == 324
    assert (
        "cannot read the subnet's activity cutoff (the dev chain file holds no hyperparameters); weights stay "
        "every 324 blocks" in caplog.text
    )


def test_a_chain_out_of_reach_for_its_activity_cutoff_is_said_once_then_once_when_it_answers(tmp_path, caplog):
    """The cutoff is read every RULES_READ_BLOCKS (2 minutes on finney). With the chain's node out
    of reach, each read logged a WARNING naming its block, 720 lines a day beside the chain's own
    (said once, then every REPEAT_EVERY_S: quasar.log.Repeats). Said once, and once when it reads."""
    caplog.set_level(logging.INFO, logger="quasar.validator.weight_setting")
    with cutoff_setter(tmp_path) as (chain, setter):
        reads = [chain.current_block() + RULES_READ_BLOCKS * n for n in range(1, 6)]
        with sqlite3.connect(chain.path) as connection:
            (stored,) = connection.execute("SELECT value FROM meta WHERE key = 'hyperparameters'").fetchone()
            connection.execute("DELETE FROM meta WHERE key = 'hyperparameters'")
        for block in reads[:3]:  # within REPEAT_EVERY_S of the monotonic clock
            setter.due(block)
        with sqlite3.connect(chain.path) as connection:
            connection.execute("INSERT INTO meta (key, value) VALUES ('hyperparameters', ?)", (stored,))
        for block in reads[3:]:
            setter.due(block)
    said = [record for record in caplog.records if "activity cutoff" in record.getMessage()]
    assert [(record.levelno, record.getMessage()) for record in said] == [
        (
            logging.WARNING,
            "cannot read the subnet's activity cutoff (the dev chain file holds no hyperparameters); weights stay "
            "every 324 blocks",
        ),
        (logging.INFO, "the subnet's activity cutoff reads again: 360 blocks"),
    ]


@pytest.mark.parametrize(("api_offset", "waits"), [("-1.5", True), ("-0.5", False), ("+4.5", False), ("+5.5", True)])
def test_a_validators_logit_checks_leave_the_miners_half_of_the_clock_window(
    chain, wallets, tmp_path, api_offset, waits
):
    """A challenge is refused when signed over 2 s ahead of the miner's clock. A validator 1.8 s
    ahead of the API checked logits (within 2 s), and an honest miner 0.7 s behind the API (within
    what its own start accepts) refused the challenge, signed 2.5 s ahead of its clock, and failed
    for good. The validator's checks wait unless its clock is within half the window of the API's:
    1 s ahead, 5 s behind. Behind, they had allowed 9 s, and a miner 2 s ahead of the API (its start
    accepted 9) refused a challenge signed 11 s behind its clock (over the 10 s accepted); a miner
    within the other half never refuses it."""
    skewed = {"LD_PRELOAD": libfaketime(), "FAKETIME": api_offset, "DONT_FAKE_MONOTONIC": "1"}
    api_hotkey = wallets["api"].hotkey.ss58_address
    process, url = start_api_process(
        tmp_path, f"sqlite:///{tmp_path}/api.sqlite3", chain.path, api_hotkey, settings=skewed
    )
    try:
        with ApiClient(url, wallets["v1"], api_hotkey=api_hotkey) as api:
            said = why_logit_checks_wait(api)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    assert (said is not None) == waits, said
    if waits:
        assert "timedatectl set-ntp true" in said and "the API's" in said, said
