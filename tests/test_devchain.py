"""The embedded dev chain: registration, blocks from a stored genesis, many processes, and subtensor's
rules under finney's hyperparameters (weights, commit-reveal, serving, re-registration, identity)."""

import dataclasses
import math
import os
import subprocess
import sys
import threading
import time

import pytest
from bittensor.sp_core import Keypair

from quasar import config
from quasar.chain import ApiLocation, ChainError, Endpoint, RateLimited, Refused, UidsChanged
from quasar.chain.base import decode_api_location, encode_api_location
from quasar.chain.devchain import FINNEY, DevChain
from quasar.chain.factory import connect
from quasar.chain.subtensor_rules import refusal_error, u16_weights
from quasar.localnet.host import make_wallet
from quasar.terminal import short_hotkey
from tests.processes import libfaketime

SLOW_BLOCKS = 1e6  # seconds per block: blocks move only through advance()


def address() -> str:
    return Keypair.create_from_mnemonic(Keypair.generate_mnemonic()).ss58_address


@pytest.fixture
def chain(tmp_path):
    return DevChain(tmp_path / "chain.sqlite3", netuid=5, block_time_s=SLOW_BLOCKS)


@pytest.fixture(scope="module")
def wallets(tmp_path_factory):
    root = tmp_path_factory.mktemp("wallets")
    return {name: make_wallet(root, name) for name in ("validator", "miner", "owner", "other")}


def hotkey(wallet) -> str:
    return wallet.hotkey.ss58_address


@pytest.fixture
def subnet(chain, wallets):
    """uid 0 the owner, uid 1 the validator (stake, permit), uid 2 the miner, uid 3 another miner."""
    for name, permit in (("owner", False), ("validator", True), ("miner", False), ("other", False)):
        chain.register_wallet(wallets[name], stake=1e4 if permit else 0.0, validator_permit=permit)
    return chain


# --- registration, blocks, files ---


def test_register_assigns_uids_in_order_and_refuses_duplicates(chain):
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


STEPPED = """
import sys
from pathlib import Path
from quasar.chain.devchain import DevChain
chain, offset = DevChain(sys.argv[1], block_time_s=0.2), Path(sys.argv[2])
chain.advance(1000)
before = chain.current_block()
offset.write_text("-60")
print(before, chain.current_block(), DevChain(sys.argv[1]).current_block())
"""


def test_a_step_back_of_the_hosts_clock_does_not_take_the_block_number_back(tmp_path):
    """A process whose wall clock steps back 60 s (NTP, libfaketime here; the boot clock goes on)
    read the block 300 blocks lower: the dev chain counted blocks by the wall clock."""
    preload = libfaketime()
    offset = tmp_path / "offset"
    offset.write_text("+0")
    faked = {
        "LD_PRELOAD": preload,
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "DONT_FAKE_MONOTONIC": "1",  # the monotonic and boot clocks go on, as under NTP
    }
    run = subprocess.run(
        [sys.executable, "-c", STEPPED, str(tmp_path / "chain.sqlite3"), str(offset)],
        env={**os.environ, **faked},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    before, after, reopened = (int(word) for word in run.stdout.split())
    assert before <= after <= before + 5 and before <= reopened <= before + 5, run.stdout


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


def test_a_new_file_has_finneys_hyperparameters(chain):
    # Subtensor's defaults for a new subnet (see FINNEY's comment for where each comes from).
    assert dataclasses.asdict(chain.hyperparameters()) == {
        "tempo": 360,
        "weights_version_key": 0,
        "weights_rate_limit": 100,
        "min_allowed_weights": 1,
        "max_weight_limit": 65535,
        "commit_reveal_enabled": True,
        "reveal_period_epochs": 1,
        "serving_rate_limit": 50,
        "max_allowed_uids": 256,
        "immunity_period": 5000,
        "activity_cutoff_factor": 13_889,
    }
    assert chain.hyperparameters() == FINNEY
    assert FINNEY.activity_cutoff == 5000  # 13,889 thousandths of a tempo of 360 blocks
    changed = chain.set_hyperparameters(tempo=10, commit_reveal_enabled=False)
    assert (changed.tempo, changed.commit_reveal_enabled, changed.weights_rate_limit) == (10, False, 100)
    assert DevChain(chain.path).hyperparameters() == changed  # stored in the file
    for bad, message in (
        ({"tempo": 0}, "at least 1"),
        ({"max_weight_limit": 70000}, "u16"),
        ({"weights_rate_limit": -1}, "non-negative integer"),
        ({"nope": 1}, "unknown"),
        ({"commit_reveal_enabled": 1}, "true or false"),
        ({"activity_cutoff_factor": 999}, "ActivityCutoffFactorMilliOutOfBounds"),
        ({"activity_cutoff_factor": 50_001}, "1000..50000 thousandths of a tempo"),
        # The chain's types and setters: u16 storage, set_reveal_period's 100, sudo_set_max_allowed_uids' 256.
        ({"tempo": 65_536}, "tempo is a u16 on chain: at most 65535"),
        ({"immunity_period": 65_536}, "immunity_period is a u16"),
        ({"min_allowed_weights": 65_536}, "min_allowed_weights is a u16"),
        ({"weights_rate_limit": 2**64}, "weights_rate_limit is a u64"),
        ({"reveal_period_epochs": 101}, "RevealPeriodTooLarge: reveal_period_epochs 101 is above 100"),
        (
            {"max_allowed_uids": 257},
            "MaxAllowedUidsGreaterThanDefaultMaxAllowedUids: max_allowed_uids 257 is above 256",
        ),
    ):
        with pytest.raises(ChainError, match=message):
            chain.set_hyperparameters(**bad)
    assert chain.hyperparameters() == changed
    # The owner's lowest: one tempo (subtensor's get_activity_cutoff_blocks, 10 blocks here).
    assert chain.set_hyperparameters(activity_cutoff_factor=1000).activity_cutoff == 10
    highest = chain.set_hyperparameters(tempo=65_535, reveal_period_epochs=100, max_allowed_uids=256)
    assert (highest.tempo, highest.reveal_period_epochs, highest.max_allowed_uids) == (65_535, 100, 256)


# --- weights, set directly (commit-reveal off) ---


def direct(chain: DevChain, **values) -> None:
    chain.set_hyperparameters(commit_reveal_enabled=False, **values)


def test_set_weights_checks_values_and_normalizes(subnet, wallets):
    direct(subnet)
    validator = wallets["validator"]
    submission = subnet.set_weights(validator, {0: 1.0, 2: 3.0}, version_key=7)
    assert not submission.committed and submission.block == subnet.current_block()
    assert subnet.weights() == {1: {0: 0.25, 2: 0.75}}
    subnet.set_hyperparameters(weights_rate_limit=0)
    subnet.set_weights(validator, {2: 2.0}, version_key=7)  # replaces the setter's previous weights
    assert subnet.weights() == {1: {2: 1.0}}
    for bad in ({0: -0.1, 2: 1.0}, {0: math.nan}, {0: math.inf}, {0: 0.0}, {}):
        with pytest.raises(ChainError):
            subnet.set_weights(validator, bad, version_key=7)
    with pytest.raises(ChainError, match=r"UidVecContainInvalidOne: uids \[9\]"):
        subnet.set_weights(validator, {9: 1.0}, version_key=7)
    # uids are u16 on chain: 65,538 is no uid (wrapped to u16 it would be uid 2's), nor is "2".
    for bad_uid in (65_538, -1, "2"):
        with pytest.raises(ChainError, match="uids must be integers in 0..65535"):
            subnet.set_weights(validator, {bad_uid: 1.0}, version_key=7)
    assert subnet.weights() == {1: {2: 1.0}}


def test_set_weights_by_an_unregistered_wallet_is_refused(chain, wallets):
    with pytest.raises(Refused, match="HotKeyNotRegisteredInSubNet") as raised:
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=1)
    assert raised.value.name == "HotKeyNotRegisteredInSubNet"


