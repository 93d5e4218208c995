"""The miner end to end on CPU at tiny lengths: the optimization loop with the real evaluation harness,
a GitHub stand-in, a stand-in chat endpoint and a real submission API on a dev chain; the neuron
process itself; START_MINER.sh's checks; the pm2 ecosystem file."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bittensor as bt
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from api_fixtures import SLOW_BLOCKS, ApiServer, api_config
from quasar.api.client import ApiClient
from quasar.chain import Endpoint
from quasar.chain.devchain import DevChain
from quasar.config import resolve
from quasar.localnet.github_standin import GitHubStandIn
from quasar.localnet.host import make_wallet
from quasar.miner.github import Git, GitHubClient, write_askpass
from quasar.miner.loop import Evaluator, LoopConfig, Miner, required_gain
from quasar.miner.runner import EndpointKeeper, MinerSetupError, published_endpoint, remote_url
from quasar.miner.state import Measurement, StateStore
from quasar.miner.status import VerdictWatcher
from quasar.miner.strategies import ERROR, FAILED, KEPT, REJECTED, SLOWER, AgentStrategy, TuningStrategy
from quasar.miner.strategies.tuning import SPACE_FILE
from quasar.miner.submission import COMMIT_REVEAL, DIRECT, Submitter
from quasar.miner.workspace import ForkClone, Workspace
from quasar.signals import stop_on_signals
from servers import serving
from test_miner_standins import (
    CHUNK_FILE,
    TOKEN,
    UPSTREAM,
    ChatStandIn,
    bare_head,
    fast_chunk_source,
    file_reply,
    github_with_upstream,
    write_slow_fork,
    write_tuning_fork,
    wrong_chunk_source,
)
from tests.evaluate_runs import FAST_CPU
from tests.gitrepo import git
from tests.processes import (
    neuron_stand_in,
    run_python,
    run_start_script,
    said,
    signal_in_a_finaliser,
    start_script_copy,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """One torch thread in the benchmarked child (passed through the sandbox): steadier CPU timings."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


# Tiny CPU evaluations with a few more timed runs: the loop compares a candidate with its baseline.
FAST = dataclasses.replace(FAST_CPU, max_timed_runs=5, timed_seconds=0.2)


class Rig:
    """Everything a miner talks to, and a miner built on it (as runner.py builds one)."""

    def __init__(self, tmp_path: Path, github: GitHubStandIn):
        self.tmp = tmp_path
        self.github = github
        wallets = tmp_path / "wallets"
        self.api_wallet, self.miner, self.validator = (make_wallet(wallets, n) for n in ("api", "miner", "v1"))
        self.chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=SLOW_BLOCKS)
        self.chain.register_wallet(self.miner)
        self.chain.register_wallet(self.validator, stake=1e4, validator_permit=True)
        config = api_config(self.api_wallet.hotkey.ss58_address, allow_local_forks=True)
        self.server = ApiServer(config, self.chain, f"sqlite:///{tmp_path}/api.sqlite3").__enter__()
        self.hotkey = self.miner.hotkey.ss58_address
        fork = GitHubClient(github.api_url, TOKEN).ensure_fork("alice", UPSTREAM).repository
        self.fork_url = remote_url(github.file_base, fork.full_name)
        self.bare = github.bare(fork.full_name)
        self.workspace = Workspace(tmp_path / "workspaces", self.hotkey)
        self.workspace.acquire()
        runner = Git(write_askpass(self.workspace.askpass), "alice", TOKEN, "Alice", "alice@example.invalid")
        self.clone = ForkClone(self.workspace.fork, runner, self.fork_url, fork.default_branch)
        self.store = StateStore(self.workspace.state_file)
        self.state = self.store.load(self.hotkey)
        self.client = ApiClient(self.server.url, self.miner, api_hotkey=self.api_wallet.hotkey.ss58_address)
        self.validator_client = ApiClient(
            self.server.url, self.validator, api_hotkey=self.api_wallet.hotkey.ss58_address
        )

    def miner_loop(self, strategies, config: LoopConfig) -> Miner:
        submitter = Submitter(
            self.client,
            self.chain,
            self.state,
            self.store,
            DIRECT,
            self.fork_url,
            publish=self.clone.push,
            min_gain=config.min_improvement,
        )
        return Miner(
            self.clone, strategies, Evaluator(FAST, self.workspace.reports), submitter, self.state, self.store, config
        )

    def close(self) -> None:
        self.client.close()
        self.validator_client.close()
        self.server.__exit__(None, None, None)
        self.workspace.release()


