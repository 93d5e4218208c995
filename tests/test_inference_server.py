"""The miner inference server and the validator's client, over real HTTP on 127.0.0.1.

Dishonest miners run the same server code with a different model at the model boundary: another
seed, the logits of another step, noise, a wrong shape, too slow. The chain behind the server is the
dev chain, or, to count what reaches a subtensor node, the Bittensor chain layer on the SDK fake of
tests/test_bittensor_chain.py.
"""

import gzip
import http.server
import json
import logging
import os
import re
import socket
import subprocess
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bittensor as bt
import pytest
import requests
import torch
from bittensor import http_auth

from quasar import auth
from quasar.chain.bittensor_chain import BittensorChain
from quasar.chain.devchain import DevChain
from quasar.inference.client import verify_miner_logits
from quasar.inference.server import InferenceLimits, create_inference_app, server_options
from quasar.localnet.host import make_wallet
from quasar.logits import (
    ChallengeLimits,
    Generation,
    LogitThresholds,
    draw_challenge,
    generate_with_logits,
    load_reference_model,
)
from servers import serving
from test_bittensor_chain import RAO, FakeChain
from tests.processes import libfaketime
from tiny_qwen import TINY_VOCAB, make_tiny_qwen2

ROOT = Path(__file__).resolve().parent.parent
LIMITS = ChallengeLimits(max_prompt_len=32, max_gen_len=8)
THRESHOLDS = LogitThresholds(min_cosine=0.99, max_abs_diff=0.1)
NETUID = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two tiny models, a dev chain with a miner, a validator and a permit-less neuron, and wallets."""
    root = tmp_path_factory.mktemp("inference")
    honest_dir, other_dir = make_tiny_qwen2(root / "seed1", 1), make_tiny_qwen2(root / "seed2", 2)
    wallets = {name: make_wallet(root / "wallets", name) for name in ("miner", "validator", "member", "stranger")}
    chain = DevChain(root / "devchain.sqlite3", netuid=NETUID)
    chain.register_wallet(wallets["miner"])
    chain.register_wallet(wallets["validator"], stake=1e4, validator_permit=True)
    chain.register_wallet(wallets["member"])
    return {
        "root": root,
        "chain": chain,
        "wallets": wallets,
        "honest_dir": honest_dir,
        "served": load_reference_model(str(honest_dir)),
        "other": load_reference_model(str(other_dir)),
        "reference": load_reference_model(str(honest_dir)),  # the validator's own copy
    }


class Wrapped:
    """A model at the server's boundary whose ``generate`` is replaced (a dishonest or slow miner)."""

    def __init__(self, inner, generate):
        self.inner, self.generate = inner, generate

    def __getattr__(self, name):
        return getattr(self.inner, name)


def chain_flags(world) -> list[str]:
    """The flags that point a process at the test's wallets and dev chain."""
    return [
        "--wallet.path",
        str(world["root"] / "wallets"),
        "--subtensor.network",
        "devchain",
        "--devchain.path",
        str(world["chain"].path),
        "--netuid",
        str(NETUID),
    ]


@contextmanager
def miner_server(world, model=None, limits=None):
    hotkey = world["wallets"]["miner"].hotkey.ss58_address
    limits = limits or InferenceLimits()
    app = create_inference_app(model or world["served"], world["chain"], hotkey, limits)
    with serving(app, **server_options(limits)) as port:  # as `quasar inference serve` runs it
        yield f"http://127.0.0.1:{port}"


def challenge_miner(world, url, challenge=None, wallet="validator", timeout_s=20.0):
    challenge = challenge or draw_challenge(world["reference"].ordinary_tokens, LIMITS)
    return verify_miner_logits(
        url,
        world["wallets"]["miner"].hotkey.ss58_address,
        world["wallets"][wallet],
        world["reference"],
        challenge,
        timeout_s,
        THRESHOLDS,
    )


def signed_request(world, url, payload, wallet="validator", receiver="miner", path="/inference"):
    """A POST of ``payload`` to ``url + path``, signed by ``wallet`` for ``receiver``'s hotkey."""
    return auth.sign_request(
        world["wallets"][wallet], "POST", url + path, world["wallets"][receiver].hotkey.ss58_address, payload
    )


def send(request) -> requests.Response:
    """A signed POST sent as it was signed."""
    return requests.post(request.url, data=request.body, headers=request.headers, timeout=20)


def signed_post(world, url, payload, wallet="validator", path="/inference"):
    return send(signed_request(world, url, payload, wallet, path=path))


def test_honest_server_passes_fresh_challenges(world):
    with miner_server(world) as url:
        for _ in range(3):
            check = challenge_miner(world, url)
            assert check.passed, check.reason
            assert check.cosine > 0.9999 and check.max_abs_diff < 1e-3 and check.elapsed_sec > 0


def test_server_answer_has_the_documented_shape(world):
    challenge = draw_challenge(world["reference"].ordinary_tokens, LIMITS)
    with miner_server(world) as url:
        response = signed_post(world, url, challenge.payload())
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"tokens", "captured_logits", "elapsed_sec"}
    assert len(answer["tokens"]) == challenge.gen_len and len(answer["captured_logits"]) == TINY_VOCAB
    expected = world["reference"].generate(challenge.prompt, challenge.gen_len, challenge.logits_at_step)
    assert tuple(answer["tokens"]) == expected.tokens
    torch.testing.assert_close(torch.tensor(answer["captured_logits"]), expected.logits, atol=1e-4, rtol=1e-4)


def shifted_step(model):
    def generate(prompt, gen_len, step):
        later = generate_with_logits(model, prompt, gen_len + 1, step + 1)
        return Generation(later.tokens[:gen_len], later.logits)

    return Wrapped(model, generate)


def noisy(model, std):
    def generate(prompt, gen_len, step):
        honest = generate_with_logits(model, prompt, gen_len, step)
        return Generation(honest.tokens, honest.logits + std * torch.randn(honest.logits.shape))

    return Wrapped(model, generate)


