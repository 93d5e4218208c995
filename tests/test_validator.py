"""The validator end to end, with real parts: a dev chain file, the submission API on 127.0.0.1, miners'
inference servers serving a tiny Qwen2, real git forks (the honest starter fork and a hostile one that
returns zeros), real evaluations in worker processes (CPU, T=64) and a real SQLite state.

- step by step in this process: verdicts, reports, logit checks, a clone failure and a crashed
  worker that do not stop the loop, weights read back from the chain;
- weights under finney's hyperparameters (commit-reveal, rate limit, permits): an owner without a
  uid, a validator without a permit, a uid taken over between planning and submitting, a rate
  limit that holds, a version key below the subnet's;
- as a process: killed (SIGKILL) mid-evaluation and restarted, it finishes the round without
  re-evaluating what it finished, and SIGINT stops it with exit code 0; a copy of another miner's
  kernel under a commit of its own gets no weight and no place on the API's leaderboard;
- START_VALIDATOR.sh's checks and messages.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from bittensor.sp_core import Keypair
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import quasar
from api_fixtures import ApiServer, api_config
from quasar import config
from quasar.api.client import ApiClient, Claim
from quasar.api.db import EvaluationReport
from quasar.api.devdb import free_port, start_api_process
from quasar.api.lookup import ApiFollower, find_api
from quasar.chain.base import ApiLocation
from quasar.chain.devchain import FINNEY, DevChain
from quasar.inference.server import create_inference_app
from quasar.localnet.host import make_wallet
from quasar.log import REPEAT_EVERY_S
from quasar.logits import ChallengeLimits, LogitThresholds, load_reference_model
from quasar.starter_fork import write_starter_fork
from quasar.validator.devices import Device
from quasar.validator.evaluator import SubprocessEvaluator
from quasar.validator.logit_check import MinerLogitChecker, private_endpoint
from quasar.validator.loop import Validator
from quasar.validator.records import EvaluationKey, EvaluationResult, Submission
from quasar.validator.state import EVALUATION_RETRY_DELAYS_S, ValidatorState
from quasar.validator.state_files import ABANDONED, FINISHED, IMPORTED_AFTER, IN_PROGRESS, PASSED, default_state_path
from servers import serving
from tests.evaluate_runs import FAST_CPU
from tests.gitrepo import commit_all
from tests.hostile_forks import write_hostile_fork
from tests.processes import REPO_ROOT, libfaketime, proc_files, said
from tiny_qwen import make_tiny_qwen2

NETUID = 24
TARGET = 64
CLAIM = 1.0  # tokens/s: far below what the CPU measures, so the claim check passes
SLOW_BLOCKS = 1e6  # seconds per block: the chain moves only through advance()
MINERS = ("a", "b", "c", "d", "u")
# For the tests not about the weights rules: weights set directly and visible at once, no rate limit.
DIRECT = dataclasses.replace(FINNEY, commit_reveal_enabled=False, weights_rate_limit=0)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Wallets, the two forks (committed), and two tiny models: the reference and a dishonest one."""
    root = tmp_path_factory.mktemp("validator")
    wallets = {name: make_wallet(root / "wallets", name) for name in ("owner", "api", "validator", *MINERS)}
    honest = root / "honest"
    honest_commit = write_starter_fork(honest)
    zeros = root / "zeros"
    write_hostile_fork(zeros, "zeros")
    zeros_commit = commit_all(zeros, "return zeros")
    # A copier's fork: the honest kernel under a commit of its own, a comment added to hide it.
    copy = root / "copy"
    shutil.copytree(honest, copy, ignore=shutil.ignore_patterns(".git"))
    with open(copy / "fla" / "ops" / "quasar" / "chunk.py", "a") as kernel:
        kernel.write("\n# my own optimisation\n")
    copy_commit = commit_all(copy, "my kernel")
    honest_model, other_model = make_tiny_qwen2(root / "qwen1", 1), make_tiny_qwen2(root / "qwen2", 2)
    return {
        "root": root,
        "wallets": wallets,
        "honest": (f"file://{honest}", honest_commit),
        "zeros": (f"file://{zeros}", zeros_commit),
        "copy": (f"file://{copy}", copy_commit),
        "missing": (f"file://{root}/no-such-fork", "ab" * 20),
        "model_dir": honest_model,
        "served": load_reference_model(str(honest_model)),
        "other": load_reference_model(str(other_model)),
        "reference": load_reference_model(str(honest_model)),
    }


class Subnet:
    """A dev chain with ``rules`` (its hyperparameters) and the owner (uid 0), the validator and the
    miners, registered at ``start_block``, each miner serving logits."""

    def __init__(
        self,
        world,
        path: Path,
        block_time_s: float,
        dishonest: tuple[str, ...] = (),
        rules=DIRECT,
        start_block: int = 0,
    ):
        self.world = world
        self.wallets = world["wallets"]
        self.chain = DevChain(path, netuid=NETUID, block_time_s=block_time_s)
        self.chain.set_hyperparameters(**dataclasses.asdict(rules))
        self.chain.allow_loopback_axons(True)  # the miners' inference servers listen on 127.0.0.1
        self.chain.advance(start_block)
        self.uids = {"owner": self.chain.register_wallet(self.wallets["owner"])}
        self.chain.set_owner(self.wallets["owner"].hotkey.ss58_address)
        self.uids["validator"] = self.chain.register_wallet(self.wallets["validator"], stake=1e4, validator_permit=True)
        self._servers = []
        for name in MINERS:
            self.uids[name] = self.chain.register_wallet(self.wallets[name])
            model = world["other"] if name in dishonest else world["served"]
            server = serving(create_inference_app(model, self.chain, self.hotkey(name)))
            port = server.__enter__()
            self._servers.append(server)
            self.chain.publish_endpoint(self.wallets[name], "127.0.0.1", port)

    def hotkey(self, name: str) -> str:
        return self.wallets[name].hotkey.ss58_address

    def close(self) -> None:
        for server in self._servers:
            server.__exit__(None, None, None)

    def validator_weights(self) -> dict[int, float]:
        return self.chain.weights().get(self.uids["validator"], {})

    def first_alone(self, miner: str) -> dict[int, float]:
        """The weights when ``miner`` is the only miner ranked: the first place's 0.60, and the rest
        (0.40) burned to the owner's uid."""
        return {self.uids[miner]: pytest.approx(0.60), self.uids["owner"]: pytest.approx(0.40)}


@contextmanager
def running_api(subnet: Subnet, tmp_path: Path):
    config_ = api_config(subnet.hotkey("api"), allow_local_forks=True)
    with ApiServer(config_, subnet.chain, f"sqlite:///{tmp_path}/api.sqlite3") as server:
        yield server


@contextmanager
def api_state_and_client(subnet: Subnet, tmp_path: Path) -> Iterator[tuple[ApiServer, ValidatorState, ApiClient]]:
    """A running API, the validator's state in ``tmp_path``, and the validator's client of the API."""
    with (
        running_api(subnet, tmp_path) as server,
        ValidatorState.open(tmp_path / "state.sqlite3") as state,
        ApiClient(server.url, subnet.wallets["validator"], api_hotkey=subnet.hotkey("api")) as api,
    ):
        yield server, state, api


def submit(server: ApiServer, subnet: Subnet, miner: str, fork: tuple[str, str]) -> int:
    with ApiClient(server.url, subnet.wallets[miner], api_hotkey=subnet.hotkey("api")) as client:
        return client.submit_kernel(Claim(fork[0], fork[1], CLAIM), TARGET).submission_id


def reports_by_submission(server: ApiServer) -> dict[int, EvaluationReport]:
    with server.database.read() as session:
        return {report.submission_id: report for report in session.scalars(select(EvaluationReport))}


def logit_checker(world, subnet: Subnet) -> MinerLogitChecker:
    """The validator's checker against the honest tiny model (its own copy of the reference)."""
    return MinerLogitChecker(
        subnet.wallets["validator"],
        world["reference"],
        ChallengeLimits(max_prompt_len=32, max_gen_len=8),
        LogitThresholds(),
        20.0,
        private_endpoints_allowed=True,  # the dev chain's miners serve on 127.0.0.1
    )


def test_an_endpoint_refused_as_not_public_is_called_so_whatever_kind_of_address_it_is():
    """docs/rules.md section 4 step 6: any address that is not globally routable is refused, a
    shared (100.64.0.0/10) or reserved one too, which the reason called loopback, private or link-local."""
    for address in ("100.64.0.1", "240.0.0.1", "127.0.0.2", "10.1.2.3", "169.254.169.254", "[fd00::5]"):
        reason = private_endpoint(f"http://{address}:8000")
        assert reason is not None and f"{address.strip('[]')} is not a public address" in reason, reason