@pytest.mark.slow
def test_agent_candidates_are_kept_when_faster_and_rolled_back_or_rejected_otherwise(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)  # as START_MINER.sh exports .env; benchmarked code must not see it
    with github_with_upstream(tmp_path, {TOKEN: "alice"}, fork_delay_polls=0) as github:
        rig = Rig(tmp_path, github)
        try:
            start = rig.clone.sync()
            original = (rig.clone.path / CHUNK_FILE).read_text()
            fast, wrong = fast_chunk_source(original), wrong_chunk_source(original)
            replies = [
                file_reply("drop the sleep", {CHUNK_FILE: fast}),
                file_reply("scale the output", {CHUNK_FILE: wrong}),
                file_reply("borrow kda", {CHUNK_FILE: "from fla.ops.kda import chunk_kda\n" + fast}),
            ]
            with ChatStandIn(replies) as chat:
                agent = AgentStrategy(chat.url, "coder")
                loop = rig.miner_loop(
                    [agent], LoopConfig(iterations=3, interval_s=0, min_improvement=0.02, target_seq_len=128)
                )
                summary = loop.run_cycle()
            outcomes = [(a.strategy, a.description, a.outcome) for a in summary.attempts]
            assert outcomes[0] == ("agent", "drop the sleep", KEPT)
            assert outcomes[1][1:] == ("scale the output", FAILED)
            assert outcomes[2][1:] == ("(no candidate)", REJECTED) and "forbidden-import" in summary.attempts[2].reason
            assert "differs from the reference" in summary.attempts[1].reason
            assert "Target sequence length: 128 tokens." in chat.requests[0]["messages"][1]["content"]

            kept = summary.attempts[0].commit
            assert bare_head(rig.bare) == kept  # pushed
            assert git(rig.clone.path, "log", "-1", "--format=%s", kept) == "agent: drop the sleep"
            assert (rig.clone.path / CHUNK_FILE).read_text() == fast  # the wrong edit was rolled back
            assert rig.clone.changed_paths() == []
            assert summary.baseline.commit == start
            assert summary.best.commit == kept and summary.best.tokens_per_sec > 2 * summary.baseline.tokens_per_sec

            # The baseline, then the improvement, which superseded it before any validator reported
            # (the work schedule, docs/rules.md section 3): validators get the improvement only.
            sent = rig.client.miner_submissions(rig.hotkey).submissions
            assert [item.commit_hash for item in reversed(sent)] == [start, kept]
            assert (sent[1].state, sent[1].superseded_by) == ("superseded", sent[0].submission_id)
            [work] = rig.validator_client.fetch_work().items
            assert work.commit_hash == kept and work.claimed_tokens_per_sec == pytest.approx(summary.best.claim)
            assert work.target_sequence_length == 128

            state = StateStore(rig.workspace.state_file).load(rig.hotkey)
            assert state.best.commit == kept and state.last_submission.measurement.commit == kept
            assert [a.outcome for a in state.attempts] == [KEPT, FAILED, REJECTED]
            best_report = json.loads((rig.workspace.reports / "best.json").read_text())
            assert "STANDIN-ENVIRONMENT" in best_report["log_tail"]  # the fork printed its environment...
            assert TOKEN not in best_report["log_tail"]  # ...and the token was not in it
        finally:
            rig.close()


