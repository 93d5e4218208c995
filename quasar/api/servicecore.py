"""What every part of the submission API's service shares: its settings, the chain, the database's
write transaction with a signed caller's checks, bans, and the input rules shared with the validator.

Every state change is one :meth:`Database.write` transaction that first locks what its rule reads
(the hotkey for the rate limit, the commit for the copy check, the validator for its leases, the
IP for its failure count, the submission row for a reveal), so a rule that reads before it writes
holds under concurrent requests. A signed request's own checks (its nonce was never used, its IP is
not banned) run in that same transaction, first (:class:`Authenticated`). Refusals raise
:class:`ApiError` with the HTTP status and a message for the caller.

The service is split along its jobs, each a class on this one: submissions and commit-reveal
(intake.py), the validators' work and reports (worklist.py), the consensus and the leaderboard
(judging.py); service.py puts them together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from quasar import auth, consensus
from quasar.api import admission, rules, schemas
from quasar.api.db import Database, IpBan, NonceLedger, ValidationFailure
from quasar.api.errors import ApiError
from quasar.chain import Chain, ChainError
from quasar.config import Settings
from quasar.forks import ForkError, normalize_fork_url, validate_commit_hash

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_REASON_STORED = 2000
# Nonces are kept a little longer than the freshness window that btauth/1 verification enforces,
# counted back from the newest nonce kept (db.NonceLedger).
NONCE_RETENTION_S = 2 * (auth.MAX_REQUEST_AGE_S + auth.ALLOWED_CLOCK_SKEW_S)


@dataclass(frozen=True)
class ApiConfig:
    """The settings the API runs with (quasar/config/settings.toml says each one's meaning)."""

    api_hotkey: str
    blocks_until_reveal: int
    reveal_window_blocks: int
    round_blocks: int
    submissions_per_hour: int
    evaluation_lease_s: float
    trusted_proxies: tuple[str, ...]
    allow_local_forks: bool
    tie_epsilon: float
    quorum_stake_share: float
    quorum_min_validators: int

    @property
    def quorum(self) -> consensus.Quorum:
        return consensus.Quorum(self.quorum_stake_share, self.quorum_min_validators)

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiConfig:
        """The settings of ``settings``. Local fork paths are accepted only on the dev chain, or where
        ALLOW_LOCAL_FORKS says so (docs/rules.md §3)."""
        copied = {field.name: getattr(settings, field.name) for field in fields(cls)}
        return cls(**{**copied, "allow_local_forks": settings.local_forks_allowed})


@dataclass(frozen=True)
class Authenticated:
    """A request whose ``btauth/1`` signature verified, and what is checked before its work runs:
    ``authorize`` (the chain: registered, validator permit; raises 403), then, first in the work's
    transaction, that ``nonce_ns`` is new for ``hotkey`` (else 401, a replay) and, with ``miner``
    set, that ``client_ip`` is not banned (403)."""

    hotkey: str
    nonce_ns: int
    client_ip: str
    miner: bool
    authorize: auth.Authorizer


def benchmarks_to_json(benchmarks: Mapping[int, float] | None) -> dict[str, float] | None:
    """Per-length figures as stored (JSON object keys are strings)."""
    return None if benchmarks is None else {str(length): float(tps) for length, tps in sorted(benchmarks.items())}


def benchmarks_from_json(stored: Mapping[str, float] | None) -> dict[int, float] | None:
    """Per-length figures as stored, keyed by length again."""
    return None if stored is None else {int(length): float(tps) for length, tps in stored.items()}


class ServiceCore:
    """The API's shared state and edges: one database, one chain, one clock."""

    def __init__(
        self,
        config: ApiConfig,
        chain: Chain,
        database: Database,
        clock: Callable[[], float] = time.time,
        fused_checks: bool = True,
    ):
        """``fused_checks``: a signed direct submission's checks in one statement while they pass
        (quasar/api/admission.py); False: one by one always (the reference)."""
        self.config = config
        self.chain = chain
        self.database = database
        self.clock = clock
        self.nonces = NonceLedger(database, NONCE_RETENTION_S, clock)
        self.fused_checks = (
            admission.fused_statement(database.dialect, retention_s=NONCE_RETENTION_S) if fused_checks else None
        )
        self.quorum = config.quorum

    # --- chain ---

    def _neurons(self) -> list:
        try:
            return list(self.chain.metagraph().neurons)
        except ChainError as error:
            raise ApiError(503, f"the chain is unavailable: {error}", {"Retry-After": "12"}) from None

    def validator_stakes(self) -> dict[str, float]:
        """The stake of each hotkey holding a validator permit now."""
        return {neuron.hotkey: neuron.stake for neuron in self._neurons() if neuron.validator_permit}

    def registered_hotkeys(self) -> list[str]:
        """The hotkeys registered on the subnet now."""
        return sorted({neuron.hotkey for neuron in self._neurons()})

    def electorate(self) -> consensus.Electorate:
        """The validators whose reports count now, weighted by their stake (quasar/consensus.py)."""
        return consensus.Electorate.from_stakes(self.validator_stakes())

    def current_block(self) -> int:
        try:
            return self.chain.current_block()
        except ChainError as error:
            raise ApiError(503, f"the chain is unavailable: {error}", {"Retry-After": "12"}) from None

    def current_round(self) -> schemas.RoundInfo:
        block = self.current_block()
        current = rules.round_of_block(block, self.config.round_blocks)
        left = current.blocks_left(block)
        return schemas.RoundInfo(
            round_id=current.round_id,
            start_block=current.start_block,
            end_block=current.end_block,
            current_block=block,
            blocks_left=left,
            seconds_left_estimate=left * self.chain.block_time_s,
        )

    def _round(self, round_id: int | None) -> int:
        if round_id is None:
            return rules.round_of_block(self.current_block(), self.config.round_blocks).round_id
        return round_id

    def past_round(self, round_id: int | None, parameter: str) -> bool:
        """Whether a read's query ``parameter`` (``round_id``; None: the current round) names a
        round before the current one. One that has not begun is refused (422): nothing to show, and
        a cache entry and a computation of the caller's making (docs/rules.md section 2)."""
        if round_id is None:
            return False
        current = self._round(None)
        if round_id > current:
            raise ApiError(422, f"{parameter}: round {round_id} has not begun; the current round is {current}")
        return round_id < current

    # --- input rules shared with the validator ---

    def _fork(self, fork_url: str, commit_hash: str) -> tuple[str, str]:
        try:
            url = normalize_fork_url(fork_url, allow_local=self.config.allow_local_forks)
        except ForkError as error:
            raise ApiError(422, f"fork_url: {error}") from None
        try:
            commit = validate_commit_hash(commit_hash)
        except ForkError as error:
            raise ApiError(422, f"commit_hash: {error}") from None
        return url, commit

    # --- the signed caller's checks, and bans ---

    def _refuse(self, session: Session, check: admission.Check, params: Mapping[str, object]) -> None:
        """Raise ``check``'s refusal for ``params`` (quasar/api/admission.py), if it refuses."""
        refusal = check.refusal(session.connection(), params)
        if refusal is not None:
            raise refusal

    def _write(
        self,
        work: Callable[[Session], T],
        caller: Authenticated | None,
        locks: Sequence[str] = (),
        fused: Callable[[Session], T | None] | None = None,
    ) -> T:
        """``work`` in one write transaction, after ``caller``'s checks (see :class:`Authenticated`).
        A request that ``work`` refuses still uses up its nonce (recorded then in a transaction of
        its own); a banned IP's does not. ``fused``: the same checks and work in fewer statements,
        tried first; it returns None, having written nothing, when a check fails, and then the
        checks and ``work`` run one by one (which raise the refusal)."""
        if caller is None:
            return self.database.write(work, locks=locks)
        caller.authorize(caller.hotkey)
        checked = False

        def guarded(session: Session) -> T:
            nonlocal checked
            if fused is not None and (result := fused(session)) is not None:
                return result
            if caller.miner:
                self._refuse(session, admission.NOT_BANNED, {"client_ip": caller.client_ip, "now": self.clock()})
            refusal = self.nonces.record(session, caller.hotkey, caller.nonce_ns)
            if refusal is not None:
                raise auth.AuthFailure(401, refusal)
            checked = True
            return work(session)

        try:
            return self.database.write(guarded, locks=locks)
        except ApiError:
            if checked:
                self.database.write(lambda session: self.nonces.record(session, caller.hotkey, caller.nonce_ns))
            raise

    def _record_failure(
        self,
        session: Session,
        client_ip: str,
        now: float,
        kind: str,
        reason: str,
        submission_id: int | None,
        dedupe_key: str | None = None,
    ) -> bool:
        """Charge a failed validation to ``client_ip``; ban it at the fifth inside 24 h. False if a
        failure with ``dedupe_key`` was already charged."""
        self.database.lock(session, f"ip:{client_ip}")  # the count below must see every earlier failure
        if dedupe_key is not None and session.scalar(
            select(exists().where(ValidationFailure.dedupe_key == dedupe_key))
        ):
            return False
        session.add(
            ValidationFailure(
                client_ip=client_ip,
                failed_at=now,
                submission_id=submission_id,
                kind=kind,
                reason=reason[:MAX_REASON_STORED],
                dedupe_key=dedupe_key,
            )
        )
        session.flush()
        failures = session.execute(
            select(func.count())
            .select_from(ValidationFailure)
            .where(ValidationFailure.client_ip == client_ip, ValidationFailure.failed_at > now - rules.BAN_WINDOW_S)
        ).scalar_one()
        banned = session.scalar(select(exists().where(IpBan.client_ip == client_ip, IpBan.banned_until > now)))
        if failures >= rules.BAN_FAILURES and not banned:
            session.add(
                IpBan(
                    client_ip=client_ip,
                    banned_at=now,
                    banned_until=now + rules.BAN_DURATION_S,
                    reason=f"{failures} failed validations within 24 h",
                )
            )
            logger.warning("banned IP %s for 24 h after %d failed validations", client_ip, failures)
        return True
