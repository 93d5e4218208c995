"""The submission API's database: tables, engines, and transactions that are safe under concurrent writers.

SQLite (the default; a file that is never deleted or reset) runs in WAL mode with ``synchronous=FULL``
(an acknowledged write survives a crash of the process or the machine) and takes the write lock at
the start of every write transaction (``BEGIN IMMEDIATE``). SQLite has one writer at a time, so each
process commits in groups (:class:`GroupCommit`): one thread runs the writes waiting at that moment
in one transaction, each in a savepoint of its own (a write that fails is undone alone), commits
once (one fsync for all) and only then answers them. The processes of one server (``--workers``)
take turns through an exclusive ``flock`` on a file beside the database, which wakes the next one
as soon as it is released (SQLite's own busy handler polls with sleeps of up to 100 ms). PostgreSQL
writes run READ COMMITTED and take transaction-scoped advisory locks on what a rule reads before it
writes (a hotkey for its rate limit, a commit for its copy check, a validator for its leases, an
IP for its failures; rows are locked with FOR UPDATE), so writers that touch different keys never
wait for each other. A write transaction is a function of a session, run by
:meth:`Database.write`, and may run again after a deadlock.

The schema is created and changed only by the Alembic migrations in ``quasar/api/migrations``.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    String,
    Table,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    literal,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Dialect, Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from quasar.api.tables import Base as Base
from quasar.api.tables import EvaluationLease as EvaluationLease
from quasar.api.tables import EvaluationReport as EvaluationReport
from quasar.api.tables import IpBan as IpBan
from quasar.api.tables import Submission as Submission
from quasar.api.tables import UsedNonce as UsedNonce
from quasar.api.tables import ValidationFailure as ValidationFailure
from quasar.errors import QuasarError

logger = logging.getLogger(__name__)

T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
SQLITE_BUSY_TIMEOUT_S = 30.0
# PostgreSQL SQLSTATEs of transactions that are safe to run again: serialization failure, deadlock.
_RETRYABLE_PGCODES = {"40001", "40P01"}
# First key of the API's two-key advisory locks (the second is a hash of the locked name).
_ADVISORY_LOCK_SPACE = 0x51A5
MAX_WRITE_ATTEMPTS = 30
# Less free space than this, and opening SQLite's write-ahead log and its index can fail (disk_trouble).
DISK_FULL_BYTES = 1 << 20
# PostgreSQL connections each API process keeps open (and as many again under load).
POSTGRESQL_POOL_SIZE = 20


class PreparedStatement:
    """A Core statement compiled once per dialect and run straight on the DBAPI cursor of a connection.

    For the few statements every submission runs: on SQLite, SQLAlchemy's execution machinery
    (execution context, result proxy, events) costs several times the statement itself. The SQL and
    the parameters are still SQLAlchemy's own (the statement's compilation for the parameters given,
    as ``Connection.execute`` compiles an INSERT for its keys, its bound literals and each parameter
    type's bind processor, e.g. JSON), and a driver's error is raised as SQLAlchemy's ``DBAPIError``
    like ``Connection.execute`` raises it, so the database sees the same thing and the callers
    handle the same errors. tests/test_api_db.py runs both ways on random parameters and compares.
    """

    def __init__(self, statement: ClauseElement):
        self.statement = statement
        self._prepared: dict[tuple[str, tuple[str, ...]], tuple[str, Callable[[dict[str, Any]], Any]]] = {}

    def _prepare(self, dialect: Dialect, keys: tuple[str, ...]) -> tuple[str, Callable[[dict[str, Any]], Any]]:
        compiled = self.statement.compile(
            dialect=dialect, column_keys=list(keys), compile_kwargs={"render_postcompile": True}
        )
        if not isinstance(compiled, SQLCompiler):
            raise TypeError(f"PreparedStatement runs SQL statements, not {type(self.statement).__name__}")
        processors = {
            name: processor
            for name in compiled.construct_params(_check=False)
            if (processor := compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect))
        }
        # A positional paramstyle (SQLite's qmark) takes the values in the order of the placeholders.
        positions = compiled.positiontup if compiled.positional else None

        def driver_params(params: dict[str, Any]) -> Any:
            values = compiled.construct_params(params)
            for name, processor in processors.items():
                values[name] = processor(values[name])
            return values if positions is None else [values[name] for name in positions]

        return compiled.string, driver_params

    def run(self, connection: Connection, params: dict[str, Any]) -> Any:
        """Execute with ``params`` in ``connection``'s transaction; the DBAPI cursor (rows, rowcount)."""
        dialect = connection.dialect
        key = (dialect.name, tuple(params))
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepared[key] = self._prepare(dialect, key[1])
        sql, driver_params = prepared
        values = driver_params(params)
        cursor = connection.connection.cursor()
        try:
            cursor.execute(sql, values)
        except dialect.loaded_dbapi.Error as error:
            raise DBAPIError.instance(sql, values, error, dialect.loaded_dbapi.Error, dialect=dialect) from error
        return cursor

    def scalar(self, connection: Connection, params: dict[str, Any]) -> Any:
        """The first column of the first row, or None without rows."""
        rows = self.run(connection, params).fetchall()
        return rows[0][0] if rows else None