def test_both_chains_raise_a_refusal_by_its_name():
    """subtensor_rules.refusal_error decides for the dev chain and the Bittensor chain alike: a
    refusal that lasts skips the validator's epoch, any other is tried again blocks later."""
    lasting = refusal_error("NeuronNoValidatorPermit", "cannot set weights: NeuronNoValidatorPermit")
    assert isinstance(lasting, Refused) and lasting.name == "NeuronNoValidatorPermit"
    for passing in ("InvalidUid", "", None):
        error = refusal_error(passing, "cannot set weights")
        assert isinstance(error, ChainError) and not isinstance(error, Refused)


def test_the_weights_rate_limit_counts_from_registration_and_each_setting(chain, wallets):
    """check_rate_limit: LastUpdate is the registration block (append_neuron) and then each setting's;
    0 means never. A uid registered at block 10 waits until block 110."""
    direct(chain)
    chain.register_wallet(wallets["owner"])
    chain.advance(10)
    chain.register_wallet(wallets["validator"], stake=1e4, validator_permit=True)
    with pytest.raises(RateLimited, match="SettingWeightsTooFast") as raised:
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=0)
    assert raised.value.blocks_to_wait == 100
    # A new validator's first weights: it set none (it said 'set weights at block 10').
    assert "uid 1 registered or last set weights at block 10;" in str(raised.value)
    chain.advance(99)
    with pytest.raises(RateLimited) as raised:
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=0)
    assert raised.value.blocks_to_wait == 1
    chain.advance(1)
    chain.set_weights(wallets["validator"], {0: 1.0}, version_key=0)
    with pytest.raises(RateLimited) as raised:
        chain.set_weights(wallets["validator"], {1: 1.0}, version_key=0)
    assert raised.value.blocks_to_wait == 100
    assert chain.weights() == {1: {0: 1.0}}


def test_a_version_key_below_the_subnets_is_refused(subnet, wallets):
    """check_version_key: WeightsVersionKey 0 takes any key; otherwise at least it."""
    direct(subnet, weights_rate_limit=0)
    subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    subnet.set_hyperparameters(weights_version_key=10)
    with pytest.raises(
        Refused, match="IncorrectWeightVersionKey: version_key 9 is below the subnet's WeightsVersionKey 10"
    ):
        subnet.set_weights(wallets["validator"], {3: 1.0}, version_key=9)
    subnet.set_weights(wallets["validator"], {3: 1.0}, version_key=10)
    assert subnet.weights() == {1: {3: 1.0}}


def test_a_too_early_setting_gets_the_rate_limit_before_its_version_key(chain, wallets):
    """The runtime's CheckRateLimits dispatch extension checks a registered hotkey's weights rate
    limit before the call runs (after CheckWeights' stake): a setting both too early and with an
    outdated key gets SettingWeightsTooFast, and IncorrectWeightVersionKey once the limit passed."""
    direct(chain, weights_version_key=10)
    chain.register_wallet(wallets["owner"])
    chain.advance(10)
    chain.register_wallet(wallets["validator"], stake=1e4, validator_permit=True)
    with pytest.raises(RateLimited, match="SettingWeightsTooFast") as raised:
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=9)
    chain.advance(raised.value.blocks_to_wait)
    with pytest.raises(Refused, match="IncorrectWeightVersionKey"):
        chain.set_weights(wallets["validator"], {0: 1.0}, version_key=9)
    chain.set_weights(wallets["validator"], {0: 1.0}, version_key=10)


def test_a_hotkey_below_the_stake_threshold_cannot_set_or_commit_weights(subnet, wallets):
    """check_weights_min_stake (the chain's StakeThreshold): checked before the call runs (the
    CheckWeights extension), so before registration and the version key, for a setting and a commit
    alike, and again when a commit is revealed; the owner's uid is exempt."""
    subnet.set_stake_threshold(2e4)  # the validator holds 1e4
    with pytest.raises(
        Refused, match="NotEnoughStakeToSetWeights: .* a stake of 10000, below the chain's StakeThreshold 20000"
    ):
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    with pytest.raises(Refused, match="NotEnoughStakeToSetWeights"):
        subnet.set_weights(make_wallet(subnet.path.parent, "stranger"), {2: 1.0}, version_key=0)
    assert subnet.set_weights(wallets["owner"], {2: 1.0}, version_key=0).committed  # the owner: exempt
    subnet.set_stake_threshold(1e4)
    assert subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0).committed
    subnet.set_stake_threshold(2e4)  # raised before the reveal: the commit is dropped there
    subnet.advance(FINNEY.tempo)
    assert [commit.outcome.split(":")[0] for commit in subnet.commits()] == ["revealed", "dropped"]
    assert "NotEnoughStakeToSetWeights" in subnet.commits()[1].outcome
    direct(subnet, weights_version_key=10)
    with pytest.raises(Refused, match="NotEnoughStakeToSetWeights"):  # before the version key
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=9)
    assert subnet.stake_threshold() == 2e4 and subnet.weights() == {0: {2: 1.0}}


