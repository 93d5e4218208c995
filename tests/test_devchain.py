"""The embedded dev chain: registration, blocks from a stored genesis, weights, endpoints, many processes."""

import math
import subprocess
import sys
import threading
import time

import bittensor as bt
import pytest
from bittensor.sp_core import Keypair

from quasar import config
from quasar.chain import ChainError, Endpoint
from quasar.chain.devchain import DevChain
from quasar.chain.factory import connect

SLOW_BLOCKS = 1e6  # seconds per block: blocks move only through advance()


def address() -> str:
    return Keypair.create_from_mnemonic(Keypair.generate_mnemonic()).ss58_address


@pytest.fixture
def chain(tmp_path):
    return DevChain(tmp_path / "chain.sqlite3", netuid=5, block_time_s=SLOW_BLOCKS)


@pytest.fixture(scope="module")
def wallets(tmp_path_factory):
    root = tmp_path_factory.mktemp("wallets")
    made = []
    for name in ("validator", "miner"):
        wallet = bt.Wallet(name=name, hotkey="default", path=str(root))
        wallet.create_new_coldkey(use_password=False, overwrite=True, suppress=True)
        wallet.create_new_hotkey(use_password=False, overwrite=True, suppress=True)
        made.append(wallet)
    return made


def test_register_assigns_lowest_free_uids_and_refuses_duplicates(chain):
    hotkeys = [address() for _ in range(3)]
    coldkey = address()
    assert [chain.register(h, coldkey, stake=float(i)) for i, h in enumerate(hotkeys)] == [0, 1, 2]
    metagraph = chain.metagraph()
    assert [n.hotkey for n in metagraph.neurons] == hotkeys
    assert metagraph.by_uid(2).stake == 2.0 and metagraph.netuid == 5
    assert chain.is_registered(hotkeys[1]) and not chain.is_registered(address())
    with pytest.raises(ChainError, match="already registered"):
        chain.register(hotkeys[0], coldkey)
    with pytest.raises(ChainError, match="not an ss58 address"):
        chain.register("5NotAnAddress", coldkey)


def test_validator_permit_is_stored_and_can_change(chain):
    validator, miner = address(), address()
    chain.register(validator, address(), stake=1000.0, validator_permit=True)
    chain.register(miner, address())
    assert chain.has_validator_permit(validator) and not chain.has_validator_permit(miner)
    chain.set_validator_permit(miner, True)
    chain.set_validator_permit(validator, False)
    assert chain.has_validator_permit(miner) and not chain.has_validator_permit(validator)
    with pytest.raises(ChainError, match="not registered"):
        chain.set_validator_permit(address(), True)


def test_blocks_advance_with_time_from_the_stored_genesis(tmp_path):
    path = tmp_path / "fast.sqlite3"
    fast = DevChain(path, block_time_s=0.05)
    first = fast.current_block()
    time.sleep(0.3)
    later = fast.current_block()
    assert 4 <= later - first <= 8
    # A second handle (another process would do the same) reads the stored genesis and block time:
    # its block number agrees, whatever block time it asks for.
    again = DevChain(path, block_time_s=12.0)
    assert again.block_time_s == 0.05
    assert abs(again.current_block() - fast.current_block()) <= 1


def test_advance_moves_exactly_and_survives_reopening(chain):
    start = chain.current_block()
    assert chain.advance(100) == start + 100
    assert chain.current_block() == start + 100
    with pytest.raises(ChainError, match="only moves forward"):
        chain.advance(-1)
    assert DevChain(chain.path).current_block() == start + 100  # never reset at open


def test_netuid_of_an_existing_file_cannot_change(chain):
    with pytest.raises(ChainError, match="holds netuid 5, not 7"):
        DevChain(chain.path, netuid=7)


def test_set_weights_checks_setter_and_values_and_normalizes(chain, wallets):
    validator, miner = wallets
    assert chain.register_wallet(validator, stake=1e4, validator_permit=True) == 0
    assert chain.register_wallet(miner) == 1
    chain.set_weights(validator, {0: 1.0, 1: 3.0}, version_key=7)
    assert chain.weights() == {0: {0: 0.25, 1: 0.75}}
    chain.set_weights(validator, {1: 2.0}, version_key=7)  # replaces the setter's previous weights
    assert chain.weights() == {0: {1: 1.0}}
    with pytest.raises(ChainError, match="no validator permit"):
        chain.set_weights(miner, {0: 1.0}, version_key=7)
    for bad in ({0: -0.1, 1: 1.0}, {0: math.nan}, {0: math.inf}, {0: 0.0}, {}):
        with pytest.raises(ChainError):
            chain.set_weights(validator, bad, version_key=7)
    with pytest.raises(ChainError, match="unregistered uids \\[9\\]"):
        chain.set_weights(validator, {9: 1.0}, version_key=7)
    assert chain.weights() == {0: {1: 1.0}}


def test_set_weights_by_unregistered_wallet_is_refused(chain, wallets):
    validator, _ = wallets
    with pytest.raises(ChainError, match="not registered"):
        chain.set_weights(validator, {0: 1.0}, version_key=1)


def test_publish_endpoint(chain, wallets):
    validator, miner = wallets
    with pytest.raises(ChainError, match="not registered"):
        chain.publish_endpoint(miner, "127.0.0.1", 8001)
    chain.register_wallet(miner)
    chain.publish_endpoint(miner, "127.0.0.1", 8001)
    assert chain.neuron(miner.hotkey.ss58_address).endpoint == Endpoint("127.0.0.1", 8001)
    with pytest.raises(ChainError, match="invalid endpoint"):
        chain.publish_endpoint(miner, "127.0.0.1", 70000)


def test_owner_uid_defaults_to_uid0_and_follows_set_owner(chain):
    with pytest.raises(ChainError, match="no subnet owner"):
        chain.owner_uid()
    first, second = address(), address()
    chain.register(first, address())
    chain.register(second, address())
    assert chain.owner_uid() == 0
    chain.set_owner(second)
    assert chain.owner_uid() == 1


def test_concurrent_registrations_from_many_handles_get_distinct_uids(chain):
    hotkeys = [address() for _ in range(24)]
    uids, errors = [], []

    def register(batch):
        handle = DevChain(chain.path)  # its own connections, like another process
        for hotkey in batch:
            try:
                uids.append(handle.register(hotkey, hotkey))
            except ChainError as error:
                errors.append(error)

    threads = [threading.Thread(target=register, args=(hotkeys[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(uids) == list(range(24))
    assert {n.hotkey for n in chain.metagraph().neurons} == set(hotkeys)


def test_cli_in_another_process_shares_the_file(chain):
    hotkey, coldkey = address(), address()
    run = [sys.executable, "-m", "quasar.chain.devchain", "--path", str(chain.path)]
    result = subprocess.run([*run, "register", "--hotkey", hotkey, "--coldkey", coldkey, "--validator"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
    assert chain.has_validator_permit(hotkey)
    result = subprocess.run([*run, "register", "--hotkey", hotkey, "--coldkey", coldkey],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "already registered" in result.stderr and "Traceback" not in result.stderr


def test_factory_builds_the_dev_chain_from_settings(tmp_path):
    settings = config.resolve({"network": "devchain", "devchain_path": str(tmp_path / "c.sqlite3"),
                               "netuid": "3", "devchain_block_time": "0.5"}, environ={}, dotenv_path=None)
    chain = connect(settings)
    assert isinstance(chain, DevChain) and chain.netuid == 3 and chain.block_time_s == 0.5
    finney = config.resolve({"network": "finney"}, environ={}, dotenv_path=None)
    assert not isinstance(connect(finney), DevChain)
