"""The submission API's miners' side: direct submissions, commit-reveal, and their counts.

Who may submit, and when, is quasar/api/admission.py's rule; a submission that becomes ready
supersedes its hotkey's older ones (quasar/api/worklist.py, the rule of quasar/scheduling.py).
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from quasar.api import admission, rules, schemas
from quasar.api.db import EvaluationReport, PreparedStatement, Submission
from quasar.api.errors import ApiError
from quasar.api.servicecore import Authenticated, ServiceCore, benchmarks_to_json
from quasar.api.worklist import supersede_older
from quasar.log import Tally

logger = logging.getLogger(__name__)

# Both stamps in one prepared statement: a direct submission reads them in every write, beside
# admission's prepared checks (two ORM queries there cost PostgreSQL a third more per submission).
_NEWEST_STAMPS = PreparedStatement(
    select(
        select(Submission.submitted_at).order_by(Submission.id.desc()).limit(1).scalar_subquery(),
        select(func.max(Submission.ready_at)).where(Submission.state == "ready").scalar_subquery(),
    )
)


@dataclass(frozen=True)
class NewestStamps:
    """The time the API stamped the last submission it took with, and the newest ready one's ready
    time (None: none yet): what a submission taken or made ready now is stamped after."""

    submitted_at: float | None
    ready_at: float | None

    @classmethod
    def read(cls, session: Session) -> NewestStamps:
        """The stamps as ``session``'s transaction sees them."""
        submitted_at, ready_at = _NEWEST_STAMPS.run(session.connection(), {}).fetchone()
        return cls(submitted_at, ready_at)

    def submission_time(self, now: float) -> float:
        """The time a submission taken now is stamped with: ``now``, or the time of the one taken
        last where the API's clock has stepped back behind it (NTP, a VM resumed). Ties go to the
        earlier submission by this time (docs/rules.md section 5), so it never runs against the
        order the API took submissions in."""
        return now if self.submitted_at is None else max(now, self.submitted_at)

    def ready_time(self, now: float) -> float:
        """The time a submission made ready now is stamped with: ``now``, or just after the newest
        ready one's where the API's clock has stepped back behind it. A hotkey's newest ready
        submission supersedes its older ones, and the work schedule takes the oldest first, both by
        this time (docs/rules.md section 3), so it never runs against the order submissions became
        ready in (a tie would go to the higher id, which a reveal need not have)."""
        if self.ready_at is None or now > self.ready_at:
            return now
        return math.nextafter(self.ready_at, math.inf)


# The hotkeys that ever submitted, counted by walking the hotkey index from one to the next: a
# COUNT(DISTINCT hotkey) read every submission (78 ms of 1.84 M on SQLite; this 5 ms).
_WALK = select(func.min(Submission.hotkey).label("hotkey")).cte("walk", recursive=True)
_WALK = _WALK.union_all(
    select(select(func.min(Submission.hotkey)).where(Submission.hotkey > _WALK.c.hotkey).scalar_subquery()).where(
        _WALK.c.hotkey.is_not(None)
    )
)
_COUNT_HOTKEYS = select(func.count(_WALK.c.hotkey))