def test_a_miner_pointing_validators_at_their_own_network_fails_without_a_connection(world):
    """Subtensor refuses only 127.0.0.1 and ::1 as an endpoint: a miner publishing 127.0.0.2, a
    private address or 169.254.169.254 had each validator connect there, and the reason it reported
    (refused, timed out, a status, a banner) told what listens on the validator's own network."""
    validator, miner = world["wallets"]["validator"], world["wallets"]["a"].hotkey.ss58_address
    limits = ChallengeLimits(max_prompt_len=32, max_gen_len=8)
    with socket.create_server(("127.0.0.2", 0)) as listener:
        url = f"http://127.0.0.2:{listener.getsockname()[1]}"
        listener.setblocking(False)
        check = MinerLogitChecker(validator, world["reference"], limits, LogitThresholds(), 1.0).check(url, miner)
        assert not check.passed and "127.0.0.2 is not a public address" in check.reason
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection was made
        allowed = MinerLogitChecker(validator, world["reference"], limits, LogitThresholds(), 1.0, True)
        assert not allowed.check(url, miner).passed  # challenged: the listener never answers
        listener.accept()[0].close()
    for address in ("10.1.2.3", "169.254.169.254", "192.168.0.7", "[::1]", "[fd00::5]", "localhost"):
        assert private_endpoint(f"http://{address}:8000") is not None, address
    assert private_endpoint("http://[2001:4860:4860::8888]:8000") is None
    assert not settings_for(network="finney").private_endpoints_allowed
    assert settings_for(network="finney", allow_private_endpoints="true").private_endpoints_allowed
    assert settings_for().private_endpoints_allowed  # the dev chain


def settings_for(**flags: str) -> config.Settings:
    base = {"network": "devchain", "netuid": str(NETUID), "device": "cpu", "epoch_blocks": "100", "eval_seq_lens": ""}
    return config.resolve({**base, **flags}, environ={}, dotenv_path=None)


@pytest.mark.slow
def test_validator_steps_evaluate_report_and_set_weights(world, tmp_path, caplog):
    """Honest a, c with a copy of a's kernel under its own commit and dishonest logits, a fork u that
    cannot be cloned, a zeros fork b; a worker crash on the first try. Only a gets weight; the rest
    goes to the owner."""
    caplog.set_level(logging.INFO)
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS, dishonest=("c",))
    try:
        with api_state_and_client(subnet, tmp_path) as (server, state, api):
            ids = {
                name: submit(server, subnet, name, world[fork])
                for name, fork in (("a", "honest"), ("u", "missing"), ("b", "zeros"), ("c", "copy"))
            }
            validator = cpu_validator(subnet, api, state, tmp_path, interval_s=0.2)

            first = validator.step()
            # As much work as its one device can start: the rest waits at the API, in the schedule's order.
            assert first.fetched == 1 and first.weights_set and not first.failed_phases
            honest_key = EvaluationKey(*world["honest"], TARGET)
            assert first.started == [honest_key]
            # Nothing is evaluated yet: the first epoch's weights all go to the owner.
            assert subnet.validator_weights() == {subnet.uids["owner"]: pytest.approx(1.0)}

            # The worker dies (as if killed by the OOM killer): this validator's failure, retried.
            os.killpg(validator.running["cpu"].process.pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while validator.running["cpu"].poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            retry = validator.step()
            assert retry.retried == [honest_key] and honest_key not in retry.started
            assert "failed on this validator's side; it runs again" in caplog.text
            # It runs again once EVALUATION_RETRY_DELAYS_S[0] have passed since its attempt began.
            validator.clock = lambda: time.time() + EVALUATION_RETRY_DELAYS_S[0]

            validator.run_until_idle(timeout_s=200)

            evaluations = {record.key: record for record in state.evaluations()}
            assert len(evaluations) == 4
            honest, zeros = evaluations[honest_key], evaluations[EvaluationKey(*world["zeros"], TARGET)]
            missing = evaluations[EvaluationKey(*world["missing"], TARGET)]
            assert honest.status == FINISHED and honest.attempts == 2 and honest.result.correct
            assert honest.result.measured_tokens_per_sec > 10 * CLAIM
            assert zeros.status == FINISHED and zeros.attempts == 1 and not zeros.result.correct
            assert any("differs from the reference" in reason for reason in zeros.result.reasons)
            assert missing.status == FINISHED and not missing.result.correct
            assert missing.result.reasons[0].startswith("clone failed:")
            assert "clone failed" in caplog.text  # logged, and the loop went on to b and c

            reports = reports_by_submission(server)
            assert set(reports) == set(ids.values())
            a, b, c, u = (reports[ids[name]] for name in "abcu")
            assert (a.verdict, a.correct, a.logits_ok) == ("passed", True, True)
            assert a.measured_tokens_per_sec == pytest.approx(honest.result.measured_tokens_per_sec)
            assert (b.verdict, b.correct, b.logits_ok) == ("failed", False, None)
            assert (c.verdict, c.correct, c.logits_ok) == ("failed", True, False)
            assert any(reason.startswith("logit check failed") for reason in c.reasons)
            assert (u.verdict, u.correct) == ("failed", False) and u.reasons[0].startswith("clone failed")
            # Per-length figures travel with the report: the honest fork is correct at every length it ran,
            # the wrong one not everywhere; a fork that was never cloned has none.
            assert a.lengths and all(item["status"] == "ok" and item["correct"] for item in a.lengths)
            assert [item["seq_len"] for item in a.lengths] == sorted(int(n) for n in a.benchmarks)
            assert any(item["correct"] is False for item in b.lengths)
            assert u.lengths is None

            assert validator.step().weights_set is False  # same epoch: no new weights
            subnet.chain.advance(100)
            assert validator.step().weights_set
            weights = subnet.validator_weights()
            assert weights == subnet.first_alone("a")
            # What the API's leaderboard ranks from the reports agrees.
            with ApiClient(server.url) as public:
                board = public.leaderboard()
            assert [(entry.hotkey, entry.share) for entry in board.entries] == [(subnet.hotkey("a"), 0.6)]
    finally:
        subnet.close()


def test_a_failing_step_is_logged_and_the_loop_goes_on(world, tmp_path, caplog):
    """The API is down: fetching fails (logged), the step still sets weights."""
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    try:
        with (
            ValidatorState.open(tmp_path / "state.sqlite3") as state,
            ApiClient(
                f"http://127.0.0.1:{free_port()}",
                subnet.wallets["validator"],
                api_hotkey=subnet.hotkey("api"),
                timeout=2,
            ) as api,
        ):
            validator = cpu_validator(subnet, api, state, tmp_path)
            summary = validator.step()
            assert summary.failed_phases == ["fetch"]
            assert "validator step: fetch failed; going on" in caplog.text
            assert summary.weights_set and subnet.validator_weights() == {subnet.uids["owner"]: pytest.approx(1.0)}
            assert validator.step().failed_phases == ["fetch"] and validator.idle
    finally:
        subnet.close()


def test_an_api_out_of_reach_for_an_hour_is_said_once_then_every_ten_minutes_not_at_every_step(world, tmp_path, caplog):
    """An hour of 12 s steps (finney's blocks) with the API down, an evaluation waiting for its logit
    check and another for its report: the fetch's failure is logged with its traceback once, then
    one line every REPEAT_EVERY_S saying how often it recurred, and so are the logit checks' wait
    and the report's; not a traceback and two lines a step (10 MB a day under pm2). When the API
    answers again, one line says so."""
    caplog.set_level(logging.INFO)
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    now = [time.time()]
    finished = Submission(
        submission_id=1,
        hotkey=subnet.hotkey("a"),
        fork_url="file:///forks/a",
        commit_hash="ab" * 20,
        target_sequence_length=TARGET,
        claimed_tokens_per_sec=1000.0,
        submitted_at=0.0,
        round_id=0,
        counts_from_block=0,
    )
    try:
        with (
            running_api(subnet, tmp_path) as server,
            ValidatorState.open(tmp_path / "state.sqlite3") as state,
            ApiClient(
                f"http://127.0.0.1:{free_port()}", subnet.wallets["validator"], api_hotkey=subnet.hotkey("api")
            ) as api,
        ):
            checked = finished.model_copy(
                update={"submission_id": 2, "hotkey": subnet.hotkey("b"), "commit_hash": "cd" * 20}
            )
            for submission in (finished, checked):
                state.add_submission(submission, 0.0)
                key = EvaluationKey(submission.fork_url, submission.commit_hash, TARGET)
                state.start_evaluation(key, "cpu", 0.0)
                state.finish_evaluation(key, EvaluationResult(correct=True, measured_tokens_per_sec=1000.0), 0.0)
            state.record_logits(checked.submission_id, PASSED, "logits match", 0.0)
            validator = cpu_validator(subnet, api, state, tmp_path, clock=lambda: now[0], monotonic=lambda: now[0])
            for _ in range(300):
                assert validator.step().failed_phases == ["fetch"]
                now[0] += 12.0
            failures = [record for record in caplog.records if "fetch failed" in record.getMessage()]
            assert len(failures) == 300 * 12 // REPEAT_EVERY_S, [record.getMessage() for record in failures]
            # The API out of reach is an ApiClientError, a QuasarError whose message says it all.
            assert not [record for record in failures if record.exc_info], failures
            assert "(50 more time(s) in the last 600 s)" in failures[1].getMessage()
            assert len(lines(caplog, "logit checks wait")) == 300 * 12 // REPEAT_EVERY_S
            assert len(lines(caplog, "reports wait")) == 300 * 12 // REPEAT_EVERY_S
            api.retarget(server.url, subnet.hotkey("api"))
            assert validator.step().failed_phases == []
            assert validator.step().failed_phases == []
            assert lines(caplog, "works again") == ["validator step: fetch works again"]
    finally:
        subnet.close()


# --- weights under finney's rules ---


def cpu_validator(
    subnet: Subnet, api: ApiClient, state: ValidatorState, tmp_path: Path, chain: DevChain | None = None, **options
) -> Validator:
    """The validator under test: the subnet's validator wallet, tiny CPU evaluations in a worker
    process, the logit checks of the subnet's world, one CPU device; ``options`` go to Validator."""
    return Validator(
        settings_for(),
        chain or subnet.chain,
        api,
        subnet.wallets["validator"],
        SubprocessEvaluator(tmp_path / "work", FAST_CPU, allow_local=True),
        logit_checker(subnet.world, subnet),
        state,
        devices=[Device("cpu", "")],
        **options,
    )


def scored_validator(
    subnet: Subnet,
    state: ValidatorState,
    api: ApiClient,
    tmp_path: Path,
    measured: dict[str, float],
    chain: DevChain | None = None,
) -> Validator:
    """A validator whose state holds finished, logit-checked results of the miners in ``measured``
    (tokens/s each), as its own evaluations would have left them; its API is down (nothing to fetch)."""
    for submission_id, (name, tokens_per_sec) in enumerate(measured.items(), start=1):
        submission = Submission(
            submission_id=submission_id,
            hotkey=subnet.hotkey(name),
            fork_url=f"file:///forks/{name}",
            commit_hash=f"{submission_id:040x}",
            target_sequence_length=TARGET,
            claimed_tokens_per_sec=tokens_per_sec,
            submitted_at=float(submission_id),
            round_id=0,
            counts_from_block=0,
        )
        state.add_submission(submission, 0.0)
        key = EvaluationKey(submission.fork_url, submission.commit_hash, TARGET)
        state.start_evaluation(key, "cpu", 0.0)
        state.finish_evaluation(key, EvaluationResult(correct=True, measured_tokens_per_sec=tokens_per_sec), 0.0)
        state.record_logits(submission_id, PASSED, "logits match", 0.0)
    return cpu_validator(subnet, api, state, tmp_path, chain=chain)


@contextmanager
def down_api(subnet: Subnet):
    with ApiClient(
        f"http://127.0.0.1:{free_port()}", subnet.wallets["validator"], api_hotkey=subnet.hotkey("api"), timeout=2
    ) as api:
        yield api


def evaluated_awaiting_logit_check(state: ValidatorState, subnet: Subnet, world) -> None:
    """Miner a's honest submission 1 in ``state``, evaluated and correct, its logit check not yet made."""
    fork_url, commit = world["honest"]
    submission = Submission(
        submission_id=1,
        hotkey=subnet.hotkey("a"),
        fork_url=fork_url,
        commit_hash=commit,
        target_sequence_length=TARGET,
        claimed_tokens_per_sec=CLAIM,
        submitted_at=1.0,
        round_id=0,
        counts_from_block=0,
    )
    state.add_submission(submission, 0.0)
    key = EvaluationKey(fork_url, commit, TARGET)
    state.start_evaluation(key, "cpu", 0.0)
    state.finish_evaluation(key, EvaluationResult(correct=True, measured_tokens_per_sec=1000.0), 0.0)


def lines(caplog, fragment: str) -> list[str]:
    return [record.getMessage() for record in caplog.records if fragment in record.getMessage()]


def test_an_owner_without_a_uid_gets_nothing_and_the_places_are_set_alone(world, tmp_path, caplog):
    """Finney's rules. The owner's hotkey holds no uid: the validator says so in one line, commits the
    two placed shares scaled to sum 1, and the chain reveals them at the next epoch."""
    caplog.set_level(logging.INFO)
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS, rules=FINNEY)
    subnet.chain.set_owner(
        Keypair.create_from_mnemonic(Keypair.generate_mnemonic()).ss58_address,
        coldkey=subnet.wallets["owner"].coldkeypub.ss58_address,
    )
    try:
        with ValidatorState.open(tmp_path / "state.sqlite3") as state, down_api(subnet) as api:
            validator = scored_validator(subnet, state, api, tmp_path, {"a": 1000.0, "b": 500.0})
            assert validator.step().weights_set
            (line,) = lines(caplog, "hotkey holds no uid on subnet")
            assert line == (
                f"the subnet owner's hotkey holds no uid on subnet {NETUID}: the unassigned share 0.15 is "
                "not set; the placed shares are set alone, scaled to sum 1"
            )
            assert "weights committed (the chain applies them when it reveals them) at block 0" in caplog.text
            assert subnet.validator_weights() == {}  # committed: invisible until revealed
            subnet.chain.advance(FINNEY.tempo)
            assert subnet.validator_weights() == {
                subnet.uids["a"]: pytest.approx(0.60 / 0.85),
                subnet.uids["b"]: pytest.approx(0.25 / 0.85),
            }
    finally:
        subnet.close()


