"""PreparedStatement (quasar/api/db.py) against its reference, SQLAlchemy's ``Connection.execute``.

The submission's hot statements run on the DBAPI cursor; here the same statements run both ways on
random parameters, on SQLite and PostgreSQL, and must give the same rows, write the same rows, and
raise the same SQLAlchemy errors.
"""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import func, insert, select, text
from sqlalchemy.exc import IntegrityError

from api_fixtures import commit_of
from quasar.api import admission
from quasar.api.db import MIGRATIONS_DIR, Database, IpBan, PreparedStatement, SchemaTooNew, Submission, UsedNonce

HOTKEYS = [f"5Hotkey{n}" for n in range(4)]
IPS = ["10.0.0.1", "10.0.0.2", "2001:db8::7"]


def random_submission(rng: random.Random, now: float) -> dict:
    """The columns of a direct submission, with the optional ones sometimes missing."""
    return {
        "hotkey": rng.choice(HOTKEYS),
        "method": "direct",
        "state": rng.choice(["ready", "committed"]),
        "commitment_hash": None,
        "target_sequence_length": rng.choice([512, 4096, 1_000_000]),
        "submitted_at": now - rng.uniform(0, 7200),
        "submitted_block": rng.randrange(10**6),
        "ready_at": now,
        "ready_block": rng.randrange(10**6),
        "round_id": rng.randrange(100),
        "fork_url": rng.choice(["https://github.com/a/fla", "https://github.com/b/fla"]),
        "commit_hash": commit_of(rng.randrange(5)),
        "claimed_tokens_per_sec": rng.uniform(1, 1e8),
        "vram_mb": rng.choice([None, rng.randrange(80_000)]),
        "benchmarks": rng.choice([None, {str(rng.choice([512, 1024])): rng.uniform(1, 1e8)}]),
        "client_ip": rng.choice(IPS),
    }


def test_the_submission_statements_read_what_sqlalchemy_reads(database):
    rng = random.Random(random.randrange(2**32))
    now = time.time()

    def seed(session) -> None:
        connection = session.connection()
        for _ in range(60):
            connection.execute(insert(Submission.__table__), random_submission(rng, now))
        for ip in IPS[:2]:
            connection.execute(
                insert(IpBan.__table__),
                {"client_ip": ip, "banned_at": now, "banned_until": now + rng.uniform(-100, 100), "reason": "r"},
            )

    database.write(seed)
    queries = [
        (admission.NOT_BANNED.statement, lambda: {"client_ip": rng.choice(IPS), "now": now + rng.uniform(-200, 200)}),
        (
            admission.UNDER_RATE_LIMIT.statement,
            lambda: {
                "hotkey": rng.choice(HOTKEYS),
                "limit": rng.randrange(1, 20),
                "now": now + rng.uniform(-4000, 4000),
            },
        ),
        (
            admission.NOT_ALREADY_READY.statement,
            lambda: {
                "hotkey": rng.choice(HOTKEYS),
                "fork_url": rng.choice(["https://github.com/a/fla", "https://x/y"]),
                "commit_hash": commit_of(rng.randrange(5)),
                "target_sequence_length": rng.choice([512, 4096]),
            },
        ),
    ]
    found = 0
    with database.read() as session:
        connection = session.connection()
        for prepared, params_of in queries:
            for _ in range(40):
                params = params_of()
                rows = [tuple(row) for row in prepared.run(connection, params).fetchall()]
                assert rows == [tuple(row) for row in connection.execute(prepared.statement, params).all()], params
                found += rows != [] and rows[0][0] not in (None, 0)
    assert found > 10  # not only empty answers


def test_an_insert_writes_what_sqlalchemy_writes(database):
    rng = random.Random(random.randrange(2**32))
    now = time.time()
    table = Submission.__table__

    def insert_both(session) -> list[tuple[int, int]]:
        connection = session.connection()
        pairs = []
        for _ in range(30):
            values = random_submission(rng, now)
            prepared = admission.INSERT_SUBMISSION.scalar(connection, values)
            reference = connection.execute(insert(table).returning(table.c.id), values).scalar_one()
            pairs.append((prepared, reference))
        return pairs

    pairs = database.write(insert_both)
    with database.read() as session:
        for prepared, reference in pairs:
            rows = [
                session.execute(select(table).where(table.c.id == id_)).one()._asdict() for id_ in (prepared, reference)
            ]
            assert rows[0].pop("id") == prepared and rows[1].pop("id") == reference
            assert rows[0] == rows[1]


