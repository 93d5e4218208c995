"""The submission API's tables: submissions, evaluation leases and reports, failures, bans, nonces.

Create Date: 2026-05-20
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "submissions",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("hotkey", sa.String(64), nullable=False),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("commitment_hash", sa.String(64), nullable=True),
        sa.Column("target_sequence_length", sa.BigInteger(), nullable=False),
        sa.Column("submitted_at", sa.Double(), nullable=False),
        sa.Column("submitted_block", sa.BigInteger(), nullable=False),
        sa.Column("ready_at", sa.Double(), nullable=True),
        sa.Column("ready_block", sa.BigInteger(), nullable=True),
        sa.Column("round_id", sa.BigInteger(), nullable=True),
        sa.Column("fork_url", sa.String(512), nullable=True),
        sa.Column("commit_hash", sa.String(40), nullable=True),
        sa.Column("claimed_tokens_per_sec", sa.Double(), nullable=True),
        sa.Column("vram_mb", sa.BigInteger(), nullable=True),
        sa.Column("benchmarks", sa.JSON(), nullable=True),
        sa.Column("client_ip", sa.String(64), nullable=False),
    )
    op.create_index("ix_submissions_hotkey_submitted_at", "submissions", ["hotkey", "submitted_at"])
    op.create_index("ix_submissions_state_ready_at", "submissions", ["state", "ready_at", "id"])
    op.create_index("ix_submissions_round_id", "submissions", ["round_id"])

    op.create_table(
        "evaluation_leases",
        sa.Column("submission_id", Id, sa.ForeignKey("submissions.id"), primary_key=True),
        sa.Column("validator_hotkey", sa.String(64), primary_key=True),
        sa.Column("leased_until", sa.Double(), nullable=False),
        sa.Column("fetch_count", sa.Integer(), nullable=False),
    )

    op.create_table(
        "evaluation_reports",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("submission_id", Id, sa.ForeignKey("submissions.id"), nullable=False),
        sa.Column("validator_hotkey", sa.String(64), nullable=False),
        sa.Column("reported_at", sa.Double(), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("correct", sa.Boolean(), nullable=False),
        sa.Column("logits_ok", sa.Boolean(), nullable=True),
        sa.Column("measured_tokens_per_sec", sa.Double(), nullable=True),
        sa.Column("benchmarks", sa.JSON(), nullable=True),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.UniqueConstraint("submission_id", "validator_hotkey", name="uq_evaluation_reports_submission_validator"),
    )

    op.create_table(
        "validation_failures",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("client_ip", sa.String(64), nullable=False),
        sa.Column("failed_at", sa.Double(), nullable=False),
        sa.Column("submission_id", Id, sa.ForeignKey("submissions.id"), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("dedupe_key", sa.String(64), nullable=True, unique=True),
    )
    op.create_index("ix_validation_failures_ip_at", "validation_failures", ["client_ip", "failed_at"])

    op.create_table(
        "ip_bans",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("client_ip", sa.String(64), nullable=False),
        sa.Column("banned_at", sa.Double(), nullable=False),
        sa.Column("banned_until", sa.Double(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
    )
    op.create_index("ix_ip_bans_ip_until", "ip_bans", ["client_ip", "banned_until"])

    op.create_table(
        "used_nonces",
        sa.Column("hotkey", sa.String(64), primary_key=True),
        sa.Column("nonce", sa.BigInteger(), primary_key=True),
    )
    op.create_index("ix_used_nonces_nonce", "used_nonces", ["nonce"])


def downgrade() -> None:
    for table in (
        "used_nonces",
        "ip_bans",
        "validation_failures",
        "evaluation_reports",
        "evaluation_leases",
        "submissions",
    ):
        op.drop_table(table)