def test_a_validator_without_a_permit_submits_nothing_and_says_so_once_an_epoch(world, tmp_path, caplog):
    """Finney's rules: a commit without a permit would be accepted and dropped at its reveal, so the
    validator commits nothing without one, and says why once an epoch."""
    caplog.set_level(logging.INFO)
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS, rules=FINNEY)
    subnet.chain.set_validator_permit(subnet.hotkey("validator"), False)
    try:
        with ValidatorState.open(tmp_path / "state.sqlite3") as state, down_api(subnet) as api:
            validator = scored_validator(subnet, state, api, tmp_path, {"a": 1000.0})
            for _ in range(3):  # one epoch (EPOCH_BLOCKS 100)
                assert not validator.step().weights_set
                subnet.chain.advance(30)
            assert not validator.step().weights_set  # block 90... then the next epoch
            subnet.chain.advance(10)
            assert not validator.step().weights_set
            assert subnet.chain.commits() == []
            said = lines(caplog, "has no validator permit")
            assert len(said) == 2 and said[0].startswith(
                f"uid {subnet.uids['validator']} has no validator permit "
                f"on subnet {NETUID} (stake 10,000.00): no weights submitted"
            )
            subnet.chain.set_validator_permit(subnet.hotkey("validator"), True)
            subnet.chain.advance(100)
            assert validator.step().weights_set
            (commit,) = subnet.chain.commits()
            assert commit.hotkey == subnet.hotkey("validator") and commit.commit_block == 200
    finally:
        subnet.close()


def test_a_validator_follows_the_api_where_the_subnet_owner_moves_it(world, tmp_path, caplog):
    """The subnet owner publishes a new location of the API while the validator runs (the API moved
    host): the validator reads the chain again (ApiFollower, here at every step) and asks the new
    location for work, instead of the old one until it is restarted."""
    caplog.set_level(logging.WARNING)
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    owner, settings = subnet.wallets["owner"], settings_for()
    old = f"http://127.0.0.1:{free_port()}"
    subnet.chain.publish_api_location(owner, ApiLocation(old, subnet.hotkey("api")))
    try:
        with running_api(subnet, tmp_path) as server, ValidatorState.open(tmp_path / "state.sqlite3") as state:
            target = find_api(settings, subnet.chain)
            with ApiClient(target.url, subnet.wallets["validator"], api_hotkey=target.hotkey, timeout=10) as api:
                follow = ApiFollower(settings, subnet.chain, api, target, every_s=0)
                validator = cpu_validator(subnet, api, state, tmp_path, follow_api=follow)
                assert "fetch" in validator.step().failed_phases
                subnet.chain.publish_api_location(owner, ApiLocation(server.url, subnet.hotkey("api")))
                assert validator.step().failed_phases == []
                assert api.base_url == server.url
        assert lines(caplog, "moved the submission API") == [
            f"the subnet owner moved the submission API: now {server.url} (hotkey {subnet.hotkey('api')}), "
            f"was {old} (hotkey {subnet.hotkey('api')})"
        ]
    finally:
        subnet.close()


