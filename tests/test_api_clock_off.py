"""The API's own clock off: every caller is refused for the clock and told its clock is off the
API's, and the API's operator was told nothing. ``python -m quasar.api serve`` as shipped, its
clock moved by libfaketime, asked over HTTP on 127.0.0.1 by clients of real wallets; what it
logs is read from its log file (quasar/api/clockwatch.py, docs/api.md)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bittensor as bt
import httpx
import pytest
from bittensor import http_auth

from api_fixtures import FORK, commit_of
from quasar.api.client import ApiClient, ApiClientError, Claim
from quasar.api.devdb import start_api_process
from quasar.localnet.host import make_wallet
from tests.processes import libfaketime

WARNING = "this host's clock is likely off (timedatectl set-ntp true)"


class Served:
    """A running API: its URL, hotkey and log."""

    def __init__(self, url: str, api_hotkey: str, log: Path):
        self.url, self.api_hotkey, self.log = url, api_hotkey, log
        self.submitted = 0

    def warnings(self) -> list[str]:
        """The API's lines saying its clock is off."""
        return [line for line in self.log.read_text().splitlines() if WARNING in line]

    def ask(self, wallet: bt.Wallet, offset_s: float = 0.0, forge: Callable[[dict], None] | None = None) -> str:
        """``GET /validator/pending`` signed by ``wallet`` with a clock ``offset_s`` ahead of this
        host's, its headers changed by ``forge``; the API's refusal (401), or "accepted"."""
        headers = http_auth.sign(
            wallet,
            method="GET",
            path="/validator/pending",
            receiver_ss58=self.api_hotkey,
            nonce_ns=time.time_ns() + int(offset_s * 1e9),
        )
        if forge is not None:
            forge(headers)
        response = httpx.get(f"{self.url}/validator/pending", headers=headers, timeout=30)
        if response.status_code == 200:
            return "accepted"
        assert response.status_code == 401, response.text
        return response.json()["detail"]

    def submit(self, wallet: bt.Wallet) -> str:
        """A miner's direct submission of a new commit through the client miners use: the API's
        refusal, or "accepted"."""
        self.submitted += 1
        with ApiClient(self.url, wallet, api_hotkey=self.api_hotkey) as client:
            try:
                client.submit_kernel(Claim(FORK, commit_of(self.submitted), 1e5), 1_000_000)
            except ApiClientError as error:
                assert error.status == 401, error
                return error.detail
        return "accepted"


@pytest.fixture
def api(chain, wallets, tmp_path) -> Iterator[Callable[..., Served]]:
    """Start the API with its clock ``FAKETIME`` off this host's ("+120": two minutes ahead), with
    ``workers`` worker processes."""
    started: list = []

    def start(offset: str, workers: int = 1) -> Served:
        faked = {"LD_PRELOAD": libfaketime(), "FAKETIME": offset, "DONT_FAKE_MONOTONIC": "1"}
        api_hotkey = wallets["api"].hotkey.ss58_address
        process, url = start_api_process(
            tmp_path, f"sqlite:///{tmp_path}/api.sqlite3", chain.path, api_hotkey, workers=workers, settings=faked
        )
        started.append(process)
        return Served(url, api_hotkey, next(tmp_path.glob("server-*.log")))

    yield start
    for process in started:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_an_api_whose_clock_is_off_says_so_once(api, wallets):
    """The API's clock 120 s ahead: two validators and a miner, their clocks right, are each refused
    and told they signed 120 s behind it; the API logged nothing at all. Its log says once that its
    own clock is likely off; the callers' refusal says that theirs being synced, the API's is off."""
    served = api("+120")
    for _ in range(3):
        refusals = [served.ask(wallets["v1"]), served.ask(wallets["v2"]), served.submit(wallets["a"])]
    for refusal in refusals:
        assert "signed 1" in refusal and "s behind this server's clock" in refusal, refusal
        assert "if it is synced, this server's is off" in refusal, refusal
    [warning] = served.warnings()
    assert "WARNING" in warning and "requests of 3 hotkeys were refused" in warning, warning
    assert re.search(r"about 1(19|20)\.\d s behind this API's clock", warning), warning
    served.ask(wallets["v1"])
    assert len(served.warnings()) == 1  # then no more often than every 10 minutes


def test_an_api_with_several_workers_says_it_once(api, chain, wallets):
    """With --workers 2 each worker counted the refusals it served and said the warning itself: two
    identical lines for one clock, in a log that reads them as two events. Only the first worker
    watches. Each of three validators asks 16 times, each time on a fresh connection, which the
    kernel gives either worker: all 16 of one validator's on the other worker has odds of 2**-16."""
    chain.register_wallet(wallets["v3"], stake=1e4, validator_permit=True)
    served = api("+120", workers=2)
    for _ in range(16):
        for name in ("v1", "v2", "v3"):
            assert "s behind this server's clock" in served.ask(wallets[name])
    warnings = served.warnings()
    assert len(warnings) == 1, warnings
    assert re.search(r"requests of 3 hotkeys were refused as signed about 1(19|20)\.\d s behind", warnings[0])


