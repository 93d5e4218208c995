"""The API's pure rules against slow, obviously-correct references, and the validators' work queue
(SQL) against a plain Python model of it on random operation sequences."""

from __future__ import annotations

import hashlib
import ipaddress
import random

import pytest
from bittensor.sp_core import Keypair
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from api_fixtures import api_config
from quasar.api import rules, schemas
from quasar.api.chaincache import CachedMetagraphChain
from quasar.api.db import Database, UsedNonce, _Write
from quasar.api.service import MAX_FETCHES_PER_VALIDATOR, ApiError, SubmissionService
from quasar.chain.devchain import DevChain
from quasar.localnet.host import make_wallet


def test_commitment_is_sha256_of_the_concatenation():
    salt = "00ff" * 8
    expected = hashlib.sha256(f"{salt}https://github.com/a/b{'c' * 40}".encode()).hexdigest()
    assert rules.commitment_hash(salt, "https://github.com/a/b", "c" * 40) == expected
    assert rules.commitment_hash(salt, "https://github.com/a/b", "d" * 40) != expected
    assert len(rules.new_salt()) == 64 and rules.new_salt() != rules.new_salt()


def test_a_reveal_takes_the_salts_the_rules_allow_and_no_others():
    """The reveal's salt bounds are docs/rules.md's (32 to 128 hex digits, 16 to 64 bytes)."""
    base = {"submission_id": 1, "fork_url": "https://github.com/a/b", "commit_hash": "c" * 40, "tokens_per_sec": 1.0}
    for length in (32, 128, len(rules.new_salt())):
        assert schemas.RevealRequest(**base, commitment_salt="a" * length).commitment_salt == "a" * length
    for length in (30, 31, 129, 130):
        with pytest.raises(ValueError, match="commitment_salt"):
            schemas.RevealRequest(**base, commitment_salt="a" * length)


@given(commit=st.integers(0, 10**6), wait=st.integers(0, 500), window=st.integers(1, 500), probe=st.integers(-50, 1100))
def test_reveal_window_matches_counting_blocks(commit, wait, window, probe):
    block = commit + probe
    waited = block - commit
    expected = "waiting" if waited < wait else ("open" if waited < wait + window else "expired")
    assert rules.reveal_window(commit, wait, window).state(block) == expected


@settings(max_examples=50)
@given(round_blocks=st.integers(1, 50), upto=st.integers(0, 400))
def test_rounds_match_walking_the_chain(round_blocks, upto):
    round_id, start = 0, 0
    for block in range(upto + 1):  # the reference walks block by block, starting a round every round_blocks
        if block - start == round_blocks:
            round_id, start = round_id + 1, block
        found = rules.round_of_block(block, round_blocks)
        assert (found.round_id, found.start_block, found.end_block) == (round_id, start, start + round_blocks - 1)
        assert found.blocks_left(block) == start + round_blocks - block
        assert rules.round_by_id(round_id, round_blocks) == found


def test_a_commitment_counts_from_the_block_its_reveal_window_opens():
    # docs/rules.md section 3: a commitment counts for originality from commit block +
    # BLOCKS_UNTIL_REVEAL, a direct submission from its own block.
    assert rules.counts_from_block("commit_reveal", 1000, 100) == 1100
    assert rules.counts_from_block("direct", 1000, 100) == 1000


@pytest.mark.parametrize(("block", "round_blocks"), [(-1, 360), (0, 0), (5, -1)])
def test_a_round_of_a_negative_block_or_of_empty_rounds_is_refused(block, round_blocks):
    with pytest.raises(ValueError, match="need block >= 0 and round_blocks >= 1"):
        rules.round_of_block(block, round_blocks)


TRUSTED = rules.parse_networks(["127.0.0.1", "10.0.0.0/8"])


def reference_client_ip(peer, header_values, trusted):
    """All hops, client first and the TCP peer last; the client is the rightmost hop that is not a
    trusted proxy, looking only as far left as trusted proxies vouch for."""
    hops = [hop.strip() for value in header_values for hop in value.split(",")] + [peer]
    index = len(hops) - 1
    while index > 0 and any(ipaddress.ip_address(hops[index]) in network for network in trusted):
        index -= 1
    return hops[index]


