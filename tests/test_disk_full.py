"""A disk that fills up (ENOSPC) under the submission API's database and the miner's state: each
runs on a small tmpfs of its own (tests/small_disk.py), filled at a chosen moment. What was
acknowledged or saved before is kept, the failure is a clear error of that request or cycle, and
each carries on once space is back, without a restart (docs/api.md and docs/miner.md, "When the
disk fills up")."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import select

from api_fixtures import BACKENDS
from quasar.api.client import ApiClient, ApiClientError, Claim
from quasar.api.db import Database, Submission
from quasar.api.devdb import PostgresUnavailable, TemporaryPostgres, start_api_process
from quasar.evaluate import EvaluationOptions
from quasar.imports import QUASAR_DIR
from quasar.localnet.host import make_wallet
from quasar.miner.loop import Evaluator
from quasar.miner.state import StateStore
from quasar.miner.strategies import Candidate, EditRejected
from quasar.miner.submission import COMMIT_REVEAL
from quasar.miner.workspace import Workspace, WorkspaceError
from quasar.starter_fork import write_starter_fork
from quasar.validator.state import StateError, ValidatorState
from test_miner_loop import neuron_network
from test_miner_submission import Setup, length, measurement, report
from tests.gitrepo import git
from tests.processes import proc_files
from tests.small_disk import SmallDisk, unavailable

ROOT = Path(__file__).resolve().parents[1]
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
        assert "cannot save the miner state" in str(raised.value)
        assert raised.value.filename == str(setup.store.path)  # the log line names the file
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


def _small_postgres(stack: contextlib.ExitStack) -> TemporaryPostgres:
    """A PostgreSQL server whose data folder is a small disk of its own (in a temporary folder the
    server's user can reach, as TemporaryPostgres makes one)."""
    account = pwd.getpwnam("postgres")
    root = Path(tempfile.mkdtemp(prefix="quasar-pg-"))
    disk = stack.enter_context(SmallDisk(root / "data", 48, f"uid={account.pw_uid},gid={account.pw_gid},mode=0700"))
    server = TemporaryPostgres(durable=False, root=root, prefix=disk.enter)
    try:
        server.start()
    except PostgresUnavailable as error:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"PostgreSQL unavailable: {error}")
        pytest.skip(f"PostgreSQL unavailable: {error} (./scripts/test.sh installs it)")
    stack.callback(server.stop)
    server.disk = disk  # type: ignore[attr-defined]
    return server


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_api_answers_503_on_a_full_disk_keeps_what_it_acknowledged_and_recovers(tmp_path, chain, wallets, backend):
    api_hotkey = wallets["api"].hotkey.ss58_address
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            disk = stack.enter_context(SmallDisk(tmp_path / "disk", 4))
            database_url = f"sqlite:///{tmp_path}/disk/api.sqlite3"
            stored_url = f"sqlite:///{tmp_path}/api.sqlite3"
            process, url = start_api_process(tmp_path, database_url, chain.path, api_hotkey, prefix=disk.enter)
        else:
            server = _small_postgres(stack)
            server_folder = str(server.root).encode()
            disk = server.disk  # type: ignore[attr-defined]
            database_url = stored_url = server.create_database("quasar_full_disk")
            process, url = start_api_process(tmp_path, database_url, chain.path, api_hotkey)
        stack.callback(process.wait, 30)
        stack.callback(process.send_signal, signal.SIGTERM)  # when the test fails before it stops it
        client = stack.enter_context(ApiClient(url, wallets["a"], api_hotkey=api_hotkey, timeout=20))
        acknowledged = {_submit(client, n): n for n in range(1, 4)}

        disk.fill()
        refusal = None
        for n in range(4, 400):  # PostgreSQL first fills the free room its files already have
            try:
                acknowledged[_submit(client, n)] = n
            except ApiClientError as error:
                refusal = error
                break
        assert refusal is not None and refusal.status == 503, refusal
        assert "the database is unavailable; retry shortly" in refusal.detail
        assert client.health().status == "ok"  # reads go on
        assert client.stats(wallets["a"].hotkey.ss58_address) is not None
        log = next(tmp_path.glob("server-*.log")).read_text()
        assert ("database or disk is full" if backend == "sqlite" else "No space left on device") in log

        disk.free()
        acknowledged[_submit(client, 1000)] = 1000  # the same process, once space is back
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        if backend == "sqlite":  # SQLite follows /proc/PID/root to this namespace's folder: read a copy
            for name in ("api.sqlite3", "api.sqlite3-wal"):
                if disk.outside(name).exists():
                    shutil.copyfile(disk.outside(name), tmp_path / name)
        database = Database(stored_url)
        stack.callback(database.dispose)
        with database.read() as session:
            stored = {row.id: int(row.commit_hash, 16) for row in session.scalars(select(Submission))}
        assert stored == acknowledged
    if backend == "postgresql":
        # Its data folder is a disk of another mount namespace: stopping it looked for its pid file
        # from here, found none, and left the server running after the test.
        assert not [pid for pid, cmdline in proc_files("cmdline") if server_folder in cmdline]


