"""The submission API's standings: the validators' consensus on each evaluated submission
(quasar/consensus.py), copies (quasar/originality.py), the leaderboard ranked from them, and each
validator's agreement with the consensus."""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from quasar import consensus, originality, scoring
from quasar.api import rules, schemas
from quasar.api.db import EvaluationReport, Submission
from quasar.api.rowfields import evaluated_submission, finding_fields
from quasar.api.servicecore import ServiceCore, benchmarks_from_json

# What ranking reads of a submission and of a report (not their JSON figures and reasons, which
# cost most of reading them).
_RANKED_COLUMNS = (
    Submission.id.label("submission_id"),  # as Submission.submission_id, so a row reads as one
    Submission.hotkey,
    Submission.submitted_at,
    Submission.target_sequence_length,
    Submission.claimed_tokens_per_sec,
    Submission.commit_hash,
    Submission.round_id,
    Submission.method,  # with the submitted block: the block it counts from for originality
    Submission.submitted_block,
)
_REPORT_COLUMNS = (
    EvaluationReport.validator_hotkey,
    EvaluationReport.verdict,
    EvaluationReport.logits_ok,
    EvaluationReport.measured_tokens_per_sec,
    EvaluationReport.content_hash,
)


def evaluated_submissions(session: Session, condition: ColumnElement[bool]) -> list[tuple[Any, list[consensus.Report]]]:
    """The revealed submissions matching ``condition`` that validators reported on (rows with the
    columns of ``_RANKED_COLUMNS``), each with its reports as the consensus reads them, in one query."""
    rows = session.execute(
        select(*_RANKED_COLUMNS, *_REPORT_COLUMNS)
        .join(EvaluationReport, EvaluationReport.submission_id == Submission.id)
        .where(condition, Submission.state == "ready")
    ).all()
    evaluated: dict[int, tuple[Any, list[consensus.Report]]] = {}
    for row in rows:
        report = consensus.Report(
            row.validator_hotkey, row.verdict == "passed", row.logits_ok, row.measured_tokens_per_sec, row.content_hash
        )
        evaluated.setdefault(row.submission_id, (row, []))[1].append(report)
    return list(evaluated.values())


def consensus_reports(reports: Sequence[EvaluationReport]) -> list[consensus.Report]:
    """Stored reports as the consensus reads them."""
    return [
        consensus.Report(
            r.validator_hotkey, r.verdict == "passed", r.logits_ok, r.measured_tokens_per_sec, r.content_hash
        )
        for r in reports
    ]


def ranked_result(submission: Any, view: consensus.Consensus) -> scoring.Result | None:
    """``submission`` (a Submission or a row of its ``_RANKED_COLUMNS``) as scoring ranks it once the
    validators' consensus passed it (the consensus figure, never the claim alone); None while it is
    not passed."""
    if view.state != consensus.PASSED:
        return None
    return scoring.Result.judged(submission, view.measured_tokens_per_sec, correct=True, logits_ok=view.logits_ok)


@dataclass(frozen=True)
class Judged:
    """A submission validators reported on (a Submission or a row of its ``_RANKED_COLUMNS``), with
    its reports, their consensus and, when it is a copy of another hotkey's earlier submission,
    which (quasar/originality.py)."""

    submission: Any
    reports: list[consensus.Report]
    consensus: consensus.Consensus
    copy_of: originality.CopyOf | None

    @functools.cached_property
    def result(self) -> scoring.Result | None:
        """Its result as ranked: passed by the consensus and not a copy; else None."""
        return None if self.copy_of is not None else ranked_result(self.submission, self.consensus)


def reported_work(report: EvaluationReport, submission: Submission, blocks_until_reveal: int) -> schemas.ReportedWork:
    """A stored report with the submission it is on. Validators report only on revealed submissions
    (quasar/api/intake.py), so its fork, commit, claim and round are set."""
    return schemas.ReportedWork(
        **evaluated_submission(submission, blocks_until_reveal).model_dump(),
        **finding_fields(report),
        report_id=report.id,
        benchmarks=benchmarks_from_json(report.benchmarks),
    )


def fingerprint(submission: Any, content_hash: str | None, blocks_until_reveal: int) -> originality.Fingerprint:
    """``submission`` (a Submission or a row of its ``_RANKED_COLUMNS``) as originality compares it,
    with the content hash its validators' consensus found (None: none yet)."""
    counts_from = rules.counts_from_block(submission.method, submission.submitted_block, blocks_until_reveal)
    return originality.Fingerprint(
        submission.submission_id, submission.hotkey, submission.commit_hash, content_hash, counts_from
    )


