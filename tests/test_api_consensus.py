"""No single validator decides alone, and a copied fork never outranks its author: a real API on
127.0.0.1 (SQLite and PostgreSQL) with the settings' default quorum, and the dev chain with three
validators of different stakes, none holding half (v1 4,000, v2 3,500, v3 2,500). Every miner
submits from 127.0.0.1, as miners behind one NAT do: a ban would hit them all."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from api_fixtures import FORK, SLOW_BLOCKS, ApiServer, Clock, api_config, commit_of, refused
from quasar import config
from quasar.api.client import ApiClient, Claim
from quasar.api.rules import commitment_hash, new_salt
from quasar.chain.devchain import DevChain
from quasar.validator.worker import kernel_content_hash

STAKES = {"v1": 4000.0, "v2": 3500.0, "v3": 2500.0}
MINERS = ("a", "b", "c")
TARGET = 1_000_000
STARTER_KERNEL = Path(__file__).resolve().parents[1] / "quasar" / "starter_fork" / "tree" / "fla" / "ops" / "quasar"


@dataclass
class Subnet:
    url: str
    chain: DevChain
    clients: dict[str, ApiClient]

    def hotkey(self, name: str) -> str:
        return self.clients[name].wallet.hotkey.ss58_address

    def leaderboard(self):
        self.chain.advance(1)  # the leaderboard is computed once per block: the next one shows every report
        return self.clients["a"].leaderboard()


@pytest.fixture
def subnet(tmp_path, wallets, database_url) -> Iterator[Subnet]:
    chain = DevChain(tmp_path / "devchain.sqlite3", netuid=24, block_time_s=SLOW_BLOCKS)
    for name in MINERS:
        chain.register_wallet(wallets[name])
    for name, stake in STAKES.items():
        chain.register_wallet(wallets[name], stake=stake, validator_permit=True)
    shipped = {
        key: config.OPTIONS_BY_KEY[key].parse(config.OPTIONS_BY_KEY[key].default)
        for key in ("quorum_stake_share", "quorum_min_validators")
    }
    assert shipped == {"quorum_stake_share": 0.6, "quorum_min_validators": 2}
    api_hotkey = wallets["api"].hotkey.ss58_address
    with ApiServer(api_config(api_hotkey, **shipped), chain, database_url, Clock()) as server:
        clients = {name: ApiClient(server.url, wallets[name], api_hotkey=api_hotkey) for name in (*MINERS, *STAKES)}
        yield Subnet(server.url, chain, clients)
        for client in clients.values():
            client.close()


def fetch_all(subnet: Subnet) -> None:
    for name in STAKES:
        subnet.clients[name].fetch_work(limit=100)


@pytest.mark.parametrize("lie", ["fails_everything", "reports_1e15"])
def test_a_lying_validator_changes_no_rank_and_bans_no_ip(subnet, lie):
    speeds = {"a": 300_000.0, "b": 200_000.0, "c": 100_000.0}
    submitted = {}
    for _ in range(2):  # six submissions from one IP: five failures would ban it
        batch = {}
        for name, speed in speeds.items():
            accepted = subnet.clients[name].submit_kernel(
                Claim(FORK, commit_of(len(submitted) + len(batch) + 1), speed), TARGET
            )
            batch[accepted.submission_id] = speed
        fetch_all(subnet)
        for submission_id, speed in batch.items():
            # The liar holds the largest stake and reports first, every time.
            if lie == "fails_everything":
                lied = subnet.clients["v1"].report(
                    submission_id, "failed", correct=False, reasons=["output differs from the reference"]
                )
            else:
                lied = subnet.clients["v1"].report(
                    submission_id, "passed", correct=True, logits_ok=True, measured_tokens_per_sec=1e15
                )
            honest = [
                subnet.clients["v2"].report(submission_id, "passed", True, True, speed),
                subnet.clients["v3"].report(submission_id, "passed", True, True, speed * 1.01),
            ]
            assert not any(accepted.failure_counted for accepted in (lied, *honest))
        submitted.update(batch)
    board = subnet.leaderboard()
    assert [entry.hotkey for entry in board.entries] == [subnet.hotkey(name) for name in ("a", "b", "c")]
    for entry in board.entries:
        honest_figure = submitted[entry.submission_id]
        assert honest_figure <= entry.measured_tokens_per_sec <= honest_figure * 1.01
        assert (entry.validators, entry.reported_stake_share) == (3, pytest.approx(1.0))
    # No failure was charged: the same IP still submits.
    assert subnet.clients["a"].submit_kernel(Claim(FORK, commit_of(999), 1e5), TARGET).state == "ready"
    # The liar shows: it disagrees with every verdict, or its figures are off by orders of magnitude.
    validators = {v.validator_hotkey: v for v in subnet.clients["a"].validators().validators}
    liar, honest_one = validators[subnet.hotkey("v1")], validators[subnet.hotkey("v2")]
    assert (liar.stake, liar.stake_share, liar.reports, liar.judged) == (4000.0, pytest.approx(0.4), 6, 6)
    if lie == "fails_everything":
        assert (liar.agreed, liar.disagreed, liar.agreement) == (0, 6, 0.0)
    else:
        assert liar.agreed == 6 and liar.median_deviation > 1e9
    assert (honest_one.agreed, honest_one.disagreed) == (6, 0) and honest_one.median_deviation < 0.011
    page = httpx.get(subnet.url + "/dashboard/validators").text
    assert subnet.hotkey("v1")[:8] in page and ('<span class="badge failed">6</span>' in page) == (
        lie == "fails_everything"
    )


def test_quorum_not_reached_is_not_ranked_and_the_status_says_why(subnet):
    a, b = subnet.clients["a"], subnet.clients["b"]
    first = a.submit_kernel(Claim(FORK, commit_of(1), 1e5), TARGET)
    fetch_all(subnet)
    subnet.clients["v1"].report(first.submission_id, "passed", True, True, 1e5)
    waiting = a.submission_status(first.submission_id)
    assert waiting.state == "awaiting_quorum" and waiting.weighted_score is None
    assert waiting.state_reason == (
        "awaiting a quorum: 1 of 3 validators reported, holding 40% of the stake; "
        "a quorum is 2 validators holding 60% of the stake"
    )
    assert (waiting.consensus.validators_reported, waiting.consensus.validators) == (1, 3)
    board = subnet.leaderboard()
    assert board.entries == [] and board.awaiting_quorum == 1 and board.validators == 3
    assert [(item.submission_id, item.state) for item in board.not_ranked] == [(first.submission_id, "awaiting_quorum")]
    page = httpx.get(f"{subnet.url}/dashboard/submissions/{first.submission_id}").text
    assert "awaiting quorum" in page and "1 of 3 validators reported, holding 40% of the stake" in page
    assert "Not ranked yet" in httpx.get(subnet.url + "/").text

    subnet.clients["v3"].report(first.submission_id, "passed", True, True, 1.02e5)
    ranked = a.submission_status(first.submission_id)
    assert ranked.state == "passed" and ranked.measured_tokens_per_sec == 1e5
    assert [entry.submission_id for entry in subnet.leaderboard().entries] == [first.submission_id]

    # A quorum without a majority of the stake is disputed: not ranked, and no IP is charged.
    second = b.submit_kernel(Claim(FORK, commit_of(2), 1e5), TARGET)
    fetch_all(subnet)
    assert not subnet.clients["v1"].report(second.submission_id, "failed", False).failure_counted
    assert not subnet.clients["v2"].report(second.submission_id, "passed", True, True, 1e5).failure_counted
    disputed = b.submission_status(second.submission_id)
    assert disputed.state == "disputed" and disputed.state_reason.startswith(
        "disputed: passed by 35% of the stake, failed by 40%"
    )
    # The third validator fails it too: failed by 65% of the stake, and now the IP is charged, once.
    assert subnet.clients["v3"].report(second.submission_id, "failed", False).failure_counted
    assert b.submission_status(second.submission_id).state == "failed"


def write_kernel(directory: Path, disguise: bool) -> Path:
    """A checkout holding the starter fork's kernel files; ``disguise``: comments and blank lines added."""
    kernel = directory / "fla" / "ops" / "quasar"
    shutil.copytree(STARTER_KERNEL, kernel, ignore=shutil.ignore_patterns("__pycache__"))
    if disguise:
        for path in kernel.rglob("*.py"):
            text = re.sub(r"\n", "\n\n", path.read_text())
            path.write_text("# written from scratch by the copier\n" + text)
    return directory


