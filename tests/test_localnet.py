"""The local network (``python -m quasar.localnet``, what ./START_LOCALNET.sh runs), on CPU.

End to end, as a process on 127.0.0.1 in a temporary folder: the two miner neurons fork through
the GitHub stand-in, evaluate and submit; one round gives the honest miner its place's weight and
the hostile one none, with the rest burned to the subnet owner; Ctrl-C and a child that cannot
start both leave no process behind. Plus the pieces: the data folder's rules, the children's
environment, the options, the forks, the summary.

A validator killed mid-evaluation and restarted, finishing the round without re-evaluating what it
finished, is tested with the real neuron process in tests/test_validator.py
(test_killed_mid_evaluation_the_validator_resumes_without_redoing_finished_work).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
from rich.console import Console

from quasar import config
from quasar.chain.devchain import FINNEY, DevChain
from quasar.evaluate import EvaluationReport
from quasar.imports import validate_repo
from quasar.localnet.cli import Display, running_text, seq_lens
from quasar.localnet.forks import (
    HONEST,
    HOSTILE,
    HOSTILE_ENTRY_POINTS,
    HOSTILE_EXACT_UP_TO,
    HOSTILE_KERNEL_FILE,
    write_forks,
)
from quasar.localnet.host import (
    child_environment,
    data_dir_lock,
    distinct_free_ports,
    make_wallet,
    read_weights_block,
    reset_data_dir,
)
from quasar.localnet.network import LocalNetwork
from quasar.localnet.options import (
    CPU_TARGET,
    MARKER,
    MINERS,
    NETUID,
    UPSTREAM,
    VALIDATOR,
    LocalnetError,
    default_options,
    evaluated_lengths,
)
from quasar.localnet.summary import (
    FAIL,
    NOT_REPORTED,
    PASS,
    LeaderboardRow,
    MinerOutcome,
    RoundSummary,
    render_summary,
    verdict_of,
)
from quasar.miner.github import GitHubClient
from quasar.miner.workspace import Workspace
from quasar.signals import stop_on_signals
from quasar.validator.state import ValidatorState
from quasar.validator.state_files import SCHEMA_VERSION, read_meta
from quasar.validator.weight_setting import LAST_WEIGHTS_BLOCK
from tests.gitrepo import head
from tests.processes import REPO_ROOT, proc_files, run_python, script_results, signal_in_a_finaliser

# The whole round on CPU takes about two minutes on two loaded cores, and finney's hyperparameters
# (0.2 s blocks) add up to two tempos (144 s) for the weights' rate limit and reveal; the limit leaves room.
ROUND_LIMIT_S = 480
FAST = ["--device", "cpu", "--stand-in-model", "--seq-lens", "128"]


def localnet_command(data_dir: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "quasar.localnet", "--data-dir", str(data_dir), *flags]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that mention ``text`` (the network's data folder)."""
    found = []
    for pid, raw in proc_files("cmdline"):
        cmdline = raw.replace(b"\0", b" ").decode(errors="replace")
        if pid != os.getpid() and text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def outermost(processes: list[str]) -> list[str]:
    """Those of ``processes`` (as :func:`processes_mentioning` gives them) whose parent is not one of
    them: a child a process forks shows its parent's command line until it execs (a miner starting
    its sandbox, for one), and is not a second copy of it."""
    pids = {line.split(":", 1)[0] for line in processes}

    def parent(pid: str) -> str:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return ""
        return re.search(r"^PPid:\s*(\d+)", status, re.M)[1]

    return [line for line in processes if parent(line.split(":", 1)[0]) not in pids]


