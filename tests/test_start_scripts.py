"""The pm2 ecosystem file (ecosystem.config.js) as pm2 reads it: evaluated by node, pm2's runtime."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from quasar.localnet.host import make_wallet
from tests.processes import neuron_stand_in, run_start_script, start_script_copy

ROOT = Path(__file__).resolve().parent.parent


def ecosystem_apps(file: Path = ROOT / "ecosystem.config.js") -> dict[str, dict]:
    """The apps of the ecosystem file ``file``, by name, as node evaluates it."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node (pm2's runtime) is not installed")
    listing = subprocess.run(
        [node, "-e", "console.log(JSON.stringify(require(process.argv[1]).apps))", str(file)],
        capture_output=True,
        text=True,
        check=True,
    )
    return {app["name"]: app for app in json.loads(listing.stdout)}


def test_ecosystem_file_starts_the_four_processes():
    apps = ecosystem_apps()
    assert set(apps) == {"quasar-api", "quasar-miner-inference", "quasar-miner", "quasar-validator"}
    scripts = {
        "quasar-api": "START_SERVER.sh",
        "quasar-miner-inference": "START_MINER_INFERENCE.sh",
        "quasar-miner": "START_MINER.sh",
        "quasar-validator": "START_VALIDATOR.sh",
    }
    for name, script in scripts.items():
        # pm2 runs the script named relative to the app's cwd (lib/Common.js, prepareAppConf).
        assert apps[name]["script"] == script and (ROOT / script).is_file()
        assert apps[name]["cwd"] == str(ROOT) and apps[name]["interpreter"] == "bash"


def test_ecosystem_file_in_a_folder_with_a_space_names_scripts_pm2_runs_as_files(tmp_path):
    """pm2 (5.4.3, lib/Common.js, verifyConfs) runs a script whose name has a space as the command
    line `bash -c SCRIPT`: in `~/GPU work/quasär suite` each app ran bash as its script and restarted
    without end on `/usr/bin/bash: /usr/bin/bash: cannot execute binary file` (exit 126)."""
    checkout = tmp_path / "GPU work" / "quas\u00e4r suite"
    checkout.mkdir(parents=True)
    shutil.copy(ROOT / "ecosystem.config.js", checkout / "ecosystem.config.js")
    apps = ecosystem_apps(checkout / "ecosystem.config.js")
    assert len(apps) == 4
    for name, app in apps.items():
        assert " " not in app["script"], f"{name}: pm2 would run {app['script']!r} through bash -c"
        assert app["cwd"] == str(checkout), name


def test_a_crash_loop_backs_off_by_the_one_restart_delay_pm2_applies():
    # pm2 (lib/God.js, handleExit) takes exp_backoff_restart_delay over restart_delay when both are
    # set: a fixed restart_delay beside it is silently ignored, and the file said what pm2 did not do.
    apps = ecosystem_apps()
    assert apps
    for name, app in apps.items():
        assert "restart_delay" not in app, f"{name}: pm2 ignores restart_delay beside exp_backoff_restart_delay"
        # A transient crash comes back after 1 s; a crash loop (a missing wallet) backs off by 1.5 x
        # per restart to pm2's cap of 15 s, so it neither spins nor waits long once fixed.
        assert app["exp_backoff_restart_delay"] == 1000, name
        assert app["autorestart"] is True and app["kill_timeout"] == 30000, name


def test_pm2_adds_no_second_timestamp_to_the_processes_lines():
    # Under pm2 the processes write plain lines that open with their time (quasar.log); pm2's
    # `time: true` put its own before it, so every line of pm2's logs had two (seen with pm2 7.0.4).
    for name, app in ecosystem_apps().items():
        assert not app.get("time"), f"{name}: pm2 would add a timestamp to lines that have one"