@pytest.mark.parametrize(
    ("peer", "header", "expected"),
    [
        ("203.0.113.5", ["1.2.3.4"], "203.0.113.5"),  # untrusted peer: its header is ignored
        ("127.0.0.1", [], "127.0.0.1"),  # a trusted proxy without a header is the client
        ("127.0.0.1", ["198.51.100.1"], "198.51.100.1"),
        ("127.0.0.1", ["6.6.6.6, 198.51.100.1"], "198.51.100.1"),  # the client's own prefix is not believed
        ("127.0.0.1", ["6.6.6.6, 198.51.100.1, 10.1.2.3"], "198.51.100.1"),  # two trusted proxies
        ("127.0.0.1", ["6.6.6.6", "198.51.100.1"], "198.51.100.1"),  # several header lines, in order
        ("127.0.0.1", ["10.0.0.1, 10.0.0.2"], "10.0.0.1"),  # all trusted: the leftmost
        ("127.0.0.1", ["2001:db8::1"], "2001:db8::1"),
    ],
)
def test_client_ip_cases(peer, header, expected):
    assert rules.client_ip(peer, header, TRUSTED) == expected


def test_what_a_trusted_proxy_passes_on_that_is_not_an_address_is_the_client_cut_to_64_characters():
    # A proxy the API trusts vouches for the hop it reports, an address or not ("unknown" say); a
    # very long entry is cut, so that no key or log line grows with it.
    assert rules.client_ip("127.0.0.1", ["unknown"], TRUSTED) == "unknown"
    assert rules.client_ip("127.0.0.1", ["x" * 1000], TRUSTED) == "x" * 64


addresses = st.one_of(
    st.sampled_from(["127.0.0.1", "10.0.0.7", "10.200.1.1", "203.0.113.9", "198.51.100.4", "2001:db8::5"]),
    st.ip_addresses().map(str),
)


@given(peer=addresses, hops=st.lists(addresses, max_size=5), split=st.integers(0, 5))
def test_client_ip_matches_reference(peer, hops, split):
    # The hops may arrive over two header lines: their order is what counts, not the lines.
    header = [", ".join(part) for part in (hops[:split], hops[split:]) if part]
    assert rules.client_ip(peer, header, TRUSTED) == reference_client_ip(peer, header, TRUSTED)
    assert rules.client_ip(peer, header, ()) == peer  # without trusted proxies the header never counts


def test_addresses_are_counted_unmapped_and_ipv6_by_its_64():
    # The attack: a ban or failure count per exact address string is walked around by writing one
    # IPv4 address IPv4-mapped, or by taking the next of the 2**64 addresses of one's IPv6 /64.
    assert rules.address_key("203.0.113.7") == rules.address_key("::ffff:203.0.113.7") == "203.0.113.7"
    assert rules.address_key("::FFFF:cb00:7107") == "203.0.113.7"
    neighbours = {rules.address_key(f"2001:db8:1:2:{n:x}::{n:x}") for n in range(1, 200)}
    assert neighbours == {"2001:db8:1:2::/64"}
    assert rules.address_key("2001:db8:1:3::1") == "2001:db8:1:3::/64"  # the next /64 is another client
    assert rules.address_key("fe80::1%eth0") == "fe80::/64"
    assert rules.address_key("unknown") == "unknown"  # not an address (no peer): as it is


@given(st.ip_addresses(v=4))
def test_an_ipv4_client_is_one_key_however_written(address):
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    assert rules.address_key(str(address)) == rules.address_key(str(mapped)) == str(address)
    # A trusted proxy that connects IPv4-mapped is still the trusted proxy.
    trusted = rules.parse_networks([str(address)])
    assert rules.client_ip(str(mapped), ["198.51.100.1"], trusted) == "198.51.100.1"


# --- the work queue against a model ---


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


