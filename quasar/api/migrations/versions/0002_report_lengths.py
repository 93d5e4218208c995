"""Per-length figures in validators' reports: tokens/sec, peak memory, correctness per sequence length.

Reports stored before this revision keep ``lengths`` NULL; their per-length tokens/sec stay in
``benchmarks``, which the status endpoints read in that case.

Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    with op.batch_alter_table("evaluation_reports") as table:
        table.add_column(sa.Column("lengths", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("evaluation_reports") as table:
        table.drop_column("lengths")
