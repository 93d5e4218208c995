"""The Bittensor chain layer against a fake of the SDK's blocking client (no chain is reachable here).

The fake stands in for ``bittensor.Subtensor`` only: the reads BittensorChain makes and
``execute``. It answers with the SDK's own types: metagraphs decoded by the SDK's decoder from a
runtime-API-shaped record, real ``ExtrinsicResult`` and ``ChainError`` objects, the SDK's
exceptions; it keeps the chain state a subnet has (uids, last updates, axons, weights, identity) and
applies the chain's rules to ``SetWeights``, ``ServeAxon`` and ``SetSubnetIdentity``, so rate limits
and refusals come out as the chain gives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import socket
import threading
import time
from dataclasses import dataclass, field

import bittensor as bt
import pytest
import websockets.asyncio.server
import websockets.exceptions
from bittensor.intents import ServeAxon, SetSubnetIdentity, SetWeights
from bittensor.intents.weights import DEFAULT_COMMIT_REVEAL_VERSION, _conform, _Preflight
from bittensor.metagraph import _build as sdk_decode_metagraph
from bittensor.result import chain_error_from_substrate_request
from bittensor.sp_core import Keypair

from quasar import config, scoring, version_key
from quasar.chain import ApiLocation, ChainError, ChainUnreachable, Endpoint, Refused, UidsChanged
from quasar.chain.bittensor_chain import (
    BittensorChain,
    RateLimited,
    blocks_until_weights_allowed,
    endpoint_from_axon,
    normalize_weights,
    to_hyperparameters,
)
from quasar.chain.factory import connect
from quasar.chain.subtensor_rules import FINNEY
from quasar.localnet.host import make_wallet
from quasar.validator.state import ValidatorState
from quasar.validator.weight_setting import WeightSetter

NETUID = 7
RAO = 10**9


def address() -> str:
    return Keypair.create_from_mnemonic(Keypair.generate_mnemonic()).ss58_address


@pytest.fixture(scope="module")
def wallets(tmp_path_factory):
    root = tmp_path_factory.mktemp("wallets")
    return {name: make_wallet(root, name) for name in ("validator", "miner")}


def hotkey_of(wallet) -> str:
    return wallet.hotkey.ss58_address


def axon_record(host: str | None, port: int) -> dict:
    """An axon as the runtime API returns it: the IP as an integer plus its version."""
    if host is None:
        return {"ip": 0, "port": port, "ip_type": 4, "protocol": 4, "version": 0}
    ip = ipaddress.ip_address(host)
    return {"ip": int(ip), "port": port, "ip_type": ip.version, "protocol": 4, "version": 1}


@dataclass
class FakeNeuron:
    hotkey: str
    coldkey: str
    total_stake_rao: int = 0
    validator_permit: bool = False
    last_update: int = 0
    axon: dict = field(default_factory=lambda: axon_record(None, 0))


class FakeChain:
    """The state of one subnet, shared by every client the factory builds (like the real chain)."""

    def __init__(self, netuid: int = NETUID, block: int = 10_000, weights_rate_limit: int = 100):
        self.netuid = netuid
        self.block = block
        self.block_time = 12.0
        self.weights_rate_limit = weights_rate_limit
        self.commit_reveal = False
        # The chain's CommitRevealWeightsVersion (root may raise it): a commit of another version is refused.
        self.commit_reveal_version = DEFAULT_COMMIT_REVEAL_VERSION
        self.stake_threshold_rao = 0  # the chain's StakeThreshold
        # What get_subnet_hyperparams_v3 returns, as the SDK flattens it (a few of its many names).
        self.hyperparameters = {
            "tempo": 360,
            "weights_version": 0,
            "min_allowed_weights": 1,
            "max_weights_limit": 65535,
            "commit_reveal_period": 1,
            "serving_rate_limit": 50,
            "max_allowed_uids": 256,
            "immunity_period": 5000,
            "kappa": 32767,
            "activity_cutoff": 5000,
            "activity_cutoff_factor": 13_889,
        }
        self.identity: dict | None = None
        self.owner_coldkey = ""
        self.neurons: list[FakeNeuron] = []
        self.owner_hotkey = ""
        self.weights: dict[int, tuple[dict[int, float], int]] = {}  # setter uid -> (weights, version_key)
        self.calls: list[str] = []  # every SDK call any client made, in order
        self.executed: list = []  # intents submitted
        self.planned: dict[str, list] = {}  # operation -> outcomes to give before the chain's own answer
        self.clients: list[FakeSubtensor] = []

    def register(self, hotkey: str, coldkey: str | None = None, **fields) -> int:
        self.neurons.append(FakeNeuron(hotkey, coldkey or address(), **fields))
        return len(self.neurons) - 1

    def factory(self, target: str) -> FakeSubtensor:
        client = FakeSubtensor(self, target)
        self.clients.append(client)
        return client

    def plan(self, operation: str, *outcomes) -> None:
        """The next calls of ``operation`` raise (exceptions) or return (anything else) these."""
        self.planned.setdefault(operation, []).extend(outcomes)

    def answer(self, operation: str, compute):
        self.calls.append(operation)
        queue = self.planned.get(operation)
        if queue:
            outcome = queue.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        return compute()

    def uid_of(self, hotkey: str) -> int | None:
        return next((uid for uid, n in enumerate(self.neurons) if n.hotkey == hotkey), None)

    def runtime_metagraph(self) -> dict:
        """The record ``SubnetInfoRuntimeApi.get_metagraph`` returns (the columns the SDK decodes)."""
        return {
            "netuid": self.netuid,
            "block": self.block,
            "tempo": 360,
            "last_step": self.block - 5,
            "blocks_since_last_step": 5,
            "owner_hotkey": self.owner_hotkey,
            "owner_coldkey": address(),
            "network_registered_at": 1,
            "num_uids": len(self.neurons),
            "max_uids": 256,
            "hotkeys": [n.hotkey for n in self.neurons],
            "coldkeys": [n.coldkey for n in self.neurons],
            "axons": [n.axon for n in self.neurons],
            "active": [True] * len(self.neurons),
            "validator_permit": [n.validator_permit for n in self.neurons],
            "last_update": [n.last_update for n in self.neurons],
            "alpha_stake": [n.total_stake_rao for n in self.neurons],
            "tao_stake": [0] * len(self.neurons),
            "total_stake": [n.total_stake_rao for n in self.neurons],
        }

    def apply(self, intent, wallet) -> bt.ExtrinsicResult:
        """What the chain does with an extrinsic: the rules it enforces, the error names it gives."""
        uid = self.uid_of(bt.resolve_signer(wallet, role="hotkey").ss58_address)
        if isinstance(intent, SetWeights) and uid is not None:
            # The SDK's build fits the weights to the subnet first and raises, unsigned, what it will not send.
            least, largest = self.hyperparameters["min_allowed_weights"], self.hyperparameters["max_weights_limit"]
            limits = _Preflight(uid, self.commit_reveal, least, largest)
            _conform(list(intent.uids or []), list(intent.weights or []), limits, self.netuid)
        self.executed.append(intent)
        if uid is None:
            return failed("HotKeyNotRegisteredInSubNet")
        neuron = self.neurons[uid]
        if isinstance(intent, SetWeights):
            # Subtensor's order: the stake (the owner's hotkey exempt), a commit's commit-reveal
            # version, the rate limit, then a setting's version key and permit (a commit's are
            # checked at its reveal).
            if neuron.hotkey != self.owner_hotkey and neuron.total_stake_rao < self.stake_threshold_rao:
                return failed("NotEnoughStakeToSetWeights")
            # SetWeights commits with the SDK's DEFAULT_COMMIT_REVEAL_VERSION.
            if self.commit_reveal and self.commit_reveal_version != DEFAULT_COMMIT_REVEAL_VERSION:
                return failed("IncorrectCommitRevealVersion")
            if neuron.last_update and self.block - neuron.last_update < self.weights_rate_limit:
                return failed("SettingWeightsTooFast")
            if not self.commit_reveal and intent.version_key < self.hyperparameters["weights_version"]:
                return failed("IncorrectWeightVersionKey")
            if not self.commit_reveal and not neuron.validator_permit:
                return failed("NeuronNoValidatorPermit")
            self.weights[uid] = (dict(zip(intent.uids or [], intent.weights or [], strict=True)), intent.version_key)
            neuron.last_update = self.block
            if self.commit_reveal:
                return bt.ExtrinsicResult(
                    success=True, message="Success", extrinsic_id=f"{self.block}-0003", data={"reveal_round": 4242}
                )
        elif isinstance(intent, ServeAxon):
            neuron.axon = axon_record(intent.ip, intent.port)
        else:
            raise AssertionError(f"unexpected intent {intent!r}")
        return bt.ExtrinsicResult(
            success=True, message="Success", block_hash="0x" + "ab" * 32, extrinsic_id=f"{self.block}-0002"
        )

    def apply_coldkey(self, intent, wallet) -> bt.ExtrinsicResult:
        """set_subnet_identity: only the subnet owner's coldkey (NotSubnetOwner)."""
        self.executed.append(intent)
        if bt.resolve_signer(wallet, role="coldkey").ss58_address != self.owner_coldkey:
            return failed("NotSubnetOwner", "the signer does not own the subnet")
        if len(intent.additional.encode()) > 1024:  # is_valid_subnet_identity
            return failed("InvalidIdentity", "the identity's fields are too long")
        # The SDK's own fields of the intent (not the code's list), so a field the code forgot shows.
        self.identity = {f.name: getattr(intent, f.name) for f in dataclasses.fields(intent) if f.name != "netuid"}
        return bt.ExtrinsicResult(success=True, message="Success", extrinsic_id=f"{self.block}-0004")