class Intake(ServiceCore):
    """Submissions and commitments: what miners send."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # The subnet's counts (GET /get_submission_stats) at the newest block they were asked at.
        self._block_stats: schemas.SubmissionStats | None = None
        self._block_stats_lock = threading.Lock()
        # Counted every REPEAT_EVERY_S, each at DEBUG: a full subnet sends about 2,500 an hour.
        self.submissions_said = Tally(logger, "submissions", clock=self.clock)

    def submit_direct(
        self, hotkey: str, client_ip: str, request: schemas.SubmitKernelRequest, caller: Authenticated | None = None
    ) -> schemas.SubmissionAccepted:
        url, commit = self._fork(request.fork_url, request.commit_hash)
        block = self.current_block()
        now = self.clock()
        round_id = rules.round_of_block(block, self.config.round_blocks).round_id
        electorate = self.electorate()  # whose reports keep an older submission (supersede_older)
        # The bind parameters of admission.SUBMISSION_CHECKS.
        params = {
            "client_ip": client_ip,
            "now": now,
            "hotkey": hotkey,
            "limit": self.config.submissions_per_hour,
            "fork_url": url,
            "commit_hash": commit,
            "target_sequence_length": request.target_sequence_length,
            "counts_from": admission.AFTER_EVERY_SUBMISSION,
            "before_id": admission.AFTER_EVERY_SUBMISSION,
            "blocks_until_reveal": self.config.blocks_until_reveal,
        }

        def work(session: Session) -> schemas.SubmissionAccepted:
            # The ban and the nonce were checked by _write, as for every signed miner request.
            for check in admission.SUBMISSION_CHECKS:
                if check is not admission.NOT_BANNED:
                    self._refuse(session, check, params)
            return insert(session)

        def fused(session: Session) -> schemas.SubmissionAccepted | None:
            assert caller is not None and self.fused_checks is not None
            recorded = self.fused_checks.run(
                session.connection(),
                {**params, "client_ip": caller.client_ip, "nonce_hotkey": caller.hotkey, "nonce": caller.nonce_ns},
            )
            if recorded.rowcount != 1:
                return None
            # After the insert, as NonceLedger.record prunes; a refused request prunes nothing here
            # (the checks one by one then prune, as ever).
            self.nonces.prune_if_due(session)
            return insert(session)

        def insert(session: Session) -> schemas.SubmissionAccepted:
            stamps = NewestStamps.read(session)
            stamped = stamps.submission_time(now)
            submission_id = admission.INSERT_SUBMISSION.scalar(
                session.connection(),
                {
                    "hotkey": hotkey,
                    "method": "direct",
                    "state": "ready",
                    "commitment_hash": None,
                    "target_sequence_length": request.target_sequence_length,
                    "submitted_at": stamped,
                    "submitted_block": block,
                    "ready_at": stamps.ready_time(stamped),
                    "ready_block": block,
                    "round_id": round_id,
                    "fork_url": url,
                    "commit_hash": commit,
                    "claimed_tokens_per_sec": request.tokens_per_sec,
                    "vram_mb": request.vram_mb,
                    "benchmarks": benchmarks_to_json(request.benchmarks),
                    "client_ip": client_ip,
                },
            )
            supersede_older(session, self.database.dialect, hotkey, round_id, electorate)
            return schemas.SubmissionAccepted(
                submission_id=submission_id,
                hotkey=hotkey,
                state="ready",
                submitted_at=stamped,
                submitted_block=block,
                round_id=round_id,
            )

        use_fused = caller is not None and caller.miner and self.fused_checks is not None
        # The commit too: two hotkeys submitting it at once would each miss the other's row (READ COMMITTED).
        locks = [f"hotkey:{hotkey}", f"commit:{commit}"]
        accepted = self._write(work, caller, locks=locks, fused=fused if use_fused else None)
        self.submissions_said.add(
            "direct",
            hotkey,
            f"submission {accepted.submission_id} from {hotkey} ({client_ip}) direct, round {round_id}",
        )
        return accepted

    def _window(self, commit_block: int) -> rules.RevealWindow:
        return rules.reveal_window(commit_block, self.config.blocks_until_reveal, self.config.reveal_window_blocks)

    def commit(
        self, hotkey: str, client_ip: str, request: schemas.CommitRequest, caller: Authenticated | None = None
    ) -> schemas.CommitAccepted:
        block = self.current_block()
        now = self.clock()

        def work(session: Session) -> tuple[int, float]:
            self._refuse(
                session,
                admission.UNDER_RATE_LIMIT,
                {"hotkey": hotkey, "now": now, "limit": self.config.submissions_per_hour},
            )
            submission = Submission(
                hotkey=hotkey,
                method="commit_reveal",
                state="committed",
                commitment_hash=request.commitment_hash,
                target_sequence_length=request.target_sequence_length,
                submitted_at=NewestStamps.read(session).submission_time(now),
                submitted_block=block,
                client_ip=client_ip,
            )
            session.add(submission)
            session.flush()
            return submission.id, submission.submitted_at

        submission_id, submitted_at = self._write(work, caller, locks=[f"hotkey:{hotkey}"])
        window = self._window(block)
        self.submissions_said.add(
            "commitments", hotkey, f"commitment {submission_id} from {hotkey} ({client_ip}) at block {block}"
        )
        return schemas.CommitAccepted(
            submission_id=submission_id,
            hotkey=hotkey,
            commit_block=block,
            reveal_from_block=window.opens,
            reveal_until_block=window.closes,
            submitted_at=submitted_at,
        )

    def reveal(
        self, hotkey: str, client_ip: str, request: schemas.RevealRequest, caller: Authenticated | None = None
    ) -> schemas.SubmissionAccepted:
        block = self.current_block()
        now = self.clock()
        round_id = rules.round_of_block(block, self.config.round_blocks).round_id
        electorate = self.electorate()  # whose reports keep an older submission (supersede_older)
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
                raise ApiError(
                    409,
                    f"too early: commitment {submission.id} can be revealed from block "
                    f"{window.opens}; the chain is at block {block}",
                )
            if state == "expired":
                raise ApiError(
                    409,
                    f"the reveal window of commitment {submission.id} closed at block "
                    f"{window.closes}; the chain is at block {block}",
                )
            url, commit = self._fork(request.fork_url, request.commit_hash)
            digest = rules.commitment_hash(request.commitment_salt, request.fork_url, request.commit_hash)
            if digest != submission.commitment_hash:
                mismatch.append(
                    f"reveal does not match commitment {submission.id}: sha256(salt + fork_url + "
                    f"commit_hash) is {digest}, the commitment is {submission.commitment_hash}"
                )
                return None
            # It counts from its window's opening (docs/rules.md section 5): a commit another hotkey
            # made ready before then is that hotkey's, though committed to here earlier.
            self._refuse(
                session,
                admission.NOT_A_COPY,
                {
                    "hotkey": hotkey,
                    "commit_hash": commit,
                    "counts_from": rules.counts_from_block(
                        submission.method, submission.submitted_block, self.config.blocks_until_reveal
                    ),
                    "before_id": submission.id,
                    "blocks_until_reveal": self.config.blocks_until_reveal,
                },
            )
            submission.state = "ready"
            submission.fork_url, submission.commit_hash = url, commit
            submission.claimed_tokens_per_sec = request.tokens_per_sec
            submission.vram_mb = request.vram_mb
            submission.benchmarks = benchmarks_to_json(request.benchmarks)
            submission.ready_at = NewestStamps.read(session).ready_time(now)
            submission.ready_block, submission.round_id = block, round_id
            submission.client_ip = client_ip
            session.flush()
            supersede_older(session, self.database.dialect, hotkey, round_id, electorate)
            return schemas.SubmissionAccepted.model_validate(submission, from_attributes=True)

        # The commit as submit_direct locks it (validated, lowercase): the copy check sees the other's row.
        accepted = self._write(work, caller, locks=[f"hotkey:{hotkey}", f"commit:{request.commit_hash.lower()}"])
        if accepted is None:
            self.database.write(
                lambda session: self._record_failure(
                    session, client_ip, now, "reveal_mismatch", mismatch[-1], request.submission_id
                )
            )
            raise ApiError(400, f"{mismatch[-1]}; counted as a failed validation")
        self.submissions_said.add(
            "revealed", hotkey, f"commitment {accepted.submission_id} revealed by {hotkey}, round {round_id}"
        )
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
            state = window.state(block)
            # The query keeps commitments (they carry their hash) whose window has not closed.
            assert row.commitment_hash is not None and state != "expired", f"commitment {row.id} is not pending"
            pending.append(
                schemas.PendingReveal(
                    submission_id=row.id,
                    hotkey=row.hotkey,
                    commitment_hash=row.commitment_hash,
                    target_sequence_length=row.target_sequence_length,
                    commit_block=row.submitted_block,
                    reveal_from_block=window.opens,
                    reveal_until_block=window.closes,
                    state=state,
                )
            )
        return schemas.PendingReveals(current_block=block, pending=pending)

    def stats(self, hotkey: str | None) -> schemas.SubmissionStats:
        """Counts of submissions, commitments and reports, and of ``hotkey``'s submissions when
        given. The subnet's are counted once a chain block per process (requests at a block the
        counting has not reached wait for one count): each reads whole tables, 0.2 s on SQLite after
        30 days of a full subnet, which every request of this public endpoint paid."""
        block = self.current_block()
        with self._block_stats_lock:
            if self._block_stats is None or self._block_stats.current_block != block:
                self._block_stats = self._count_all(block)
            stats = self._block_stats.model_copy()
        if hotkey is not None:
            with self.database.read() as session:
                stats.hotkey = hotkey
                stats.hotkey_submissions = session.execute(
                    select(func.count()).select_from(Submission).where(Submission.hotkey == hotkey)
                ).scalar_one()
        return stats

    def _count_all(self, block: int) -> schemas.SubmissionStats:
        round_id = rules.round_of_block(block, self.config.round_blocks).round_id
        oldest_open = block - (self.config.blocks_until_reveal + self.config.reveal_window_blocks - 1)
        committed = Submission.state == "committed"
        with self.database.read() as session:

            def count(*where: ColumnElement[bool]) -> int:
                return session.execute(select(func.count()).select_from(Submission).where(*where)).scalar_one()

            return schemas.SubmissionStats(
                current_block=block,
                current_round=round_id,
                submissions=count(),
                ready=count(Submission.state == "ready"),
                awaiting_reveal=count(committed, Submission.submitted_block >= oldest_open),
                expired_commitments=count(committed, Submission.submitted_block < oldest_open),
                hotkeys=session.execute(_COUNT_HOTKEYS).scalar_one(),
                reports=session.execute(select(func.count()).select_from(EvaluationReport)).scalar_one(),
                submissions_this_round=count(Submission.round_id == round_id),
            )