def test_more_weights_than_the_subnet_has_uids_are_refused_first_once_the_rate_limit_passed(chain, wallets):
    """internal_set_weights' check_len_uids_within_allowed (its step 4) comes before registration and
    the version key, but the CheckRateLimits extension before the call: too early, a setting on more
    uids than the subnet holds gets SettingWeightsTooFast, then UidsLengthExceedUidsInSubNet."""
    direct(chain)
    chain.register_wallet(wallets["owner"])
    chain.advance(10)
    chain.register_wallet(wallets["validator"], stake=1e4, validator_permit=True)
    too_many = {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}
    with pytest.raises(RateLimited, match="SettingWeightsTooFast") as raised:
        chain.set_weights(wallets["validator"], too_many, version_key=0)
    chain.advance(raised.value.blocks_to_wait)
    with pytest.raises(Refused, match="UidsLengthExceedUidsInSubNet: 3 weights, the subnet holds 2 uids"):
        chain.set_weights(wallets["validator"], too_many, version_key=0)


def test_weights_need_a_permit_except_the_owners_and_a_self_weight(subnet, wallets):
    """check_validator_permit: a permit, or the subnet owner's uid, or one weight on the setter's own uid."""
    direct(subnet, weights_rate_limit=0)
    with pytest.raises(Refused, match="NeuronNoValidatorPermit: uid 2 has no validator permit"):
        subnet.set_weights(wallets["miner"], {3: 1.0}, version_key=0)
    subnet.set_weights(wallets["miner"], {2: 1.0}, version_key=0)  # a self-weight
    subnet.set_weights(wallets["owner"], {2: 1.0, 3: 1.0}, version_key=0)  # the owner, without a permit
    assert subnet.weights() == {0: {2: 0.5, 3: 0.5}, 2: {2: 1.0}}


