"""Opt-in: the chain layer against a real subtensor node, for an operator who runs one.

    SUBTENSOR_TEST_ENDPOINT=ws://127.0.0.1:9944 python -m pytest tests/test_subtensor_node.py -v

Skipped without ``SUBTENSOR_TEST_ENDPOINT``. The node must hold a funded account whose coldkey is
``SUBTENSOR_TEST_OWNER_URI`` (default ``//Alice``, funded on subtensor's localnet image, e.g.
``docker run -p 9944:9944 ghcr.io/opentensor/subtensor-localnet:devnet-ready``). The test creates a
subnet owned by it (or uses ``SUBTENSOR_TEST_NETUID``, which it must own), registers a miner
hotkey, and checks, through :class:`~quasar.chain.bittensor_chain.BittensorChain`:

- hyperparameters and the block time read from the chain;
- ``ServeAxon``: an endpoint published and read back, and the loopback address refused;
- plain ``SetWeights`` (commit-reveal off): set at once, with a uid that changed hands refused first;
- commit-reveal ``SetWeights``: committed, invisible, then revealed by the chain (the node's drand
  pallet must receive pulses: a node without internet access never reveals);
- the API location: published in the subnet identity by the owner's coldkey and read back.

The subnet owner's hotkey sets the weights: the chain lets the owner set weights without a permit
or stake, so no epoch has to hand out permits first.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

ENDPOINT = os.environ.get("SUBTENSOR_TEST_ENDPOINT", "")

pytestmark = pytest.mark.skipif(
    not ENDPOINT, reason="set SUBTENSOR_TEST_ENDPOINT=ws://HOST:PORT to run against a subtensor node"
)

OWNER_URI = os.environ.get("SUBTENSOR_TEST_OWNER_URI", "//Alice")
TEMPO = 10  # blocks: a reveal comes within seconds on a fast-block node
SETUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class DevKeys:
    """A wallet made of dev keypairs (the SDK takes any object with these three keys)."""

    coldkey: object
    coldkeypub: object
    hotkey: object


def keys(cold_uri: str, hot_uri: str) -> DevKeys:
    from bittensor.sp_core import Keypair

    cold = Keypair.create_from_uri(cold_uri)
    return DevKeys(cold, cold, Keypair.create_from_uri(hot_uri))


def succeeded(result) -> None:
    assert result.success is True, f"{result.message} {result.error}"


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


@pytest.fixture(scope="module")
def node():
    """The SDK client, the owner's and the miner's keys, and the subnet's netuid."""
    import bittensor as bt
    from bittensor.intents import BurnedRegister, RegisterSubnet, SetHyperparameter, StartCall

    client = bt.Subtensor(ENDPOINT)
    owner = keys(OWNER_URI, f"{OWNER_URI}//quasar-owner-hotkey")
    miner = keys(OWNER_URI, f"{OWNER_URI}//quasar-miner-hotkey-{int(time.time())}")
    if os.environ.get("SUBTENSOR_TEST_NETUID"):
        netuid = int(os.environ["SUBTENSOR_TEST_NETUID"])
    else:
        created = client.execute(RegisterSubnet(hotkey_ss58=owner.hotkey.ss58_address), owner)
        succeeded(created)
        netuid = int(created.data["netuid"])
        # A new subnet starts inactive until its owner's start_call, allowed after the chain's delay.
        wait_for(
            lambda: client.execute(StartCall(netuid=netuid), owner).success,
            SETUP_TIMEOUT_S,
            f"start_call of subnet {netuid}",
            poll_s=5.0,
        )
    succeeded(client.execute(BurnedRegister(netuid=netuid, hotkey_ss58=miner.hotkey.ss58_address), miner))
    succeeded(client.execute(SetHyperparameter(netuid=netuid, name="tempo", value=TEMPO), owner))
    yield client, owner, miner, netuid
    client.close()


