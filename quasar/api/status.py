"""Where each submission stands, for miners and the public: its state, the validators' verdicts,
reasons and per-length figures, and a miner's measured tokens/sec per round.

What is public: everything of a revealed submission (a direct submission is revealed when it is
made) except the client IP it came from; of a commitment that is not revealed, only its hash,
target length, time and reveal window: never a fork URL, commit or claim (it has none stored
before the reveal, and nothing here reads those columns for it).

The state machine (:func:`submission_state`): a commitment is ``committed`` until it is revealed
(``revealed``) or its reveal window closes (``expired``); a direct submission starts ``queued``.
Before any report, the schedule (quasar/scheduling.py) may make it ``superseded`` (a newer one of
its hotkey replaced it), ``deferred`` (its upper bound is below the current fourth place: it waits
until nothing that could place does) or ``lapsed`` (its round and the next are over: no longer
handed out). It is ``being_evaluated`` while a validator holds an unexpired lease on it and none
has reported. Once reports arrive, the validators' consensus (quasar/consensus.py, the rule
the leaderboard ranks by) makes it ``awaiting_quorum`` (too few validators reported yet),
``disputed`` (a quorum, but no side holds more than half of the stake), ``passed`` or ``failed``;
a copy of another hotkey's earlier submission (quasar/originality.py) that did not fail is
``copy``, and is not ranked. ``state_reason`` says each state in words.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, TypedDict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from quasar import consensus, originality, scheduling, scoring
from quasar.api import rules, schemas
from quasar.api.db import EvaluationLease, EvaluationReport, Submission
from quasar.api.judging import Judged, consensus_reports, evaluated_submissions
from quasar.api.rowfields import finding_fields
from quasar.api.service import SubmissionService
from quasar.api.tables import SubmissionMethod

COMMITTED: Final = "committed"
EXPIRED: Final = "expired"
REVEALED: Final = "revealed"
QUEUED: Final = "queued"
SUPERSEDED: Final = "superseded"
DEFERRED: Final = "deferred"
LAPSED: Final = "lapsed"
BEING_EVALUATED: Final = "being_evaluated"
COPY: Final = "copy"
READY = "ready"  # the stored state of a revealed submission being scheduled or judged
# A miner's history (its dashboard page's chart) reads the current round and the rounds before it
# up to this many in all (five days at the default ROUND_BLOCKS): judging every round a miner ever
# played made the page cost more with each round (docs/api.md, "How long things are kept").
HISTORY_ROUNDS = 100
PASSED, FAILED = consensus.PASSED, consensus.FAILED
# The consensus's states as the API names them (the same words).
_CONSENSUS_STATES: dict[str, schemas.ConsensusState] = {
    consensus.AWAITING_QUORUM: "awaiting_quorum",
    consensus.DISPUTED: "disputed",
    consensus.PASSED: "passed",
    consensus.FAILED: "failed",
}


@dataclass(frozen=True)
class Waiting:
    """Where the schedule has put a revealed submission no validator reported on: ``superseded``,
    ``deferred`` or ``lapsed`` (see the module docstring), and why."""

    state: schemas.SubmissionState
    reason: str


def consensus_state(view: consensus.Consensus) -> schemas.ConsensusState:
    """The state of the validators' consensus ``view``, as the API's schemas name it."""
    return _CONSENSUS_STATES[view.state]


def submission_state(
    method: str,
    revealed: bool,
    window_state: str | None,
    evaluating: int,
    view: consensus.Consensus | None,
    copy_of: originality.CopyOf | None,
    waiting: Waiting | None = None,
) -> schemas.SubmissionState:
    """The state of a submission (module docstring).

    ``window_state``: the reveal window's state (``waiting``/``open``/``expired``) of an unrevealed
    commitment; ``evaluating``: validators holding a live lease without a report; ``view``: the
    validators' consensus (None without reports); ``copy_of``: the submission it copies, if any;
    ``waiting``: where the schedule put it while no validator reported on it.
    """
    if not revealed:
        return EXPIRED if window_state == "expired" else COMMITTED
    if view is not None:
        return COPY if copy_of is not None and view.state != FAILED else consensus_state(view)
    if waiting is not None and waiting.state == SUPERSEDED:
        return SUPERSEDED  # never evaluated, even by a validator that took it before
    if evaluating:
        return BEING_EVALUATED
    if waiting is not None:
        return waiting.state
    return REVEALED if method == "commit_reveal" else QUEUED


def state_reason(
    state: str,
    evaluating: int,
    view: consensus.Consensus | None,
    copy_of: originality.CopyOf | None,
    waiting: Waiting | None = None,
) -> str | None:
    """The state in words, for the miner (None where the state says it all)."""
    if state == COPY:
        assert copy_of is not None, "a copy's state comes from what it copies"
        return copy_of.reason
    if view is not None:
        return view.reason
    if state == BEING_EVALUATED:
        return f"{evaluating} validator{'' if evaluating == 1 else 's'} evaluating it now"
    if waiting is not None and state == waiting.state:
        return waiting.reason
    if state in (QUEUED, REVEALED):
        return "waiting for a validator to fetch it"
    return None


def waiting_of(submission: Submission, context: StatusContext) -> Waiting | None:
    """Where the schedule has put ``submission`` (a revealed one without reports), or None."""
    if submission.state == SUPERSEDED:
        return Waiting(
            SUPERSEDED,
            f"superseded by submission {submission.superseded_by}, a newer one of this "
            f"hotkey, before any validator reported on it: it is not evaluated",
        )
    revealed = submission.revealed()
    if revealed.round_id < context.first_scheduled_round:
        return Waiting(
            LAPSED,
            f"lapsed: validators evaluate a submission in its round and the next; round "
            f"{revealed.round_id} and the next are over",
        )
    queued = scheduling.Queued(
        submission.id,
        submission.hotkey,
        revealed.ready_at,
        submission.target_sequence_length,
        revealed.claimed_tokens_per_sec,
        reported=False,
    )
    if not scheduling.could_place(queued, context.standing):
        return Waiting(DEFERRED, scheduling.deferred_reason(queued, context.standing))
    return None


def consensus_view(view: consensus.Consensus) -> schemas.ConsensusView:
    return schemas.ConsensusView(
        state=consensus_state(view),
        validators_reported=view.reported,
        validators=view.validators,
        reported_stake_share=view.reported_share,
        passed_stake_share=view.passed_share,
        failed_stake_share=view.failed_share,
        reason=view.reason,
        content_hash=view.content_hash,
    )


def length_figures(
    stored_lengths: Sequence[Mapping] | None, stored_benchmarks: Mapping[str, float] | None
) -> list[schemas.LengthFigures]:
    """A report's per-length figures, by length; a report from before per-length figures were
    sent (``lengths`` NULL) gives its ``benchmarks`` tokens/sec with the rest unknown."""
    if stored_lengths is not None:
        figures = [
            schemas.LengthFigures(
                seq_len=int(item["seq_len"]),
                status=item.get("status"),
                tokens_per_sec=item.get("tokens_per_sec"),
                peak_vram_mb=item.get("peak_vram_mb"),
                correct=item.get("correct"),
            )
            for item in stored_lengths
        ]
    else:
        figures = [
            schemas.LengthFigures(
                seq_len=int(length), status=None, tokens_per_sec=float(tps), peak_vram_mb=None, correct=None
            )
            for length, tps in (stored_benchmarks or {}).items()
        ]
    return sorted(figures, key=lambda item: item.seq_len)


def _verdict(report: EvaluationReport, electorate: consensus.Electorate) -> schemas.ValidatorVerdict:
    return schemas.ValidatorVerdict(
        **finding_fields(report),
        validator_hotkey=report.validator_hotkey,
        lengths=length_figures(report.lengths, report.benchmarks),
        counted=electorate.weight(report.validator_hotkey) > 0,
    )


def _benchmarks(stored: Mapping[str, float] | None) -> dict[int, float] | None:
    return None if stored is None else {int(length): float(tps) for length, tps in stored.items()}


@dataclass(frozen=True)
class StatusContext:
    """What a status is computed against: the chain's block, the time, the reveal parameters, the
    validators whose reports count, the oldest round still scheduled and the current round's
    standing (its fourth place and copiers: quasar/scheduling.py)."""

    block: int
    now: float
    blocks_until_reveal: int
    reveal_window_blocks: int
    electorate: consensus.Electorate
    first_scheduled_round: int
    standing: scheduling.Standing


class _CommonStatus(TypedDict):
    """The fields of a status shown whether or not the submission is revealed."""

    submission_id: int
    hotkey: str
    method: SubmissionMethod
    state: schemas.SubmissionState
    state_reason: str | None
    target_sequence_length: int
    league: str
    submitted_at: float
    submitted_block: int
    commitment_hash: str | None
    reveal_from_block: int | None
    reveal_until_block: int | None
    revealed: bool


def build_status(
    submission: Submission,
    reports: Sequence[EvaluationReport],
    judged: Judged | None,
    evaluating: int,
    context: StatusContext,
) -> schemas.SubmissionStatus:
    """The public status of ``submission`` (see the module docstring for what an unrevealed one
    shows) with its ``reports``; ``judged``: their consensus, None before any report."""
    revealed = submission.state in (READY, SUPERSEDED)
    window = None
    if submission.method == "commit_reveal":
        window = rules.reveal_window(
            submission.submitted_block, context.blocks_until_reveal, context.reveal_window_blocks
        )
    if not revealed:
        judged = None
    view, copy_of = (None, None) if judged is None else (judged.consensus, judged.copy_of)
    waiting = waiting_of(submission, context) if revealed and judged is None else None
    state = submission_state(
        submission.method,
        revealed,
        None if window is None else window.state(context.block),
        evaluating,
        view,
        copy_of,
        waiting,
    )
    result = None if judged is None else judged.result
    common = _CommonStatus(
        submission_id=submission.id,
        hotkey=submission.hotkey,
        method=submission.method,
        state=state,
        state_reason=state_reason(state, evaluating, view, copy_of, waiting),
        target_sequence_length=submission.target_sequence_length,
        league=scoring.league_for(submission.target_sequence_length).name,
        submitted_at=submission.submitted_at,
        submitted_block=submission.submitted_block,
        commitment_hash=submission.commitment_hash,
        reveal_from_block=None if window is None else window.opens,
        reveal_until_block=None if window is None else window.closes,
        revealed=revealed,
    )
    if not revealed:
        # Nothing but ``common`` is shown before the reveal: every other field null, no one evaluating.
        hidden: dict[str, Any] = dict.fromkeys(schemas.SubmissionStatus.model_fields.keys() - common.keys())
        return schemas.SubmissionStatus(**{**hidden, "validators_evaluating": 0, "reports": []}, **common)
    weighted: float | None
    if result is not None:
        weighted = scoring.weighted_score(result)
    else:
        weighted = 0.0 if state in (FAILED, COPY) else None
    return schemas.SubmissionStatus(
        **common,
        **asdict(submission.revealed()),
        vram_mb=submission.vram_mb,
        claimed_benchmarks=_benchmarks(submission.benchmarks),
        measured_tokens_per_sec=None if view is None else view.measured_tokens_per_sec,
        weighted_score=weighted,
        validators_evaluating=evaluating,
        consensus=None if view is None else consensus_view(view),
        copy_of=None if copy_of is None else copy_of.original_id,
        superseded_by=submission.superseded_by,
        reports=[
            _verdict(report, context.electorate) for report in sorted(reports, key=lambda r: (r.reported_at, r.id))
        ],
    )


def best_per_round(points: Iterable[schemas.RoundPoint]) -> list[schemas.RoundPoint]:
    """Each round's best point (highest weighted score, then measured tokens/sec, then the earlier
    submission), by round."""
    best: dict[int, schemas.RoundPoint] = {}
    for point in points:
        held = best.get(point.round_id)
        if held is None or (point.weighted_score, point.measured_tokens_per_sec, -point.submission_id) > (
            held.weighted_score,
            held.measured_tokens_per_sec,
            -held.submission_id,
        ):
            best[point.round_id] = point
    return [best[round_id] for round_id in sorted(best)]


class StatusReader:
    """Reads submission statuses and miners' histories through ``service``'s database and chain."""

    def __init__(self, service: SubmissionService):
        self.service = service

    def _context(self) -> StatusContext:
        config = self.service.config
        block = self.service.current_block()
        round_id = rules.round_of_block(block, config.round_blocks).round_id
        return StatusContext(
            block,
            self.service.clock(),
            config.blocks_until_reveal,
            config.reveal_window_blocks,
            self.service.electorate(),
            scheduling.first_scheduled_round(round_id),
            self.service.standing(round_id),
        )

    def _statuses(
        self, session: Session, submissions: Sequence[Submission], context: StatusContext
    ) -> list[schemas.SubmissionStatus]:
        ids = [submission.id for submission in submissions]
        reports: dict[int, list[EvaluationReport]] = defaultdict(list)
        evaluating: dict[int, int] = defaultdict(int)
        if ids:
            for report in session.scalars(select(EvaluationReport).where(EvaluationReport.submission_id.in_(ids))):
                reports[report.submission_id].append(report)
            leases = session.scalars(
                select(EvaluationLease).where(
                    EvaluationLease.submission_id.in_(ids), EvaluationLease.leased_until > context.now
                )
            )
            for lease in leases:
                if all(r.validator_hotkey != lease.validator_hotkey for r in reports[lease.submission_id]):
                    evaluating[lease.submission_id] += 1
        evaluated = [(s, consensus_reports(reports[s.id])) for s in submissions if s.state == READY and reports[s.id]]
        judged = {
            item.submission.submission_id: item for item in self.service.judge(session, evaluated, context.electorate)
        }
        return [
            build_status(s, reports[s.id] if s.state == READY else [], judged.get(s.id), evaluating[s.id], context)
            for s in submissions
        ]

    def submission(self, submission_id: int) -> schemas.SubmissionStatus | None:
        """The status of one submission, or None when there is no such submission."""
        context = self._context()
        with self.service.database.read() as session:
            submission = session.get(Submission, submission_id)
            if submission is None:
                return None
            return self._statuses(session, [submission], context)[0]

    def submissions(self, hotkey: str | None, limit: int, offset: int) -> schemas.SubmissionPage:
        """Submissions, newest first (of ``hotkey`` only, when given)."""
        context = self._context()
        where = [] if hotkey is None else [Submission.hotkey == hotkey]
        with self.service.database.read() as session:
            total = session.execute(select(func.count()).select_from(Submission).where(*where)).scalar_one()
            rows = session.scalars(
                select(Submission).where(*where).order_by(Submission.id.desc()).offset(offset).limit(limit)
            ).all()
            statuses = self._statuses(session, rows, context)
        return schemas.SubmissionPage(hotkey=hotkey, total=total, offset=offset, limit=limit, submissions=statuses)

    def history(self, hotkey: str) -> schemas.MinerHistory:
        """``hotkey``'s best judged submission per round (settled, not a copy) of the newest
        :data:`HISTORY_ROUNDS` rounds: consensus tokens/sec and weighted score."""
        electorate = self.service.electorate()
        round_id = rules.round_of_block(self.service.current_block(), self.service.config.round_blocks).round_id
        kept = (Submission.hotkey == hotkey) & (Submission.round_id > round_id - HISTORY_ROUNDS)
        with self.service.database.read() as session:
            judged = self.service.judge(session, evaluated_submissions(session, kept), electorate)
        points = []
        for item in judged:
            if not item.consensus.settled or item.copy_of is not None:
                continue
            result = item.result
            points.append(
                schemas.RoundPoint(
                    round_id=item.submission.round_id,
                    submission_id=item.submission.submission_id,
                    measured_tokens_per_sec=item.consensus.measured_tokens_per_sec or 0.0,
                    weighted_score=0.0 if result is None else scoring.weighted_score(result),
                    state="passed" if result is not None else "failed",
                )
            )
        return schemas.MinerHistory(hotkey=hotkey, rounds=best_per_round(points))