def test_min_allowed_weights_counts_nonzero_weights_up_to_the_subnets_size(subnet, wallets):
    """check_length: at least min(subnet size, MinAllowedWeights) weights (the SDK drops zeros)."""
    direct(subnet, weights_rate_limit=0, min_allowed_weights=3)
    with pytest.raises(Refused, match="WeightVecLengthIsLow: 2 weights, the subnet needs at least 3"):
        subnet.set_weights(wallets["validator"], {0: 1.0, 2: 1.0, 3: 0.0}, version_key=0)
    subnet.set_weights(wallets["validator"], {0: 1.0, 2: 1.0, 3: 1.0}, version_key=0)
    subnet.set_hyperparameters(min_allowed_weights=1024)  # capped by the subnet's 4 neurons
    subnet.set_weights(wallets["validator"], {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, version_key=0)
    assert len(subnet.weights()[1]) == 4


def test_max_weight_limit_caps_the_largest_share(subnet, wallets):
    """max_weight_limited: no share above MaxWeightsLimit / 65535 (a self-weight apart)."""
    direct(subnet, weights_rate_limit=0, max_weight_limit=32768)
    with pytest.raises(
        Refused,
        match=r"MaxWeightExceeded: a share of 0.6000 is above the subnet's "
        r"max_weight_limit 32768 \(0.5000\)",
    ):
        subnet.set_weights(wallets["validator"], {2: 0.6, 3: 0.4}, version_key=0)
    with pytest.raises(ChainError, match="MaxWeightExceeded"):
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    subnet.set_weights(wallets["validator"], {2: 0.5, 3: 0.5}, version_key=0)
    subnet.set_weights(wallets["validator"], {1: 1.0}, version_key=0)  # all on itself
    assert subnet.weights() == {1: {1: 1.0}}


def test_a_weight_the_sdk_rounds_to_zero_is_not_stored(subnet, wallets):
    """The chain gets the u16 values the SDK sends: a weight below half of 1/65535 of the largest is 0
    and not sent, so it is neither checked nor stored, not even on a uid that does not exist."""
    direct(subnet)
    subnet.set_weights(wallets["validator"], {2: 1.0, 3: 1e-6, 9: 1e-6}, version_key=0)
    assert subnet.weights() == {1: {2: 1.0}}


def test_u16_weights_are_what_the_sdk_sends():
    assert u16_weights({0: 0.6, 1: 0.25, 5: 0.0}) == {0: 65535, 1: 27306}
    assert u16_weights({3: 1e-9, 4: 1.0}) == {4: 65535}  # rounds to zero: dropped
    assert u16_weights({}) == {}


def test_weights_planned_for_a_uid_that_changed_hands_are_refused(subnet, wallets):
    direct(subnet, weights_rate_limit=0)
    planned = {0: hotkey(wallets["owner"]), 2: hotkey(wallets["miner"])}
    subnet.deregister(hotkey(wallets["miner"]))
    newcomer = address()
    assert subnet.register(newcomer, address()) == 2
    with pytest.raises(UidsChanged) as raised:
        subnet.set_weights(wallets["validator"], {0: 0.4, 2: 0.6}, version_key=0, hotkeys=planned)
    assert raised.value.changed == {2: (hotkey(wallets["miner"]), newcomer)}
    assert "uid 2: planned for" in str(raised.value) and "nothing was submitted" in str(raised.value)
    assert subnet.weights() == {}
    subnet.set_weights(wallets["validator"], {0: 1.0}, version_key=0, hotkeys={0: hotkey(wallets["owner"])})
    assert subnet.weights() == {1: {0: 1.0}}


# --- validator permits (run_epoch: recomputed at each epoch) ---


def test_a_zero_stake_validator_loses_its_permit_at_the_next_epoch(chain, wallets):
    """is_topk_nonzero: a permit goes only to a nonzero stake; a permit granted at registration lasts
    until the next epoch recomputes it, and a validator holding no stake cannot set weights after."""
    chain.set_hyperparameters(commit_reveal_enabled=False)
    chain.register_wallet(wallets["owner"])
    chain.register_wallet(wallets["validator"], stake=0.0, validator_permit=True)
    chain.register_wallet(wallets["miner"])
    assert chain.has_validator_permit(hotkey(wallets["validator"]))  # granted now, as an epoch would
    chain.advance(FINNEY.tempo)
    assert not chain.has_validator_permit(hotkey(wallets["validator"]))
    with pytest.raises(Refused, match="NeuronNoValidatorPermit"):
        chain.set_weights(wallets["validator"], {2: 1.0}, version_key=0)


def test_permits_go_to_the_max_allowed_validators_largest_stakes(chain):
    """The top max_allowed_validators stakes hold permits (a tie keeps the higher uid, as the chain's
    stable ascending sort drops the lower one first); one pushed out of the top loses its permit."""
    assert chain.max_allowed_validators() == 64  # init_new_network's
    chain.set_max_allowed_validators(2)
    owner, small, tied, large = (address() for _ in range(4))
    chain.register(owner, address())
    chain.register(small, address(), stake=10.0, validator_permit=True)
    chain.register(tied, address(), stake=10.0, validator_permit=True)
    chain.advance(FINNEY.tempo)
    permits = {n.hotkey for n in chain.metagraph().neurons if n.validator_permit}
    assert permits == {owner, small, tied}  # two stakes, two places; the owner's uid besides
    chain.register(large, address(), stake=20.0)
    assert not chain.has_validator_permit(large)  # a new neuron waits for an epoch
    chain.advance(FINNEY.tempo)
    permits = {n.hotkey for n in chain.metagraph().neurons if n.validator_permit}
    assert permits == {owner, tied, large}


def test_the_owners_uid_holds_a_permit_from_the_next_epoch(chain, wallets):
    """run_epoch sets the subnet owner's uid's permit whatever its stake."""
    chain.register_wallet(wallets["owner"])
    chain.register_wallet(wallets["miner"])
    assert not chain.has_validator_permit(hotkey(wallets["owner"]))
    chain.advance(FINNEY.tempo - 1)
    assert not chain.has_validator_permit(hotkey(wallets["owner"]))
    chain.advance(1)
    assert chain.has_validator_permit(hotkey(wallets["owner"]))
    assert not chain.has_validator_permit(hotkey(wallets["miner"]))


def test_a_stake_below_the_threshold_counts_as_none_for_permits(chain, wallets):
    chain.register_wallet(wallets["owner"])
    chain.register_wallet(wallets["validator"], stake=1e4, validator_permit=True)
    chain.register_wallet(wallets["other"], stake=100.0, validator_permit=True)
    chain.set_stake_threshold(1000.0)
    chain.advance(FINNEY.tempo)
    assert chain.has_validator_permit(hotkey(wallets["validator"]))
    assert not chain.has_validator_permit(hotkey(wallets["other"]))


def test_a_commit_revealed_at_an_epoch_start_meets_the_permits_before_that_epoch(chain, wallets):
    """The block's reveals run before its epoch (block_step: reveal_crv3_commits, then run_coinbase)."""
    chain.register_wallet(wallets["owner"])
    chain.register_wallet(wallets["validator"], stake=0.0, validator_permit=True)
    chain.register_wallet(wallets["miner"])
    assert chain.set_weights(wallets["validator"], {2: 1.0}, version_key=0).committed
    chain.advance(FINNEY.tempo)
    assert [commit.outcome for commit in chain.commits()] == ["revealed"]
    assert not chain.has_validator_permit(hotkey(wallets["validator"]))


# --- commit-reveal (finney's default) ---


def test_committed_weights_are_invisible_until_the_next_epoch_reveals_them(subnet, wallets):
    subnet.advance(1000)  # epoch 2 of tempo 360 runs from block 720 to 1079
    submission = subnet.set_weights(wallets["validator"], {2: 3.0, 3: 1.0}, version_key=0)
    assert submission.committed and submission.detail == "committed at block 1000, revealed at block 1080"
    assert subnet.weights() == {}
    (commit,) = subnet.commits()
    assert (commit.commit_block, commit.reveal_block, commit.outcome) == (1000, 1080, None)
    # The commit counts for the rate limit at once (LastUpdate is the commit block).
    with pytest.raises(RateLimited, match="CommittingWeightsTooFast"):
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    subnet.advance(79)
    assert subnet.weights() == {}
    subnet.advance(1)
    assert subnet.weights() == {1: {2: 0.75, 3: 0.25}}
    assert subnet.commits()[0].outcome == "revealed"
    # The reveal leaves LastUpdate at the commit (internal_set_weights sets it only without commit-reveal).
    assert subnet.last_update(hotkey(wallets["validator"])) == 1000


def test_a_commit_that_breaks_a_rule_at_its_reveal_is_dropped_silently(subnet, wallets):
    """The commit itself checks only registration and the rate limit; the reveal runs do_set_weights,
    and a failure there is dropped without a word (reveal_crv3_commits_for_subnet): a validator
    without a permit may see its commits accepted and nothing ever applied."""
    subnet.set_hyperparameters(weights_version_key=5)
    assert subnet.set_weights(wallets["miner"], {3: 1.0}, version_key=5).committed  # no permit: accepted
    assert subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=4).committed  # old key: accepted
    subnet.advance(360)
    assert subnet.weights() == {}
    outcomes = [commit.outcome for commit in subnet.commits()]
    assert outcomes[0].startswith("dropped: cannot set weights: NeuronNoValidatorPermit")
    assert outcomes[1].startswith("dropped: cannot set weights: IncorrectWeightVersionKey")


def test_a_hotkey_that_takes_a_uid_between_commit_and_reveal_does_not_inherit_its_weight(subnet, wallets):
    """Yuma's epoch masks a weight whose setter last updated (on a commit-reveal subnet: committed)
    at or before the target uid's registration block (run_epoch's outdated mask): a newcomer that
    took the miner's uid after the commit gets none of what was committed for the miner."""
    subnet.advance(1000)
    planned = {0: hotkey(wallets["owner"]), 2: hotkey(wallets["miner"])}
    assert subnet.set_weights(wallets["validator"], {0: 0.4, 2: 0.6}, version_key=0, hotkeys=planned).committed
    subnet.advance(10)
    subnet.deregister(hotkey(wallets["miner"]))
    assert subnet.register(address(), address()) == 2
    subnet.advance(70)  # the reveal, at block 1080
    assert subnet.commits()[0].outcome == "revealed"
    assert subnet.weights() == {1: {0: 0.4, 2: 0.0}}


