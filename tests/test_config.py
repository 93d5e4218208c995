"""Settings: precedence default < .env < environment < flag, clear errors, .env.example in step."""

import argparse
import ast
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from quasar import config
from quasar.config import values
from quasar.evaluate import cli as evaluate_cli
from quasar.evaluate.options import EvaluationOptions
from quasar.tools.install_kernel import module_file
from tests.processes import run_python

ROOT = Path(__file__).resolve().parents[1]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser


def test_defaults_when_nothing_is_set(tmp_path):
    settings = config.resolve({}, environ={}, dotenv_path=tmp_path / "missing.env")
    assert settings.netuid == 24
    assert settings.network == "finney"
    assert settings.target_sequence_length is None
    assert settings.wallet_name_for("miner") == "quasar_miner"
    assert settings.wallet_name_for("validator") == "quasar_validator"


def test_a_miners_target_is_a_length_an_evaluation_runs():
    for target in (values.MIN_SEQ_LEN, values.MAX_SEQ_LEN):
        assert (
            config.resolve({"target_sequence_length": str(target)}, environ={}, dotenv_path=None).target_sequence_length
            == target
        )
    for target in (values.MIN_SEQ_LEN - 1, values.MAX_SEQ_LEN + 1):
        with pytest.raises(config.SettingsError, match="--target-sequence-length"):
            config.resolve({"target_sequence_length": str(target)}, environ={}, dotenv_path=None)


def test_quasar_dotenv_names_the_env_file_or_none(tmp_path, monkeypatch):
    """Two processes of one checkout (a miner and a validator under pm2) can read their own .env;
    an empty QUASAR_DOTENV reads none; a name that is not a file is refused, named."""
    here = tmp_path / "here"
    here.mkdir()
    (here / ".env").write_text("NETUID=5\n")
    own = tmp_path / "validator.env"
    own.write_text("NETUID=7\n")
    monkeypatch.chdir(here)
    monkeypatch.delenv(config.DOTENV_VARIABLE, raising=False)
    assert config.resolve({}, environ={}).netuid == 5
    monkeypatch.setenv(config.DOTENV_VARIABLE, str(own))
    assert config.resolve({}, environ={}).netuid == 7
    monkeypatch.setenv(config.DOTENV_VARIABLE, "")
    assert config.resolve({}, environ={}).netuid == 24
    monkeypatch.setenv(config.DOTENV_VARIABLE, str(tmp_path / "missing.env"))
    with pytest.raises(
        config.SettingsError,
        match=r"QUASAR_DOTENV names .*missing\.env, which is not a file: name a \.env file there, or set it empty "
        r"to read none$",
    ):
        config.resolve({}, environ={})


def test_precedence_dotenv_then_environment_then_flag(tmp_path):
    dotenv = tmp_path / ".env"
    dotenv.write_text("NETUID=3\nSUBTENSOR_NETWORK=test\nAXON_EXTERNAL_PORT=9000\nDEVICE=cpu\n")
    environ = {"NETUID": "5", "SUBTENSOR_NETWORK": "local"}
    parser = make_parser()
    namespace = parser.parse_args(["--netuid", "7"])
    settings = config.resolve(namespace, environ=environ, dotenv_path=dotenv)
    assert settings.netuid == 7  # flag beats environment
    assert settings.network == "local"  # environment beats .env
    assert settings.axon_external_port == 9000  # .env beats default
    assert settings.device == "cpu"


def test_a_retired_setting_in_an_old_env_is_named_with_what_replaced_it(tmp_path, caplog):
    """An .env written from an older .env.example (AXON_PORT=8091 was in it) upgrades in place:
    a setting no longer read is named with what does its work now, not silently ignored."""
    dotenv = tmp_path / ".env"
    dotenv.write_text("NETUID=3\nAXON_PORT=9000\n")
    with caplog.at_level("WARNING", logger="quasar.config.settings"):
        # START_MINER.sh and START_VALIDATOR.sh export the .env: the .env is still the one named.
        settings = config.resolve({}, environ={"AXON_PORT": "9000"}, dotenv_path=dotenv)
    assert settings.axon_external_port is None
    warned = [record.getMessage() for record in caplog.records]
    assert warned == [
        f"AXON_PORT (from {dotenv}) is no longer read: the port published on chain is AXON_EXTERNAL_PORT "
        "(empty: MINER_INFERENCE_PORT, where the inference server listens); move its value there if a "
        "router forwards that port, then remove AXON_PORT"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="quasar.config.settings"):
        config.resolve({}, environ={"AXON_PORT": "9000"}, dotenv_path=None)
    assert [record.getMessage().split(" is no longer")[0] for record in caplog.records] == [
        "AXON_PORT (from environment)"
    ]


