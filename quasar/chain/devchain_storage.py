"""The dev chain's SQLite file: its schema, its block clock, transactions and a per-thread snapshot.

Blocks advance with time: ``block = offset + floor((now - genesis) / block_time)``, where the
genesis time and the block time are stored in the file when it is created, so every process that
opens the file agrees on the block number; ``offset`` grows when the chain is advanced at once.
Time is the host's boot clock (``CLOCK_BOOTTIME``, the same in every process of the host, and no
step of the wall clock moves it: blocks never go back) while the host has not restarted since the
file was made; then, and where there is no boot id (not Linux), the wall clock.
The file holds the subnet's neurons (uid, hotkey, coldkey, stake, validator permit, published
endpoint, last weights update), the weights validators set, their pending commits, and in its
``meta`` table the subnet owner, the subnet identity, the subnet's hyperparameters and the last
epoch whose validator permits it holds.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from quasar.chain.base import ChainError, Endpoint, NeuronInfo, SubnetHyperparameters
from quasar.chain.subtensor_rules import (
    FINNEY,
    MAX_ALLOWED_VALIDATORS,
    MIN_NON_IMMUNE_UIDS,
    PruneCandidate,
    neuron_to_prune,
    next_epoch_block,
    retimed_reveal,
)
from quasar.config.options import OPTIONS_BY_KEY

logger = logging.getLogger(__name__)
T = TypeVar("T")

# A new file's, where its creator names none: the settings' (DEVCHAIN_BLOCK_TIME's and NETUID's) defaults.
DEFAULT_BLOCK_TIME_S = float(OPTIONS_BY_KEY["devchain_block_time"].default)
DEFAULT_NETUID = int(OPTIONS_BY_KEY["netuid"].default)
BUSY_TIMEOUT_S = 30.0
SCHEMA_VERSION = 2
# Subtensor's InitialMinAllowedUids: a trim leaves at least this many uids (set_min_allowed_uids).
MIN_ALLOWED_UIDS = 64
# DefaultImmuneOwnerUidsLimit: how many of the owner's neurons pruning and trimming never take.
IMMUNE_OWNER_UIDS_LIMIT = 1
# The runtime's MaxImmuneUidsPercentage: a trim is refused while the immune neurons (the owner's
# among them) would make this share of the new size or more.
MAX_IMMUNE_UIDS_PERCENT = 80

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
    next_epoch_block: int  # the start of the first epoch whose permits the file does not hold yet
    neurons: tuple[NeuronInfo, ...]
    by_hotkey: dict[str, NeuronInfo]


@dataclass(frozen=True)
class WeightCommit:
    """A commit of weights (commit-reveal): pending until ``reveal_block``, then revealed or dropped."""

    hotkey: str
    weights: dict[int, float]
    version_key: int
    commit_block: int
    reveal_block: int
    outcome: str | None  # None: pending; "revealed"; or why the chain dropped it


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


def permits_block_in(connection: sqlite3.Connection) -> int:
    """The start of the last epoch whose validator permits the file holds (0: none run yet), or the
    block of a later tempo change (subtensor's LastEpochBlock: epochs start every tempo blocks from it)."""
    return int(meta(connection, "permits_block") or 0)


def max_validators_in(connection: sqlite3.Connection) -> int:
    """The subnet's MaxAllowedValidators (default 64, init_new_network's)."""
    return int(meta(connection, "max_allowed_validators") or MAX_ALLOWED_VALIDATORS)


def min_non_immune_uids_in(connection: sqlite3.Connection) -> int:
    """The subnet's MinNonImmuneUids (default 10, subtensor's)."""
    return int(meta(connection, "min_non_immune_uids") or MIN_NON_IMMUNE_UIDS)


def stake_threshold_in(connection: sqlite3.Connection) -> float:
    """The chain's StakeThreshold (default 0, subtensor's)."""
    return float(meta(connection, "stake_threshold") or 0)


def owner_in(connection: sqlite3.Connection) -> tuple[str | None, str | None]:
    """The owner's (hotkey, coldkey): set with set_owner, else uid 0's (subtensor registers the
    subnet creator's hotkey as uid 0 when the subnet is created)."""
    hotkey = meta(connection, "owner_hotkey")
    if hotkey is not None:
        return hotkey, meta(connection, "owner_coldkey")
    row = connection.execute("SELECT hotkey, coldkey FROM neurons WHERE uid = 0").fetchone()
    return (row[0], row[1]) if row else (None, None)


def owner_uid_in(connection: sqlite3.Connection) -> int | None:
    """The owner's hotkey's uid, or None when it holds none."""
    hotkey, _ = owner_in(connection)
    row = connection.execute("SELECT uid FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone()
    return None if row is None else int(row[0])


def immune_owner_uids_in(connection: sqlite3.Connection) -> set[int]:
    """The uids subtensor's get_immune_owner_uids keeps from pruning and trimming: the owner's
    hotkey's uid first, then the neurons of the owner's coldkey earliest registered (then lowest
    uid), IMMUNE_OWNER_UIDS_LIMIT of them."""
    _, coldkey = owner_in(connection)
    rows = connection.execute(
        "SELECT uid FROM neurons WHERE coldkey IS ? ORDER BY registered_block, uid", (coldkey,)
    ).fetchall()
    owner_uid = owner_uid_in(connection)
    ranked = ([] if owner_uid is None else [owner_uid]) + [uid for (uid,) in rows if uid != owner_uid]
    return set(ranked[:IMMUNE_OWNER_UIDS_LIMIT])


def clear_neuron(connection: sqlite3.Connection, uid: int) -> None:
    """What subtensor's clear_neuron does to a uid that changes hands: the weights it set go, the
    weights set on it become 0."""
    connection.execute("DELETE FROM weights WHERE setter_uid = ?", (uid,))
    connection.execute("UPDATE weights SET weight = 0 WHERE target_uid = ?", (uid,))


def mask_outdated(connection: sqlite3.Connection, hotkey: str) -> None:
    """Zero ``hotkey``'s weights on uids registered at or after its last update, as Yuma's epoch
    masks them (run_epoch's outdated mask): a commit's LastUpdate is its commit block, so a
    hotkey that took a uid between a commit and its reveal gets nothing of that commit. Neurons
    registered at block 0 stand for the genesis' (nothing can register after a commit there)."""
    connection.execute(
        "UPDATE weights SET weight = 0 WHERE setter_uid = (SELECT uid FROM neurons WHERE hotkey = ?) "
        "AND target_uid IN (SELECT uid FROM neurons WHERE registered_block > 0 AND registered_block >= "
        "(SELECT last_update FROM neurons WHERE hotkey = ?))",
        (hotkey, hotkey),
    )


def prune_candidate_in(connection: sqlite3.Connection, block: int, netuid: int) -> int:
    """The uid a registration replaces on a full subnet (:func:`neuron_to_prune`, with the stake
    standing for the emission this chain does not pay); never the owner's (:func:`immune_owner_uids_in`)."""
    kept = immune_owner_uids_in(connection)
    candidates = [
        PruneCandidate(*row)
        for row in connection.execute("SELECT uid, stake, registered_block FROM neurons")
        if row[0] not in kept
    ]
    immunity = hyperparameters_in(connection).immunity_period
    floor = min_non_immune_uids_in(connection)
    uid = neuron_to_prune(candidates, block, immunity, floor)
    if uid is None:
        raise ChainError(
            f"cannot register: NoNeuronIdAvailable: subnet {netuid} is full, and {floor} or fewer of "
            f"its neurons (the owner's apart) are past their immunity period ({immunity} blocks) while "
            "none is within it"
        )
    return uid


def trim_neurons_in(connection: sqlite3.Connection, max_n: int, block: int) -> dict[int, int]:
    """Subtensor's trim_to_max_allowed_uids at ``block``: max_allowed_uids becomes ``max_n`` (between
    MinAllowedUids and the current max_allowed_uids, else InvalidValue); a subnet holding more
    neurons loses those of least emission (here: stake; of equal ones the highest uid first), never
    the owner's nor one within its immunity period, as the weights they set and those set on them,
    and the rest move to uids 0.. in their order, each with its weights, endpoint, permit, last update
    and registration block (pending commits keep the uids they name). Refused
    (TrimmingWouldExceedMaxImmunePercentage) while the immune neurons make MAX_IMMUNE_UIDS_PERCENT of
    ``max_n`` or more. Returns old uid -> new uid of the neurons kept."""
    current = hyperparameters_in(connection)
    floor = int(meta(connection, "min_allowed_uids") or MIN_ALLOWED_UIDS)
    if not floor <= max_n <= current.max_allowed_uids:
        raise ChainError(
            f"cannot trim to {max_n} uids: InvalidValue: the subnet takes between its MinAllowedUids {floor} "
            f"and its max_allowed_uids {current.max_allowed_uids}"
        )
    set_meta(connection, "hyperparameters", json.dumps({**dataclasses.asdict(current), "max_allowed_uids": max_n}))
    rows = connection.execute("SELECT uid, hotkey, stake, registered_block FROM neurons ORDER BY uid").fetchall()
    if len(rows) <= max_n:
        return {uid: uid for uid, *_ in rows}
    kept = immune_owner_uids_in(connection)
    immune = {uid for uid, _, _, born in rows if uid in kept or block - born < current.immunity_period}
    if len(immune) * 100 >= MAX_IMMUNE_UIDS_PERCENT * max_n:
        raise ChainError(
            f"cannot trim to {max_n} uids: TrimmingWouldExceedMaxImmunePercentage: {len(immune)} neurons are "
            f"immune (the owner's, or within the immunity period of {current.immunity_period} blocks)"
        )
    removed: set[int] = set()
    for uid, _, _, _ in sorted(rows, key=lambda row: (row[2], -row[0])):
        if len(rows) - len(removed) == max_n:
            break
        if uid not in immune:
            removed.add(uid)
    for uid in removed:
        connection.execute("DELETE FROM weights WHERE setter_uid = ? OR target_uid = ?", (uid, uid))
        connection.execute("DELETE FROM neurons WHERE uid = ?", (uid,))
    moved = {old: new for new, old in enumerate(uid for uid, *_ in rows if uid not in removed)}
    for old, new in moved.items():  # ascending: each new uid is free when its neuron moves there
        connection.execute("UPDATE neurons SET uid = ? WHERE uid = ?", (new, old))
        connection.execute("UPDATE weights SET setter_uid = ? WHERE setter_uid = ?", (new, old))
        connection.execute("UPDATE weights SET target_uid = ? WHERE target_uid = ?", (new, old))
    return moved


def retime_commits(
    connection: sqlite3.Connection, old: SubnetHyperparameters, new: SubnetHyperparameters, block: int
) -> None:
    """Move the pending commits' reveals as a change from ``old`` to ``new`` hyperparameters at
    ``block`` moves them on subtensor (:func:`retimed_reveal`), once the epochs up to ``block`` ran:
    a commit whose reveal a lowered reveal period has passed is dropped; a tempo change restarts the
    epoch cycle at ``block``."""
    if (old.tempo, old.reveal_period_epochs) == (new.tempo, new.reveal_period_epochs):
        return
    last = permits_block_in(connection)
    for commit_id, reveal_block in connection.execute(
        "SELECT id, reveal_block FROM weight_commits WHERE outcome IS NULL"
    ).fetchall():
        moved = retimed_reveal(reveal_block, last, old, new, block)
        if moved is None:
            periods = new.reveal_period_epochs
            expired = f"dropped: expired: the reveal period was lowered to {periods} epoch(s), past its reveal"
            connection.execute("UPDATE weight_commits SET outcome = ? WHERE id = ?", (expired, commit_id))
        else:
            connection.execute("UPDATE weight_commits SET reveal_block = ? WHERE id = ?", (moved, commit_id))
    if new.tempo != old.tempo:
        set_meta(connection, "permits_block", str(block))


def set_hyperparameters_in(connection: sqlite3.Connection, hyperparameters: SubnetHyperparameters, block: int) -> None:
    """Store the subnet's hyperparameters, changed at ``block`` as subtensor's setters change them:
    a max_allowed_uids below the subnet's size is refused (sudo_set_max_allowed_uids'
    MaxAllowedUIdsLessThanCurrentUIds), and the pending commits' reveals move (:func:`retime_commits`)."""
    (size,) = connection.execute("SELECT COUNT(*) FROM neurons").fetchone()
    if hyperparameters.max_allowed_uids < size:
        raise ChainError(
            f"cannot set max_allowed_uids {hyperparameters.max_allowed_uids}: MaxAllowedUIdsLessThanCurrentUIds: "
            f"the subnet holds {size} uids"
        )
    retime_commits(connection, hyperparameters_in(connection), hyperparameters, block)
    set_meta(connection, "hyperparameters", json.dumps(dataclasses.asdict(hyperparameters)))


def weights_in(connection: sqlite3.Connection) -> dict[int, dict[int, float]]:
    """The weights the file holds: setter uid -> {target uid: weight}."""
    result: dict[int, dict[int, float]] = {}
    for setter, target, weight in connection.execute(
        "SELECT setter_uid, target_uid, weight FROM weights ORDER BY setter_uid, target_uid"
    ):
        result.setdefault(setter, {})[target] = weight
    return result


def commits_in(connection: sqlite3.Connection) -> list[WeightCommit]:
    """Every commit of weights the file holds, oldest first."""
    rows = connection.execute(
        "SELECT hotkey, weights, version_key, commit_block, reveal_block, outcome FROM weight_commits ORDER BY id"
    ).fetchall()
    return [
        WeightCommit(hotkey, {int(uid): w for uid, w in json.loads(weights).items()}, key, commit, reveal, outcome)
        for hotkey, weights, key, commit, reveal, outcome in rows
    ]


def _boot_clock() -> tuple[str, float] | None:
    """This boot of the host (Linux's boot id) and its boot clock's seconds, or None where there is
    no boot id (not Linux)."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return boot_id, time.clock_gettime(time.CLOCK_BOOTTIME)


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
            boot = _boot_clock()
            with self.transaction() as connection:
                stored = dict(connection.execute("SELECT key, value FROM meta").fetchall())
                if not stored:
                    stored = {
                        "netuid": str(DEFAULT_NETUID if netuid is None else netuid),
                        "block_time_s": repr(block_time_s or DEFAULT_BLOCK_TIME_S),
                        "genesis_time": repr(time.time()),
                        "genesis_boot": "" if boot is None else f"{boot[0]} {boot[1]!r}",
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
        boot_id, _, boot_time = stored.get("genesis_boot", "").partition(" ")
        # The boot clock counts from the host's start: the genesis' reading holds on that boot only.
        self._genesis_boot_time = float(boot_time) if boot is not None and boot_id == boot[0] else None
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
        return self.query(lambda connection: connection.execute(sql, parameters).fetchall())

    def query(self, read: Callable[[sqlite3.Connection], T]) -> T:
        """``read`` on a connection of its own, outside any write; ChainError naming the file when
        SQLite fails."""
        try:
            with self.connect() as connection:
                return read(connection)
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
        if self._genesis_boot_time is not None:
            elapsed = time.clock_gettime(time.CLOCK_BOOTTIME) - self._genesis_boot_time
        else:
            elapsed = time.time() - self._genesis_time
        return int(elapsed // self.block_time_s)

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
                last = permits_block_in(connection)
                next_epoch = next_epoch_block(last, hyperparameters_in(connection).tempo, last)
            finally:
                connection.execute("COMMIT")
        except (OSError, sqlite3.Error) as error:
            raise ChainError(f"dev chain {self.path}: {error}") from None
        neurons = tuple(_neuron(row) for row in rows)
        local.snapshot = Snapshot(version, int(offset), next_epoch, neurons, {n.hotkey: n for n in neurons})
        return local.snapshot
