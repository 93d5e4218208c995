"""The embedded local dev chain: a Bittensor-like subnet in one SQLite file, for one-machine runs and tests.

Blocks advance with time: ``block = offset + floor((now - genesis) / block_time)``, where the
genesis time and the block time are stored in the file when it is created, so every process that
opens the file agrees on the block number. ``advance(n)`` moves the chain ``n`` blocks ahead at once
(tests, demos). The file also holds the subnet's neurons (uid, hotkey, coldkey, stake, validator
permit, published endpoint, last weights update), the weights validators set, their pending
commits, the subnet owner, the subnet identity and the subnet's hyperparameters.

The rules the suite depends on are subtensor's (pallets/subtensor of opentensor/subtensor; each
rule below names the function it follows), with finney's defaults for a new subnet
(:data:`FINNEY`) unless a file is given others (``set_hyperparameters``, the CLI's
``set-hyperparameter``):

- weights: version key, validator permit (the owner and a self-weight exempt), uids that exist,
  ``min_allowed_weights``, ``max_weight_limit`` and the weights rate limit;
- commit-reveal: with ``commit_reveal_enabled`` weights are committed, invisible, and applied (or
  silently dropped, as the chain drops a reveal that fails) at the start of the epoch
  ``reveal_period_epochs`` after the commit's; epochs are ``tempo`` blocks from block 0;
- serving: the serving rate limit, and no loopback address (127.0.0.1, ::1), which subtensor
  refuses. One allowance the real chain does not have, for the local network whose servers listen
  on 127.0.0.1 only: ``allow-loopback`` lets this file store loopback endpoints;
- registration: uids are appended up to ``max_allowed_uids``; then a registration replaces the
  non-immune neuron with the least stake (never the owner's), which loses its weights, its endpoint
  and its permit, and whose uid keeps the weights others set on it at 0.

Several processes may use one file at the same time: SQLite in WAL mode, a busy timeout, and every
write in a ``BEGIN IMMEDIATE`` transaction. Reads are served from a snapshot of the file (the block
offset and the neurons) that each thread keeps on a connection of its own and reads again only
after some connection, in any process, committed to the file (``PRAGMA data_version``): exact, and
a few microseconds instead of opening the file for every lookup.

CLI (``quasar devchain --path FILE COMMAND``, or ``python -m quasar.chain.devchain``): ``init``,
``register``, ``deregister``, ``set-owner``, ``set-permit``, ``advance``, ``block``, ``neurons``,
``weights``, ``commits``, ``hyperparameters``, ``set-hyperparameter``, ``allow-loopback``,
``identity``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ipaddress
import json
import logging
import math
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bittensor import resolve_signer
from bittensor.sp_core import decode_ss58
from rich.console import Console
from rich.table import Table

from quasar.chain.base import (
    MAX_UNREVEALED_COMMITS,
    U16_MAX,
    ApiLocation,
    Chain,
    ChainError,
    Endpoint,
    Metagraph,
    NeuronInfo,
    RateLimited,
    SubnetHyperparameters,
    UidsChanged,
    WeightsSubmission,
    decode_api_location,
    encode_api_location,
)
from quasar.log import setup_logging

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_TIME_S = 12.0
DEFAULT_NETUID = 24
BUSY_TIMEOUT_S = 30.0
SCHEMA_VERSION = 2

# A new subnet on finney: tempo INITIAL_SUBNET_TEMPO (360), DefaultWeightsSetRateLimit (100),
# init_new_network's min_allowed_weights (1), max_allowed_uids (256) and immunity_period (5000),
# DefaultMaxWeightsLimit (u16::MAX), DefaultCommitRevealWeightsEnabled (true),
# DefaultRevealPeriodEpochs (1), InitialServingRateLimit (50), InitialWeightsVersionKey (0).
FINNEY = SubnetHyperparameters(
    tempo=360, weights_version_key=0, weights_rate_limit=100, min_allowed_weights=1, max_weight_limit=U16_MAX,
    commit_reveal_enabled=True, reveal_period_epochs=1, serving_rate_limit=50, max_allowed_uids=256,
    immunity_period=5000,
)
HYPERPARAMETER_NAMES = tuple(field.name for field in dataclasses.fields(SubnetHyperparameters))

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
class _Snapshot:
    """What the dev chain's readers need from the file, as of its commit ``data_version``."""

    data_version: int
    block_offset: int
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


def _hotkey_of(wallet) -> str:
    """The ss58 address of ``wallet``'s hotkey (a Wallet, a keypair or a Signer)."""
    return resolve_signer(wallet, role="hotkey").ss58_address


def _coldkey_of(wallet) -> str:
    """The ss58 address of ``wallet``'s coldkey (read from its public file: nothing is unlocked)."""
    return resolve_signer(wallet, role="coldkey").ss58_address


