"""A miner's history reads its evaluated submissions of the newest rounds (quasar/api/status.py):
an index of submissions by hotkey, state and round, so that it reads those rows only.

Create Date: 2026-11-28
"""

from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.create_index("ix_submissions_hotkey_state_round_id", "submissions", ["hotkey", "state", "round_id"])


def downgrade() -> None:
    op.drop_index("ix_submissions_hotkey_state_round_id", table_name="submissions")