def test_at_most_ten_commits_wait_for_their_reveal(subnet, wallets):
    subnet.set_hyperparameters(weights_rate_limit=0)
    for _ in range(10):
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    with pytest.raises(Refused, match="TooManyUnrevealedCommits"):
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    subnet.advance(360)
    subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    assert [commit.outcome for commit in subnet.commits()].count("revealed") == 10


def test_the_ten_commits_cap_counts_the_commits_of_one_epoch(subnet, wallets):
    """internal_commit_timelocked_weights counts a hotkey's commits in the queue of the current epoch
    (TimelockedWeightCommits is keyed by epoch): with a reveal two epochs away, ten commits waiting
    from the last epoch do not refuse this epoch's first."""
    subnet.set_hyperparameters(weights_rate_limit=0, reveal_period_epochs=2)
    for _ in range(10):
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    subnet.advance(FINNEY.tempo)
    assert subnet.set_weights(wallets["validator"], {3: 1.0}, version_key=0).committed
    assert [commit.outcome for commit in subnet.commits()] == [None] * 11


def test_a_reveal_period_raised_with_a_commit_pending_reveals_it_later(subnet, wallets):
    """Subtensor keeps a commit under the epoch it was made in and reveals, at each epoch's start, the
    commits of the epoch RevealPeriodEpochs (read then) before it: raised from 1 to 3 after a commit
    of epoch 0, the commit is revealed at the start of epoch 3 (block 1080), not of epoch 1."""
    subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    subnet.advance(10)
    subnet.set_hyperparameters(reveal_period_epochs=3)
    assert [commit.reveal_block for commit in subnet.commits()] == [1080]
    subnet.advance(1069)
    assert subnet.weights() == {} and subnet.commits()[0].outcome is None
    subnet.advance(1)
    assert subnet.weights() == {1: {2: 1.0}}


def test_a_reveal_period_lowered_past_a_pending_commits_reveal_drops_it(subnet, wallets):
    """Lowered from 3 to 1 in epoch 1, the reveal of a commit of epoch 0 (due at epoch 1 by the new
    period) has passed: subtensor removes it as expired at the next epoch's start, unrevealed."""
    subnet.set_hyperparameters(reveal_period_epochs=3)
    subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    subnet.advance(400)
    subnet.set_hyperparameters(reveal_period_epochs=1)
    subnet.advance(1000)
    assert subnet.weights() == {}
    (commit,) = subnet.commits()
    assert commit.outcome == "dropped: expired: the reveal period was lowered to 1 epoch(s), past its reveal"


def test_a_tempo_change_restarts_the_epoch_cycle_and_moves_the_pending_reveals(subnet, wallets):
    """Subtensor's tempo setters restart the epoch cycle at the block of the change (LastEpochBlock):
    the next epoch starts a whole new tempo later, and a commit waiting for the next epoch's start is
    revealed then; the ten commits of one epoch stay counted together."""
    subnet.set_hyperparameters(weights_rate_limit=0)
    subnet.advance(300)
    for _ in range(9):
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    subnet.advance(10)  # block 310
    subnet.set_hyperparameters(tempo=100)
    assert subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0).detail == (
        "committed at block 310, revealed at block 410"
    )
    with pytest.raises(Refused, match="TooManyUnrevealedCommits"):
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    assert {commit.reveal_block for commit in subnet.commits()} == {410}
    subnet.advance(99)
    assert subnet.weights() == {}
    subnet.advance(1)
    assert subnet.weights() == {1: {2: 1.0}}
    assert subnet.set_weights(wallets["validator"], {3: 1.0}, version_key=0).detail == (
        "committed at block 410, revealed at block 510"
    )


def test_max_allowed_uids_below_the_subnets_size_is_refused(subnet):
    """sudo_set_max_allowed_uids: MaxAllowedUIdsLessThanCurrentUIds (trimming is another call)."""
    with pytest.raises(ChainError, match="MaxAllowedUIdsLessThanCurrentUIds: the subnet holds 4 uids"):
        subnet.set_hyperparameters(max_allowed_uids=3)
    assert subnet.hyperparameters().max_allowed_uids == 256
    assert subnet.set_hyperparameters(max_allowed_uids=4).max_allowed_uids == 4


def test_a_trim_shrinks_the_subnet_and_moves_the_rest_to_the_lowest_uids(subnet, wallets):
    """sudo_trim_to_max_allowed_uids: the least-staked neurons past their immunity go (with the
    weights they set and those set on them), the rest move left in their order with their own."""
    subnet.set_min_allowed_uids(2)
    subnet.set_hyperparameters(commit_reveal_enabled=False, weights_rate_limit=0)
    subnet.advance(FINNEY.immunity_period)
    subnet.deregister(hotkey(wallets["owner"]))  # uid 0 free: a gap, as a pruned uid leaves here
    assert subnet.register(hotkey(wallets["owner"]), address(), stake=5.0) == 0
    subnet.set_owner(hotkey(wallets["owner"]))
    newcomer = address()
    assert subnet.register(newcomer, address()) == 4  # immune, stake 0
    subnet.set_weights(wallets["validator"], {0: 1.0, 2: 2.0, 3: 1.0, 4: 1.0}, version_key=0)
    with pytest.raises(ChainError, match="InvalidValue: the subnet takes between its MinAllowedUids 2 and"):
        subnet.trim_to_max_allowed_uids(1)
    with pytest.raises(ChainError, match="TrimmingWouldExceedMaxImmunePercentage: 2 neurons are immune"):
        subnet.trim_to_max_allowed_uids(2)
    assert subnet.trim_to_max_allowed_uids(3) == {0: 0, 1: 1, 4: 2}  # the miners (stake 0) go, uid 3 first
    assert [(n.uid, n.hotkey) for n in subnet.metagraph().neurons] == [
        (0, hotkey(wallets["owner"])),
        (1, hotkey(wallets["validator"])),
        (2, newcomer),
    ]
    assert subnet.weights() == {1: {0: 0.2, 2: 0.2}}
    assert subnet.hyperparameters().max_allowed_uids == 3
    with pytest.raises(ChainError, match="InvalidValue"):
        subnet.trim_to_max_allowed_uids(4)  # above max_allowed_uids now


