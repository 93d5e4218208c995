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

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypeVar

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    String,
    bindparam,
    exists,
    func,
    insert,
    select,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from quasar import auth, scoring
from quasar.api import rules, schemas
from quasar.api.db import (
    Database,
    EvaluationLease,
    EvaluationReport,
    IpBan,
    NonceLedger,
    PreparedStatement,
    Submission,
    UsedNonce,
    ValidationFailure,
    dialect_insert,
)
from quasar.chain import Chain, ChainError
from quasar.config import Settings
from quasar.errors import QuasarError
from quasar.forks import ForkError, normalize_fork_url, validate_commit_hash

logger = logging.getLogger(__name__)

T = TypeVar("T")

RATE_WINDOW_S = 3600.0
# A validator that fetched a submission this many times without reporting is not handed it again
# (a submission that crashes the validator must not be re-fetched forever).
MAX_FETCHES_PER_VALIDATOR = 3
MAX_REASON_STORED = 2000
# Nonces are kept a little longer than the freshness window that btauth/1 verification enforces.
NONCE_RETENTION_S = 2 * (auth.MAX_REQUEST_AGE_S + auth.ALLOWED_CLOCK_SKEW_S)


class ApiError(QuasarError):
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

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiConfig:
        """Local fork paths are accepted only on the dev chain, or where ALLOW_LOCAL_FORKS says so (docs/rules.md §3)."""
        return cls(
            api_hotkey=settings.api_hotkey,
            blocks_until_reveal=settings.blocks_until_reveal,
            reveal_window_blocks=settings.reveal_window_blocks,
            round_blocks=settings.round_blocks,
            submissions_per_hour=settings.submissions_per_hour,
            evaluation_lease_s=settings.evaluation_lease_s,
            trusted_proxies=settings.trusted_proxies,
            allow_local_forks=settings.local_forks_allowed,
            tie_epsilon=settings.tie_epsilon,
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
_INSERT_SUBMISSION = PreparedStatement(insert(_SUBMISSIONS).returning(_SUBMISSIONS.c.id))


def _nonce_if_submission_allowed(dialect: str) -> PreparedStatement:
    """Record the caller's nonce only if its IP is not banned, the nonce is new, the hotkey is under
    its rate limit and the same submission is not ready already: a direct submission's four checks
    in one statement (rowcount 1: all passed, the nonce is recorded; 0: nothing was written). On
    SQLite every statement lets go of the interpreter (the GIL) and waits to get it back while the
    process's write lock is held, so a submission's write holds that lock for a fraction of the
    time the checks take one by one (``_check_not_banned``, ``NonceLedger.record``,
    ``_enforce_rate_limit``, ``_SAME_SUBMISSION``: the reference, which also names a refusal)."""
    recent = select(func.count()).select_from(_SUBMISSIONS).where(*_RECENT_WHERE).scalar_subquery()
    allowed = (select(bindparam("nonce_hotkey", type_=String()), bindparam("nonce", type_=BigInteger()))
               .where(~exists().where(*_BANNED_WHERE), recent < bindparam("limit"),
                      ~exists().where(*_SAME_SUBMISSION_WHERE)))
    return PreparedStatement(dialect_insert(dialect, UsedNonce.__table__).from_select(["hotkey", "nonce"], allowed)
                             .on_conflict_do_nothing())


def _utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _benchmarks_to_json(benchmarks: Mapping[int, float] | None) -> dict[str, float] | None:
    return None if benchmarks is None else {str(length): float(tps) for length, tps in sorted(benchmarks.items())}


def _benchmarks_from_json(stored: Mapping[str, float] | None) -> dict[int, float] | None:
    return None if stored is None else {int(length): float(tps) for length, tps in stored.items()}


def evaluated_submissions(session: Session,
                          condition: ColumnElement[bool]) -> list[tuple[Submission, list[EvaluationReport]]]:
    """The revealed submissions matching ``condition`` that validators reported on, each with its
    reports, in one query."""
    rows = session.execute(
        select(Submission, EvaluationReport)
        .join(EvaluationReport, EvaluationReport.submission_id == Submission.id)
        .where(condition, Submission.state == "ready")
    ).all()
    evaluated: dict[int, tuple[Submission, list[EvaluationReport]]] = {}
    for submission, report in rows:
        evaluated.setdefault(submission.id, (submission, []))[1].append(report)
    return list(evaluated.values())


def consensus_result(submission: Submission,
                     reports: Sequence[EvaluationReport]) -> tuple[scoring.Result, rules.Consensus]:
    """The validators' combined view of ``submission`` (at least one report) and its result as
    scoring ranks it: measured figures from the consensus, never the claim alone."""
    view = rules.consensus([rules.ValidatorReport(r.validator_hotkey, r.correct, r.logits_ok,
                                                  r.measured_tokens_per_sec) for r in reports])
    result = scoring.Result(
        hotkey=submission.hotkey, submission_id=submission.id, submitted_at=submission.submitted_at,
        target_sequence_length=submission.target_sequence_length,
        claimed_tokens_per_sec=submission.claimed_tokens_per_sec,
        measured_tokens_per_sec=view.measured_tokens_per_sec, correct=view.correct, logits_ok=view.logits_ok)
    return result, view


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

    # --- chain ---

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
            return schemas.SubmissionAccepted(submission_id=submission_id, hotkey=hotkey, state="ready",
                                              submitted_at=now, submitted_block=block, round_id=round_id)

        use_fused = caller is not None and caller.miner and self._nonce_if_submission_allowed is not None
        accepted = self._write(work, caller, locks=[f"hotkey:{hotkey}"], fused=fused if use_fused else None)
        logger.info("submission %d from %s (%s) direct, round %d", accepted.submission_id, hotkey, client_ip, round_id)
        return accepted

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
            submission.state = "ready"
            submission.fork_url, submission.commit_hash = url, commit
            submission.claimed_tokens_per_sec = request.tokens_per_sec
            submission.vram_mb = request.vram_mb
            submission.benchmarks = _benchmarks_to_json(request.benchmarks)
            submission.ready_at, submission.ready_block, submission.round_id = now, block, round_id
            submission.client_ip = client_ip
            session.flush()
            return self._accepted(submission)

        accepted = self._write(work, caller)
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

    def fetch_work(self, validator: str, limit: int, caller: Authenticated | None = None) -> schemas.WorkBatch:
        """Up to ``limit`` ready submissions this validator has not reported on and does not hold,
        oldest first, each leased to it for ``evaluation_lease_s``."""
        now = self.clock()
        lease_s = self.config.evaluation_lease_s

        def work(session: Session) -> list[schemas.WorkItem]:
            reported = select(EvaluationReport.submission_id).where(EvaluationReport.validator_hotkey == validator)
            held = select(EvaluationLease.submission_id).where(
                EvaluationLease.validator_hotkey == validator,
                (EvaluationLease.leased_until > now) | (EvaluationLease.fetch_count >= MAX_FETCHES_PER_VALIDATOR),
            )
            rows = session.scalars(
                select(Submission)
                .where(Submission.state == "ready", Submission.id.not_in(reported), Submission.id.not_in(held))
                .order_by(Submission.ready_at, Submission.id).limit(limit)
            ).all()
            items = []
            for row in rows:
                lease = session.get(EvaluationLease, (row.id, validator))
                if lease is None:
                    session.add(EvaluationLease(submission_id=row.id, validator_hotkey=validator,
                                                leased_until=now + lease_s, fetch_count=1))
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

    def report(self, validator: str, request: schemas.ReportRequest,
               caller: Authenticated | None = None) -> schemas.ReportAccepted:
        if request.verdict == "passed" and (not request.correct or request.logits_ok is False):
            raise ApiError(422, "verdict 'passed' contradicts correct=false or logits_ok=false")
        now = self.clock()

        def work(session: Session) -> schemas.ReportAccepted:
            submission = session.get(Submission, request.submission_id)
            if submission is None or submission.state != "ready":
                raise ApiError(404, f"no submission {request.submission_id} ready for evaluation")
            if session.get(EvaluationLease, (submission.id, validator)) is None:
                raise ApiError(409, f"submission {submission.id} was never fetched by this validator "
                                    f"(GET /validator/pending first)")
            if session.scalar(select(exists().where(EvaluationReport.submission_id == submission.id,
                                                    EvaluationReport.validator_hotkey == validator))):
                raise ApiError(409, f"this validator already reported on submission {submission.id}")
            report = EvaluationReport(
                submission_id=submission.id, validator_hotkey=validator, reported_at=now, verdict=request.verdict,
                correct=request.correct, logits_ok=request.logits_ok,
                measured_tokens_per_sec=request.measured_tokens_per_sec,
                benchmarks=_benchmarks_to_json(request.benchmarks), reasons=list(request.reasons),
                lengths=None if request.lengths is None else [item.model_dump() for item in request.lengths],
            )
            session.add(report)
            session.flush()
            counted = False
            if request.verdict == "failed":
                reason = "; ".join(request.reasons) or "failed evaluation"
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

    def leaderboard(self, round_id: int | None) -> schemas.Leaderboard:
        """Round ``round_id`` (default: the current one) ranked by quasar.scoring from the validators'
        measured figures (never the claims): per submission, the consensus of its reports."""
        if round_id is None:
            round_id = rules.round_of_block(self.current_block(), self.config.round_blocks).round_id
        with self.database.read() as session:
            evaluated = evaluated_submissions(session, Submission.round_id == round_id)
        results, agreed = [], {}
        for submission, reports in evaluated:
            result, agreed[submission.id] = consensus_result(submission, reports)
            results.append(result)
        ranking = scoring.rank(results, epsilon=self.config.tie_epsilon)
        entries = []
        for placement in ranking.placements:
            result, league = placement.result, scoring.league_for(placement.result.target_sequence_length)
            entries.append(schemas.LeaderboardEntry(
                place=placement.place, hotkey=result.hotkey, submission_id=result.submission_id,
                league=league.name, multiplier=league.multiplier,
                target_sequence_length=result.target_sequence_length,
                claimed_tokens_per_sec=result.claimed_tokens_per_sec,
                measured_tokens_per_sec=result.measured_tokens_per_sec,
                weighted_score=placement.weighted_score, share=placement.share,
                validators=agreed[result.submission_id].validators, submitted_at=result.submitted_at))
        return schemas.Leaderboard(round_id=round_id, epsilon=ranking.epsilon, entries=entries,
                                   unassigned=ranking.unassigned, evaluated_submissions=len(results))
