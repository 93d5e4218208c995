"""The embedded local dev chain: a Bittensor-like subnet in one SQLite file, for one-machine runs and tests.

:class:`DevChain` is the :class:`~quasar.chain.Chain` of a subnet whose state is the file
(quasar/chain/devchain_storage.py: its blocks, neurons, weights, commits, owner, identity and
hyperparameters); ``advance(n)`` moves the chain ``n`` blocks ahead at once (tests, demos).

The rules the suite depends on are subtensor's, as the pure functions of
quasar/chain/subtensor_rules.py (each names the function of subtensor's pallet it follows), with
finney's defaults for a new subnet (:data:`FINNEY`) unless a file is given others
(``set_hyperparameters``, the CLI's ``set-hyperparameter``):

- weights: the chain's StakeThreshold (``set_stake_threshold``, the owner exempt; default 0), the
  weights rate limit, no more uids than the subnet's, version key, validator permit (the owner and
  a self-weight exempt), uids that exist, ``min_allowed_weights`` and ``max_weight_limit``, checked
  in that order (the runtime's dispatch extensions, then internal_set_weights'), so a call gets the
  error of the first rule it breaks;
- commit-reveal: with ``commit_reveal_enabled`` weights are committed, invisible, and applied (or
  silently dropped, as the chain drops a reveal that fails) at the start of the epoch
  ``reveal_period_epochs`` after the commit's, as those are when the reveal comes (a lowered period
  that has passed a commit's reveal drops it); epochs are ``tempo`` blocks from block 0, or from
  the last tempo change (the chain restarts its epoch cycle there); a hotkey makes at most 10
  commits an epoch while they wait (TooManyUnrevealedCommits);
- validator permits: each epoch's start, after its reveals, gives a permit to the largest nonzero
  stakes up to ``max_allowed_validators`` (``set_max_allowed_validators``, default 64), a stake
  below the StakeThreshold counting as none, and to the owner's uid, and takes every other; a
  neuron registers without one. ``register(validator_permit=True)`` and ``set_validator_permit``
  set a permit at once, as if an epoch had passed: the next epoch recomputes it;
- serving: the serving rate limit, and no loopback (127.0.0.1, ::1) nor all-ones address, which
  subtensor refuses; one allowance the real chain lacks, for the local network whose servers listen
  on 127.0.0.1 only: ``allow-loopback`` lets this file store loopback endpoints;
- identity: only the owner's coldkey writes it, its additional text at most 1024 bytes;
- registration: uids are appended up to ``max_allowed_uids``; then a registration replaces the
  neuron of least stake (never the owner's) among those past ``immunity_period`` while more than
  MinNonImmuneUids (``set_min_non_immune_uids``, default 10) of them remain, else among the immune
  ones; the replaced neuron loses its weights, its endpoint and its permit, and its uid keeps the
  weights others set on it at 0; a commit revealed after the uid changed hands gives it 0 too
  (Yuma's epoch masks a weight committed before the uid's registration);
- trimming (``trim_to_max_allowed_uids``, the owner's sudo_trim_to_max_allowed_uids): the subnet
  shrinks to a new max_allowed_uids, the least-staked neurons past their immunity going first, and
  the rest move to uids 0.. in their order (``set_min_allowed_uids``: the fewest it leaves, 64).

Its CLI (``quasar devchain``, ``python -m quasar.chain.devchain``) is quasar/chain/devchain_cli.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import logging
import math
import sqlite3
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bittensor import resolve_signer
from bittensor.sp_core import decode_ss58

from quasar.chain.base import (
    MAX_UNREVEALED_COMMITS,
    Chain,
    ChainError,
    Metagraph,
    RateLimited,
    UidsChanged,
    WeightsSubmission,
    decode_api_location,
    encode_api_location,
)
from quasar.chain.devchain_storage import (
    DevChainFile,
    Snapshot,
    WeightCommit,
    clear_neuron,
    commits_in,
    hyperparameters_in,
    mask_outdated,
    max_validators_in,
    meta,
    min_non_immune_uids_in,
    owner_in,
    owner_uid_in,
    permits_block_in,
    prune_candidate_in,
    set_hyperparameters_in,
    set_meta,
    stake_threshold_in,
    trim_neurons_in,
    weights_in,
)
from quasar.chain.subtensor_rules import (
    FINNEY,
    blocks_until_allowed,
    check_weights_rate_limit,
    checked_weights,
    hyperparameters_refusal,
    identity_refusal,
    next_epoch_block,
    refusal_error,
    refused_axon_address,
    reveal_block_for,
    stake_refusal,
    u16_weights,
    validator_permits,
    version_key_refusal,
    weights_refusal,
)

if TYPE_CHECKING:  # the records only annotated here
    from quasar.chain.base import ApiLocation, NeuronInfo, SubnetHyperparameters

__all__ = ["FINNEY", "DevChain", "WeightCommit"]

logger = logging.getLogger(__name__)


def _hotkey_of(wallet) -> str:
    """The ss58 address of ``wallet``'s hotkey (a Wallet, a keypair or a Signer)."""
    return resolve_signer(wallet, role="hotkey").ss58_address


