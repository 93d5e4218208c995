"""The validator's, the miner's and the submission API's refusals at start, as a new validator or
subnet owner reads them in an 80-column terminal: wrapped at words, a flag with its value; a chain
node out of reach with the cure."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from quasar import cli as quasar_cli
from quasar.api import __main__ as api_main
from quasar.api.devdb import start_api_process
from quasar.chain import devchain_cli
from quasar.inference import cli as inference_cli
from quasar.localnet import cli as localnet_cli
from quasar.localnet.host import make_wallet
from quasar.miner import cli as miner_cli
from quasar.validator import cli as validator_cli

ROOT = Path(__file__).resolve().parents[1]
API_HOTKEY = "5CSbsWarESZtNAWFpTaTcMFqBvpD7ULQbDfqQuYgKCCPfotw"


@pytest.fixture
def terminal(monkeypatch, tmp_path):
    """An 80-column terminal, no .env and none of the settings these refusals are about."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("QUASAR_DOTENV", "")
    for name in ("API_HOTKEY", "NETUID", "SUBTENSOR_NETWORK", "DEVCHAIN_PATH", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def refusal(capsys, prog: str) -> tuple[list[str], str]:
    """The lines from ``PROG: error:`` on, and their words joined by single spaces."""
    error = capsys.readouterr().err
    assert f"{prog}: error:" in error, error
    lines = error[error.index(f"{prog}: error:") :].splitlines()
    return lines, " ".join(" ".join(lines).split())


@pytest.mark.parametrize(
    "main, prog",
    [
        (validator_cli.main, "quasar validator"),
        (miner_cli.main, "quasar miner"),
        (miner_cli.status_main, "quasar status"),
    ],
)
def test_a_bad_flag_value_is_refused_within_80_columns(terminal, capsys, main, prog):
    """`quasar validator --netuid abc` (and START_VALIDATOR.sh, whose checks read the flags with the
    validator's parser) was refused in one line of 85 columns, 96 as python -m neurons.validator."""
    with pytest.raises(SystemExit) as refused:
        main(["--netuid", "abc"], prog=prog)
    assert refused.value.code == 2
    lines, text = refusal(capsys, prog)
    assert max(len(line) for line in lines) <= 80, lines
    assert text == f"{prog}: error: --netuid (from command line): expected an integer, got 'abc'"


@pytest.mark.parametrize(
    "main, argv, prog, said",
    [
        (
            devchain_cli.main,
            ["--path", "chain.sqlite3", "nodes"],
            "quasar devchain",
            "quasar devchain: error: argument COMMAND: invalid choice: 'nodes' (choose from 'init',",
        ),
        (
            devchain_cli.main,
            ["--path", "chain.sqlite3", "set-hyperparameter", "commit_reveal", "false"],
            "quasar devchain",
            "quasar devchain set-hyperparameter: error: argument NAME: invalid choice: 'commit_reveal' (choose",
        ),
        (
            functools.partial(quasar_cli.show_settings, prog="quasar config"),
            ["--table", "validators"],
            "quasar config",
            "quasar config: error: argument --table: invalid choice: 'validators' (choose from 'api',",
        ),
        (
            localnet_cli.main,
            ["--hyperparameters", "mainnet"],
            "quasar localnet",
            "quasar localnet: error: argument --hyperparameters: invalid choice: 'mainnet' (choose from",
        ),
    ],
)
def test_a_bad_choice_is_refused_within_80_columns(terminal, capsys, main, argv, prog, said):
    """The dev chain's commands, `quasar config --table` and the local network's flags refused a
    name they do not take in argparse's one line, of 339 columns for `quasar devchain nodes`, its
    usage listing every hyperparameter's name on one line of 335 for set-hyperparameter."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    error = capsys.readouterr().err
    assert max(len(line) for line in error.splitlines()) <= 80, error
    assert said in " ".join(error.split()), error


def test_a_dev_chain_refusal_is_said_within_80_columns(terminal, capsys):
    """`quasar devchain --path FILE trim 12` printed 'error: cannot trim to 12 uids: ...' in one
    line of 120 columns, without naming the command."""
    assert devchain_cli.main(["--path", "chain.sqlite3", "trim", "12"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert max(len(line) for line in lines) <= 80, lines
    assert " ".join(" ".join(lines).split()) == (
        "quasar devchain: error: cannot trim to 12 uids: InvalidValue: the subnet takes between its "
        "MinAllowedUids 64 and its max_allowed_uids 256"
    )


def api_serve(*flags: str) -> int:
    """``quasar api serve`` with the API's hotkey and ``flags``; its exit status."""
    return api_main.main(["serve", "--api.hotkey", API_HOTKEY, *flags], prog="quasar api")


def test_the_api_without_its_hotkey_is_refused_within_80_columns(terminal, capsys):
    """START_SERVER.sh from a fresh .env.example: one line of 156 columns."""
    with pytest.raises(SystemExit) as refused:
        api_main.main(["serve"], prog="quasar api")
    assert refused.value.code == 2
    lines, text = refusal(capsys, "quasar api")
    assert max(len(line) for line in lines) <= 80, lines
    assert text == (
        "quasar api: error: API_HOTKEY is not set: give the ss58 address of the API's hotkey (clients "
        "sign for it) in .env, the environment or --api.hotkey"
    )
    assert any("--api.hotkey" in line for line in lines)


def test_publishing_a_url_no_api_answers_is_refused_within_80_columns(terminal, capsys, tmp_path):
    """The owner's `quasar api publish-url` printed its refusal in one line of 178 columns."""
    make_wallet(tmp_path / "wallets", "owner")
    status = api_main.main(
        [
            "publish-url",
            "http://127.0.0.1:1",
            "--wallet.name",
            "owner",
            "--wallet.path",
            str(tmp_path / "wallets"),
            "--subtensor.network",
            "devchain",
            "--devchain.path",
            str(tmp_path / "devchain.sqlite3"),
        ],
        prog="quasar api",
    )
    assert status == 1
    lines, text = refusal(capsys, "quasar api publish-url")
    assert max(len(line) for line in lines) <= 80, lines
    assert text.startswith(
        "quasar api publish-url: error: the API at http://127.0.0.1:1 does not answer GET /health"
    ), text
    assert text.endswith("start it, and publish the URL miners and validators reach it at"), text


def test_publishing_with_a_wallet_that_is_not_there_is_refused_naming_it(terminal, capsys, tmp_path):
    """The owner's `quasar api publish-url URL --wallet.name typo`, the API answering, ended in an
    uncaught FileNotFoundError: a traceback of 76 lines at 80 columns from the SDK's key file."""
    chain = tmp_path / "devchain.sqlite3"
    server, url = start_api_process(tmp_path, f"sqlite:///{tmp_path}/api.sqlite3", chain, API_HOTKEY)
    try:
        status = api_main.main(
            [
                "publish-url",
                url,
                "--wallet.name",
                "typo",
                "--wallet.path",
                str(tmp_path / "wallets"),
                "--subtensor.network",
                "devchain",
                "--devchain.path",
                str(chain),
            ],
            prog="quasar api",
        )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    assert status == 1
    lines, text = refusal(capsys, "quasar api publish-url")
    # The file's path, kept whole on a line of its own, is as long as the test's folder makes it.
    assert all(len(line) <= 80 or len(line.split()) == 1 for line in lines), lines
    assert text == (
        f"quasar api publish-url: error: the wallet typo has no coldkey file {tmp_path}/wallets/typo/coldkeypub.txt: "
        "name the subnet owner's wallet (its coldkey owns the subnet) with --wallet.name or WALLET_NAME, "
        "and the folder holding it with --wallet.path or WALLET_PATH"
    )


def test_a_database_that_refuses_the_connection_is_said_within_80_columns(terminal, capsys, tmp_path):
    """A PostgreSQL server not running: psycopg's message on two lines of 154 columns and a tab,
    then SQLAlchemy's link to its page about the error class."""
    status = api_serve(
        "--subtensor.network",
        "devchain",
        "--devchain.path",
        str(tmp_path / "devchain.sqlite3"),
        "--database-url",
        "postgresql://quasar@127.0.0.1:1/quasar",
    )
    assert status == 1
    lines, text = refusal(capsys, "quasar api serve")
    assert max(len(line) for line in lines) <= 80, lines
    assert "\t" not in "".join(lines) and "sqlalche.me" not in text, lines
    assert text.startswith(
        "quasar api serve: error: database postgresql://quasar@127.0.0.1:1/quasar: connection to server at"
    ), text
    assert "Connection refused" in text, text


@pytest.fixture
def closed_node(monkeypatch):
    """A ws:// URL nothing listens at, the chain's tries without their waits between them."""
    from quasar.chain import bittensor_chain

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(
        bittensor_chain, "BittensorChain", functools.partial(bittensor_chain.BittensorChain, sleep=lambda _: None)
    )
    return f"ws://127.0.0.1:{port}"


CHAIN_CURE = (
    "check this host's network, or name a node that answers in SUBTENSOR_CHAIN_ENDPOINT (--subtensor.chain_endpoint)"
)


def test_an_api_whose_chain_node_does_not_answer_is_refused_naming_the_cure(terminal, capsys, closed_node):
    """It said that it could not reach the node, in the SDK's words, and nothing of what to do."""
    status = api_serve("--subtensor.network", "local", "--subtensor.chain_endpoint", closed_node)
    assert status == 1
    lines, text = refusal(capsys, "quasar api serve")
    assert max(len(line) for line in lines) <= 80, lines
    assert f"cannot reach {closed_node} after 4 attempts" in text and text.endswith(CHAIN_CURE), text


def test_a_validator_whose_chain_node_does_not_answer_stops_naming_the_cure(terminal, capsys, tmp_path, closed_node):
    """It logged that it could not reach the node, in the SDK's words, and nothing of what to do."""
    make_wallet(tmp_path / "wallets", "quasar_validator")
    argv = ["--device", "cpu", "--wallet.path", str(tmp_path / "wallets"), "--subtensor.network", "local"]
    assert validator_cli.main([*argv, "--subtensor.chain_endpoint", closed_node]) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if " ERROR " in line]
    assert len(said) == 1 and f"cannot reach {closed_node} after 4 attempts" in said[0], said
    assert said[0].endswith(CHAIN_CURE), said


