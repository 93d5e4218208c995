"""The submission API's tables: the SQLAlchemy models the Alembic migrations in
``quasar/api/migrations`` create (:mod:`quasar.api.db` runs the transactions on them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Ids: 64-bit on PostgreSQL; on SQLite "INTEGER PRIMARY KEY" (the rowid, itself 64-bit).
Id = BigInteger().with_variant(Integer(), "sqlite")


# What the string columns below hold (the database stores them as plain strings).
SubmissionMethod = Literal["direct", "commit_reveal"]
# A submission's stored state; the states a miner sees (quasar/api/status.py) derive from it.
StoredState = Literal["committed", "ready", "superseded"]
Verdict = Literal["passed", "failed"]


class Base(DeclarativeBase):
    if TYPE_CHECKING:
        # Every model here is declared with __tablename__, so it is mapped to a Table (SQLAlchemy
        # types __table__ as any FromClause, which Core's insert and update do not take).
        __table__: ClassVar[Table]


@dataclass(frozen=True)
class Revealed:
    """What a submission has once revealed (directly submitted, or its commitment revealed): set
    together when it became ready, and kept when it is superseded."""

    round_id: int
    ready_at: float
    fork_url: str
    commit_hash: str
    claimed_tokens_per_sec: float


class Submission(Base):
    """A miner's submission: direct (ready at once) or commit-reveal (``committed`` until revealed).

    ``submitted_at``/``submitted_block`` are the commit's (the tie-break time); ``ready_*`` and
    ``round_id`` are set when it becomes evaluable (direct submission or reveal). A ready one that no
    validator reported on becomes ``superseded`` by a newer one of its hotkey (``superseded_by``,
    quasar/scheduling.py).
    """

    __tablename__ = "submissions"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    hotkey: Mapped[str] = mapped_column(String(64))
    method: Mapped[SubmissionMethod] = mapped_column(String(16))
    state: Mapped[StoredState] = mapped_column(String(16))
    commitment_hash: Mapped[str | None] = mapped_column(String(64))
    target_sequence_length: Mapped[int] = mapped_column(BigInteger)
    submitted_at: Mapped[float] = mapped_column(Double)  # unix seconds
    submitted_block: Mapped[int] = mapped_column(BigInteger)
    ready_at: Mapped[float | None] = mapped_column(Double)
    ready_block: Mapped[int | None] = mapped_column(BigInteger)
    round_id: Mapped[int | None] = mapped_column(BigInteger)
    fork_url: Mapped[str | None] = mapped_column(String(512))
    commit_hash: Mapped[str | None] = mapped_column(String(40))
    claimed_tokens_per_sec: Mapped[float | None] = mapped_column(Double)
    vram_mb: Mapped[int | None] = mapped_column(BigInteger)
    benchmarks: Mapped[dict | None] = mapped_column(JSON)  # {"seq_len": tokens_per_sec}
    client_ip: Mapped[str] = mapped_column(String(64))
    superseded_by: Mapped[int | None] = mapped_column(Id)  # a submission id

    __table_args__ = (
        Index("ix_submissions_hotkey_submitted_at", "hotkey", "submitted_at"),
        Index("ix_submissions_state_ready_at", "state", "ready_at", "id"),
        Index("ix_submissions_round_id", "round_id"),
        # A hotkey's submissions in a state: the duplicate check of every submission (with the
        # commit) and a miner's evaluated submissions. Without it SQLite's planner takes the state
        # index for both and reads every ready submission of every miner.
        Index("ix_submissions_hotkey_state_commit_hash", "hotkey", "state", "commit_hash"),
        # Another hotkey's submission of the same commit: the originality check of every submission.
        Index("ix_submissions_commit_hash", "commit_hash"),
        # The ready submissions of the rounds being evaluated: what the work endpoint schedules.
        Index("ix_submissions_state_round_id", "state", "round_id"),
        # A hotkey's evaluated submissions of the newest rounds: a miner's history. Without it
        # SQLite's planner takes the state and round index and reads every miner's of those rounds.
        Index("ix_submissions_hotkey_state_round_id", "hotkey", "state", "round_id"),
        # The commitments whose reveal window is open (GET /pending_reveals): without it every
        # commitment never revealed, of every round, was read.
        Index("ix_submissions_state_submitted_block", "state", "submitted_block"),
    )

    @property
    def submission_id(self) -> int:
        """Its id under the name the API's responses give it, so that they are read from the row by name."""
        return self.id

    def revealed(self) -> Revealed:
        """Its revealed fields; raises ValueError for a commitment not revealed (they are NULL then)."""
        if (
            self.round_id is None
            or self.ready_at is None
            or self.fork_url is None
            or self.commit_hash is None
            or self.claimed_tokens_per_sec is None
        ):
            raise ValueError(f"submission {self.id} ({self.state}) is not revealed: it has no fork, commit or claim")
        return Revealed(self.round_id, self.ready_at, self.fork_url, self.commit_hash, self.claimed_tokens_per_sec)