def test_a_retired_setting_is_logged_as_every_line_once_logging_is_set_up(tmp_path):
    """A process reads its settings before it sets up logging (which needs their debug flag and
    secrets): the retired setting's warning is held until then and logged as every line is, with
    its time and level and terminal controls (in the .env's path) as ?. Logging's last resort wrote
    it bare: no time, the escape raw, one line of 239 columns in an 80-column terminal."""
    dotenv = tmp_path / "old\x1b[31m.env"
    dotenv.write_text("AXON_PORT=8091\n")
    env = {**os.environ, "QUASAR_DOTENV": str(dotenv)}
    env.pop("AXON_PORT", None)
    command = ["-m", "quasar", "scoring", "--input", str(ROOT / "examples" / "results.json")]
    run = run_python(command, tmp_path, 120, env)
    assert run.returncode == 0, run.stderr
    warned = [line for line in run.stderr.splitlines() if "AXON_PORT" in line]
    assert len(warned) == 1, run.stderr
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING quasar\.config\.settings: AXON_PORT "
        r"\(from .*/old\?\[31m\.env\) is no longer read: the port published on chain is AXON_EXTERNAL_PORT .*",
        warned[0],
    ), warned[0]


def test_bittensor_flag_spelling(tmp_path):
    parser = make_parser()
    argv = [
        "--wallet.name",
        "alice",
        "--wallet.hotkey",
        "hk",
        "--wallet.path",
        "/w",
        "--subtensor.network",
        "devchain",
        "--subtensor.chain_endpoint",
        "ws://127.0.0.1:9944",
        "--netuid",
        "1",
        "--axon.port",
        "8092",
        "--axon.external_ip",
        "203.0.113.7",
        "--axon.external_port",
        "443",
        "--logging.debug",
    ]
    settings = config.resolve(parser.parse_args(argv), environ={}, dotenv_path=None)
    assert (settings.wallet_name_for("miner"), settings.wallet_hotkey, settings.wallet_path) == ("alice", "hk", "/w")
    assert settings.network == "devchain"
    assert settings.chain_endpoint == "ws://127.0.0.1:9944"
    # --axon.port is the inference server's port (the miner's axon); the external pair is what is published.
    assert (settings.netuid, settings.miner_inference_port, settings.debug) == (1, 8092, True)
    assert (settings.axon_external_ip, settings.axon_external_port) == ("203.0.113.7", 443)
    inference = config.resolve(parser.parse_args(["--inference.port", "8093"]), environ={}, dotenv_path=None)
    assert inference.miner_inference_port == 8093 and inference.axon_external_port is None


def test_local_forks_only_on_the_dev_chain_or_when_allowed():
    def allowed(**environ: str) -> bool:
        return config.resolve({}, environ=environ, dotenv_path=None).local_forks_allowed

    assert allowed(SUBTENSOR_NETWORK="devchain")
    # A subtensor node on this machine is a real chain: its miners are strangers as on finney.
    assert not allowed(SUBTENSOR_NETWORK="local") and not allowed(SUBTENSOR_NETWORK="finney")
    assert allowed(SUBTENSOR_NETWORK="local", ALLOW_LOCAL_FORKS="true")


