"""Signed requests: accepted once from the right hotkey, refused when replayed, tampered or unauthorized."""

import re
import time

import pytest
from bittensor import http_auth
from starlette.datastructures import Headers

from quasar import auth
from quasar.chain import Chain, Metagraph, NeuronInfo
from quasar.inference.client import _MAX_DETAIL_CHARS
from quasar.localnet.host import make_wallet

RECEIVER = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"


class StaticChain(Chain):
    """A chain whose metagraph is fixed: enough to test authorization decisions."""

    netuid = 1
    block_time_s = 12.0

    def __init__(self, neurons):
        self.neurons = tuple(neurons)

    def current_block(self):
        return 1

    def metagraph(self):
        return Metagraph(self.netuid, 1, self.neurons)

    def owner_uid(self):
        return 0

    def hyperparameters(self):
        raise NotImplementedError

    def publish_endpoint(self, wallet, host, port):
        raise NotImplementedError

    def set_weights(self, wallet, weights, version_key, hotkeys=None):
        raise NotImplementedError

    def api_location(self):
        raise NotImplementedError

    def publish_api_location(self, wallet, location):
        raise NotImplementedError


@pytest.fixture(scope="module")
def wallets(tmp_path_factory):
    root = tmp_path_factory.mktemp("wallets")
    return make_wallet(root, "miner"), make_wallet(root, "validator")


@pytest.fixture(scope="module")
def chain(wallets):
    miner, validator = wallets
    return StaticChain(
        [
            NeuronInfo(0, miner.hotkey.ss58_address, miner.coldkeypub.ss58_address, 0.0, False, None),
            NeuronInfo(1, validator.hotkey.ss58_address, validator.coldkeypub.ss58_address, 1e4, True, None),
        ]
    )


def check(request, store, target="/submit_kernel?round=1", authorize=None, body=None):
    return auth.authenticate(
        request.headers,
        request.body if body is None else body,
        method=request.method,
        target=target,
        self_hotkey=RECEIVER,
        nonce_store=store,
        authorize=authorize,
    )


def test_signed_request_is_accepted_once(wallets):
    miner, _ = wallets
    store = http_auth.InMemoryNonceStore()
    request = auth.sign_request(miner, "POST", "http://127.0.0.1:9/submit_kernel?round=1", RECEIVER, {"a": 1})
    assert check(request, store) == miner.hotkey.ss58_address
    with pytest.raises(auth.AuthFailure) as replay:
        check(request, store)
    assert replay.value.status_code == 401 and "already accepted" in replay.value.reason


def test_tampered_body_path_or_receiver_is_refused(wallets):
    miner, _ = wallets
    store = http_auth.InMemoryNonceStore()
    request = auth.sign_request(miner, "POST", "http://127.0.0.1:9/submit_kernel?round=1", RECEIVER, {"a": 1})
    for kwargs in ({"body": b'{"a":2}'}, {"target": "/submit_kernel?round=2"}):
        with pytest.raises(auth.AuthFailure) as failure:
            check(request, store, **kwargs)
        assert failure.value.status_code == 401
    other = auth.sign_request(miner, "POST", "http://127.0.0.1:9/submit_kernel?round=1", "5Other", {"a": 1})
    with pytest.raises(auth.AuthFailure, match="different receiving hotkey"):
        check(other, store)


def test_authorizers_follow_the_metagraph(wallets, chain, tmp_path):
    miner, validator = wallets
    stranger = make_wallet(tmp_path, "stranger")
    store = http_auth.InMemoryNonceStore()
    url = "http://127.0.0.1:9/submit_kernel?round=1"
    assert (
        check(auth.sign_request(miner, "POST", url, RECEIVER), store, authorize=auth.require_registered(chain))
        == miner.hotkey.ss58_address
    )
    with pytest.raises(auth.AuthFailure) as unregistered:
        check(auth.sign_request(stranger, "POST", url, RECEIVER), store, authorize=auth.require_registered(chain))
    assert unregistered.value.status_code == 403 and "not registered" in unregistered.value.reason
    with pytest.raises(auth.AuthFailure) as no_permit:
        check(auth.sign_request(miner, "POST", url, RECEIVER), store, authorize=auth.require_validator_permit(chain))
    assert no_permit.value.status_code == 403 and "no validator permit" in no_permit.value.reason
    assert (
        check(
            auth.sign_request(validator, "POST", url, RECEIVER), store, authorize=auth.require_validator_permit(chain)
        )
        == validator.hotkey.ss58_address
    )