def test_a_trim_that_moves_the_miners_uids_moves_the_validators_weights_with_them(world, tmp_path):
    """The subnet owner trims the subnet (sudo_trim_to_max_allowed_uids) while the validator runs:
    miner b moves from uid 3 to uid 2, which another hotkey held, and the validator's next weights
    name b's new uid, planned on the metagraph as it is then."""
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    try:
        with ValidatorState.open(tmp_path / "state.sqlite3") as state, down_api(subnet) as api:
            validator = scored_validator(subnet, state, api, tmp_path, {"b": 1000.0})
            assert validator.step().weights_set
            assert subnet.validator_weights() == subnet.first_alone("b")
            subnet.chain.set_min_allowed_uids(2)
            subnet.chain.advance(DIRECT.immunity_period)
            subnet.chain.deregister(subnet.hotkey("a"))  # uid 2 free
            assert subnet.chain.trim_to_max_allowed_uids(4) == {0: 0, 1: 1, 3: 2, 4: 3}
            subnet.uids.update(b=2, c=3)
            assert validator.step().weights_set
            assert subnet.validator_weights() == subnet.first_alone("b")
            assert subnet.chain.metagraph().by_uid(2).hotkey == subnet.hotkey("b")
    finally:
        subnet.close()


class TakeoverChain(DevChain):
    """The validator's view of the dev chain, with one registration landing between its planning and
    its submission: miner ``a`` is pruned and a new hotkey takes its uid, just before the first
    ``set_weights`` reaches the chain."""

    def __init__(self, path: Path, victim: str):
        super().__init__(path)
        self.victim = victim
        self.newcomer = Keypair.create_from_mnemonic(Keypair.generate_mnemonic()).ss58_address
        self.submissions = 0

    def set_weights(self, wallet, weights, version_key, hotkeys=None):
        self.submissions += 1
        if self.submissions == 1:
            self.deregister(self.victim)
            self.register(self.newcomer, self.newcomer)
        return super().set_weights(wallet, weights, version_key, hotkeys)


def test_a_uid_taken_over_between_planning_and_submitting_gets_nothing(world, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS, rules=FINNEY)
    chain = TakeoverChain(subnet.chain.path, subnet.hotkey("a"))
    try:
        with ValidatorState.open(tmp_path / "state.sqlite3") as state, down_api(subnet) as api:
            validator = scored_validator(subnet, state, api, tmp_path, {"a": 1000.0, "b": 500.0}, chain=chain)
            assert validator.step().weights_set
            assert chain.submissions == 2  # planned again once the chain said uid a changed hands
            assert (
                f"uid {subnet.uids['a']}: planned for {subnet.hotkey('a')}, held by {chain.newcomer} now" in caplog.text
                and "planning the weights again" in caplog.text
            )
            assert chain.metagraph().by_uid(subnet.uids["a"]).hotkey == chain.newcomer
            subnet.chain.advance(FINNEY.tempo)
            # a is no longer registered, so b is first; the newcomer at a's uid gets nothing.
            assert subnet.validator_weights() == subnet.first_alone("b")
    finally:
        subnet.close()


def test_a_version_key_raised_while_the_validator_runs_stops_its_weights_with_an_error_each_epoch(
    world, tmp_path, caplog
):
    """Finney's rules (commit-reveal): the subnet owner raises WeightsVersionKey after the validator
    started. A commit with the old key would be accepted and silently dropped at its reveal, so the
    validator commits nothing, says at ERROR once an epoch to update QUASAR, and does not retry
    within the epoch."""
    caplog.set_level(logging.INFO)
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS, rules=FINNEY)
    try:
        with ValidatorState.open(tmp_path / "state.sqlite3") as state, down_api(subnet) as api:
            validator = scored_validator(subnet, state, api, tmp_path, {"a": 1000.0})
            assert validator.step().weights_set  # committed at block 0 with the key the subnet takes
            required = quasar.version_key() + 1
            subnet.chain.set_hyperparameters(weights_version_key=required)
            for _ in range(20):  # two epochs (EPOCH_BLOCKS 100), a step every 10 blocks
                subnet.chain.advance(10)
                assert not validator.step().weights_set
            assert len(subnet.chain.commits()) == 1
            errors = [
                record
                for record in caplog.records
                if record.levelno == logging.ERROR and record.name == "quasar.validator.weight_setting"
            ]
            assert len(errors) == 2, [record.getMessage() for record in errors]
            assert errors[0].getMessage() == (
                f"no weights submitted this epoch: this QUASAR's weights version key is {quasar.version_key()}, "
                f"below the subnet's WeightsVersionKey {required}: the chain refuses its weights "
                "(IncorrectWeightVersionKey). Update QUASAR to the subnet's current release (git pull, then "
                "./scripts/setup_venv.sh) and start the validator again (next look at block 200)"
            )
            subnet.chain.set_hyperparameters(weights_version_key=quasar.version_key())
            subnet.chain.advance(100)
            assert validator.step().weights_set
            assert [commit.commit_block for commit in subnet.chain.commits()] == [0, 300]
    finally:
        subnet.close()


def test_a_refusal_that_lasts_waits_for_the_next_epoch_instead_of_retrying(world, tmp_path, caplog):
    """Commit-reveal with a tempo of 1000 blocks: the validator's hotkey already holds the 10 commits
    of this epoch the chain lets wait for their reveal, so the chain refuses another (TooManyUnrevealedCommits)
    until they are revealed. The validator says so in one line and looks again next epoch, rather
    than submitting every WEIGHTS_RETRY_BLOCKS (9 more refused extrinsics an epoch)."""
    caplog.set_level(logging.INFO)
    rules = dataclasses.replace(FINNEY, tempo=1000, weights_rate_limit=0)
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS, rules=rules)
    try:
        for _ in range(10):
            subnet.chain.set_weights(subnet.wallets["validator"], {subnet.uids["owner"]: 1.0}, quasar.version_key())
        with ValidatorState.open(tmp_path / "state.sqlite3") as state, down_api(subnet) as api:
            validator = scored_validator(subnet, state, api, tmp_path, {"a": 1000.0})
            for _ in range(10):  # one epoch (EPOCH_BLOCKS 100), a step every 10 blocks
                assert not validator.step().weights_set
                subnet.chain.advance(10)
            refused = lines(caplog, "TooManyUnrevealedCommits")
            assert refused == [
                "the chain refused the weights at block 0, none this epoch: cannot commit weights: "
                f"TooManyUnrevealedCommits: 10 commits of uid {subnet.uids['validator']} this epoch wait for their "
                "reveal (next look at block 100)"
            ]
            assert lines(caplog, "retrying at block") == []
            assert len(subnet.chain.commits()) == 10
    finally:
        subnet.close()


def test_a_rate_limited_validator_waits_the_blocks_the_chain_says(world, tmp_path, caplog):
    """Finney's rules: registered at block 10, the validator's weights are rate-limited until block 110
    (WeightsSetRateLimit 100 from the registration block); it waits until then, then commits."""
    caplog.set_level(logging.INFO)
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS, rules=FINNEY, start_block=10)
    try:
        with ValidatorState.open(tmp_path / "state.sqlite3") as state, down_api(subnet) as api:
            validator = scored_validator(subnet, state, api, tmp_path, {"a": 1000.0})
            assert not validator.step().weights_set
            assert "the chain's weights rate limit holds at block 10" in caplog.text
            assert "retrying at block 110" in caplog.text
            subnet.chain.advance(99)
            assert not validator.step().weights_set and subnet.chain.commits() == []
            subnet.chain.advance(1)
            assert validator.step().weights_set
            (commit,) = subnet.chain.commits()
            assert commit.commit_block == 110
            subnet.chain.advance(FINNEY.tempo)
            assert subnet.validator_weights() == subnet.first_alone("a")
    finally:
        subnet.close()


# --- a hostile API: work items it should never hand out ---