@pytest.mark.slow
def test_tuning_picks_the_target_length_and_walks_the_tuning_file(tmp_path):
    source = tmp_path / "tunable"
    write_tuning_fork(source)
    with GitHubStandIn(tmp_path / "github", {TOKEN: "alice"}, fork_delay_polls=0) as github:
        github.add_repository(UPSTREAM, source)
        rig = Rig(tmp_path, github)
        try:
            config = LoopConfig(iterations=6, interval_s=0, min_improvement=0.02, candidate_lengths=(64, 128))
            summary = rig.miner_loop([TuningStrategy()], config).run_cycle()
            assert summary.target_seq_len == 128  # the fixed delay weighs less at the longer length
            assert rig.state.target_seq_len == 128
            described = [(a.description, a.outcome) for a in summary.attempts]
            assert described[0] == ("combine_block_v 16 -> 32", KEPT)
            assert described[1][0] == "combine_block_v 32 -> 64" and described[1][1] in (KEPT, SLOWER)
            assert len(described) == 2  # then nothing is left to try
            final = 64 if described[1][1] == KEPT else 32
            head = bare_head(rig.bare)
            pushed = json.loads(git(None, "--git-dir", str(rig.bare), "show", f"{head}:fla/ops/quasar/tuning.json"))
            assert pushed["combine_block_v"] == final
            assert rig.clone.changed_paths() == []
        finally:
            rig.close()


@pytest.mark.slow
def test_a_strategy_failing_unexpectedly_is_that_attempts_error_and_the_cycle_goes_on(tmp_path, caplog):
    """The fork ships a tuning_space.json nested deeper than the JSON parser recurses: the tuning
    strategy raised RecursionError, no StrategyError, which ended the cycle after its baseline (the
    agent was never asked, cycle after cycle). The failure is logged once with its traceback,
    recorded as that attempt's error, and the other strategies go on."""
    source = tmp_path / "upstream-source"
    write_slow_fork(source)
    (source / SPACE_FILE).write_text("[" * 100_000 + "]" * 100_000)
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "a tuning space too deep to parse")
    with GitHubStandIn(tmp_path / "github", {TOKEN: "alice"}, fork_delay_polls=0) as github:
        github.add_repository(UPSTREAM, source)
        rig = Rig(tmp_path, github)
        try:
            rig.clone.sync()
            fast = fast_chunk_source((rig.clone.path / CHUNK_FILE).read_text())
            with ChatStandIn([file_reply("drop the sleep", {CHUNK_FILE: fast})]) as chat:
                config = LoopConfig(iterations=3, interval_s=0, min_improvement=0.02, target_seq_len=128)
                summary = rig.miner_loop([TuningStrategy(), AgentStrategy(chat.url, "coder")], config).run_cycle()
            outcomes = [(a.strategy, a.outcome) for a in summary.attempts]
            # The tuning strategy sits the cycle out; the agent's second answer is the stand-in's 500.
            assert outcomes == [("tuning", ERROR), ("agent", KEPT), ("agent", ERROR)]
            assert summary.attempts[0].reason.startswith("RecursionError: ")
            assert [a.outcome for a in rig.state.attempts] == [ERROR, KEPT, ERROR]
            assert bare_head(rig.bare) == summary.attempts[1].commit  # kept and submitted
            failures = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
            assert len(failures) == 1 and "tuning" in failures[0].getMessage()
            assert rig.clone.changed_paths() == []
        finally:
            rig.close()


def test_waiting_between_cycles_reveals_a_commitment_when_it_is_due(tmp_path):
    with github_with_upstream(tmp_path, {TOKEN: "alice"}, fork_delay_polls=0) as github:
        rig = Rig(tmp_path, github)
        try:
            head = rig.clone.sync()
            submitter = Submitter(
                rig.client, rig.chain, rig.state, rig.store, COMMIT_REVEAL, rig.fork_url, publish=rig.clone.push
            )
            miner = Miner(
                rig.clone,
                [TuningStrategy()],
                Evaluator(FAST),
                submitter,
                rig.state,
                rig.store,
                LoopConfig(iterations=0, interval_s=0, min_improvement=0.02),
            )
            assert submitter.submit_if_better(Measurement(head, 128, 5000.0, 4500.0))
            stop = threading.Event()
            miner.wait(stop, 0.05)
            assert rig.state.pending_reveal is not None  # not due yet
            rig.chain.advance(100)
            miner.wait(stop, 0.05)
            assert rig.state.pending_reveal is None
            [item] = rig.validator_client.fetch_work().items
            assert (item.commit_hash, item.claimed_tokens_per_sec) == (head, 4500.0)
        finally:
            rig.close()