def u16_weights(weights: Mapping[int, float]) -> dict[int, int]:
    """Weights as the chain receives them: max-upscaled to u16, zeros dropped (the SDK's ``normalize``)."""
    top = max(weights.values(), default=0.0)
    if top <= 0:
        return {}
    scaled = {uid: round(weight / top * U16_MAX) for uid, weight in weights.items()}
    return {uid: value for uid, value in sorted(scaled.items()) if value}


def weights_refusal(weights: Mapping[int, float], setter_uid: int, setter_permit: bool, owner_uid: int | None,
                    version_key: int, uids: set[int], hyperparameters: SubnetHyperparameters) -> str | None:
    """Why subtensor's ``internal_set_weights`` refuses ``weights`` from ``setter_uid`` (the error's
    name and what it means), or None when it accepts them. The rate limit is checked apart."""
    values = u16_weights(weights)
    if not values:
        return "weights are empty or all zero"
    self_weight = list(values) == [setter_uid]  # is_self_weight: one entry, on the setter's own uid
    # check_version_key: WeightsVersionKey 0 accepts any version.
    required = hyperparameters.weights_version_key
    if required and version_key < required:
        return (f"IncorrectWeightVersionKey: version_key {version_key} is below the subnet's "
                f"WeightsVersionKey {required}")
    # check_validator_permit: a self-weight and the subnet owner need no permit.
    if not (self_weight or setter_uid == owner_uid or setter_permit):
        return f"NeuronNoValidatorPermit: uid {setter_uid} has no validator permit"
    unknown = sorted(set(values) - uids)
    if unknown:
        return f"UidVecContainInvalidOne: uids {unknown} are not registered"
    # check_length: at least min(subnet size, MinAllowedWeights) weights, a self-weight apart.
    needed = min(len(uids), hyperparameters.min_allowed_weights)
    if not self_weight and len(values) < needed:
        return f"WeightVecLengthIsLow: {len(values)} weights, the subnet needs at least {needed}"
    # max_weight_limited: no share above MaxWeightsLimit / 65535, a self-weight apart.
    share = max(values.values()) / sum(values.values())
    if not self_weight and hyperparameters.max_weight_limit < U16_MAX and share > hyperparameters.max_weight_share:
        return (f"MaxWeightExceeded: a share of {share:.4f} is above the subnet's max_weight_limit "
                f"{hyperparameters.max_weight_limit} ({hyperparameters.max_weight_share:.4f})")
    return None


def blocks_until_allowed(block: int, last: int, rate_limit: int) -> int:
    """Blocks to wait before a rate-limited write is allowed (0: now): subtensor's check_rate_limit
    and axon_passes_rate_limit allow it when the last one is at block 0 (never) or at least
    ``rate_limit`` blocks ago."""
    if rate_limit <= 0 or last == 0:
        return 0
    return max(0, rate_limit - (block - last))


def refused_axon_address(host: str) -> str | None:
    """Why subtensor's ``is_valid_ip_address`` refuses ``host`` for an axon (it names no address
    range but these two), or None when it takes it."""
    address = ipaddress.ip_address(host)
    if address == ipaddress.ip_address("127.0.0.1") or address == ipaddress.ip_address("::1"):
        return f"InvalidIpAddress: {host} is the loopback address, which the chain refuses"
    return None