class EvaluationLease(Base):
    """A submission handed to one validator, until ``leased_until`` (then it is handed out again);
    ``first_round``: the round in which it was first handed to it (NULL before 0005), which the
    schedule's fairness counts."""

    __tablename__ = "evaluation_leases"

    submission_id: Mapped[int] = mapped_column(Id, ForeignKey("submissions.id"), primary_key=True)
    validator_hotkey: Mapped[str] = mapped_column(String(64), primary_key=True)
    leased_until: Mapped[float] = mapped_column(Double)
    fetch_count: Mapped[int] = mapped_column(Integer)
    first_round: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_evaluation_leases_validator_round", "validator_hotkey", "first_round"),)


class EvaluationReport(Base):
    """One validator's result for one submission (at most one each)."""

    __tablename__ = "evaluation_reports"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    submission_id: Mapped[int] = mapped_column(Id, ForeignKey("submissions.id"))
    validator_hotkey: Mapped[str] = mapped_column(String(64))
    reported_at: Mapped[float] = mapped_column(Double)
    verdict: Mapped[Verdict] = mapped_column(String(16))
    correct: Mapped[bool] = mapped_column(Boolean)
    logits_ok: Mapped[bool | None] = mapped_column(Boolean)
    measured_tokens_per_sec: Mapped[float | None] = mapped_column(Double)
    benchmarks: Mapped[dict | None] = mapped_column(JSON)
    reasons: Mapped[list] = mapped_column(JSON)
    # [{"seq_len", "status", "tokens_per_sec", "peak_vram_mb", "correct"}]; NULL in reports from before 0002.
    lengths: Mapped[list | None] = mapped_column(JSON)
    # The normalised content hash of the fork's kernel files (quasar/originality.py); NULL before 0004.
    content_hash: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        UniqueConstraint("submission_id", "validator_hotkey", name="uq_evaluation_reports_submission_validator"),
        Index("ix_evaluation_reports_content_hash", "content_hash"),
        # A validator's reports after an id (GET /validators/{hotkey}/reports, read by its primary at
        # every step): without it a hotkey with none read every report ever stored.
        Index("ix_evaluation_reports_validator_id", "validator_hotkey", "id"),
    )


class ValidationFailure(Base):
    """A failed validation charged to a client IP (five in 24 h ban the IP). ``dedupe_key`` makes
    one submission's evaluation failure count once however many validators report it."""

    __tablename__ = "validation_failures"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    client_ip: Mapped[str] = mapped_column(String(64))
    failed_at: Mapped[float] = mapped_column(Double)
    submission_id: Mapped[int | None] = mapped_column(Id, ForeignKey("submissions.id"))
    kind: Mapped[str] = mapped_column(String(32))  # "evaluation" | "reveal_mismatch"
    reason: Mapped[str] = mapped_column(Text)
    dedupe_key: Mapped[str | None] = mapped_column(String(64), unique=True)

    __table_args__ = (Index("ix_validation_failures_ip_at", "client_ip", "failed_at"),)


class IpBan(Base):
    __tablename__ = "ip_bans"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    client_ip: Mapped[str] = mapped_column(String(64))
    banned_at: Mapped[float] = mapped_column(Double)
    banned_until: Mapped[float] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(Text)

    __table_args__ = (Index("ix_ip_bans_ip_until", "client_ip", "banned_until"),)


class UsedNonce(Base):
    """Accepted ``btauth/1`` (hotkey, nonce) pairs: a second insert of one is a replay."""

    __tablename__ = "used_nonces"

    hotkey: Mapped[str] = mapped_column(String(64), primary_key=True)
    nonce: Mapped[int] = mapped_column(BigInteger, primary_key=True)

    __table_args__ = (Index("ix_used_nonces_nonce", "nonce"),)