def test_an_api_answering_200_with_html_does_not_stop_the_miner_between_cycles(tmp_path, caplog):
    """A proxy in front of the API serves its maintenance page with status 200: reading the miner's
    verdicts gets HTML, not JSON. The wait between cycles logs it and goes on (it used to end the
    miner with a JSONDecodeError, pm2 restarting it into the same page)."""
    caplog.set_level(logging.DEBUG, logger="quasar.miner")
    wallets = tmp_path / "wallets"
    miner, api = make_wallet(wallets, "miner"), make_wallet(wallets, "api")
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=SLOW_BLOCKS)
    chain.register_wallet(miner)
    hotkey = miner.hotkey.ss58_address
    page = HTMLResponse("<html><title>Down for maintenance</title></html>")
    with (
        serving(Starlette(routes=[Route("/{path:path}", lambda request: page)])) as port,
        ApiClient(f"http://127.0.0.1:{port}", miner, api_hotkey=api.hotkey.ss58_address) as client,
    ):
        store = StateStore(tmp_path / "state.json")
        state = store.load(hotkey)
        git_runner = Git(write_askpass(tmp_path / "askpass"), "alice", TOKEN, "Alice", "alice@example.invalid")
        miner_loop = Miner(
            ForkClone(tmp_path / "fork", git_runner, "file:///forks/alice", "main"),
            [TuningStrategy()],
            Evaluator(FAST),
            Submitter(client, chain, state, store, DIRECT, "file:///forks/alice", publish=lambda commit: None),
            state,
            store,
            LoopConfig(iterations=0, interval_s=0, min_improvement=0.02),
            verdicts=VerdictWatcher(client, hotkey),
        )
        miner_loop.wait(threading.Event(), 0.05)
    assert f"GET http://127.0.0.1:{port}/miners/{hotkey}/submissions answered 200 with a body that is not JSON" in (
        caplog.text
    )


def test_the_gain_needed_grows_with_the_benchmarks_spread():
    assert required_gain(0.02, 0.002, 0.003) == 0.02
    assert required_gain(0.02, 0.05, 0.03) == pytest.approx(0.08)
    assert required_gain(0.0, None, None) == 0.0


@dataclasses.dataclass
class NeuronNetwork:
    """What a miner neuron process runs against (:func:`neuron_network`)."""

    github: GitHubStandIn
    wallets: Path
    miners: dict[str, bt.Wallet]
    chain: DevChain
    api: ApiServer
    env: dict[str, str]


@contextmanager
def neuron_network(
    tmp_path: Path, miners: tuple[str, ...] = ("miner",), fork_delay_polls: int = 1
) -> Iterator[NeuronNetwork]:
    """A GitHub stand-in holding the upstream fork, a dev chain with a wallet of each of ``miners``
    registered, the submission API on it, and the environment of a miner neuron process using them."""
    with github_with_upstream(
        tmp_path, {TOKEN: "alice"}, fork_delay_polls=fork_delay_polls, slow_delay_s=0.0
    ) as github:
        wallets = tmp_path / "wallets"
        api_hotkey = make_wallet(wallets, "api").hotkey.ss58_address
        registered = {name: make_wallet(wallets, name) for name in miners}
        chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=SLOW_BLOCKS)
        for wallet in registered.values():
            chain.register_wallet(wallet)
        config = api_config(api_hotkey, allow_local_forks=True)
        with ApiServer(config, chain, f"sqlite:///{tmp_path}/api.sqlite3") as api:
            env = neuron_environment(tmp_path, github, api, api_hotkey)
            yield NeuronNetwork(github, wallets, registered, chain, api, env)


