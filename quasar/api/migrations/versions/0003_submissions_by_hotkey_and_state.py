"""An index of submissions by (hotkey, state, commit_hash).

Every submission checks that the same fork, commit and target length is not already a ready
submission of its hotkey, and a miner's page reads the hotkey's evaluated (ready) submissions.
Without this index SQLite answered both through ``ix_submissions_state_ready_at``, reading every
ready submission of every miner, so a submission and a miner's page cost more the more submissions
were waiting for evaluation.

Create Date: 2026-11-23
"""

from alembic import op

revision = "0003"
down_revision = "0002"

INDEX = "ix_submissions_hotkey_state_commit_hash"


def upgrade() -> None:
    op.create_index(INDEX, "submissions", ["hotkey", "state", "commit_hash"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="submissions")