def test_a_copy_after_the_reveal_never_outranks_the_author_even_measured_3_percent_faster(subnet, tmp_path):
    author, copier = subnet.clients["a"], subnet.clients["c"]
    author_fork, author_commit = "https://github.com/author/fla", commit_of(0xA)
    salt = new_salt()
    committed = author.commit(commitment_hash(salt, author_fork, author_commit), TARGET)
    subnet.chain.advance(100)
    # The author pushes its commit as its reveal window opens; the copier saw the push and submits
    # the commit, in that same block, before the author could reveal it.
    early = copier.submit_kernel(Claim("https://github.com/copier/fla", author_commit, 1.03e5), TARGET)
    revealed = author.reveal(committed.submission_id, salt, Claim(author_fork, author_commit, 1e5))
    assert revealed.state == "ready"  # counts from its window's opening: the author's, whoever submitted it since
    # After the reveal, the same commit again, directly or by commit-reveal: refused as a copy.
    detail = refused(
        lambda: copier.submit_kernel(Claim("https://github.com/copier/fla2", author_commit, 1.03e5), TARGET),
        409,
        "a copy is not accepted",
    )
    assert f"submission {committed.submission_id}" in detail and subnet.hotkey("a") in detail
    copier_salt = new_salt()
    late = copier.commit(commitment_hash(copier_salt, FORK, author_commit), TARGET)
    subnet.chain.advance(100)
    refused(
        lambda: copier.reveal(late.submission_id, copier_salt, Claim(FORK, author_commit, 1.03e5)),
        409,
        "a copy is not accepted",
    )
    # The same kernel files under a commit of the copier's own, disguised: what validators fingerprint.
    original_hash = kernel_content_hash(write_kernel(tmp_path / "author", disguise=False))
    copied_hash = kernel_content_hash(write_kernel(tmp_path / "copier", disguise=True))
    assert original_hash == copied_hash is not None

    fetch_all(subnet)
    for name in STAKES:  # the copy 3% faster, by every validator
        subnet.clients[name].report(committed.submission_id, "passed", True, True, 1e5, content_hash=original_hash)
        subnet.clients[name].report(early.submission_id, "passed", True, True, 1.03e5, content_hash=copied_hash)
    disguised = copier.submit_kernel(Claim("https://github.com/copier/fla", commit_of(0xC0FFEE), 1.03e5), TARGET)
    fetch_all(subnet)
    for name in STAKES:
        subnet.clients[name].report(disguised.submission_id, "passed", True, True, 1.03e5, content_hash=copied_hash)
    board = subnet.leaderboard()
    assert [(entry.hotkey, entry.submission_id) for entry in board.entries] == [
        (subnet.hotkey("a"), committed.submission_id)
    ]
    assert sorted((item.submission_id, item.state) for item in board.not_ranked) == [
        (early.submission_id, "copy"),
        (disguised.submission_id, "copy"),
    ]
    assert board.copies == 2
    for copy, same in ((early, "the same commit"), (disguised, "the same kernel files")):
        status = copier.submission_status(copy.submission_id)
        assert (status.state, status.copy_of, status.weighted_score) == ("copy", committed.submission_id, 0.0)
        assert status.state_reason.startswith(
            f"a copy of submission {committed.submission_id} by {subnet.hotkey('a')}, made earlier with {same}"
        )
        assert status.consensus.state == "passed"  # it passed; being a copy is what keeps it out
    page = httpx.get(f"{subnet.url}/dashboard/submissions/{disguised.submission_id}").text
    assert f'href="/dashboard/submissions/{committed.submission_id}"' in page and "copy" in page