@pytest.mark.parametrize("kind", ["other seed", "shifted step", "noise"])
def test_dishonest_servers_fail(world, kind):
    model = {
        "other seed": lambda: world["other"],
        "shifted step": lambda: shifted_step(world["served"]),
        "noise": lambda: noisy(world["served"], 3.0),
    }[kind]()
    with miner_server(world, model) as url:
        for _ in range(2):
            check = challenge_miner(world, url)
            assert not check.passed, f"{kind} passed: {check.reason}"
            assert "greedy choice" in check.reason or "cosine" in check.reason


def test_rounding_sized_noise_still_passes(world):
    # The thresholds are not a hair trigger: noise well inside 0.1 per logit is accepted.
    with miner_server(world, noisy(world["served"], 0.005)) as url:
        check = challenge_miner(world, url)
    assert check.passed and check.max_abs_diff < 0.1, check.reason


def test_unsigned_non_validator_and_misaddressed_requests_are_refused(world):
    payload = {"prompt": [1, 2, 3], "gen_len": 2, "logits_at_step": 1}
    with miner_server(world) as url:
        unsigned = requests.post(url + "/inference", json=payload, timeout=10)
        assert unsigned.status_code == 401 and "authentication failed" in unsigned.json()["detail"]
        for wallet in ("member", "stranger", "miner"):
            response = signed_post(world, url, payload, wallet=wallet)
            assert response.status_code == 403 and "no validator permit" in response.json()["detail"], wallet
        check = challenge_miner(world, url, wallet="member")
        assert not check.passed and "HTTP 403" in check.reason and "no validator permit" in check.reason

        wrong = send(signed_request(world, url, payload, receiver="member"))
        assert wrong.status_code == 401 and "receiv" in wrong.json()["detail"]

        once = signed_request(world, url, payload)
        first, replay = send(once), send(once)
        assert first.status_code == 200 and replay.status_code == 401


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"prompt": [], "gen_len": 2, "logits_at_step": 1}, "prompt: must hold at least one"),
        ({"prompt": [1, TINY_VOCAB], "gen_len": 2, "logits_at_step": 1}, "prompt[1]: token id 512 is outside"),
        ({"prompt": [1, 2], "gen_len": 2, "logits_at_step": 3}, "logits_at_step: must be between 1 and gen_len (2)"),
        ({"prompt": [1, 2], "gen_len": 100_000, "logits_at_step": 1}, "gen_len: 100000, at most 16"),
        ({"prompt": [1] * 65, "gen_len": 2, "logits_at_step": 1}, "prompt: 65 tokens, at most 64"),
        ({"prompt": [1, "2"], "gen_len": 2, "logits_at_step": 1}, "prompt.1: Input should be a valid integer"),
        ({"prompt": [1, 2], "gen_len": 2.0, "logits_at_step": 1}, "gen_len: Input should be a valid integer"),
        ({"prompt": [1, 2], "gen_len": 2}, "logits_at_step: Field required"),
        ({"prompt": [1, 2], "gen_len": 2, "logits_at_step": 1, "temperature": 1}, "temperature: Extra inputs"),
    ],
)
def test_bad_requests_get_422_naming_the_field(world, payload, field):
    with miner_server(world, limits=InferenceLimits(max_prompt_len=64, max_gen_len=16)) as url:
        response = signed_post(world, url, payload)
    assert response.status_code == 422 and field in response.json()["detail"], response.text


def test_oversized_body_is_refused_before_anything_else(world):
    with miner_server(world, limits=InferenceLimits(max_prompt_len=64)) as url:
        response = requests.post(url + "/inference", data=b"[" + b"1," * 5000 + b"1]", timeout=10)
    assert response.status_code == 413 and "at most 64 tokens" in response.json()["detail"]


def test_health_is_open_and_model_info_is_signed(world):
    with miner_server(world) as url:
        health = requests.get(url + "/health", timeout=10)
        assert health.status_code == 200 and health.json() == {
            "status": "ok",
            "pending": 0,
            "capacity": 1 + InferenceLimits().queue_size,
            "hotkey": world["wallets"]["miner"].hotkey.ss58_address,
        }
        assert requests.get(url + "/model_info", timeout=10).status_code == 401
        signed = auth.sign_request(
            world["wallets"]["validator"], "GET", url + "/model_info", world["wallets"]["miner"].hotkey.ss58_address
        )
        info = requests.get(signed.url, headers=signed.headers, timeout=10)
    assert info.status_code == 200, info.text
    assert info.json()["vocab_size"] == TINY_VOCAB and info.json()["dtype"] == "float32"
    assert info.json()["model"] == str(world["honest_dir"])


def test_a_miner_starting_beside_another_miners_inference_server_on_its_port_is_warned(world, caplog):
    """Two miners of one checkout share the .env's MINER_INFERENCE_PORT: the second miner found the
    first one's inference server answering there and said nothing, published that port, and every
    validator's logit check of it was refused ('signed for a different receiving hotkey')."""
    from quasar.miner import runner

    class Api:
        base_url = "http://127.0.0.1:9"

        def health(self):
            return types.SimpleNamespace(current_block=1)

        def clock_offset(self):
            return 0.0

    with miner_server(world) as url:
        settings = types.SimpleNamespace(miner_inference_port=int(url.rsplit(":", 1)[1]))
        other = world["wallets"]["member"].hotkey.ss58_address
        with caplog.at_level(logging.WARNING, logger="quasar.miner.runner"):
            runner._check_services(settings, Api(), world["wallets"]["miner"].hotkey.ss58_address)
            assert caplog.text == ""
            runner._check_services(settings, Api(), other)
    assert f"serves hotkey {world['wallets']['miner'].hotkey.ss58_address}, not this miner's {other}" in caplog.text
    assert "its own MINER_INFERENCE_PORT" in caplog.text


