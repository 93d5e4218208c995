"""The work schedule (quasar/scheduling.py): superseded submissions, leases by round.

- ``submissions.superseded_by``: the newer submission of the same hotkey that replaced one no
  validator reported on (its state becomes ``superseded``).
- ``evaluation_leases.first_round``: the round in which a validator first took a submission (the
  schedule's fairness counts a validator's evaluations per hotkey and round); NULL before.
- Indexes of submissions by state and round (the ready ones of the rounds being scheduled) and of
  leases by validator and round.

Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("submissions") as table:
        table.add_column(sa.Column("superseded_by", Id, nullable=True))
    with op.batch_alter_table("evaluation_leases") as table:
        table.add_column(sa.Column("first_round", sa.BigInteger(), nullable=True))
    op.create_index("ix_submissions_state_round_id", "submissions", ["state", "round_id"])
    op.create_index("ix_evaluation_leases_validator_round", "evaluation_leases", ["validator_hotkey", "first_round"])


def downgrade() -> None:
    op.drop_index("ix_evaluation_leases_validator_round", table_name="evaluation_leases")
    op.drop_index("ix_submissions_state_round_id", table_name="submissions")
    with op.batch_alter_table("evaluation_leases") as table:
        table.drop_column("first_round")
    with op.batch_alter_table("submissions") as table:
        table.drop_column("superseded_by")