def failed(name: str, message: str | None = None) -> bt.ExtrinsicResult:
    """A failed extrinsic as the SDK reports one that was included but failed in dispatch."""
    text = message or f"the chain refused: {name}"
    return bt.ExtrinsicResult(
        success=False, message=text, block_hash="0x" + "cd" * 32, extrinsic_id="1-0001", error=bt.ChainError(text, name)
    )


class _View:
    """The typed read namespaces of a blocking client or a block-pinned snapshot."""

    def __init__(self, chain: FakeChain, block: int | None):
        self._chain = chain
        self._block = block
        self.subnets = _Namespace(
            metagraph=self._metagraph,
            subnet_hyperparameters=self._hyperparameters,
            subnet_identity=self._identity,
            commit_reveal_enabled=self._commit_reveal,
        )
        self.neurons = _Namespace(uid=self._uid)
        self.hyperparameters = _Namespace(weights_rate_limit=self._weights_rate_limit)
        self.epochs = _Namespace(blocks_since_last_update=self._blocks_since_last_update)

    def query(self, item, params=None):
        """A storage read (``client.query``): the chain's StakeThreshold, or the subnet's MinAllowedWeights."""
        if tuple(item) == ("SubtensorModule", "MinAllowedWeights") and params == [self._chain.netuid]:
            least = self._chain.hyperparameters["min_allowed_weights"]
            return self._chain.answer("query MinAllowedWeights", lambda: least)
        assert tuple(item) == ("SubtensorModule", "StakeThreshold") and not params, item
        return self._chain.answer("query StakeThreshold", lambda: self._chain.stake_threshold_rao)

    def _metagraph(self, netuid, block=None, *, commitments=True):
        def compute():
            if netuid != self._chain.netuid:
                return None
            return sdk_decode_metagraph(netuid, self._chain.runtime_metagraph(), {})

        return self._chain.answer("subnets.metagraph", compute)

    def _hyperparameters(self, netuid, *, block=None):
        def compute():
            if netuid != self._chain.netuid:
                return None
            return {
                **self._chain.hyperparameters,
                "weights_rate_limit": self._chain.weights_rate_limit,
                "commit_reveal_weights_enabled": self._chain.commit_reveal,
            }

        return self._chain.answer("subnets.subnet_hyperparameters", compute)

    def _identity(self, netuid, *, block=None):
        return self._chain.answer("subnets.subnet_identity", lambda: self._chain.identity)

    def _commit_reveal(self, netuid, block=None):
        return self._chain.answer("subnets.commit_reveal_enabled", lambda: self._chain.commit_reveal)

    def _uid(self, hotkey_ss58, netuid, *, block=None):
        return self._chain.answer("neurons.uid", lambda: self._chain.uid_of(hotkey_ss58))

    def _weights_rate_limit(self, netuid=None, *, block=None):
        return self._chain.answer("hyperparameters.weights_rate_limit", lambda: self._chain.weights_rate_limit)

    def _blocks_since_last_update(self, netuid, uid, *, block=None):
        def compute():
            if uid >= len(self._chain.neurons):
                return None
            return self._chain.block - self._chain.neurons[uid].last_update

        return self._chain.answer("epochs.blocks_since_last_update", compute)