def test_one_request_at_a_time_with_a_bounded_queue(world):
    release, running, peak = threading.Event(), [0], [0]
    lock = threading.Lock()

    def blocking(prompt, gen_len, step):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        release.wait(20)
        try:
            return generate_with_logits(world["served"], prompt, gen_len, step)
        finally:
            with lock:
                running[0] -= 1

    payload = {"prompt": [1, 2, 3], "gen_len": 2, "logits_at_step": 2}
    with miner_server(world, Wrapped(world["served"], blocking), InferenceLimits(queue_size=1)) as url:
        results = []
        threads = [threading.Thread(target=lambda: results.append(signed_post(world, url, payload))) for _ in range(2)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while requests.get(url + "/health", timeout=5).json()["pending"] < 2:
            assert time.monotonic() < deadline, "the two requests never got in"
            time.sleep(0.02)
        busy = signed_post(world, url, payload)
        release.set()
        for thread in threads:
            thread.join(20)
        assert busy.status_code == 503 and "queue full" in busy.json()["detail"]
        assert [r.status_code for r in results] == [200, 200] and peak[0] == 1
        assert requests.get(url + "/health", timeout=5).json()["pending"] == 0


def test_unreachable_slow_and_malformed_miners_fail_with_the_reason(world):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    unreachable = challenge_miner(world, f"http://127.0.0.1:{port}")
    assert not unreachable.passed and "unreachable" in unreachable.reason

    def slow(prompt, gen_len, step):
        time.sleep(1.5)
        return generate_with_logits(world["served"], prompt, gen_len, step)

    with miner_server(world, Wrapped(world["served"], slow)) as url:
        late = challenge_miner(world, url, timeout_s=0.5)
    assert not late.passed and "within 0.5 s" in late.reason

    def short(prompt, gen_len, step):
        honest = generate_with_logits(world["served"], prompt, gen_len, step)
        return Generation(honest.tokens, honest.logits[:100])

    with miner_server(world, Wrapped(world["served"], short)) as url:
        cut = challenge_miner(world, url)
    assert not cut.passed and "captured_logits has 100 values, expected the vocabulary size 512" in cut.reason

    class NotJson(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args):
            pass

    garbage = http.server.HTTPServer(("127.0.0.1", 0), NotJson)
    threading.Thread(target=garbage.serve_forever, daemon=True).start()
    try:
        answer = challenge_miner(world, f"http://127.0.0.1:{garbage.server_address[1]}")
    finally:
        garbage.shutdown()
        garbage.server_close()
    assert not answer.passed and "not JSON" in answer.reason


@pytest.mark.slow
@contextmanager
def served_by_start_script(world, log_path: Path, env: dict[str, str] | None = None):
    """START_MINER_INFERENCE.sh serving the tiny model on a free port, its output into ``log_path``,
    with ``env`` added to its environment; yields its URL once it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        str(ROOT / "START_MINER_INFERENCE.sh"),
        "--wallet.name",
        "miner",
        "--wallet.hotkey",
        "default",
        *chain_flags(world),
        "--reference-model",
        str(world["honest_dir"]),
        "--device",
        "cpu",
        "--reference-dtype",
        "float32",
        "--inference.host",
        "127.0.0.1",
        "--inference.port",
        str(port),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, log_path.read_text()
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "inference server did not come up in 90 s"
            time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_start_script_serves_the_model_for_validators(world, tmp_path):
    miner = world["wallets"]["miner"]
    with served_by_start_script(world, tmp_path / "server.log") as url:
        check = challenge_miner(world, url)
        assert check.passed, check.reason
        with requests.Session() as session:
            assert signed_get(session, world, url).json()["model"] == str(world["honest_dir"])
    assert f"for hotkey {miner.hotkey.ss58_address}" in (tmp_path / "server.log").read_text()


def test_a_step_back_of_the_miners_clock_lets_no_captured_request_be_served_again(world, tmp_path):
    """The server's clock, under libfaketime, moves by the offset in a file read at every clock
    read: a validator's request is served at +0 s; 61 s later (another validator's request then)
    the clock steps back 55 s, so the first request is 6 s old, fresh again. Replayed then, it was
    served a second time: the SDK's store forgot it after 60 s while freshness is by the wall clock."""
    preload = libfaketime()
    offset = tmp_path / "offset"
    offset.write_text("+0\n")
    faked = {"LD_PRELOAD": preload, "FAKETIME_TIMESTAMP_FILE": str(offset), "FAKETIME_NO_CACHE": "1"}
    payload = {"prompt": [5, 6, 7], "gen_len": 1, "logits_at_step": 1}
    with served_by_start_script(world, tmp_path / "server.log", faked) as url:
        captured = signed_request(world, url, payload)
        assert send(captured).status_code == 200
        offset.write_text("+61\n")
        later = http_auth.sign(
            world["wallets"]["validator"],
            method="POST",
            path="/inference",
            body=captured.body,
            receiver_ss58=world["wallets"]["miner"].hotkey.ss58_address,
            nonce_ns=time.time_ns() + 61 * 10**9,
        )
        assert requests.post(url + "/inference", data=captured.body, headers=later, timeout=20).status_code == 200
        offset.write_text("+6\n")
        replayed = send(captured)
        offset.write_text("+61\n")  # libfaketime steps the monotonic clock too: forward again for the shutdown
    assert replayed.status_code == 401, replayed.text[:200]
    # 61 s apart by the offset, plus however long the machine took between signing the two
    gap = re.search(r"signed ([0-9.]+) s before the newest request this server accepted", replayed.json()["detail"])
    assert gap is not None, replayed.json()["detail"]
    assert 61.0 <= float(gap.group(1)) < 66.0, replayed.json()["detail"]