@pytest.fixture
def suite(tmp_path) -> Path:
    """A copy of START_VALIDATOR.sh and the checks it sources beside this checkout's .venv, with a
    stand-in neurons/validator.py that parses its flags as the validator does and prints the wallet
    and the device its settings name."""
    directory = start_script_copy(tmp_path / "suite", "START_VALIDATOR.sh")
    neuron_stand_in(
        directory, "validator", "'wallet:', settings.wallet_name_for('validator'), 'device:', settings.device"
    )
    for name in ("val_cold", "miner_cold"):
        make_wallet(directory / "wallets", name)
    return directory


def start_validator(directory: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    return run_start_script(directory, "START_VALIDATOR.sh", env, *flags)


def test_start_script_reads_the_env_file_quasar_dotenv_names_as_the_process_does(suite):
    # QUASAR_DOTENV gives a miner and a validator of one checkout a settings file each (README); the
    # checks read the checkout's .env whatever it said and exported it, so the validator started
    # with the miner's settings (the environment's win over QUASAR_DOTENV's file), or was refused
    # for a wallet its own file does not name.
    wallets = suite / "wallets"
    (suite / "validator.env").write_text(f"WALLET_PATH={wallets}\nWALLET_NAME=val_cold\nDEVICE=cpu\n")
    own = {"QUASAR_DOTENV": str(suite / "validator.env")}
    result = start_validator(suite, own)
    assert result.returncode == 0 and "wallet: val_cold" in result.stdout, result.stderr
    (suite / ".env").write_text(f"WALLET_PATH={wallets}\nWALLET_NAME=miner_cold\nDEVICE=cpu\n")
    result = start_validator(suite, own)
    assert result.returncode == 0 and "wallet: val_cold" in result.stdout, result.stderr
    # Without QUASAR_DOTENV the checkout's .env is read; set empty, none (the wallet then is the default).
    assert "wallet: miner_cold" in start_validator(suite, {}).stdout
    result = start_validator(suite, {"QUASAR_DOTENV": ""})
    assert result.returncode == 1 and "quasar_validator/coldkeypub.txt" in " ".join(result.stderr.split())
    result = start_validator(suite, {"QUASAR_DOTENV": str(suite / "missing.env")})
    said = " ".join(result.stderr.split())
    assert (
        result.returncode == 1
        and "missing.env, which is not a file: name a .env file there, or set it empty to read none" in said
    )


def test_start_script_reads_an_unquoted_path_with_a_space_as_the_process_does(suite):
    """`WALLET_PATH=/home/ana/GPU work/wällets`, unquoted, is one value to the validator (python-
    dotenv), but the .env was sourced by bash: `./.env: line 1: work/wällets: No such file or
    directory` and exit status 127 under LC_ALL=C, where pm2 restarts it without end."""
    wallets = suite / "GPU work" / "w\u00e4llets"
    make_wallet(wallets, "val_cold")
    (suite / ".env").write_text(f"WALLET_PATH={wallets}\nWALLET_NAME=val_cold\nDEVICE=cpu\n", encoding="utf-8")
    result = start_validator(suite, {"LC_ALL": "C"})
    assert result.returncode == 0 and "wallet: val_cold" in result.stdout, result.stderr
    # The environment still wins over .env: a wallet folder given there is the one checked.
    result = start_validator(suite, {"LC_ALL": "C", "WALLET_PATH": str(suite / "nowhere")})
    assert result.returncode == 1 and "nowhere/val_cold/coldkeypub.txt does" in " ".join(result.stderr.split())


def test_start_script_says_when_other_users_may_read_the_env_file(suite):
    """`cp .env.example .env` (the README's step) under the usual umask 022 left GITHUB_TOKEN
    readable by every user of the machine (`nobody` read it), and nothing said so."""
    wallets = suite / "wallets"
    env_file = suite / ".env"
    env_file.write_text(f"WALLET_PATH={wallets}\nWALLET_NAME=val_cold\nDEVICE=cpu\nGITHUB_TOKEN=ghp_0123456789\n")
    env_file.chmod(0o644)
    result = start_validator(suite, {})
    said = " ".join(result.stderr.split())
    assert result.returncode == 0 and "wallet: val_cold" in result.stdout, result.stderr
    assert "./.env is readable by other users of this machine (mode 644)" in said and "chmod 600 ./.env" in said
    env_file.chmod(0o600)
    assert "readable by other users" not in start_validator(suite, {}).stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_start_script_help_is_the_process_help_before_any_check(suite, flag):
    """`./START_VALIDATOR.sh --help` on a host without the wallet or a GPU yet (a new operator's
    first question) ran the checks and said the wallet file does not exist, or that PyTorch sees no
    CUDA GPU, and never showed the flags the script passes on."""
    result = start_validator(suite, {"QUASAR_DOTENV": ""}, "--device", "cuda", flag)
    assert result.returncode == 0 and result.stdout.startswith("usage: "), result.stderr
    assert "--wallet.name" in result.stdout and result.stderr == ""


def said(result: subprocess.CompletedProcess) -> str:
    return " ".join(result.stderr.split())


def test_start_script_checks_the_wallet_and_device_of_abbreviated_flags_as_the_validator_reads_them(suite):
    """argparse takes a flag's unique prefix (`--wallet.nam`, `--devi`) and an empty --wallet.name
    as the role's wallet; the checks matched whole flags by hand: `--wallet.nam val_cold --devi cpu`
    was refused for the wallet quasar_validator, and for CUDA, which the validator would not use;
    `--wallet.name ''` for the file wallets//coldkeypub.txt."""
    wallets = {"WALLET_PATH": str(suite / "wallets")}
    result = start_validator(suite, wallets, "--wallet.nam", "val_cold", "--devi", "cpu")
    assert result.returncode == 0 and "wallet: val_cold device: cpu" in result.stdout, result.stderr
    result = start_validator(suite, {**wallets, "WALLET_NAME": "val_cold"}, "--wallet.name", "", "--device", "cpu")
    assert result.returncode == 1 and f"{suite}/wallets/quasar_validator/coldkeypub.txt does not" in said(result)
    # A flag the validator would refuse is refused with its message.
    result = start_validator(suite, wallets, "--wallet", "val_cold")
    assert result.returncode == 2 and "error: ambiguous option: --wallet could match" in result.stderr


def test_start_script_checks_the_wallet_folder_of_a_tilde_user_path_as_the_validator_reads_it(suite):
    """`~USER/wallets` is USER's home folder's to the validator (os.path.expanduser); the checks
    replaced the `~` alone by HOME, and checked HOME + `USER/wallets`: a wallet there passed them and
    the validator then stopped on a hotkey file its folder does not hold."""
    user = pwd.getpwuid(os.getuid())
    folder = f"quasar-start-checks-{suite.parent.name}"
    make_wallet(Path(f"{suite}{user.pw_name}") / folder, "val_cold")  # HOME + "USER/..." (HOME is suite)
    result = start_validator(
        suite, {"DEVICE": "cpu"}, f"--wallet.path=~{user.pw_name}/{folder}", "--wallet.name", "val_cold"
    )
    assert result.returncode == 1, result.stdout
    assert f"wallet file {user.pw_dir}/{folder}/val_cold/coldkeypub.txt does not exist" in said(result)


def test_start_script_keeps_a_flag_on_the_line_of_its_value(suite):
    """The cure for a missing wallet is a btcli command to copy; wrapped by fmt at 80 columns, a
    wallet name of 10 letters ended a line with `--wallet-hotkey` and began the next with `default`
    (24 letters: `--wallet` and the name), as no message of the suite's Python commands does."""
    for length in range(1, 25):
        name = "w" * length
        result = start_validator(suite, {"DEVICE": "cpu", "WALLET_PATH": str(suite / "wallets")}, "--wallet.name", name)
        lines = result.stderr.splitlines()
        assert result.returncode == 1 and all(len(line) <= 80 for line in lines if str(suite) not in line), lines
        assert not [line for line in lines if line.split()[-1] in ("--wallet", "--wallet-hotkey", "--wallet-path")], (
            length,
            lines,
        )
        assert f"(btcli wallet create --wallet {name} --wallet-hotkey default --wallet-path" in said(result), lines