# --- serving ---


def test_publish_endpoint_follows_the_serving_rules(chain, wallets):
    miner = wallets["miner"]
    with pytest.raises(ChainError, match="HotKeyNotRegisteredInNetwork"):
        chain.publish_endpoint(miner, "203.0.113.5", 8001)
    chain.register_wallet(miner)
    chain.advance(10)  # at block 0 a publication would count as none (the last serve's block 0 means never)
    chain.publish_endpoint(miner, "203.0.113.5", 8001)
    assert chain.neuron(hotkey(miner)).endpoint == Endpoint("203.0.113.5", 8001)
    chain.publish_endpoint(miner, "203.0.113.5", 8001)  # the same endpoint: nothing to do, no rate limit spent
    for host, port, problem in (
        ("miner.example.org", 8001, "stores an IPv4 or IPv6 address"),
        ("203.0.113.5", 0, "InvalidPort"),
        ("203.0.113.5", 70000, "InvalidPort"),
    ):
        with pytest.raises(ChainError, match=problem):
            chain.publish_endpoint(miner, host, port)
    # axon_passes_rate_limit: another endpoint only ServingRateLimit (50) blocks after the last one.
    with pytest.raises(RateLimited, match="ServingRateLimitExceeded") as raised:
        chain.publish_endpoint(miner, "203.0.113.6", 8001)
    assert raised.value.blocks_to_wait == 50
    chain.advance(50)
    chain.publish_endpoint(miner, "2001:db8::6", 8002)
    assert chain.neuron(hotkey(miner)).endpoint == Endpoint("2001:db8::6", 8002)


@pytest.mark.parametrize(
    "hosts, why, allowed_by_the_file",
    [
        (("127.0.0.1", "::1"), "the loopback address", True),
        (("255.255.255.255", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), "the all-ones address", False),
    ],
    ids=["loopback", "all-ones"],
)
def test_the_addresses_subtensor_refuses_are_refused(chain, wallets, hosts, why, allowed_by_the_file):
    """is_valid_ip_address refuses 127.0.0.1 and ::1, the two loopback addresses it names, which a
    dev chain file may allow (allow-loopback), and an IPv4 address of u32::MAX or an IPv6 one of
    u128::MAX, which allow-loopback does not let in; the address one below each is taken."""
    chain.set_hyperparameters(serving_rate_limit=0)
    miner = wallets["miner"]
    chain.register_wallet(miner)
    for host in hosts:
        with pytest.raises(ChainError, match=f"InvalidIpAddress: {host} is {why}"):
            chain.publish_endpoint(miner, host, 8001)
    assert chain.neuron(hotkey(miner)).endpoint is None
    chain.allow_loopback_axons(True)
    for host in hosts:
        if allowed_by_the_file:
            chain.publish_endpoint(miner, host, 8001)
            assert chain.neuron(hotkey(miner)).endpoint == Endpoint(host, 8001)
        else:
            with pytest.raises(ChainError, match=f"InvalidIpAddress: {host} is {why}"):
                chain.publish_endpoint(miner, host, 8001)
    for host in ("127.0.0.0", "::", "255.255.255.254", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"):
        chain.publish_endpoint(miner, host, 8001)
        assert chain.neuron(hotkey(miner)).endpoint == Endpoint(host, 8001)


# --- deregistration and re-registration ---


def test_a_full_subnet_replaces_its_least_staked_neuron_past_immunity(subnet, wallets):
    """replace_neuron: a new hotkey takes the uid, the old one's weights, endpoint and permit go, and
    the weights others set on the uid become 0; the owner's hotkey and immune neurons stay (with
    MinNonImmuneUids 0, so that neurons past immunity are always the ones replaced)."""
    direct(subnet, weights_rate_limit=0, serving_rate_limit=0, max_allowed_uids=4, immunity_period=100)
    subnet.set_min_non_immune_uids(0)
    subnet.publish_endpoint(wallets["miner"], "203.0.113.2", 8001)
    subnet.set_weights(wallets["validator"], {2: 0.6, 3: 0.4}, version_key=0)
    subnet.set_weights(wallets["other"], {3: 1.0}, version_key=0)  # a self-weight of uid 3
    subnet.advance(100)
    newcomer = address()
    assert subnet.register(newcomer, address()) == 2  # uids 2 and 3 hold no stake; 2 registered first
    neuron = subnet.metagraph().by_uid(2)
    assert (neuron.hotkey, neuron.endpoint, neuron.validator_permit) == (newcomer, None, False)
    assert subnet.weights() == {1: {2: 0.0, 3: 0.4}, 3: {3: 1.0}}
    assert not subnet.is_registered(hotkey(wallets["miner"])) and len(subnet.metagraph().neurons) == 4
    assert subnet.register(address(), address()) == 3  # then uid 3, not the immune newcomer's uid 2
    assert subnet.register(address(), address()) == 1  # then the validator; the owner's uid 0 is never taken


def test_a_full_subnet_replaces_an_immune_neuron_while_too_few_are_past_immunity(subnet, wallets):
    """get_neuron_to_prune replaces a neuron past immunity only while more than MinNonImmuneUids (10
    by default) of them remain, the owner's apart; else the immune neuron of least emission (here:
    stake), earliest registered; with no immune one either, NoNeuronIdAvailable. A full subnet of
    immune neurons takes registrations: the newest miner may lose its uid at once."""
    subnet.set_hyperparameters(max_allowed_uids=4, immunity_period=100)
    subnet.advance(50)
    assert subnet.register(address(), address()) == 2  # all immune: uids 2 and 3 hold no stake, 2 is older
    subnet.advance(50)  # uids 1 and 3 past immunity, 2 <= 10 of them: uid 2, immune, goes again
    assert subnet.register(address(), address()) == 2
    subnet.advance(100)  # none immune, 3 <= 10 past immunity
    with pytest.raises(ChainError, match="NoNeuronIdAvailable"):
        subnet.register(address(), address())
    subnet.set_min_non_immune_uids(2)
    assert subnet.register(address(), address()) == 3  # 3 > 2 past immunity: the least-staked of them
    assert subnet.min_non_immune_uids() == 2 and len(subnet.metagraph().neurons) == 4


def test_without_a_uid_for_the_owners_hotkey_its_coldkeys_oldest_neuron_is_never_replaced(chain):
    """get_immune_owner_uids (ImmuneOwnerUidsLimit 1): the owner's hotkey's uid, or, while that hotkey
    holds none, the earliest registered neuron of the owner's coldkey is never pruned nor trimmed."""
    owner_coldkey, kept, later = address(), address(), address()
    chain.set_hyperparameters(max_allowed_uids=3, immunity_period=10)
    chain.set_min_non_immune_uids(0)
    chain.set_min_allowed_uids(2)
    assert chain.register(kept, owner_coldkey) == 0
    chain.register(address(), address(), stake=5.0)
    chain.register(later, owner_coldkey, stake=1.0)
    chain.set_owner(address(), coldkey=owner_coldkey)  # the owner's hotkey holds no uid
    chain.advance(20)
    assert chain.register(address(), address()) == 2  # the least-staked but for uid 0: the coldkey's later one
    assert chain.metagraph().by_uid(0).hotkey == kept
    chain.advance(20)
    assert chain.trim_to_max_allowed_uids(2) == {0: 0, 1: 1}  # uid 2, the newcomer, goes; uid 0 stays
    assert chain.metagraph().by_uid(0).hotkey == kept and not chain.is_registered(later)


def test_a_deregistered_uid_goes_to_the_next_registration(subnet, wallets):
    direct(subnet, weights_rate_limit=0)
    subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=0)
    subnet.deregister(hotkey(wallets["miner"]))
    assert subnet.weights() == {1: {2: 0.0}}
    assert subnet.register(address(), address()) == 2
    assert subnet.register(address(), address()) == 4


