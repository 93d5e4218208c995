"""Every ``btcli`` command the README, docs/, the START scripts and QUASAR's messages tell an operator to run
is one the btcli that pyproject.toml pins takes: its subcommand exists and each flag is in its
``--help`` (bittensor 11's btcli wants ``--wallet`` and ``--wallet-hotkey``, not ``--wallet.name``).
The help comes from btcli's own command-line app (what the ``btcli`` script runs), in this process."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from bittensor.cli.main import app as btcli_app
from typer.testing import CliRunner

from quasar.chain import btcli
from quasar.config import resolve

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = [
    "START_MINER.sh",
    "START_VALIDATOR.sh",
    "START_MINER_INFERENCE.sh",
    "START_SERVER.sh",
    "scripts/start_checks.sh",
]
# In the README and docs/: a line of a code block, or a code span, that starts with btcli (up to a comment).
README_COMMAND = re.compile(r"^btcli ([^#\n]+)|`btcli ([^`]+)`", re.MULTILINE)
# In a script's message: a command in parentheses.
SCRIPT_COMMAND = re.compile(r"\(btcli ([^)\"]+)\)")


@functools.cache
def help_text(subcommand: tuple[str, ...]) -> str:
    result = CliRunner().invoke(btcli_app, [*subcommand, "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, f"btcli {' '.join(subcommand)} --help failed: {result.output[-2000:]}"
    return result.output


def parsed(command: str) -> tuple[tuple[str, ...], list[str]]:
    """(the subcommand words, the flags) of a ``btcli ...`` command line."""
    words = command.split()
    subcommand = []
    for word in words:
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        subcommand.append(word)
    flags = [word.split("=")[0] for word in words if word.startswith("--")]
    return tuple(subcommand), flags


def commands_in(text: str, pattern: re.Pattern) -> list[str]:
    return [next(group for group in match.groups() if group).strip() for match in pattern.finditer(text)]


def check(command: str) -> None:
    subcommand, flags = parsed(command)
    assert subcommand, f"no subcommand in btcli {command}"
    text = help_text(subcommand)
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (
            f"btcli {' '.join(subcommand)} takes no {flag} (in: btcli {command})"
        )


def test_the_readme_docs_and_start_scripts_use_real_btcli_commands():
    found = {script: commands_in((ROOT / script).read_text(), SCRIPT_COMMAND) for script in SCRIPTS}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found[str(path.relative_to(ROOT))] = commands_in(path.read_text(), README_COMMAND)
    assert len(found["README.md"]) >= 8, found["README.md"]  # wallets, registration, stake, hyperparameters...
    assert found["scripts/start_checks.sh"]  # the START scripts' wallet check
    for commands in found.values():
        for command in commands:
            check(command)


def test_the_commands_quasar_prints_are_real_btcli_commands():
    finney = resolve({"wallet_path": "/srv/wallets"}, environ={}, dotenv_path=None)
    local = resolve({"network": "local", "chain_endpoint": "ws://10.0.0.2:9944"}, environ={}, dotenv_path=None)
    printed = [
        btcli.wallet_create("miner", "default"),
        btcli.wallet_create("v", "hk", "/srv/wallets"),
        btcli.new_hotkey("miner", "default"),
        btcli.register(finney, "miner"),
        btcli.register(local, "miner"),
        btcli.stake_add(finney, "validator", "100"),
    ]
    assert printed[0] == "btcli wallet create --wallet miner --wallet-hotkey default"
    assert printed[3] == (
        "btcli subnets register --netuid 24 --wallet miner --wallet-hotkey default --wallet-path "
        "/srv/wallets --network finney"
    )
    assert printed[4].endswith("--network ws://10.0.0.2:9944")
    for command in printed:
        check(command.removeprefix("btcli "))


def test_a_wrong_flag_is_caught():
    with pytest.raises(AssertionError, match="takes no --wallet.name"):
        check("wallet create --wallet.name miner")