class QueueModel:
    """What GET /validator/pending must return, kept in plain Python: supersession, fairness per
    validator and round, what another validator reported on first, then the highest upper bound,
    leases (nothing here places four miners, so nothing is deferred: tests/test_api_schedule.py
    covers that)."""

    def __init__(self, lease_s):
        self.lease_s = lease_s
        self.ready: dict[int, tuple[str, float, float, int]] = {}  # id -> (hotkey, ready_at, upper bound, round)
        self.superseded: set[int] = set()
        self.reported: set[tuple[int, str]] = set()
        self.leases: dict[tuple[int, str], tuple[float, int, int]] = {}  # -> (until, fetches, first round)

    def submit(self, submission_id, hotkey, ready_at, bound, round_id):
        """A newer submission supersedes its hotkey's older ones of the scheduled rounds without reports."""
        for i, (owner, _, _, round_of) in self.ready.items():
            if owner == hotkey and round_of >= round_id - 1 and not any(k == i for k, _ in self.reported):
                self.superseded.add(i)
        self.ready[submission_id] = (hotkey, ready_at, bound, round_id)

    def fetch(self, validator, limit, now, round_id):
        window = {i: entry for i, entry in self.ready.items() if i not in self.superseded and entry[3] >= round_id - 1}
        waiting = []
        for i, (hotkey, ready_at, bound, _) in window.items():
            until, fetches, _ = self.leases.get((i, validator), (0.0, 0, 0))
            if (
                i in self.superseded
                or (i, validator) in self.reported
                or until > now
                or fetches >= MAX_FETCHES_PER_VALIDATOR
            ):
                continue
            waiting.append((i, hotkey, ready_at, bound))
        taken: dict[str, int] = {}
        for (i, v), (_, _, first_round) in self.leases.items():
            if v == validator and first_round == round_id:
                taken[self.ready[i][0]] = taken.get(self.ready[i][0], 0) + 1
        chosen = []
        helped = {i for i, v in self.reported if v != validator}  # another validator's consensus waits
        # The least served hotkey, then one another validator reported on, the highest bound, the oldest.
        while waiting and len(chosen) < limit:
            pick = min(waiting, key=lambda w: (taken.get(w[1], 0), w[0] not in helped, -w[3], w[2], w[0]))
            waiting.remove(pick)
            taken[pick[1]] = taken.get(pick[1], 0) + 1
            chosen.append(pick[0])
        for i in chosen:
            _, fetches, first_round = self.leases.get((i, validator), (0.0, 0, round_id))
            self.leases[(i, validator)] = (now + self.lease_s, fetches + 1, first_round)
        return chosen


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_work_queue_matches_model(tmp_path, seed):
    rng = random.Random(seed)
    miners = ("m1", "m2", "m3")
    wallets = {name: make_wallet(tmp_path / "w", name) for name in (*miners, "v1", "v2")}
    chain = DevChain(tmp_path / "chain.sqlite3", block_time_s=1e6)
    for name in ("v1", "v2"):  # their reports count (a report that counts for nothing orders nothing)
        chain.register_wallet(wallets[name], stake=1e4, validator_permit=True)
    for name in miners:  # registered: a pruned hotkey's submissions are handed out to no one
        chain.register_wallet(wallets[name])
    clock = Clock()
    database = Database(f"sqlite:///{tmp_path}/api.sqlite3")
    database.upgrade()
    service = SubmissionService(
        api_config(wallets["m1"].hotkey.ss58_address, evaluation_lease_s=100.0, round_blocks=10), chain, database, clock
    )
    model = QueueModel(100.0)
    validators = [wallets["v1"].hotkey.ss58_address, wallets["v2"].hotkey.ss58_address]
    for step in range(160):
        action = rng.random()
        round_id = chain.current_block() // 10
        if action < 0.3:
            miner = wallets[rng.choice(miners)].hotkey.ss58_address
            claim, target = rng.choice([1.0, 2.0, 3.0]), rng.choice([1000, 1_000_000])
            accepted = service.submit_direct(
                miner,
                "192.0.2.1",
                schemas.SubmitKernelRequest(
                    fork_url="https://github.com/m/fla",
                    commit_hash=f"{step + 1:040x}",
                    target_sequence_length=target,
                    tokens_per_sec=claim,
                ),
            )
            model.submit(accepted.submission_id, miner, clock.now, claim * (3.0 if target > 1000 else 0.5), round_id)
            clock.now += 0.001  # ready times apart, as they are
        elif action < 0.6:
            validator, limit = rng.choice(validators), rng.randint(1, 4)
            got = [item.submission_id for item in service.fetch_work(validator, limit).items]
            assert got == model.fetch(validator, limit, clock.now, round_id), step
        elif action < 0.85:
            validator = rng.choice(validators)
            leased = [
                key[0]
                for key in model.leases
                if key[1] == validator and key not in model.reported and key[0] not in model.superseded
            ]
            if leased:
                submission_id = rng.choice(leased)
                service.report(
                    validator,
                    schemas.ReportRequest(
                        submission_id=submission_id, verdict="passed", correct=True, measured_tokens_per_sec=3.0
                    ),
                )
                model.reported.add((submission_id, validator))
                with pytest.raises(ApiError):
                    service.report(
                        validator,
                        schemas.ReportRequest(
                            submission_id=submission_id, verdict="passed", correct=True, measured_tokens_per_sec=3.0
                        ),
                    )
        elif action < 0.95:
            clock.now += rng.choice([10.0, 60.0, 101.0])
        else:
            chain.advance(10)  # the next round: fairness counts again; two rounds on, a submission lapses
    assert model.superseded  # the sequence reached supersession
    database.dispose()


