"""Where each submission stands, for miners and the public: its state, the validators' verdicts,
reasons and per-length figures, and a miner's measured tokens/sec per round.

What is public: everything of a revealed submission (a direct submission is revealed when it is
made) except the client IP it came from; of a commitment that is not revealed, only its hash,
target length, time and reveal window: never a fork URL, commit or claim (it has none stored
before the reveal, and nothing here reads those columns for it).

The state machine (:func:`submission_state`): a commitment is ``committed`` until it is revealed
(``revealed``) or its reveal window closes (``expired``); a direct submission starts ``queued``.
A ready submission is ``being_evaluated`` while a validator holds an unexpired lease on it and
none has reported; once reports arrive it is ``passed`` or ``failed`` by the validators'
consensus, the same rule the leaderboard ranks by (docs/rules.md section 5).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import func, select

from quasar import scoring
from quasar.api import rules, schemas
from quasar.api.db import EvaluationLease, EvaluationReport, Submission
from quasar.api.service import SubmissionService, consensus_result, evaluated_submissions

COMMITTED, EXPIRED, REVEALED, QUEUED = "committed", "expired", "revealed", "queued"
BEING_EVALUATED, PASSED, FAILED = "being_evaluated", "passed", "failed"


def submission_state(method: str, revealed: bool, window_state: str | None, reports: int, evaluating: int,
                     eligible: bool | None) -> str:
    """The state of a submission (module docstring).

    ``window_state``: the reveal window's state (``waiting``/``open``/``expired``) of an unrevealed
    commitment; ``reports``: reports received; ``evaluating``: validators holding a live lease
    without a report; ``eligible``: the consensus of the reports passes (None without reports).
    """
    if not revealed:
        return EXPIRED if window_state == "expired" else COMMITTED
    if reports:
        return PASSED if eligible else FAILED
    if evaluating:
        return BEING_EVALUATED
    return REVEALED if method == "commit_reveal" else QUEUED


def length_figures(stored_lengths: Sequence[Mapping] | None,
                   stored_benchmarks: Mapping[str, float] | None) -> list[schemas.LengthFigures]:
    """A report's per-length figures, by length; a report from before per-length figures were
    sent (``lengths`` NULL) gives its ``benchmarks`` tokens/sec with the rest unknown."""
    if stored_lengths is not None:
        figures = [schemas.LengthFigures(seq_len=int(item["seq_len"]), status=item.get("status"),
                                         tokens_per_sec=item.get("tokens_per_sec"),
                                         peak_vram_mb=item.get("peak_vram_mb"), correct=item.get("correct"))
                   for item in stored_lengths]
    else:
        figures = [schemas.LengthFigures(seq_len=int(length), status=None, tokens_per_sec=float(tps),
                                         peak_vram_mb=None, correct=None)
                   for length, tps in (stored_benchmarks or {}).items()]
    return sorted(figures, key=lambda item: item.seq_len)


def _verdict(report: EvaluationReport) -> schemas.ValidatorVerdict:
    return schemas.ValidatorVerdict(
        validator_hotkey=report.validator_hotkey, verdict=report.verdict, correct=report.correct,
        logits_ok=report.logits_ok, measured_tokens_per_sec=report.measured_tokens_per_sec,
        lengths=length_figures(report.lengths, report.benchmarks), reasons=list(report.reasons),
        reported_at=report.reported_at)


def _benchmarks(stored: Mapping[str, float] | None) -> dict[int, float] | None:
    return None if stored is None else {int(length): float(tps) for length, tps in stored.items()}


@dataclass(frozen=True)
class StatusContext:
    """What a status is computed against: the chain's block, the time, the reveal parameters."""

    block: int
    now: float
    blocks_until_reveal: int
    reveal_window_blocks: int


