"""The embedded local dev chain: a Bittensor-like subnet in one SQLite file, for one-machine runs and tests.

Blocks advance with time: ``block = offset + floor((now - genesis) / block_time)``, where the
genesis time and the block time are stored in the file when it is created, so every process that
opens the file agrees on the block number. ``advance(n)`` moves the chain ``n`` blocks ahead at once
(tests, demos). The file also holds the subnet's neurons (uid, hotkey, coldkey, stake, validator
permit, published endpoint), the weights validators set and the subnet owner.

Several processes may use one file at the same time: SQLite in WAL mode, a busy timeout, and every
write in a ``BEGIN IMMEDIATE`` transaction. Reads are served from a snapshot of the file (the block
offset and the neurons) that each thread keeps on a connection of its own and reads again only
after some connection, in any process, committed to the file (``PRAGMA data_version``): exact, and
a few microseconds instead of opening the file for every lookup.

CLI (``python -m quasar.chain.devchain --path FILE COMMAND``): ``init``, ``register``,
``set-owner``, ``set-permit``, ``advance``, ``block``, ``neurons``, ``weights``.
"""

from __future__ import annotations

import argparse
import contextlib
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

from quasar.chain.base import Chain, ChainError, Endpoint, Metagraph, NeuronInfo

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_TIME_S = 12.0
DEFAULT_NETUID = 24
MAX_NEURONS = 256  # Bittensor's usual subnet size; the dev chain never prunes.
BUSY_TIMEOUT_S = 30.0

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
"""


@dataclass(frozen=True)
class _Snapshot:
    """What the dev chain's readers need from the file, as of its commit ``data_version``."""

    data_version: int
    block_offset: int
    neurons: tuple[NeuronInfo, ...]
    by_hotkey: dict[str, NeuronInfo]


def _hotkey_of(wallet) -> str:
    """The ss58 address of ``wallet``'s hotkey (a Wallet, a keypair or a Signer)."""
    return resolve_signer(wallet, role="hotkey").ss58_address