@pytest.fixture(scope="module")
def chain(node):
    from quasar.chain.bittensor_chain import BittensorChain

    _, _, _, netuid = node
    return BittensorChain("local", netuid, ENDPOINT, retries=2, backoff_s=2.0)


def set_hyperparameter(node, name: str, value) -> None:
    from bittensor.intents import SetHyperparameter

    client, owner, _, netuid = node
    succeeded(client.execute(SetHyperparameter(netuid=netuid, name=name, value=value), owner))


def set_weights_when_allowed(chain, wallet, weights, hotkeys):
    """Set weights, waiting out the rate limit the chain states."""
    from quasar.chain import RateLimited

    while True:
        try:
            return chain.set_weights(wallet, weights, 1, hotkeys)
        except RateLimited as limited:
            time.sleep(((limited.blocks_to_wait or 1) + 1) * chain.block_time_s)


def owner_row(node, chain) -> dict[int, float]:
    client, owner, _, netuid = node
    uid = chain.metagraph().by_hotkey(owner.hotkey.ss58_address).uid
    return client.weights.weights(netuid).get(uid, {})


def test_hyperparameters_and_block_time(chain):
    rules = chain.hyperparameters()
    assert rules.tempo == TEMPO and rules.max_weight_limit >= 1 and rules.weights_rate_limit >= 0
    assert chain.block_time_s in (0.25, 12.0)


def test_serve_axon_publishes_and_the_loopback_address_is_refused(node, chain):
    from quasar.chain import ChainError, Endpoint

    _, _, miner, _ = node
    chain.publish_endpoint(miner, "198.51.100.7", 8001)
    assert chain.neuron(miner.hotkey.ss58_address).endpoint == Endpoint("198.51.100.7", 8001)
    with pytest.raises(ChainError, match="InvalidIpAddress"):
        chain.publish_endpoint(miner, "127.0.0.1", 8001)


def test_plain_set_weights(node, chain):
    from quasar.chain import UidsChanged

    _, owner, miner, _ = node
    set_hyperparameter(node, "commit_reveal_weights_enabled", False)
    graph = chain.metagraph()
    miner_uid = graph.by_hotkey(miner.hotkey.ss58_address).uid
    with pytest.raises(UidsChanged):
        chain.set_weights(owner, {miner_uid: 1.0}, 1, {miner_uid: owner.hotkey.ss58_address})
    submission = set_weights_when_allowed(chain, owner, {miner_uid: 1.0}, {miner_uid: miner.hotkey.ss58_address})
    assert not submission.committed
    assert wait_for(lambda: owner_row(node, chain).get(miner_uid) == pytest.approx(1.0), 60, "the weights")


def test_commit_reveal_set_weights(node, chain):
    _, owner, miner, _ = node
    set_hyperparameter(node, "commit_reveal_weights_enabled", True)
    graph = chain.metagraph()
    owner_uid = graph.by_hotkey(owner.hotkey.ss58_address).uid
    miner_uid = graph.by_hotkey(miner.hotkey.ss58_address).uid
    weights = {owner_uid: 1.0, miner_uid: 3.0}
    submission = set_weights_when_allowed(
        chain, owner, weights, {owner_uid: owner.hotkey.ss58_address, miner_uid: miner.hotkey.ss58_address}
    )
    assert submission.committed
    reveal_s = (chain.hyperparameters().reveal_period_epochs + 2) * TEMPO * chain.block_time_s + 120
    assert wait_for(
        lambda: owner_row(node, chain).get(miner_uid) == pytest.approx(0.75, abs=1e-3),
        reveal_s,
        "the chain to reveal the committed weights",
    )


def test_the_api_location_round_trips_through_the_subnet_identity(node, chain):
    from quasar.chain import ApiLocation

    _, owner, miner, _ = node
    location = ApiLocation(f"https://api-{int(time.time())}.quasar.invalid", miner.hotkey.ss58_address)
    chain.publish_api_location(owner, location)
    assert chain.api_location() == location