class _Namespace:
    def __init__(self, **methods):
        self.__dict__.update(methods)


class FakeSubtensor(_View):
    """The surface of ``bittensor.Subtensor`` (blocking mode) that BittensorChain uses."""

    def __init__(self, chain: FakeChain, target: str):
        super().__init__(chain, None)
        self.target = target
        self.closed = False

    @property
    def block(self) -> int:
        return self._chain.answer("block", lambda: self._chain.block)

    def at(self, block=None):
        pinned = self._chain.answer("at", lambda: self._chain.block if block is None else block)
        view = _View(self._chain, pinned)
        view.block = pinned
        return view

    def block_time(self):
        return self._chain.answer("block_time", lambda: self._chain.block_time)

    def execute(self, intent, wallet, **kwargs):
        if isinstance(intent, SetSubnetIdentity):
            return self._chain.answer("execute", lambda: self._chain.apply_coldkey(intent, wallet))
        return self._chain.answer("execute", lambda: self._chain.apply(intent, wallet))

    def close(self):
        self.closed = True


class RecordingSleep:
    def __init__(self):
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def fake():
    return FakeChain()


@pytest.fixture
def sleep():
    return RecordingSleep()


@pytest.fixture
def chain(fake, sleep):
    return BittensorChain("finney", NETUID, retries=3, backoff_s=2.0, sleep=sleep, client_factory=fake.factory)


@pytest.fixture
def subnet(fake, wallets):
    """uid 0 the owner, uid 1 our validator (with a permit), uid 2 our miner, uid 3 another miner."""
    fake.owner_hotkey = address()
    fake.register(fake.owner_hotkey, total_stake_rao=5 * RAO)
    fake.register(
        hotkey_of(wallets["validator"]),
        wallets["validator"].coldkeypub.ss58_address,
        total_stake_rao=12_345_678_901_234,
        validator_permit=True,
    )
    fake.register(hotkey_of(wallets["miner"]), wallets["miner"].coldkeypub.ss58_address)
    fake.register(address(), axon=axon_record("2001:db8::7", 8001))
    return fake


# --- reads ---


def test_metagraph_converts_uids_keys_stake_permits_and_endpoints(chain, subnet, wallets):
    subnet.neurons[2].axon = axon_record("203.0.113.9", 8001)
    subnet.register(address(), axon=axon_record(None, 1))  # what ResetAxon leaves: nothing served
    subnet.register(address(), axon=axon_record("198.51.100.1", 0))
    metagraph = chain.metagraph()
    assert metagraph.netuid == NETUID and metagraph.block == subnet.block
    assert [n.uid for n in metagraph.neurons] == [0, 1, 2, 3, 4, 5]
    assert [n.hotkey for n in metagraph.neurons] == [n.hotkey for n in subnet.neurons]
    assert [n.coldkey for n in metagraph.neurons] == [n.coldkey for n in subnet.neurons]
    validator = metagraph.by_hotkey(hotkey_of(wallets["validator"]))
    assert validator.uid == 1 and validator.validator_permit and validator.stake == pytest.approx(12_345.678901234)
    assert metagraph.by_uid(0).stake == 5.0 and not metagraph.by_uid(2).validator_permit
    assert metagraph.by_uid(2).endpoint == Endpoint("203.0.113.9", 8001)
    assert metagraph.by_uid(3).endpoint == Endpoint("2001:db8::7", 8001)
    assert metagraph.by_uid(3).endpoint.base_url == "http://[2001:db8::7]:8001"
    assert [metagraph.by_uid(uid).endpoint for uid in (0, 1, 4, 5)] == [None] * 4
    assert chain.is_registered(hotkey_of(wallets["miner"])) and not chain.is_registered(address())
    assert chain.has_validator_permit(hotkey_of(wallets["validator"]))
    assert not chain.has_validator_permit(hotkey_of(wallets["miner"]))


def test_current_block_and_owner_uid(chain, subnet):
    assert chain.current_block() == 10_000
    subnet.block += 7
    assert chain.current_block() == 10_007
    assert chain.owner_uid() == 0
    subnet.owner_hotkey = subnet.neurons[3].hotkey
    assert chain.owner_uid() == 3