def neuron_environment(tmp_path: Path, github: GitHubStandIn, api: ApiServer, api_hotkey: str) -> dict[str, str]:
    keep = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ}
    return {
        **keep,
        "GITHUB_TOKEN": TOKEN,
        "GITHUB_USERNAME": "alice",
        "GITHUB_API_URL": github.api_url,
        "GIT_REMOTE_BASE": github.file_base,
        "WORKSPACE_ROOT": str(tmp_path / "workspaces"),
        "VALIDATOR_API_URL": api.url,
        "API_HOTKEY": api_hotkey,
        "DEVCHAIN_PATH": str(tmp_path / "devchain.sqlite3"),
        "DEVICE": "cpu",
        "TARGET_SEQUENCE_LENGTH": "128",
        "AGENT_ITERATIONS": "0",
        "OPTIMIZATION_INTERVAL": "600",
        "MINER_INFERENCE_PORT": "18001",
        "AXON_EXTERNAL_IP": "203.0.113.7",
        "AXON_EXTERNAL_PORT": "28001",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "EVAL_SEQ_LENS": "",
        "EVAL_TIMED_SECONDS": "0.2",
    }


@pytest.mark.slow
def test_the_neuron_forks_submits_publishes_and_stops_cleanly(tmp_path):
    """Behind NAT: the inference server listens on 18001 here, the router forwards 203.0.113.7:28001
    to it, and the miner publishes that address and port (AXON_EXTERNAL_IP, AXON_EXTERNAL_PORT)."""
    with neuron_network(tmp_path) as network:
        command = [
            sys.executable,
            "-m",
            "neurons.miner",
            "--wallet.name",
            "miner",
            "--wallet.hotkey",
            "default",
            "--wallet.path",
            str(network.wallets),
            "--subtensor.network",
            "devchain",
            "--netuid",
            "24",
            "--claim-share",
            "0.5",
        ]
        process = subprocess.Popen(
            command, cwd=tmp_path, env=network.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        hotkey = network.miners["miner"].hotkey.ss58_address
        try:
            with ApiClient(network.api.url) as reader:
                deadline = time.monotonic() + 150
                while reader.stats(hotkey).hotkey_submissions == 0:
                    assert process.poll() is None, process.communicate()[0]
                    assert time.monotonic() < deadline, "the miner made no submission"
                    time.sleep(0.5)
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 0, output
        assert TOKEN not in output
        assert "published the inference endpoint 203.0.113.7:28001" in output
        assert f"submission API: {network.api.url} (from VALIDATOR_API_URL)" in output
        neuron = network.chain.neuron(hotkey)
        assert (neuron.endpoint.host, neuron.endpoint.port) == ("203.0.113.7", 28001)
        assert network.github.bare("alice/flash-linear-attention").is_dir()  # forked through the stand-in
        workspace = Workspace(tmp_path / "workspaces", hotkey)
        workspace.acquire()  # the stopped miner released its lock
        workspace.release()
        state = StateStore(workspace.state_file).load(hotkey)
        assert state.last_submission.measurement.commit == bare_head(network.github.bare(UPSTREAM))
        latest = (workspace.reports / "latest.json").read_text()
        assert "STANDIN-ENVIRONMENT" in latest and TOKEN not in latest
        recommended = json.loads(latest)["recommended_claim"]
        assert state.last_submission.measurement.claim == pytest.approx(0.5 * recommended)


def test_a_second_hotkeys_miner_on_the_same_fork_is_refused_at_start(tmp_path):
    """Two miners (two hotkeys) of one checkout share the .env's GITHUB_USERNAME, so one fork and one
    branch: each kept candidates in its own clone, the second one's pushes were refused ('the fork's
    branch has commits this workspace lacks') and its workspace diverged for good. The second one
    now stops at start, naming the first one's hotkey; the first runs on."""
    with neuron_network(tmp_path, miners=("first", "second")) as network:
        first_hotkey = network.miners["first"].hotkey.ss58_address

        def miner(name: str, output) -> subprocess.Popen:
            flags = ["--wallet.name", name, "--wallet.path", str(network.wallets), "--netuid", "24"]
            command = [sys.executable, "-m", "neurons.miner", *flags, "--subtensor.network", "devchain"]
            return subprocess.Popen(command, cwd=tmp_path, env=network.env, stdout=output, stderr=subprocess.STDOUT)

        log = tmp_path / "first.log"
        with log.open("w") as output:
            running = miner("first", output)
        try:
            state = Workspace(tmp_path / "workspaces", first_hotkey).state_file
            deadline = time.monotonic() + 60
            while not (state.is_file() and json.loads(state.read_text())["fork_url"]):
                assert running.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the first miner did not start"
                time.sleep(0.2)
            refused = miner("second", subprocess.PIPE)
            try:
                output = refused.communicate(timeout=60)[0].decode()
            finally:
                if refused.poll() is None:
                    refused.kill()
                    refused.wait()
            assert refused.returncode == 1, output
            assert f"the miner of hotkey {first_hotkey} is running on the fork" in output
            assert "its own GitHub account" in output
            assert running.poll() is None, log.read_text()
        finally:
            running.send_signal(signal.SIGTERM)
            running.wait(timeout=60)


def endpoint_of(**environ: str) -> tuple[str, int]:
    return published_endpoint(resolve({}, environ=environ, dotenv_path=None))


def test_the_published_endpoint_is_the_external_one_and_public_on_finney(monkeypatch):
    # Public addresses (finney is the default network).
    assert endpoint_of(AXON_EXTERNAL_IP="45.33.10.7", AXON_EXTERNAL_PORT="28001") == ("45.33.10.7", 28001)
    assert endpoint_of(AXON_EXTERNAL_IP="2606:4700::7", MINER_INFERENCE_PORT="8002") == ("2606:4700::7", 8002)
    for address, kind in (
        ("192.168.1.20", "not a public address"),
        ("10.0.0.5", "not a public address"),
        ("100.64.0.9", "not a public address"),
        ("203.0.113.7", "not a public address"),
        ("127.0.0.1", "a loopback address"),
    ):
        for network in ("finney", "test"):
            with pytest.raises(MinerSetupError) as refused:
                endpoint_of(SUBTENSOR_NETWORK=network, AXON_EXTERNAL_IP=address)
            assert str(refused.value).startswith(f"AXON_EXTERNAL_IP {address} is {kind}: validators on {network}")
            assert "Set AXON_EXTERNAL_IP to this machine's public IP address" in str(refused.value)
            assert "MINER_INFERENCE_PORT (8001) and set AXON_EXTERNAL_PORT" in str(refused.value)
    # A private network of one's own (a local subtensor node, the dev chain) may use private addresses.
    assert endpoint_of(SUBTENSOR_NETWORK="local", AXON_EXTERNAL_IP="192.168.1.20") == ("192.168.1.20", 8001)
    # Found rather than configured: the machine's outward address behind NAT is private, and refused.
    monkeypatch.setattr("quasar.miner.runner.outward_address", lambda: "192.168.1.20")
    with pytest.raises(MinerSetupError, match="this machine's outward address 192.168.1.20 is not a public address"):
        endpoint_of(SUBTENSOR_NETWORK="finney")
    monkeypatch.setattr("quasar.miner.runner.outward_address", lambda: "45.33.10.23")
    assert endpoint_of(SUBTENSOR_NETWORK="finney") == ("45.33.10.23", 8001)


def test_a_hotkey_pruned_and_registered_again_gets_its_endpoint_back_at_the_next_cycle(tmp_path, caplog):
    """The miner's hook before each cycle compares the endpoint on chain with its own: pruned and
    registered again while it runs, its new uid has none, and the next cycle publishes it again
    (validators skip a miner without one in the logit check). Cycles that change nothing log nothing."""
    caplog.set_level(logging.INFO, logger="quasar.miner.runner")
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=SLOW_BLOCKS)
    wallets = tmp_path / "wallets"
    owner, miner = make_wallet(wallets, "owner"), make_wallet(wallets, "miner")
    chain.register_wallet(owner)
    hotkey = miner.hotkey.ss58_address
    wanted = Endpoint("203.0.113.7", 28001)
    keep_endpoint = EndpointKeeper(chain, miner, (wanted.host, wanted.port))
    uid = chain.register_wallet(miner)
    keep_endpoint()
    assert chain.neuron(hotkey).endpoint == wanted
    keep_endpoint()
    assert [record.getMessage() for record in caplog.records] == [
        f"published the inference endpoint 203.0.113.7:28001 for uid {uid} on subnet 24"
    ]
    caplog.clear()
    chain.deregister(hotkey)
    keep_endpoint()
    keep_endpoint()
    assert [record.getMessage() for record in caplog.records] == [
        f"hotkey {hotkey} is not registered on subnet 24: its inference endpoint is published once it is"
    ]
    caplog.clear()
    chain.register_wallet(make_wallet(wallets, "other"))  # takes the freed uid
    uid = chain.register_wallet(miner)
    assert chain.neuron(hotkey).endpoint is None
    keep_endpoint()
    assert chain.neuron(hotkey).endpoint == wanted
    keep_endpoint()
    assert [record.getMessage() for record in caplog.records] == [
        f"published the inference endpoint 203.0.113.7:28001 for uid {uid} on subnet 24"
    ]


