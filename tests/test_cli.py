"""The ``quasar`` command (quasar/cli.py): every tool a subcommand, listed by role; each one's own
help legible at 80 columns; every command through the project's logging setup (secrets masked);
the older spellings (``python scripts/X.py``, ``python -m neurons.miner``, ``python -m
quasar.evaluate``...) still working as thin shims from any folder; and every ``quasar`` command the
README and docs/ print is a real one, with real flags."""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from quasar.cli import command_lines, main
from quasar.log import SafeRecords

ROOT = Path(__file__).resolve().parents[1]
QUASAR_SCRIPT = Path(sys.executable).with_name("quasar")
TOKEN = "ghp_cli_test_token_0123456789"
# Sub-commands of the tools that have them, each with its own help.
NESTED = [
    ("api", "serve"),
    ("api", "migrate"),
    ("api", "revision"),
    ("api", "publish-url"),
    ("inference", "serve"),
    ("devchain", "--path", "x.sqlite3", "register"),
    ("devchain", "--path", "x.sqlite3", "set-hyperparameter"),
]
# The older spellings that must keep working, and the usage line each prints.
SHIMS = {
    **{
        (f"scripts/{path.name}",): f"usage: python scripts/{path.name}"
        for path in sorted((ROOT / "scripts").glob("*.py"))
    },
    ("neurons/miner.py",): "usage: python -m neurons.miner",
    ("-m", "neurons.miner"): "usage: python -m neurons.miner",
    ("-m", "neurons.validator"): "usage: python -m neurons.validator",
    ("-m", "quasar"): "usage: quasar [-h] [--version] COMMAND",
    ("-m", "quasar.evaluate"): "usage: python -m quasar.evaluate",
    ("-m", "quasar.api"): "usage: python -m quasar.api",
    ("-m", "quasar.localnet"): "usage: python -m quasar.localnet",
    ("-m", "quasar.inference"): "usage: python -m quasar.inference",
    ("-m", "quasar.scoring"): "usage: python -m quasar.scoring",
    ("-m", "quasar.chain.devchain"): "usage: python -m quasar.chain.devchain",
    ("-m", "quasar.imports"): "usage: python -m quasar.imports",
}
# In the README and docs/: a line of a code block, or a code span, that starts with quasar (up to a comment).
DOCUMENTED_COMMAND = re.compile(r"^ *quasar ([^#\n]+)|`quasar ([^`]+)`", re.MULTILINE)


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


def help_of(words, capsys) -> str:
    """What ``quasar WORDS --help`` prints (it must exit 0)."""
    with pytest.raises(SystemExit) as exited:
        main([*words, "--help"])
    assert exited.value.code == 0, words
    return capsys.readouterr().out


