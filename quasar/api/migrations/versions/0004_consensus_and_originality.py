"""Kernel content hashes in reports, submissions by commit, and client addresses normalised.

- ``evaluation_reports.content_hash``: the normalised content hash of the fork's kernel files a
  validator computed from its clone (quasar/originality.py); reports from before stay NULL.
- An index of submissions by commit and of reports by content hash: the originality checks.
- Client addresses as failures and bans count them from now on (``rules.address_key``): an
  IPv4-mapped IPv6 address becomes the IPv4 address, an IPv6 address its /64. Failures and bans
  recorded before are rewritten, so they keep counting against the same client.

Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

from quasar.api.rules import address_key

revision = "0004"
down_revision = "0003"

ADDRESS_TABLES = ("submissions", "validation_failures", "ip_bans")


def upgrade() -> None:
    with op.batch_alter_table("evaluation_reports") as batch:
        batch.add_column(sa.Column("content_hash", sa.String(64), nullable=True))
    op.create_index("ix_evaluation_reports_content_hash", "evaluation_reports", ["content_hash"])
    op.create_index("ix_submissions_commit_hash", "submissions", ["commit_hash"])
    connection = op.get_bind()
    for name in ADDRESS_TABLES:
        table = sa.table(name, sa.column("client_ip", sa.String(64)))
        for (address,) in connection.execute(sa.select(table.c.client_ip).distinct()).all():
            key = address_key(address)
            if key != address:
                connection.execute(sa.update(table).where(table.c.client_ip == address).values(client_ip=key))


def downgrade() -> None:
    op.drop_index("ix_submissions_commit_hash", table_name="submissions")
    op.drop_index("ix_evaluation_reports_content_hash", table_name="evaluation_reports")
    with op.batch_alter_table("evaluation_reports") as batch:
        batch.drop_column("content_hash")