def test_committing_to_a_commit_already_submitted_never_makes_it_the_committers(subnet, tmp_path):
    """The attack: Bob commits to Alice's commit as soon as she pushes it, and to a commit of his
    own holding her kernel files; Alice submits her commit directly a few blocks later, before Bob's
    reveal windows open. Were a commitment to count from its commit block, Bob's reveal would be
    accepted and ranked as the original, Alice's submission would be the copy, and her hotkey would
    wait behind everyone's for the rest of the round as a copier's."""
    alice, bob = subnet.clients["a"], subnet.clients["b"]
    alice_fork, bob_fork, commit = "https://github.com/alice/fla", "https://github.com/bob/fla", commit_of(0xA11CE)
    salt, disguised_salt, disguised_commit = new_salt(), new_salt(), commit_of(0xB0B)
    same = bob.commit(commitment_hash(salt, bob_fork, commit), TARGET)
    disguised = bob.commit(commitment_hash(disguised_salt, bob_fork, disguised_commit), TARGET)
    subnet.chain.advance(10)
    submitted = alice.submit_kernel(Claim(alice_fork, commit, 1e5), TARGET)
    subnet.chain.advance(90)  # Bob's reveal windows open
    detail = refused(
        lambda: bob.reveal(same.submission_id, salt, Claim(bob_fork, commit, 1.03e5)),
        409,
        "a copy is not accepted",
    )
    assert f"submission {submitted.submission_id}" in detail and subnet.hotkey("a") in detail
    revealed = bob.reveal(disguised.submission_id, disguised_salt, Claim(bob_fork, disguised_commit, 1.03e5))
    assert revealed.state == "ready"  # another commit: the validators' fingerprints find the copy

    original_hash = kernel_content_hash(write_kernel(tmp_path / "alice", disguise=False))
    copied_hash = kernel_content_hash(write_kernel(tmp_path / "bob", disguise=True))
    fetch_all(subnet)
    for name in STAKES:  # Bob's measured 3% faster, by every validator
        subnet.clients[name].report(submitted.submission_id, "passed", True, True, 1e5, content_hash=original_hash)
        subnet.clients[name].report(disguised.submission_id, "passed", True, True, 1.03e5, content_hash=copied_hash)
    board = subnet.leaderboard()
    assert [(entry.hotkey, entry.submission_id) for entry in board.entries] == [
        (subnet.hotkey("a"), submitted.submission_id)
    ]
    assert [(item.submission_id, item.state) for item in board.not_ranked] == [(disguised.submission_id, "copy")]
    status = bob.submission_status(disguised.submission_id)
    assert (status.state, status.copy_of) == ("copy", submitted.submission_id)
    # Bob is the copier this round, not Alice: his next submission waits behind hers.
    alice_next = alice.submit_kernel(Claim(alice_fork, commit_of(0xA2), 1e5), TARGET)
    bob_next = bob.submit_kernel(Claim(bob_fork, commit_of(0xB2), 1e5), TARGET)
    assert alice.submission_status(alice_next.submission_id).state == "queued"
    waiting = bob.submission_status(bob_next.submission_id)
    assert waiting.state == "deferred" and "a copy of another hotkey's" in waiting.state_reason