def test_an_owner_without_a_uid_is_none_and_a_missing_subnet_an_error(sleep, subnet):
    subnet.owner_hotkey = address()
    chain = BittensorChain("test", NETUID, sleep=sleep, client_factory=subnet.factory)
    assert chain.owner_uid() is None
    other = BittensorChain("test", NETUID + 1, sleep=sleep, client_factory=subnet.factory)
    with pytest.raises(ChainError, match=f"subnet {NETUID + 1} does not exist"):
        other.metagraph()
    with pytest.raises(ChainError, match=f"subnet {NETUID + 1} does not exist"):
        other.hyperparameters()
    assert sleep.delays == []


def test_hyperparameters_and_the_block_time_come_from_the_chain(chain, subnet):
    subnet.commit_reveal = True
    subnet.hyperparameters["weights_version"] = 30_201
    # The fake subnet is a new subnet on finney (its defaults), but for the version key set here.
    assert chain.hyperparameters() == dataclasses.replace(FINNEY, weights_version_key=30_201)
    subnet.block_time = 0.25  # a fast-block node
    assert chain.block_time_s == 0.25
    subnet.block_time = 12.0
    assert chain.block_time_s == 0.25 and subnet.calls.count("block_time") == 1  # read once
    partial = {**subnet.hyperparameters, "weights_rate_limit": 100, "commit_reveal_weights_enabled": True}
    del partial["max_weights_limit"], partial["tempo"]
    with pytest.raises(ChainError, match="hyperparameters lack max_weights_limit, tempo$"):
        to_hyperparameters(partial)


@pytest.mark.parametrize(("blocks", "tempo"), [(5000, 360), (360, 360), (1000, 99), (7, 3600)])
def test_a_runtime_without_the_cutoff_factor_gives_its_cutoff_in_blocks(subnet, blocks, tempo):
    """A node older than subtensor's dynamic tempo answers activity_cutoff in blocks and no factor:
    the hyperparameters are still read (a missing field refused them all), with a cutoff of at most
    those blocks, so a validator's weights stay within it, and short of them by a thousandth of a
    tempo and a block at most (the factor is in thousandths of a tempo)."""
    older = {**subnet.hyperparameters, "tempo": tempo, "activity_cutoff": blocks, "weights_rate_limit": 100}
    older["commit_reveal_weights_enabled"] = True
    del older["activity_cutoff_factor"]
    cutoff = to_hyperparameters(older).activity_cutoff
    assert blocks - tempo / 1000 - 1 <= cutoff <= blocks, cutoff


def test_endpoint_overrides_the_network_name(fake):
    chain = BittensorChain("finney", NETUID, "ws://127.0.0.1:9944", client_factory=fake.factory)
    assert chain.target == "ws://127.0.0.1:9944" and fake.clients[-1].target == "ws://127.0.0.1:9944"
    assert BittensorChain("test", NETUID, client_factory=fake.factory).target == "test"


# --- set_weights ---


def test_set_weights_submits_normalized_weights_with_the_version_key(chain, subnet, wallets):
    chain.set_weights(wallets["validator"], {3: 3.0, 0: 1.0, 2: 0.0}, version_key=version_key())
    (intent,) = subnet.executed
    assert isinstance(intent, SetWeights) and intent.netuid == NETUID and intent.mechid == 0
    assert intent.version_key == version_key()
    assert intent.uids == [0, 2, 3] and intent.weights == pytest.approx([0.25, 0.0, 0.75])
    stored, stored_version = subnet.weights[1]
    assert stored == pytest.approx({0: 0.25, 2: 0.0, 3: 0.75}) and stored_version == version_key()
    assert subnet.neurons[1].last_update == subnet.block


def test_failed_extrinsic_raises_with_the_chains_message_and_is_not_retried(chain, subnet, wallets, sleep):
    with pytest.raises(ChainError, match="NeuronNoValidatorPermit") as raised:
        chain.set_weights(wallets["miner"], {0: 1.0}, version_key=1)
    assert "the chain refused" in str(raised.value) and not isinstance(raised.value, RateLimited)
    assert subnet.calls.count("execute") == 1 and sleep.delays == []
    subnet.plan("execute", failed("InvalidUid", "a uid is not registered"))
    with pytest.raises(ChainError, match="a uid is not registered"):
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert 1 not in subnet.weights and sleep.delays == []


@pytest.mark.parametrize(
    "refusal, name",
    [
        (failed("NeuronNoValidatorPermit"), "NeuronNoValidatorPermit"),
        (failed("IncorrectWeightVersionKey"), "IncorrectWeightVersionKey"),
        (failed("NotEnoughStakeToSetWeights"), "NotEnoughStakeToSetWeights"),
        (failed("TooManyUnrevealedCommits"), "TooManyUnrevealedCommits"),
        (failed("IncorrectCommitRevealVersion"), "IncorrectCommitRevealVersion"),
        # The transaction pool's rejection of a weights call from a hotkey below StakeThreshold, as
        # the SDK decodes it from the node's answer.
        (
            chain_error_from_substrate_request(Exception("1010: Invalid Transaction: Custom error: 1")),
            "StakeAmountTooLow",
        ),
    ],
)
def test_refusals_that_last_are_refused_with_their_name(chain, subnet, wallets, sleep, refusal, name):
    """The validator waits a whole epoch after these (quasar/validator/weight_setting.py), not
    WEIGHTS_RETRY_BLOCKS: the chain gives the same answer until stake, permit, rules or release change."""
    subnet.plan("execute", refusal)
    with pytest.raises(Refused) as raised:
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert raised.value.name == name and name in str(raised.value)
    assert subnet.calls.count("execute") == 1 and sleep.delays == []