@pytest.mark.parametrize(("offset_s", "direction"), [(37.0, "ahead of"), (-75.0, "behind"), (86_400.0, "ahead of")])
def test_a_request_signed_by_a_clock_that_is_off_names_the_offset_and_the_fix(wallets, offset_s, direction):
    """A signer's clock minutes off the server's (no NTP, a step): the refusal says by how much and
    which way, the window accepted and what to do, not a bare 'stale nonce'; and that a sender whose
    clock is synced has found the server's off."""
    miner, _ = wallets
    url = "http://127.0.0.1:9/submit_kernel?round=1"
    headers = http_auth.sign(
        miner,
        method="POST",
        path="/submit_kernel?round=1",
        receiver_ss58=RECEIVER,
        nonce_ns=time.time_ns() + int(offset_s * 1e9),
    )
    with pytest.raises(auth.AuthFailure) as failure:
        check(auth.SignedRequest("POST", url, b"", headers), http_auth.InMemoryNonceStore())
    reason = failure.value.reason
    assert failure.value.status_code == 401
    shown = re.search(rf"signed (\d+(?:\.\d)?) s {direction} this server's clock", reason)
    assert shown is not None, reason
    assert abs(float(shown.group(1)) - abs(offset_s)) < 2, reason
    assert "2 s ahead" in reason and "10 s behind" in reason and "timedatectl set-ntp true" in reason, reason
    assert "if it is synced, this server's is off: tell its operator" in reason, reason
    # A validator records a miner server's refusal cut to _MAX_DETAIL_CHARS: the cure must fit.
    assert len(reason) <= _MAX_DETAIL_CHARS, reason


@pytest.mark.parametrize("nonce", ["9" * 400, "-" + "9" * 400, str(2**63)])
def test_a_nonce_that_is_no_time_is_refused_naming_it(wallets, nonce):
    """A nonce of hundreds of digits, unsigned: its offset from this server's clock overflowed a
    float (OverflowError), an unsigned request answered 500 with its traceback logged at ERROR. A
    nonce outside unix nanoseconds' 64 bits is refused 401 as no time, its signature unchecked."""
    miner, _ = wallets
    headers = http_auth.sign(miner, method="GET", path="/x", receiver_ss58=RECEIVER)
    headers[http_auth.HEADER_NONCE] = nonce
    with pytest.raises(auth.AuthFailure) as failure:
        auth.authenticate(
            headers, b"", method="GET", target="/x", self_hotkey=RECEIVER, nonce_store=auth.RecentNonces(60)
        )
    assert failure.value.status_code == 401 and not isinstance(failure.value, auth.ClockRefusal)
    assert failure.value.reason == "authentication failed: X-Bittensor-Nonce is no time (unix nanoseconds, 64 bits)"


def test_a_stale_request_with_a_second_nonce_header_is_refused_by_the_one_verified(wallets):
    """A server's headers keep every header sent (starlette's ``Headers``), and the SDK reads the
    last of a repeated one. A stale request with another nonce header before its own (not a number,
    or another time) is refused 401 for the time of the nonce it was signed with: neither a
    ValueError (an unsigned request answered 500, its traceback logged at ERROR) nor another offset."""
    miner, _ = wallets
    signed = http_auth.sign(
        miner, method="GET", path="/x", receiver_ss58=RECEIVER, nonce_ns=time.time_ns() - 3600 * 10**9
    )
    for first in ("not-a-number", str(time.time_ns() - 60 * 10**9)):
        headers = Headers(
            raw=[(http_auth.HEADER_NONCE.lower().encode(), first.encode())]
            + [(key.lower().encode(), value.encode()) for key, value in signed.items()]
        )
        with pytest.raises(auth.ClockRefusal) as failure:
            auth.authenticate(
                headers, b"", method="GET", target="/x", self_hotkey=RECEIVER, nonce_store=auth.RecentNonces(60)
            )
        assert failure.value.hotkey == miner.hotkey.ss58_address
        assert 3599 < -failure.value.offset_s < 3601, failure.value.offset_s
        assert "signed 3600.0 s behind" in failure.value.reason or "signed 3599.9 s behind" in failure.value.reason