def _submit(client: ApiClient, n: int) -> int:
    return client.submit_kernel(Claim("https://github.com/miner/fla", f"{n:040x}", 1e4), 500_000).submission_id


@pytest.mark.parametrize(
    ("trouble", "said"),
    [
        ((SmallDisk.fill, SmallDisk.free), "full"),
        # Without disk_trouble's check SQLite says only 'unable to open database file'.
        ((lambda disk: disk.remount("ro"), lambda disk: disk.remount("rw")), "read-only"),
    ],
    ids=["full", "read-only"],
)
def test_the_api_started_on_a_disk_it_cannot_write_says_so_and_keeps_what_it_stored(
    tmp_path, chain, wallets, trouble, said
):
    """SQLite, unable to make its write-ahead log there, reported only 'disk I/O error' (full) or
    'unable to open database file' (read-only), which sent the operator to the hardware."""
    cause, cure = trouble
    api_hotkey = wallets["api"].hotkey.ss58_address
    database_url = f"sqlite:///{tmp_path}/disk/api.sqlite3"
    with SmallDisk(tmp_path / "disk", 4) as disk:
        process, url = start_api_process(tmp_path, database_url, chain.path, api_hotkey, prefix=disk.enter)
        with ApiClient(url, wallets["a"], api_hotkey=api_hotkey) as client:
            first = _submit(client, 1)
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        cause(disk)  # and pm2 restarts the server
        with pytest.raises(RuntimeError) as failed:
            start_api_process(tmp_path, database_url, chain.path, api_hotkey, prefix=disk.enter)
        assert f"the disk of {tmp_path}/disk is {said}" in " ".join(str(failed.value).split())  # wrapped at 80
        cure(disk)
        process, url = start_api_process(tmp_path, database_url, chain.path, api_hotkey, prefix=disk.enter)
        try:
            with ApiClient(url, wallets["a"], api_hotkey=api_hotkey) as client:
                assert client.submission_status(first).submission_id == first
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def test_a_miner_starting_on_a_full_disk_gets_a_workspace_error_naming_it(tmp_path):
    hotkey = make_wallet(tmp_path / "wallets", "miner").hotkey.ss58_address
    with SmallDisk(tmp_path / "disk", 1) as disk:
        workspace = Workspace(disk.outside("workspaces"), hotkey)
        disk.fill()
        with pytest.raises(WorkspaceError) as refused:
            workspace.acquire()
        assert str(refused.value) == (
            f"cannot write {workspace.lock_file} in the workspace: No space left on device; free space on its "
            "disk, or give this miner a WORKSPACE_ROOT on a disk it can write"
        )
        disk.free()
        with workspace:  # once space is back
            assert workspace.lock_file.read_text() == f"{os.getpid()}\n"


def test_a_miner_starting_on_a_read_only_disk_is_told_its_disk_is_read_only(tmp_path):
    """A read-only disk refuses the workspace's folder, new, or its lock file's opening, left by an
    earlier start (EROFS). The miner said 'cannot create the workspace' for both, with no cure."""
    hotkey = make_wallet(tmp_path / "wallets", "miner").hotkey.ss58_address
    cure = "Read-only file system; its disk is mounted read-only: mount it read-write, or give this miner a "
    cure += "WORKSPACE_ROOT on a disk it can write"
    for earlier in (False, True):
        with SmallDisk(tmp_path / f"disk-{earlier}", 1) as disk:
            workspace = Workspace(disk.outside("workspaces"), hotkey)
            if earlier:
                with workspace:
                    pass
            disk.remount("ro")
            with pytest.raises(WorkspaceError) as refused:
                workspace.acquire()
            refused_to = f"open {workspace.lock_file}" if earlier else f"create the workspace {workspace.path}"
            assert str(refused.value) == f"cannot {refused_to}: {cure}"
            disk.remount("rw")
            with workspace:  # once the disk is writable
                assert workspace.lock_file.read_text() == f"{os.getpid()}\n"