class DevChain(Chain):
    """A dev subnet stored in the SQLite file ``path`` (created when missing, never reset).

    ``netuid`` and ``block_time_s`` are used when the file is created; an existing file keeps the
    values it was created with (opening it with a different ``netuid`` is an error).
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
            with self._write() as connection:
                meta = dict(connection.execute("SELECT key, value FROM meta").fetchall())
                if not meta:
                    meta = {
                        "netuid": str(DEFAULT_NETUID if netuid is None else netuid),
                        "block_time_s": repr(block_time_s or DEFAULT_BLOCK_TIME_S),
                        "genesis_time": repr(time.time()),
                        "block_offset": "0",
                    }
                    connection.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta.items())
                    logger.info("created dev chain %s (netuid %s, %s s per block)", self.path,
                                meta["netuid"], meta["block_time_s"])
        except sqlite3.Error as error:
            raise ChainError(f"cannot open dev chain file {self.path}: {error}") from None
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
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (no upgrade deadlocks)."""
        with self._connect() as connection:
            connection.execute("BEGIN IMMEDIATE")
            try:
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
                rows = connection.execute(
                    "SELECT uid, hotkey, coldkey, stake, validator_permit, host, port FROM neurons ORDER BY uid"
                ).fetchall()
            finally:
                connection.execute("COMMIT")
        except (OSError, sqlite3.Error) as error:
            raise ChainError(f"dev chain {self.path}: {error}") from None
        neurons = tuple(self._neuron(row) for row in rows)
        local.snapshot = _Snapshot(version, int(offset), neurons, {n.hotkey: n for n in neurons})
        return local.snapshot

    def _block_of(self, snapshot: _Snapshot) -> int:
        return snapshot.block_offset + int((time.time() - self._genesis_time) // self.block_time_s)

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

    def owner_uid(self) -> int:
        """The owner hotkey's uid (``set_owner``); without one set, uid 0, as the subnet creator's."""
        rows = self._read(
            "SELECT n.uid FROM meta m JOIN neurons n ON n.hotkey = m.value WHERE m.key = 'owner_hotkey'"
        )
        if rows:
            return int(rows[0][0])
        if self._read("SELECT uid FROM neurons WHERE uid = 0"):
            return 0
        raise ChainError(f"dev chain {self.path} has no subnet owner: register a neuron or run set-owner")

    def publish_endpoint(self, wallet, host: str, port: int) -> None:
        hotkey = _hotkey_of(wallet)
        if not host or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ChainError(f"invalid endpoint {host!r}:{port!r}: need a host and a port in 1..65535")
        with self._write() as connection:
            updated = connection.execute(
                "UPDATE neurons SET host = ?, port = ? WHERE hotkey = ?", (host, port, hotkey)
            ).rowcount
        if not updated:
            raise ChainError(f"cannot publish an endpoint: hotkey {hotkey} is not registered on subnet {self.netuid}")

    def set_weights(self, wallet, weights: Mapping[int, float], version_key: int) -> None:
        """Store ``wallet``'s weights, normalized to sum 1 as the chain does; validators only."""
        hotkey = _hotkey_of(wallet)
        values = {int(uid): float(weight) for uid, weight in weights.items()}
        bad = {uid: w for uid, w in values.items() if not math.isfinite(w) or w < 0}
        if bad:
            raise ChainError(f"weights must be finite and non-negative; got {bad}")
        total = sum(values.values())
        if total <= 0:
            raise ChainError("weights are empty or all zero")
        with self._write() as connection:
            setter = connection.execute(
                "SELECT uid, validator_permit FROM neurons WHERE hotkey = ?", (hotkey,)
            ).fetchone()
            if setter is None:
                raise ChainError(f"cannot set weights: hotkey {hotkey} is not registered on subnet {self.netuid}")
            if not setter[1]:
                raise ChainError(f"cannot set weights: hotkey {hotkey} has no validator permit")
            known = {uid for (uid,) in connection.execute("SELECT uid FROM neurons")}
            unknown = sorted(set(values) - known)
            if unknown:
                raise ChainError(f"cannot set weights on unregistered uids {unknown}")
            block = self._block_at(connection)
            connection.execute("DELETE FROM weights WHERE setter_uid = ?", (setter[0],))
            connection.executemany(
                "INSERT INTO weights (setter_uid, target_uid, weight, version_key, block) VALUES (?, ?, ?, ?, ?)",
                [(setter[0], uid, weight / total, int(version_key), block) for uid, weight in values.items()],
            )

    # --- dev-chain only ---

    def register(self, hotkey: str, coldkey: str, stake: float = 0.0, validator_permit: bool = False) -> int:
        """Register ``hotkey`` on the subnet and return its uid (the lowest free one)."""
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
            uids = {uid for (uid,) in connection.execute("SELECT uid FROM neurons")}
            uid = next((u for u in range(MAX_NEURONS) if u not in uids), None)
            if uid is None:
                raise ChainError(f"subnet {self.netuid} is full ({MAX_NEURONS} neurons)")
            connection.execute(
                "INSERT INTO neurons (uid, hotkey, coldkey, stake, validator_permit, registered_block) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (uid, hotkey, coldkey, float(stake), int(validator_permit), self._block_at(connection)),
            )
        logger.info("registered %s as uid %d on dev subnet %d", hotkey, uid, self.netuid)
        return uid

    def register_wallet(self, wallet, stake: float = 0.0, validator_permit: bool = False) -> int:
        """Register a bittensor ``Wallet``'s hotkey (with its coldkey) and return the uid."""
        return self.register(wallet.hotkey.ss58_address, wallet.coldkeypub.ss58_address, stake, validator_permit)

    def deregister(self, hotkey: str) -> None:
        """Remove ``hotkey`` from the subnet (as when a chain prunes a neuron), with the weights it
        set and those set on it."""
        with self._write() as connection:
            row = connection.execute("SELECT uid FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone()
            if row is None:
                raise ChainError(f"hotkey {hotkey} is not registered on subnet {self.netuid}")
            connection.execute("DELETE FROM weights WHERE setter_uid = ? OR target_uid = ?", (row[0], row[0]))
            connection.execute("DELETE FROM neurons WHERE uid = ?", (row[0],))
        logger.info("deregistered %s (uid %d) from dev subnet %d", hotkey, row[0], self.netuid)

    def set_validator_permit(self, hotkey: str, permit: bool) -> None:
        with self._write() as connection:
            if not connection.execute(
                "UPDATE neurons SET validator_permit = ? WHERE hotkey = ?", (int(permit), hotkey)
            ).rowcount:
                raise ChainError(f"hotkey {hotkey} is not registered on subnet {self.netuid}")

    def set_owner(self, hotkey: str) -> None:
        """Make ``hotkey`` the subnet owner (it must be registered to receive weight)."""
        with self._write() as connection:
            connection.execute(
                "INSERT INTO meta (key, value) VALUES ('owner_hotkey', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (hotkey,),
            )

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
        """The weights on chain: setter uid -> {target uid: weight} (each setter's sum is 1)."""
        result: dict[int, dict[int, float]] = {}
        for setter, target, weight in self._read(
            "SELECT setter_uid, target_uid, weight FROM weights ORDER BY setter_uid, target_uid"
        ):
            result.setdefault(setter, {})[target] = weight
        return result


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quasar.chain.devchain", description=__doc__.split("\n")[0])
    parser.add_argument("--path", required=True, help="the dev chain's SQLite file (created when missing)")
    parser.add_argument("--netuid", type=int, default=None, help="subnet id for a new file (default 24)")
    parser.add_argument("--block-time", type=float, default=None, help="seconds per block for a new file (default 12)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("init", help="create the file (no-op when it exists)")
    register = commands.add_parser("register", help="register a hotkey; prints its uid")
    register.add_argument("--hotkey", required=True, help="hotkey ss58 address")
    register.add_argument("--coldkey", required=True, help="coldkey ss58 address")
    register.add_argument("--stake", type=float, default=0.0)
    register.add_argument("--validator", action="store_true", help="give it a validator permit")
    owner = commands.add_parser("set-owner", help="make a hotkey the subnet owner")
    owner.add_argument("--hotkey", required=True)
    permit = commands.add_parser("set-permit", help="grant or revoke a validator permit")
    permit.add_argument("--hotkey", required=True)
    permit.add_argument("--revoke", action="store_true")
    advance = commands.add_parser("advance", help="move the chain N blocks ahead")
    advance.add_argument("blocks", type=int)
    commands.add_parser("block", help="print the current block")
    commands.add_parser("neurons", help="list the neurons")
    commands.add_parser("weights", help="list the weights validators set")
    args = parser.parse_args(argv)
    console = Console()
    try:
        chain = DevChain(args.path, netuid=args.netuid, block_time_s=args.block_time)
        if args.command == "register":
            print(chain.register(args.hotkey, args.coldkey, args.stake, args.validator))
        elif args.command == "set-owner":
            chain.set_owner(args.hotkey)
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
    except ChainError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