def _coldkey_of(wallet) -> str:
    """The ss58 address of ``wallet``'s coldkey (read from its public file: nothing is unlocked)."""
    return resolve_signer(wallet, role="coldkey").ss58_address


class DevChain(Chain):
    """A dev subnet stored in the SQLite file ``path`` (created when missing, never reset).

    ``netuid`` and ``block_time_s`` are used when the file is created; an existing file keeps the
    values it was created with (opening it with a different ``netuid`` is an error). A new file
    has finney's hyperparameters (:data:`FINNEY`).
    """

    def __init__(self, path: str | Path, netuid: int | None = None, block_time_s: float | None = None):
        self._file = DevChainFile(path, netuid, block_time_s)
        self.path = self._file.path
        self.netuid = self._file.netuid
        self.block_time_s = self._file.block_time_s

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction of the file in which the epochs passed since the last write run
        first (:meth:`_run_epochs`), so every call meets the subnet as of its block."""
        with self._file.transaction() as connection:
            self._run_epochs(connection)
            yield connection

    def _snapshot(self) -> Snapshot:
        """The file's snapshot, once the epochs passed since the last write have run (their permits)."""
        snapshot = self._file.snapshot()
        if self._file.block_of(snapshot) < snapshot.next_epoch_block:
            return snapshot
        with self._write():
            pass
        return self._file.snapshot()

    def _run_epochs(self, connection: sqlite3.Connection) -> None:
        """What the chain did at the epoch starts passed since the last write: at each, the commits
        due are revealed, then the epoch recomputes the validator permits (block_step's order). The
        stakes do not change between two writes, so the first of them gives the permits of all."""
        block = self._file.block_at(connection)
        tempo, last = hyperparameters_in(connection).tempo, permits_block_in(connection)
        epoch = next_epoch_block(last, tempo, last)
        if epoch <= block:
            self._reveal_due(connection, epoch)
            self._grant_permits(connection)
            set_meta(connection, "permits_block", str(next_epoch_block(block, tempo, last) - max(1, tempo)))
        self._reveal_due(connection, block)

    def _grant_permits(self, connection: sqlite3.Connection) -> None:
        """run_epoch's validator permits (:func:`validator_permits`), every neuron's set anew."""
        stakes = dict(connection.execute("SELECT uid, stake FROM neurons").fetchall())
        threshold = stake_threshold_in(connection)
        permitted = validator_permits(stakes, max_validators_in(connection), threshold, owner_uid_in(connection))
        connection.execute("UPDATE neurons SET validator_permit = 0")
        connection.executemany("UPDATE neurons SET validator_permit = 1 WHERE uid = ?", [(uid,) for uid in permitted])

    # --- commit-reveal ---

    def _reveal_due(self, connection: sqlite3.Connection, block: int) -> None:
        """Apply (or drop, as the chain silently does when do_set_weights fails) every pending commit
        whose reveal block is ``block`` or earlier, in the order they were made."""
        due = connection.execute(
            "SELECT id, hotkey, weights, version_key, reveal_block FROM weight_commits "
            "WHERE outcome IS NULL AND reveal_block <= ? ORDER BY reveal_block, id",
            (block,),
        ).fetchall()
        for commit_id, hotkey, weights, version_key, reveal_block in due:
            values = {int(uid): weight for uid, weight in json.loads(weights).items()}
            try:
                self._apply_weights(connection, hotkey, values, version_key, reveal_block)
                mask_outdated(connection, hotkey)
                outcome = "revealed"
            except ChainError as error:
                outcome = f"dropped: {error}"
                logger.info(
                    "dev chain: the weights %s committed for block %d were dropped at their reveal: %s",
                    hotkey,
                    reveal_block,
                    error,
                )
            connection.execute("UPDATE weight_commits SET outcome = ? WHERE id = ?", (outcome, commit_id))

    def _check_stake(self, connection: sqlite3.Connection, hotkey: str) -> None:
        """Subtensor's check_weights_min_stake: ``hotkey``'s stake (0 when it holds no uid) at least the
        chain's StakeThreshold (:meth:`set_stake_threshold`), the owner's uid exempt."""
        threshold = stake_threshold_in(connection)
        row = connection.execute("SELECT uid, stake FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone()
        uid, stake = row if row else (None, 0.0)
        refusal = stake_refusal(hotkey, stake, threshold, owner=uid is not None and uid == owner_uid_in(connection))
        if refusal is not None:
            raise refusal_error(refusal.name, f"cannot set weights: {refusal}")

    def _apply_weights(
        self, connection: sqlite3.Connection, hotkey: str, weights: Mapping[int, float], version_key: int, block: int
    ) -> None:
        """Subtensor's internal_set_weights, its checks in its order (the error a call gets is the
        first that fails): no more uids than the subnet holds, registration, stake, version key, the
        rate limit (not on a commit-reveal subnet, whose commits are limited instead), then
        :func:`weights_refusal`'s; stores the weights the SDK sends (:func:`u16_weights`'s uids)
        normalized and, without commit-reveal, the uid's LastUpdate."""
        sent = u16_weights(weights)  # what the SDK sends: a weight that rounds to 0 is not
        size = connection.execute("SELECT COUNT(*) FROM neurons").fetchone()[0]
        if len(sent) > size:
            raise refusal_error(
                "UidsLengthExceedUidsInSubNet",
                f"cannot set weights: UidsLengthExceedUidsInSubNet: {len(sent)} weights, the subnet holds {size} uids",
            )
        setter = connection.execute(
            "SELECT uid, validator_permit, last_update FROM neurons WHERE hotkey = ?", (hotkey,)
        ).fetchone()
        if setter is None:
            raise refusal_error(
                "HotKeyNotRegisteredInSubNet",
                f"HotKeyNotRegisteredInSubNet: hotkey {hotkey} is not registered on subnet {self.netuid}",
            )
        uid, permit, last_update = setter
        self._check_stake(connection, hotkey)
        hyperparameters = hyperparameters_in(connection)
        refusal = version_key_refusal(version_key, hyperparameters)
        if refusal is None and not hyperparameters.commit_reveal_enabled:
            check_weights_rate_limit("SettingWeightsTooFast", uid, last_update, block, hyperparameters)
        if refusal is None:
            registered = {row[0] for row in connection.execute("SELECT uid FROM neurons")}
            owner_uid = owner_uid_in(connection)
            refusal = weights_refusal(weights, uid, bool(permit), owner_uid, registered, hyperparameters)
        if refusal is not None:
            raise refusal_error(refusal.name, f"cannot set weights: {refusal}")
        total = sum(weights[target] for target in sent)
        connection.execute("DELETE FROM weights WHERE setter_uid = ?", (uid,))
        connection.executemany(
            "INSERT INTO weights (setter_uid, target_uid, weight, version_key, block) VALUES (?, ?, ?, ?, ?)",
            [(uid, target, weights[target] / total, int(version_key), block) for target in sent],
        )
        if not hyperparameters.commit_reveal_enabled:
            connection.execute("UPDATE neurons SET last_update = ? WHERE uid = ?", (block, uid))

    # --- Chain ---

    def current_block(self) -> int:
        return self._file.block_of(self._file.snapshot())

    def metagraph(self) -> Metagraph:
        snapshot = self._snapshot()
        return Metagraph(self.netuid, self._file.block_of(snapshot), snapshot.neurons)

    def neuron(self, hotkey: str) -> NeuronInfo | None:
        return self._snapshot().by_hotkey.get(hotkey)

    def owner_uid(self) -> int | None:
        """The owner hotkey's uid (``set_owner``; without one set, uid 0's hotkey is the owner), or
        None when the owner's hotkey holds no uid."""
        try:
            with self._file.connect() as connection:
                hotkey, _ = owner_in(connection)
                if hotkey is None:
                    raise ChainError(f"dev chain {self.path} has no subnet owner: register a neuron or run set-owner")
                return owner_uid_in(connection)
        except sqlite3.Error as error:
            raise ChainError(f"dev chain {self.path}: {error}") from None

    def hyperparameters(self) -> SubnetHyperparameters:
        try:
            with self._file.connect() as connection:
                return hyperparameters_in(connection)
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
            row = connection.execute(
                "SELECT uid, host, port, served_block FROM neurons WHERE hotkey = ?", (hotkey,)
            ).fetchone()
            if row is None:
                raise ChainError(
                    f"cannot publish an endpoint: HotKeyNotRegisteredInNetwork: hotkey {hotkey} is not "
                    f"registered on subnet {self.netuid}"
                )
            uid, old_host, old_port, served_block = row
            if (old_host, old_port) == (address, port):
                return
            if refusal := refused_axon_address(address, allow_loopback=meta(connection, "allow_loopback_axons") == "1"):
                raise ChainError(f"cannot publish {address}:{port}: {refusal}")
            block = self._file.block_at(connection)
            wait = blocks_until_allowed(block, served_block, hyperparameters_in(connection).serving_rate_limit)
            if wait:
                raise RateLimited(
                    wait,
                    f"cannot publish an endpoint: ServingRateLimitExceeded: uid {uid} published "
                    f"one at block {served_block}; wait {wait} more blocks",
                )
            connection.execute(
                "UPDATE neurons SET host = ?, port = ?, served_block = ? WHERE uid = ?", (address, port, block, uid)
            )

    def set_weights(
        self, wallet, weights: Mapping[int, float], version_key: int, hotkeys: Mapping[int, str] | None = None
    ) -> WeightsSubmission:
        """Set ``wallet``'s weights (stored normalized to sum 1, as the chain does), or commit them when
        the subnet runs commit-reveal, under subtensor's rules (module docstring)."""
        hotkey = _hotkey_of(wallet)
        values = checked_weights(weights)
        with self._write() as connection:
            # Subtensor's CheckWeights extension checks the stake before the call runs, registered or not.
            self._check_stake(connection, hotkey)
            setter = connection.execute("SELECT uid, last_update FROM neurons WHERE hotkey = ?", (hotkey,)).fetchone()
            if setter is None:
                raise refusal_error(
                    "HotKeyNotRegisteredInSubNet",
                    f"cannot set weights: HotKeyNotRegisteredInSubNet: hotkey {hotkey} is not registered "
                    f"on subnet {self.netuid}",
                )
            holders = dict(connection.execute("SELECT uid, hotkey FROM neurons").fetchall())
            changed = {uid: (key, holders.get(uid)) for uid, key in (hotkeys or {}).items() if holders.get(uid) != key}
            if changed:
                raise UidsChanged(changed)
            block = self._file.block_at(connection)
            hyperparameters = hyperparameters_in(connection)
            if not hyperparameters.commit_reveal_enabled:  # the CheckRateLimits extension, before the call
                uid, last_update = setter
                check_weights_rate_limit("SettingWeightsTooFast", uid, last_update, block, hyperparameters)
                self._apply_weights(connection, hotkey, values, version_key, block)
                return WeightsSubmission(block, False, f"set at block {block}")
            return self._commit(connection, hotkey, setter, values, version_key, block)

    def _commit(
        self,
        connection: sqlite3.Connection,
        hotkey: str,
        setter: tuple[int, int],
        values: Mapping[int, float],
        version_key: int,
        block: int,
    ) -> WeightsSubmission:
        """Subtensor's commit of weights (internal_commit_timelocked_weights) after the stake and
        registration checks: the rate limit, at most 10 commits of the hotkey waiting in the current
        epoch (those due at this commit's reveal block); the commit sets the uid's LastUpdate. Its
        weights are checked only at the reveal."""
        uid, last_update = setter
        hyperparameters = hyperparameters_in(connection)
        check_weights_rate_limit("CommittingWeightsTooFast", uid, last_update, block, hyperparameters)
        reveal_block = reveal_block_for(block, hyperparameters, permits_block_in(connection))
        pending = connection.execute(
            "SELECT COUNT(*) FROM weight_commits WHERE hotkey = ? AND outcome IS NULL AND reveal_block = ?",
            (hotkey, reveal_block),
        ).fetchone()[0]
        if pending >= MAX_UNREVEALED_COMMITS:
            raise refusal_error(
                "TooManyUnrevealedCommits",
                f"cannot commit weights: TooManyUnrevealedCommits: {pending} commits of uid {uid} "
                "this epoch wait for their reveal",
            )
        connection.execute(
            "INSERT INTO weight_commits (hotkey, weights, version_key, commit_block, reveal_block) "
            "VALUES (?, ?, ?, ?, ?)",
            (hotkey, json.dumps(values), int(version_key), block, reveal_block),
        )
        connection.execute("UPDATE neurons SET last_update = ? WHERE uid = ?", (block, uid))
        return WeightsSubmission(block, True, f"committed at block {block}, revealed at block {reveal_block}")

    def _setting(self, key: str) -> str | None:
        rows = self._file.read("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def api_location(self) -> ApiLocation | None:
        additional = self._setting("identity_additional")
        return None if additional is None else decode_api_location(additional)

    def publish_api_location(self, wallet, location: ApiLocation) -> None:
        """Write ``location`` into the subnet identity, as subtensor's set_subnet_identity does only for
        the coldkey that owns the subnet (NotSubnetOwner otherwise), within :func:`identity_refusal`."""
        coldkey = _coldkey_of(wallet)
        with self._write() as connection:
            _, owner_coldkey = owner_in(connection)
            if coldkey != owner_coldkey:
                raise ChainError(
                    f"cannot set the subnet identity: NotSubnetOwner: coldkey {coldkey} does not own "
                    f"subnet {self.netuid}; sign with the wallet whose coldkey owns the subnet (--wallet.name)"
                )
            additional = encode_api_location(meta(connection, "identity_additional"), location)
            if refusal := identity_refusal(additional):
                raise ChainError(f"cannot set the subnet identity: {refusal}")
            set_meta(connection, "identity_additional", additional)

    # --- dev-chain only ---

    def register(self, hotkey: str, coldkey: str, stake: float = 0.0, validator_permit: bool = False) -> int:
        """Register ``hotkey`` on the subnet and return its uid: a uid left free by :meth:`deregister`,
        else the next one (append_neuron) while the subnet has fewer than ``max_allowed_uids``, else
        the uid of the neuron it replaces (replace_neuron; see :meth:`prune_candidate`). It has no
        validator permit until an epoch gives it one; ``validator_permit`` gives one now, as if an
        epoch had passed (the next one keeps it only for a stake among the largest)."""
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
            block = self._file.block_at(connection)
            uids = {uid for (uid,) in connection.execute("SELECT uid FROM neurons")}
            size = max(uids, default=-1) + 1
            free = sorted(set(range(size)) - uids)
            if free:
                uid = free[0]
            elif size < hyperparameters_in(connection).max_allowed_uids:
                uid = size
            else:
                uid = prune_candidate_in(connection, block, self.netuid)
                replaced = connection.execute("SELECT hotkey FROM neurons WHERE uid = ?", (uid,)).fetchone()[0]
                clear_neuron(connection, uid)
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
            clear_neuron(connection, row[0])
            connection.execute("DELETE FROM neurons WHERE uid = ?", (row[0],))
        logger.info("deregistered %s (uid %d) from dev subnet %d", hotkey, row[0], self.netuid)

    def set_validator_permit(self, hotkey: str, permit: bool) -> None:
        """Grant or take ``hotkey``'s validator permit now, as if an epoch had passed; the next epoch
        recomputes it by the chain's rule (module docstring)."""
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
                    raise ChainError(
                        f"hotkey {hotkey} is not registered on subnet {self.netuid}: name the owner's coldkey too"
                    )
                coldkey = row[0]
            set_meta(connection, "owner_hotkey", hotkey)
            set_meta(connection, "owner_coldkey", coldkey)

    def set_hyperparameters(self, **values: int | bool) -> SubnetHyperparameters:
        """Change some of the subnet's hyperparameters (names: :class:`SubnetHyperparameters`'s
        fields) at the current block, as subtensor's setters do (``set_hyperparameters_in``); returns
        them all. ChainError names an unknown or invalid one, or a max_allowed_uids below the subnet's size."""
        refusal = hyperparameters_refusal(values)
        if refusal:
            raise ChainError(refusal)
        fields: dict[str, Any] = dict(values)  # checked above: each has its field's type
        with self._write() as connection:
            updated = dataclasses.replace(hyperparameters_in(connection), **fields)
            set_hyperparameters_in(connection, updated, self._file.block_at(connection))
        return updated

    def set_stake_threshold(self, stake: float) -> None:
        """Set the chain's StakeThreshold: the least stake (in this file's units) a hotkey needs to
        set or commit weights, the owner's exempt; subtensor's default is 0, finney's is set by its
        governance."""
        if not (math.isfinite(stake) and stake >= 0):
            raise ChainError(f"the stake threshold must be finite and non-negative, got {stake}")
        with self._write() as connection:
            set_meta(connection, "stake_threshold", repr(float(stake)))

    def stake_threshold(self) -> float:
        """The chain's StakeThreshold (:meth:`set_stake_threshold`)."""
        return self._file.query(stake_threshold_in)

    def set_min_non_immune_uids(self, count: int) -> None:
        """Set the subnet's MinNonImmuneUids (default 10, subtensor's): a full subnet replaces a neuron
        past its immunity period only while more than ``count`` of them remain, else an immune one."""
        self._set_count("min_non_immune_uids", count)

    def _set_count(self, name: str, count: int) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ChainError(f"{name} must be a non-negative integer, got {count!r}")
        with self._write() as connection:
            set_meta(connection, name, str(count))

    def trim_to_max_allowed_uids(self, max_n: int) -> dict[int, int]:
        """Subtensor's sudo_trim_to_max_allowed_uids (:func:`trim_neurons_in`): old uid -> new uid of
        the neurons kept."""
        with self._write() as connection:
            return trim_neurons_in(connection, max_n, self._file.block_at(connection))

    def set_min_allowed_uids(self, count: int) -> None:
        """Set the subnet's MinAllowedUids (default 64, subtensor's): the fewest uids a trim leaves."""
        self._set_count("min_allowed_uids", count)

    def min_non_immune_uids(self) -> int:
        """The subnet's MinNonImmuneUids (:meth:`set_min_non_immune_uids`)."""
        return self._file.query(min_non_immune_uids_in)

    def set_max_allowed_validators(self, count: int) -> None:
        """Set the subnet's MaxAllowedValidators (default 64, init_new_network's): how many of the
        largest stakes an epoch gives a validator permit."""
        self._set_count("max_allowed_validators", count)

    def max_allowed_validators(self) -> int:
        """The subnet's MaxAllowedValidators (:meth:`set_max_allowed_validators`)."""
        return self._file.query(max_validators_in)

    def allow_loopback_axons(self, allowed: bool) -> None:
        """Let this file store loopback endpoints, which subtensor refuses: only for a network whose
        servers all run on this machine and listen on 127.0.0.1 (the local network)."""
        with self._write() as connection:
            set_meta(connection, "allow_loopback_axons", "1" if allowed else "0")

    def advance(self, blocks: int) -> int:
        """Move the chain ``blocks`` ahead at once; returns the new current block."""
        if blocks < 0:
            raise ChainError(f"the chain only moves forward; got {blocks} blocks")
        with self._write() as connection:
            connection.execute(
                "UPDATE meta SET value = CAST(value AS INTEGER) + ? WHERE key = 'block_offset'", (int(blocks),)
            )
            return self._file.block_at(connection)

    def last_update(self, hotkey: str) -> int:
        """``hotkey``'s LastUpdate: the block of its last weights, or commit on a commit-reveal subnet
        (never its reveal), else of its registration; the chain's epoch leaves out a validator whose
        LastUpdate is more than the subnet's ``activity_cutoff`` blocks old."""
        rows = self._file.read("SELECT last_update FROM neurons WHERE hotkey = ?", (hotkey,))
        if not rows:
            raise ChainError(f"hotkey {hotkey} is not registered on subnet {self.netuid}")
        return int(rows[0][0])

    def weights(self) -> dict[int, dict[int, float]]:
        """The weights on chain: setter uid -> {target uid: weight} (each setter's sum is 1, less the
        weight on uids that changed hands since). Commits are here once revealed."""
        with self._write() as connection:
            return weights_in(connection)

    def commits(self) -> list[WeightCommit]:
        """Every commit of weights, oldest first, with its outcome once its reveal block has come."""
        with self._write() as connection:
            return commits_in(connection)


if __name__ == "__main__":
    from quasar.chain.devchain_cli import main

    sys.exit(main(prog="python -m quasar.chain.devchain"))
