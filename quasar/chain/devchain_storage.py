"""The dev chain's SQLite file: its schema, its block clock, transactions and a per-thread snapshot.

Blocks advance with time: ``block = offset + floor((now - genesis) / block_time)``, where the
genesis time and the block time are stored in the file when it is created, so every process that
opens the file agrees on the block number; ``offset`` grows when the chain is advanced at once.
The file holds the subnet's neurons (uid, hotkey, coldkey, stake, validator permit, published
endpoint, last weights update), the weights validators set, their pending commits, and in its
``meta`` table the subnet owner, the subnet identity and the subnet's hyperparameters.

Several processes may use one file at the same time: SQLite in WAL mode, a busy timeout, and every
write in a ``BEGIN IMMEDIATE`` transaction. Reads are served from a snapshot of the file (the block
offset and the neurons) that each thread keeps on a connection of its own and reads again only
after some connection, in any process, committed to the file (``PRAGMA data_version``): exact, and
a few microseconds instead of opening the file for every lookup.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from quasar.chain.base import ChainError, Endpoint, NeuronInfo, SubnetHyperparameters
from quasar.chain.subtensor_rules import FINNEY

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_TIME_S = 12.0
DEFAULT_NETUID = 24
BUSY_TIMEOUT_S = 30.0
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS neurons (
    uid INTEGER PRIMARY KEY,
    hotkey TEXT NOT NULL UNIQUE,
    coldkey TEXT NOT NULL,
    stake REAL NOT NULL DEFAULT 0,
    validator_permit INTEGER NOT NULL DEFAULT 0,
    host TEXT,
    port INTEGER,
    served_block INTEGER NOT NULL DEFAULT 0,
    last_update INTEGER NOT NULL DEFAULT 0,
    registered_block INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS weights (
    setter_uid INTEGER NOT NULL REFERENCES neurons(uid),
    target_uid INTEGER NOT NULL REFERENCES neurons(uid),
    weight REAL NOT NULL,
    version_key INTEGER NOT NULL,
    block INTEGER NOT NULL,
    PRIMARY KEY (setter_uid, target_uid)
);
CREATE TABLE IF NOT EXISTS weight_commits (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hotkey TEXT NOT NULL,
    weights TEXT NOT NULL,
    version_key INTEGER NOT NULL,
    commit_block INTEGER NOT NULL,
    reveal_block INTEGER NOT NULL,
    outcome TEXT
);
"""

_NEURON_COLUMNS = "uid, hotkey, coldkey, stake, validator_permit, host, port"


@dataclass(frozen=True)
class Snapshot:
    """What the dev chain's readers need from the file, as of its commit ``data_version``."""

    data_version: int
    block_offset: int
    neurons: tuple[NeuronInfo, ...]
    by_hotkey: dict[str, NeuronInfo]


def _neuron(row: tuple) -> NeuronInfo:
    uid, hotkey, coldkey, stake, permit, host, port = row
    endpoint = Endpoint(host, port) if host is not None and port is not None else None
    return NeuronInfo(uid, hotkey, coldkey, float(stake), bool(permit), endpoint)


def meta(connection: sqlite3.Connection, key: str) -> str | None:
    """The ``meta`` entry ``key``, or None without one."""
    row = connection.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


def set_meta(connection: sqlite3.Connection, key: str, value: str) -> None:
    """Write the ``meta`` entry ``key``."""
    connection.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def hyperparameters_in(connection: sqlite3.Connection) -> SubnetHyperparameters:
    """The subnet's hyperparameters as the file holds them."""
    stored = meta(connection, "hyperparameters")
    if stored is None:
        raise ChainError("the dev chain file holds no hyperparameters")
    return SubnetHyperparameters(**json.loads(stored))


def set_hyperparameters_in(connection: sqlite3.Connection, hyperparameters: SubnetHyperparameters) -> None:
    """Store the subnet's hyperparameters."""
    set_meta(connection, "hyperparameters", json.dumps(dataclasses.asdict(hyperparameters)))