def copies_among(
    session: Session,
    prints: Sequence[originality.Fingerprint],
    electorate: consensus.Electorate,
    quorum: consensus.Quorum,
    blocks_until_reveal: int,
) -> dict[int, originality.CopyOf]:
    """Which of ``prints`` copy a submission of another hotkey that counts earlier: compared with
    every revealed submission of the same commit, and every one whose validators' consensus found
    the same kernel content (whatever their ids: a higher id may count earlier)."""
    if not prints:
        return {}
    known = {fingerprint.submission_id for fingerprint in prints}
    commits = {fingerprint.commit_hash for fingerprint in prints if fingerprint.commit_hash is not None}
    contents = {fingerprint.content_hash for fingerprint in prints if fingerprint.content_hash is not None}
    others: list[originality.Fingerprint] = []
    if commits:
        rows = session.execute(
            select(
                Submission.id.label("submission_id"),
                Submission.hotkey,
                Submission.commit_hash,
                Submission.method,
                Submission.submitted_block,
            ).where(Submission.commit_hash.in_(commits), Submission.state != "committed")
        ).all()
        others += [fingerprint(row, None, blocks_until_reveal) for row in rows if row.submission_id not in known]
    if contents:
        ids = set(
            session.scalars(select(EvaluationReport.submission_id).where(EvaluationReport.content_hash.in_(contents)))
        )
        unknown = ids - known
        # Never asked with none: SQLite answers an empty IN by reading every ready submission ever made.
        for submission, reports in evaluated_submissions(session, Submission.id.in_(unknown)) if unknown else []:
            view = consensus.decide(reports, electorate, quorum)
            others.append(fingerprint(submission, view.content_hash, blocks_until_reveal))
    found = originality.find_copies([*prints, *others])
    return {submission_id: copy for submission_id, copy in found.items() if submission_id in known}


def judge(
    session: Session,
    evaluated: Sequence[tuple[Any, list[consensus.Report]]],
    electorate: consensus.Electorate,
    quorum: consensus.Quorum,
    blocks_until_reveal: int,
) -> list[Judged]:
    """The consensus of each evaluated submission and whether it is a copy (one database read for
    the originals); ``blocks_until_reveal`` places commitments in time (rules.counts_from_block)."""
    views = {
        submission.submission_id: consensus.decide(reports, electorate, quorum) for submission, reports in evaluated
    }
    prints = [
        fingerprint(submission, views[submission.submission_id].content_hash, blocks_until_reveal)
        for submission, _ in evaluated
    ]
    copies = copies_among(session, prints, electorate, quorum, blocks_until_reveal)
    return [
        Judged(submission, reports, views[submission.submission_id], copies.get(submission.submission_id))
        for submission, reports in evaluated
    ]


