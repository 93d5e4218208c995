"""When a hotkey may submit (docs/rules.md section 3): the API's one submission rule, stated once.

A signed direct submission (``POST /submit_kernel``) is accepted when, in this order:

1. its ``btauth/1`` signature verifies: ``authenticate`` in app.py, which the route and the fast
   lane (fastlane.py) both call;
2. its hotkey is registered on the subnet: ``Authenticated.authorize``, called by the service;
3. the checks of :data:`SUBMISSION_CHECKS`, in their order, each a SQL condition on the database
   in the request's transaction: the client address is not banned, the nonce is new for the hotkey
   (the nonce table's primary key), the hotkey made fewer than ``SUBMISSIONS_PER_HOUR`` submissions
   in the last hour, the same fork, commit and target are not already waiting as its own, and no
   other hotkey made the commit ready before it (a copy: quasar/originality.py; a reveal is
   checked against those counting earlier than its commitment, docs/rules.md section 5).

The service runs the checks of step 3 two ways, both built from :data:`SUBMISSION_CHECKS` and
nothing else: all together in one statement that records the nonce only when every check passes
(:func:`fused_statement`, the fast path), and one at a time (:meth:`Check.refusal`), which names the
first that refuses. A commitment runs the ban, nonce and rate-limit checks; a reveal the ban, nonce
and copy checks. tests/test_api_admission.py makes each check refuse on its own and requires both
paths to refuse it; tests/test_api_fused_checks.py runs both on random traffic and compares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, String, and_, bindparam, case, exists, func, insert, or_, select
from sqlalchemy.engine import Connection

from quasar.api import rules
from quasar.api.db import IpBan, PreparedStatement, Submission, UsedNonce, dialect_insert, oldest_kept
from quasar.api.errors import ApiError

RATE_WINDOW_S = 3600.0
# A block and an id above every submission's: where a direct submission stands for originality
# when checked (it has no id yet), so every other hotkey's stored submission of its commit is
# before it: each was made ready before it, even one stored by a process that read a later block.
AFTER_EVERY_SUBMISSION = 2**62

_SUBMISSIONS, _BANS = Submission.__table__, IpBan.__table__


def _utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class Check:
    """One check of the rule: ``refuses`` is a SQL condition true when the check refuses the
    submission, on bind parameters of the submission (``client_ip``, ``hotkey``, ``fork_url``,
    ``commit_hash``, ``target_sequence_length``; ``counts_from`` and ``before_id``: where it stands
    for originality) and of the service (``limit``, ``now``, ``blocks_until_reveal``); ``details``
    are the values its refusal names, read in the same statement; ``refuse`` builds the refusal
    from them."""

    name: str
    refuses: ColumnElement[bool]
    details: tuple[Any, ...]
    refuse: Callable[[tuple[Any, ...], Mapping[str, Any]], ApiError]
    statement: PreparedStatement = field(init=False)  # whether it refuses, then its details

    def __post_init__(self) -> None:
        object.__setattr__(self, "statement", PreparedStatement(select(self.refuses, *self.details)))

    def refusal(self, connection: Connection, params: Mapping[str, Any]) -> ApiError | None:
        """The refusal of this check for ``params`` (None when it passes): one statement."""
        refused, *details = self.statement.run(connection, dict(params)).fetchone()
        return self.refuse(tuple(details), params) if refused else None


def _banned(details: tuple[Any, ...], params: Mapping[str, Any]) -> ApiError:
    (until,) = details
    return ApiError(
        403,
        f"IP {params['client_ip']} is banned until {_utc(until)} after {rules.BAN_FAILURES} "
        f"failed validations within 24 h",
        {"Retry-After": str(int(until - params["now"]) + 1)},
    )


def _over_rate_limit(details: tuple[Any, ...], params: Mapping[str, Any]) -> ApiError:
    (oldest,) = details
    wait = int(oldest + RATE_WINDOW_S - params["now"]) + 1
    return ApiError(
        429,
        f"rate limit: at most {params['limit']} submissions per hour per hotkey; the next is allowed in {wait} s",
        {"Retry-After": str(wait)},
    )


def _already_ready(details: tuple[Any, ...], params: Mapping[str, Any]) -> ApiError:
    return ApiError(
        409,
        f"this fork, commit and target length were already submitted as submission {details[0]}; each is "
        "evaluated once: to submit it again (with another claim, say), commit again",
    )


def _a_copy(details: tuple[Any, ...], params: Mapping[str, Any]) -> ApiError:
    original_id, original_hotkey, original_from = details
    return ApiError(
        409,
        f"commit {params['commit_hash']} was submitted first by another hotkey ({original_hotkey}, "
        f"submission {original_id}, which counts from block {original_from}): a copy is not accepted",
    )


_BANNED_WHERE = (_BANS.c.client_ip == bindparam("client_ip"), _BANS.c.banned_until > bindparam("now"))
_RECENT_WHERE = (
    _SUBMISSIONS.c.hotkey == bindparam("hotkey"),
    _SUBMISSIONS.c.submitted_at > bindparam("now") - RATE_WINDOW_S,
)
_RECENT = select(func.count()).select_from(_SUBMISSIONS).where(*_RECENT_WHERE).scalar_subquery()
_SAME_WHERE = (
    _SUBMISSIONS.c.hotkey == bindparam("hotkey"),
    _SUBMISSIONS.c.state == "ready",
    _SUBMISSIONS.c.fork_url == bindparam("fork_url"),
    _SUBMISSIONS.c.commit_hash == bindparam("commit_hash"),
    _SUBMISSIONS.c.target_sequence_length == bindparam("target_sequence_length"),
)
# The block a stored submission counts from for originality: rules.counts_from_block, in SQL.
_COUNTS_FROM = case(
    (_SUBMISSIONS.c.method == "commit_reveal", _SUBMISSIONS.c.submitted_block + bindparam("blocks_until_reveal")),
    else_=_SUBMISSIONS.c.submitted_block,
)
# Another hotkey's submission of the same commit that counts before the one checked (which counts
# from block ``counts_from`` and has id ``before_id``; the lower id first in a tie): every state but
# committed (a superseded one was ready, and its commit is its miner's).
_COPIED_WHERE = (
    _SUBMISSIONS.c.commit_hash == bindparam("commit_hash"),
    _SUBMISSIONS.c.state != "committed",
    _SUBMISSIONS.c.hotkey != bindparam("hotkey"),
    or_(
        _COUNTS_FROM < bindparam("counts_from"),
        and_(_COUNTS_FROM == bindparam("counts_from"), _SUBMISSIONS.c.id < bindparam("before_id")),
    ),
)
_FIRST_COPIED = (
    select(_SUBMISSIONS.c.id, _SUBMISSIONS.c.hotkey).where(*_COPIED_WHERE).order_by(_COUNTS_FROM, _SUBMISSIONS.c.id)
)

NOT_BANNED = Check(
    "not banned",
    exists().where(*_BANNED_WHERE),
    (select(func.max(_BANS.c.banned_until)).where(*_BANNED_WHERE).scalar_subquery(),),
    _banned,
)
UNDER_RATE_LIMIT = Check(
    "under the rate limit",
    _RECENT >= bindparam("limit"),
    (select(func.min(_SUBMISSIONS.c.submitted_at)).where(*_RECENT_WHERE).scalar_subquery(),),
    _over_rate_limit,
)
NOT_ALREADY_READY = Check(
    "not already waiting",
    exists().where(*_SAME_WHERE),
    (select(_SUBMISSIONS.c.id).where(*_SAME_WHERE).limit(1).scalar_subquery(),),
    _already_ready,
)
NOT_A_COPY = Check(
    "not a copy",
    exists().where(*_COPIED_WHERE),
    (
        _FIRST_COPIED.with_only_columns(_SUBMISSIONS.c.id).limit(1).scalar_subquery(),
        _FIRST_COPIED.with_only_columns(_SUBMISSIONS.c.hotkey).limit(1).scalar_subquery(),
        _FIRST_COPIED.with_only_columns(_COUNTS_FROM).limit(1).scalar_subquery(),
    ),
    _a_copy,
)

# The database checks of a direct submission, in the order they are tried one by one; the nonce is
# checked between the ban and the rate limit (by the service, as for every signed request).
SUBMISSION_CHECKS: tuple[Check, ...] = (NOT_BANNED, UNDER_RATE_LIMIT, NOT_ALREADY_READY, NOT_A_COPY)

INSERT_SUBMISSION = PreparedStatement(insert(_SUBMISSIONS).returning(_SUBMISSIONS.c.id))


def fused_statement(
    dialect: str, checks: tuple[Check, ...] = SUBMISSION_CHECKS, *, retention_s: float
) -> PreparedStatement:
    """Record the caller's nonce (``nonce_hotkey``, ``nonce``) only if no check of ``checks``
    refuses and the nonce is new and kept by the ledger (db.NonceLedger, whose ``retention_s``
    this is): every check of a direct submission in one statement (rowcount 1:
    all passed, the nonce is recorded; 0: nothing was written, and the checks one by one then name
    the refusal). On SQLite every statement lets go of the interpreter (the GIL) and waits to get it
    back while the process's write lock is held, so a submission's write holds that lock for a
    fraction of the time the checks take one by one."""
    nonce = bindparam("nonce", type_=BigInteger())
    allowed = select(bindparam("nonce_hotkey", type_=String()), nonce).where(
        nonce >= oldest_kept(retention_s), *(~check.refuses for check in checks)
    )
    return PreparedStatement(
        dialect_insert(dialect, UsedNonce.__table__).from_select(["hotkey", "nonce"], allowed).on_conflict_do_nothing()
    )
