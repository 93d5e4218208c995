"""Who came first, for originality (quasar/originality.py, docs/rules.md section 5): find_copies
against a slow, obviously correct reference on random fingerprints.

The attack it stops: a miner commits (commit-reveal) to a commit another miner has already made
public and submitted directly. Ordered by submission id (or commit block), the commitment came
first and the author's submission was the copy; a submission counts from the block it was made
ready, a commitment from the block its reveal window opened."""

from __future__ import annotations

import random

from quasar.originality import SAME_COMMIT, SAME_CONTENT, CopyOf, Fingerprint, find_copies


def reference(prints: list[Fingerprint]) -> dict[int, CopyOf]:
    """For each submission, every other that counts strictly earlier (block, then id) and shares its
    commit or its content; the earliest of them is its original, and it is a copy when that one is
    another hotkey's (the same commit named first when the original shares both)."""
    copies = {}
    for mine in prints:
        earlier = [
            other
            for other in prints
            if (other.counts_from_block, other.submission_id) < (mine.counts_from_block, mine.submission_id)
            and (
                (mine.commit_hash is not None and other.commit_hash == mine.commit_hash)
                or (mine.content_hash is not None and other.content_hash == mine.content_hash)
            )
        ]
        if not earlier:
            continue
        original = min(earlier, key=lambda other: (other.counts_from_block, other.submission_id))
        if original.hotkey != mine.hotkey:
            same = (
                SAME_COMMIT
                if mine.commit_hash is not None and original.commit_hash == mine.commit_hash
                else SAME_CONTENT
            )
            copies[mine.submission_id] = CopyOf(mine.submission_id, original.submission_id, original.hotkey, same)
    return copies


def random_prints(rng: random.Random) -> list[Fingerprint]:
    """Up to a dozen submissions of three hotkeys over a few blocks (ties happen), sharing a few
    commits and contents (or none yet); ids in any order of the blocks, as commit-reveal makes them."""
    ids = rng.sample(range(1, 60), rng.randrange(13))
    return [
        Fingerprint(
            submission_id,
            rng.choice("abc"),
            rng.choice([None, "c1", "c2", "c3"]),
            rng.choice([None, "k1", "k2"]),
            rng.randrange(5),
        )
        for submission_id in ids
    ]


def test_find_copies_agrees_with_the_reference_on_random_fingerprints():
    rng = random.Random(7)
    for _ in range(3000):
        prints = random_prints(rng)
        assert find_copies(prints) == reference(prints), prints
        rng.shuffle(prints)
        assert find_copies(prints) == reference(prints), prints


def test_a_commitment_is_the_original_from_its_window_not_its_commit():
    # Bob (id 1) committed to a commit Alice (id 2) then submitted directly at block 110; Bob's
    # window opened at block 200: Alice's is the original, whatever the ids say.
    bob = Fingerprint(1, "bob", "c", None, counts_from_block=200)
    alice = Fingerprint(2, "alice", "c", None, counts_from_block=110)
    assert find_copies([bob, alice]) == {1: CopyOf(1, 2, "alice", SAME_COMMIT)}
    # A copier submitting it directly in the very block the window opened: the lower id, the committer's.
    copier = Fingerprint(3, "copier", "c", None, counts_from_block=200)
    assert find_copies([bob, copier]) == {3: CopyOf(3, 1, "bob", SAME_COMMIT)}