# Every PostgreSQL submission takes one (its hotkey's): through Session.execute it cost a third of
# the submission's database work in the API process.
_ADVISORY_LOCK = PreparedStatement(text("SELECT pg_advisory_xact_lock(:space, hashtext(:key))"))


def dialect_insert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT into ``table`` in ``dialect``'s own form, which has ``on_conflict_do_nothing``."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


class FileLock:
    """An exclusive ``flock`` on ``path``, shared by every process that opens the same file: a waiter
    sleeps in the kernel and wakes as soon as the holder releases it (or dies: the kernel drops the
    lock with the process)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: object) -> None:
        assert self._fd is not None, "FileLock released without being taken"
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the file (when not held); the next :meth:`__enter__` opens it again."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Write:
    """A write waiting for its group's commit: the work, then its result or its exception."""

    def __init__(self, work: Callable[[Session], Any]):
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None
        # Held until the group is committed: a bare lock is a cheaper signal than an Event's condition.
        self.done = threading.Lock()
        self.done.acquire()


class GroupCommit:
    """SQLite writes of one process, committed in groups by one thread (see the module's docstring).

    Under load a group holds every write that arrived while the previous group was committing (up
    to ``max_group``), so the write lock is taken, and the disk synced, once per group instead of
    once per write; alone, a write is a group of one.
    """

    def __init__(self, database: Database, lock: FileLock, max_group: int = 64):
        self.database = database
        self.lock = lock
        self.max_group = max_group
        self._queue: collections.deque[_Write] = collections.deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def run(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` in the next group's transaction; return its result once the group committed,
        or raise its exception (or the commit's)."""
        write = _Write(work)
        with self._wake:
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(target=self._commit_groups, name="sqlite-group-commit", daemon=True)
                self._thread.start()
            self._queue.append(write)
            self._wake.notify()
        write.done.acquire()
        if write.error is not None:
            raise write.error
        return write.result

    def stop(self) -> None:
        """End the committing thread once the queue is empty (a later write starts it again)."""
        with self._wake:
            thread, self._stopping = self._thread, True
            self._wake.notify()
        if thread is not None:
            thread.join(timeout=30)

    def _commit_groups(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stopping:
                    self._wake.wait()
                if not self._queue:
                    self._thread = None
                    return
                group = [self._queue.popleft() for _ in range(min(self.max_group, len(self._queue)))]
            self._commit(group)

    def _commit(self, group: list[_Write]) -> None:
        pending = group
        try:
            while pending:
                pending = self._attempt(pending)
        except OperationalError as error:
            failure: BaseException = (
                DatabaseBusy("the database is busy; retry shortly") if "locked" in str(error.orig) else error
            )
            for write in pending:
                write.error = write.error or failure
        except BaseException as error:  # the commit failed: nothing of the group was written
            for write in pending:
                write.error = write.error or error
        finally:
            for write in group:
                write.done.release()

    def _attempt(self, group: list[_Write]) -> list[_Write]:
        """Run and commit ``group``; what is left to run again (empty once committed)."""
        with self.lock, Session(self.database._write_engine, expire_on_commit=False) as session, session.begin():
            # Plain SAVEPOINT statements on the DBAPI cursor: the ORM's begin_nested() cost more than the writes.
            cursor = session.connection().connection.cursor()
            for write in group:
                write.result, write.error = None, None
                cursor.execute("SAVEPOINT quasar_write")
                try:
                    write.result = write.work(session)
                    session.flush()
                except Exception as error:  # undone alone; the caller gets it
                    write.error = error
                    if not session.is_active:
                        # A failed flush leaves the ORM session needing the whole transaction rolled
                        # back: do that, and run the group again without this write.
                        session.rollback()
                        return [other for other in group if other is not write]
                    cursor.execute("ROLLBACK TO SAVEPOINT quasar_write")
                    session.expunge_all()  # objects it loaded or added may hold what was undone
                cursor.execute("RELEASE SAVEPOINT quasar_write")
        return []


class SchemaTooNew(QuasarError, ValueError):
    """The database's schema is at a revision this code has no migration for: a newer QUASAR migrated it."""


class DatabaseBusy(QuasarError, RuntimeError):
    """The database could not take the write in time (SQLite lock wait, or retries exhausted)."""


def _is_retryable(error: DBAPIError) -> bool:
    return getattr(error.orig, "pgcode", None) in _RETRYABLE_PGCODES


def display_url(url: str) -> str:
    """The URL with any password hidden, for logs and messages."""
    return make_url(url).render_as_string(hide_password=True)


def disk_trouble(url: str) -> str:
    """For an SQLite URL, why the disk of its file's folder cannot take writes (full or read-only),
    or ``""``: SQLite reports either as a plain "disk I/O error" when it opens the database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return ""
    folder = Path(parsed.database).expanduser().parent
    try:
        disk = os.statvfs(folder)
    except OSError:
        return ""
    if disk.f_flag & os.ST_RDONLY:
        return f"the disk of {folder} is read-only: mount it read-write and start again"
    free = disk.f_bavail * disk.f_frsize
    if free < DISK_FULL_BYTES:
        return f"the disk of {folder} is full ({free // 1024} KiB free): free space on it and start again"
    return ""


@contextlib.contextmanager
def _alembic_quiet() -> Iterator[None]:
    """Alembic's INFO lines held back: its dialect and DDL mode, said at every start of the API and
    of each of its workers, and each step with its docstring's lines; :meth:`Database.upgrade` says
    a migration in one line of its own."""
    alembic_log = logging.getLogger("alembic.runtime.migration")
    level = alembic_log.level
    alembic_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic_log.setLevel(level)


class Database:
    """Engines and transactions for one database URL (``sqlite:///PATH`` or ``postgresql://...``)."""

    def __init__(self, url: str):
        self.url = url
        parsed = make_url(url)
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg2")  # the driver this project installs
        self.dialect = parsed.get_backend_name()
        if self.dialect == "sqlite":
            if not parsed.database or parsed.database == ":memory:":
                raise ValueError("the API needs an SQLite file (sqlite:///PATH), not an in-memory database")
            path = Path(parsed.database).expanduser()
            path.parent.mkdir(parents=True, exist_ok=True)
            self.engine = _sqlite_engine(parsed, synchronous="FULL")
            self._write_engine: Engine = self.engine.execution_options(quasar_write=True)
            # SQLite has one writer at a time anyway: writers wait here, in order, rather than
            # polling in SQLite's busy handler (whose growing sleeps starve unlucky requests).
            # One SQLite writer at a time across the server's processes (each commits its group under it).
            self._sqlite_writer: FileLock | None = FileLock(path.with_name(path.name + "-writer.lock"))
            self._group_commit: GroupCommit | None = GroupCommit(self, self._sqlite_writer)
        elif self.dialect == "postgresql":
            self.engine = create_engine(
                parsed, pool_size=POSTGRESQL_POOL_SIZE, max_overflow=POSTGRESQL_POOL_SIZE, pool_pre_ping=True
            )
            self._write_engine = self.engine
            self._sqlite_writer = None
            self._group_commit = None
        else:
            raise ValueError(f"unsupported database {display_url(url)}: use sqlite:///PATH or postgresql://...")
        self._reading = threading.local()  # the session of the read under way in each thread
        # A read sees one snapshot: SQLite's read transactions do; PostgreSQL needs REPEATABLE READ.
        self._read_engine = (
            self.engine
            if self.dialect == "sqlite"
            else self.engine.execution_options(isolation_level="REPEATABLE READ")
        )

    def _alembic(self) -> AlembicConfig:
        alembic = AlembicConfig()
        alembic.set_main_option("script_location", str(MIGRATIONS_DIR))
        alembic.attributes["engine"] = self._write_engine
        return alembic

    def upgrade(self) -> None:
        """Bring the schema to the newest migration (creating it on an empty database); never drops data.
        A schema at a revision this code has no migration for (a newer QUASAR migrated it) is
        refused, untouched, with :class:`SchemaTooNew`."""
        scripts = ScriptDirectory(str(MIGRATIONS_DIR))
        known = {script.revision for script in scripts.walk_revisions()}
        newest = scripts.get_current_head()
        with _alembic_quiet(), self._write_engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_heads()
        for revision in current:
            if revision not in known:
                raise SchemaTooNew(
                    f"the schema is at revision {revision}, which this QUASAR does not know (its newest is "
                    f"{newest}): a newer QUASAR migrated it; run that version again, or restore the "
                    "database's copy from before the upgrade"
                )
        where = display_url(self.url)
        if not current:
            logger.info("database %s: creating its schema (revision %s)", where, newest)
        elif newest not in current:
            steps = len(list(scripts.iterate_revisions(newest, current)))
            logger.info(
                "database %s: migrating its schema from revision %s to %s (%d migrations)",
                where,
                ", ".join(current),
                newest,
                steps,
            )
        with _alembic_quiet():
            command.upgrade(self._alembic(), "head")

    def new_migration(self, message: str) -> None:
        """Write a migration from the difference between the models and this (up-to-date) database."""
        current = len(list(ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions()))
        command.revision(self._alembic(), message=message, autogenerate=True, rev_id=f"{current + 1:04d}")

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session (one consistent snapshot on both backends). Inside another
        :meth:`read` of the same thread it is that read's session: a page that reads in several
        places sees one snapshot, and on PostgreSQL pays for one transaction (a pool check-out
        with its ping, BEGIN and COMMIT: round trips to a backend that, on a busy machine, each
        wait for their turn on a CPU)."""
        session = getattr(self._reading, "session", None)
        if session is not None:
            yield session
            return
        with Session(self._read_engine, expire_on_commit=False) as session, session.begin():
            self._reading.session = session
            try:
                yield session
            finally:
                self._reading.session = None

    def write(self, work: Callable[[Session], T], locks: Sequence[str] = ()) -> T:
        """Run ``work(session)`` in a write transaction and commit (durably); run again after a deadlock.

        ``work`` must only touch the database (it may run several times). Exceptions it raises roll
        back what it wrote and propagate. ``locks``: keys locked for the whole transaction before
        ``work`` runs (see :meth:`lock`). Raises :class:`DatabaseBusy` when the write cannot be
        taken in time. On SQLite ``work`` runs in its process's next group commit (:class:`GroupCommit`).
        """
        if self._group_commit is not None:
            return self._group_commit.run(work)
        for attempt in range(1, MAX_WRITE_ATTEMPTS + 1):
            try:
                with Session(self._write_engine, expire_on_commit=False) as session, session.begin():
                    for key in sorted(set(locks)):  # one order everywhere: no deadlock between them
                        self.lock(session, key)
                    return work(session)
            except DBAPIError as error:
                if not _is_retryable(error):
                    raise
            # Jittered exponential backoff so that colliding transactions do not collide again.
            time.sleep(random.uniform(0, min(0.2, 0.002 * 2**attempt)))
        raise DatabaseBusy(f"the write did not go through after {MAX_WRITE_ATTEMPTS} attempts; retry shortly")

    def lock(self, session: Session, key: str) -> None:
        """Hold ``key`` until ``session``'s transaction ends, so the read-then-write rules keyed on it
        (rate limits, leases, failure counts) see every earlier writer's result. On SQLite the whole
        write transaction is already exclusive."""
        if self.dialect == "postgresql":
            _ADVISORY_LOCK.run(session.connection(), {"space": _ADVISORY_LOCK_SPACE, "key": key})

    def open_connections(self) -> None:
        """On PostgreSQL, open the pool's connections now and read every table once through each:
        a request then never waits for a backend to start and fill its catalog caches (about 40 ms
        of the server's CPU each; under load, the first seconds of a new API process opened dozens
        at once). Nothing on SQLite, where a connection costs next to nothing."""
        if self.dialect != "postgresql":
            return
        connections = []
        try:
            for _ in range(POSTGRESQL_POOL_SIZE):
                connections.append(connection := self.engine.connect())
                for table in Base.metadata.sorted_tables:
                    connection.execute(select(literal(1)).select_from(table).limit(1))
                connection.rollback()
        finally:
            for connection in connections:
                connection.close()

    def dispose(self) -> None:
        if self._group_commit is not None:
            self._group_commit.stop()
        self.engine.dispose()
        if self._sqlite_writer is not None:
            self._sqlite_writer.close()


def _sqlite_engine(url: URL, synchronous: str) -> Engine:
    """An engine on the SQLite file ``url``: WAL, foreign keys, a busy timeout, ``synchronous`` as given."""
    engine = create_engine(
        url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}, pool_size=20, max_overflow=20
    )

    def connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite would defer it past the first read).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    event.listen(engine, "connect", connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_begin(connection: Any) -> None:
    write = connection.get_execution_options().get("quasar_write", False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def oldest_kept(retention_s: float) -> ColumnElement[int]:
    """SQL: the oldest nonce the ledger keeps, ``retention_s`` before the newest it holds: it holds
    every accepted nonce from there on (so a replay of one is found) and refuses older ones."""
    newest = select(func.max(UsedNonce.nonce)).scalar_subquery()
    return func.coalesce(newest, 0) - int(retention_s * 1e9)


class NonceLedger:
    """The ``btauth/1`` replay store in the database, shared by every API process and kept across
    restarts: an accepted (hotkey, nonce) is a row, recorded in the transaction of the request it
    authenticates, so a replayed request finds it there.

    Nonces are the signers' clocks (ns), let through only near the API's clock. The ledger forgets
    a nonce once it is ``retention_s`` older than the newest one it holds, not by the API's clock,
    and refuses those it has forgotten: after a step back of the API's clock a request it accepted
    before the step is fresh again, and one forgotten by the clock's time would be accepted twice."""

    def __init__(self, database: Database, retention_s: float, clock: Callable[[], float] = time.time):
        self.database = database
        self.retention = retention_s
        self.clock = clock
        self._next_prune = 0.0
        nonce = bindparam("nonce", type_=BigInteger())
        kept = select(bindparam("hotkey", type_=String()), nonce).where(nonce >= oldest_kept(retention_s))
        self._insert = PreparedStatement(
            dialect_insert(database.dialect, UsedNonce.__table__)
            .from_select(["hotkey", "nonce"], kept)
            .on_conflict_do_nothing()
        )

    def record(self, session: Session, hotkey_ss58: str, nonce_ns: int) -> str | None:
        """Record (hotkey, nonce) in ``session``'s transaction; None when recorded, else why not (a
        replay, or a nonce older than the ledger keeps: the refusal's reason for the caller)."""
        recorded = self._insert.run(session.connection(), {"hotkey": hotkey_ss58, "nonce": nonce_ns}).rowcount == 1
        self.prune_if_due(session)
        if recorded:
            return None
        oldest = session.execute(select(oldest_kept(self.retention))).scalar_one()
        if nonce_ns < oldest:
            signed_before_s = (oldest - nonce_ns) / 1e9 + self.retention  # before the newest nonce held
            return (
                f"authentication failed: the request was signed {signed_before_s:.1f} s before the newest "
                f"request this API accepted, and it remembers requests for {self.retention:g} s: a clock stepped "
                "back (this API's or the sender's); sign it again once the clocks are right"
            )
        return "authentication failed: this nonce was already accepted from this hotkey"

    def prune_if_due(self, session: Session) -> None:
        """Delete, in ``session``'s transaction, the nonces the ledger no longer keeps, once every half
        retention period by the API's clock (:meth:`record` does it; call it too where a nonce is
        recorded any other way, after recording it)."""
        now = self.clock()
        if now >= self._next_prune:
            self._next_prune = now + self.retention / 2
            session.execute(delete(UsedNonce).where(UsedNonce.nonce < oldest_kept(self.retention)))