# --- owner and identity ---


def test_owner_uid_defaults_to_uid0_and_is_none_without_a_uid(chain, wallets):
    with pytest.raises(ChainError, match="no subnet owner"):
        chain.owner_uid()
    first, second = address(), address()
    chain.register(first, address())
    chain.register(second, address())
    assert chain.owner_uid() == 0
    chain.set_owner(second)
    assert chain.owner_uid() == 1
    chain.set_owner(address(), coldkey=address())  # an owner whose hotkey holds no uid
    assert chain.owner_uid() is None
    with pytest.raises(ChainError, match="name the owner's coldkey"):
        chain.set_owner(address())


def test_only_the_owners_coldkey_publishes_the_api_location(subnet, wallets):
    location = ApiLocation("https://api.example.org", hotkey(wallets["other"]))
    assert subnet.api_location() is None
    with pytest.raises(ChainError, match="NotSubnetOwner") as refused:
        subnet.publish_api_location(wallets["validator"], location)
    # The cure, as subtensor's refusal comes with the SDK's remediation.
    assert str(refused.value).endswith("sign with the wallet whose coldkey owns the subnet (--wallet.name)")
    subnet.publish_api_location(wallets["owner"], location)
    assert subnet.api_location() == location
    moved = ApiLocation("http://198.51.100.4:8000")
    subnet.publish_api_location(wallets["owner"], moved)
    assert DevChain(subnet.path).api_location() == moved


def test_the_api_location_is_refused_past_the_identitys_1024_bytes(subnet, wallets):
    """is_valid_subnet_identity: the identity's additional text, the owner's own and the location
    together, is at most 1024 bytes of UTF-8; more is InvalidIdentity and the identity stays as it was."""
    owner, tag = wallets["owner"], "quasar-api="
    base = "https://api.example.org/"
    fits = ApiLocation(base + "a" * (1024 - len(tag) - len(base)))
    subnet.publish_api_location(owner, fits)
    assert subnet.api_location() == fits
    for url in (fits.url + "a", base + "\u00e9" * 500):  # 1025 bytes; 1035 bytes in 535 characters
        with pytest.raises(ChainError, match=r"InvalidIdentity: .* would be 10\d\d bytes, above the chain's 1024"):
            subnet.publish_api_location(owner, ApiLocation(url))
    assert subnet.api_location() == fits


def test_the_api_location_lives_among_the_owners_other_text():
    additional = encode_api_location("QUASAR: fastest kernels wins", ApiLocation("https://a.example", "5Fkey"))
    assert additional == "QUASAR: fastest kernels wins quasar-api=https://a.example quasar-api-hotkey=5Fkey"
    assert decode_api_location(additional) == ApiLocation("https://a.example", "5Fkey")
    replaced = encode_api_location(additional, ApiLocation("https://b.example"))
    assert replaced == "QUASAR: fastest kernels wins quasar-api=https://b.example"
    assert decode_api_location(replaced) == ApiLocation("https://b.example", "")
    assert decode_api_location("no tag here") is None and decode_api_location(None) is None


# --- many processes ---


def test_concurrent_registrations_from_many_handles_get_distinct_uids(chain):
    hotkeys = [address() for _ in range(24)]
    uids, errors = [], []

    def register(batch):
        handle = DevChain(chain.path)  # its own connections, like another process
        for key in batch:
            try:
                uids.append(handle.register(key, key))
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


def cli(chain: DevChain, *arguments: str, columns: int | None = None) -> subprocess.CompletedProcess:
    environment = None if columns is None else {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "quasar.chain.devchain", "--path", str(chain.path), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )


def test_cli_in_another_process_shares_the_file(chain):
    key, coldkey = address(), address()
    result = cli(chain, "register", "--hotkey", key, "--coldkey", coldkey, "--validator")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
    assert chain.has_validator_permit(key)
    result = cli(chain, "register", "--hotkey", key, "--coldkey", coldkey)
    assert result.returncode == 1 and "already registered" in result.stderr and "Traceback" not in result.stderr