@contextmanager
def hostile_api_validator(tmp_path: Path, pending, report=None, reports=None, **options) -> Iterator[Validator]:
    """A validator of one CPU device on a dev chain, against an API on 127.0.0.1 whose
    GET /validator/pending answers ``pending()``, POST /validator/report ``await report()`` when
    given, GET /validators/{hotkey}/reports ``reports(after_id)`` when given (the validator is then
    a primary), and every other route a 503; ``options`` go to Validator."""

    async def route(request):
        if request.url.path == "/validator/pending":
            return Response(json.dumps(pending(), allow_nan=True), media_type="application/json")
        if request.url.path == "/validator/report" and report is not None:
            return await report()
        if request.url.path.endswith("/reports") and reports is not None:
            answer = reports(int(request.query_params["after_id"]))
            return Response(json.dumps(answer, allow_nan=True), media_type="application/json")
        return JSONResponse({"detail": "busy"}, status_code=503)

    wallets = {name: make_wallet(tmp_path / "wallets", name) for name in ("owner", "validator", "api")}
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=NETUID, block_time_s=SLOW_BLOCKS)
    chain.set_hyperparameters(**dataclasses.asdict(DIRECT))
    chain.register_wallet(wallets["owner"])
    chain.set_owner(wallets["owner"].hotkey.ss58_address)
    chain.register_wallet(wallets["validator"], stake=1e4, validator_permit=True)
    app = Starlette(routes=[Route("/{path:path}", route, methods=["GET", "POST"])])
    with (
        serving(app) as port,
        ValidatorState.open(tmp_path / "state.sqlite3") as state,
        ApiClient(
            f"http://127.0.0.1:{port}", wallets["validator"], api_hotkey=wallets["api"].hotkey.ss58_address
        ) as api,
    ):
        yield Validator(
            settings_for(**({} if reports is None else {"validator_role": "primary"})),
            chain,
            api,
            wallets["validator"],
            SubprocessEvaluator(tmp_path / "work", FAST_CPU, allow_local=True),
            None,  # never asked: a refused fork's result is not logit-checked
            state,
            devices=[Device("cpu", "")],
            **options,
        )


def work_item(number: int, **changes) -> dict:
    """A work item as the API sends it, of a fork the validator refuses (an ssh URL): recorded as
    failed at once, with no evaluation to run."""
    return {
        "submission_id": number,
        "hotkey": "5" + "a" * 47,
        "fork_url": "ssh://git@github.com/miner/fork",
        "commit_hash": f"{number:040x}",
        "target_sequence_length": TARGET,
        "claimed_tokens_per_sec": CLAIM,
        "submitted_at": 1.0,
        "round_id": 0,
        "counts_from_block": 0,
        "vram_mb": None,
        "benchmarks": None,
        "lease_expires_at": 1e10,
        **changes,
    }


def test_a_hostile_api_gets_no_more_work_recorded_than_was_asked_for(tmp_path, caplog):
    """Asked for one item, an API sent 500 each step (fresh ids, hotkeys of 20 KB): each was
    stored for good, 10 MB of state file and 27 MB of log a step (12 s)."""
    ids = iter(range(1, 10**6))

    def pending():
        return {"items": [work_item(next(ids)) for _ in range(500)], "lease_seconds": 60}

    with hostile_api_validator(tmp_path, pending) as validator:
        for _ in range(3):
            assert validator.step().fetched == 1
        assert [record.submission.submission_id for record in validator.state.submissions()] == [1, 501, 1001]
    assert len(lines(caplog, "the API sent 500 work items where 1 were asked for; the first 1 are taken")) == 3


BEYOND_LIMITS = [
    ({"claimed_tokens_per_sec": float("inf")}, "claimed_tokens_per_sec: Input should be a finite number"),
    ({"claimed_tokens_per_sec": -5.0}, "claimed_tokens_per_sec: Input should be greater than 0"),
    ({"target_sequence_length": 0}, "target_sequence_length: Input should be greater than or equal to 1"),
    ({"submitted_at": float("nan")}, "submitted_at: Input should be a finite number"),
    ({"submission_id": 2**70}, "submission_id: Input should be less than or equal to 4611686018427387904"),
    ({"hotkey": "5" + "x" * 20_000}, "hotkey: String should match pattern"),
    ({"hotkey": "5" * 47 + "\n2026-01-01 INFO forged"}, "hotkey: String should match pattern"),
    ({"fork_url": "https://github.com/a/b\nforged"}, "fork_url: String should match pattern"),
    ({"commit_hash": "a" * 100_000}, "commit_hash: String should have at most 64 characters"),
]


def test_work_beyond_the_apis_own_limits_is_not_recorded_and_fails_no_step(tmp_path, caplog):
    """A claim of inf or a target of 0 was recorded, then failed the report phase with a traceback
    every step for good (scoring refuses them); a NaN time or an id past SQLite's range failed the
    fetch phase every step; a hotkey or fork URL with a newline forged log lines."""
    answers = iter(BEYOND_LIMITS)

    def pending():
        changes, _ = next(answers)
        return {"items": [work_item(1, **changes)], "lease_seconds": 60}

    with hostile_api_validator(tmp_path, pending) as validator:
        for _ in BEYOND_LIMITS:
            summary = validator.step()
            assert summary.fetched == 0 and summary.failed_phases == []
        assert validator.state.submissions() == [] and validator.idle
    assert not [record for record in caplog.records if record.exc_info]
    warnings = lines(caplog, "the API sent a work item beyond its own limits")
    assert len(warnings) == len(BEYOND_LIMITS) and all("\n" not in line and len(line) < 300 for line in warnings)
    for line, (_, problem) in zip(warnings, BEYOND_LIMITS):
        assert problem in line


def reported(number: int, **changes) -> dict:
    """A report of this validator's hotkey as the API answers GET /validators/{hotkey}/reports: a
    passed submission of a GitHub fork."""
    item = {key: value for key, value in work_item(number).items() if key not in ("vram_mb", "lease_expires_at")}
    return {
        **item,
        "fork_url": "https://github.com/miner/fork",
        "report_id": number,
        "verdict": "passed",
        "correct": True,
        "logits_ok": True,
        "measured_tokens_per_sec": CLAIM,
        "benchmarks": None,
        "reasons": [],
        "content_hash": None,
        "reported_at": 1.0,
        **changes,
    }


REPORTS_BEYOND_LIMITS = [
    ({"claimed_tokens_per_sec": float("inf")}, "claimed_tokens_per_sec: Input should be a finite number"),
    ({"measured_tokens_per_sec": 1e300}, "measured_tokens_per_sec: Input should be less than or equal to"),
    ({"measured_tokens_per_sec": -1.0}, "measured_tokens_per_sec: Input should be greater than or equal to 0"),
    ({"measured_tokens_per_sec": float("nan")}, "measured_tokens_per_sec: Input should be a finite number"),
    ({"submission_id": 2**70}, "submission_id: Input should be less than or equal to 4611686018427387904"),
    ({"hotkey": "5" * 47 + "\n2026-01-01 ERROR forged"}, "hotkey: String should match pattern"),
    ({"hotkey": "5" + "x" * 200_000}, "hotkey: String should match pattern"),
    ({"reasons": ["x" * 200_000]}, "reasons.0: String should have at most 1000 characters"),
    ({"reasons": ["x"] * 1000}, "reasons: List should have at most 20 items"),
    ({"content_hash": "f" * 200_000}, "content_hash: String should match pattern"),
]


def test_a_hostile_api_cannot_put_reports_beyond_its_own_limits_into_a_primarys_ranking(tmp_path, caplog):
    """A primary imports its hotkey's reports as the API answers them, and took any: a claim of inf
    or a figure of 1e300 failed scoring with a traceback at every weights phase for good, an id past
    SQLite's range failed its import with one, a hotkey with a newline forged a line of the weights
    phase's log, and hotkeys or reasons of megabytes went into the state file and that line."""
    caplog.set_level(logging.INFO)
    answer = [reported(number + 1, **changes) for number, (changes, _) in enumerate(REPORTS_BEYOND_LIMITS)]
    honest = reported(len(answer) + 1)

    def pending():
        return {"items": [], "lease_seconds": 60}

    def reports(after_id: int):
        unread = [item for item in (*answer, honest) if item["report_id"] > after_id]
        return {"validator_hotkey": "x", "reports": unread}

    with hostile_api_validator(tmp_path, pending, reports=reports) as validator:
        for _ in range(2):
            summary = validator.step()
            assert summary.failed_phases == [] and summary.weights_set
            validator.chain.advance(1000)
        assert [record.submission.submission_id for record in validator.state.submissions()] == [honest["report_id"]]
    assert (tmp_path / "state.sqlite3").stat().st_size < 1_000_000
    assert not [record for record in caplog.records if record.exc_info]
    (left_out,) = lines(caplog, "left out of the ranking")
    assert "\n" not in left_out and len(left_out) < 300
    warnings = lines(caplog, "the API sent report")
    assert len(warnings) == len(REPORTS_BEYOND_LIMITS)
    for line, (_, problem) in zip(warnings, REPORTS_BEYOND_LIMITS):
        assert problem in line


