"""The validator's, the miner's and the submission API's refusals at start, as a new validator or
subnet owner reads them in an 80-column terminal: wrapped at words, a flag with its value."""

from __future__ import annotations

import pytest

from quasar.api import __main__ as api_main
from quasar.miner import cli as miner_cli
from quasar.validator import cli as validator_cli


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


def test_a_database_that_refuses_the_connection_is_said_within_80_columns(terminal, capsys, tmp_path):
    """A PostgreSQL server not running: psycopg's message on two lines of 154 columns and a tab,
    then SQLAlchemy's link to its page about the error class."""
    status = api_main.main(
        [
            "serve",
            "--subtensor.network",
            "devchain",
            "--devchain.path",
            str(tmp_path / "devchain.sqlite3"),
            "--database-url",
            "postgresql://quasar@127.0.0.1:1/quasar",
            "--api.hotkey",
            "5CSbsWarESZtNAWFpTaTcMFqBvpD7ULQbDfqQuYgKCCPfotw",
        ],
        prog="quasar api",
    )
    assert status == 1
    lines, text = refusal(capsys, "quasar api serve")
    assert max(len(line) for line in lines) <= 80, lines
    assert "\t" not in "".join(lines) and "sqlalche.me" not in text, lines
    assert text.startswith(
        "quasar api serve: error: database postgresql://quasar@127.0.0.1:1/quasar: connection to server at"
    ), text
    assert "Connection refused" in text, text