def test_anyones_requests_do_not_grow_the_miners_log(world, tmp_path):
    """The server is open to the internet: each unsigned request wrote 260 bytes to the log (uvicorn's
    access line and the refusal), 700 a second from one client here, so anyone could fill the
    disk under pm2's log files (15 GB a day at that rate). Validators' inferences are logged."""
    log_path = tmp_path / "server.log"
    with served_by_start_script(world, log_path) as url:
        time.sleep(0.5)
        before = log_path.stat().st_size
        with requests.Session() as session:
            for _ in range(100):
                assert (
                    session.post(
                        url + "/inference", json={"prompt": [1], "gen_len": 1, "logits_at_step": 1}
                    ).status_code
                    == 401
                )
                assert (
                    signed_post(
                        world, url, {"prompt": [1], "gen_len": 1, "logits_at_step": 1}, wallet="stranger"
                    ).status_code
                    == 403
                )
                assert session.get(url + "/health").status_code == 200
                assert session.get(url + "/nothing-here").status_code == 404
        time.sleep(0.5)
        flooded = log_path.stat().st_size - before
        assert challenge_miner(world, url).passed
        time.sleep(0.5)
    assert flooded < 1024, log_path.read_text()[-2000:]
    assert "inference for " in log_path.read_text()


def test_a_permit_holders_flood_of_inferences_does_not_grow_the_miners_log(world, caplog):
    """A hotkey with a validator permit (a rival validator, or a permit's keys stolen) may send tiny
    inferences as fast as the model answers them: a line each grew the miner's log at its pace (55
    a second here, 790 MB a day). A caller's inferences are logged at most one line per
    ``inference_log_every_s``, the next saying how many were served meanwhile."""
    limits = InferenceLimits(inference_log_every_s=1.0)
    tiny = {"prompt": [1], "gen_len": 1, "logits_at_step": 1}
    with miner_server(world, limits=limits) as url, caplog.at_level(logging.INFO, "quasar.inference.server"):
        assert [signed_post(world, url, tiny).status_code for _ in range(20)] == [200] * 20
        time.sleep(limits.inference_log_every_s)
        assert signed_post(world, url, tiny).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("inference for ")]
    assert len(lines) == 2, lines
    assert "(and 19 more since its last line" in lines[1]


def test_serve_reports_a_missing_model_or_wallet_and_exits(world, tmp_path, monkeypatch, caplog):
    from quasar.inference import cli

    monkeypatch.setattr(cli, "setup_logging", lambda *args, **kwargs: None)  # keep pytest's log capture
    argv = [
        "serve",
        "--wallet.name",
        "miner",
        *chain_flags(world),
        "--reference-model",
        str(tmp_path / "missing-model"),
        "--device",
        "cpu",
    ]
    assert cli.main(argv) == 1
    assert f"{tmp_path / 'missing-model'} does not exist" in caplog.text
    caplog.clear()
    # The model folder is checked before the wallet (no network either): here one that exists.
    given_model = argv.index("--reference-model") + 1
    argv[given_model] = str(world["honest_dir"])
    assert cli.main([*argv[:2], "nobody", *argv[3:]]) == 1
    assert "hotkey file" in caplog.text and "nobody/hotkeys/default does not exist" in caplog.text


# --- the chain behind the server ---


def signed_get(session: requests.Session, world, url: str, wallet: str = "validator") -> requests.Response:
    request = auth.sign_request(
        world["wallets"][wallet], "GET", url + "/model_info", world["wallets"]["miner"].hotkey.ss58_address
    )
    return session.get(request.url, headers=request.headers, timeout=20)


def fake_subnet(world, node: type[FakeChain] = FakeChain) -> FakeChain:
    """A subtensor node's state (through the SDK fake, or ``node``, one of its kinds): the miner,
    and the validator with a permit."""
    fake = node(netuid=NETUID)
    fake.register(world["wallets"]["miner"].hotkey.ss58_address)
    fake.register(
        world["wallets"]["validator"].hotkey.ss58_address, total_stake_rao=10_000 * RAO, validator_permit=True
    )
    return fake


def test_a_thousand_signed_requests_cost_a_few_chain_reads(world):
    """The flood an anyone-with-a-permit caller can send reaches the chain node once a block: the
    metagraph once (the block does not change here), the block number every half block."""
    fake = fake_subnet(world)
    chain = BittensorChain("finney", NETUID, client_factory=fake.factory, retries=0)
    hotkey = world["wallets"]["miner"].hotkey.ss58_address
    with serving(create_inference_app(world["served"], chain, hotkey)) as port, requests.Session() as session:
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        statuses = [signed_get(session, world, url).status_code for _ in range(1000)]
        elapsed = time.monotonic() - started
    assert statuses == [200] * 1000
    reads = [call for call in fake.calls if call != "block_time"]
    assert reads.count("subnets.metagraph") == 1
    # One block read when the cache fills, then one per half block (6 s) of the run.
    assert reads.count("block") <= 2 + elapsed / 6, (reads.count("block"), elapsed)
    assert set(reads) == {"subnets.metagraph", "block"}


def test_attack_a_permit_lost_while_the_server_runs_is_refused_from_the_next_block(world, tmp_path):
    """A validator's hotkey deregistered, or its permit gone at an epoch (its keys sold or stolen
    after): its requests are refused (403) from the first one after the server has seen the next
    block (its number is read every half block), not served from the permits read before."""
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=NETUID, block_time_s=2.0)
    chain.register_wallet(world["wallets"]["miner"])
    for name in ("validator", "member"):
        chain.register_wallet(world["wallets"][name], stake=1e4, validator_permit=True)
    hotkey = world["wallets"]["miner"].hotkey.ss58_address
    with serving(create_inference_app(world["served"], chain, hotkey)) as port, requests.Session() as session:
        url = f"http://127.0.0.1:{port}"
        assert [signed_get(session, world, url, wallet).status_code for wallet in ("validator", "member")] == [200, 200]
        chain.deregister(world["wallets"]["validator"].hotkey.ss58_address)
        chain.set_validator_permit(world["wallets"]["member"].hotkey.ss58_address, False)
        chain.advance(1)
        time.sleep(chain.block_time_s / 2)
        refused = [signed_get(session, world, url, wallet) for wallet in ("validator", "member")]
    assert [response.status_code for response in refused] == [403, 403]
    assert all("no validator permit" in response.json()["detail"] for response in refused)