def build_status(submission: Submission, reports: Sequence[EvaluationReport], evaluating: int,
                 context: StatusContext) -> schemas.SubmissionStatus:
    """The public status of ``submission`` (see the module docstring for what an unrevealed one shows)."""
    revealed = submission.state == "ready"
    window = None
    if submission.method == "commit_reveal":
        window = rules.reveal_window(submission.submitted_block, context.blocks_until_reveal,
                                     context.reveal_window_blocks)
    result = consensus_result(submission, reports)[0] if revealed and reports else None
    state = submission_state(submission.method, revealed, None if window is None else window.state(context.block),
                             len(reports) if revealed else 0, evaluating,
                             None if result is None else scoring.is_eligible(result))
    common = dict(
        submission_id=submission.id, hotkey=submission.hotkey, method=submission.method, state=state,
        target_sequence_length=submission.target_sequence_length,
        league=scoring.league_for(submission.target_sequence_length).name,
        submitted_at=submission.submitted_at, submitted_block=submission.submitted_block,
        commitment_hash=submission.commitment_hash,
        reveal_from_block=None if window is None else window.opens,
        reveal_until_block=None if window is None else window.closes, revealed=revealed)
    if not revealed:
        return schemas.SubmissionStatus(
            **common, ready_at=None, round_id=None, fork_url=None, commit_hash=None, claimed_tokens_per_sec=None,
            vram_mb=None, claimed_benchmarks=None, measured_tokens_per_sec=None, weighted_score=None,
            validators_evaluating=0, reports=[])
    return schemas.SubmissionStatus(
        **common, ready_at=submission.ready_at, round_id=submission.round_id, fork_url=submission.fork_url,
        commit_hash=submission.commit_hash, claimed_tokens_per_sec=submission.claimed_tokens_per_sec,
        vram_mb=submission.vram_mb, claimed_benchmarks=_benchmarks(submission.benchmarks),
        measured_tokens_per_sec=None if result is None else result.measured_tokens_per_sec,
        weighted_score=None if result is None else scoring.weighted_score(result),
        validators_evaluating=evaluating,
        reports=[_verdict(report) for report in sorted(reports, key=lambda r: (r.reported_at, r.id))])


def best_per_round(points: Iterable[schemas.RoundPoint]) -> list[schemas.RoundPoint]:
    """Each round's best point (highest weighted score, then measured tokens/sec, then the earlier
    submission), by round."""
    best: dict[int, schemas.RoundPoint] = {}
    for point in points:
        held = best.get(point.round_id)
        if held is None or (point.weighted_score, point.measured_tokens_per_sec, -point.submission_id) > \
                (held.weighted_score, held.measured_tokens_per_sec, -held.submission_id):
            best[point.round_id] = point
    return [best[round_id] for round_id in sorted(best)]


class StatusReader:
    """Reads submission statuses and miners' histories through ``service``'s database and chain."""

    def __init__(self, service: SubmissionService):
        self.service = service

    def _context(self) -> StatusContext:
        config = self.service.config
        return StatusContext(self.service.current_block(), self.service.clock(), config.blocks_until_reveal,
                             config.reveal_window_blocks)

    def _statuses(self, session, submissions: Sequence[Submission],
                  context: StatusContext) -> list[schemas.SubmissionStatus]:
        ids = [submission.id for submission in submissions]
        reports: dict[int, list[EvaluationReport]] = defaultdict(list)
        evaluating: dict[int, int] = defaultdict(int)
        if ids:
            for report in session.scalars(select(EvaluationReport).where(EvaluationReport.submission_id.in_(ids))):
                reports[report.submission_id].append(report)
            leases = session.scalars(select(EvaluationLease).where(EvaluationLease.submission_id.in_(ids),
                                                                   EvaluationLease.leased_until > context.now))
            for lease in leases:
                if all(r.validator_hotkey != lease.validator_hotkey for r in reports[lease.submission_id]):
                    evaluating[lease.submission_id] += 1
        return [build_status(s, reports[s.id], evaluating[s.id], context) for s in submissions]

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
            total = session.scalar(select(func.count()).select_from(Submission).where(*where))
            rows = session.scalars(select(Submission).where(*where).order_by(Submission.id.desc())
                                   .offset(offset).limit(limit)).all()
            statuses = self._statuses(session, rows, context)
        return schemas.SubmissionPage(hotkey=hotkey, total=total, offset=offset, limit=limit, submissions=statuses)

    def history(self, hotkey: str) -> schemas.MinerHistory:
        """``hotkey``'s best evaluated submission per round: consensus tokens/sec and weighted score."""
        with self.service.database.read() as session:
            evaluated = evaluated_submissions(session, Submission.hotkey == hotkey)
        points = []
        for submission, reports in evaluated:
            result, _ = consensus_result(submission, reports)
            points.append(schemas.RoundPoint(
                round_id=submission.round_id, submission_id=submission.id,
                measured_tokens_per_sec=result.measured_tokens_per_sec,
                weighted_score=scoring.weighted_score(result),
                state=PASSED if scoring.is_eligible(result) else FAILED))
        return schemas.MinerHistory(hotkey=hotkey, rounds=best_per_round(points))
