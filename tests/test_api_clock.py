"""The submission API's nonce ledger under a clock that steps back (NTP correcting a clock that ran
ahead, a VM resumed): a request it accepted is never accepted again.

The service runs on both backends with a clock the test moves; each request carries the nonce
``btauth/1`` verification would have let through at that moment (signed by a clock agreeing with
the API's), as tests/test_api_fused_checks.py drives it. Direct submissions take the fused checks
and the checks one by one; a commitment takes only the latter.
"""

from __future__ import annotations

import time

import pytest

from api_fixtures import api_config, commit_of
from quasar import auth
from quasar.api import schemas
from quasar.api.rules import commitment_hash, new_salt
from quasar.api.service import Authenticated, SubmissionService

IP = "10.0.0.1"


def submit(service, wallets, name: str, nonce_ns: int, kind: str, n: int):
    """One signed request of ``kind`` (direct, commit) from miner ``name`` with ``nonce_ns``."""
    hotkey = wallets[name].hotkey.ss58_address
    caller = Authenticated(hotkey, nonce_ns, IP, miner=True, authorize=auth.require_registered(service.chain))
    if kind == "commit":
        request = schemas.CommitRequest(
            commitment_hash=commitment_hash(new_salt(), "https://github.com/x/fla", commit_of(n)),
            target_sequence_length=1_000_000,
        )
        return service.commit(hotkey, IP, request, caller)
    claim = schemas.SubmitKernelRequest(
        fork_url="https://github.com/x/fla",
        commit_hash=commit_of(n),
        target_sequence_length=1_000_000,
        tokens_per_sec=1e5,
    )
    return service.submit_direct(hotkey, IP, claim, caller)


@pytest.mark.parametrize(("kind", "fused"), [("direct", True), ("direct", False), ("commit", False)])
def test_a_step_back_of_the_apis_clock_lets_no_replay_through(chain, wallets, database, kind, fused):
    now = [time.time()]
    service = SubmissionService(
        api_config(wallets["api"].hotkey.ss58_address), chain, database, lambda: now[0], fused_checks=fused
    )
    captured = int(now[0] * 1e9)
    submit(service, wallets, "a", captured, kind, 1)
    now[0] += 30.0  # half a minute later the ledger forgets what is older than its retention
    submit(service, wallets, "b", int(now[0] * 1e9), kind, 2)
    now[0] -= 29.0  # the clock steps back: the captured request is fresh again (1 s old)
    with pytest.raises(auth.AuthFailure) as replay:
        submit(service, wallets, "a", captured, kind, 1)
    assert replay.value.status_code == 401, replay.value.reason
    assert "30.0 s before the newest request this API accepted" in replay.value.reason
    assert "clock" in replay.value.reason and "stepped back" in replay.value.reason
    # A smaller step (signed 8 s before the newest accepted nonce) still goes through.
    submit(service, wallets, "c", int((now[0] + 22.0) * 1e9), kind, 3)