def test_a_commit_reveal_version_raised_by_governance_stops_the_commits_until_the_next_epoch(
    chain, subnet, wallets, tmp_path, caplog
):
    """The chain's governance raises CommitRevealWeightsVersion while the validator runs: every
    commit of this SDK is refused (IncorrectCommitRevealVersion) until QUASAR's bittensor is updated.
    The validator commits once an epoch (EPOCH_BLOCKS 100) and says at ERROR why and to update,
    instead of once every WEIGHTS_RETRY_BLOCKS (ten refused commits an epoch)."""
    caplog.set_level("INFO", logger="quasar.validator.weight_setting")
    settings = config.resolve(
        {"network": "finney", "netuid": str(NETUID), "device": "cpu", "epoch_blocks": "100", "eval_seq_lens": ""},
        environ={},
        dotenv_path=None,
    )
    miner = scoring.Result(
        hotkey=hotkey_of(wallets["miner"]),
        submission_id=1,
        submitted_at=1.0,
        target_sequence_length=4096,
        claimed_tokens_per_sec=1000.0,
        measured_tokens_per_sec=1000.0,
        correct=True,
        logits_ok=True,
    )
    subnet.commit_reveal = True
    subnet.commit_reveal_version = DEFAULT_COMMIT_REVEAL_VERSION + 1
    with ValidatorState.open(tmp_path / "state.sqlite3") as state:
        setter = WeightSetter(settings, chain, wallets["validator"], state)
        start = subnet.block
        for block in range(start, start + 100, 10):  # one epoch, a step every 10 blocks
            subnet.block = block
            assert not (setter.due(block) and setter.set_weights(block, [miner]))
    refused = [r for r in caplog.records if "IncorrectCommitRevealVersion" in r.getMessage()]
    assert len(subnet.executed) == 1 and len(refused) == 1, [r.getMessage() for r in refused]
    assert refused[0].levelname == "ERROR"
    assert refused[0].getMessage().startswith(f"the chain refused the weights at block {start}, none this epoch: ")
    assert (
        refused[0]
        .getMessage()
        .endswith(
            "; update QUASAR (git pull, then ./scripts/setup_venv.sh) and start the validator again "
            f"(next look at block {start + 100})"
        )
    )


def test_passing_failures_are_not_refusals_that_last(chain, subnet, wallets, sleep):
    subnet.plan("execute", failed("InvalidUid", "a uid is not registered"))
    with pytest.raises(ChainError) as raised:
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert not isinstance(raised.value, Refused)
    subnet.plan("execute", *[bt.RpcConnectionError("endpoint unreachable")] * 4)
    with pytest.raises(ChainError) as raised:
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert not isinstance(raised.value, Refused)


def test_fewer_weights_than_min_allowed_weights_are_refused_for_the_epoch_as_the_sdk_sends_none(
    chain, subnet, wallets, sleep
):
    """The chain takes weights on every uid of a subnet smaller than its min_allowed_weights
    (check_length: min(size, MinAllowedWeights)), but the SDK's SetWeights counts min_allowed_weights
    alone and raises before signing: a refusal that lasts while the subnet is that small, not a
    failure to try again 10 blocks later. A weight on one's own uid alone is exempt in both."""
    subnet.hyperparameters["min_allowed_weights"] = 5  # the subnet holds 4 uids
    with pytest.raises(Refused, match="WeightVecLengthIsLow: 4 weights, .*min_allowed_weights 5, even") as refused:
        chain.set_weights(wallets["validator"], {0: 0.4, 1: 0.1, 2: 0.3, 3: 0.2}, version_key=version_key())
    assert refused.value.name == "WeightVecLengthIsLow" and subnet.executed == [] and sleep.delays == []
    chain.set_weights(wallets["validator"], {1: 1.0}, version_key=version_key())
    assert subnet.weights[1] == ({1: 1.0}, version_key())


def test_a_failed_result_without_an_error_object_is_still_a_failure(chain, subnet, wallets):
    subnet.plan("execute", bt.ExtrinsicResult(success=False, message="Subtensor: BadRequest"))
    with pytest.raises(ChainError, match="BadRequest"):
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)


def test_rate_limit_pre_check_refuses_without_submitting(chain, subnet, wallets):
    chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    subnet.block += 40
    with pytest.raises(RateLimited) as raised:
        chain.set_weights(wallets["validator"], {2: 1.0}, version_key=1)
    assert raised.value.blocks_to_wait == 60 and "wait 60 more" in str(raised.value)
    assert "uid 1 on subnet 7 registered or last set weights 40 blocks ago" in str(raised.value)
    assert subnet.calls.count("execute") == 1 and subnet.weights[1][0] == {0: 1.0}
    subnet.block += 60
    chain.set_weights(wallets["validator"], {2: 1.0}, version_key=1)
    assert subnet.weights[1][0] == {2: 1.0}


@pytest.mark.parametrize(
    "commit_reveal, fault, answer",
    [
        (False, "stake", "NotEnoughStakeToSetWeights"),
        (True, "stake", "NotEnoughStakeToSetWeights"),
        (False, "version key", None),  # the CheckRateLimits extension runs before the call's version key
        (True, "version key", None),  # a commit's version key is checked at its reveal
        (False, "permit", None),  # the chain checks the rate limit before the permit
    ],
)
def test_a_too_early_call_with_a_lasting_fault_gets_the_answer_the_chain_gives(
    chain, subnet, wallets, commit_reveal, fault, answer
):
    """Subtensor checks the stake (CheckWeights) before the rate limit (CheckRateLimits, or a
    commit's own): too early, a validator below the StakeThreshold is refused for good and waits for
    the next epoch, where a RateLimited would have it try again once the limit passes, in vain; any
    other fault is met after the rate limit, as the chain meets it."""
    chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    subnet.commit_reveal = commit_reveal
    subnet.block += 40
    if fault == "version key":
        subnet.hyperparameters["weights_version"] = 2
    elif fault == "stake":
        subnet.stake_threshold_rao = subnet.neurons[1].total_stake_rao + 1
    else:
        subnet.neurons[1].validator_permit = False
    intent = SetWeights(netuid=NETUID, uids=[2], weights=[1.0], version_key=1)
    given = subnet.apply(intent, wallets["validator"]).error  # what the chain itself answers
    assert given.name == (answer or "SettingWeightsTooFast")
    subnet.executed.clear()
    with pytest.raises(RateLimited if answer is None else Refused) as raised:
        chain.set_weights(wallets["validator"], {2: 1.0}, version_key=1)
    assert answer is None or raised.value.name == answer
    assert subnet.executed == []  # nothing sent: the fee of a call the chain refuses is saved


