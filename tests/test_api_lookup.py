"""Finding the submission API: the owner publishes its URL and hotkey in the subnet identity (the dev
chain here, with finney's rules), miners and validators read it when VALIDATOR_API_URL is empty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from api_fixtures import SLOW_BLOCKS, ApiServer, api_config
from quasar import config
from quasar.api.client import ApiClient
from quasar.api.devdb import free_port
from quasar.api.lookup import ApiFollower, ApiNotFound, find_api, publish_api
from quasar.chain import ApiLocation, ChainError
from quasar.chain.devchain import DevChain
from quasar.localnet.host import make_wallet

ROOT = Path(__file__).resolve().parent.parent
NETUID = 24


@pytest.fixture(scope="module")
def wallets(tmp_path_factory):
    root = tmp_path_factory.mktemp("wallets")
    return {name: make_wallet(root, name) for name in ("owner", "api", "miner", "stranger")}


@pytest.fixture
def chain(tmp_path, wallets):
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=NETUID, block_time_s=SLOW_BLOCKS)
    chain.register_wallet(wallets["owner"])
    chain.register_wallet(wallets["miner"])
    return chain


def settings_for(chain: DevChain, **values: str) -> config.Settings:
    return config.resolve(
        {"network": "devchain", "devchain_path": str(chain.path), "netuid": str(NETUID), **values},
        environ={},
        dotenv_path=None,
    )


def test_validator_api_url_wins_and_the_chain_is_read_only_without_it(chain, wallets):
    chain.publish_api_location(wallets["owner"], ApiLocation("https://api.quasar.example", "5Published"))
    pinned = find_api(settings_for(chain, validator_api_url="http://10.0.0.2:8000", api_hotkey="5Pinned"), chain)
    assert (pinned.url, pinned.hotkey, pinned.source) == ("http://10.0.0.2:8000", "5Pinned", "VALIDATOR_API_URL")
    found = find_api(settings_for(chain), chain)
    assert (found.url, found.hotkey) == ("https://api.quasar.example", "5Published")
    assert found.source == f"subnet {NETUID}'s identity on devchain"
    assert find_api(settings_for(chain, api_hotkey="5Pinned"), chain).hotkey == "5Pinned"  # a pinned key still wins


def test_nothing_published_and_nothing_set_says_what_to_do(chain, wallets):
    with pytest.raises(ApiNotFound) as missing:
        find_api(settings_for(chain), chain)
    assert str(missing.value) == (
        f"VALIDATOR_API_URL is empty and subnet {NETUID}'s identity on devchain names no submission API: set "
        "VALIDATOR_API_URL (or --api.url), or ask the subnet owner to publish it (python -m quasar.api publish-url URL)"
    )
    chain.publish_api_location(wallets["owner"], ApiLocation("javascript:alert(1)"))
    with pytest.raises(ApiNotFound, match="is not an http:// or https:// URL"):
        find_api(settings_for(chain), chain)


def test_publishing_checks_the_api_answers_and_needs_the_owners_coldkey(chain, wallets, tmp_path):
    api_hotkey = wallets["api"].hotkey.ss58_address
    with pytest.raises(ApiNotFound, match="does not answer GET /health"):
        publish_api(chain, wallets["owner"], f"http://127.0.0.1:{free_port()}")
    with ApiServer(api_config(api_hotkey), chain, f"sqlite:///{tmp_path}/api.sqlite3") as server:
        with pytest.raises(ApiNotFound, match=f"signs as {api_hotkey}, not API_HOTKEY"):
            publish_api(chain, wallets["owner"], server.url, api_hotkey=wallets["stranger"].hotkey.ss58_address)
        with pytest.raises(ChainError, match="NotSubnetOwner"):
            publish_api(chain, wallets["miner"], server.url)
        assert chain.api_location() is None
        assert publish_api(chain, wallets["owner"], server.url + "/", api_hotkey) == ApiLocation(server.url, api_hotkey)
    assert chain.api_location() == ApiLocation(server.url, api_hotkey)


def test_the_owners_command_publishes_and_a_miner_finds_the_api_from_the_chain(chain, wallets, tmp_path):
    api_hotkey = wallets["api"].hotkey.ss58_address
    wallet_root = str(Path(wallets["owner"].path))
    chain_flags = ["--subtensor.network", "devchain", "--devchain.path", str(chain.path), "--netuid", str(NETUID)]
    environment = {key: value for key, value in os.environ.items() if key not in ("VALIDATOR_API_URL", "API_HOTKEY")}
    environment["PYTHONPATH"] = str(ROOT)

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", *command], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120
        )

    with ApiServer(api_config(api_hotkey), chain, f"sqlite:///{tmp_path}/api.sqlite3") as server:
        # The miner's status command has no --api.url, and nothing names the API yet.
        status = ["neurons.miner", "status", "--wallet.path", wallet_root, "--wallet.name", "miner", *chain_flags]
        lost = run(*status)
        assert lost.returncode == 1 and "names no submission API" in lost.stderr
        publish = ["quasar.api", "publish-url", server.url, "--wallet.path", wallet_root, *chain_flags]
        unnamed = run(*publish)
        assert unnamed.returncode == 1 and "name the subnet owner's wallet" in unnamed.stderr
        published = run(*publish, "--wallet.name", "owner")
        assert published.returncode == 0, published.stderr
        assert " ".join(published.stdout.split()) == (  # wrapped to the terminal, 80 columns here
            f"published {server.url} (API hotkey {api_hotkey}) on subnet {NETUID} of devchain"
        )
        assert max(len(line) for line in published.stdout.splitlines()) <= 80, published.stdout
        found = run(*status)  # now it reads the URL from the chain
        assert found.returncode == 0, found.stderr
        assert "no submissions yet" in found.stdout


def test_a_running_neuron_follows_the_api_where_the_owner_moves_it(chain, wallets, caplog):
    """ApiFollower (the validator's sync phase, the miner's cycle): the location is read again at most
    every ``every_s``; a move (URL or hotkey) moves the client, said in one line; a location that
    cannot be read leaves the client where it is, said once; VALIDATOR_API_URL pins it for good."""
    caplog.set_level("WARNING", logger="quasar.api.lookup")
    owner, now = wallets["owner"], [0.0]
    chain.publish_api_location(owner, ApiLocation("https://old.example", "5Old"))
    settings = settings_for(chain)
    target = find_api(settings, chain)
    with ApiClient(target.url, api_hotkey=target.hotkey) as client:
        follow = ApiFollower(settings, chain, client, target, every_s=300, clock=lambda: now[0])
        chain.publish_api_location(owner, ApiLocation("https://new.example", "5New"))
        now[0] = 299.0
        follow()
        assert (client.base_url, client.api_hotkey) == ("https://old.example", "5Old")
        now[0] = 300.0
        follow()
        assert (client.base_url, client.api_hotkey) == ("https://new.example", "5New")
        chain.publish_api_location(owner, ApiLocation("ftp://wrong.example", "5New"))
        for now[0] in (600.0, 900.0):
            follow()
        assert client.base_url == "https://new.example"
    said = [record.getMessage() for record in caplog.records]
    assert said == [
        "the subnet owner moved the submission API: now https://new.example (hotkey 5New), was "
        "https://old.example (hotkey 5Old)",
        "cannot read where the submission API is; staying on https://new.example: the API URL published in "
        f"subnet {NETUID}'s identity on devchain, 'ftp://wrong.example', is not an http:// or https:// URL",
    ]
    pinned_settings = settings_for(chain, validator_api_url="http://10.0.0.2:8000")
    pinned = find_api(pinned_settings, chain)
    with ApiClient(pinned.url) as client:
        ApiFollower(pinned_settings, chain, client, pinned, every_s=0)()
        assert client.base_url == "http://10.0.0.2:8000"