def test_a_driver_error_is_raised_as_sqlalchemy_raises_it(database):
    statement = insert(UsedNonce.__table__)
    prepared = PreparedStatement(statement)
    values = {"hotkey": HOTKEYS[0], "nonce": random.randrange(2**62)}
    database.write(lambda session: prepared.run(session.connection(), values))
    for again in (
        lambda connection: prepared.run(connection, values),
        lambda connection: connection.execute(statement, values),
    ):
        with pytest.raises(IntegrityError):
            database.write(lambda session: again(session.connection()))


def test_open_connections_starts_the_pools_backends_before_any_request(database):
    pool = database.engine.pool
    before = pool.checkedin()
    database.open_connections()
    if database.dialect == "sqlite":
        assert pool.checkedin() == before  # nothing to gain there
        return
    assert pool.checkedin() == pool.size() == 20 and pool.checkedout() == 0
    with database.read() as session:
        backends = session.scalar(
            select(func.count()).select_from(text("pg_stat_activity")).where(text("datname = current_database()"))
        )
    assert backends >= pool.size()


def test_a_read_inside_a_read_is_the_same_snapshot(database):
    """A page reads in several places inside one read: one session, one snapshot, even when a
    write commits between its reads; other threads and later reads get their own."""
    rng = random.Random()
    count = select(func.count()).select_from(Submission)

    def add_one() -> None:
        row = random_submission(rng, time.time())
        database.write(lambda session: session.execute(insert(Submission).values(**row)))

    add_one()
    with database.read() as outer:
        before = outer.scalar(count)
        add_one()  # committed by another session while the outer read is open
        with database.read() as inner:
            assert inner is outer
            assert inner.scalar(count) == before
        assert outer.scalar(count) == before  # the inner read did not end the outer one
        elsewhere = []
        thread = threading.Thread(target=lambda: elsewhere.append(_count_in_new_read(database, count)))
        thread.start()
        thread.join()
        assert elsewhere == [before + 1]  # another thread's read is its own, and sees the write
    with database.read() as later:
        assert later is not outer and later.scalar(count) == before + 1


def _count_in_new_read(database: Database, count) -> int:
    with database.read() as session:
        return session.scalar(count)


def test_a_database_a_newer_quasar_migrated_is_refused_naming_its_revision_and_keeps_its_rows(database):
    """Going back to an older QUASAR after an upgrade (or running two versions on one database):
    the schema is at a revision this code has no migration for. The start stops with a message
    naming it and what to do, not with Alembic's traceback, and nothing stored is touched."""
    with database.engine.begin() as connection:
        connection.execute(insert(UsedNonce).values(hotkey="5Fnewer", nonce=1))
        connection.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    newest = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    with pytest.raises(SchemaTooNew) as refused:
        database.upgrade()
    assert str(refused.value) == (
        f"the schema is at revision 0099, which this QUASAR does not know (its newest is {newest}): "
        "a newer QUASAR migrated it; run that version again, or restore the database's copy from before the upgrade"
    )
    with database.read() as session:
        assert session.scalar(select(func.count()).select_from(UsedNonce)) == 1
        assert session.scalar(text("SELECT version_num FROM alembic_version")) == "0099"


def test_a_migration_is_said_in_one_line_and_a_schema_up_to_date_in_none(tmp_path, caplog):
    """Alembic's own lines (its dialect and DDL mode, twice, then each step with its docstring on
    several lines) came at every start of the API and of each of its workers: 4 lines for a schema
    up to date, 12 for a new one, before the server's own."""
    url = f"sqlite:///{tmp_path}/api.sqlite3"
    database = Database(url)
    try:
        with caplog.at_level(logging.INFO):
            database.upgrade()
            newest = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
            assert [(record.name, record.getMessage()) for record in caplog.records] == [
                ("quasar.api.db", f"database {url}: creating its schema (revision {newest})")
            ]
            caplog.clear()
            database.upgrade()
            assert caplog.records == []
            command.downgrade(database._alembic(), "0005")
            caplog.clear()
            database.upgrade()
            assert [record.getMessage() for record in caplog.records] == [
                f"database {url}: migrating its schema from revision 0005 to {newest} ({int(newest) - 5} migrations)"
            ]
    finally:
        database.dispose()