def test_private_endpoints_are_checked_off_the_public_networks_or_when_allowed():
    """One rule for both sides: where a miner may publish a private address (quasar/miner/runner.py),
    validators challenge it; on finney, test and archive neither does unless allowed."""

    def allowed(**environ: str) -> bool:
        return config.resolve({}, environ=environ, dotenv_path=None).private_endpoints_allowed

    assert allowed(SUBTENSOR_NETWORK="devchain") and allowed(SUBTENSOR_NETWORK="local")
    assert not any(allowed(SUBTENSOR_NETWORK=network) for network in ("finney", "test", "archive"))
    assert allowed(SUBTENSOR_NETWORK="finney", ALLOW_PRIVATE_ENDPOINTS="true")


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"NETUID": "abc"}, "NETUID (from environment): expected an integer, got 'abc'"),
        ({"SUBTENSOR_NETWORK": "mainnet"}, "SUBTENSOR_NETWORK (from environment): unknown network 'mainnet'"),
        ({"MINER_INFERENCE_PORT": "70000"}, "MINER_INFERENCE_PORT (from environment): must be between 1 and 65535"),
        ({"DEVICE": "gpu"}, "DEVICE (from environment): expected cpu, cuda or cuda:N"),
        ({"VALIDATOR_API_URL": "ftp://x"}, "VALIDATOR_API_URL (from environment): expected an http"),
        ({"AXON_EXTERNAL_IP": "miner.example.org"}, "AXON_EXTERNAL_IP (from environment): expected an IPv4 or IPv6"),
        ({"AXON_EXTERNAL_PORT": "0"}, "AXON_EXTERNAL_PORT (from environment): must be at least 1, got 0"),
        ({"WALLET_HOTKEY": "../../etc"}, "WALLET_HOTKEY (from environment): expected a plain name"),
        ({"LOGGING_DEBUG": "maybe"}, "LOGGING_DEBUG (from environment): expected true or false"),
        ({"CLAIM_SHARE": "1.2"}, "CLAIM_SHARE (from environment): must be above 0 and at most 1, got 1.2"),
        ({"CLAIM_SHARE": "0"}, "CLAIM_SHARE (from environment): must be above 0 and at most 1, got 0"),
        (
            {"DATABASE_URL": "postgresql://quasar:hunter2@db:5432/quasar"},
            "DATABASE_URL (from environment): must not contain a password",
        ),
    ],
)
def test_bad_values_name_the_setting(environ, message):
    with pytest.raises(config.SettingsError) as raised:
        config.resolve({}, environ=environ, dotenv_path=None)
    assert message in str(raised.value)


def test_a_list_of_lengths_reads_the_same_in_a_setting_and_on_a_flag(tmp_path):
    """EVAL_SEQ_LENS took only plain integers while --seq-lens took 100k and 1M: one reading now."""
    settings = config.resolve({}, environ={"EVAL_SEQ_LENS": "512, 100k,1_024,1M"}, dotenv_path=None)
    assert settings.eval_seq_lens == (512, 100_000, 1024, 1_000_000)
    assert evaluate_cli.parse_seq_lens("512, 100k,1_024,1M") == settings.eval_seq_lens
    assert config.resolve({}, environ={"EVAL_SEQ_LENS": ""}, dotenv_path=None).eval_seq_lens == ()
    for bad in ("512,abc", "1.5M", "0", "\u0663", "k"):
        with pytest.raises(config.SettingsError, match=r"EVAL_SEQ_LENS \(from environment\): expected comma-separated"):
            config.resolve({}, environ={"EVAL_SEQ_LENS": bad}, dotenv_path=None)
        with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated"):
            evaluate_cli.parse_seq_lens(bad)