def test_a_hostile_apis_report_id_past_what_an_api_can_be_asked_after_stops_no_primarys_reading(tmp_path, caplog):
    """A primary asks for its hotkey's reports after the last one read; a lying API answering one of
    id 2^63 moved it there, and every API after it, the honest one put back included, refused to be
    asked after an id past 2^62 (422): the import phase failed every step for good, the workers'
    results never reaching the weights again."""

    def reports(after_id: int):
        return {"validator_hotkey": "x", "reports": [reported(1, report_id=2**63)] if after_id == 0 else []}

    with hostile_api_validator(tmp_path, lambda: {"items": [], "lease_seconds": 60}, reports=reports) as validator:
        assert validator.step().failed_phases == []
        config_ = api_config(validator.api.api_hotkey, allow_local_forks=True)
        with ApiServer(config_, validator.chain, f"sqlite:///{tmp_path}/api.sqlite3") as server:
            validator.api.retarget(f"http://127.0.0.1:{server.port}", validator.api.api_hotkey)
            for _ in range(2):
                assert validator.step().failed_phases == []
    (refused,) = lines(caplog, "the API sent report 9223372036854775808 beyond its own limits")
    assert "report_id: Input should be less than or equal to 4611686018427387904" in refused


def test_a_place_in_the_reports_past_what_an_api_can_be_asked_after_kept_by_an_earlier_version_is_read_again(
    tmp_path, caplog
):
    """A version before the bound above kept a lying API's report id of 2^63 as the last one read.
    Upgraded, the primary still asked every API for the reports after it, and each refused (422):
    the import phase failed every step for good."""
    with hostile_api_validator(tmp_path, lambda: {"items": [], "lease_seconds": 60}, reports=lambda _: {}) as validator:
        validator.state.set_meta(IMPORTED_AFTER, str(2**63))
        config_ = api_config(validator.api.api_hotkey, allow_local_forks=True)
        with ApiServer(config_, validator.chain, f"sqlite:///{tmp_path}/api.sqlite3") as server:
            validator.api.retarget(f"http://127.0.0.1:{server.port}", validator.api.api_hotkey)
            for _ in range(2):
                assert validator.step().failed_phases == []
        assert validator.state.get_meta(IMPORTED_AFTER) == "0"
    (said,) = lines(caplog, "report 9223372036854775808, is past any an API can be asked after")
    assert "the reports are read again from the first" in said


def test_an_api_answering_each_report_slowly_holds_the_loop_no_longer_than_the_report_budget(tmp_path, caplog):
    """An API answering each report with a 429 just inside the client's timeout held one step for
    the backlog of reports times that delay (1,000 unreported submissions at 30 s each: 8 hours
    without collecting an evaluation or setting weights)."""
    asked: list[float] = []

    async def report():
        asked.append(time.monotonic())
        await asyncio.sleep(1.0)
        return JSONResponse({"detail": "rate limited"}, status_code=429)

    def pending():
        return {"items": [work_item(number) for number in range(1, 11)], "lease_seconds": 60}

    with hostile_api_validator(tmp_path, pending, report, report_budget_s=2.0) as validator:
        validator.devices = [Device(f"cpu{index}", "") for index in range(10)]
        validator.step()  # takes the ten refused submissions, failed at once
        validator.chain.advance(1000)
        started = time.monotonic()
        summary = validator.step()
        assert time.monotonic() - started < 6.0
        assert summary.weights_set and 2 <= len(asked) <= 4
    (line,) = lines(caplog, "reporting took over 2 s this step")
    assert line.endswith(f"{10 - len(asked)} report(s) wait for the next")


def test_a_wall_clock_stepped_back_or_forward_moves_no_reminder(tmp_path, caplog):
    """A phase failing at every step is said again every REPEAT_EVERY_S (quasar.log.Repeats). Its
    interval was measured by the wall clock the state's times are read from: stepped back an hour
    (NTP, an operator's date -s), the failure was not said again for an hour and ten minutes, and
    stepped forward, at once. The intervals follow the monotonic clock."""
    wall, monotonic = [time.time()], [0.0]

    def later(seconds: float, wall_step: float) -> None:
        monotonic[0] += seconds
        wall[0] += seconds + wall_step

    with (
        hostile_api_validator(
            tmp_path, lambda: {"items": "none"}, clock=lambda: wall[0], monotonic=lambda: monotonic[0]
        ) as validator,
        caplog.at_level(logging.ERROR, logger="quasar.validator.loop"),
    ):
        assert validator.step().failed_phases == ["fetch"]  # the API's answer is not a work batch
        later(REPEAT_EVERY_S, wall_step=-3600.0)
        assert validator.step().failed_phases == ["fetch"]
        later(1.0, wall_step=7200.0)
        assert validator.step().failed_phases == ["fetch"]
    said = lines(caplog, "fetch failed")
    assert len(said) == 2 and said[1].endswith(f"(1 more time(s) in the last {REPEAT_EVERY_S:.0f} s)"), said


# --- the validator as a process ---


def validator_command(subnet_path: Path, world, api_url: str, api_hotkey: str, data_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "neurons.validator",
        "--subtensor.network",
        "devchain",
        "--devchain.path",
        str(subnet_path),
        "--netuid",
        str(NETUID),
        "--wallet.path",
        str(world["root"] / "wallets"),
        "--wallet.name",
        "validator",
        "--wallet.hotkey",
        "default",
        "--api.url",
        api_url,
        "--api.hotkey",
        api_hotkey,
        "--device",
        "cpu",
        "--reference-model",
        str(world["model_dir"]),
        "--validator.data-dir",
        str(data_dir),
        "--eval.seq-lens",
        "",
        "--eval.timed-seconds",
        "0",
        "--epoch-blocks",
        "3",
        "--logits.max-prompt-len",
        "32",
        "--logits.max-gen-len",
        "8",
    ]


