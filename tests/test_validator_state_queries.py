"""The validator's state queries (quasar/validator/state.py): what to evaluate next, what needs a
logit check, what to report, how many are open, and which harness reports are dropped, each one
SQL statement, against a slow reference that reads every submission with its evaluation and
filters in Python, after random sequences of what the validator's loop does to its state file."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

from bittensor.sp_core import Keypair

from quasar.validator.records import EvaluationResult, Submission
from quasar.validator.state import ValidatorState
from quasar.validator.state_files import (
    ABANDONED,
    FAILED,
    FINISHED,
    PASSED,
    PENDING,
    REFUSED,
    REPORTED,
    SKIPPED,
    UNCHECKED,
    UNREPORTED,
)

HOTKEYS = [Keypair.create_from_mnemonic(Keypair.generate_mnemonic()).ss58_address for _ in range(3)]
RESULT = EvaluationResult(correct=True, measured_tokens_per_sec=1000.0, benchmarks={512: 2000.0})


def random_submission(submission_id: int, rng: random.Random) -> Submission:
    """A submission of one of a few keys (fork, commit, length): several share an evaluation."""
    values = (
        submission_id,
        rng.choice(HOTKEYS),
        rng.choice(["https://github.com/a/fla", "https://github.com/b/fla"]),
        f"{rng.randrange(3):040x}",
        rng.choice([512, 1024]),
        900.0,
        float(submission_id),
        0,
        0,
    )
    return Submission(**dict(zip(Submission.model_fields, values, strict=True)))


def random_history(state: ValidatorState, rng: random.Random, check: Callable[[float], None]) -> None:
    """Fetches, refusals, imports, evaluations started, finished, failed and cancelled, logit checks
    and reports, in a random order at increasing times; ``check(now)`` every few steps."""
    ids = rng.sample(range(1, 200), 40)  # fetched in any order of their ids
    now = 0.0
    for step in range(120):
        now += 1.0
        if step % 6 == 5:
            check(now)
        action = rng.random()
        pending = state.pending_evaluations()
        in_progress = [r.evaluation.key for r in state.submissions("e.status = 'in_progress'")]
        if action < 0.35 and ids:
            submission = random_submission(ids.pop(), rng)
            kind = rng.random()
            if kind < 0.1:
                state.add_refused_submission(submission, "breaks the fork rules", now)
            elif kind < 0.2:
                state.import_result(submission, RESULT, rng.choice([PASSED, FAILED, SKIPPED]), "imported", now)
            else:
                state.add_submission(submission, now)
        elif action < 0.55 and pending:
            state.start_evaluation(rng.choice(pending), "cpu", now)
        elif action < 0.75 and in_progress:
            key = rng.choice(in_progress)
            outcome = rng.random()
            if outcome < 0.6:
                state.finish_evaluation(key, replace(RESULT, report={"n": step}), now)
            elif outcome < 0.85:
                state.fail_attempt(key, "worker died", now, max_attempts=2)
            else:
                state.cancel_evaluation(key)
        elif action < 0.8:
            unchecked = state.submissions("e.status = ? AND s.logits = ?", (FINISHED, UNCHECKED))
            if unchecked:
                state.record_logits(
                    rng.choice(unchecked).submission.submission_id, rng.choice([PASSED, FAILED]), "", now
                )
        else:
            checked = [r for r in state.submissions() if r.logits != UNCHECKED and r.report_state == UNREPORTED]
            if checked:
                state.record_report(
                    rng.choice(checked).submission.submission_id, rng.choice([REPORTED, REFUSED]), "", now
                )


def check_queries(state: ValidatorState, rng: random.Random, now: float, seed: int) -> None:
    """Each query against its filter of every row; then a random share of the reports dropped."""
    every = state.submissions()
    first: dict = {}
    for record in every:  # by id
        if record.evaluation.status == PENDING:
            first.setdefault(record.evaluation.key, record.submission.submission_id)
    assert state.pending_evaluations() == sorted(first, key=first.__getitem__), seed
    assert state.needing_logit_check() == [
        r for r in every if r.evaluation.status == FINISHED and r.logits == UNCHECKED
    ], seed
    assert state.ready_to_report() == [
        r for r in every if r.evaluation.status == FINISHED and r.logits != UNCHECKED and r.report_state == UNREPORTED
    ], seed
    assert state.open_submissions() == sum(
        1 for r in every if r.evaluation.status != ABANDONED and r.report_state == UNREPORTED
    ), seed

    cutoff = rng.uniform(0.0, now)
    waiting = {r.evaluation.key for r in every if r.report_state == UNREPORTED}
    dropped = {
        r.evaluation.key
        for r in every
        if r.evaluation.status == FINISHED
        and r.evaluation.result is not None
        and r.evaluation.result.report is not None
        and r.evaluation.finished_at is not None
        and r.evaluation.finished_at < cutoff
        and r.evaluation.key not in waiting
    }
    assert state.forget_reports(finished_before=cutoff) == len(dropped), seed
    after = {r.evaluation.key: r.evaluation.result for r in state.submissions()}
    for record in every:
        result = record.evaluation.result
        if result is not None:
            kept = None if record.evaluation.key in dropped else result.report
            assert after[record.evaluation.key] == replace(result, report=kept), seed


def test_the_state_queries_match_a_filter_of_every_row_after_random_histories(tmp_path):
    for trial in range(4):
        seed = random.randrange(2**32)
        rng = random.Random(seed)
        with ValidatorState.open(tmp_path / f"state{trial}.sqlite3") as state:

            def check(now: float, state: ValidatorState = state, rng: random.Random = rng, seed: int = seed) -> None:
                check_queries(state, rng, now, seed)

            random_history(state, rng, check)


def test_a_steps_queries_cost_the_same_after_weeks_of_finished_work(tmp_path):
    """The queries each step of the loop runs (what to evaluate, check and report, how many are
    open) read the open rows by an index, not every evaluation and submission ever fetched: after
    eight simulated days of finished, checked and reported work they cost what they cost after one
    (counted in SQLite's virtual machine instructions, which do not depend on the machine's load)."""
    per_day = 400
    with ValidatorState.open(tmp_path / "state.sqlite3") as state:
        instructions = [0]

        def count() -> int:
            instructions[0] += 1
            return 0

        def step_cost(now: float) -> int:
            state._connection.set_progress_handler(count, 10)
            instructions[0] = 0
            state.pending_evaluations(now)
            state.needing_logit_check()
            state.ready_to_report()
            state.open_submissions()
            state._connection.set_progress_handler(None, 0)
            return instructions[0]

        costs = []
        for day in range(8):
            now = day * 86400.0
            with state._write():  # a day's work in one transaction: the test's speed, not the rule's
                for n in range(day * per_day, (day + 1) * per_day):
                    values = (n + 1, HOTKEYS[n % 3], "https://github.com/a/fla", f"{n:040x}", 512, 900.0, now, day, 0)
                    submission = Submission(**dict(zip(Submission.model_fields, values, strict=True)))
                    state.add_submission(submission, now)
                    state.start_evaluation(submission.key, "cuda:0", now)
                    state.finish_evaluation(submission.key, RESULT, now)
                    state.record_logits(submission.submission_id, PASSED, "", now)
                    state.record_report(submission.submission_id, REPORTED, "", now)
            costs.append(step_cost(now))
        assert state.open_submissions() == 0
    assert costs[-1] <= 1.5 * costs[0] + 50, costs