def test_lengths_written_out_read_back_as_the_same_lengths():
    rng = random.Random()
    seed = random.SystemRandom().randrange(2**32)
    rng.seed(seed)
    for _ in range(200):
        scale = rng.choice([1, 1000, 1_000_000])
        lengths = tuple(rng.randrange(1, 10**7 // scale) * scale for _ in range(4))
        text = values.format_seq_lens(lengths)
        assert values.parse_seq_lens(text) == lengths, f"seed {seed}: {text}"
        assert all(part.endswith("M") == (n % 1_000_000 == 0) for part, n in zip(text.split(","), lengths))
    assert values.format_seq_lens((65536, 262144, 100_000, 1_000_000, 1500)) == "65536,262144,100k,1M,1500"


def test_a_minimum_length_is_named_when_refused():
    assert values.parse_seq_lens("64, 1k", minimum=64) == (64, 1000)
    with pytest.raises(ValueError, match="at least 64.*'32'"):
        values.parse_seq_lens("64,32", minimum=64)


def test_the_timed_seconds_help_names_the_bounds_the_evaluation_uses():
    """The settings table is TOML, so its help cannot print the constants; this checks the copy."""
    defaults = EvaluationOptions()
    help_text = config.OPTIONS_BY_KEY["eval_timed_seconds"].help
    assert f"at least {defaults.min_timed_runs} and at most {defaults.max_timed_runs}" in help_text


# What the README and docs/ say of a setting's default: "`API_WORKERS`, default 1", "`QUORUM_STAKE_SHARE`
# (default 0.6)", "`API_MAX_HEADER_BYTES` (16 KiB)", "`SANDBOX_MEMORY_MB` (16,384)".
DOCUMENTED_DEFAULT = re.compile(r"`([A-Z][A-Z0-9_]+)`(?:,? \(?default:? `?([^`),;]+)| \(([^);]+))")
STATED_NUMBER = re.compile(r"([0-9][0-9,]*(?:\.[0-9]+)?)( KiB| MiB| s)?")
UNITS = {None: 1, " s": 1, " KiB": 1024, " MiB": 1024 * 1024}


def _same_default(stated: str, default: str) -> bool:
    number = STATED_NUMBER.fullmatch(stated)
    if number is None:
        return stated == default
    return float(number[1].replace(",", "")) * UNITS[number[2]] == float(default)


def test_the_docs_state_the_defaults_the_settings_have():
    by_env = {option.env: option for option in config.OPTIONS if option.env}
    stated = [
        (path.name, name, (default_form or parenthesised).strip())
        for path in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
        for name, default_form, parenthesised in DOCUMENTED_DEFAULT.findall(path.read_text())
        if name in by_env and (default_form or STATED_NUMBER.fullmatch(parenthesised.strip()))
    ]
    assert len(stated) >= 10, stated  # the pattern still finds what the docs write
    for page, name, value in stated:
        default = by_env[name].default
        assert _same_default(value, default), f"{page} says {name} defaults to {value!r}; the code: {default!r}"


def test_bad_flag_names_the_flag():
    parser = make_parser()
    with pytest.raises(config.SettingsError, match=r"--netuid \(from command line\): expected an integer"):
        config.resolve(parser.parse_args(["--netuid", "x1"]), environ={}, dotenv_path=None)


# The docs page that holds each process's table of settings.
SETTINGS_PAGES = {
    "miner": "docs/miner.md",
    "inference": "docs/miner.md",
    "validator": "docs/validator.md",
    "api": "docs/api.md",
    "evaluate": "docs/evaluation.md",
}


def test_each_process_page_holds_the_table_of_the_settings_it_reads():
    assert set(SETTINGS_PAGES) == set(config.ROLES)
    for role, page in SETTINGS_PAGES.items():
        table = config.settings_table(role)
        assert table in (ROOT / page).read_text(), (
            f"{page}: the table of {role}'s settings is not `quasar config --table {role}`'s: paste that there"
        )
        variables = [option.env for option in config.role_options(role) if option.env]
        assert variables and all(f"`{variable}`" in table for variable in variables)


def test_bad_dotenv_value_names_the_file(tmp_path):
    dotenv = tmp_path / ".env"
    dotenv.write_text("NETUID=twelve\n")
    with pytest.raises(config.SettingsError, match=r"NETUID \(from .*\.env\)"):
        config.resolve({}, environ={}, dotenv_path=dotenv)


def test_secret_is_kept_out_of_repr_and_listing():
    settings = config.resolve({}, environ={"GITHUB_TOKEN": "ghp_verysecret"}, dotenv_path=None)
    assert settings.github_token == "ghp_verysecret"
    assert "ghp_verysecret" not in repr(settings)
    assert "ghp_verysecret" not in str(settings.public_items())
    assert settings.secrets() == ["ghp_verysecret"]


@pytest.mark.parametrize("variable", ["GITHUB_TOKEN", "AGENT_API_KEY"])
def test_a_secret_too_short_to_mask_is_refused_without_its_value(variable):
    """A secret's every occurrence is masked in the logs: GITHUB_TOKEN=e turned every 'e' of the miner's
    log into '***' ('hotk***y fil*** ... do***s not ***xist'). Such a value is refused, naming the
    setting and not the value; 8 characters are taken, as is an empty one (not set)."""
    for value in ("Q", "EMPTY", "ghp_123"):
        with pytest.raises(config.SettingsError) as refused:
            config.resolve({}, environ={variable: value}, dotenv_path=None)
        assert str(refused.value).startswith(f"{variable} (from environment): {len(value)} character")
        assert "too short to keep out of the logs" in str(refused.value)
        assert value not in str(refused.value)
    for value in ("ghp_1234", ""):
        settings = config.resolve({}, environ={variable: value}, dotenv_path=None)
        assert settings.secrets() == ([value] if value else [])


def test_every_setting_has_one_option_and_the_example_is_current():
    assert sorted(o.key for o in config.OPTIONS) == sorted(config.settings_keys())
    assert (ROOT / ".env.example").read_text() == config.env_example()
    for option in config.OPTIONS:
        option.parse(option.default)  # every documented default is itself valid


def test_the_example_reads_in_an_80_column_editor():
    """A new operator edits .env in nano over SSH, which shows each line's first 80 columns: 60 of
    .env.example's comments were longer (up to 278 columns), the meaning of DEVICE, DATABASE_URL
    and ALLOW_LOCAL_FORKS past the edge. Each meaning is wrapped at words, whole."""
    lines = config.env_example().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not [line for line in lines if line.endswith("(flag")]  # a flag on the line of "(flag"
    for option in config.OPTIONS:
        if option.env is None:
            continue
        end = lines.index(f"{option.env}={option.default}")
        start = end
        while lines[start - 1].startswith("# "):
            start -= 1
        said = " ".join(line.removeprefix("# ") for line in lines[start:end])
        assert said.startswith(" ".join(option.help.split())), option.env


def test_help_shows_every_default_within_80_columns():
    """`quasar validator --help` left out the defaults that did not fit beside the setting's
    words: where the validator keeps its state (data/validator, under the folder it starts in),
    the lengths it benchmarks and its reference model; `quasar api serve --help` its database."""
    for role in config.ROLES:
        lines = config.settings_help(role).splitlines()
        assert max(len(line) for line in lines) <= 80, role
        for option in config.role_options(role):
            if not option.default or option.secret:
                continue
            name = option.flag or option.env
            at = next(index for index, line in enumerate(lines) if line.split()[:1] == [name])
            below = lines[at + 1] if at + 1 < len(lines) else ""
            shown = lines[at] + (below if below.startswith(" " * 30) else "")
            assert f"[{option.default}]" in shown, (role, name)


def test_neuron_rejects_bad_flag_with_clear_message():
    result = run_python(["-m", "neurons.validator", "--netuid", "nope"], ROOT, 60)
    assert result.returncode == 2
    assert "--netuid (from command line): expected an integer, got 'nope'" in " ".join(result.stderr.split())


def test_a_command_started_from_another_folder_reads_the_checkouts_env(tmp_path, monkeypatch):
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    checkout.mkdir()
    elsewhere.mkdir()
    (checkout / ".env").write_text("API_HOTKEY=5FromTheCheckout\n")
    monkeypatch.setattr(config.settings, "PROJECT_ROOT", checkout)
    monkeypatch.chdir(elsewhere)
    assert config.resolve({}, environ={}).api_hotkey == "5FromTheCheckout"
    # What every command does: parse its flags, then resolve.
    assert config.parse_args(make_parser(), [], environ={})[1].api_hotkey == "5FromTheCheckout"
    # A .env in the current folder is the one read.
    (elsewhere / ".env").write_text("API_HOTKEY=5FromHere\n")
    assert config.resolve({}, environ={}).api_hotkey == "5FromHere"


def test_the_envs_hugging_face_variables_reach_the_environment_below_its_own(tmp_path, monkeypatch):
    dotenv = tmp_path / ".env"
    dotenv.write_text("HF_HUB_OFFLINE=1\nHF_HOME=/from/dotenv\n")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", "/from/environment")
    settings = config.resolve({}, dotenv_path=dotenv)
    assert settings.hf_hub_offline is True
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["HF_HOME"] == "/from/environment"


# --- each process's --help lists the settings it reads ---

# Each process's entry module.
PROCESS_ENTRY = {
    "miner": "neurons.miner",
    "validator": "neurons.validator",
    "inference": "quasar.inference.__main__",
    "api": "quasar.api.__main__",
    "evaluate": "quasar.evaluate.__main__",
}


# Settings read in a module a process imports, by code that process never runs.
NOT_READ = {
    "api": {"validator_api_url"},  # quasar/api/lookup.py: how miners and validators find the API
    "evaluate": {"tie_epsilon"},  # quasar/scoring.py's own command line
    "miner": {"tie_epsilon"},
}


def imported_files(entry: str) -> set[Path]:
    """The files of this project ``entry`` imports, at any depth (function-level imports too)."""
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        file = module_file(ROOT, name)
        if file is None or file in seen:
            continue
        seen.add(file)
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
    return seen


def settings_read_by(entry: str) -> set[str]:
    text = "".join(file.read_text() for file in imported_files(entry))
    return {option.key for option in config.OPTIONS if re.search(rf"settings\.{option.key}\b", text)}


def test_every_setting_has_a_group_and_a_brief_and_every_role_names_real_settings():
    for option in config.OPTIONS:
        assert option.group in config.GROUPS, option.key
        assert option.brief and "``" not in option.brief, option.key
    for role, keys in config.ROLES.items():
        assert set(keys) <= set(config.OPTIONS_BY_KEY), role
        assert len(set(keys)) == len(keys), role


@pytest.mark.parametrize("role", sorted(PROCESS_ENTRY))
def test_a_process_help_lists_every_setting_its_code_reads(role):
    """A setting read by a process but missing from its --help would be invisible to its operator."""
    read = settings_read_by(PROCESS_ENTRY[role]) - NOT_READ.get(role, set())
    assert read, role
    assert read <= set(config.ROLES[role]), sorted(read - set(config.ROLES[role]))


@pytest.mark.parametrize(
    "command, role, most_lines",
    [
        (["neurons.miner"], "miner", 60),
        (["neurons.validator"], "validator", 60),
        (["quasar.api", "serve"], "api", 60),
        (["quasar.inference", "serve"], "inference", 60),
    ],
)
def test_help_shows_the_process_settings_grouped_in_plain_text_at_80_columns(command, role, most_lines):
    """One line a setting, and a second for a default that does not fit beside its words (none in
    the miner's): each process's help within 60 lines, the miner's 64 when its briefs were longer."""
    done = run_python(["-m", *command, "--help"], ROOT, 120, {**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= most_lines and max(map(len, lines)) <= 80, done.stdout
    assert "``" not in done.stdout
    shown = set(config.ROLES[role])
    for option in config.OPTIONS:
        name = option.flag or option.env
        listed = any(line.split()[:1] == [name] for line in lines)
        assert listed == (option.key in shown), (role, name)
    headings = [line[:-1] for line in lines if line.endswith(":") and line[:-1] in config.GROUPS]
    assert headings == sorted(set(headings), key=config.GROUPS.index)


def test_a_flag_another_process_reads_is_refused():
    parser = argparse.ArgumentParser(prog="miner")
    config.add_arguments(parser, "miner")
    with pytest.raises(SystemExit):
        parser.parse_args(["--database-url", "sqlite:///x.sqlite3"])
    assert parser.parse_args(["--eval.timeout", "9"]).eval_timeout == "9"
    with pytest.raises(ValueError, match="unknown process 'minr'"):
        config.add_arguments(argparse.ArgumentParser(), "minr")


def test_every_default_in_the_table_parses():
    for option in config.OPTIONS:
        option.parse(option.default)


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            '[x]\nkind = "str"\ndefault = ""\nbrief = "b"\nhelp = "h"\ncolour = "red"\n',
            r"wallet.toml \[x\]: unknown field\(s\) colour",
        ),
        (
            '[x]\nkind = "str"\ndefault = ""\nbrief = "b"\n',
            r"wallet.toml \[x\]: missing field 'help'",
        ),
        (
            '[x]\nkind = "int"\ndefault = "1"\nbrief = "b"\nhelp = "h"\n',
            r"wallet.toml \[x\]: kind int needs low",
        ),
        (
            '[x]\nkind = "colour"\ndefault = ""\nbrief = "b"\nhelp = "h"\n',
            r"wallet.toml \[x\]: unknown kind 'colour'",
        ),
    ],
)
def test_a_bad_settings_table_names_the_entry_and_field(tmp_path, entry, message):
    table = tmp_path / "wallet.toml"
    table.write_text(entry)
    with pytest.raises(ValueError, match=message):
        config.options.load_group(table, "wallet")


def settings_folder(tmp_path, files: dict[str, str]):
    """A copy of the settings folder with ``files`` (name: text) written over it (text None: removed)."""
    folder = tmp_path / "settings"
    shutil.copytree(config.options.SETTINGS_DIR, folder)
    for name, text in files.items():
        if text is None:
            (folder / name).unlink()
        else:
            (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize(
    "files, message",
    [
        ({"colours.toml": ""}, r"colours.toml name no group of GROUPS"),
        ({"scoring.toml": None}, r"the group 'scoring' has no file scoring.toml"),
        (
            {"scoring.toml": '[netuid]\nkind = "str"\ndefault = ""\nbrief = "b"\nhelp = "h"\n'},
            r"netuid defined in more than one file",
        ),
    ],
)
def test_a_bad_settings_folder_is_named(tmp_path, files, message):
    assert len(config.options.load_options(settings_folder(tmp_path, {}))) == len(config.OPTIONS)
    with pytest.raises(ValueError, match=message):
        config.options.load_options(settings_folder(tmp_path / "bad", files))