def test_cached_chain_refuses_a_deregistered_hotkey_once_it_sees_the_next_block(tmp_path):
    inner = DevChain(tmp_path / "chain.sqlite3", block_time_s=1e6)  # blocks move only through advance()
    clock = Clock()
    cached = CachedMetagraphChain(inner, block_poll_s=1.0, clock=clock)
    hotkey = Keypair.create_from_mnemonic(Keypair.generate_mnemonic()).ss58_address
    inner.register(hotkey, hotkey, validator_permit=True)
    start = inner.current_block()
    assert cached.is_registered(hotkey) and cached.has_validator_permit(hotkey)
    inner.deregister(hotkey)
    assert not inner.is_registered(hotkey)  # the dev chain itself sees its own file at once
    assert cached.is_registered(hotkey)  # the snapshot holds for the rest of its block
    inner.advance(1)
    clock.now += 0.5
    assert cached.current_block() == start and cached.is_registered(hotkey)  # block start + 1 not read yet
    clock.now += 0.5  # block_poll_s after the last read: the next block is seen, and the metagraph read again
    assert cached.current_block() == start + 1
    assert not cached.is_registered(hotkey) and not cached.has_validator_permit(hotkey)
    inner.register(hotkey, hotkey)
    inner.advance(1)
    clock.now += 1.0
    assert cached.is_registered(hotkey) and not cached.has_validator_permit(hotkey)
    with pytest.raises(ValueError, match="shorter than a block"):
        CachedMetagraphChain(DevChain(tmp_path / "fast.sqlite3", block_time_s=0.5), block_poll_s=1.0)


def test_a_group_commit_undoes_a_failed_write_alone(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/api.sqlite3")
    database.upgrade()

    def add(nonce: int, then: Exception | None = None):
        def work(session):
            session.add(UsedNonce(hotkey="h", nonce=nonce))
            session.flush()
            if then is not None:
                raise then
            return nonce

        return work

    # 2 repeats 1 (its flush fails: the ORM needs the transaction rolled back, so the group runs
    # again without it); 4 raises after its insert (rolled back to its savepoint).
    group = [_Write(work) for work in (add(1), add(1), add(3), add(4, ValueError("refused")), add(5))]
    database._group_commit._commit(group)
    assert not any(write.done.locked() for write in group)  # every one answered
    assert [write.result for write in group] == [1, None, 3, None, 5]
    assert type(group[1].error) is IntegrityError and str(group[3].error) == "refused"
    with database.read() as session:
        assert sorted(session.scalars(select(UsedNonce.nonce))) == [1, 3, 5]
    database.dispose()