def test_a_chain_that_cannot_be_read_gets_503_not_500(world):
    fake = fake_subnet(world)
    chain = BittensorChain("finney", NETUID, client_factory=fake.factory, retries=0)
    hotkey = world["wallets"]["miner"].hotkey.ss58_address
    fake.plan("block", *[bt.RpcConnectionError("node unreachable")] * 2)  # the next two reads fail
    with serving(create_inference_app(world["served"], chain, hotkey)) as port, requests.Session() as session:
        url = f"http://127.0.0.1:{port}"
        refused = signed_get(session, world, url)
        assert refused.status_code == 503
        assert refused.json()["detail"] == (
            "the miner cannot read the chain to check the caller's validator permit now; retry later"
        )
        challenge = draw_challenge(world["reference"].ordinary_tokens, LIMITS)
        request = auth.sign_request(
            world["wallets"]["validator"], "POST", url + "/inference", hotkey, challenge.payload()
        )
        assert session.post(request.url, data=request.body, headers=request.headers, timeout=20).status_code == 503
        assert session.get(url + "/health", timeout=5).status_code == 200  # the server itself is fine
        assert signed_get(session, world, url).status_code == 200  # the node answers again


# --- hostile miners: any bytes over HTTP ---


@contextmanager
def raw_miner(answer):
    """A hostile miner's endpoint on 127.0.0.1: reads the validator's request, then calls
    ``answer(write, request, stopped)`` (``write(bytes)`` sends raw bytes; ``stopped`` is set
    when the test ends, for an answer that would drip forever)."""
    stopped = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))

            def write(data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()

            try:
                answer(write, request, stopped)
            except OSError:
                pass  # the validator hung up

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stopped.set()
        server.shutdown()
        server.server_close()


def json_answer(body: bytes, status: int = 200):
    def answer(write, request, stopped):
        write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (status, len(body)) + body)

    return answer


def drip(head: bytes):
    """Sends ``head``, then a byte every 0.1 s until stopped: every read gets something in time."""

    def answer(write, request, stopped):
        write(head)
        while not stopped.wait(0.1):
            write(b" ")

    return answer


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nX-Slow: ",  # the headers never end
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",  # the body never ends
    ],
    ids=["headers", "body"],
)
def test_a_miner_dripping_its_answer_cannot_hold_the_validator_past_the_timeout(world, head):
    """Slow drip: a byte every 0.1 s kept every socket read of the validator's client within its
    timeout, so one check never ended (the validator's whole loop waits on it); the timeout bounds
    the whole exchange."""
    done: list = []
    with raw_miner(drip(head)) as url:
        thread = threading.Thread(target=lambda: done.append(challenge_miner(world, url, timeout_s=0.5)), daemon=True)
        started = time.monotonic()
        thread.start()
        thread.join(3)
        elapsed = time.monotonic() - started
    assert done, "the check was still waiting on the dripping miner after 3 s"
    assert not done[0].passed and "within 0.5 s" in done[0].reason and elapsed < 1.5, (done[0], elapsed)


def test_hostile_json_fails_the_check_instead_of_raising(world):
    """JSON nested deeper than Python's recursion limit (as an answer or an error's detail), and a
    logit that is an integer too large for a float, raised out of the check (RecursionError,
    OverflowError): the validator logged a crash and asked again every step, forever, instead of
    failing the miner. Python 3.11's parser raises RecursionError at this depth; 3.12's reads it, and
    the list is then not an answer; a deeper one would be refused for its size first."""
    nested = b"[" * 5000 + b"]" * 5000

    def huge_logit(write, request, stopped):
        honest = world["reference"].generate(request["prompt"], request["gen_len"], request["logits_at_step"])
        logits = ",".join(["1" + "0" * 400] + ["0"] * (TINY_VOCAB - 1))
        body = b'{"tokens":%s,"captured_logits":[%s]}' % (json.dumps(list(honest.tokens)).encode(), logits.encode())
        json_answer(body)(write, request, stopped)

    for answer, expected in [
        (json_answer(nested), "malformed answer: answer is not"),
        (json_answer(nested, status=500), "HTTP 500"),
        (huge_logit, "captured_logits"),
    ]:
        with raw_miner(answer) as url:
            check = challenge_miner(world, url)
        assert not check.passed and expected in check.reason, check.reason


def answer_to(sock: socket.socket, data: bytes) -> bytes:
    """What the server sends back on a connection after ``data``, until it closes it (2 s at most)."""
    if data:
        sock.sendall(data)
    sock.settimeout(2)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return received + b" [still open after 2 s]"
    return received