def test_a_miner_whose_chain_node_does_not_answer_stops_naming_the_cure(
    terminal, capsys, monkeypatch, tmp_path, closed_node
):
    """./START_MINER.sh on finney from a host without its way out logged 'chain: read the
    metagraph: cannot reach finney after 4 attempts' in the SDK's words, and nothing of what to do."""
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_" + "0" * 36)
    monkeypatch.setenv("GITHUB_USERNAME", "a-miner")
    make_wallet(tmp_path / "wallets", "quasar_miner")
    argv = ["--device", "cpu", "--target-sequence-length", "128", "--wallet.path", str(tmp_path / "wallets")]
    argv += ["--workspace.root", str(tmp_path / "work"), "--subtensor.network", "local"]
    assert miner_cli.main([*argv, "--subtensor.chain_endpoint", closed_node]) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if " ERROR " in line]
    assert len(said) == 1 and f"cannot reach {closed_node} after 4 attempts" in said[0], said
    assert said[0].endswith(CHAIN_CURE), said


def test_the_miners_inference_server_whose_chain_node_does_not_answer_stops_naming_the_cure(
    terminal, capsys, tmp_path, closed_node
):
    """The miner's `quasar inference serve` on finney from a host without its way out logged
    'chain: read the metagraph: cannot reach finney after 4 attempts' in the SDK's words alone."""
    make_wallet(tmp_path / "wallets", "quasar_miner")
    argv = ["serve", "--device", "cpu", "--wallet.path", str(tmp_path / "wallets"), "--subtensor.network", "local"]
    assert inference_cli.main([*argv, "--subtensor.chain_endpoint", closed_node]) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if " ERROR " in line]
    assert len(said) == 1 and f"cannot reach {closed_node} after 4 attempts" in said[0], said
    assert said[0].endswith(CHAIN_CURE), said


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--device", "cuda:99"], "DEVICE is cuda:99 but "),
        (["--device", "cpu", "--reference-model", "./no-such-model"], "folder no-such-model does not exist"),
    ],
)
def test_the_miners_inference_server_says_a_local_mistake_before_it_reaches_the_chain(
    terminal, capsys, tmp_path, closed_node, flags, said
):
    """With no GPU and no way out to the chain, `quasar inference serve` said only that it could not
    reach the chain's node, after about 15 s of tries; on a chain that answered, it then said the
    GPU was missing. The device and a local model folder need no network: they are said first."""
    make_wallet(tmp_path / "wallets", "quasar_miner")
    argv = ["serve", *flags, "--wallet.path", str(tmp_path / "wallets"), "--subtensor.network", "local"]
    assert inference_cli.main([*argv, "--subtensor.chain_endpoint", closed_node]) == 1
    logged = [line for line in capsys.readouterr().err.splitlines() if " quasar." in line]
    assert len(logged) == 1 and " ERROR " in logged[0] and said in logged[0], logged


