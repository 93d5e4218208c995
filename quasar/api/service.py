"""What the submission API does, independent of HTTP: submissions, commit-reveal, the validators' work
queue, reports, failures and bans, rounds and the leaderboard.

Every state change is one :meth:`Database.write` transaction that first locks what its rule reads
(the hotkey for the rate limit, the validator for its leases, the IP for its failure count, the
submission row for a reveal), so a rule that reads before it writes holds under concurrent requests.
A signed request's own checks (its nonce was never used, its IP is not banned) run in that same
transaction, first (:class:`Authenticated`). Refusals raise :class:`ApiError` with the HTTP status
and a message for the caller.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from sqlalchemy import BigInteger, ColumnElement, String, bindparam, exists, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from quasar import auth, consensus, originality, scheduling, scoring
from quasar.api import rules, schemas
from quasar.api.db import (
    Database, EvaluationLease, EvaluationReport, IpBan, NonceLedger, PreparedStatement, Submission, UsedNonce,
    ValidationFailure, dialect_insert,
)
from quasar.chain import Chain, ChainError
from quasar.config import DEV_NETWORK, Settings
from quasar.forks import ForkError, normalize_fork_url, validate_commit_hash

logger = logging.getLogger(__name__)

T = TypeVar("T")

RATE_WINDOW_S = 3600.0
# A validator that fetched a submission this many times without reporting is not handed it again
# (a submission that crashes the validator must not be re-fetched forever).
MAX_FETCHES_PER_VALIDATOR = 3
# Submissions are handed out in their own round and the next (quasar/scheduling.py); older ones
# cannot change the ranking of the round being played.
SCHEDULED_ROUNDS = 2
MAX_REASON_STORED = 2000
# Nonces are kept a little longer than the freshness window that btauth/1 verification enforces.
NONCE_RETENTION_S = 2 * (auth.MAX_REQUEST_AGE_S + auth.ALLOWED_CLOCK_SKEW_S)


class ApiError(Exception):
    """A refused request: ``status`` and a ``detail`` safe to return to the caller."""

    def __init__(self, status: int, detail: str, headers: Mapping[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class ApiConfig:
    """The settings the API runs with (see quasar/config.py for each one's meaning)."""

    api_hotkey: str
    blocks_until_reveal: int
    reveal_window_blocks: int
    round_blocks: int
    submissions_per_hour: int
    evaluation_lease_s: float
    trusted_proxies: tuple[str, ...]
    allow_local_forks: bool
    tie_epsilon: float
    quorum_stake_share: float
    quorum_min_validators: int

    @property
    def quorum(self) -> consensus.Quorum:
        return consensus.Quorum(self.quorum_stake_share, self.quorum_min_validators)

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiConfig:
        """Local fork paths are accepted only on the dev chain and a local subtensor (QUASAR.md §3)."""
        return cls(
            api_hotkey=settings.api_hotkey,
            blocks_until_reveal=settings.blocks_until_reveal,
            reveal_window_blocks=settings.reveal_window_blocks,
            round_blocks=settings.round_blocks,
            submissions_per_hour=settings.submissions_per_hour,
            evaluation_lease_s=settings.evaluation_lease_s,
            trusted_proxies=settings.trusted_proxies,
            allow_local_forks=settings.network in (DEV_NETWORK, "local"),
            tie_epsilon=settings.tie_epsilon,
            quorum_stake_share=settings.quorum_stake_share,
            quorum_min_validators=settings.quorum_min_validators,
        )


@dataclass(frozen=True)
class Authenticated:
    """A request whose ``btauth/1`` signature verified, and what is checked before its work runs:
    ``authorize`` (the chain: registered, validator permit; raises 403), then, first in the work's
    transaction, that ``nonce_ns`` is new for ``hotkey`` (else 401, a replay) and, with ``miner``
    set, that ``client_ip`` is not banned (403)."""

    hotkey: str
    nonce_ns: int
    client_ip: str
    miner: bool
    authorize: auth.Authorizer


# The statements every submission runs, compiled once and run on the DBAPI cursor (PreparedStatement:
# SQLAlchemy's execution machinery cost several times these statements on SQLite).
_SUBMISSIONS, _BANS = Submission.__table__, IpBan.__table__
_BANNED_WHERE = (_BANS.c.client_ip == bindparam("client_ip"), _BANS.c.banned_until > bindparam("now"))
_BANNED_UNTIL = PreparedStatement(select(func.max(_BANS.c.banned_until)).where(*_BANNED_WHERE))
_RECENT_WHERE = (_SUBMISSIONS.c.hotkey == bindparam("hotkey"), _SUBMISSIONS.c.submitted_at > bindparam("since"))
_RECENT_SUBMISSIONS = PreparedStatement(select(func.count(), func.min(_SUBMISSIONS.c.submitted_at))
                                        .where(*_RECENT_WHERE))
_SAME_SUBMISSION_WHERE = (
    _SUBMISSIONS.c.hotkey == bindparam("hotkey"), _SUBMISSIONS.c.state == "ready",
    _SUBMISSIONS.c.fork_url == bindparam("fork_url"), _SUBMISSIONS.c.commit_hash == bindparam("commit_hash"),
    _SUBMISSIONS.c.target_sequence_length == bindparam("target_sequence_length"),
)
_SAME_SUBMISSION = PreparedStatement(select(_SUBMISSIONS.c.id).where(*_SAME_SUBMISSION_WHERE).limit(1))
# Another hotkey's submission of the same commit, made ready earlier: a copy (quasar/originality.py).
# (Made ready: every state but committed; a superseded one was ready, and its commit is its miner's.)
_COPIED_WHERE = (_SUBMISSIONS.c.commit_hash == bindparam("commit_hash"), _SUBMISSIONS.c.state != "committed",
                 _SUBMISSIONS.c.hotkey != bindparam("hotkey"))
_COPIED = PreparedStatement(select(_SUBMISSIONS.c.id, _SUBMISSIONS.c.hotkey).where(*_COPIED_WHERE)
                            .order_by(_SUBMISSIONS.c.id).limit(1))
_INSERT_SUBMISSION = PreparedStatement(insert(_SUBMISSIONS).returning(_SUBMISSIONS.c.id))
# A hotkey's ready submissions of the scheduled rounds, and whether any validator reported on each:
# what a newer one may supersede (quasar/scheduling.py).
_HOTKEY_READY_WHERE = (_SUBMISSIONS.c.hotkey == bindparam("hotkey"), _SUBMISSIONS.c.state == "ready",
                       _SUBMISSIONS.c.round_id >= bindparam("first_round"))
_REPORTS = EvaluationReport.__table__
_HOTKEY_READY = PreparedStatement(select(
    _SUBMISSIONS.c.id, _SUBMISSIONS.c.ready_at, _SUBMISSIONS.c.target_sequence_length,
    _SUBMISSIONS.c.claimed_tokens_per_sec, exists().where(_REPORTS.c.submission_id == _SUBMISSIONS.c.id).label("reported"),
).where(*_HOTKEY_READY_WHERE))
_LOCK_HOTKEY_READY = PreparedStatement(select(_SUBMISSIONS.c.id).where(*_HOTKEY_READY_WHERE)
                                       .order_by(_SUBMISSIONS.c.id).with_for_update())
_SUPERSEDE = PreparedStatement(update(_SUBMISSIONS).where(_SUBMISSIONS.c.id == bindparam("old_id"),
                                                          _SUBMISSIONS.c.state == "ready")
                               .values(state="superseded", superseded_by=bindparam("new_id")))


def _nonce_if_submission_allowed(dialect: str) -> PreparedStatement:
    """Record the caller's nonce only if its IP is not banned, the nonce is new, the hotkey is under
    its rate limit, the same submission is not ready already and no other hotkey submitted the
    commit: a direct submission's five checks in one statement (rowcount 1: all passed, the nonce
    is recorded; 0: nothing was written). On
    SQLite every statement lets go of the interpreter (the GIL) and waits to get it back while the
    process's write lock is held, so a submission's write holds that lock for a fraction of the
    time the checks take one by one (``_check_not_banned``, ``NonceLedger.record``,
    ``_enforce_rate_limit``, ``_SAME_SUBMISSION``, ``_COPIED``: the reference, which also names a refusal)."""
    recent = select(func.count()).select_from(_SUBMISSIONS).where(*_RECENT_WHERE).scalar_subquery()
    allowed = (select(bindparam("nonce_hotkey", type_=String()), bindparam("nonce", type_=BigInteger()))
               .where(~exists().where(*_BANNED_WHERE), recent < bindparam("limit"),
                      ~exists().where(*_SAME_SUBMISSION_WHERE), ~exists().where(*_COPIED_WHERE)))
    return PreparedStatement(dialect_insert(dialect, UsedNonce.__table__).from_select(["hotkey", "nonce"], allowed)
                             .on_conflict_do_nothing())


def _utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _benchmarks_to_json(benchmarks: Mapping[int, float] | None) -> dict[str, float] | None:
    return None if benchmarks is None else {str(length): float(tps) for length, tps in sorted(benchmarks.items())}


def _benchmarks_from_json(stored: Mapping[str, float] | None) -> dict[int, float] | None:
    return None if stored is None else {int(length): float(tps) for length, tps in stored.items()}


# What ranking reads of a submission and of a report (not their JSON figures and reasons, which
# cost most of reading them).
_RANKED_COLUMNS = (Submission.id, Submission.hotkey, Submission.submitted_at, Submission.target_sequence_length,
                   Submission.claimed_tokens_per_sec, Submission.commit_hash, Submission.round_id)
_REPORT_COLUMNS = (EvaluationReport.validator_hotkey, EvaluationReport.verdict, EvaluationReport.logits_ok,
                   EvaluationReport.measured_tokens_per_sec, EvaluationReport.content_hash)


def evaluated_submissions(session: Session, condition: ColumnElement[bool]) -> list[tuple[Any, list[consensus.Report]]]:
    """The revealed submissions matching ``condition`` that validators reported on (rows with the
    columns of ``_RANKED_COLUMNS``), each with its reports as the consensus reads them, in one query."""
    rows = session.execute(
        select(*_RANKED_COLUMNS, *_REPORT_COLUMNS)
        .join(EvaluationReport, EvaluationReport.submission_id == Submission.id)
        .where(condition, Submission.state == "ready")
    ).all()
    evaluated: dict[int, tuple[Any, list[consensus.Report]]] = {}
    width = len(_RANKED_COLUMNS)
    for row in rows:
        validator, verdict, logits_ok, measured, content_hash = row[width:]
        report = consensus.Report(validator, verdict == "passed", logits_ok, measured, content_hash)
        evaluated.setdefault(row.id, (row, []))[1].append(report)
    return list(evaluated.values())


def consensus_reports(reports: Sequence[EvaluationReport]) -> list[consensus.Report]:
    """Stored reports as the consensus reads them."""
    return [consensus.Report(r.validator_hotkey, r.verdict == "passed", r.logits_ok, r.measured_tokens_per_sec,
                             r.content_hash) for r in reports]


def ranked_result(submission: Any, view: consensus.Consensus) -> scoring.Result | None:
    """``submission`` (a Submission or a row of its ``_RANKED_COLUMNS``) as scoring ranks it once the
    validators' consensus passed it (the consensus figure, never the claim alone); None while it is
    not passed."""
    if view.state != consensus.PASSED:
        return None
    return scoring.Result(
        hotkey=submission.hotkey, submission_id=submission.id, submitted_at=submission.submitted_at,
        target_sequence_length=submission.target_sequence_length,
        claimed_tokens_per_sec=submission.claimed_tokens_per_sec,
        measured_tokens_per_sec=view.measured_tokens_per_sec or 0.0, correct=True, logits_ok=view.logits_ok)


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


def copies_among(session: Session, prints: Sequence[originality.Fingerprint], electorate: consensus.Electorate,
                 quorum: consensus.Quorum) -> dict[int, originality.CopyOf]:
    """Which of ``prints`` copy an earlier submission of another hotkey: compared with every
    earlier revealed submission of the same commit, or whose validators' consensus found the same
    kernel content."""
    if not prints:
        return {}
    newest = max(fingerprint.submission_id for fingerprint in prints)
    known = {fingerprint.submission_id for fingerprint in prints}
    commits = {fingerprint.commit_hash for fingerprint in prints if fingerprint.commit_hash is not None}
    contents = {fingerprint.content_hash for fingerprint in prints if fingerprint.content_hash is not None}
    earlier: list[originality.Fingerprint] = []
    if commits:
        rows = session.execute(select(Submission.id, Submission.hotkey, Submission.commit_hash).where(
            Submission.commit_hash.in_(commits), Submission.state != "committed", Submission.id < newest)).all()
        earlier += [originality.Fingerprint(row.id, row.hotkey, row.commit_hash, None)
                    for row in rows if row.id not in known]
    if contents:
        ids = set(session.scalars(select(EvaluationReport.submission_id).where(
            EvaluationReport.content_hash.in_(contents), EvaluationReport.submission_id < newest)))
        for submission, reports in evaluated_submissions(session, Submission.id.in_(ids - known)):
            view = consensus.decide(reports, electorate, quorum)
            earlier.append(originality.Fingerprint(submission.id, submission.hotkey, submission.commit_hash,
                                                   view.content_hash))
    found = originality.find_copies([*prints, *earlier])
    return {submission_id: copy for submission_id, copy in found.items() if submission_id in known}


def judge(session: Session, evaluated: Sequence[tuple[Any, list[consensus.Report]]],
          electorate: consensus.Electorate, quorum: consensus.Quorum) -> list[Judged]:
    """The consensus of each evaluated submission and whether it is a copy (one database read for
    the originals)."""
    views = {submission.id: consensus.decide(reports, electorate, quorum)
             for submission, reports in evaluated}
    prints = [originality.Fingerprint(submission.id, submission.hotkey, submission.commit_hash,
                                      views[submission.id].content_hash) for submission, _ in evaluated]
    copies = copies_among(session, prints, electorate, quorum)
    return [Judged(submission, reports, views[submission.id], copies.get(submission.id))
            for submission, reports in evaluated]


class SubmissionService:
    """The API's operations on one database and one chain."""

    def __init__(self, config: ApiConfig, chain: Chain, database: Database, clock: Callable[[], float] = time.time,
                 fused_checks: bool = True):
        """``fused_checks``: a signed direct submission's checks in one statement while they pass
        (see ``_nonce_if_submission_allowed``); False: one by one always (the reference)."""
        self.config = config
        self.chain = chain
        self.database = database
        self.clock = clock
        self.nonces = NonceLedger(database, NONCE_RETENTION_S, clock)
        self._nonce_if_submission_allowed = _nonce_if_submission_allowed(database.dialect) if fused_checks else None
        self.quorum = config.quorum
        # The newest leaderboards by (round, block), with the hotkeys found copying: the leaderboard
        # route and the work schedule's standing compute each once per block and process.
        self._leaderboards: dict[tuple[int, int], tuple[schemas.Leaderboard, frozenset[str]]] = {}
        self._leaderboards_lock = threading.Lock()

    # --- chain ---

    def validator_stakes(self) -> dict[str, float]:
        """The stake of each hotkey holding a validator permit now."""
        try:
            metagraph = self.chain.metagraph()
        except ChainError as error:
            raise ApiError(503, f"the chain is unavailable: {error}", {"Retry-After": "12"}) from None
        return {neuron.hotkey: neuron.stake for neuron in metagraph.neurons if neuron.validator_permit}

    def electorate(self) -> consensus.Electorate:
        """The validators whose reports count now, weighted by their stake (quasar/consensus.py)."""
        return consensus.Electorate.from_stakes(self.validator_stakes())

    def judge(self, session: Session, evaluated: Sequence[tuple[Any, list[consensus.Report]]],
              electorate: consensus.Electorate) -> list[Judged]:
        return judge(session, evaluated, electorate, self.quorum)

    def current_block(self) -> int:
        try:
            return self.chain.current_block()
        except ChainError as error:
            raise ApiError(503, f"the chain is unavailable: {error}", {"Retry-After": "12"}) from None

    def current_round(self) -> schemas.RoundInfo:
        block = self.current_block()
        current = rules.round_of_block(block, self.config.round_blocks)
        left = current.blocks_left(block)
        return schemas.RoundInfo(round_id=current.round_id, start_block=current.start_block,
                                 end_block=current.end_block, current_block=block, blocks_left=left,
                                 seconds_left_estimate=left * self.chain.block_time_s)

    # --- input rules shared with the validator ---

    def _fork(self, fork_url: str, commit_hash: str) -> tuple[str, str]:
        try:
            url = normalize_fork_url(fork_url, allow_local=self.config.allow_local_forks)
        except ForkError as error:
            raise ApiError(422, f"fork_url: {error}") from None
        try:
            commit = validate_commit_hash(commit_hash)
        except ForkError as error:
            raise ApiError(422, f"commit_hash: {error}") from None
        return url, commit

    # --- bans and rate limits ---

    def _check_not_banned(self, session: Session, client_ip: str, now: float) -> None:
        until = _BANNED_UNTIL.scalar(session.connection(), {"client_ip": client_ip, "now": now})
        if until is not None:
            raise ApiError(403, f"IP {client_ip} is banned until {_utc(until)} after {rules.BAN_FAILURES} failed "
                                f"validations within 24 h", {"Retry-After": str(int(until - now) + 1)})

    def _write(self, work: Callable[[Session], T], caller: Authenticated | None, locks: Sequence[str] = (),
               fused: Callable[[Session], T | None] | None = None) -> T:
        """``work`` in one write transaction, after ``caller``'s checks (see :class:`Authenticated`).
        A request that ``work`` refuses still uses up its nonce (recorded then in a transaction of
        its own); a banned IP's does not. ``fused``: the same checks and work in fewer statements,
        tried first; it returns None, having written nothing, when a check fails, and then the
        checks and ``work`` run one by one (which raise the refusal)."""
        if caller is None:
            return self.database.write(work, locks=locks)
        caller.authorize(caller.hotkey)
        checked = False

        def guarded(session: Session) -> T:
            nonlocal checked
            if fused is not None and (result := fused(session)) is not None:
                return result
            if caller.miner:
                self._check_not_banned(session, caller.client_ip, self.clock())
            if not self.nonces.record(session, caller.hotkey, caller.nonce_ns):
                raise auth.AuthFailure(401, "authentication failed: this nonce was already accepted from this hotkey")
            checked = True
            return work(session)

        try:
            return self.database.write(guarded, locks=locks)
        except ApiError:
            if checked:
                self.database.write(lambda session: self.nonces.record(session, caller.hotkey, caller.nonce_ns))
            raise

    def _enforce_rate_limit(self, session: Session, hotkey: str, now: float) -> None:
        count, oldest = _RECENT_SUBMISSIONS.run(
            session.connection(), {"hotkey": hotkey, "since": now - RATE_WINDOW_S}).fetchone()
        if count >= self.config.submissions_per_hour:
            wait = int(oldest + RATE_WINDOW_S - now) + 1
            raise ApiError(429, f"rate limit: at most {self.config.submissions_per_hour} submissions per hour per "
                                f"hotkey; the next is allowed in {wait} s", {"Retry-After": str(wait)})

    def _record_failure(self, session: Session, client_ip: str, now: float, kind: str, reason: str,
                        submission_id: int | None, dedupe_key: str | None = None) -> bool:
        """Charge a failed validation to ``client_ip``; ban it at the fifth inside 24 h. False if a
        failure with ``dedupe_key`` was already charged."""
        self.database.lock(session, f"ip:{client_ip}")  # the count below must see every earlier failure
        if dedupe_key is not None and session.scalar(
                select(exists().where(ValidationFailure.dedupe_key == dedupe_key))):
            return False
        session.add(ValidationFailure(client_ip=client_ip, failed_at=now, submission_id=submission_id, kind=kind,
                                      reason=reason[:MAX_REASON_STORED], dedupe_key=dedupe_key))
        session.flush()
        failures = session.scalar(
            select(func.count()).select_from(ValidationFailure)
            .where(ValidationFailure.client_ip == client_ip, ValidationFailure.failed_at > now - rules.BAN_WINDOW_S)
        )
        banned = session.scalar(select(exists().where(IpBan.client_ip == client_ip, IpBan.banned_until > now)))
        if failures >= rules.BAN_FAILURES and not banned:
            session.add(IpBan(client_ip=client_ip, banned_at=now, banned_until=now + rules.BAN_DURATION_S,
                              reason=f"{failures} failed validations within 24 h"))
            logger.warning("banned IP %s for 24 h after %d failed validations", client_ip, failures)
        return True

    # --- miners ---

    def submit_direct(self, hotkey: str, client_ip: str, request: schemas.SubmitKernelRequest,
                      caller: Authenticated | None = None) -> schemas.SubmissionAccepted:
        url, commit = self._fork(request.fork_url, request.commit_hash)
        block = self.current_block()
        now = self.clock()
        round_id = rules.round_of_block(block, self.config.round_blocks).round_id

        same = {"hotkey": hotkey, "fork_url": url, "commit_hash": commit,
                "target_sequence_length": request.target_sequence_length}

        def work(session: Session) -> schemas.SubmissionAccepted:
            self._enforce_rate_limit(session, hotkey, now)
            duplicate = _SAME_SUBMISSION.scalar(session.connection(), same)
            if duplicate is not None:
                raise ApiError(409, f"this fork, commit and target length were already submitted as submission "
                                    f"{duplicate}")
            self._refuse_copy(session, hotkey, commit)
            return insert(session)

        def fused(session: Session) -> schemas.SubmissionAccepted | None:
            recorded = self._nonce_if_submission_allowed.run(session.connection(), {
                **same, "client_ip": caller.client_ip, "now": self.clock(), "nonce_hotkey": caller.hotkey,
                "nonce": caller.nonce_ns, "since": now - RATE_WINDOW_S, "limit": self.config.submissions_per_hour})
            if recorded.rowcount != 1:
                return None
            # After the insert, unlike NonceLedger.record: a fresh nonce is never pruned, and a
            # refused request prunes nothing here (the checks one by one then prune, as ever).
            self.nonces.prune_if_due(session)
            return insert(session)

        def insert(session: Session) -> schemas.SubmissionAccepted:
            submission_id = _INSERT_SUBMISSION.scalar(session.connection(), {
                "hotkey": hotkey, "method": "direct", "state": "ready", "commitment_hash": None,
                "target_sequence_length": request.target_sequence_length, "submitted_at": now,
                "submitted_block": block, "ready_at": now, "ready_block": block, "round_id": round_id,
                "fork_url": url, "commit_hash": commit, "claimed_tokens_per_sec": request.tokens_per_sec,
                "vram_mb": request.vram_mb, "benchmarks": _benchmarks_to_json(request.benchmarks),
                "client_ip": client_ip})
            self._supersede_older(session, hotkey, round_id)
            return schemas.SubmissionAccepted(submission_id=submission_id, hotkey=hotkey, state="ready",
                                              submitted_at=now, submitted_block=block, round_id=round_id)

        use_fused = caller is not None and caller.miner and self._nonce_if_submission_allowed is not None
        accepted = self._write(work, caller, locks=[f"hotkey:{hotkey}"], fused=fused if use_fused else None)
        logger.info("submission %d from %s (%s) direct, round %d", accepted.submission_id, hotkey, client_ip, round_id)
        return accepted

    @staticmethod
    def _refuse_copy(session: Session, hotkey: str, commit: str, before_id: int | None = None) -> None:
        """Refuse (409) a commit that another hotkey made ready earlier (before ``before_id``, when
        given): a copy (quasar/originality.py)."""
        original = _COPIED.run(session.connection(), {"commit_hash": commit, "hotkey": hotkey}).fetchone()
        if original is not None and (before_id is None or original[0] < before_id):
            raise ApiError(409, f"commit {commit} was submitted first by another hotkey ({original[1]}, "
                                f"submission {original[0]}): a copy is not accepted")

    @staticmethod
    def _accepted(submission: Submission) -> schemas.SubmissionAccepted:
        return schemas.SubmissionAccepted(
            submission_id=submission.id, hotkey=submission.hotkey, state=submission.state,
            submitted_at=submission.submitted_at, submitted_block=submission.submitted_block,
            round_id=submission.round_id,
        )

    def _window(self, commit_block: int) -> rules.RevealWindow:
        return rules.reveal_window(commit_block, self.config.blocks_until_reveal, self.config.reveal_window_blocks)

    def commit(self, hotkey: str, client_ip: str, request: schemas.CommitRequest,
               caller: Authenticated | None = None) -> schemas.CommitAccepted:
        block = self.current_block()
        now = self.clock()

        def work(session: Session) -> int:
            self._enforce_rate_limit(session, hotkey, now)
            submission = Submission(
                hotkey=hotkey, method="commit_reveal", state="committed", commitment_hash=request.commitment_hash,
                target_sequence_length=request.target_sequence_length, submitted_at=now, submitted_block=block,
                client_ip=client_ip,
            )
            session.add(submission)
            session.flush()
            return submission.id

        submission_id = self._write(work, caller, locks=[f"hotkey:{hotkey}"])
        window = self._window(block)
        logger.info("commitment %d from %s (%s) at block %d", submission_id, hotkey, client_ip, block)
        return schemas.CommitAccepted(submission_id=submission_id, hotkey=hotkey, commit_block=block,
                                      reveal_from_block=window.opens, reveal_until_block=window.closes,
                                      submitted_at=now)

    def reveal(self, hotkey: str, client_ip: str, request: schemas.RevealRequest,
               caller: Authenticated | None = None) -> schemas.SubmissionAccepted:
        block = self.current_block()
        now = self.clock()
        round_id = rules.round_of_block(block, self.config.round_blocks).round_id
        mismatch: list[str] = []

        def work(session: Session) -> schemas.SubmissionAccepted | None:
            submission = session.get(Submission, request.submission_id, with_for_update=True)
            if submission is None or submission.hotkey != hotkey or submission.method != "commit_reveal":
                raise ApiError(404, f"no commitment {request.submission_id} from hotkey {hotkey}")
            if submission.state != "committed":
                raise ApiError(409, f"commitment {submission.id} was already revealed")
            window = self._window(submission.submitted_block)
            state = window.state(block)
            if state == "waiting":
                raise ApiError(409, f"too early: commitment {submission.id} can be revealed from block "
                                    f"{window.opens}; the chain is at block {block}")
            if state == "expired":
                raise ApiError(409, f"the reveal window of commitment {submission.id} closed at block "
                                    f"{window.closes}; the chain is at block {block}")
            url, commit = self._fork(request.fork_url, request.commit_hash)
            digest = rules.commitment_hash(request.commitment_salt, request.fork_url, request.commit_hash)
            if digest != submission.commitment_hash:
                mismatch.append(f"reveal does not match commitment {submission.id}: sha256(salt + fork_url + "
                                f"commit_hash) is {digest}, the commitment is {submission.commitment_hash}")
                return None
            # A commitment made before another hotkey's submission of the same commit is the original.
            self._refuse_copy(session, hotkey, commit, before_id=submission.id)
            submission.state = "ready"
            submission.fork_url, submission.commit_hash = url, commit
            submission.claimed_tokens_per_sec = request.tokens_per_sec
            submission.vram_mb = request.vram_mb
            submission.benchmarks = _benchmarks_to_json(request.benchmarks)
            submission.ready_at, submission.ready_block, submission.round_id = now, block, round_id
            submission.client_ip = client_ip
            session.flush()
            self._supersede_older(session, hotkey, round_id)
            return self._accepted(submission)

        accepted = self._write(work, caller, locks=[f"hotkey:{hotkey}"])
        if accepted is None:
            self.database.write(lambda session: self._record_failure(
                session, client_ip, now, "reveal_mismatch", mismatch[-1], request.submission_id))
            raise ApiError(400, f"{mismatch[-1]}; counted as a failed validation")
        logger.info("commitment %d revealed by %s, round %d", accepted.submission_id, hotkey, round_id)
        return accepted

    def pending_reveals(self, hotkey: str | None, limit: int) -> schemas.PendingReveals:
        """Commitments not revealed yet whose window has not closed (oldest first)."""
        block = self.current_block()
        oldest_open = block - (self.config.blocks_until_reveal + self.config.reveal_window_blocks - 1)
        query = select(Submission).where(Submission.state == "committed", Submission.submitted_block >= oldest_open)
        if hotkey is not None:
            query = query.where(Submission.hotkey == hotkey)
        with self.database.read() as session:
            rows = session.scalars(query.order_by(Submission.id).limit(limit)).all()
        pending = []
        for row in rows:
            window = self._window(row.submitted_block)
            pending.append(schemas.PendingReveal(
                submission_id=row.id, hotkey=row.hotkey, commitment_hash=row.commitment_hash,
                target_sequence_length=row.target_sequence_length, commit_block=row.submitted_block,
                reveal_from_block=window.opens, reveal_until_block=window.closes, state=window.state(block)))
        return schemas.PendingReveals(current_block=block, pending=pending)

    def stats(self, hotkey: str | None) -> schemas.SubmissionStats:
        block = self.current_block()
        round_id = rules.round_of_block(block, self.config.round_blocks).round_id
        oldest_open = block - (self.config.blocks_until_reveal + self.config.reveal_window_blocks - 1)
        committed = Submission.state == "committed"
        with self.database.read() as session:
            def count(*where) -> int:
                return session.scalar(select(func.count()).select_from(Submission).where(*where))

            stats = schemas.SubmissionStats(
                current_block=block, current_round=round_id,
                submissions=count(), ready=count(Submission.state == "ready"),
                awaiting_reveal=count(committed, Submission.submitted_block >= oldest_open),
                expired_commitments=count(committed, Submission.submitted_block < oldest_open),
                hotkeys=session.scalar(select(func.count(func.distinct(Submission.hotkey)))),
                reports=session.scalar(select(func.count()).select_from(EvaluationReport)),
                submissions_this_round=count(Submission.round_id == round_id),
            )
            if hotkey is not None:
                stats.hotkey = hotkey
                stats.hotkey_submissions = count(Submission.hotkey == hotkey)
        return stats

    # --- validators ---

    def first_scheduled_round(self, round_id: int) -> int:
        """The oldest round whose submissions are still handed out while round ``round_id`` runs."""
        return max(0, round_id - SCHEDULED_ROUNDS + 1)

    def standing(self, round_id: int) -> scheduling.Standing:
        """Round ``round_id`` as the schedule's rule 2 reads it now: its fourth place's score and
        the hotkeys found copying in it (quasar/scheduling.py)."""
        board, copiers = self._judged_board(round_id)
        return scheduling.Standing(scheduling.fourth_place(entry.weighted_score for entry in board.entries), copiers)

    def fetch_work(self, validator: str, limit: int, caller: Authenticated | None = None) -> schemas.WorkBatch:
        """Up to ``limit`` submissions for this validator, by the schedule's rules (quasar/scheduling.py),
        each leased to it for ``evaluation_lease_s``: ready submissions of the scheduled rounds (a
        superseded one is not ready) that it has neither reported on nor holds."""
        now = self.clock()
        lease_s = self.config.evaluation_lease_s
        round_id = rules.round_of_block(self.current_block(), self.config.round_blocks).round_id
        standing = self.standing(round_id)

        def work(session: Session) -> list[schemas.WorkItem]:
            mine = exists().where(EvaluationReport.submission_id == Submission.id,
                                  EvaluationReport.validator_hotkey == validator)
            held = exists().where(
                EvaluationLease.submission_id == Submission.id, EvaluationLease.validator_hotkey == validator,
                (EvaluationLease.leased_until > now) | (EvaluationLease.fetch_count >= MAX_FETCHES_PER_VALIDATOR))
            rows = session.execute(
                select(Submission.id, Submission.hotkey, Submission.ready_at, Submission.target_sequence_length,
                       Submission.claimed_tokens_per_sec)
                .where(Submission.state == "ready", Submission.round_id >= self.first_scheduled_round(round_id),
                       ~mine, ~held)
            ).all()
            candidates = [scheduling.Queued(row.id, row.hotkey, row.ready_at, row.target_sequence_length,
                                            row.claimed_tokens_per_sec, reported=False) for row in rows]
            taken = dict(session.execute(
                select(Submission.hotkey, func.count())
                .select_from(EvaluationLease).join(Submission, Submission.id == EvaluationLease.submission_id)
                .where(EvaluationLease.validator_hotkey == validator, EvaluationLease.first_round == round_id)
                .group_by(Submission.hotkey)).all())
            chosen = scheduling.order_work(candidates, taken, standing, limit)
            items = []
            for pick in chosen:
                row = session.get(Submission, pick.submission_id)
                lease = session.get(EvaluationLease, (row.id, validator))
                if lease is None:
                    session.add(EvaluationLease(submission_id=row.id, validator_hotkey=validator,
                                                leased_until=now + lease_s, fetch_count=1, first_round=round_id))
                else:
                    lease.leased_until = now + lease_s
                    lease.fetch_count += 1
                items.append(schemas.WorkItem(
                    submission_id=row.id, hotkey=row.hotkey, fork_url=row.fork_url, commit_hash=row.commit_hash,
                    target_sequence_length=row.target_sequence_length,
                    claimed_tokens_per_sec=row.claimed_tokens_per_sec, vram_mb=row.vram_mb,
                    benchmarks=_benchmarks_from_json(row.benchmarks), submitted_at=row.submitted_at,
                    round_id=row.round_id, lease_expires_at=now + lease_s))
            return items

        return schemas.WorkBatch(items=self._write(work, caller, locks=[f"validator:{validator}"]),
                                 lease_seconds=lease_s)

    def _supersede_older(self, session: Session, hotkey: str, round_id: int) -> None:
        """Supersede ``hotkey``'s older ready submissions that no validator reported on, one of its
        submissions having just become ready (the rule of quasar/scheduling.py). On PostgreSQL their
        rows are locked first and then read afresh: a report being stored meanwhile (it locks its
        submission's row) is then seen, and keeps its submission."""
        params = {"hotkey": hotkey, "first_round": self.first_scheduled_round(round_id)}
        connection = session.connection()
        if self.database.dialect == "postgresql":
            _LOCK_HOTKEY_READY.run(connection, params)
        rows = _HOTKEY_READY.run(connection, params).fetchall()
        queued = [scheduling.Queued(row[0], hotkey, row[1], row[2], row[3], bool(row[4])) for row in rows]
        for old, new in scheduling.superseded(queued).items():
            _SUPERSEDE.run(connection, {"old_id": old, "new_id": new})

    def report(self, validator: str, request: schemas.ReportRequest,
               caller: Authenticated | None = None) -> schemas.ReportAccepted:
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
                raise ApiError(409, f"submission {submission.id} was superseded by submission "
                                    f"{submission.superseded_by} of the same hotkey before any validator "
                                    f"reported on it: it is not evaluated")
            if submission is None or submission.state != "ready":
                raise ApiError(404, f"no submission {request.submission_id} ready for evaluation")
            if session.get(EvaluationLease, (submission.id, validator)) is None:
                raise ApiError(409, f"submission {submission.id} was never fetched by this validator "
                                    f"(GET /validator/pending first)")
            if session.scalar(select(exists().where(EvaluationReport.submission_id == submission.id,
                                                    EvaluationReport.validator_hotkey == validator))):
                raise ApiError(409, f"this validator already reported on submission {submission.id}")
            floor = scoring.CLAIM_FACTOR * submission.claimed_tokens_per_sec
            if request.verdict == "passed" and request.measured_tokens_per_sec < floor:
                raise ApiError(422, f"verdict 'passed' contradicts measured_tokens_per_sec "
                                    f"{request.measured_tokens_per_sec:g} < {scoring.CLAIM_FACTOR} x the claim "
                                    f"{submission.claimed_tokens_per_sec:g}")
            report = EvaluationReport(
                submission_id=submission.id, validator_hotkey=validator, reported_at=now, verdict=request.verdict,
                correct=request.correct, logits_ok=request.logits_ok,
                measured_tokens_per_sec=request.measured_tokens_per_sec,
                benchmarks=_benchmarks_to_json(request.benchmarks), reasons=list(request.reasons),
                lengths=None if request.lengths is None else [item.model_dump() for item in request.lengths],
                content_hash=request.content_hash,
            )
            session.add(report)
            session.flush()
            reports = session.scalars(select(EvaluationReport).where(
                EvaluationReport.submission_id == submission.id)).all()
            view = consensus.decide(consensus_reports(reports), electorate, self.quorum)
            counted = False
            if view.state == consensus.FAILED:
                given = dict.fromkeys(reason for r in reports if r.verdict == "failed" for reason in r.reasons)
                reason = "; ".join([view.reason, *given])
                counted = self._record_failure(session, submission.client_ip, now, "evaluation", reason,
                                               submission.id, dedupe_key=f"evaluation:{submission.id}")
            return schemas.ReportAccepted(report_id=report.id, submission_id=submission.id, failure_counted=counted)

        try:
            accepted = self._write(work, caller)
        except IntegrityError:
            raise ApiError(409, f"this validator already reported on submission {request.submission_id}") from None
        logger.info("report on submission %d by %s: %s", request.submission_id, validator, request.verdict)
        return accepted

    # --- leaderboard ---

    def _round(self, round_id: int | None) -> int:
        if round_id is None:
            return rules.round_of_block(self.current_block(), self.config.round_blocks).round_id
        return round_id

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
        return self._judged_board(round_id)[0]

    def _judged_board(self, round_id: int | None) -> tuple[schemas.Leaderboard, frozenset[str]]:
        """The leaderboard of round ``round_id`` (default: the current one) and the hotkeys found
        copying in it, computed once per block and process."""
        block = self.current_block()
        round_id = rules.round_of_block(block, self.config.round_blocks).round_id if round_id is None else round_id
        with self._leaderboards_lock:
            kept = self._leaderboards.get((round_id, block))
        if kept is not None:
            return kept
        judged, electorate = self.judged_round(round_id)
        ranked = (self._ranked(round_id, judged, electorate),
                  frozenset(item.submission.hotkey for item in judged if item.copy_of is not None))
        with self._leaderboards_lock:
            self._leaderboards = {key: value for key, value in self._leaderboards.items() if key[1] == block}
            self._leaderboards[(round_id, block)] = ranked
        return ranked

    def _ranked(self, round_id: int, judged: list[Judged], electorate: consensus.Electorate) -> schemas.Leaderboard:
        results = {item.submission.id: item for item in judged if item.result is not None}
        ranking = scoring.rank([item.result for item in results.values()], epsilon=self.config.tie_epsilon)
        entries = []
        for placement in ranking.placements:
            result, league = placement.result, scoring.league_for(placement.result.target_sequence_length)
            view = results[result.submission_id].consensus
            entries.append(schemas.LeaderboardEntry(
                place=placement.place, hotkey=result.hotkey, submission_id=result.submission_id,
                league=league.name, multiplier=league.multiplier,
                target_sequence_length=result.target_sequence_length,
                claimed_tokens_per_sec=result.claimed_tokens_per_sec,
                measured_tokens_per_sec=result.measured_tokens_per_sec,
                weighted_score=placement.weighted_score, share=placement.share,
                validators=view.reported, reported_stake_share=view.reported_share, submitted_at=result.submitted_at))
        not_ranked = []
        for item in sorted(judged, key=lambda item: -item.submission.id):
            view, copy = item.consensus, item.copy_of
            if copy is not None and view.state != consensus.FAILED:
                state, reason = "copy", copy.reason
            elif not view.settled:
                state, reason = view.state, view.reason
            else:
                continue
            not_ranked.append(schemas.NotRanked(
                submission_id=item.submission.id, hotkey=item.submission.hotkey, state=state, reason=reason,
                validators_reported=view.reported, reported_stake_share=view.reported_share))
        counts = {state: sum(1 for item in judged if item.consensus.state == state)
                  for state in (consensus.AWAITING_QUORUM, consensus.DISPUTED, consensus.FAILED)}
        return schemas.Leaderboard(
            round_id=round_id, epsilon=ranking.epsilon, entries=entries, unassigned=ranking.unassigned,
            evaluated_submissions=len(judged), quorum_stake_share=self.quorum.stake_share,
            quorum_min_validators=self.quorum.min_validators, validators=len(electorate),
            awaiting_quorum=counts[consensus.AWAITING_QUORUM], disputed=counts[consensus.DISPUTED],
            failed=counts[consensus.FAILED],
            copies=sum(1 for item in not_ranked if item.state == "copy"),
            not_ranked=not_ranked[:schemas.MAX_NOT_RANKED_SHOWN])

    def validator_reports(self, validator: str, after_id: int, limit: int) -> schemas.ValidatorReports:
        """``validator``'s reports with an id above ``after_id``, oldest first, at most ``limit``, each
        with its submission: what its other processes reported (quasar/validator/loop.py)."""
        with self.database.read() as session:
            rows = session.execute(
                select(EvaluationReport, Submission).join(Submission, Submission.id == EvaluationReport.submission_id)
                .where(EvaluationReport.validator_hotkey == validator, EvaluationReport.id > after_id)
                .order_by(EvaluationReport.id).limit(limit)).all()
        return schemas.ValidatorReports(validator_hotkey=validator, reports=[schemas.ReportedWork(
            report_id=report.id, submission_id=submission.id, hotkey=submission.hotkey, fork_url=submission.fork_url,
            commit_hash=submission.commit_hash, target_sequence_length=submission.target_sequence_length,
            claimed_tokens_per_sec=submission.claimed_tokens_per_sec, submitted_at=submission.submitted_at,
            round_id=submission.round_id, verdict=report.verdict, correct=report.correct, logits_ok=report.logits_ok,
            measured_tokens_per_sec=report.measured_tokens_per_sec, benchmarks=_benchmarks_from_json(report.benchmarks),
            reasons=list(report.reasons), content_hash=report.content_hash, reported_at=report.reported_at)
            for report, submission in rows])

    def validator_agreement(self, round_id: int | None) -> schemas.ValidatorAgreements:
        """Per validator: its reports on round ``round_id``'s submissions (default: the current round)
        against the validators' settled consensus, and its weight in the consensus now."""
        round_id = self._round(round_id)
        judged, electorate = self.judged_round(round_id)
        agreements = {item.validator_hotkey: item for item in consensus.agreement(
            (item.consensus, item.reports) for item in judged)}
        reports: dict[str, int] = {}
        for item in judged:
            for report in item.reports:
                reports[report.validator_hotkey] = reports.get(report.validator_hotkey, 0) + 1
        stakes = self.validator_stakes()
        total = electorate.total
        validators = []
        for hotkey in sorted(set(electorate.weights) | set(reports),
                             key=lambda hotkey: (-electorate.weight(hotkey), hotkey)):
            found = agreements.get(hotkey)
            validators.append(schemas.ValidatorAgreement(
                validator_hotkey=hotkey, stake=stakes.get(hotkey),
                stake_share=electorate.weight(hotkey) / total if total else 0.0, reports=reports.get(hotkey, 0),
                judged=found.judged if found else 0, agreed=found.agreed if found else 0,
                disagreed=found.disagreed if found else 0, agreement=found.share if found else None,
                median_deviation=found.median_deviation if found else None))
        return schemas.ValidatorAgreements(round_id=round_id, validators=validators)