def test_a_validator_starting_on_a_full_disk_gets_a_state_error_naming_its_lock_file(tmp_path):
    """The state's lock, once taken, gets this process's pid written into its file. On a full disk
    that write raised a bare OSError (no file named, no cure: a traceback at the validator's start,
    whose command refuses a QuasarError in one line) and left the lock file open in the process."""
    with SmallDisk(tmp_path / "disk", 1) as disk:
        path = disk.outside("state.sqlite3")
        disk.fill()
        with pytest.raises(StateError, match="No space left on device; free space on its disk") as refused:
            ValidatorState.open(path)
        assert f"cannot write {path}.lock" in str(refused.value)
        lock = str(disk.folder / "state.sqlite3.lock")  # as the kernel names it, in the disk's namespace
        assert lock not in [os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
        disk.free()
        with ValidatorState.open(path):  # once space is back
            assert Path(f"{path}.lock").read_text() == f"{os.getpid()}\n"


def test_a_validator_starting_on_a_read_only_disk_is_told_its_disk_is_read_only(tmp_path):
    """A read-only disk refuses the lock file's opening (EROFS), new or left by an earlier start; the
    refusal's cure was a VALIDATOR_DATA_DIR 'that its user can write', which sent the operator to
    the folder's permissions."""
    for earlier in (False, True):
        with SmallDisk(tmp_path / f"disk-{earlier}", 1) as disk:
            path = disk.outside("state.sqlite3")
            if earlier:
                ValidatorState.open(path).close()
            disk.remount("ro")
            with pytest.raises(StateError) as refused:
                ValidatorState.open(path)
            assert str(refused.value) == (
                f"cannot open {path}.lock: Read-only file system; its disk is mounted read-only: mount it "
                "read-write, or give this validator a VALIDATOR_DATA_DIR on a disk it can write"
            )
            disk.remount("rw")
            with ValidatorState.open(path):  # once the disk is writable
                assert Path(f"{path}.lock").read_text() == f"{os.getpid()}\n"


def test_a_report_a_full_disk_cannot_take_is_an_error_naming_it_and_leaves_nothing_half_written(tmp_path):
    with SmallDisk(tmp_path / "disk", 1) as disk:
        reports = disk.outside("reports")
        evaluator = Evaluator(EvaluationOptions(), reports)
        first = report([length(4096, 1000.0)], 4096)
        evaluator.save(first, "best")
        big = report([length(4096, 2000.0)], 4096)
        big.reasons.extend(["a long reason"] * 50_000)
        disk.fill()
        with pytest.raises(OSError) as raised:
            evaluator.save(big, "best")
        assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(reports / "best.json")
        assert sorted(path.name for path in reports.iterdir()) == ["best.json"]
        assert json.loads((reports / "best.json").read_text())["measured_tokens_per_sec"] == 1000.0


def test_a_full_temporary_disk_does_not_fail_the_reads_of_several_workers(tmp_path, chain, wallets):
    api_hotkey = wallets["api"].hotkey.ss58_address
    with SmallDisk(tmp_path / "tmp", 1) as disk:
        process, url = start_api_process(
            tmp_path,
            f"sqlite:///{tmp_path}/api.sqlite3",
            chain.path,
            api_hotkey,
            workers=2,
            prefix=disk.enter,
            settings={"TMPDIR": str(tmp_path / "tmp")},  # where the workers share their rendered reads
        )
        try:
            with ApiClient(url, wallets["a"], api_hotkey=api_hotkey) as client:
                _submit(client, 1)
                disk.fill()
                for _ in range(3):
                    assert client.leaderboard().entries is not None
                    assert client.stats(wallets["a"].hotkey.ss58_address) is not None
                disk.free()
                assert client.leaderboard().entries is not None
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        log = next(tmp_path.glob("server-*.log")).read_text()
        assert "Traceback" not in log
        assert 1 <= log.count("cannot share rendered reads") <= 2  # once per worker, not once per read


# Run in the small disk's mount namespace (git resolves its folders' real paths, which /proc/PID/root
# paths are not): sync the workspace's clone of BARE, the disk filled first when asked; prints JSON.
SYNC_SCRIPT = """
import json, subprocess, sys
from pathlib import Path
from quasar.miner.github import Git, write_askpass
from quasar.miner.workspace import ForkClone, Workspace
from tests.small_disk import FILLER, fill_folder
folder, bare, hotkey, full = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "full"
with Workspace(folder / "workspaces", hotkey) as workspace:
    git = Git(write_askpass(workspace.askpass), "alice", "", "Alice", "alice@example.invalid")
    clone = ForkClone(workspace.fork, git, "file://" + bare, "main")
    if full:
        fill_folder(folder)
    try:
        result = {"head": clone.sync()}
    except Exception as error:
        result = {"error": f"{type(error).__name__}: {error}"}
    (folder / FILLER).unlink(missing_ok=True)
    fsck = subprocess.run(["git", "fsck"], cwd=workspace.fork, capture_output=True) if workspace.fork.exists() else None
    result["fsck"] = None if fsck is None else fsck.returncode
    result["files"] = sorted(path.name for path in workspace.path.iterdir())
print(json.dumps(result))
"""


def test_a_full_disk_during_a_clone_or_a_fetch_fails_that_sync_clearly_and_harms_no_clone(tmp_path):
    source, bare = tmp_path / "source", tmp_path / "fork.git"
    write_starter_fork(source)
    git(None, "clone", "-q", "--bare", str(source), str(bare))
    hotkey = make_wallet(tmp_path / "wallets", "miner").hotkey.ss58_address
    with SmallDisk(tmp_path / "disk", 2) as disk:

        def sync(full: bool) -> dict:
            command = [sys.executable, "-c", SYNC_SCRIPT, str(disk.folder), str(bare), hotkey, "full" if full else ""]
            environ = {**os.environ, "PYTHONPATH": str(ROOT)}
            done = subprocess.run([*disk.enter, *command], capture_output=True, text=True, env=environ, check=True)
            return json.loads(done.stdout)

        failed = sync(full=True)
        assert "GitError: git clone" in failed["error"] and "No space left on device" in failed["error"]
        assert "fork" not in failed["files"] and "fork.partial" not in failed["files"]
        assert sync(full=False)["head"] == git(bare, "rev-parse", "main")

        (source / "more.bin").write_bytes(os.urandom(300_000))
        git(source, "add", "more.bin")
        git(source, "commit", "-q", "-m", "more")
        git(source, "push", "-q", str(bare), "main")
        failed = sync(full=True)
        assert failed["error"].startswith("GitError: git") and "space" in failed["error"].lower()
        assert failed["fsck"] == 0
        assert sync(full=False)["head"] == git(bare, "rev-parse", "main")


def test_a_miner_started_on_a_full_disk_stops_with_one_line_naming_the_file(tmp_path):
    with neuron_network(tmp_path, fork_delay_polls=0) as network, SmallDisk(tmp_path / "disk", 1) as disk:
        env = {**network.env, "WORKSPACE_ROOT": str(tmp_path / "disk")}
        hotkey = network.miners["miner"].hotkey.ss58_address
        workspace = disk.outside(hotkey)
        workspace.mkdir()
        (workspace / "miner.lock").write_text("12345\n")  # a miner ran here before the disk filled
        disk.fill()
        output = _start_miner(network.wallets, env, disk)
        assert "the miner stops: [Errno 28] cannot write git's credential helper" in output
        assert f"{tmp_path}/disk/{hotkey}/askpass.sh" in output
        assert "No space left on device" in output


def test_a_miner_started_on_a_read_only_disk_stops_with_one_line_saying_so(tmp_path):
    with neuron_network(tmp_path, fork_delay_polls=0) as network, SmallDisk(tmp_path / "disk", 1) as disk:
        env = {**network.env, "WORKSPACE_ROOT": str(tmp_path / "disk")}
        hotkey = network.miners["miner"].hotkey.ss58_address
        disk.outside(hotkey).mkdir()
        disk.outside(f"{hotkey}/miner.lock").write_text("12345\n")  # a miner ran here before
        disk.remount("ro")
        output = _start_miner(network.wallets, env, disk)
        assert (
            f"cannot open {tmp_path}/disk/{hotkey}/miner.lock: Read-only file system; its disk is mounted read-only: "
            "mount it read-write, or give this miner a WORKSPACE_ROOT on a disk it can write"
        ) in output


def _start_miner(wallets: Path, env: dict[str, str], disk: SmallDisk) -> str:
    """What ``python -m neurons.miner`` run on ``disk`` says, once it stopped with status 1 and no traceback."""
    command = [sys.executable, "-m", "neurons.miner", "--wallet.name", "miner", "--wallet.hotkey", "default"]
    command += ["--wallet.path", str(wallets), "--subtensor.network", "devchain", "--netuid", "24"]
    done = subprocess.run([*disk.enter, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output, output
    return output
