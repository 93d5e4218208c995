"""The one-process-at-a-time lock files (quasar/lock_files.py) of the miner's workspace and the
validator's state, refused as the file system or the Unix user refuses them: each refusal names the
file and the setting that cures it. A full or read-only disk: tests/test_disk_full.py."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest

from quasar import lock_files
from quasar.errors import QuasarError
from quasar.miner.workspace import Workspace
from quasar.validator.state import ValidatorState
from tests.processes import needs_another_user, open_to_other_users, run_python_as_nobody

HOTKEY_A = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
HOTKEY_B = "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty"


@dataclass(frozen=True)
class LockOwner:
    """A process kind whose folder has a lock file: how its refusals name the process and the
    folder's setting, how the first one takes it in ``folder``, the lock file, how the refusals name
    it, and the code a second Unix user runs to take its own."""

    process: str
    setting: str
    take: Callable[[Path], AbstractContextManager]
    lock_file: Callable[[Path], Path]
    named: Callable[[Path], str]
    second_user_code: Callable[[Path], str]
    # The last line of the second user's refusal, the folder's path left out.
    second_user_refusal: Callable[[Path], str]


MINER = LockOwner(
    process="this miner",
    setting="WORKSPACE_ROOT",
    take=lambda folder: Workspace(folder, HOTKEY_A),
    lock_file=lambda folder: folder / HOTKEY_A / "miner.lock",
    named=lambda folder: f"{folder / HOTKEY_A / 'miner.lock'} in the workspace",
    second_user_code=lambda folder: (
        f"from quasar.miner.workspace import Workspace\nWorkspace({str(folder)!r}, {HOTKEY_B!r}).acquire()"
    ),
    second_user_refusal=lambda folder: (
        f"quasar.miner.workspace.WorkspaceError: cannot create the workspace {folder / HOTKEY_B}: "
        "Permission denied; give this miner a WORKSPACE_ROOT that its user can write"
    ),
)
VALIDATOR = LockOwner(
    process="this validator",
    setting="VALIDATOR_DATA_DIR",
    take=lambda folder: ValidatorState.open(folder / "state-devchain-3-5A.sqlite3"),
    lock_file=lambda folder: folder / "state-devchain-3-5A.sqlite3.lock",
    named=lambda folder: str(folder / "state-devchain-3-5A.sqlite3.lock"),
    # The folder is read first: the refusal is the lock file's, not the folder's.
    second_user_code=lambda folder: (
        f"import os\nfrom quasar.validator.state import ValidatorState\nos.listdir({str(folder)!r})\n"
        f"ValidatorState.open({str(folder / 'state-devchain-3-5B.sqlite3')!r})"
    ),
    second_user_refusal=lambda folder: (
        f"quasar.validator.state.StateError: cannot open {folder / 'state-devchain-3-5B.sqlite3'}.lock: "
        "Permission denied; give this validator a VALIDATOR_DATA_DIR that its user can write"
    ),
)
OWNERS = pytest.mark.parametrize("owner", [MINER, VALIDATOR], ids=["miner-workspace", "validator-state"])


@OWNERS
def test_a_lock_file_whose_file_system_cannot_lock_is_refused_with_the_cure_a_local_disk(tmp_path, monkeypatch, owner):
    """flock fails with ENOLCK on NFS without its lock service. Both refusals said 'cannot write'
    the lock file, the miner's with no cure and the validator's with 'free space on its disk'. NFS
    cannot be mounted here: the kernel's flock is replaced at that one call by one failing as NFS's
    does."""

    def flock_on_nfs(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(lock_files.fcntl, "flock", flock_on_nfs)
    with pytest.raises(QuasarError) as refused, owner.take(tmp_path):
        pass
    assert str(refused.value) == (
        f"cannot lock {owner.named(tmp_path)}: No locks available; its file system does not lock files (NFS "
        f"without its lock service): give {owner.process} a {owner.setting} on a local disk"
    )
    monkeypatch.undo()
    with owner.take(tmp_path):
        assert owner.lock_file(tmp_path).read_text() == f"{os.getpid()}\n"


@needs_another_user
@OWNERS
def test_a_second_unix_users_process_in_the_first_ones_folder_is_refused_with_the_cure(tmp_path, owner):
    """Two Unix users run one process kind each from one checkout, where the folder's default lies
    (the workspace root or data/validator): the first one's folder. The second one's start ended in a
    PermissionError's traceback (the validator), or was told 'Permission denied' and nothing of the
    setting that cures it (the miner)."""
    folder = tmp_path / "data"
    open_to_other_users(tmp_path)
    with owner.take(folder):
        pass
    result = run_python_as_nobody(owner.second_user_code(folder))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == owner.second_user_refusal(folder), last