def test_one_caller_whose_clock_is_off_is_that_callers_clock(api, wallets):
    """The API's clock right; one validator's 120 s ahead, asking many times, the others' right:
    nothing of the API's clock is said. Nor when two of the callers are off by different figures."""
    served = api("+0")
    for _ in range(5):
        assert "signed 1" in served.ask(wallets["v1"], offset_s=120.0)
        assert served.ask(wallets["v2"]) == "accepted"
        assert served.submit(wallets["a"]) == "accepted"
    # Signed 300 s ahead, received a moment later: 299.9 s under load.
    refusal = served.ask(wallets["v2"], offset_s=300.0)
    assert re.search(r"signed (299|300)\.\d s ahead", refusal), refusal
    assert served.warnings() == []


def test_forged_and_unregistered_requests_and_one_hotkey_asking_often_do_not_count(api, chain, wallets, tmp_path):
    """The API's clock 120 s ahead. Requests refused for the clock are counted by hotkey: headers
    naming three validators with signatures that do not verify (the SDK judges the time before the
    signature), three unregistered hotkeys signing properly, and one validator asking twenty times
    say nothing; two more honest hotkeys make three, and the API says so."""
    chain.register_wallet(wallets["v3"], stake=1e4, validator_permit=True)
    served = api("+120")
    signer = wallets["stranger"]

    def as_hotkey(name: str) -> Callable[[dict], None]:
        def forge(headers: dict) -> None:
            headers[http_auth.HEADER_HOTKEY] = wallets[name].hotkey.ss58_address

        return forge

    for name in ("v1", "v2", "v3"):
        assert "signed 1" in served.ask(signer, forge=as_hotkey(name))
    for stranger in [signer, make_wallet(tmp_path / "w", "s2"), make_wallet(tmp_path / "w", "s3")]:
        assert "signed 1" in served.ask(stranger)
    for _ in range(20):
        assert "signed 1" in served.ask(wallets["v1"])
    assert served.warnings() == []
    served.ask(wallets["v2"])
    served.submit(wallets["a"])
    [warning] = served.warnings()
    assert "requests of 3 hotkeys were refused" in warning, warning


def test_hotkeys_refused_at_other_offsets_do_not_hide_those_that_agree(api, chain, wallets, tmp_path):
    """The API's clock 120 s ahead; four more validators sign 300 to 600 s behind it (their clocks
    off, or an attacker's registrations). Of the seven refused, a median falls among those four, and
    no three lie within 2 s of it: the three honest hotkeys that agree are still said."""
    others = [make_wallet(tmp_path / "w", f"x{n}") for n in range(4)]
    for wallet in others:
        chain.register_wallet(wallet, stake=1e4, validator_permit=True)
    served = api("+120")
    for n, wallet in enumerate(others):
        assert "s behind this server's clock" in served.ask(wallet, offset_s=-180.0 - 100 * n)
    served.ask(wallets["v1"])
    served.ask(wallets["v2"])
    served.submit(wallets["a"])
    [warning] = served.warnings()
    assert re.search(r"requests of 3 hotkeys were refused as signed about 1(19|20)\.\d s behind", warning), warning


def test_replays_of_older_requests_do_not_hide_hotkeys_that_agree(api, wallets):
    """The API's clock 120 s ahead. Someone who saw requests two validators signed 40 s before (any
    request to this API: a request proves nothing of when it was sent) sends them again after each
    of their refusals, refused then as signed 160 s behind and more. Counted by each hotkey's latest
    refusal, the replays replaced the two honest offsets, no three agreed, and the API said nothing;
    counted by each hotkey's newest nonce, they replace nothing."""
    served = api("+120")
    seen = {
        name: http_auth.sign(
            wallets[name],
            method="GET",
            path="/validator/pending",
            receiver_ss58=served.api_hotkey,
            nonce_ns=time.time_ns() - 40 * 10**9,
        )
        for name in ("v1", "v2")
    }
    for _ in range(3):
        for name in ("v1", "v2"):
            assert "s behind this server's clock" in served.ask(wallets[name])
            replayed = httpx.get(f"{served.url}/validator/pending", headers=seen[name], timeout=30)
            assert replayed.status_code == 401, replayed.text
            assert re.search(r"signed 1[6-9]\d\.\d s behind", replayed.json()["detail"]), replayed.text
        served.submit(wallets["a"])
    [warning] = served.warnings()
    assert re.search(r"requests of 3 hotkeys were refused as signed about 1(19|20)\.\d s behind", warning), warning