def test_a_stranger_cannot_hold_a_connection_open_or_fill_memory_with_headers(world):
    """Slowloris and header flooding, unsigned: uvicorn's defaults waited forever for a request's
    headers and its body, and took a 300 MB header into memory (RSS +380 MB, 135 s of parsing);
    a stranger could hold every file descriptor or the memory of the miner's server. Headers
    over the size limit get 431, headers or a body not in time get 408, and the connection closes;
    so does one whose body no route reads (GET /health, an unknown path) when the body is late."""
    limits = InferenceLimits(max_header_bytes=4096, header_timeout_s=0.3, body_timeout_s=0.3)
    with miner_server(world, limits=limits) as url:
        address = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
        cases = [
            (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: a", b"408"),
            (b"POST /inference HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n\r\n{", b"408"),
            (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192, b"431"),
            # a body no route reads: answered, then the connection closes when the body is late
            (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n\r\n{", b"200"),
            (b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n\r\n{", b"404"),
        ]
        for request, status in cases:
            with socket.create_connection(address) as sock:
                answer = answer_to(sock, request)
            assert answer.startswith(b"HTTP/1.1 " + status) and b"still open" not in answer, (request[:40], answer)
        assert requests.get(url + "/health", timeout=5).status_code == 200


def test_a_miners_text_in_the_reason_cannot_forge_validator_log_lines_or_send_terminal_escapes(world):
    """Log injection: the detail of a miner's error answer and a non-HTTP status line went into the
    check's reason verbatim, and the validator logs the reason: a newline forged a whole log line
    ("... passed (cosine 1.000000)") and escape sequences reached the operator's terminal."""
    forged = "busy\n2026-05-01 12:00:00,000 INFO    quasar.validator.loop: logit check passed\x1b]0;owned\x07"
    for answer in [
        json_answer(json.dumps({"detail": forged}).encode(), status=503),
        lambda write, request, stopped: write(b"SSH-2.0-OpenSSH_9.6\x1b[2J\r\n"),
    ]:
        with raw_miner(answer) as url:
            check = challenge_miner(world, url)
        assert not check.passed and check.reason.isprintable(), check.reason
        assert "busy\\n2026" in check.reason or "SSH-2.0-OpenSSH_9.6\\x1b[2J" in check.reason, check.reason


def test_one_strangers_address_cannot_take_every_connection_of_the_server(world):
    """Descriptor exhaustion: idle connections from one host, no key needed, took every file
    descriptor of the server until the header timeout closed them (at a 256-descriptor limit, 400
    idle connections made an honest miner fail a validator's check), and reconnecting kept them.
    Connections beyond the limit of one client address are refused at once; other addresses
    (the validator's) are still served."""
    limits = InferenceLimits(max_connections_per_client=3)
    with miner_server(world, limits=limits) as url:
        address = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
        held = [socket.create_connection(address, source_address=("127.0.0.2", 0)) for _ in range(3)]
        try:
            with socket.create_connection(address, source_address=("127.0.0.2", 0)) as extra:
                answer = answer_to(extra, b"")  # refused before it sends anything
            assert answer.startswith(b"HTTP/1.1 503") and b"still open" not in answer, answer
            check = challenge_miner(world, url)  # from 127.0.0.1
            assert check.passed, check.reason
        finally:
            for sock in held:
                sock.close()
        with socket.create_connection(address, source_address=("127.0.0.2", 0)) as again:
            assert answer_to(again, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
                b"HTTP/1.1 200"
            )


def test_a_chain_outage_logs_one_warning_not_one_per_signed_request(world, caplog):
    """Log flood: while the chain could not be read, every signed request (anyone's: a fresh
    hotkey signs for free) logged a WARNING, so an outage of an hour filled pm2's log at the
    callers' pace. One warning when the outage begins, one line when the chain answers again;
    callers are refused as before (503 while it is down, 401 unsigned, 403 without a permit)."""
    fake = fake_subnet(world)
    chain = BittensorChain("finney", NETUID, client_factory=fake.factory, retries=0)
    hotkey = world["wallets"]["miner"].hotkey.ss58_address
    payload = {"prompt": [1, 2, 3], "gen_len": 2, "logits_at_step": 1}
    requests_sent = 30
    fake.plan("block", *[bt.RpcConnectionError("node unreachable")] * requests_sent)
    caplog.set_level("INFO", logger="quasar")
    with serving(create_inference_app(world["served"], chain, hotkey)) as port:
        url = f"http://127.0.0.1:{port}"
        down = [signed_post(world, url, payload, wallet=("validator", "stranger")[i % 2]) for i in range(requests_sent)]
        unsigned = requests.post(url + "/inference", json=payload, timeout=10)
        back = signed_post(world, url, payload)
        stranger = signed_post(world, url, payload, wallet="stranger")
    assert [r.status_code for r in down] == [503] * requests_sent
    assert unsigned.status_code == 401 and back.status_code == 200 and stranger.status_code == 403
    lines = [r for r in caplog.records if r.name.startswith("quasar") and r.levelname != "DEBUG"]
    warnings = [r.getMessage() for r in lines if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "node unreachable" in warnings[0], warnings
    assert sum("chain can be read again" in r.getMessage() for r in lines) == 1, [r.getMessage() for r in lines]


def endless(head: bytes, piece: bytes, pause: float = 0.0):
    """Sends ``head``, then ``piece`` again and again (every ``pause`` s) until the test ends."""

    def answer(write, request, stopped):
        write(head)
        while not stopped.is_set():
            write(piece)
            if pause:
                stopped.wait(pause)

    return answer


def honest_tokens_with(world, logits):
    """The reference's tokens for the challenge, with ``logits`` as the captured logits."""

    def answer(write, request, stopped):
        honest = world["reference"].generate(request["prompt"], request["gen_len"], request["logits_at_step"])
        body = json.dumps({"tokens": list(honest.tokens), "captured_logits": logits}).encode()
        json_answer(body)(write, request, stopped)

    return answer


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
BOMB = gzip.compress(b"0" * (50 << 20))
HOSTILE_ANSWERS = {
    "huge-content-length-then-close": (
        lambda world: (
            lambda write, request, stopped: write(b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n{}")
        ),
        "short of its Content-Length",
    ),
    "huge-content-length-dripped": (
        lambda world: endless(b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n", b"1", 0.05),
        "within 0.5 s",
    ),
    "chunked-forever": (lambda world: endless(CHUNKED, b"400\r\n" + b"1" * 1024 + b"\r\n"), "larger than"),
    "chunked-dripped": (lambda world: endless(CHUNKED, b"1\r\n1\r\n", 0.05), "within 0.5 s"),
    "endless-trailer": (
        lambda world: endless(CHUNKED + b"0\r\n", b"X: y\r\n"),
        "",
    ),  # refused for its size or cut at the deadline
    "endless-headers": (
        lambda world: endless(b"HTTP/1.1 200 OK\r\n", b"X: y\r\n"),
        "",
    ),  # refused for its size or cut at the deadline
    "endless-header-line": (
        lambda world: endless(b"HTTP/1.1 200 OK\r\nX: ", b"y" * 1024),
        "",
    ),  # refused for its size or cut at the deadline
    "redirect": (
        lambda world: (
            lambda write, request, stopped: write(
                b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/inference\r\nContent-Length: 0\r\n\r\n"
            )
        ),
        "HTTP 302",
    ),
    "gzip-bomb": (
        lambda world: (
            lambda write, request, stopped: write(
                b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(BOMB) + BOMB
            )
        ),
        "compressed",
    ),
    "1GiB-body": (
        lambda world: endless(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n", b"1" * 65536),
        "larger than",
    ),
    "1GiB-body-without-length": (
        lambda world: endless(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"1" * 65536),
        "larger than",
    ),
    "nan-logits": (lambda world: honest_tokens_with(world, [float("nan")] * TINY_VOCAB), "non-finite"),
    "inf-logit": (lambda world: honest_tokens_with(world, [float("inf")] + [0.0] * (TINY_VOCAB - 1)), "non-finite"),
}


@pytest.mark.parametrize("name", list(HOSTILE_ANSWERS))
def test_hostile_answers_fail_the_check_within_its_deadline_and_size(world, name):
    """Whatever a miner's endpoint sends (a length it never sends, a body, headers or a trailer
    without end, a redirect, a compression bomb, a gigabyte, non-finite logits), the check fails
    within its timeout, reads no more than the answer's size bound, and says why."""
    make, expected = HOSTILE_ANSWERS[name]
    with raw_miner(make(world)) as url:
        started = time.monotonic()
        check = challenge_miner(world, url, timeout_s=0.5)
        elapsed = time.monotonic() - started
    assert not check.passed and expected in check.reason and elapsed < 1.5, (check.reason, elapsed)


def test_json_nested_100k_deep_fails_the_check_at_a_real_vocabulary_size(world):
    """Within the size bound of a real vocabulary (151,936 logits, about 4.9 MB), an answer or an
    error's detail nested 100,000 deep fails the check instead of raising RecursionError."""
    nested = b"[" * 100_000 + b"]" * 100_000
    reference = Wrapped(world["reference"], world["reference"].generate)
    reference.vocab_size = 151_936
    challenge = draw_challenge(world["reference"].ordinary_tokens, LIMITS)
    for status, expected in [(200, "not JSON"), (500, "HTTP 500")]:
        with raw_miner(json_answer(nested, status)) as url:
            check = verify_miner_logits(
                url,
                world["wallets"]["miner"].hotkey.ss58_address,
                world["wallets"]["validator"],
                reference,
                challenge,
                5.0,
                THRESHOLDS,
            )
        assert not check.passed and expected in check.reason, check.reason


def test_one_validator_cannot_fill_the_queue_and_fail_the_miner_for_every_other_validator(world):
    """Queue flood: the queue was one for all callers, so one permit holder (a rival validator,
    or a miner who holds a permit) that kept it full got every other validator's challenge
    answered 503 "queue full", and each of those checks failed the miner's submission. A caller
    holds at most ``max_pending_per_caller`` places; the rest of the queue stays for the others."""
    rival = make_wallet(world["root"] / "wallets", "rival")
    world["chain"].register_wallet(rival, stake=1e4, validator_permit=True)
    world["wallets"]["rival"] = rival

    def slow(prompt, gen_len, step):
        time.sleep(0.3)
        return generate_with_logits(world["served"], prompt, gen_len, step)

    payload = {"prompt": [1, 2, 3], "gen_len": 2, "logits_at_step": 2}
    limits = InferenceLimits()
    flood = 1 + limits.queue_size
    with miner_server(world, Wrapped(world["served"], slow), limits) as url:
        answers: list = []
        threads = [
            threading.Thread(target=lambda: answers.append(signed_post(world, url, payload, wallet="rival")))
            for _ in range(flood)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while len(answers) < flood - limits.max_pending_per_caller:  # the refused ones come back at once
            if requests.get(url + "/health", timeout=5).json()["pending"] == flood:
                break  # every place taken by the rival
            assert time.monotonic() < deadline, "the rival's requests never got in"
            time.sleep(0.02)
        check = challenge_miner(world, url)
        for thread in threads:
            thread.join(20)
    assert check.passed, check.reason
    refused = [a for a in answers if a.status_code == 503]
    assert len(refused) == flood - limits.max_pending_per_caller, [a.status_code for a in answers]
    assert "at most 2 of your requests" in refused[0].json()["detail"], refused[0].text


OUTAGE_PAYLOAD = {"prompt": [1, 2, 3], "gen_len": 2, "logits_at_step": 1}


@contextmanager
def served_over(world, fake: FakeChain, limits: InferenceLimits) -> Iterator[str]:
    """The miner's inference server over ``fake`` through the production chain layer (no retries),
    its URL once a first signed request has read the metagraph."""
    fake.block_time = 0.25  # the block number is read again every 0.125 s
    chain = BittensorChain("finney", NETUID, client_factory=fake.factory, retries=0)
    hotkey = world["wallets"]["miner"].hotkey.ss58_address
    with serving(create_inference_app(world["served"], chain, hotkey, limits)) as port:
        url = f"http://127.0.0.1:{port}"
        assert signed_post(world, url, OUTAGE_PAYLOAD).status_code == 200  # the metagraph is read
        yield url


def test_an_outage_of_the_miners_chain_node_does_not_fail_every_validators_check(world, caplog):
    """Chain outage: while the miner's node could not be read, every signed request got 503, so
    every validator that checked the miner then failed its submission for good, though the miner
    did nothing wrong. Callers are checked against the validator permits of the last metagraph
    read, while it is at most ``permit_max_stale_s`` old (503 after that); a hotkey without a
    permit there still gets 403, an unsigned request 401; one warning per outage, saying so."""
    fake = fake_subnet(world)
    limits = InferenceLimits(permit_max_stale_s=3.0)
    payload = OUTAGE_PAYLOAD
    caplog.set_level("INFO", logger="quasar")
    with served_over(world, fake, limits) as url:
        read_at = time.monotonic()
        fake.plan("block", *[bt.RpcConnectionError("node unreachable")] * 1000)
        time.sleep(0.3)  # past the cached block number: the next request asks the node
        checks = [challenge_miner(world, url) for _ in range(3)]
        stranger = signed_post(world, url, payload, wallet="stranger")
        member = signed_post(world, url, payload, wallet="member")
        unsigned = requests.post(url + "/inference", json=payload, timeout=10)
        assert time.monotonic() - read_at < limits.permit_max_stale_s, "the machine was too slow for this test"
        time.sleep(max(0.0, read_at + limits.permit_max_stale_s + 0.2 - time.monotonic()))
        stale = signed_post(world, url, payload)
    assert all(check.passed for check in checks), [check.reason for check in checks]
    assert stranger.status_code == 403 and member.status_code == 403 and unsigned.status_code == 401
    assert stale.status_code == 503 and "retry later" in stale.json()["detail"], stale.text
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("quasar") and r.levelname == "WARNING"]
    assert len(warnings) == 1 and "node unreachable" in warnings[0], warnings
    assert "last validator permits read" in warnings[0] and "3 s" in warnings[0], warnings[0]


def test_a_chain_node_slow_to_fail_does_not_hold_every_validators_check_past_its_timeout(world):
    """Chain outage, slow: the production chain layer retries a failing read (3 times, 2 s, 4 s,
    8 s apart; 120 s an attempt on a hung node), and each request of the outage waited for a read of
    its own before the last permits were used, so every validator's check timed out (LOGITS_TIMEOUT,
    30 s) and failed the miner. Once a read has failed, callers are checked against the last permits
    at once while one read at a time goes on asking the node."""
    fake = fake_subnet(world)
    fake.block_time = 0.25
    # The production retry shape, scaled: a failing read takes 1 + 2 + 4 = 7 s.
    chain = BittensorChain("finney", NETUID, client_factory=fake.factory, retries=3, backoff_s=1.0)
    hotkey = world["wallets"]["miner"].hotkey.ss58_address
    payload = {"prompt": [1, 2, 3], "gen_len": 2, "logits_at_step": 1}
    with serving(create_inference_app(world["served"], chain, hotkey)) as port:
        url = f"http://127.0.0.1:{port}"
        assert signed_post(world, url, payload).status_code == 200  # the metagraph is read
        fake.plan("block", *[bt.RpcConnectionError("node unreachable")] * 1000)
        time.sleep(0.3)  # past the cached block number
        assert signed_post(world, url, payload).status_code == 200  # the last permits, while the read fails
        checks = [challenge_miner(world, url, timeout_s=4.0) for _ in range(3)]
        fake.planned["block"].clear()  # the node answers again
    assert all(check.passed for check in checks), [check.reason for check in checks]


class HungNode(FakeChain):
    """A subtensor node that, once ``hang_s`` is set, answers every call after ``hang_s`` seconds
    with a connection error (the chain layer's attempt timeout on a hung node, scaled down)."""

    hang_s: float | None = None

    def answer(self, operation: str, compute):
        if self.hang_s is None:
            return super().answer(operation, compute)
        self.calls.append(operation)
        time.sleep(self.hang_s)
        raise bt.RpcConnectionError("node hung")


def test_the_first_read_of_a_hung_chain_node_does_not_hold_validators_checks_past_their_timeout(world, caplog):
    """Chain outage, first read: the last permits were used only once a read had failed, and the
    first failing read of an outage held every request that came meanwhile; on a hung node it takes
    the chain layer's retries (120 s an attempt, 3 attempts), so every validator's check then timed
    out (LOGITS_TIMEOUT, 30 s) and failed the miner. Scaled: a read that takes 5 s against a check
    timeout of 2 s. With a fresh last read, a request waits for a read at most ``permit_read_wait_s``,
    then is checked against the last permits while that one read goes on; its failure begins the
    outage (one warning), the node's next answer ends it."""
    fake = fake_subnet(world, HungNode)
    assert isinstance(fake, HungNode)
    payload = OUTAGE_PAYLOAD
    caplog.set_level("INFO", logger="quasar")
    with served_over(world, fake, InferenceLimits(permit_read_wait_s=0.3)) as url:
        calls_before = len(fake.calls)
        fake.hang_s = 5.0
        time.sleep(0.3)  # past the cached block number: the next request asks the node
        hung_at = time.monotonic()
        checks = [challenge_miner(world, url, timeout_s=2.0) for _ in range(3)]
        stranger = signed_post(world, url, payload, wallet="stranger")
        unsigned = requests.post(url + "/inference", json=payload, timeout=10)
        answered_in = time.monotonic() - hung_at
        hung_calls = len(fake.calls) - calls_before
        time.sleep(max(0.0, hung_at + fake.hang_s + 0.5 - time.monotonic()))  # the read has failed
        fake.hang_s = None
        time.sleep(0.3)
        back = signed_post(world, url, payload)  # answered at once; its read ends the outage
        time.sleep(0.3)
    assert all(check.passed for check in checks), [check.reason for check in checks]
    assert answered_in < 5.0, "the machine was too slow for this test"  # all answered while the read hung
    assert stranger.status_code == 403 and unsigned.status_code == 401 and back.status_code == 200
    assert hung_calls == 1, fake.calls[calls_before:]  # one read at a time asked the hung node
    lines = [r for r in caplog.records if r.name.startswith("quasar") and r.levelname != "DEBUG"]
    warnings = [r.getMessage() for r in lines if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "node hung" in warnings[0], warnings
    assert sum("chain can be read again" in r.getMessage() for r in lines) == 1, [r.getMessage() for r in lines]
