"""The submission API's validators' side: the work schedule (quasar/scheduling.py) at the work
endpoint, leases, supersession, and the reports validators send back."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import bindparam, exists, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from quasar import consensus, scheduling, scoring
from quasar.api import rules, schemas
from quasar.api.db import EvaluationLease, EvaluationReport, PreparedStatement, Submission
from quasar.api.errors import ApiError
from quasar.api.judging import Standings, consensus_reports
from quasar.api.rowfields import evaluated_submission
from quasar.api.servicecore import Authenticated, benchmarks_from_json, benchmarks_to_json
from quasar.log import Tally

logger = logging.getLogger(__name__)

# A validator that fetched a submission this many times without reporting is not handed it again
# (a submission that crashes the validator must not be re-fetched forever).
MAX_FETCHES_PER_VALIDATOR = 3

# A hotkey's ready submissions of the scheduled rounds, each with the validators that reported on
# it (a row per report; one with none has NULL): what a newer one may supersede (quasar/scheduling.py).
_SUBMISSIONS, _REPORTS = Submission.__table__, EvaluationReport.__table__
_HOTKEY_READY_WHERE = (
    _SUBMISSIONS.c.hotkey == bindparam("hotkey"),
    _SUBMISSIONS.c.state == "ready",
    _SUBMISSIONS.c.round_id >= bindparam("first_round"),
)
_HOTKEY_READY = PreparedStatement(
    select(
        _SUBMISSIONS.c.id,
        _SUBMISSIONS.c.ready_at,
        _SUBMISSIONS.c.target_sequence_length,
        _SUBMISSIONS.c.claimed_tokens_per_sec,
        _REPORTS.c.validator_hotkey,
    )
    .select_from(_SUBMISSIONS.outerjoin(_REPORTS, _REPORTS.c.submission_id == _SUBMISSIONS.c.id))
    .where(*_HOTKEY_READY_WHERE)
)
_LOCK_HOTKEY_READY = PreparedStatement(
    select(_SUBMISSIONS.c.id).where(*_HOTKEY_READY_WHERE).order_by(_SUBMISSIONS.c.id).with_for_update()
)
_SUPERSEDE = PreparedStatement(
    update(_SUBMISSIONS)
    .where(_SUBMISSIONS.c.id == bindparam("old_id"), _SUBMISSIONS.c.state == "ready")
    .values(state="superseded", superseded_by=bindparam("new_id"))
)


def supersede_older(
    session: Session, dialect: str, hotkey: str, round_id: int, electorate: consensus.Electorate
) -> None:
    """Supersede ``hotkey``'s older ready submissions that no validator of ``electorate`` reported on
    (a report that counts for nothing completes no consensus), one of its submissions having just
    become ready in round ``round_id`` (the rule of quasar/scheduling.py). On PostgreSQL their rows
    are locked first and then read afresh: a report being stored meanwhile (it locks its
    submission's row) is then seen, and keeps its submission."""
    params = {"hotkey": hotkey, "first_round": scheduling.first_scheduled_round(round_id)}
    connection = session.connection()
    if dialect == "postgresql":
        _LOCK_HOTKEY_READY.run(connection, params)
    rows = _HOTKEY_READY.run(connection, params).fetchall()
    reported = {row[0] for row in rows if row[4] is not None and electorate.weight(row[4]) > 0}
    queued = {row[0]: scheduling.Queued(row[0], hotkey, row[1], row[2], row[3], row[0] in reported) for row in rows}
    for old, new in scheduling.superseded(queued.values()).items():
        _SUPERSEDE.run(connection, {"old_id": old, "new_id": new})


class WorkQueue(Standings):
    """Work for validators, and their reports."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Counted every REPEAT_EVERY_S, each at DEBUG: every GPU of every validator adds about 80 an hour.
        self.reports_said = Tally(logger, "reports", clock=self.clock)

    def standing(self, round_id: int) -> scheduling.Standing:
        """Round ``round_id`` as the schedule's rule 2 reads it now: its fourth place's score and
        the hotkeys found copying in it (quasar/scheduling.py)."""
        board, copiers = self.judged_board(round_id)
        return scheduling.Standing(
            scheduling.fourth_place(entry.weighted_score for entry in board.entries), copiers, self.config.tie_epsilon
        )

    def fetch_work(self, validator: str, limit: int, caller: Authenticated | None = None) -> schemas.WorkBatch:
        """Up to ``limit`` submissions for this validator, by the schedule's rules (quasar/scheduling.py),
        each leased to it for ``evaluation_lease_s``: ready submissions of the scheduled rounds (a
        superseded one is not ready) of hotkeys registered now, that it has neither reported on nor
        holds."""
        now = self.clock()
        lease_s = self.config.evaluation_lease_s
        round_id = rules.round_of_block(self.current_block(), self.config.round_blocks).round_id
        standing = self.standing(round_id)
        electorate = self.electorate()
        # A hotkey pruned from the subnet can be given no weight: its evaluation would spend a GPU for nothing.
        registered = self.registered_hotkeys()

        def work(session: Session) -> list[schemas.WorkItem]:
            mine = exists().where(
                EvaluationReport.submission_id == Submission.id, EvaluationReport.validator_hotkey == validator
            )
            held = exists().where(
                EvaluationLease.submission_id == Submission.id,
                EvaluationLease.validator_hotkey == validator,
                (EvaluationLease.leased_until > now) | (EvaluationLease.fetch_count >= MAX_FETCHES_PER_VALIDATOR),
            )
            # By another validator whose report counts (one that counts for nothing completes no consensus).
            reported = exists().where(
                EvaluationReport.submission_id == Submission.id,
                EvaluationReport.validator_hotkey.in_(electorate.voters),
            )
            rows = session.execute(
                select(
                    Submission.id,
                    Submission.hotkey,
                    Submission.ready_at,
                    Submission.target_sequence_length,
                    Submission.claimed_tokens_per_sec,
                    reported.label("reported"),
                ).where(
                    Submission.state == "ready",
                    Submission.round_id >= scheduling.first_scheduled_round(round_id),
                    Submission.hotkey.in_(registered),
                    ~mine,
                    ~held,
                )
            ).all()
            candidates = [
                scheduling.Queued(
                    row.id,
                    row.hotkey,
                    row.ready_at,
                    row.target_sequence_length,
                    row.claimed_tokens_per_sec,
                    reported=bool(row.reported),
                )
                for row in rows
            ]
            taken = dict(
                session.execute(
                    select(Submission.hotkey, func.count())
                    .select_from(EvaluationLease)
                    .join(Submission, Submission.id == EvaluationLease.submission_id)
                    .where(EvaluationLease.validator_hotkey == validator, EvaluationLease.first_round == round_id)
                    .group_by(Submission.hotkey)
                ).all()
            )
            chosen = scheduling.order_work(candidates, taken, standing, limit)
            items = []
            for pick in chosen:
                row = session.get(Submission, pick.submission_id)
                assert row is not None, f"submission {pick.submission_id} was read in this transaction"
                lease = session.get(EvaluationLease, (row.id, validator))
                if lease is None:
                    session.add(
                        EvaluationLease(
                            submission_id=row.id,
                            validator_hotkey=validator,
                            leased_until=now + lease_s,
                            fetch_count=1,
                            first_round=round_id,
                        )
                    )
                else:
                    lease.leased_until = now + lease_s
                    lease.fetch_count += 1
                items.append(
                    schemas.WorkItem(
                        # a ready submission is revealed
                        **evaluated_submission(row, self.config.blocks_until_reveal).model_dump(),
                        vram_mb=row.vram_mb,
                        benchmarks=benchmarks_from_json(row.benchmarks),
                        lease_expires_at=now + lease_s,
                    )
                )
            return items

        return schemas.WorkBatch(
            items=self._write(work, caller, locks=[f"validator:{validator}"]), lease_seconds=lease_s
        )

    def report(
        self, validator: str, request: schemas.ReportRequest, caller: Authenticated | None = None
    ) -> schemas.ReportAccepted:
        """Store one validator's report; when with it the validators' consensus fails the submission,
        charge a failed validation to the miner's IP (once per submission, never on one validator's word)."""
        if request.verdict == "passed" and (not request.correct or request.logits_ok is False):
            raise ApiError(422, "verdict 'passed' contradicts correct=false or logits_ok=false")
        if request.verdict == "passed" and request.measured_tokens_per_sec is None:
            raise ApiError(422, "verdict 'passed' needs measured_tokens_per_sec")
        now = self.clock()
        electorate = self.electorate()

        def work(session: Session) -> schemas.ReportAccepted:
            # Locked: the schedule does not supersede it while this report is being stored.
            submission = session.get(Submission, request.submission_id, with_for_update=True)
            if submission is not None and submission.state == "superseded":
                raise ApiError(
                    409,
                    f"submission {submission.id} was superseded by submission "
                    f"{submission.superseded_by} of the same hotkey before any validator "
                    f"reported on it: it is not evaluated",
                )
            if submission is None or submission.state != "ready":
                raise ApiError(404, f"no submission {request.submission_id} ready for evaluation")
            if session.get(EvaluationLease, (submission.id, validator)) is None:
                raise ApiError(
                    409,
                    f"submission {submission.id} was never fetched by this validator (GET /validator/pending first)",
                )
            if session.scalar(
                select(
                    exists().where(
                        EvaluationReport.submission_id == submission.id, EvaluationReport.validator_hotkey == validator
                    )
                )
            ):
                raise ApiError(409, f"this validator already reported on submission {submission.id}")
            claimed = submission.revealed().claimed_tokens_per_sec
            measured = request.measured_tokens_per_sec  # not None when passed: checked above
            if request.verdict == "passed" and measured is not None and measured < scoring.CLAIM_FACTOR * claimed:
                raise ApiError(
                    422,
                    f"verdict 'passed' contradicts measured_tokens_per_sec "
                    f"{measured:g} < {scoring.CLAIM_FACTOR} x the claim {claimed:g}",
                )
            # Every field of the request is a column of the report (its lengths as JSON objects).
            report = EvaluationReport(
                **request.model_dump(exclude={"benchmarks"}),
                benchmarks=benchmarks_to_json(request.benchmarks),
                validator_hotkey=validator,
                reported_at=now,
            )
            session.add(report)
            session.flush()
            reports = session.scalars(
                select(EvaluationReport).where(EvaluationReport.submission_id == submission.id)
            ).all()
            view = consensus.decide(consensus_reports(reports), electorate, self.quorum)
            counted = False
            if view.state == consensus.FAILED:
                given = dict.fromkeys(reason for r in reports if r.verdict == "failed" for reason in r.reasons)
                reason = "; ".join([view.reason, *given])
                counted = self._record_failure(
                    session,
                    submission.client_ip,
                    now,
                    "evaluation",
                    reason,
                    submission.id,
                    dedupe_key=f"evaluation:{submission.id}",
                )
            return schemas.ReportAccepted(report_id=report.id, submission_id=submission.id, failure_counted=counted)

        try:
            # One validator's reports commit in the order of their ids: its primary imports them
            # with a cursor (after_id), which would pass over one committed after a higher id.
            accepted = self._write(work, caller, locks=[f"validator:{validator}"])
        except IntegrityError:
            raise ApiError(409, f"this validator already reported on submission {request.submission_id}") from None
        self.reports_said.add(
            request.verdict,
            validator,
            f"report on submission {request.submission_id} by {validator}: {request.verdict}",
        )
        return accepted