def test_the_neuron_explains_what_is_missing(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DEVICE": "cpu", "TARGET_SEQUENCE_LENGTH": "128"}
    # The miner guide's spelling: python neurons/miner.py
    result = run_python([str(ROOT / "neurons" / "miner.py"), "--netuid", "24"], tmp_path, 120, env)
    assert result.returncode == 1
    assert "GITHUB_TOKEN is not set" in result.stderr
    env.update(GITHUB_TOKEN=TOKEN, GITHUB_USERNAME="alice", WALLET_PATH=str(tmp_path / "nowhere"))
    result = run_python(["-m", "neurons.miner"], tmp_path, 120, env)
    assert result.returncode == 1
    assert "quasar_miner/hotkeys/default does not exist" in result.stderr
    assert TOKEN not in result.stderr


# --- START_MINER.sh ---


@pytest.fixture
def script_dir(tmp_path) -> Path:
    """A copy of START_MINER.sh and the checks it sources beside this checkout's .venv."""
    return start_script_copy(tmp_path / "suite", "START_MINER.sh")


def run_script(directory: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run_start_script(directory, "START_MINER.sh", env, *args)


def test_start_script_messages_fit_80_columns_with_each_path_and_word_whole(script_dir):
    """The refusals were one line of up to 280 columns: an 80-column terminal split the wallet's
    path and the btcli command to copy mid-word ("coldkeypub.tx" / "t", "--walle" / "t-hotkey")."""
    (script_dir / ".env").write_text(f"GITHUB_TOKEN={TOKEN}\nGITHUB_USERNAME=alice\nDEVICE=cpu\n")
    result = run_script(script_dir, {}, "--wallet.path", "no-wallets-here", "--wallet.name", "nobody")
    wallet = "no-wallets-here/nobody/coldkeypub.txt"
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and all(len(line) <= 80 for line in lines), result.stderr
    for word in (wallet, "--wallet-hotkey"):
        assert any(word in line.split() for line in lines), result.stderr
    for environment in ({}, {"GITHUB_TOKEN": TOKEN}):
        (script_dir / ".env").unlink(missing_ok=True)
        result = run_script(script_dir, environment)
        assert result.returncode == 1 and all(len(line) <= 80 for line in result.stderr.splitlines()), result.stderr


def test_start_script_names_each_missing_prerequisite(script_dir, tmp_path):
    result = run_script(script_dir, {})
    assert result.returncode == 1 and "GITHUB_TOKEN is not set" in result.stderr
    (script_dir / ".env").write_text(f'GITHUB_TOKEN="{TOKEN}"\n')
    result = run_script(script_dir, {})
    assert result.returncode == 1 and "GITHUB_USERNAME is not set" in result.stderr
    (script_dir / ".env").write_text(f'GITHUB_TOKEN="{TOKEN}"\nGITHUB_USERNAME=alice\nDEVICE=cpu\n')
    result = run_script(script_dir, {})
    wallets = script_dir / ".bittensor" / "wallets"  # the default WALLET_PATH under this HOME
    assert result.returncode == 1 and (
        f"wallet file {wallets}/quasar_miner/coldkeypub.txt does not exist: create the "
        "wallet (btcli wallet create --wallet quasar_miner --wallet-hotkey default)" in said(result)
    )
    result = run_script(script_dir, {}, "--wallet.path", str(tmp_path / "w"), "--wallet.name", "m")
    assert "(btcli wallet create --wallet m --wallet-hotkey default --wallet-path " + str(tmp_path / "w") in said(
        result
    )
    make_wallet(wallets, "quasar_miner")
    result = run_script(script_dir, {"VALIDATOR_API_URL": "http://127.0.0.1:9"})
    assert result.returncode == 1
    assert "the submission API at http://127.0.0.1:9 does not answer GET /health" in said(result)
    result = run_script(script_dir, {}, "--api.url", "http://127.0.0.1:9")
    assert "the submission API at http://127.0.0.1:9" in said(result)  # a flag is checked too
    os.unlink(script_dir / ".venv")
    result = run_script(script_dir, {})
    assert result.returncode == 1 and "no .venv here" in result.stderr


def test_start_script_checks_cuda_unless_the_device_is_cpu(script_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the message is for machines without it")
    (script_dir / ".env").write_text(f"GITHUB_TOKEN={TOKEN}\nGITHUB_USERNAME=alice\n")
    make_wallet(script_dir / ".bittensor" / "wallets", "quasar_miner")
    result = run_script(script_dir, {})
    assert result.returncode == 1 and "DEVICE=cuda but PyTorch sees no CUDA GPU" in said(result)


def test_start_script_runs_the_miner_when_all_is_ready(script_dir, tmp_path):
    """The checks pass and the script starts the miner: here a stand-in neurons/miner.py that reads
    its settings as the miner does and prints its device and API URL (--help skips the checks)."""
    neuron_stand_in(
        script_dir, "miner", "'device:', settings.device, 'api:', settings.validator_api_url or 'from the chain'"
    )
    wallets = tmp_path / "wallets"
    api_wallet = make_wallet(wallets, "api")
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=SLOW_BLOCKS)
    with ApiServer(api_config(api_wallet.hotkey.ss58_address), chain, f"sqlite:///{tmp_path}/api.sqlite3") as api:
        # .env says cuda (unavailable here) but the environment says cpu: the environment must win.
        (script_dir / ".env").write_text(
            f"GITHUB_TOKEN={TOKEN}\nGITHUB_USERNAME=alice\nDEVICE=cuda\n"
            f"VALIDATOR_API_URL={api.url}\nWALLET_PATH={wallets}\nWALLET_NAME=api\n"
        )
        result = run_script(script_dir, {"DEVICE": "cpu"})
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"device: cpu api: {api.url}\n"
    # Without VALIDATOR_API_URL the script leaves finding the API to the miner, which reads the chain.
    (script_dir / ".env").write_text(
        f"GITHUB_TOKEN={TOKEN}\nGITHUB_USERNAME=alice\nWALLET_PATH={wallets}\nWALLET_NAME=api\n"
    )
    result = run_script(script_dir, {"DEVICE": "cpu"})
    assert result.returncode == 0 and "the miner reads the submission API's URL from the chain" in said(result)
    assert result.stdout == "device: cpu api: from the chain\n"


# The exception dropped in the finaliser is what the test stages.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_signal_landing_in_a_finaliser_still_stops_the_miner():
    """pm2's SIGTERM raised KeyboardInterrupt alone; landing while Python ran a finaliser (a weakref
    callback of the garbage collector), it was dropped ("Exception ignored in ..."), and the miner
    went on to wait for its next cycle until pm2 killed it. The stop flag outlives the exception."""
    stop = threading.Event()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    stop_on_signals(stop)
    try:
        signal_in_a_finaliser()
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt, match="signal 2"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
