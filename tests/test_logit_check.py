"""The validator's logit check of a miner (quasar/validator/logit_check.py) over real HTTP on
127.0.0.1: the miner inference server of tests/test_inference_server.py, or a raw endpoint there."""

import json
import re
import threading
import time

import requests

from quasar.inference.server import InferenceLimits
from quasar.localnet.host import make_wallet
from quasar.logits import LogitThresholds, generate_with_logits
from quasar.validator.logit_check import MinerLogitChecker
from test_inference_server import LIMITS, Wrapped, json_answer, miner_server, raw_miner, signed_post, world

__all__ = ["world"]  # the fixture, shared with the server's tests


class Sleeps:
    """The checker's sleep: records each delay instead of waiting, then runs ``then`` (if any)."""

    def __init__(self, then=None):
        self.delays: list[float] = []
        self.then = then

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.then is not None:
            self.then()


def checker(world, sleep, timeout_s: float = 20.0) -> MinerLogitChecker:
    return MinerLogitChecker(
        world["wallets"]["validator"],
        world["reference"],
        LIMITS,
        LogitThresholds(min_cosine=0.99, max_abs_diff=0.1),
        timeout_s,
        private_endpoints_allowed=True,  # the test's miners serve on 127.0.0.1
        sleep=sleep,
    )


def miner_hotkey(world) -> str:
    return world["wallets"]["miner"].hotkey.ss58_address


def test_a_moments_full_queue_does_not_fail_the_miner_for_good(world):
    """Busy queue: several validators checking one miner at once filled its queue for a moment,
    and a validator answered 503 "queue full" (retry later) recorded the check FAILED, for good.
    A 503 is retried after a short backoff with a fresh challenge, and this one passes."""
    rival = make_wallet(world["root"] / "wallets", "rival")
    world["chain"].register_wallet(rival, stake=1e4, validator_permit=True)
    world["wallets"]["rival"] = rival
    release = threading.Event()

    def held(prompt, gen_len, step):
        release.wait(20)
        return generate_with_logits(world["served"], prompt, gen_len, step)

    payload = {"prompt": [1, 2, 3], "gen_len": 2, "logits_at_step": 2}
    with miner_server(world, Wrapped(world["served"], held), InferenceLimits(queue_size=0)) as url:
        answers: list = []
        other = threading.Thread(target=lambda: answers.append(signed_post(world, url, payload, wallet="rival")))
        other.start()
        deadline = time.monotonic() + 10
        while requests.get(url + "/health", timeout=5).json()["pending"] < 1:
            assert time.monotonic() < deadline, "the rival's request never got in"
            time.sleep(0.02)

        def rival_done() -> None:
            release.set()
            other.join(20)

        sleeps = Sleeps(then=rival_done)
        check = checker(world, sleeps).check(url, miner_hotkey(world))
    assert check.passed, check.reason
    assert sleeps.delays == [5.0] and [a.status_code for a in answers] == [200]


def test_a_miner_answering_503_forever_fails_after_three_fresh_challenges(world):
    """The retry is bounded (3 tries, 5 s then 10 s between), each try a fresh challenge (a
    challenge sent again would let the miner answer one it had time to prepare), and the reason
    says how many tries over how long."""
    bodies: list = []

    def busy(write, request, stopped):
        bodies.append(request)
        json_answer(json.dumps({"detail": "inference queue full; retry later"}).encode(), status=503)(
            write, request, stopped
        )

    sleeps = Sleeps()
    with raw_miner(busy) as url:
        check = checker(world, sleeps).check(url, miner_hotkey(world))
    assert not check.passed and "HTTP 503" in check.reason and "queue full" in check.reason, check.reason
    assert "3 tries over" in check.reason, check.reason
    assert sleeps.delays == [5.0, 10.0] and len(bodies) == 3
    assert len({json.dumps(body, sort_keys=True) for body in bodies}) == 3, bodies


def test_a_miner_answering_503_slowly_cannot_stretch_a_check_past_one_timeout(world):
    """The tries share the check's timeout: a miner answering 503 just before it, again and again,
    would otherwise hold the validator three timeouts per submission, besides the waits."""

    def slow_busy(write, request, stopped):
        if not stopped.wait(0.8):
            json_answer(b'{"detail": "retry later"}', status=503)(write, request, stopped)

    sleeps = Sleeps()
    with raw_miner(slow_busy) as url:
        started = time.monotonic()
        check = checker(world, sleeps, timeout_s=1.0).check(url, miner_hotkey(world))
        elapsed = time.monotonic() - started
    assert not check.passed and "no complete answer" in check.reason and "2 tries over 1 s" in check.reason, (
        check.reason
    )
    # The second try had what was left of the timeout: said to the hundredth, not 0.195303 s.
    assert re.search(r"within 0\.\d{1,2} s", check.reason), check.reason
    assert sleeps.delays == [5.0] and elapsed < 1.5, elapsed


def test_other_failures_are_not_retried(world):
    """Only "retry later" is retried: a refusal, a server error or wrong logits fail at once."""
    for status in (403, 500, 429):
        bodies: list = []

        def answer(write, request, stopped, status=status):
            bodies.append(request)
            json_answer(b'{"detail": "no"}', status=status)(write, request, stopped)

        sleeps = Sleeps()
        with raw_miner(answer) as url:
            check = checker(world, sleeps).check(url, miner_hotkey(world))
        assert not check.passed and f"HTTP {status}" in check.reason and "tries" not in check.reason, check.reason
        assert sleeps.delays == [] and len(bodies) == 1, status
    sleeps = Sleeps()
    with miner_server(world, world["other"]) as url:  # another model: wrong logits
        check = checker(world, sleeps).check(url, miner_hotkey(world))
    assert not check.passed and sleeps.delays == [], check.reason