def test_cli_without_its_path_uses_the_devchain_path_setting(tmp_path):
    """`quasar devchain` required --path although the processes read the DEVCHAIN_PATH setting
    (.env < environment), whose file it is meant to look at."""
    env = {**os.environ, "QUASAR_DOTENV": str(tmp_path / "quasar.env")}
    (tmp_path / "quasar.env").write_text(f"DEVCHAIN_PATH={tmp_path / 'from-env-file.sqlite3'}\n")
    command = [sys.executable, "-m", "quasar.chain.devchain", "block"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 0 and (tmp_path / "from-env-file.sqlite3").is_file(), done.stderr
    env["DEVCHAIN_PATH"] = str(tmp_path / "from-environment.sqlite3")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 0 and (tmp_path / "from-environment.sqlite3").is_file(), done.stderr
    env["NETUID"] = "twelve"  # a bad setting is refused naming it, as the processes refuse it
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 2 and "NETUID (from environment)" in done.stderr


def test_cli_sets_hyperparameters_and_the_loopback_allowance(chain, wallets):
    result = cli(chain, "set-hyperparameter", "commit_reveal_enabled", "false")
    assert result.returncode == 0, result.stderr
    result = cli(chain, "set-hyperparameter", "weights_version_key", "7")
    assert result.returncode == 0 and "weights_version_key" in result.stdout
    assert (chain.hyperparameters().commit_reveal_enabled, chain.hyperparameters().weights_version_key) == (False, 7)
    result = cli(chain, "set-hyperparameter", "tempo", "soon")
    assert result.returncode == 1 and "tempo takes an integer, got 'soon'" in result.stderr
    assert chain.hyperparameters().tempo == 360
    chain.register_wallet(wallets["miner"])
    assert cli(chain, "allow-loopback", "on").returncode == 0
    chain.publish_endpoint(wallets["miner"], "127.0.0.1", 8001)
    listing = cli(chain, "hyperparameters")
    assert listing.returncode == 0 and "finney's default" in listing.stdout
    assert cli(chain, "stake-threshold", "1000").stdout.strip() == "1000" and chain.stake_threshold() == 1000
    assert cli(chain, "stake-threshold", "--", "-1").returncode == 1 and chain.stake_threshold() == 1000
    assert cli(chain, "min-non-immune-uids").stdout.strip() == "10"
    assert cli(chain, "min-non-immune-uids", "3").returncode == 0 and chain.min_non_immune_uids() == 3
    assert cli(chain, "max-allowed-validators").stdout.strip() == "64"
    assert cli(chain, "max-allowed-validators", "8").returncode == 0 and chain.max_allowed_validators() == 8
    assert cli(chain, "max-allowed-validators", "--", "-1").returncode == 1 and chain.max_allowed_validators() == 8
    refused = " ".join(cli(chain, "trim", "2").stderr.split())  # wrapped within 80 columns
    assert "InvalidValue: the subnet takes between its MinAllowedUids 64" in refused
    chain.register_wallet(wallets["other"])  # uid 1, stake 0: the one a trim takes
    chain.register_wallet(wallets["validator"], stake=5.0)
    chain.advance(FINNEY.immunity_period)
    trimmed = cli(chain, "trim", "2", "--min-allowed-uids", "1")
    assert (trimmed.returncode, trimmed.stdout) == (0, "uid 2 -> 1\n"), trimmed.stderr
    assert chain.hyperparameters().max_allowed_uids == 2


def test_cli_tables_fit_80_columns_with_every_figure_whole(subnet, wallets):
    subnet.set_hyperparameters(weights_rate_limit=0)
    subnet.publish_endpoint(wallets["miner"], "203.0.113.250", 8091)
    subnet.publish_endpoint(wallets["other"], "2001:db8:85a3::8a2e:370:7334", 8091)
    subnet.set_weights(wallets["validator"], {2: 0.6, 3: 0.4}, version_key=0)
    subnet.set_weights(wallets["validator"], {2: 0.5, 99: 0.5}, version_key=0)  # dropped at its reveal
    subnet.advance(FINNEY.tempo)
    listings = {
        command: cli(subnet, command, columns=80) for command in ("neurons", "weights", "commits", "hyperparameters")
    }
    for command, listing in listings.items():
        assert listing.returncode == 0, listing.stderr
        assert max(len(line) for line in listing.stdout.splitlines()) <= 80, (command, listing.stdout)
    neurons = listings["neurons"].stdout
    for neuron in subnet.metagraph().neurons:  # short forms whole, on the neuron's own line
        (line,) = [line for line in neurons.splitlines() if short_hotkey(neuron.hotkey) in line]
        assert short_hotkey(neuron.coldkey) in line and line.split()[0] == str(neuron.uid)
    assert " 203.0.113.250:8091" in neurons and "10000" in neurons
    assert "0.600000" in listings["weights"].stdout and "0.400000" in listings["weights"].stdout
    commits = " ".join(listings["commits"].stdout.split())
    assert "revealed" in commits and "UidVecContainInvalidOne: uids [99] are not registered" in commits
    assert "immunity_period 5000 5000" in " ".join(listings["hyperparameters"].stdout.split())


def test_cli_commits_lists_the_newest_unless_asked_for_all(subnet, wallets):
    """The local network's validator commits every few blocks: after 5 minutes `quasar devchain
    commits` printed 112 rows (a row a second after an hour), the newest, pending, scrolled past."""
    subnet.set_hyperparameters(weights_rate_limit=0)
    for commit in range(25):
        subnet.set_weights(wallets["validator"], {2: 1.0}, version_key=commit)
        if commit % 5 == 4:
            subnet.advance(FINNEY.tempo)
    blocks = [str(commit.commit_block) for commit in subnet.commits()]
    newest = cli(subnet, "commits", columns=80)
    assert newest.returncode == 0, newest.stderr
    lines = newest.stdout.splitlines()
    assert lines[-1] == "the newest 20 of 25 commits; --all lists every one"
    rows = [line.split() for line in lines if line.split()[:1] == [short_hotkey(hotkey(wallets["validator"]))]]
    assert [row[1] for row in rows] == blocks[-20:]
    every = cli(subnet, "commits", "--all", columns=80)
    assert "--all" not in every.stdout
    assert len([line for line in every.stdout.splitlines() if short_hotkey(hotkey(wallets["validator"])) in line]) == 25


def test_factory_builds_the_dev_chain_from_settings(tmp_path):
    settings = config.resolve(
        {
            "network": "devchain",
            "devchain_path": str(tmp_path / "c.sqlite3"),
            "netuid": "3",
            "devchain_block_time": "0.5",
        },
        environ={},
        dotenv_path=None,
    )
    chain = connect(settings)
    assert isinstance(chain, DevChain) and chain.netuid == 3 and chain.block_time_s == 0.5
    finney = config.resolve({"network": "finney"}, environ={}, dotenv_path=None)
    assert not isinstance(connect(finney), DevChain)