def process_environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("QUASAR", "VALIDATOR"))}
    env.update(PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def read_evaluations(path: Path) -> dict[tuple, tuple[str, int]]:
    """(url, commit, target) -> (status, attempts), read while the validator runs (WAL: never blocks it)."""
    if not path.exists():
        return {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
        try:
            rows = db.execute(
                "SELECT fork_url, commit_hash, target_sequence_length, status, attempts FROM evaluations"
            ).fetchall()
        except sqlite3.OperationalError:  # not created yet
            return {}
    return {tuple(row[:3]): (row[3], row[4]) for row in rows}


def wait_for(condition, timeout_s: float, what: str, process: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"the validator exited ({process.returncode}) waiting for {what}:\n"
                f"{log.read_text()[-4000:] if log else ''}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:] if log else ''}")
        time.sleep(0.1)


def worker_processes(marker: str) -> list[int]:
    return [
        pid
        for pid, cmdline in proc_files("cmdline")
        if b"quasar.validator.worker" in cmdline and marker.encode() in cmdline
    ]


@pytest.mark.slow
def test_killed_mid_evaluation_the_validator_resumes_without_redoing_finished_work(world, tmp_path):
    """a (honest), b (zeros), d (a's kernel under a commit of d's own): SIGKILL while b is evaluated,
    restart; a is not evaluated again, b is; every submission is reported, with its kernel content
    hash; weights a 0.60 and the owner 0.40: d passes but is a copy, ranked neither by the validator
    nor by the API; SIGINT stops the validator with status 0."""
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", block_time_s=1.0)
    data_dir = tmp_path / "data"
    try:
        with running_api(subnet, tmp_path) as server:
            ids = {
                name: submit(server, subnet, name, world[fork])
                for name, fork in (("a", "honest"), ("b", "zeros"), ("d", "copy"))
            }
            command = validator_command(
                tmp_path / "devchain.sqlite3", world, server.url, subnet.hotkey("api"), data_dir
            )
            state_path = default_state_path(data_dir, "devchain", NETUID, subnet.hotkey("validator"))
            honest = (*world["honest"], TARGET)
            zeros = (*world["zeros"], TARGET)

            first_log = tmp_path / "first.log"
            with open(first_log, "w") as log:
                first = subprocess.Popen(
                    command, cwd=tmp_path, env=process_environment(), stdout=log, stderr=subprocess.STDOUT
                )
            try:
                wait_for(
                    lambda: (
                        read_evaluations(state_path).get(honest, ("",))[0] == FINISHED
                        and read_evaluations(state_path).get(zeros, ("",))[0] == IN_PROGRESS
                    ),
                    180,
                    "a finished and b in progress",
                    first,
                    first_log,
                )
                wait_for(lambda: worker_processes(str(data_dir)), 30, "b's worker to start", first, first_log)
            finally:
                first.kill()
                first.wait()
            # The worker of b dies with its validator (no orphan evaluation skews the next benchmark).
            wait_for(lambda: not worker_processes(str(data_dir)), 30, "b's worker to exit")
            assert read_evaluations(state_path)[honest] == (FINISHED, 1)

            second_log = tmp_path / "second.log"
            with open(second_log, "w") as log:
                second = subprocess.Popen(
                    command, cwd=tmp_path, env=process_environment(), stdout=log, stderr=subprocess.STDOUT
                )
            try:
                wait_for(lambda: len(reports_by_submission(server)) == 3, 180, "three reports", second, second_log)
                expected = subnet.first_alone("a")
                wait_for(lambda: subnet.validator_weights() == expected, 60, "the weights", second, second_log)
            finally:
                second.send_signal(signal.SIGINT)
                try:
                    status = second.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    second.kill()
                    raise
            output = second_log.read_text()
            assert status == 0, output[-4000:]
            assert "was interrupted (validator stopped or crashed): it runs again" in output
            assert "validator stopped" in output

            evaluations = read_evaluations(state_path)
            assert evaluations[honest] == (FINISHED, 1) and evaluations[zeros] == (FINISHED, 2)
            reports = reports_by_submission(server)
            assert [reports[ids[name]].verdict for name in ("a", "b", "d")] == ["passed", "failed", "passed"]
            # The validator fingerprinted both clones: the comment does not hide d's copy.
            assert reports[ids["a"]].content_hash == reports[ids["d"]].content_hash is not None
            with ApiClient(server.url) as public:
                board = public.leaderboard()
                copied = public.submission_status(ids["d"])
            assert [entry.hotkey for entry in board.entries] == [subnet.hotkey("a")]
            assert [(item.submission_id, item.state) for item in board.not_ranked] == [(ids["d"], "copy")]
            assert (copied.state, copied.copy_of, copied.weighted_score) == ("copy", ids["a"], 0.0)
    finally:
        subnet.close()


def test_sigint_stops_a_running_evaluation_and_puts_it_back(world, tmp_path):
    """request_stop during an evaluation: the worker is stopped, the evaluation is pending again and
    its attempt is not counted."""
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    try:
        with api_state_and_client(subnet, tmp_path) as (server, state, api):
            submit(server, subnet, "a", world["honest"])
            validator = cpu_validator(subnet, api, state, tmp_path)
            assert validator.step().started
            running = validator.running["cpu"]
            interrupt = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
            interrupt.start()
            validator.run_forever()  # returns only once the SIGINT has stopped it
            interrupt.join()
            assert running.process.returncode is not None and not validator.running
            record = state.evaluation(EvaluationKey(*world["honest"], TARGET))
            assert (record.status, record.attempts) == ("pending", 0)
            assert record.status != ABANDONED
    finally:
        subnet.close()


def test_a_stop_during_a_logit_check_of_a_miner_answering_503_forever_ends_at_once_and_records_nothing(
    world, tmp_path, caplog
):
    """pm2 stops with SIGINT and kills 30 s later. A miner answering 503 ("retry later") to every
    challenge held the logit check phase through its waits between tries (15 s, after up to
    LOGITS_TIMEOUT of exchanges) before the loop saw the stop, then recorded the check FAILED. The
    wait ends when the validator is asked to stop, and the check, given up, runs after the restart."""

    async def busy(request):
        return JSONResponse({"detail": "inference queue full; retry later"}, status_code=503)

    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    try:
        with (
            serving(Starlette(routes=[Route("/inference", busy, methods=["POST"])])) as port,
            api_state_and_client(subnet, tmp_path) as (_, state, api),  # an API within reach: checks run
        ):
            subnet.chain.publish_endpoint(subnet.wallets["a"], "127.0.0.1", port)
            evaluated_awaiting_logit_check(state, subnet, world)
            validator = cpu_validator(subnet, api, state, tmp_path)
            validator.logit_checker.sleep = validator.pause  # as quasar/validator/cli.py builds it
            assert [record.submission.submission_id for record in state.needing_logit_check()] == [1]
            interrupt = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
            started = time.monotonic()
            interrupt.start()
            with caplog.at_level(logging.INFO, logger="quasar.validator.loop"):
                validator.run_forever()
            elapsed = time.monotonic() - started
            interrupt.join()
            assert [record.submission.submission_id for record in state.needing_logit_check()] == [1]
    finally:
        subnet.close()
    assert elapsed < 4.0, elapsed
    assert lines(caplog, "logit check of submission 1 given up: the validator is stopping"), caplog.text


def test_a_validator_whose_network_is_down_fails_no_miners_logit_check(world, tmp_path, caplog):
    """This host's network down: neither the API nor the miner's endpoint answers. The check failed
    the miner for good ('miner endpoint ... unreachable'), reported once the network was back. The
    validator leaves its checks for a later step while it cannot reach the API, saying why."""
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    try:
        with down_api(subnet) as api, ValidatorState.open(tmp_path / "state.sqlite3") as state:
            subnet.chain.publish_endpoint(subnet.wallets["a"], "127.0.0.1", free_port())  # nothing listens
            evaluated_awaiting_logit_check(state, subnet, world)
            validator = cpu_validator(subnet, api, state, tmp_path)
            with caplog.at_level(logging.INFO, logger="quasar.validator.loop"):
                validator.step()
            records = state.submissions()
            assert [record.submission.submission_id for record in state.needing_logit_check()] == [1], [
                (record.logits, record.logits_reason) for record in records
            ]
    finally:
        subnet.close()
    (said,) = lines(caplog, "logit checks wait")
    assert "cannot reach the API" in said, said


@contextmanager
def validator_ahead_of_the_api(world, tmp_path, seconds: int):
    """A CPU validator whose clock is ``seconds`` ahead of its API's (the API's process runs that far
    behind under libfaketime; every clock else is the host's), holding one evaluated submission that
    awaits its logit check; yields (state, validator)."""
    behind = {"LD_PRELOAD": libfaketime(), "FAKETIME": f"-{seconds}", "DONT_FAKE_MONOTONIC": "1"}
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    database_url = f"sqlite:///{tmp_path}/api.sqlite3"
    process, url = start_api_process(tmp_path, database_url, subnet.chain.path, subnet.hotkey("api"), settings=behind)
    try:
        with (
            ValidatorState.open(tmp_path / "state.sqlite3") as state,
            ApiClient(url, subnet.wallets["validator"], api_hotkey=subnet.hotkey("api")) as api,
        ):
            evaluated_awaiting_logit_check(state, subnet, world)
            yield state, cpu_validator(subnet, api, state, tmp_path)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
        subnet.close()


def test_a_validator_whose_clock_is_ahead_of_the_apis_checks_no_logits_and_says_by_how_much(world, tmp_path, caplog):
    """A miner's server refuses a request signed more than 2 s ahead of its clock, and the refusal
    failed the miner's check, recorded for good: a validator whose clock ran 5 s ahead failed every
    miner. It compares its clock with the API's first, and that far off leaves the checks for a
    later step, saying why."""
    with validator_ahead_of_the_api(world, tmp_path, 5) as (state, validator):
        with caplog.at_level(logging.INFO, logger="quasar.validator.loop"):
            validator.step()
        assert [record.submission.submission_id for record in state.needing_logit_check()] == [1]
    (said,) = lines(caplog, "logit checks wait")
    assert re.search(r"[45]\.\d s ahead of the API's", said) and "NTP" in said, said


def test_a_validator_whose_clock_is_two_minutes_off_says_so_once_not_at_every_step(world, tmp_path, caplog):
    """A validator 120 s ahead of the API: every signed request is refused (401) with the offset and
    the API's time, which differ at each step, and the logit checks wait with the offset measured
    again. A condition is said again when its text changes (quasar.log.Repeats), so those figures
    had each step log the fetch's failure with its traceback and the logit checks' wait again. Said
    once, then every REPEAT_EVERY_S."""
    with validator_ahead_of_the_api(world, tmp_path, 120) as (_, validator):
        with caplog.at_level(logging.INFO, logger="quasar.validator.loop"):
            for _ in range(4):
                assert validator.step().failed_phases == ["fetch"]
                time.sleep(1.1)  # the API's time in its refusal is another second at each step
    (failure,) = [record for record in caplog.records if "fetch failed" in record.getMessage()]
    assert failure.exc_info is None
    assert re.search(r"signed 1(19|20)\.\d s ahead of this server's clock", failure.getMessage()), failure.getMessage()
    (waiting,) = lines(caplog, "logit checks wait")
    assert re.search(r"1(19|20)\.\d s ahead of the API's", waiting) and "timedatectl set-ntp true" in waiting, waiting


def test_reports_refused_for_the_clock_are_said_once_not_each_at_every_step(world, tmp_path, caplog):
    """Reports the API refuses with 401 (this host's clock 120 s ahead) are tried each, in turn, at
    every step: one condition, said once. Each line named its submission, so with two waiting the
    text changed at every try and both were logged again at every step."""
    with validator_ahead_of_the_api(world, tmp_path, 120) as (state, validator):
        (first,) = state.needing_logit_check()
        state.add_submission(first.submission.model_copy(update={"submission_id": 2, "submitted_at": 2.0}), 0.0)
        for submission_id in (1, 2):
            state.record_logits(submission_id, PASSED, "logits match", 0.0)
        with caplog.at_level(logging.INFO, logger="quasar.validator.loop"):
            for _ in range(3):
                validator.step()
        assert [record.submission.submission_id for record in state.ready_to_report()] == [1, 2]
    waiting = [line for line in lines(caplog, "wait") if "401" in line]
    assert len(waiting) == 1 and "ahead of this server's clock" in waiting[0], waiting


def test_a_phase_failing_another_way_with_an_empty_message_is_said_with_its_traceback(world, tmp_path, caplog):
    """A phase that fails at every step is said once (quasar.log.Repeats), its traceback with it. A
    timeout's message is empty, as is an assert's: a phase that timed out and then failed an assert
    read the same, 'failed; going on: ', and the assert was not said, nor its traceback ever."""
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    try:
        with api_state_and_client(subnet, tmp_path) as (_, state, api):
            validator = cpu_validator(subnet, api, state, tmp_path)
            with caplog.at_level(logging.ERROR, logger="quasar.validator.loop"):
                for failure in (TimeoutError(), AssertionError()):

                    def sync(summary, failure=failure):
                        raise failure

                    validator._sync = sync
                    assert validator.step().failed_phases == ["sync"]
    finally:
        subnet.close()
    failures = [record for record in caplog.records if "sync failed" in record.getMessage()]
    assert [type(record.exc_info[1]) for record in failures] == [TimeoutError, AssertionError], failures


def test_an_idle_validator_says_where_it_stands_every_heartbeat(world, tmp_path, caplog):
    """Nothing to evaluate for a whole epoch: the log still shows the validator alive, at which
    block, and when weights are due."""
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS)
    try:
        with api_state_and_client(subnet, tmp_path) as (server, state, api):
            validator = cpu_validator(subnet, api, state, tmp_path, interval_s=0.2, heartbeat_s=0.5)
            interrupt = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
            interrupt.start()
            with caplog.at_level(logging.INFO, logger="quasar.validator.loop"):
                validator.run_forever()
            interrupt.join()
    finally:
        subnet.close()
    beats = [record.getMessage() for record in caplog.records if "evaluation(s) running" in record.getMessage()]
    assert 2 <= len(beats) <= 4, beats
    block = subnet.chain.current_block()
    assert all(
        beat.startswith("at block ") and "0 evaluation(s) running, 0 submission(s) open" in beat for beat in beats
    ), beats
    assert int(beats[-1].split()[2].rstrip(":")) <= block


def test_a_version_key_below_the_subnets_is_refused_at_start(world, tmp_path):
    subnet = Subnet(world, tmp_path / "devchain.sqlite3", SLOW_BLOCKS, rules=FINNEY)
    required = quasar.version_key() + 1
    subnet.chain.set_hyperparameters(weights_version_key=required)
    try:
        command = validator_command(
            tmp_path / "devchain.sqlite3", world, "http://127.0.0.1:9", subnet.hotkey("api"), tmp_path / "data"
        )
        result = subprocess.run(
            command, cwd=tmp_path, env=process_environment(), capture_output=True, text=True, timeout=120
        )
    finally:
        subnet.close()
    assert result.returncode == 1, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert (
        f"this QUASAR's weights version key is {quasar.version_key()}, below the subnet's WeightsVersionKey {required}"
    ) in output
    assert "Update QUASAR to the subnet's current release (git pull, then ./scripts/setup_venv.sh)" in output
    assert "Traceback" not in output


# --- START_VALIDATOR.sh ---


def run_start_script(*flags: str, **env: str) -> subprocess.CompletedProcess:
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("WALLET_NAME", "WALLET_PATH", "WALLET_HOTKEY", "DEVICE", "VALIDATOR_API_URL")
    }
    environment.update(env)
    return subprocess.run(
        ["bash", str(REPO_ROOT / "START_VALIDATOR.sh"), *flags],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_start_script_names_a_missing_wallet(tmp_path):
    result = run_start_script("--wallet.path", str(tmp_path / "wallets"), "--wallet.name", "nobody", DEVICE="cpu")
    assert result.returncode == 1
    assert (
        f"wallet file {tmp_path}/wallets/nobody/coldkeypub.txt does not exist: create the wallet (btcli wallet "
        f"create --wallet nobody --wallet-hotkey default --wallet-path {tmp_path}/wallets)"
    ) in said(result)


def test_start_script_messages_fit_80_columns_with_each_path_whole(world):
    """The refusals were one line of up to 300 columns: an 80-column terminal split the wallet's
    path and the btcli command to copy mid-word."""
    result = run_start_script("--wallet.path", "no-wallets-here", "--wallet.name", "nobody", DEVICE="cpu")
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and all(len(line) <= 80 for line in lines), result.stderr
    assert any("no-wallets-here/nobody/coldkeypub.txt" in line.split() for line in lines), result.stderr
    wallets = str(world["root"] / "wallets")
    api = f"http://127.0.0.1:{free_port()}"
    result = run_start_script("--wallet.name", "validator", "--api.url", api, WALLET_PATH=wallets, DEVICE="cpu")
    assert result.returncode == 1 and "GET /health" in result.stderr, result.stderr
    assert all(len(line) <= 80 for line in result.stderr.splitlines()), result.stderr


def test_start_script_says_when_the_api_does_not_answer(world):
    port = free_port()
    result = run_start_script(
        "--wallet.name",
        "validator",
        DEVICE="cpu",
        WALLET_PATH=str(world["root"] / "wallets"),
        VALIDATOR_API_URL=f"http://127.0.0.1:{port}",
    )
    assert result.returncode == 1
    assert f"the submission API at http://127.0.0.1:{port} does not answer GET /health" in said(result)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_start_script_says_when_cuda_is_missing(world):
    result = run_start_script(
        "--wallet.path", str(world["root"] / "wallets"), "--wallet.name", "validator", DEVICE="cuda"
    )
    assert result.returncode == 1
    assert "DEVICE=cuda but PyTorch sees no CUDA GPU" in said(result)


def test_start_script_runs_the_validator_which_names_an_unregistered_hotkey(world, tmp_path):
    """Every check passes: the validator itself starts and refuses a hotkey not on the subnet."""
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=NETUID, block_time_s=SLOW_BLOCKS)
    chain.register_wallet(world["wallets"]["owner"])
    config_ = api_config(world["wallets"]["api"].hotkey.ss58_address, allow_local_forks=True)
    with ApiServer(config_, chain, f"sqlite:///{tmp_path}/api.sqlite3") as server:
        result = run_start_script(
            "--wallet.path",
            str(world["root"] / "wallets"),
            "--wallet.name",
            "validator",
            "--subtensor.network",
            "devchain",
            "--devchain.path",
            str(tmp_path / "devchain.sqlite3"),
            "--validator.data-dir",
            str(tmp_path / "data"),
            DEVICE="cpu",
            VALIDATOR_API_URL=server.url,
        )
    hotkey = world["wallets"]["validator"].hotkey.ss58_address
    assert result.returncode == 1, result.stderr
    assert f"hotkey {hotkey} is not registered on subnet {NETUID} of devchain" in result.stderr