def test_quasar_help_lists_every_command_by_role_in_80_columns():
    done = subprocess.run(
        [str(QUASAR_SCRIPT), "--help"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"}
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    sections, title = {}, ""
    for line in lines:
        if re.fullmatch(r"[A-Za-z ]+:", line):
            title = line[:-1]
        elif line.startswith("  ") and not line.startswith("   ") and title != "options":
            sections.setdefault(title, []).append(re.split(r"\s{2,}", line.strip())[0])
    assert sections.pop("positional arguments") == ["COMMAND", "ARGS"]
    assert sections == {
        "miner": ["starter-fork", "step1", "step2", "local-validator", "evaluate", "status", "miner", "inference"],
        "validator": ["validator", "check-sandbox"],
        "API and chain": ["api", "devchain"],
        "network": ["localnet"],
        "measurement": [
            "bench harness",
            "bench kernel",
            "bench floor",
            "bench reference",
            "bench inference",
            "bench neighbours",
            "bench api-load",
            "bench api-profile",
            "bench simulate-subnet",
            "bench api-month",
            "bench validator-month",
            "bench dashboard-pages",
        ],
        "other": ["imports", "scoring", "config"],
    }
    assert [" ".join(words) for words in command_lines()] == [name for names in sections.values() for name in names]


@pytest.mark.parametrize("words", [*command_lines(), *NESTED], ids=" ".join)
def test_each_commands_help_is_its_own_and_fits_80_columns(words, capsys):
    text = help_of(words, capsys)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(line for line in lines if len(line) > 80)
    named = [
        word
        for index, word in enumerate(words)
        if not word.startswith("-") and not (index and words[index - 1].startswith("-"))
    ]
    if words != ("imports",):  # the import validator's parser names itself python -m quasar.imports
        assert lines[0].startswith(f"usage: quasar {' '.join(named)} "), lines[0]
    assert "``" not in text  # plain text, not reStructuredText


def test_an_options_value_is_named_as_its_help_names_it(capsys):
    """`quasar check-sandbox --help` said `--out OUT  also write DIR/sandbox.json`."""
    assert "--out DIR " in help_of(["check-sandbox"], capsys)


def test_a_wrong_command_names_what_was_wrong(capsys):
    for argv, message in (
        ([], "name a command (`quasar --help` lists them)"),
        (["stpe1"], "unknown command 'stpe1' (`quasar --help` lists them)"),
        (["bench"], "name a command (`quasar bench --help` lists them)"),
        (["bench", "kernal"], "unknown command 'kernal' (`quasar bench --help` lists them)"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("quasar ")


def test_no_help_loads_torch_or_the_commands_modules():
    code = (
        "import sys; from quasar.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m in ('torch', 'bittensor') or m.startswith(('quasar.bench', "
        "'quasar.tools', 'quasar.api', 'quasar.evaluate'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout + done.stderr


@pytest.fixture
def quiet_world(tmp_path, monkeypatch):
    """A folder without .env, a home without wallets, and a GitHub token in the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_USERNAME", "alice")
    monkeypatch.setenv("DEVICE", "cpu")
    for name in ("VALIDATOR_API_URL", "WALLET_PATH", "WALLET_NAME", "SUBTENSOR_NETWORK", "LOGGING_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # No redacting handler from an earlier test in this process: the command must install its own.
    root.handlers[:] = [
        handler for handler in handlers if not any(isinstance(found, SafeRecords) for found in handler.filters)
    ]
    yield tmp_path
    root.handlers[:] = handlers
    root.setLevel(level)


# (the command, whether it reads the settings, and so knows their secrets), each failing or ending
# fast after it set up logging.
SETUPS = [
    (["starter-fork", "fork"], False),
    (["step1", "--repo-path", "absent", "--skip-setup"], True),
    (["step2", "--repo-path", "."], True),
    (["local-validator", "--repo-path", "absent", "--seq-len", "64", "--device", "cpu"], True),
    (["evaluate", "absent", "--target", "64", "--device", "cpu"], True),
    (["status", "--wallet.path", "wallets"], True),
    (["miner", "--wallet.path", "wallets"], True),
    (["inference", "serve", "--wallet.path", "wallets"], True),
    (["validator", "--wallet.path", "wallets"], True),
    (["check-sandbox", "--device", "tpu"], True),
    (["api", "migrate", "--database-url", "sqlite:///api.sqlite3"], True),
    (["devchain", "--path", "chain.sqlite3", "block"], False),
    (["imports", "."], False),
    (["scoring", "--input", str(ROOT / "examples" / "results.json")], True),
    (["config"], False),
]


@pytest.mark.parametrize(("argv", "knows_secrets"), SETUPS, ids=[argv[0] for argv, _ in SETUPS])
def test_every_command_logs_through_the_projects_setup_with_secrets_masked(argv, knows_secrets, quiet_world):
    """A command that configured logging itself (logging.basicConfig) would print a token it logged:
    each installs quasar.log's handler, which masks the settings' secrets."""
    try:
        main(argv)
    except SystemExit:
        pass  # a refusal through argparse, after the set-up
    filters = [f for handler in logging.getLogger().handlers for f in handler.filters if isinstance(f, SafeRecords)]
    assert len(filters) == 1, f"quasar {argv[0]} did not set up logging through quasar.log"
    if knows_secrets:
        assert TOKEN in filters[0].safe.secrets
        record = logging.LogRecord("quasar.test", logging.WARNING, __file__, 1, "pushing with %s", (TOKEN,), None)
        filters[0].filter(record)
        assert record.getMessage() == "pushing with ***"


def test_the_older_spellings_still_work_from_any_folder(tmp_path):
    """The scripts and ``python -m`` forms the README used to give, run from a folder outside the
    checkout with no PYTHONPATH: the installed package answers, no sys.path edit needed."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    def run(spelling: tuple[str, ...]) -> subprocess.CompletedProcess:
        arguments = [str(ROOT / spelling[0]), *spelling[1:]] if spelling[0].endswith(".py") else list(spelling)
        return subprocess.run(
            [sys.executable, *arguments, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(SHIMS, pool.map(run, SHIMS), strict=True))
    for spelling, usage in SHIMS.items():
        assert done[spelling].returncode == 0, (spelling, done[spelling].stderr[-2000:])
        assert done[spelling].stdout.startswith(usage), (spelling, done[spelling].stdout[:200])
    config = subprocess.run(
        [sys.executable, "-m", "quasar.config"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert config.stdout == (ROOT / ".env.example").read_text()


def test_scripts_and_neurons_are_thin_shims_without_path_edits():
    shims = [*sorted((ROOT / "scripts").glob("*.py")), ROOT / "neurons" / "miner.py", ROOT / "neurons" / "validator.py"]
    for path in shims:
        text = path.read_text()
        assert "sys.path" not in text and len(text.splitlines()) <= 10, path
        assert re.search(r"^from quasar(\.\w+)+ import main$", text, re.MULTILINE), path
    for path in [*shims, *ROOT.joinpath("quasar").rglob("*.py")]:
        assert "logging.basicConfig" not in path.read_text(), path


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in DOCUMENTED_COMMAND.finditer(path.read_text()):
            line = next(group for group in match.groups() if group).strip().replace("[", "").replace("]", "")
            found.append((path.name, shlex.split(line.rstrip("\\"))))
    return found


def test_the_readme_and_docs_name_real_commands_and_flags(capsys):
    commands = documented_commands()
    assert len(commands) >= 10, commands
    known = {words[0] for words in command_lines()}
    for source, words in commands:
        if words[0] in ("--help", "--version", "COMMAND"):  # the command itself, explained
            continue
        assert words[0] in known, f"{source}: quasar {' '.join(words)}: no command {words[0]!r}"
        # The help of every prefix that parses: the command's, and its sub-command's (api serve, devchain ... register).
        helps = []
        for end in range(1, len(words) + 1):
            try:
                main([*words[:end], "--help"])
            except SystemExit as exited:
                output = capsys.readouterr()
                if exited.code == 0:
                    helps.append(output.out)
        assert helps, f"{source}: quasar {' '.join(words)}"
        for flag in (word.split("=")[0] for word in words if word.startswith("--")):
            assert any(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) for text in helps), (
                f"{source}: quasar {' '.join(words)}: no flag {flag}"
            )