class DevChain(Chain):
    """A dev subnet stored in the SQLite file ``path`` (created when missing, never reset).

    ``netuid`` and ``block_time_s`` are used when the file is created; an existing file keeps the
    values it was created with (opening it with a different ``netuid`` is an error). A new file
    has finney's hyperparameters (:data:`FINNEY`).
    """

    def __init__(self, path: str | Path, netuid: int | None = None, block_time_s: float | None = None):
        self.path = Path(path)
        if block_time_s is not None and not (math.isfinite(block_time_s) and block_time_s > 0):
            raise ChainError(f"devchain block time must be a positive number of seconds, got {block_time_s}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as connection:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.executescript(_SCHEMA)
            with self._write(reveal=False) as connection:
                meta = dict(connection.execute("SELECT key, value FROM meta").fetchall())
                if not meta:
                    meta = {
                        "netuid": str(DEFAULT_NETUID if netuid is None else netuid),
                        "block_time_s": repr(block_time_s or DEFAULT_BLOCK_TIME_S),
                        "genesis_time": repr(time.time()),
                        "block_offset": "0",
                        "schema_version": str(SCHEMA_VERSION),
                        "hyperparameters": json.dumps(dataclasses.asdict(FINNEY)),
                        "allow_loopback_axons": "0",
                    }
                    connection.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta.items())
                    logger.info("created dev chain %s (netuid %s, %s s per block)", self.path,
                                meta["netuid"], meta["block_time_s"])
        except sqlite3.Error as error:
            raise ChainError(f"cannot open dev chain file {self.path}: {error}") from None
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            raise ChainError(f"dev chain file {self.path} was made by an older QUASAR (without the subnet's rules): "
                             "remove it, and a new one is made")
        self.netuid = int(meta["netuid"])
        if netuid is not None and netuid != self.netuid:
            raise ChainError(f"dev chain {self.path} holds netuid {self.netuid}, not {netuid}")
        self.block_time_s = float(meta["block_time_s"])
        self._genesis_time = float(meta["genesis_time"])
        self._local = threading.local()  # per thread: (file inode, connection, snapshot)

    # --- storage helpers ---

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            yield connection
        finally:
            connection.close()

    @contextlib.contextmanager
    def _write(self, reveal: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (no upgrade deadlocks). Commits
        whose reveal is due are revealed first, so they meet the subnet as it was when they were due."""
        with self._connect() as connection:
            connection.execute("BEGIN IMMEDIATE")
            try:
                if reveal:
                    self._reveal_due(connection)
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def _read(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        try:
            with self._connect() as connection:
                return connection.execute(sql, parameters).fetchall()
        except sqlite3.Error as error:
            raise ChainError(f"dev chain {self.path}: {error}") from None

    def _block_at(self, connection: sqlite3.Connection) -> int:
        (offset,) = connection.execute("SELECT value FROM meta WHERE key = 'block_offset'").fetchone()
        return int(offset) + int((time.time() - self._genesis_time) // self.block_time_s)

    @staticmethod
    def _meta(connection: sqlite3.Connection, key: str) -> str | None:
        row = connection.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def _set_meta(connection: sqlite3.Connection, key: str, value: str) -> None:
        connection.execute("INSERT INTO meta (key, value) VALUES (?, ?) "
                           "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))

    def _hyperparameters_in(self, connection: sqlite3.Connection) -> SubnetHyperparameters:
        return SubnetHyperparameters(**json.loads(self._meta(connection, "hyperparameters")))

    def _owner_in(self, connection: sqlite3.Connection) -> tuple[str | None, str | None]:
        """The owner's (hotkey, coldkey): set with set_owner, else uid 0's (subtensor registers the
        subnet creator's hotkey as uid 0 when the subnet is created)."""
        hotkey = self._meta(connection, "owner_hotkey")
        if hotkey is not None:
            return hotkey, self._meta(connection, "owner_coldkey")
        row = connection.execute("SELECT hotkey, coldkey FROM neurons WHERE uid = 0").fetchone()
        return (row[0], row[1]) if row else (None, None)

    def _owner_uid_in(self, connection: sqlite3.Connection) -> int | None:
        hotkey, _ = self._owner_in(connection)
        row = connection.execute("SELECT uid FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone()
        return None if row is None else int(row[0])

    @staticmethod
    def _clear_neuron(connection: sqlite3.Connection, uid: int) -> None:
        """What subtensor's clear_neuron does to a uid that changes hands: the weights it set go, the
        weights set on it become 0."""
        connection.execute("DELETE FROM weights WHERE setter_uid = ?", (uid,))
        connection.execute("UPDATE weights SET weight = 0 WHERE target_uid = ?", (uid,))

    def _snapshot(self) -> _Snapshot:
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
        neurons = tuple(self._neuron(row) for row in rows)
        local.snapshot = _Snapshot(version, int(offset), neurons, {n.hotkey: n for n in neurons})
        return local.snapshot

    def _block_of(self, snapshot: _Snapshot) -> int:
        return snapshot.block_offset + int((time.time() - self._genesis_time) // self.block_time_s)

    # --- commit-reveal ---

    def _reveal_block(self, commit_block: int, hyperparameters: SubnetHyperparameters) -> int:
        """The block a commit made at ``commit_block`` is revealed: the first block of the epoch
        ``reveal_period_epochs`` after the commit's (reveal_crv3_commits_for_subnet reveals the
        commits of epoch e at the start of epoch e + RevealPeriodEpochs); epochs are ``tempo``
        blocks from block 0."""
        tempo = max(1, hyperparameters.tempo)
        return (commit_block // tempo + hyperparameters.reveal_period_epochs) * tempo

    def _reveal_due(self, connection: sqlite3.Connection) -> None:
        """Apply (or drop, as the chain silently does when do_set_weights fails) every pending commit
        whose reveal block has come, in the order they were made."""
        block = self._block_at(connection)
        due = connection.execute(
            "SELECT id, hotkey, weights, version_key, reveal_block FROM weight_commits "
            "WHERE outcome IS NULL AND reveal_block <= ? ORDER BY reveal_block, id", (block,)).fetchall()
        for commit_id, hotkey, weights, version_key, reveal_block in due:
            values = {int(uid): weight for uid, weight in json.loads(weights).items()}
            try:
                self._apply_weights(connection, hotkey, values, version_key, reveal_block)
                outcome = "revealed"
            except ChainError as error:
                outcome = f"dropped: {error}"
                logger.info("dev chain: the weights %s committed for block %d were dropped at their reveal: %s",
                            hotkey, reveal_block, error)
            connection.execute("UPDATE weight_commits SET outcome = ? WHERE id = ?", (outcome, commit_id))

    def _apply_weights(self, connection: sqlite3.Connection, hotkey: str, weights: Mapping[int, float],
                       version_key: int, block: int) -> None:
        """Subtensor's internal_set_weights without the rate limit: check, then store normalized."""
        setter = connection.execute("SELECT uid, validator_permit FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone()
        if setter is None:
            raise ChainError(f"HotKeyNotRegisteredInSubNet: hotkey {hotkey} is not registered on subnet {self.netuid}")
        uids = {uid for (uid,) in connection.execute("SELECT uid FROM neurons")}
        refusal = weights_refusal(weights, setter[0], bool(setter[1]), self._owner_uid_in(connection), version_key,
                                  uids, self._hyperparameters_in(connection))
        if refusal:
            raise ChainError(f"cannot set weights: {refusal}")
        total = sum(weights.values())
        connection.execute("DELETE FROM weights WHERE setter_uid = ?", (setter[0],))
        connection.executemany(
            "INSERT INTO weights (setter_uid, target_uid, weight, version_key, block) VALUES (?, ?, ?, ?, ?)",
            [(setter[0], uid, weight / total, int(version_key), block) for uid, weight in weights.items() if weight],
        )

    # --- Chain ---

    def current_block(self) -> int:
        return self._block_of(self._snapshot())

    def metagraph(self) -> Metagraph:
        snapshot = self._snapshot()
        return Metagraph(self.netuid, self._block_of(snapshot), snapshot.neurons)

    def neuron(self, hotkey: str) -> NeuronInfo | None:
        return self._snapshot().by_hotkey.get(hotkey)

    @staticmethod
    def _neuron(row: tuple) -> NeuronInfo:
        uid, hotkey, coldkey, stake, permit, host, port = row
        endpoint = Endpoint(host, port) if host is not None and port is not None else None
        return NeuronInfo(uid, hotkey, coldkey, float(stake), bool(permit), endpoint)

    def owner_uid(self) -> int | None:
        """The owner hotkey's uid (``set_owner``; without one set, uid 0's hotkey is the owner), or
        None when the owner's hotkey holds no uid."""
        try:
            with self._connect() as connection:
                hotkey, _ = self._owner_in(connection)
                if hotkey is None:
                    raise ChainError(f"dev chain {self.path} has no subnet owner: register a neuron or run set-owner")
                return self._owner_uid_in(connection)
        except sqlite3.Error as error:
            raise ChainError(f"dev chain {self.path}: {error}") from None

    def hyperparameters(self) -> SubnetHyperparameters:
        try:
            with self._connect() as connection:
                return self._hyperparameters_in(connection)
        except sqlite3.Error as error:
            raise ChainError(f"dev chain {self.path}: {error}") from None

    def publish_endpoint(self, wallet, host: str, port: int) -> None:
        """Store ``host:port`` for ``wallet``'s hotkey under subtensor's serve_axon rules: an IP address
        (validate_serve_axon), not the loopback one unless this file allows it (allow-loopback), a
        port other than 0 (validate_axon_data), within the serving rate limit (axon_passes_rate_limit)."""
        hotkey = _hotkey_of(wallet)
        try:
            address = str(ipaddress.ip_address(host))
        except ValueError:
            raise ChainError(f"invalid endpoint host {host!r}: the chain stores an IPv4 or IPv6 address") from None
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ChainError(f"invalid endpoint {host!r}:{port!r}: InvalidPort, need a port in 1..65535")
        with self._write() as connection:
            row = connection.execute("SELECT uid, host, port, served_block FROM neurons WHERE hotkey = ?",
                                     (hotkey,)).fetchone()
            if row is None:
                raise ChainError(f"cannot publish an endpoint: HotKeyNotRegisteredInNetwork: hotkey {hotkey} is not "
                                 f"registered on subnet {self.netuid}")
            uid, old_host, old_port, served_block = row
            if (old_host, old_port) == (address, port):
                return
            refusal = refused_axon_address(address)
            if refusal and self._meta(connection, "allow_loopback_axons") != "1":
                raise ChainError(f"cannot publish {address}:{port}: {refusal} (a dev chain file stores it only "
                                 "with allow-loopback, as the local network sets)")
            block = self._block_at(connection)
            wait = blocks_until_allowed(block, served_block, self._hyperparameters_in(connection).serving_rate_limit)
            if wait:
                raise RateLimited(wait, f"cannot publish an endpoint: ServingRateLimitExceeded: uid {uid} published "
                                        f"one at block {served_block}; wait {wait} more blocks")
            connection.execute("UPDATE neurons SET host = ?, port = ?, served_block = ? WHERE uid = ?",
                               (address, port, block, uid))

    def set_weights(self, wallet, weights: Mapping[int, float], version_key: int,
                    hotkeys: Mapping[int, str] | None = None) -> WeightsSubmission:
        """Set ``wallet``'s weights (stored normalized to sum 1, as the chain does), or commit them when
        the subnet runs commit-reveal, under subtensor's rules (module docstring)."""
        hotkey = _hotkey_of(wallet)
        values = {int(uid): float(weight) for uid, weight in weights.items()}
        bad = {uid: w for uid, w in values.items() if not math.isfinite(w) or w < 0}
        if bad:
            raise ChainError(f"weights must be finite and non-negative; got {bad}")
        if sum(values.values()) <= 0:
            raise ChainError("weights are empty or all zero")
        with self._write() as connection:
            setter = connection.execute("SELECT uid, last_update FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone()
            if setter is None:
                raise ChainError(f"cannot set weights: HotKeyNotRegisteredInSubNet: hotkey {hotkey} is not registered "
                                 f"on subnet {self.netuid}")
            holders = dict(connection.execute("SELECT uid, hotkey FROM neurons").fetchall())
            changed = {uid: (planned, holders.get(uid)) for uid, planned in (hotkeys or {}).items()
                       if holders.get(uid) != planned}
            if changed:
                raise UidsChanged(changed)
            uid, last_update = setter
            block = self._block_at(connection)
            hyperparameters = self._hyperparameters_in(connection)
            # check_rate_limit, for set_weights and for commits alike (each sets LastUpdate).
            wait = blocks_until_allowed(block, last_update, hyperparameters.weights_rate_limit)
            if wait:
                name = "CommittingWeightsTooFast" if hyperparameters.commit_reveal_enabled else "SettingWeightsTooFast"
                raise RateLimited(wait, f"cannot set weights: {name}: uid {uid} set weights at block {last_update}; the "
                                        f"rate limit is {hyperparameters.weights_rate_limit} blocks: wait {wait} more")
            if hyperparameters.commit_reveal_enabled:
                pending = connection.execute("SELECT COUNT(*) FROM weight_commits WHERE hotkey = ? AND outcome IS NULL",
                                             (hotkey,)).fetchone()[0]
                if pending >= MAX_UNREVEALED_COMMITS:
                    raise ChainError(f"cannot commit weights: TooManyUnrevealedCommits: {pending} commits of uid {uid} "
                                     "wait for their reveal")
                reveal_block = self._reveal_block(block, hyperparameters)
                connection.execute(
                    "INSERT INTO weight_commits (hotkey, weights, version_key, commit_block, reveal_block) "
                    "VALUES (?, ?, ?, ?, ?)", (hotkey, json.dumps(values), int(version_key), block, reveal_block))
                submission = WeightsSubmission(block, True, f"committed at block {block}, revealed at block "
                                                            f"{reveal_block}")
            else:
                self._apply_weights(connection, hotkey, values, version_key, block)
                submission = WeightsSubmission(block, False, f"set at block {block}")
            connection.execute("UPDATE neurons SET last_update = ? WHERE uid = ?", (block, uid))
        return submission

    def api_location(self) -> ApiLocation | None:
        rows = self._read("SELECT value FROM meta WHERE key = 'identity_additional'")
        return decode_api_location(rows[0][0]) if rows else None

    def publish_api_location(self, wallet, location: ApiLocation) -> None:
        """Write ``location`` into the subnet identity, as subtensor's set_subnet_identity does only for
        the coldkey that owns the subnet (NotSubnetOwner otherwise)."""
        coldkey = _coldkey_of(wallet)
        with self._write() as connection:
            _, owner_coldkey = self._owner_in(connection)
            if coldkey != owner_coldkey:
                raise ChainError(f"cannot set the subnet identity: NotSubnetOwner: coldkey {coldkey} does not own "
                                 f"subnet {self.netuid}")
            additional = self._meta(connection, "identity_additional")
            self._set_meta(connection, "identity_additional", encode_api_location(additional, location))

    # --- dev-chain only ---

    def register(self, hotkey: str, coldkey: str, stake: float = 0.0, validator_permit: bool = False) -> int:
        """Register ``hotkey`` on the subnet and return its uid: a uid left free by :meth:`deregister`,
        else the next one (append_neuron) while the subnet has fewer than ``max_allowed_uids``, else
        the uid of the neuron it replaces (replace_neuron; see :meth:`prune_candidate`)."""
        for role, address in (("hotkey", hotkey), ("coldkey", coldkey)):
            try:
                decode_ss58(address)
            except ValueError:
                raise ChainError(f"{role} {address!r} is not an ss58 address") from None
        if not (math.isfinite(stake) and stake >= 0):
            raise ChainError(f"stake must be finite and non-negative, got {stake}")
        with self._write() as connection:
            if connection.execute("SELECT 1 FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone():
                raise ChainError(f"hotkey {hotkey} is already registered on subnet {self.netuid}")
            block = self._block_at(connection)
            uids = {uid for (uid,) in connection.execute("SELECT uid FROM neurons")}
            size = max(uids, default=-1) + 1
            free = sorted(set(range(size)) - uids)
            if free:
                uid = free[0]
            elif size < self._hyperparameters_in(connection).max_allowed_uids:
                uid = size
            else:
                uid = self._prune_candidate_in(connection, block)
                replaced = connection.execute("SELECT hotkey FROM neurons WHERE uid = ?", (uid,)).fetchone()[0]
                self._clear_neuron(connection, uid)
                connection.execute("DELETE FROM neurons WHERE uid = ?", (uid,))
                logger.info("dev subnet %d is full: %s replaces %s at uid %d", self.netuid, hotkey, replaced, uid)
            # append_neuron and replace_neuron set the uid's LastUpdate to the registration block.
            connection.execute(
                "INSERT INTO neurons (uid, hotkey, coldkey, stake, validator_permit, last_update, registered_block) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (uid, hotkey, coldkey, float(stake), int(validator_permit), block, block),
            )
        logger.info("registered %s as uid %d on dev subnet %d", hotkey, uid, self.netuid)
        return uid

    def _prune_candidate_in(self, connection: sqlite3.Connection, block: int) -> int:
        """The uid a registration replaces on a full subnet: the neuron past its immunity period with
        the least stake (this chain has no emission to rank by), the earliest registered on a tie;
        never the owner's hotkey (replace_neuron skips it)."""
        owner_hotkey, _ = self._owner_in(connection)
        immunity = self._hyperparameters_in(connection).immunity_period
        row = connection.execute(
            "SELECT uid FROM neurons WHERE hotkey IS NOT ? AND registered_block + ? <= ? "
            "ORDER BY stake, registered_block, uid LIMIT 1", (owner_hotkey, immunity, block)).fetchone()
        if row is None:
            raise ChainError(f"subnet {self.netuid} is full and every neuron is within its immunity period "
                             f"({immunity} blocks) or the owner's: nothing can be replaced")
        return int(row[0])

    def register_wallet(self, wallet, stake: float = 0.0, validator_permit: bool = False) -> int:
        """Register a bittensor ``Wallet``'s hotkey (with its coldkey) and return the uid."""
        return self.register(wallet.hotkey.ss58_address, wallet.coldkeypub.ss58_address, stake, validator_permit)

    def deregister(self, hotkey: str) -> None:
        """Take ``hotkey`` off the subnet, as a chain pruning it does (clear_neuron: the weights it set
        go, those set on it become 0); its uid goes to the next registration."""
        with self._write() as connection:
            row = connection.execute("SELECT uid FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone()
            if row is None:
                raise ChainError(f"hotkey {hotkey} is not registered on subnet {self.netuid}")
            self._clear_neuron(connection, row[0])
            connection.execute("DELETE FROM neurons WHERE uid = ?", (row[0],))
        logger.info("deregistered %s (uid %d) from dev subnet %d", hotkey, row[0], self.netuid)

    def set_validator_permit(self, hotkey: str, permit: bool) -> None:
        with self._write() as connection:
            if not connection.execute(
                "UPDATE neurons SET validator_permit = ? WHERE hotkey = ?", (int(permit), hotkey)
            ).rowcount:
                raise ChainError(f"hotkey {hotkey} is not registered on subnet {self.netuid}")

    def set_owner(self, hotkey: str, coldkey: str | None = None) -> None:
        """Make ``hotkey`` the subnet owner's hotkey and ``coldkey`` its owning coldkey (default: the
        coldkey ``hotkey`` is registered with). The owner's hotkey needs a uid to receive weight."""
        with self._write() as connection:
            if coldkey is None:
                row = connection.execute("SELECT coldkey FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone()
                if row is None:
                    raise ChainError(f"hotkey {hotkey} is not registered on subnet {self.netuid}: name the owner's "
                                     "coldkey too")
                coldkey = row[0]
            self._set_meta(connection, "owner_hotkey", hotkey)
            self._set_meta(connection, "owner_coldkey", coldkey)

    def set_hyperparameters(self, **values: int | bool) -> SubnetHyperparameters:
        """Change some of the subnet's hyperparameters (names: :class:`SubnetHyperparameters`'s
        fields); returns them all. ChainError names an unknown or invalid one."""
        unknown = sorted(set(values) - set(HYPERPARAMETER_NAMES))
        if unknown:
            raise ChainError(f"unknown hyperparameters {unknown}; known: {', '.join(HYPERPARAMETER_NAMES)}")
        for name, value in values.items():
            if name == "commit_reveal_enabled":
                if not isinstance(value, bool):
                    raise ChainError(f"{name} must be true or false, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ChainError(f"{name} must be a non-negative integer, got {value!r}")
        if values.get("max_weight_limit", 0) > U16_MAX:
            raise ChainError(f"max_weight_limit is a u16: at most {U16_MAX}")
        if values.get("tempo", 1) < 1 or values.get("reveal_period_epochs", 1) < 1:
            raise ChainError("tempo and reveal_period_epochs must be at least 1")
        with self._write() as connection:
            updated = dataclasses.replace(self._hyperparameters_in(connection), **values)
            self._set_meta(connection, "hyperparameters", json.dumps(dataclasses.asdict(updated)))
        return updated

    def allow_loopback_axons(self, allowed: bool) -> None:
        """Let this file store loopback endpoints, which subtensor refuses: only for a network whose
        servers all run on this machine and listen on 127.0.0.1 (the local network)."""
        with self._write() as connection:
            self._set_meta(connection, "allow_loopback_axons", "1" if allowed else "0")

    def advance(self, blocks: int) -> int:
        """Move the chain ``blocks`` ahead at once; returns the new current block."""
        if blocks < 0:
            raise ChainError(f"the chain only moves forward; got {blocks} blocks")
        with self._write() as connection:
            connection.execute(
                "UPDATE meta SET value = CAST(value AS INTEGER) + ? WHERE key = 'block_offset'", (int(blocks),)
            )
            return self._block_at(connection)

    def weights(self) -> dict[int, dict[int, float]]:
        """The weights on chain: setter uid -> {target uid: weight} (each setter's sum is 1, less the
        weight on uids that changed hands since). Commits are here once revealed."""
        with self._write() as connection:
            rows = connection.execute(
                "SELECT setter_uid, target_uid, weight FROM weights ORDER BY setter_uid, target_uid").fetchall()
        result: dict[int, dict[int, float]] = {}
        for setter, target, weight in rows:
            result.setdefault(setter, {})[target] = weight
        return result

    def commits(self) -> list[WeightCommit]:
        """Every commit of weights, oldest first, with its outcome once its reveal block has come."""
        with self._write() as connection:
            rows = connection.execute("SELECT hotkey, weights, version_key, commit_block, reveal_block, outcome "
                                      "FROM weight_commits ORDER BY id").fetchall()
        return [WeightCommit(hotkey, {int(uid): w for uid, w in json.loads(weights).items()}, version_key,
                             commit_block, reveal_block, outcome)
                for hotkey, weights, version_key, commit_block, reveal_block, outcome in rows]


# --- CLI ---


def _print_neurons(chain: DevChain, console: Console) -> None:
    metagraph = chain.metagraph()
    table = Table(title=f"dev subnet {chain.netuid} at block {metagraph.block}")
    for column in ("uid", "hotkey", "coldkey", "stake", "validator", "endpoint"):
        table.add_column(column)
    for n in metagraph.neurons:
        table.add_row(str(n.uid), n.hotkey, n.coldkey, f"{n.stake:g}", "yes" if n.validator_permit else "",
                      n.endpoint.base_url if n.endpoint else "")
    console.print(table)


def _print_weights(chain: DevChain, console: Console) -> None:
    table = Table(title=f"weights on dev subnet {chain.netuid}")
    for column in ("setter uid", "target uid", "weight"):
        table.add_column(column)
    for setter, targets in chain.weights().items():
        for target, weight in targets.items():
            table.add_row(str(setter), str(target), f"{weight:.6f}")
    console.print(table)


def _print_commits(chain: DevChain, console: Console) -> None:
    table = Table(title=f"weight commits on dev subnet {chain.netuid}")
    for column in ("hotkey", "commit block", "reveal block", "outcome"):
        table.add_column(column)
    for commit in chain.commits():
        table.add_row(commit.hotkey, str(commit.commit_block), str(commit.reveal_block), commit.outcome or "pending")
    console.print(table)


def _print_hyperparameters(chain: DevChain, console: Console) -> None:
    table = Table(title=f"hyperparameters of dev subnet {chain.netuid}")
    table.add_column("name")
    table.add_column("value", justify="right")
    table.add_column("finney's default", justify="right")
    current = chain.hyperparameters()
    for name in HYPERPARAMETER_NAMES:
        table.add_row(name, str(getattr(current, name)), str(getattr(FINNEY, name)))
    console.print(table)


def _hyperparameter_value(name: str, raw: str) -> int | bool:
    if name == "commit_reveal_enabled":
        lowered = raw.strip().lower()
        if lowered not in ("true", "false", "1", "0"):
            raise ChainError(f"{name} takes true or false, got {raw!r}")
        return lowered in ("true", "1")
    try:
        return int(raw)
    except ValueError:
        raise ChainError(f"{name} takes an integer, got {raw!r}") from None


def main(argv: list[str] | None = None, prog: str = "quasar devchain") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--path", required=True, help="the dev chain's SQLite file (created when missing)")
    parser.add_argument("--netuid", type=int, default=None, help="subnet id for a new file (default 24)")
    parser.add_argument("--block-time", type=float, default=None, help="seconds per block for a new file (default 12)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("init", help="create the file (no-op when it exists)")
    register = commands.add_parser("register", help="register a hotkey; prints its uid")
    register.add_argument("--hotkey", required=True, help="hotkey ss58 address")
    register.add_argument("--coldkey", required=True, help="coldkey ss58 address")
    register.add_argument("--stake", type=float, default=0.0)
    register.add_argument("--validator", action="store_true", help="give it a validator permit")
    deregister = commands.add_parser("deregister", help="take a hotkey off the subnet (its uid goes to the next one)")
    deregister.add_argument("--hotkey", required=True)
    owner = commands.add_parser("set-owner", help="make a hotkey (and its coldkey) the subnet owner")
    owner.add_argument("--hotkey", required=True)
    owner.add_argument("--coldkey", default=None, help="the owning coldkey (default: the hotkey's registered one)")
    permit = commands.add_parser("set-permit", help="grant or revoke a validator permit")
    permit.add_argument("--hotkey", required=True)
    permit.add_argument("--revoke", action="store_true")
    advance = commands.add_parser("advance", help="move the chain N blocks ahead")
    advance.add_argument("blocks", type=int)
    commands.add_parser("block", help="print the current block")
    commands.add_parser("neurons", help="list the neurons")
    commands.add_parser("weights", help="list the weights validators set (revealed ones, on commit-reveal)")
    commands.add_parser("commits", help="list the weight commits and what became of them")
    commands.add_parser("hyperparameters", help="list the subnet's hyperparameters beside finney's defaults")
    hyperparameter = commands.add_parser("set-hyperparameter", help="change one hyperparameter")
    hyperparameter.add_argument("name", choices=HYPERPARAMETER_NAMES)
    hyperparameter.add_argument("value", help="an integer (true or false for commit_reveal_enabled)")
    loopback = commands.add_parser("allow-loopback", help="let this file store loopback endpoints (subtensor "
                                                          "refuses them; the local network needs them)")
    loopback.add_argument("state", choices=("on", "off"))
    commands.add_parser("identity", help="print the API location published in the subnet identity")
    args = parser.parse_args(argv)
    setup_logging(quiet=True)
    console = Console()
    try:
        chain = DevChain(args.path, netuid=args.netuid, block_time_s=args.block_time)
        if args.command == "register":
            print(chain.register(args.hotkey, args.coldkey, args.stake, args.validator))
        elif args.command == "deregister":
            chain.deregister(args.hotkey)
        elif args.command == "set-owner":
            chain.set_owner(args.hotkey, args.coldkey)
        elif args.command == "set-permit":
            chain.set_validator_permit(args.hotkey, not args.revoke)
        elif args.command == "advance":
            print(chain.advance(args.blocks))
        elif args.command == "block":
            print(chain.current_block())
        elif args.command == "neurons":
            _print_neurons(chain, console)
        elif args.command == "weights":
            _print_weights(chain, console)
        elif args.command == "commits":
            _print_commits(chain, console)
        elif args.command == "hyperparameters":
            _print_hyperparameters(chain, console)
        elif args.command == "set-hyperparameter":
            chain.set_hyperparameters(**{args.name: _hyperparameter_value(args.name, args.value)})
            _print_hyperparameters(chain, console)
        elif args.command == "allow-loopback":
            chain.allow_loopback_axons(args.state == "on")
        elif args.command == "identity":
            location = chain.api_location()
            print("no API location published" if location is None else f"{location.url} {location.hotkey}".strip())
    except ChainError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m quasar.chain.devchain"))
