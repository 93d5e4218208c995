"""The commitments whose reveal window is open (``GET /pending_reveals``, the counts of
``GET /get_submission_stats``): an index of submissions by state and block, so that the read walks
the open window's commitments, not every commitment never revealed.

Create Date: 2026-11-28
"""

from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.create_index("ix_submissions_state_submitted_block", "submissions", ["state", "submitted_block"])


def downgrade() -> None:
    op.drop_index("ix_submissions_state_submitted_block", table_name="submissions")