def test_weights_for_a_uid_that_changed_hands_are_not_submitted(chain, subnet, wallets, sleep):
    planned = {0: subnet.neurons[0].hotkey, 2: subnet.neurons[2].hotkey}
    subnet.neurons[2].hotkey = address()  # uid 2 deregistered and taken by a new hotkey
    with pytest.raises(UidsChanged) as raised:
        chain.set_weights(wallets["validator"], {0: 0.4, 2: 0.6}, version_key=1, hotkeys=planned)
    assert raised.value.changed == {2: (planned[2], None)}
    assert "execute" not in subnet.calls and sleep.delays == []
    chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1, hotkeys={0: planned[0]})
    assert subnet.weights[1][0] == {0: 1.0}


def test_on_a_commit_reveal_subnet_the_weights_are_committed(chain, subnet, wallets):
    subnet.commit_reveal = True
    submission = chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert submission.committed and submission.block == subnet.block
    assert submission.detail == "10000-0003, revealed at drand round 4242"
    subnet.commit_reveal = False
    subnet.block += 100
    submission = chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert not submission.committed and submission.detail == "10100-0002"


def test_an_unregistered_hotkey_is_refused_before_submitting(chain, subnet, wallets, sleep):
    """A validator deregistered between planning and submitting waits for the next epoch, as on the
    dev chain (test_devchain.py), instead of asking again every WEIGHTS_RETRY_BLOCKS."""
    subnet.neurons[1].hotkey = address()  # the validator's uid now belongs to another hotkey
    with pytest.raises(Refused, match="HotKeyNotRegisteredInSubNet: hotkey .* is not registered on subnet 7") as raised:
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert raised.value.name == "HotKeyNotRegisteredInSubNet"
    assert "execute" not in subnet.calls and sleep.delays == []


@pytest.mark.parametrize(
    "refusal",
    [
        failed("SettingWeightsTooFast"),
        bt.ExtrinsicResult(
            success=False, message="Priority is too low: (1 vs 1)", error=bt.ChainError("Priority is too low: (1 vs 1)")
        ),
        bt.ChainError("weights were set 3 blocks ago", code=bt.ErrorCode.RATE_LIMITED),  # the SDK's own preflight
    ],
)
def test_a_rate_limit_from_the_chain_is_retried_after_back_off(chain, subnet, wallets, sleep, refusal):
    subnet.plan("execute", refusal)
    chain.set_weights(wallets["validator"], {0: 1.0, 3: 1.0}, version_key=1)
    assert sleep.delays == [2.0] and subnet.calls.count("execute") == 2
    assert subnet.weights[1][0] == pytest.approx({0: 0.5, 3: 0.5})


def test_a_persistent_rate_limit_gives_up_with_rate_limited(chain, subnet, wallets, sleep):
    subnet.plan("execute", *[failed("SettingWeightsTooFast")] * 4)
    with pytest.raises(RateLimited, match="after 4 attempts") as raised:
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert raised.value.blocks_to_wait is None
    assert sleep.delays == [2.0, 4.0, 8.0] and subnet.calls.count("execute") == 4


@pytest.mark.parametrize(
    "error",
    [
        bt.RpcConnectionError("could not connect to any endpoint: connection refused"),
        bt.ConnectionNotReady("Client connection is not open."),
        ConnectionResetError("connection reset by peer"),
        TimeoutError("no response from the node in 60s"),
    ],
)
def test_connection_errors_are_retried_on_a_fresh_client(chain, subnet, wallets, sleep, error):
    subnet.plan("execute", error, error)
    chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert sleep.delays == [2.0, 4.0] and subnet.calls.count("execute") == 3
    assert len(subnet.clients) == 3 and [c.closed for c in subnet.clients] == [True, True, False]
    assert subnet.weights[1][0] == {0: 1.0}


def test_a_connection_error_wrapped_by_the_sdk_is_retried(chain, subnet, wallets, sleep):
    try:
        raise bt.ChainError("socket dropped") from ConnectionResetError("reset")
    except bt.ChainError as wrapped:
        subnet.plan("at", wrapped)
    chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert sleep.delays == [2.0] and subnet.weights[1][0] == {0: 1.0}


def test_connection_errors_give_up_after_the_retries_naming_the_cause(chain, subnet, wallets, sleep):
    subnet.plan("execute", *[bt.RpcConnectionError("endpoint unreachable")] * 4)
    with pytest.raises(ChainError, match="cannot reach finney after 4 attempts: RpcConnectionError: endpoint unreach"):
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert sleep.delays == [2.0, 4.0, 8.0] and 1 not in subnet.weights


def test_reads_retry_connection_errors_too(chain, subnet, sleep):
    subnet.plan("block", bt.RpcConnectionError("dropped"))
    assert chain.current_block() == subnet.block and sleep.delays == [2.0]
    subnet.plan("subnets.metagraph", *[TimeoutError("slow node")] * 4)
    with pytest.raises(ChainError, match="read the metagraph: cannot reach finney after 4 attempts"):
        chain.metagraph()
    assert sleep.delays == [2.0, 2.0, 4.0, 8.0]