def test_quasar_status_whose_chain_node_does_not_answer_says_the_cure(terminal, capsys, tmp_path, closed_node):
    """`quasar status` on finney without the way out said 'cannot find the submission API: read
    the subnet identity: cannot reach finney after 4 attempts' in the SDK's words alone."""
    make_wallet(tmp_path / "wallets", "quasar_miner")
    argv = ["--wallet.path", str(tmp_path / "wallets"), "--subtensor.network", "local"]
    assert miner_cli.status_main([*argv, "--subtensor.chain_endpoint", closed_node]) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if " ERROR " in line]
    assert len(said) == 1 and f"cannot reach {closed_node} after 4 attempts" in said[0], said
    assert said[0].endswith(CHAIN_CURE), said


@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_another_api_serves_is_refused_not_shared(tmp_path, workers):
    """A second API (pm2 starting it twice, another database) on the port of one serving with
    --workers 2: with two workers it started, its workers' SO_REUSEPORT sockets beside the first's,
    and the kernel shared the connections, and so the submissions, between the two databases; with
    one, uvicorn's ERROR named the port taken and no cure, after the start-up lines."""
    chain = tmp_path / "devchain.sqlite3"
    first, url = start_api_process(tmp_path, f"sqlite:///{tmp_path}/first.sqlite3", chain, API_HOTKEY, workers=2)
    try:
        port = url.rsplit(":", 1)[1]
        command = [sys.executable, "-m", "quasar.api", "serve", "--workers", str(workers), "--port", port]
        command += ["--database-url", f"sqlite:///{tmp_path}/second.sqlite3", "--api.hotkey", API_HOTKEY]
        command += ["--subtensor.network", "devchain", "--devchain.path", str(chain)]
        environment = {**os.environ, "QUASAR_DOTENV": "", "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
        second = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=60)
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=60)
    assert second.returncode == 1, second.stderr
    lines = second.stderr[second.stderr.index("python -m quasar.api serve: error:") :].splitlines()
    assert max(len(line) for line in lines) <= 80, lines
    assert " ".join(" ".join(lines).split()) == (
        f"python -m quasar.api serve: error: cannot listen on 127.0.0.1:{port}: Address already in use: "
        "another process listens there (this API started twice?): stop it, or give this one another "
        "API_PORT (--port)"
    )
    assert not (tmp_path / "second.sqlite3").exists()  # refused before its database is made