class DevChainFile:
    """The SQLite file ``path`` of a dev chain (created when missing, never reset).

    ``netuid`` and ``block_time_s`` are used when the file is created; an existing file keeps the
    values it was created with (opening it with a different ``netuid`` is an error). A new file
    has finney's hyperparameters (:data:`~quasar.chain.subtensor_rules.FINNEY`).
    """

    def __init__(self, path: str | Path, netuid: int | None = None, block_time_s: float | None = None):
        self.path = Path(path)
        if block_time_s is not None and not (math.isfinite(block_time_s) and block_time_s > 0):
            raise ChainError(f"devchain block time must be a positive number of seconds, got {block_time_s}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.connect() as connection:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.executescript(_SCHEMA)
            with self.transaction() as connection:
                stored = dict(connection.execute("SELECT key, value FROM meta").fetchall())
                if not stored:
                    stored = {
                        "netuid": str(DEFAULT_NETUID if netuid is None else netuid),
                        "block_time_s": repr(block_time_s or DEFAULT_BLOCK_TIME_S),
                        "genesis_time": repr(time.time()),
                        "block_offset": "0",
                        "schema_version": str(SCHEMA_VERSION),
                        "hyperparameters": json.dumps(dataclasses.asdict(FINNEY)),
                        "allow_loopback_axons": "0",
                    }
                    connection.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", stored.items())
                    logger.info(
                        "created dev chain %s (netuid %s, %s s per block)",
                        self.path,
                        stored["netuid"],
                        stored["block_time_s"],
                    )
        except sqlite3.Error as error:
            raise ChainError(f"cannot open dev chain file {self.path}: {error}") from None
        if stored.get("schema_version") != str(SCHEMA_VERSION):
            raise ChainError(
                f"dev chain file {self.path} was made by an older QUASAR (without the subnet's rules): "
                "remove it, and a new one is made"
            )
        self.netuid = int(stored["netuid"])
        if netuid is not None and netuid != self.netuid:
            raise ChainError(f"dev chain {self.path} holds netuid {self.netuid}, not {netuid}")
        self.block_time_s = float(stored["block_time_s"])
        self._genesis_time = float(stored["genesis_time"])
        self._local = threading.local()  # per thread: (file inode, connection, snapshot)

    @contextlib.contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection of its own, in autocommit mode, closed on exit."""
        connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            yield connection
        finally:
            connection.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (no upgrade deadlocks)."""
        with self.connect() as connection:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def read(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        """The rows of one query; ChainError naming the file when SQLite fails."""
        try:
            with self.connect() as connection:
                return connection.execute(sql, parameters).fetchall()
        except sqlite3.Error as error:
            raise ChainError(f"dev chain {self.path}: {error}") from None

    def block_at(self, connection: sqlite3.Connection) -> int:
        """The current block, read inside ``connection``'s transaction."""
        (offset,) = connection.execute("SELECT value FROM meta WHERE key = 'block_offset'").fetchone()
        return int(offset) + self._blocks_since_genesis()

    def block_of(self, snapshot: Snapshot) -> int:
        """The current block, from ``snapshot``'s offset."""
        return snapshot.block_offset + self._blocks_since_genesis()

    def _blocks_since_genesis(self) -> int:
        return int((time.time() - self._genesis_time) // self.block_time_s)

    def snapshot(self) -> Snapshot:
        """This thread's snapshot of the file, read again when another connection committed to it
        (or the file was replaced)."""
        try:
            inode = os.stat(self.path).st_ino
            local = self._local
            if getattr(local, "inode", None) != inode:
                if getattr(local, "connection", None) is not None:
                    local.connection.close()
                local.connection, local.snapshot = None, None
                local.connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                local.inode = inode
            connection = local.connection
            (version,) = connection.execute("PRAGMA data_version").fetchone()
            if local.snapshot is not None and local.snapshot.data_version == version:
                return local.snapshot
            connection.execute("BEGIN")
            try:
                (offset,) = connection.execute("SELECT value FROM meta WHERE key = 'block_offset'").fetchone()
                rows = connection.execute(f"SELECT {_NEURON_COLUMNS} FROM neurons ORDER BY uid").fetchall()
            finally:
                connection.execute("COMMIT")
        except (OSError, sqlite3.Error) as error:
            raise ChainError(f"dev chain {self.path}: {error}") from None
        neurons = tuple(_neuron(row) for row in rows)
        local.snapshot = Snapshot(version, int(offset), neurons, {n.hotkey: n for n in neurons})
        return local.snapshot
