"""Shared pieces of the submission API tests: wallets, a dev chain, a real server on 127.0.0.1, and the
two database backends (an SQLite file, and a throwaway PostgreSQL server started once per session).

Import the fixtures into a test module (``from api_fixtures import ...``). PostgreSQL tests skip
locally when no server can be started, and fail under CI (``CI=true``), where ./scripts/test.sh
has installed it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import bittensor as bt
import httpx
import pytest

from quasar import config
from quasar.api.app import create_app
from quasar.api.client import ApiClient, ApiClientError
from quasar.api.db import Database
from quasar.api.devdb import PostgresUnavailable, TemporaryPostgres, ThreadedServer
from quasar.api.service import ApiConfig
from quasar.chain.devchain import DevChain
from quasar.localnet.host import make_wallet

BACKENDS = ["sqlite", "postgresql"]
SLOW_BLOCKS = 1e6  # seconds per block: the dev chain moves only through advance()
FORK = "https://github.com/miner/flash-linear-attention"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def commit_of(n: int) -> str:
    """A 40-hex-digit commit hash made from ``n``."""
    return f"{n:040x}"


def refused(call, status: int, *fragments: str) -> str:
    """Run ``call``; it must fail with ``status`` and a detail containing every fragment."""
    with pytest.raises(ApiClientError) as raised:
        call()
    assert raised.value.status == status, raised.value.detail
    for fragment in fragments:
        assert fragment in raised.value.detail, raised.value.detail
    return raised.value.detail


def api_config(api_hotkey: str, **overrides) -> ApiConfig:
    """The API's settings for tests: the shipped defaults (config.resolve, no .env or environment)
    but for a rate limit no test reaches and the smallest quorum there is (one validator holding
    half of the stake). The ``chain`` fixture gives v1 three quarters of the stake: v1's word alone
    settles a submission, as tests of everything but the consensus want (tests/test_api_consensus.py
    runs the defaults' quorum with three validators)."""
    changed = {"submissions_per_hour": "1000", "quorum_stake_share": "0.5", "quorum_min_validators": "1"}
    settings = config.resolve({"api_hotkey": api_hotkey, **changed}, environ={}, dotenv_path=None)
    return replace(ApiConfig.from_settings(settings), **overrides)


class Clock:
    """Real time plus an offset a test can move forward (leases, bans, rate windows)."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class ApiServer(ThreadedServer):
    """The API app over its own :class:`Database`, served by uvicorn in a thread on a free 127.0.0.1 port."""

    def __init__(
        self,
        config: ApiConfig,
        chain: DevChain,
        database_url: str,
        clock: Callable[[], float] = time.time,
        fast_lane: bool = True,
    ):
        self.database = Database(database_url)
        super().__init__(create_app(config, chain, self.database, clock, fast_lane))

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        self.database.dispose()


@pytest.fixture(scope="session")
def wallets(tmp_path_factory) -> dict[str, bt.Wallet]:
    """api (the receiver), miners a/b/c, validators v1/v2/v3, and stranger (never registered)."""
    root = tmp_path_factory.mktemp("wallets")
    return {name: make_wallet(root, name) for name in ("api", "a", "b", "c", "v1", "v2", "v3", "stranger")}


@pytest.fixture
def chain(tmp_path, wallets) -> DevChain:
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=SLOW_BLOCKS)
    for name in ("a", "b", "c"):
        chain.register_wallet(wallets[name])
    chain.register_wallet(wallets["v1"], stake=3e4, validator_permit=True)
    chain.register_wallet(wallets["v2"], stake=1e4, validator_permit=True)
    return chain


@pytest.fixture(scope="session")
def postgres() -> Iterator[TemporaryPostgres]:
    server = TemporaryPostgres(durable=False)
    try:
        server.start()
    except PostgresUnavailable as error:
        reason = f"PostgreSQL unavailable: {error}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason + " (./scripts/test.sh installs it)")
    yield server
    server.stop()


@pytest.fixture
def database(database_url) -> Iterator[Database]:
    """A fresh database on each backend, migrated."""
    database = Database(database_url)
    database.upgrade()
    yield database
    database.dispose()


@pytest.fixture(params=BACKENDS)
def database_url(request, tmp_path) -> str:
    """A fresh, empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/api.sqlite3"
    postgres = request.getfixturevalue("postgres")
    return postgres.create_database(f"quasar_{uuid.uuid4().hex[:12]}")


@dataclass
class Api:
    """A running API with its chain, wallets, clock and a signed client per wallet."""

    server: ApiServer
    chain: DevChain
    wallets: dict[str, bt.Wallet]
    clock: Clock
    clients: dict[str, ApiClient] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def hotkey(self) -> str:
        return self.wallets["api"].hotkey.ss58_address

    def client(self, name: str, **headers: str) -> ApiClient:
        key = name + repr(sorted(headers.items()))
        if key not in self.clients:
            self.clients[key] = ApiClient(
                self.url, self.wallets[name], api_hotkey=self.hotkey, http=httpx.Client(timeout=30, headers=headers)
            )
        return self.clients[key]


@pytest.fixture
def start_api(chain, wallets, database_url) -> Iterator[Callable[..., Api]]:
    """Start the API with config overrides (``start_api(submissions_per_hour=3)``); stopped after the test."""
    running: list[Api] = []

    def start(**overrides) -> Api:
        clock = Clock()
        server = ApiServer(api_config(wallets["api"].hotkey.ss58_address, **overrides), chain, database_url, clock)
        api = Api(server.__enter__(), chain, wallets, clock)
        running.append(api)
        return api

    yield start
    for api in running:
        for client in api.clients.values():
            client.close()
        api.server.__exit__(None, None, None)
