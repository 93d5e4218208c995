"""Alembic environment of the submission API: run with the engine that Database.upgrade passes in."""

from alembic import context
from sqlalchemy import text

from quasar.api.db import Base

# An arbitrary constant: the PostgreSQL advisory lock key that serializes concurrent migrators.
_MIGRATION_LOCK_KEY = 0x51A5A2


def run_migrations() -> None:
    engine = context.config.attributes["engine"]
    with engine.connect() as connection:
        # Both backends run DDL inside the transaction (pysqlite does too, as Database sets it up),
        # so a migration and its version stamp land together or not at all.
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            transactional_ddl=True,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run them against the database")
run_migrations()