def test_other_sdk_errors_are_chain_errors_without_retry(chain, subnet, sleep):
    subnet.plan("block", bt.ChainError("state discarded for block 0x12", "StateDiscarded"))
    with pytest.raises(ChainError, match="read the current block on finney: state discarded"):
        chain.current_block()
    assert sleep.delays == [] and len(subnet.clients) == 1


@pytest.mark.parametrize(
    "weights, problem",
    [
        ({}, "empty or all zero"),
        ({0: 0.0, 1: 0.0}, "empty or all zero"),
        ({0: 1.0, 1: -0.5}, "finite and non-negative"),
        ({0: float("nan")}, "finite and non-negative"),
        ({0: float("inf"), 1: 1.0}, "finite and non-negative"),
        ({-1: 1.0}, "uids must be integers"),
        ({70_000: 1.0}, "uids must be integers"),
        ({"3": 1.0}, "uids must be integers"),
    ],
)
def test_invalid_weights_are_refused_before_any_call(chain, subnet, wallets, weights, problem):
    with pytest.raises(ChainError, match=problem):
        chain.set_weights(wallets["validator"], weights, version_key=1)
    assert subnet.calls == []


def test_normalize_weights_sums_to_one_and_keeps_proportions():
    assert normalize_weights({2: 2.0, 0: 6.0}) == {0: 0.75, 2: 0.25}
    assert normalize_weights({5: 1e-9}) == {5: 1.0}


@pytest.mark.parametrize(
    "block, since, limit, wait",
    [
        (1000, 1000, 100, 0),  # never set (last update 0): allowed at once
        (1000, None, 100, 0),  # no last-update entry
        (1000, 10, 0, 0),  # no rate limit
        (1000, 99, 100, 1),
        (1000, 100, 100, 0),  # the chain allows since >= limit
        (1000, 0, 100, 100),  # set in this very block
        (50, 10, 100, 90),  # young chain, set at block 40
    ],
)
def test_blocks_until_weights_allowed(block, since, limit, wait):
    assert blocks_until_weights_allowed(block, since, limit) == wait


# --- publish_endpoint ---


def test_publish_endpoint_serves_the_axon_and_is_idempotent(chain, subnet, wallets):
    miner = wallets["miner"]
    chain.publish_endpoint(miner, "203.0.113.5", 8001)
    (intent,) = subnet.executed
    assert isinstance(intent, ServeAxon) and intent.netuid == NETUID
    assert (intent.ip, intent.port, intent.version) == ("203.0.113.5", 8001, version_key())
    assert chain.neuron(hotkey_of(miner)).endpoint == Endpoint("203.0.113.5", 8001)
    chain.publish_endpoint(miner, "203.0.113.5", 8001)
    assert len(subnet.executed) == 1
    chain.publish_endpoint(miner, "2001:db8::5", 8002)
    assert len(subnet.executed) == 2
    assert chain.neuron(hotkey_of(miner)).endpoint == Endpoint("2001:db8::5", 8002)


def test_publish_endpoint_failure_and_refusals(chain, subnet, wallets, sleep):
    miner = wallets["miner"]
    subnet.plan("execute", failed("InvalidIpAddress", "the ip address is not valid"))
    with pytest.raises(ChainError, match="publishing the endpoint failed on chain: the ip address is not valid"):
        chain.publish_endpoint(miner, "203.0.113.5", 8001)
    assert chain.neuron(hotkey_of(miner)).endpoint is None
    subnet.plan("execute", *[failed("ServingRateLimitExceeded")] * 4)
    with pytest.raises(RateLimited):
        chain.publish_endpoint(miner, "203.0.113.5", 8001)
    assert sleep.delays == [2.0, 4.0, 8.0]
    calls = len(subnet.calls)
    for host, port, problem in [
        ("miner.example.org", 8001, "not an IP address"),
        ("0.0.0.0", 8001, "unspecified"),
        ("203.0.113.5", 0, "port 0 must be"),
        ("203.0.113.5", 70_000, "1..65535"),
    ]:
        with pytest.raises(ChainError, match=problem):
            chain.publish_endpoint(miner, host, port)
    assert len(subnet.calls) == calls
    subnet.neurons[2].hotkey = address()
    with pytest.raises(ChainError, match="is not registered on subnet 7"):
        chain.publish_endpoint(miner, "203.0.113.5", 8001)
    assert subnet.calls.count("execute") == 5


def test_a_wallet_without_a_hotkey_file_is_a_clear_error(chain, subnet, tmp_path):
    wallet = bt.Wallet(name="empty", hotkey="default", path=str(tmp_path))
    with pytest.raises(ChainError, match="cannot read the wallet's hotkey"):
        chain.set_weights(wallet, {0: 1.0}, version_key=1)
    assert subnet.calls == []


# --- the API's location in the subnet identity ---


def test_the_owner_publishes_the_api_location_keeping_the_identity(chain, subnet, wallets):
    subnet.owner_coldkey = wallets["validator"].coldkeypub.ss58_address  # this test's owner
    assert chain.api_location() is None
    subnet.identity = {
        "subnet_name": "QUASAR",
        "github_repo": "https://github.com/q/q",
        "subnet_contact": "",
        "subnet_url": "https://quasar.example",
        "discord": "",
        "description": "long context",
        "logo_url": "",
        "additional": "see the docs",
    }
    location = ApiLocation("https://api.quasar.example", address())
    chain.publish_api_location(wallets["validator"], location)
    (intent,) = subnet.executed
    assert isinstance(intent, SetSubnetIdentity) and intent.netuid == NETUID
    assert (intent.subnet_name, intent.subnet_url, intent.description) == (
        "QUASAR",
        "https://quasar.example",
        "long context",
    )
    assert intent.additional == (
        f"see the docs quasar-api=https://api.quasar.example quasar-api-hotkey={location.hotkey}"
    )
    assert chain.api_location() == location
    with pytest.raises(ChainError, match="NotSubnetOwner"):
        chain.publish_api_location(wallets["miner"], ApiLocation("https://evil.example"))
    assert chain.api_location() == location