def wait_gone(text: str, timeout_s: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


# --- end to end ---


@pytest.mark.slow
def test_one_round_weights_the_honest_miner_and_not_the_hostile_one(tmp_path):
    """Under finney's hyperparameters: commit-reveal, weights and serving rate limits, permits."""
    data_dir = tmp_path / "net"
    result = subprocess.run(
        localnet_command(
            data_dir, "--once", "--json", "--device", "cpu", "--stand-in-model", "--hyperparameters", "finney"
        ),
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=ROUND_LIMIT_S,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    summary = json.loads(result.stdout)
    miners = {miner["kind"]: miner for miner in summary["miners"]}
    honest, hostile = miners[HONEST], miners[HOSTILE]
    assert (honest["verdict"], hostile["verdict"]) == (PASS, FAIL), json.dumps(summary, indent=2)
    # Refused for its output beyond the length its miner checked (it passes the import rules, and
    # its miner's own evaluation at its target passed, or it would not have submitted).
    assert hostile["target_sequence_length"] == HOSTILE_EXACT_UP_TO
    assert any("differs from the reference" in reason for reason in hostile["reasons"]), hostile["reasons"]
    assert honest["target_sequence_length"] == CPU_TARGET

    # The miner neurons submitted their forks' heads from the GitHub stand-in's repositories: the
    # honest miner's fork was created through the fork endpoint, the hostile one's was there.
    repo_name = UPSTREAM.split("/")[1]
    for kind, miner in miners.items():
        bare = data_dir.resolve() / "github" / MINERS[kind] / f"{repo_name}.git"
        assert miner["fork_url"] == bare.as_uri()
        assert miner["commit"] == head(bare) == head(data_dir / "forks" / kind)
        assert (data_dir / "logs" / f"{MINERS[kind]}.log").read_text().count("submitted ") == 1
    assert summary["seq_lens"] == [64, 128]

    weights = summary["weights"]
    owner = str(summary["owner_uid"])
    assert weights[str(honest["uid"])] == pytest.approx(0.60)
    assert weights.get(str(hostile["uid"]), 0.0) == 0.0
    assert weights[owner] == pytest.approx(0.40)  # places 2-4 are unfilled: burned to the owner
    assert sum(weights.values()) == pytest.approx(1.0)
    assert (honest["weight"], hostile["weight"]) == (pytest.approx(0.60), 0.0)
    # The weights are the ones on chain, committed by the validator's hotkey and revealed by the chain,
    # under finney's rules; the API was found on chain, where the owner published it.
    chain = DevChain(data_dir / "devchain.sqlite3")
    assert chain.hyperparameters() == FINNEY
    on_chain = chain.weights()[summary["validator_uid"]]
    assert {str(uid): pytest.approx(weight) for uid, weight in on_chain.items()} == weights
    assert chain.api_location().url == summary["api_url"]
    validator_log = (data_dir / "logs" / "validator.log").read_text()
    assert f"submission API: {summary['api_url']} (from subnet 24's identity on devchain)" in validator_log
    assert "weights committed (the chain applies them when it reveals them)" in validator_log
    assert [(row["place"], row["uid"], row["share"]) for row in summary["leaderboard"]] == [
        (1, honest["uid"], pytest.approx(0.60))
    ]
    assert honest["measured_tokens_per_sec"] >= 0.9 * honest["claimed_tokens_per_sec"] > 0

    assert json.loads((data_dir / "summary.json").read_text()) == summary
    assert "No CUDA device: the validator evaluates on CPU at small lengths" in result.stderr
    assert "the validator fetches, evaluates" in result.stderr
    assert f"dashboard {summary['api_url']}/" in result.stderr
    assert not wait_gone(str(data_dir)), "a child of the local network outlived it"


@pytest.mark.slow
def test_ctrl_c_stops_the_network_and_every_child(tmp_path):
    data_dir = tmp_path / "net"
    log = tmp_path / "stderr.log"
    with open(log, "w") as err:
        process = subprocess.Popen(
            localnet_command(data_dir, *FAST), cwd=tmp_path, env=environment(), stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        deadline = time.monotonic() + 150
        # Both miners evaluate in their sandboxes (each is past its start-up, where it handles signals).
        while not all(f"{name}: evaluating its fork" in log.read_text() for name in MINERS.values()):
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        assert processes_mentioning(str(data_dir / "validator"))
        miners = [p for p in processes_mentioning(str(data_dir / "miners")) if "neurons.miner" in p]
        assert len(outermost(miners)) == 2, miners
        process.send_signal(signal.SIGINT)
        status = process.wait(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert status == 0, log.read_text()[-4000:]
    assert "stopping the validator" in log.read_text()
    assert not wait_gone(str(data_dir)), "a child of the local network outlived it"
    for name in MINERS.values():  # each miner stopped cleanly, its evaluation abandoned
        assert "miner stopped" in (data_dir / "logs" / f"{name}.log").read_text()


def test_a_child_that_cannot_start_is_named_with_its_log(tmp_path):
    data_dir = tmp_path / "net"
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    result = subprocess.run(
        localnet_command(data_dir, "--once", "--reference-model", str(not_a_model), *FAST),
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    # The validator or an inference server, whichever finds out first, is named with its log.
    assert re.search(
        r"(validator|inference server) exited with status 1; its log is "
        + re.escape(str(data_dir.resolve() / "logs"))
        + r"/\S+\.log",
        result.stderr,
    ), result.stderr
    assert "has no config.json" in result.stderr  # the end of its log comes with the message
    assert not wait_gone(str(data_dir)), "a child of the local network outlived it"


# --- the miners ---


class Steps:
    """Progress as a list of lines."""

    def __init__(self):
        self.lines: list[str] = []

    def step(self, text: str) -> None:
        self.lines.append(text)

    def detail(self, text: str) -> None:
        self.lines.append(text)


def test_a_miner_is_followed_through_its_workspace_and_its_failed_evaluation_is_an_error(tmp_path):
    network = LocalNetwork(default_options(tmp_path / "net", "cpu"), Steps())
    name = MINERS[HONEST]
    network.wallets[name] = make_wallet(network.wallet_dir, name)
    workspace = Workspace(network.miners_dir, network.hotkey(name))
    assert network._miner_stage(name) == "forking and cloning"
    workspace.fork.mkdir(parents=True)
    assert network._miner_stage(name) == "evaluating its fork"
    report = EvaluationReport(
        verdict="fail",
        reasons=["T=128: the output differs from the reference"],
        repo=str(workspace.fork),
        target_seq_len=128,
        seq_lens=[64, 128],
        device="cpu",
        device_name="",
        import_check=None,
        lengths={},
    )
    workspace.reports.mkdir()
    (workspace.reports / "latest.json").write_text(report.to_json())
    with pytest.raises(LocalnetError) as error:
        network._miner_stage(name)
    assert str(error.value) == (
        f"{name}'s fork failed its own evaluation on cpu, so it does not submit: T=128: the "
        f"output differs from the reference (its log: {network.logs_dir / name}.log)"
    )
    report.verdict, report.reasons = "pass", []
    (workspace.reports / "latest.json").write_text(report.to_json())
    assert network._miner_stage(name) == "evaluated, submitting"


def test_each_miner_runs_the_miner_neuron_against_the_stand_ins(tmp_path):
    network = LocalNetwork(default_options(tmp_path / "net", "cpu"), Steps())
    network.api_url = "http://127.0.0.1:1"
    for name in ("api", *MINERS.values()):
        network.wallets[name] = make_wallet(network.wallet_dir, name)
    network._start_github()
    try:
        commands = {kind: network._miner_command(kind, name, 4000) for kind, name in MINERS.items()}
        for kind, command in commands.items():
            flags = dict(zip(command[3::2], command[4::2]))
            assert command[1:3] == ["-m", "neurons.miner"] and flags["--agent-iterations"] == "0"
            assert flags["--wallet.name"] == MINERS[kind] and flags["--workspace.root"] == str(network.miners_dir)
        honest = dict(zip(commands[HONEST][3::2], commands[HONEST][4::2]))
        hostile = dict(zip(commands[HOSTILE][3::2], commands[HOSTILE][4::2]))
        # The honest miner checks what the validator will; the hostile one only its own target.
        assert (honest["--target-sequence-length"], honest["--eval.seq-lens"]) == ("128", "64,128")
        assert (hostile["--target-sequence-length"], hostile["--eval.seq-lens"]) == (str(HOSTILE_EXACT_UP_TO), "")
        environments = {name: network._miner_environment(name) for name in MINERS.values()}
        tokens = {env["GITHUB_TOKEN"] for env in environments.values()}
        assert len(tokens) == 2 and not any(token in " ".join(c) for c in commands.values() for token in tokens)
        for name, env in environments.items():
            assert env["GITHUB_USERNAME"] == name and env["GIT_REMOTE_BASE"] == network.github.file_base
            client = GitHubClient(env["GITHUB_API_URL"], env["GITHUB_TOKEN"])
            fork = client.ensure_fork(name, env["UPSTREAM_REPO"])
            client.close()
            assert fork.created == (name == MINERS[HONEST])  # the hostile miner's fork is already there
            assert (
                head(network.github.bare(fork.repository.full_name))
                == network.forks[HONEST if name == MINERS[HONEST] else HOSTILE].commit
            )
    finally:
        network.github.stop()


# --- the data folder, ports, environment ---


class StillWatching(Exception):
    """The network went on watching long after it was asked to stop."""


class SignalledChain(DevChain):
    """A dev chain whose first read of the weights drops an object whose finaliser sends SIGTERM to
    this process (the handler runs inside the finaliser); its 20th read raises StillWatching."""

    reads = 0

    def weights(self):
        self.reads += 1
        if self.reads == 1:
            signal_in_a_finaliser()
        if self.reads >= 20:
            raise StillWatching
        return super().weights()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_signal_landing_in_a_finaliser_still_stops_the_network(tmp_path):
    """SIGTERM raised KeyboardInterrupt alone; landing while Python ran a finaliser (a weakref
    callback of the garbage collector), it was dropped ("Exception ignored in ..."), and the
    network went on watching (or waiting for its round) until it was killed, its children left
    running. The stop flag outlives the exception, and the network's waits end on it."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        network = LocalNetwork(default_options(tmp_path / "net", "cpu"), Steps(), stop)
        network._chain = SignalledChain(tmp_path / "devchain.sqlite3", netuid=NETUID, block_time_s=1e6)
        network.wallets[VALIDATOR] = make_wallet(network.wallet_dir, VALIDATOR)
        network.uids[VALIDATOR] = 1
        for name in MINERS.values():
            network.wallets[name] = make_wallet(network.wallet_dir, name)
        network._database().upgrade()  # the API's empty database: no miner has submitted
        with pytest.raises(KeyboardInterrupt, match="stop requested"):
            network.watch(lambda summary: None, poll_s=0.05)
        assert network.chain.reads == 1
        with pytest.raises(KeyboardInterrupt, match="stop requested"):  # the round's waits too
            network._wait_for_submissions([])
        network.stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_the_data_folder_is_emptied_only_when_the_local_network_made_it(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(LocalnetError, match="not empty and was not made by the local network"):
        reset_data_dir(foreign)
    assert (foreign / "precious.txt").read_text() == "keep me"
    # The command refuses it as it is: no lock file (nor anything else) left in someone's folder.
    refused = subprocess.run(
        localnet_command(foreign, *FAST), env=environment(), capture_output=True, text=True, timeout=120
    )
    assert refused.returncode != 0 and "was not made by the local network" in refused.stderr, refused.stderr
    assert [entry.name for entry in foreign.iterdir()] == ["precious.txt"]

    ours = tmp_path / "ours"
    reset_data_dir(ours)
    (ours / "logs").mkdir()
    (ours / "logs" / "api.log").write_text("old run")
    reset_data_dir(ours)
    assert sorted(entry.name for entry in ours.iterdir()) == [".gitignore", MARKER]
    assert (ours / ".gitignore").read_text() == "*\n"


def test_two_networks_cannot_share_a_data_folder(tmp_path):
    with data_dir_lock(tmp_path):
        with pytest.raises(LocalnetError, match="another local network is running"):
            with data_dir_lock(tmp_path):
                pass
    with data_dir_lock(tmp_path):  # released with the first
        pass


def test_a_data_folder_whose_path_a_local_fork_may_not_use_is_refused_before_anything_starts(tmp_path):
    """A checkout at `~/GPU work/quasär suite` kept its data in `./localnet-data` there: the API
    refused each miner's submission (422: local fork path '/…/GPU%20work/quas%C3%A4r%20suite/…' may
    use only letters, digits and . _ / + @ , = -) and the round waited its 30 minutes on CPU."""
    data_dir = tmp_path / "GPU work" / "quas\u00e4r suite" / "localnet-data"
    refused = subprocess.run(
        localnet_command(data_dir, *FAST, "--once", "--round-timeout", "1"),
        env={**environment(), "LC_ALL": "C", "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1, refused.stderr
    assert "refuses in a local fork's path (' ', '\u00e4')" in refused.stderr, refused.stderr
    assert "pass --data-dir with a path of letters, digits and . _ / -" in refused.stderr, refused.stderr
    assert not data_dir.exists()


def test_children_get_no_quasar_setting_from_the_environment(monkeypatch):
    monkeypatch.setenv("SUBTENSOR_NETWORK", "finney")
    monkeypatch.setenv("NETUID", "1")
    monkeypatch.setenv("GITHUB_TOKEN", "secret")
    monkeypatch.setenv("SOMETHING_ELSE", "kept")
    env = child_environment(REPO_ROOT)
    assert not {"SUBTENSOR_NETWORK", "NETUID", "GITHUB_TOKEN"} & set(env)
    assert env["SOMETHING_ELSE"] == "kept"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT)
    assert env["HF_HUB_OFFLINE"] == "1"


def test_attack_a_checkouts_env_cannot_point_the_children_at_a_real_api(tmp_path):
    """The children run in the data folder, where no .env is; the settings' fallback to the
    checkout's .env read an operator's miner settings there, and the local validator and miners
    then used the real subnet's API beside the dev chain."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT / "quasar", checkout / "quasar", ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / ".env").write_text("VALIDATOR_API_URL=https://api.real-subnet.example\n")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    read = "from quasar import config; print(repr(config.resolve({}).validator_api_url))"
    env = child_environment(checkout)
    assert run_python(["-c", read], data_dir, 60, env).stdout.strip() == "''"
    # The same child told nothing about .env files reads the checkout's: what the line above stops.
    env.pop(config.DOTENV_VARIABLE)
    assert run_python(["-c", read], data_dir, 60, env).stdout.strip() == "'https://api.real-subnet.example'"


def test_the_weights_block_is_read_while_the_validator_holds_its_state(tmp_path):
    path = tmp_path / "validator" / "state.sqlite3"
    assert read_weights_block(path) is None  # no file yet
    with ValidatorState.open(path) as state:  # holds the lock, as the running validator does
        assert read_weights_block(path) is None  # no weights yet
        state.set_meta(LAST_WEIGHTS_BLOCK, "42")
        assert read_weights_block(path) == 42
        assert read_meta(path, "schema_version") == str(SCHEMA_VERSION)
        assert read_meta(path, "no such key") is None
        state.set_meta(LAST_WEIGHTS_BLOCK, "47")  # the reader left nothing open that blocks a write
    assert read_weights_block(path) == 47


def test_the_validator_must_run_a_length_that_shows_the_hostile_fork_wrong(tmp_path):
    options = default_options(tmp_path, "cpu")
    assert evaluated_lengths(options) == (64, 128)
    assert default_options(tmp_path, "cuda").seq_lens == (512, 1024, 2048)
    for lengths in ((), (64,)):
        with pytest.raises(LocalnetError, match=r"need one above 64 tokens: the hostile miner's kernel is exact"):
            default_options(tmp_path, "cpu", seq_lens=lengths)
    assert evaluated_lengths(default_options(tmp_path, "cpu", target=256, seq_lens=(128,))) == (64, 128, 256)


def test_ports_are_distinct():
    ports = distinct_free_ports(5)
    assert len(set(ports)) == 5 and all(1024 <= port <= 65535 for port in ports)


def test_seq_lens_flag():
    assert seq_lens("64, 128") == (64, 128)
    assert seq_lens("") == ()
    with pytest.raises(Exception, match="at least 64"):
        seq_lens("32")


# --- the forks ---


def test_the_hostile_fork_is_the_starter_fork_with_only_its_kernel_changed(tmp_path):
    forks = write_forks(tmp_path)
    honest, hostile = forks[HONEST], forks[HOSTILE]
    assert honest.path == tmp_path / HONEST
    parent = subprocess.run(
        ["git", "-C", str(hostile.path), "rev-parse", "HEAD^"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert parent == honest.commit  # the same starter commit below the patch
    changed = subprocess.run(
        ["git", "-C", str(hostile.path), "diff", "--name-only", "HEAD^", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert changed == [str(HOSTILE_KERNEL_FILE)]
    # Both pass the import rules: the hostile fork can only be caught by checking its output.
    assert validate_repo(honest.path).ok and validate_repo(hostile.path).ok


# Run in a child: the fork's ``fla`` is imported from argv[1], and TRITON_INTERPRET (when set) must
# be set before triton is imported. For each path the layer takes, the entry points of
# fla.ops.quasar.chunk it called and its error against the reference layer at each length.
LAYER_PATHS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    sys.path.insert(0, sys.argv[1])
    import fla.layers.quasar as layer_module
    from fla.layers.quasar import QuasarAttention
    from quasar.reference import QuasarAttentionReference, relative_error

    calls = []
    for name in ("chunk_quasar", "chunk_quasar_norm_gated"):
        def counted(*args, _inner=getattr(layer_module, name), _name=name, **kwargs):
            calls.append(_name)
            return _inner(*args, **kwargs)
        setattr(layer_module, name, counted)

    torch.manual_seed(0)
    layer = QuasarAttention(hidden_size=64, head_dim=16, num_heads=4)
    reference = QuasarAttentionReference(hidden_size=64, head_dim=16, num_heads=4)
    reference.load_state_dict(layer.state_dict())
    results = {}
    for length in (64, 128):
        x = torch.randn(1, length, 64)
        expected = reference(x)[0]
        with torch.inference_mode():
            kernels = layer._runs_in_kernels(x, None)
        paths = [("modules", torch.enable_grad)] + ([("kernels", torch.inference_mode)] if kernels else [])
        for path, mode in paths:
            calls.clear()
            with mode():
                output = layer(x)[0]
            results.setdefault(path, {})[str(length)] = {
                "error": relative_error(output.detach(), expected), "calls": sorted(set(calls))}
    print(json.dumps(results))
    """
)


def layer_paths(fork: Path, interpreted: bool) -> dict:
    return script_results(LAYER_PATHS_SCRIPT, [str(fork)], 280, TRITON_INTERPRET="1" if interpreted else "0")


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    return write_forks(tmp_path_factory.mktemp("forks"))


@pytest.mark.slow
@pytest.mark.parametrize("interpreted", [False, True], ids=["cpu-pytorch", "triton-interpreter"])
def test_the_hostile_fork_is_wrong_on_every_path_the_layer_takes(forks, interpreted):
    """On CPU the layer runs its modules (chunk_quasar). Where the Triton kernels run (CUDA; here
    Triton's interpreter on the CPU) it runs its fused no-gradient path (chunk_quasar_norm_gated),
    which a hostile fork overriding chunk_quasar alone would leave honest, and its modules with
    gradients. The hostile fork is exact at 64 tokens on each path and wrong at 128; the honest one
    right on each."""
    hostile, honest = layer_paths(forks[HOSTILE].path, interpreted), layer_paths(forks[HONEST].path, interpreted)
    expected_paths = {"modules": ["chunk_quasar"]}
    if interpreted:
        expected_paths["kernels"] = ["chunk_quasar_norm_gated"]
    assert {path: runs["128"]["calls"] for path, runs in hostile.items()} == expected_paths
    for path in expected_paths:
        assert hostile[path]["64"]["error"] < 1e-4, hostile
        assert hostile[path]["128"]["error"] > 0.1, hostile
        assert max(honest[path][length]["error"] for length in ("64", "128")) < 1e-4, honest
    if interpreted:  # between them, the two paths call every entry point the hostile fork replaces
        assert set().union(*(runs["128"]["calls"] for runs in hostile.values())) == set(HOSTILE_ENTRY_POINTS)


def test_the_local_network_on_sqlite_never_imports_psycopg2():
    code = (
        "import sys; from quasar.localnet.host import distinct_free_ports; distinct_free_ports(3); "
        "print('psycopg2' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=environment(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# --- the summary ---


def _summary() -> RoundSummary:
    def miner(name, kind, uid, verdict, weight, reasons=()):
        return MinerOutcome(
            name=name,
            kind=kind,
            uid=uid,
            hotkey=f"5{name}",
            submission_id=uid,
            fork_url="file:///f",
            commit="a" * 40,
            target_sequence_length=128,
            claimed_tokens_per_sec=10.0,
            verdict=verdict,
            measured_tokens_per_sec=None if verdict == NOT_REPORTED else 20.0,
            reasons=reasons,
            weight=weight,
        )

    return RoundSummary(
        weights={0: 0.4, 2: 0.6},
        miners=(
            miner("miner-honest", HONEST, 2, PASS, 0.6),
            miner("miner-hostile", HOSTILE, 3, FAIL, 0.0, ("wrong output",)),
        ),
        leaderboard=(LeaderboardRow(1, 2, "5miner-honest", "100k", 20.0, 5.0, 0.6),),
        round_id=0,
        owner_uid=0,
        validator_uid=1,
        weights_block=42,
        device="cpu",
        reference_model="/m",
        seq_lens=(64, 128),
        api_url="http://127.0.0.1:1",
        data_dir="/d",
        notes=("a note",),
    )


def test_verdicts():
    assert (verdict_of("passed"), verdict_of("failed"), verdict_of(None)) == (PASS, FAIL, NOT_REPORTED)
    with pytest.raises(ValueError, match="unknown report verdict"):
        verdict_of("maybe")


def test_summary_json_has_string_uids_and_each_miners_verdict():
    data = json.loads(json.dumps(_summary().to_json()))
    assert data["weights"] == {"0": 0.4, "2": 0.6}
    assert [(m["uid"], m["hotkey"], m["kind"], m["verdict"]) for m in data["miners"]] == [
        (2, "5miner-honest", HONEST, PASS),
        (3, "5miner-hostile", HOSTILE, FAIL),
    ]


def test_summary_tables_fit_80_columns():
    console = Console(record=True, width=80)
    render_summary(_summary(), console, {0: "owner", 1: "validator", 2: "miner-honest", 3: "miner-hostile"})
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert any("miner-honest" in line and "20" in line and "pass" in line for line in text.splitlines())
    assert "Weights set by the validator (uid 1) at block 42" in text
    assert "owner (subnet owner: unassigned places burn here)" in text
    assert "wrong output" in text and "miner-hostile" in text
    assert "note: a note" in text


def test_its_messages_on_a_terminal_fit_80_columns_without_splitting_a_word_or_a_path():
    """START_LOCALNET.sh in an 80-column terminal: its CPU note (146 columns) and a finished step's
    line (179: the forks and the GitHub stand-in) came on one line each, which the terminal split
    mid-word."""
    path = "/tmp/" + "long-folder-name/" * 6 + "ln"
    screen = io.StringIO()
    display = Display(Console(file=screen, width=80, force_terminal=True, soft_wrap=True, color_system=None))
    note = (
        "No CUDA device: the validator evaluates on CPU at small lengths (T = 64, 128). CPU figures are not benchmarks"
    )
    display.say(note, style="yellow")
    display.say(f"Data, wallets and logs: {path}")
    step = (
        "writing the forks and serving them from a GitHub stand-in: troy12x/flash-linear-attention is the starter "
        "fork; miner-hostile's fork skips the recurrence beyond 64 tokens"
    )
    display.step(step)
    display.close(ok=True)
    lines = [line.rstrip() for line in re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen.getvalue()).splitlines()]
    said = [line.split("\r")[-1] for line in lines if line.split("\r")[-1].strip()]
    assert all(len(line) <= 80 for line in said if path not in line), said
    assert path in said, said  # a path longer than a line is whole on its own
    text = " ".join(" ".join(said).split())
    assert note in text and f"Data, wallets and logs: {path}" in text, said
    assert re.search(rf"✓ {re.escape(step)} \(\d+\.\d s\)", text), said


def test_a_finished_steps_time_stays_whole_at_a_lines_end():
    """In an 80-column terminal the owner's step ended '... as the subnet owner (3.7' and the next
    line began with 's)', the time split from its unit."""
    screen = io.StringIO()
    display = Display(Console(file=screen, width=80, force_terminal=True, soft_wrap=True, color_system=None))
    display.step("waiting for the API, then publishing its URL on chain as the subnet owner")
    display.close(ok=True)
    lines = [line.rstrip() for line in re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen.getvalue()).splitlines()]
    said = [line.split("\r")[-1] for line in lines if line.split("\r")[-1].strip()]
    finished = [line for line in said if line.startswith(("✓", "  "))]  # not the spinner's redraws
    assert finished[-1].endswith("(0.0 s)") and all(len(line) <= 80 for line in finished), said


def test_what_a_running_network_prints_fits_80_columns_and_its_commands_copy_whole():
    """Without --once: the block naming the API, the miners' status command and the chain's flags
    had lines of 105, 215 and 110 columns (data in /tmp/walk/ln2), which the terminal split mid-word;
    the commands are shell lines continued with a backslash, each flag beside its value."""
    data = Path("/tmp/walk/ln2")
    network = types.SimpleNamespace(
        api_url="http://127.0.0.1:52219",
        dashboard_url="http://127.0.0.1:52219/",
        wallet_dir=data / "wallets",
        chain_path=data / "devchain.sqlite3",
        miners_dir=data / "miners",
        logs_dir=data / "logs",
        hotkey=lambda name: "5GTubf2Q4HukvspCBzrqaai1DYxbAVny2jUavJafqavs55DT",
    )
    github = types.SimpleNamespace(api_url="http://127.0.0.1:44397/api", root=data / "github")
    text = running_text(network, github)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    status = re.search(r"^ *(quasar status .*)$", text.replace(" \\\n", " "), re.M)
    assert status is not None, text
    words = status.group(1).split()
    assert words == [
        *("quasar", "status", "--wallet.path", str(network.wallet_dir), "--wallet.name", "miner-hostile"),
        *("--wallet.hotkey", "default", "--subtensor.network", "devchain", "--devchain.path"),
        *(str(network.chain_path), "--netuid", "24"),
    ], text
    for line in text.splitlines():
        assert not line.rstrip(" \\").endswith(("--wallet.path", "--devchain.path", "--netuid")), text
    assert "5GTubf2Q4HukvspCBzrqaai1DYxbAVny2jUavJafqavs55DT" in text and str(github.root) in text
    # The chain's flags are the neurons'; `quasar devchain` takes the file as --path, and refused
    # them ("argument COMMAND: invalid choice: '/tmp/walk/ln2/devchain.sqlite3'").
    devchain = re.search(r"^ *(quasar devchain .*)$", text.replace(" \\\n", " "), re.M)
    assert devchain is not None, text
    assert devchain.group(1).split() == ["quasar", "devchain", "--path", str(network.chain_path), "neurons"], text
