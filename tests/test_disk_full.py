"""A disk that fills up (ENOSPC) under the submission API's database and the miner's state: each
runs on a small tmpfs of its own (tests/small_disk.py), filled at a chosen moment. What was
acknowledged or saved before is kept, the failure is a clear error of that request or cycle, and
each carries on once space is back, without a restart (docs/api.md and docs/miner.md, "When the
disk fills up")."""

from __future__ import annotations

import errno

import pytest

from quasar.imports import QUASAR_DIR
from quasar.miner.state import StateStore
from quasar.miner.strategies import Candidate, EditRejected
from quasar.miner.submission import COMMIT_REVEAL
from test_miner_submission import Setup, measurement
from tests.small_disk import SmallDisk, unavailable

UNAVAILABLE = unavailable()
pytestmark = pytest.mark.skipif(bool(UNAVAILABLE), reason=f"no small disk for one process here: {UNAVAILABLE}")


@pytest.fixture
def setup(tmp_path):
    running = Setup(tmp_path)
    yield running
    running.close()


def test_a_full_disk_never_lets_a_commitment_leave_before_its_salt_is_saved(setup, tmp_path):
    with SmallDisk(tmp_path / "disk", 1) as disk:
        setup.store = StateStore(disk.outside("state.json"))
        submitter = setup.submitter(COMMIT_REVEAL)
        commit = setup.new_commit("kernel found while the disk is full")
        disk.fill()
        with pytest.raises(OSError) as raised:
            submitter.submit_if_better(measurement(commit, 1000.0))
        assert raised.value.errno == errno.ENOSPC
        for _ in range(2):  # the miner's wait moves a pending reveal on, the disk still full
            try:
                submitter.advance()
            except OSError:
                pass
        # The salt is nowhere on disk: a commitment sent now could never be revealed after a restart.
        assert setup.client(setup.miner).pending_reveals(setup.hotkey).pending == []
        assert submitter.state.pending_reveal is None
        assert not disk.outside("state.json").exists()

        disk.free()
        assert submitter.submit_if_better(measurement(commit, 1000.0))
        restarted = setup.submitter(COMMIT_REVEAL)
        assert restarted.state.pending_reveal is not None
        setup.chain.advance(100)
        assert restarted.advance()
        assert [item.commit_hash for item in setup.work()] == [commit]


def test_a_candidate_that_a_full_disk_cannot_write_is_not_rejected_as_an_edit(tmp_path):
    with SmallDisk(tmp_path / "disk", 1) as disk:
        repo = disk.outside("fork")
        chunk = repo / QUASAR_DIR / "chunk.py"
        chunk.parent.mkdir(parents=True)
        chunk.write_text("original = 1\n")
        candidate = Candidate("tuning", "a bigger kernel", {f"{QUASAR_DIR}/chunk.py": "tuned = 2\n" * 100_000})
        disk.fill()
        # The disk's failure, not the edit's: a REJECTED attempt would be remembered and never tried again.
        with pytest.raises(OSError) as raised:
            candidate.apply(repo)
        assert not isinstance(raised.value, EditRejected)
        assert raised.value.errno == errno.ENOSPC
        assert chunk.read_text() == "original = 1\n"
        disk.free()
        candidate.apply(repo)
        assert chunk.read_text().startswith("tuned = 2\n")