def test_an_api_location_past_the_identitys_1024_bytes_is_not_sent(chain, subnet, wallets):
    """The chain refuses an identity whose additional text is over 1024 bytes (InvalidIdentity, a fee
    spent): the owner's text and the location together are checked before anything is signed."""
    subnet.owner_coldkey = wallets["validator"].coldkeypub.ss58_address
    subnet.identity = {"subnet_name": "QUASAR", "additional": "x" * 1000}
    with pytest.raises(ChainError, match=r"InvalidIdentity: .* would be 1029 bytes, above the chain's 1024"):
        chain.publish_api_location(wallets["validator"], ApiLocation("https://a.example"))
    assert subnet.executed == [] and chain.api_location() is None


def test_endpoint_from_axon():
    assert endpoint_from_axon("1.2.3.4:8001") == Endpoint("1.2.3.4", 8001)
    assert endpoint_from_axon("[::1]:9") == Endpoint("::1", 9)
    assert [endpoint_from_axon(a) for a in (None, "", "1.2.3.4:0")] == [None, None, None]


def test_the_real_sdk_on_a_closed_port_gives_connection_errors_that_are_retried(sleep):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    chain = BittensorChain("local", NETUID, f"ws://127.0.0.1:{port}", retries=2, backoff_s=0.5, sleep=sleep)
    lost = f"cannot reach ws://127.0.0.1:{port} after 3 attempts: RpcConnectionError"
    with pytest.raises(ChainUnreachable, match=lost) as unreachable:
        chain.current_block()
    assert sleep.delays == [0.5, 1.0]
    # The message leaves the cure out (the API's 503 passes it to its callers, whose network is not at
    # fault); a process that stops on it says both, the API's serve and the validator alike.
    message = str(unreachable.value)
    assert "SUBTENSOR_CHAIN_ENDPOINT" not in message
    assert unreachable.value.with_cure == (
        f"{message}; check this host's network, or name a node that answers in SUBTENSOR_CHAIN_ENDPOINT "
        "(--subtensor.chain_endpoint)"
    )


@contextlib.contextmanager
def chattering_node():
    """A websocket server on 127.0.0.1 that answers no request but sends a frame of garbage every
    0.2 s, as a broken node or proxy may: the SDK's own response timeout restarts at each frame."""

    async def handler(connection):
        async def chatter():
            while True:
                await asyncio.sleep(0.2)
                await connection.send("not a JSON-RPC answer")

        task = asyncio.create_task(chatter())
        try:
            async for _ in connection:
                pass
        except websockets.exceptions.ConnectionClosed:
            pass  # the client cut the attempt short: the end this node waits for
        finally:
            task.cancel()

    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder = {}

    async def run():
        async with websockets.asyncio.server.serve(handler, "127.0.0.1", 0) as server:
            holder["port"] = server.sockets[0].getsockname()[1]
            holder["stop"] = loop.create_future()
            started.set()
            await holder["stop"]

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield f"ws://127.0.0.1:{holder['port']}"
    finally:
        loop.call_soon_threadsafe(holder["stop"].set_result, None)


def test_a_node_that_chatters_without_answering_cannot_hold_a_call_past_its_timeout(sleep):
    """The real SDK waits as long as frames keep coming: each attempt is cut at attempt_timeout_s,
    on a fresh connection each time, what it waited for is cancelled (no thread is left waiting),
    and the caller gets a ChainError naming the timeout."""
    with chattering_node() as url:
        chain = BittensorChain("local", NETUID, url, retries=1, backoff_s=0.5, attempt_timeout_s=2, sleep=sleep)
        outcome = []
        caller = threading.Thread(target=lambda: outcome.append(_raised(chain.current_block)), daemon=True)
        started = time.monotonic()
        caller.start()
        caller.join(60)
        assert not caller.is_alive(), "the call was still waiting for the node after 60 s"
        assert time.monotonic() - started < 20
        assert not [thread for thread in threading.enumerate() if thread.name == "quasar-chain-call"]
    (error,) = outcome
    assert isinstance(error, ChainError)
    assert f"cannot reach {url} after 2 attempts: TimeoutError: no answer within 2 s" in str(error)
    assert sleep.delays == [0.5]


def _raised(call) -> BaseException | None:
    try:
        call()
    except Exception as error:  # the test inspects it
        return error
    return None


# --- construction and the factory ---


def test_bad_settings_are_chain_errors(fake):
    with pytest.raises(ChainError, match="Unknown network 'nowhere'"):
        BittensorChain("nowhere", NETUID)
    with pytest.raises(ChainError, match="retries must be >= 0"):
        BittensorChain("finney", NETUID, retries=-1, client_factory=fake.factory)
    for timeout in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ChainError, match="attempt_timeout_s must be a finite number > 0"):
            BittensorChain("finney", NETUID, attempt_timeout_s=timeout, client_factory=fake.factory)


def test_factory_returns_the_bittensor_chain_for_bittensor_networks():
    finney = connect(config.resolve({"network": "finney", "netuid": "24"}, environ={}, dotenv_path=None))
    assert isinstance(finney, BittensorChain) and finney.target == "finney" and finney.netuid == 24
    local = connect(
        config.resolve({"network": "local", "chain_endpoint": "ws://10.0.0.2:9944"}, environ={}, dotenv_path=None)
    )
    assert isinstance(local, BittensorChain) and local.target == "ws://10.0.0.2:9944"