class Standings(ServiceCore):
    """The consensus, copies and the leaderboard, computed once per chain block and process."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # The current round's leaderboard at the newest block, keyed (round, block), with the hotkeys
        # found copying: the work schedule's standing and the leaderboard route compute it once per
        # block and process. One entry: a past round asked for is not kept here (the read cache keeps
        # its page), so however many are asked for, nothing piles up.
        self._current_board: tuple[tuple[int, int], tuple[schemas.Leaderboard, frozenset[str]]] | None = None
        self._current_board_lock = threading.Lock()

    def judge(
        self,
        session: Session,
        evaluated: Sequence[tuple[Any, list[consensus.Report]]],
        electorate: consensus.Electorate,
    ) -> list[Judged]:
        """The consensus of each of ``evaluated`` under this API's quorum, and which are copies."""
        return judge(session, evaluated, electorate, self.quorum, self.config.blocks_until_reveal)

    def judged_round(self, round_id: int) -> tuple[list[Judged], consensus.Electorate]:
        """The round's evaluated submissions judged (consensus, copies), and the electorate used."""
        electorate = self.electorate()
        with self.database.read() as session:
            evaluated = evaluated_submissions(session, Submission.round_id == round_id)
            return self.judge(session, evaluated, electorate), electorate

    def leaderboard(self, round_id: int | None) -> schemas.Leaderboard:
        """Round ``round_id`` (default: the current one) ranked by quasar.scoring from the validators'
        consensus figures (never the claims); submissions awaiting a quorum, disputed, failed or
        copies are not ranked (the first three and the copies are listed with why). Computed once
        per chain block: reports count from the block after they arrive."""
        return self.judged_board(round_id)[0]

    def judged_board(self, round_id: int | None) -> tuple[schemas.Leaderboard, frozenset[str]]:
        """The leaderboard of round ``round_id`` (default: the current one) and the hotkeys found
        copying in it; the current round's computed once per block and process."""
        block = self.current_block()
        current = rules.round_of_block(block, self.config.round_blocks).round_id
        key = (current if round_id is None else round_id, block)
        with self._current_board_lock:
            kept = self._current_board
        if kept is not None and kept[0] == key:
            return kept[1]
        judged, electorate = self.judged_round(key[0])
        ranked = (
            self._ranked(key[0], judged, electorate),
            frozenset(item.submission.hotkey for item in judged if item.copy_of is not None),
        )
        if key[0] == current:
            with self._current_board_lock:
                if self._current_board is None or self._current_board[0][1] <= block:
                    self._current_board = (key, ranked)
        return ranked

    def _ranked(self, round_id: int, judged: list[Judged], electorate: consensus.Electorate) -> schemas.Leaderboard:
        views = {item.submission.submission_id: item.consensus for item in judged}
        ranking = scoring.rank(
            [item.result for item in judged if item.result is not None], epsilon=self.config.tie_epsilon
        )
        entries = []
        for placement in ranking.placements:
            result, league = placement.result, scoring.league_for(placement.result.target_sequence_length)
            view = views[result.submission_id]
            entries.append(
                schemas.LeaderboardEntry(
                    place=placement.place,
                    hotkey=result.hotkey,
                    submission_id=result.submission_id,
                    league=league.name,
                    multiplier=league.multiplier,
                    target_sequence_length=result.target_sequence_length,
                    claimed_tokens_per_sec=result.claimed_tokens_per_sec,
                    measured_tokens_per_sec=result.measured_tokens_per_sec,
                    weighted_score=placement.weighted_score,
                    share=placement.share,
                    validators=view.reported,
                    reported_stake_share=view.reported_share,
                    submitted_at=result.submitted_at,
                )
            )
        not_ranked = []
        for item in sorted(judged, key=lambda item: -item.submission.submission_id):
            view, copy = item.consensus, item.copy_of
            state: schemas.NotRankedState
            if copy is not None and view.state != consensus.FAILED:
                state, reason = "copy", copy.reason
            elif view.state == consensus.AWAITING_QUORUM:  # not settled
                state, reason = "awaiting_quorum", view.reason
            elif view.state == consensus.DISPUTED:
                state, reason = "disputed", view.reason
            else:
                continue
            not_ranked.append(
                schemas.NotRanked(
                    submission_id=item.submission.submission_id,
                    hotkey=item.submission.hotkey,
                    state=state,
                    reason=reason,
                    validators_reported=view.reported,
                    reported_stake_share=view.reported_share,
                )
            )
        counts = {
            state: sum(1 for item in judged if item.consensus.state == state)
            for state in (consensus.AWAITING_QUORUM, consensus.DISPUTED, consensus.FAILED)
        }
        return schemas.Leaderboard(
            round_id=round_id,
            epsilon=ranking.epsilon,
            entries=entries,
            unassigned=ranking.unassigned,
            evaluated_submissions=len(judged),
            quorum_stake_share=self.quorum.stake_share,
            quorum_min_validators=self.quorum.min_validators,
            validators=len(electorate),
            awaiting_quorum=counts[consensus.AWAITING_QUORUM],
            disputed=counts[consensus.DISPUTED],
            failed=counts[consensus.FAILED],
            copies=sum(1 for item in not_ranked if item.state == "copy"),
            not_ranked=not_ranked[: schemas.MAX_NOT_RANKED_SHOWN],
        )

    def validator_reports(self, validator: str, after_id: int, limit: int) -> schemas.ValidatorReports:
        """``validator``'s reports with an id above ``after_id``, oldest first, at most ``limit``, each
        with its submission: what its other processes reported (quasar/validator/intake.py)."""
        with self.database.read() as session:
            rows = session.execute(
                select(EvaluationReport, Submission)
                .join(Submission, Submission.id == EvaluationReport.submission_id)
                .where(EvaluationReport.validator_hotkey == validator, EvaluationReport.id > after_id)
                .order_by(EvaluationReport.id)
                .limit(limit)
            ).all()
        return schemas.ValidatorReports(
            validator_hotkey=validator,
            reports=[reported_work(report, submission, self.config.blocks_until_reveal) for report, submission in rows],
        )

    def validator_agreement(self, round_id: int | None) -> schemas.ValidatorAgreements:
        """Per validator: its reports on round ``round_id``'s submissions (default: the current round)
        against the validators' settled consensus, and its weight in the consensus now."""
        round_id = self._round(round_id)
        judged, electorate = self.judged_round(round_id)
        agreements = {
            item.validator_hotkey: item
            for item in consensus.agreement((item.consensus, item.reports) for item in judged)
        }
        reports: dict[str, int] = {}
        for item in judged:
            for report in item.reports:
                reports[report.validator_hotkey] = reports.get(report.validator_hotkey, 0) + 1
        stakes = self.validator_stakes()
        total = electorate.total
        validators = []
        for hotkey in sorted(
            set(electorate.weights) | set(reports), key=lambda hotkey: (-electorate.weight(hotkey), hotkey)
        ):
            found = agreements.get(hotkey)
            validators.append(
                schemas.ValidatorAgreement(
                    validator_hotkey=hotkey,
                    stake=stakes.get(hotkey),
                    stake_share=electorate.weight(hotkey) / total if total else 0.0,
                    reports=reports.get(hotkey, 0),
                    judged=found.judged if found else 0,
                    agreed=found.agreed if found else 0,
                    disagreed=found.disagreed if found else 0,
                    agreement=found.share if found else None,
                    median_deviation=found.median_deviation if found else None,
                )
            )
        return schemas.ValidatorAgreements(round_id=round_id, validators=validators)
