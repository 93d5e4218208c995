"""A validator's reports after an id (``GET /validators/{hotkey}/reports``): an index of reports by
validator hotkey and id, so that the read walks that validator's reports only, not every report
stored after the id (all of them for a hotkey that never reported).

Create Date: 2026-11-28
"""

from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.create_index("ix_evaluation_reports_validator_id", "evaluation_reports", ["validator_hotkey", "id"])


def downgrade() -> None:
    op.drop_index("ix_evaluation_reports_validator_id", table_name="evaluation_reports")
