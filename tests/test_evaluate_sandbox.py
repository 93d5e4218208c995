"""The sandbox's parent side (quasar/evaluate/sandbox.py, sandbox_contents.py): the output it keeps,
the environment, the fork's copy and its bytecode, the stragglers, the folders it binds and hides."""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from quasar.evaluate import confinement, sandbox
from quasar.evaluate.captured_output import CapturedOutput
from quasar.evaluate.confinement import descendants
from quasar.evaluate.sandbox import SandboxedChild, SandboxError, SandboxPolicy
from quasar.evaluate.sandbox_contents import (
    COMPILE_ADDRESS_SPACE_BYTES,
    COMPILE_CPU_SECONDS,
    COMPILE_WORKERS,
    copy_tree,
    scrubbed_environment,
)
from quasar.evaluate.sandbox_layout import SANDBOX_FORK, python_installation, site_folders
from quasar.evaluate.stragglers import MARKER_VARIABLE, kill_marked_processes
from quasar.starter_fork import write_starter_fork
from tests.evaluate_runs import (
    naive_capture_text,
)
from tests.processes import REPO_ROOT


@pytest.mark.parametrize("seed", range(4))
def test_captured_output_keeps_head_and_tail_like_the_naive_version(seed):
    generator = torch.Generator().manual_seed(seed)
    chunks = []
    for _ in range(int(torch.randint(1, 40, (1,), generator=generator))):
        size = int(torch.randint(0, 9000, (1,), generator=generator))
        chunks.append(bytes(torch.randint(97, 123, (size,), generator=generator, dtype=torch.uint8).tolist()))
    captured = CapturedOutput()
    for chunk in chunks:
        captured.add(chunk)
    assert captured.total_bytes == sum(map(len, chunks))
    assert captured.text() == naive_capture_text(chunks)


def test_scrubbed_environment_keeps_no_secret(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv("WALLET_PATH", "/root/.bittensor/wallets")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    env = scrubbed_environment("/sandbox/home", "cuda:1", SandboxPolicy(), "abc")
    assert not any("secret" in value.lower() or "bittensor" in value for value in env.values())
    assert "GITHUB_TOKEN" not in env and "WALLET_PATH" not in env
    assert env["HOME"] == "/sandbox/home" and env["TMPDIR"] == "/sandbox/home/tmp"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    assert env[MARKER_VARIABLE] == "abc"
    assert scrubbed_environment("/h", "cpu", SandboxPolicy(), "m")["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(SandboxError, match="has no device 2"):
        scrubbed_environment("/h", "cuda:2", SandboxPolicy(), "m")


def test_copying_a_fork_skips_git_and_links_leaving_it(tmp_path, monkeypatch):
    source = tmp_path / "fork"
    (source / ".git").mkdir(parents=True)
    (source / ".git" / "config").write_text("[credential] token")
    (source / "fla").mkdir()
    (source / "fla" / "a.py").write_text("x = 1")
    os.chmod(source / "fla" / "a.py", 0o600)
    (source / "fla" / "inside.py").symlink_to(source / "fla" / "a.py")
    (source / "fla" / "escape").symlink_to("/etc/passwd")
    copy_tree(source, tmp_path / "copy")
    copied = tmp_path / "copy"
    assert not (copied / ".git").exists()
    assert (copied / "fla" / "a.py").read_text() == "x = 1"
    assert oct((copied / "fla" / "a.py").stat().st_mode & 0o777) == "0o644"
    assert (copied / "fla" / "inside.py").is_symlink() and not (copied / "fla" / "escape").exists()
    monkeypatch.setattr("quasar.evaluate.sandbox_contents.MAX_FORK_BYTES", 2)
    with pytest.raises(SandboxError, match="larger than"):
        copy_tree(source, tmp_path / "copy2")


def test_processes_carrying_the_marker_are_killed():
    marker = f"unit-{os.getpid()}"
    env = dict(os.environ, **{MARKER_VARIABLE: marker})
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    try:
        time.sleep(0.2)
        assert kill_marked_processes(marker, grace_seconds=0.1) == 1
        assert escaped.wait(timeout=5) == -signal.SIGKILL
        assert kill_marked_processes(marker, grace_seconds=0.1) == 0
    finally:
        escaped.kill()


def test_the_sandbox_hides_site_folders_lent_by_a_pth_file_and_binds_no_checkout(tmp_path, monkeypatch):
    lent = tmp_path / "image" / "lib" / "site-packages"
    checkout = tmp_path / "checkout"
    lent.mkdir(parents=True)
    checkout.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(lent), str(checkout)])
    # A folder of packages is hidden inside the sandbox wherever it lies in what is bound;
    # the child's Python is the installation, not this process's virtual environment.
    assert str(lent) in site_folders()
    assert str(checkout) not in site_folders()
    installation = python_installation()
    assert all(not folder.startswith(str(checkout)) for folder in installation)
    if sys.prefix != sys.base_prefix:
        assert sys.prefix not in installation


class GroupWatch:
    """Samples a process and all it started until it ends: the most resident memory
    they held at once, and what /proc said of the process that held the most (its limits, uid and
    cgroups then, while it compiled: a process that is exiting is shown in the root cgroup)."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.peak_bytes = 0
        self.largest: dict[str, str | int] = {"rss": 0}
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while self.process.poll() is None:
            held = 0
            for pid in descendants(self.process.pid):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    limits, cgroup = Path(f"/proc/{pid}/limits").read_text(), Path(f"/proc/{pid}/cgroup").read_text()
                except OSError:
                    continue
                rss = int(status.split("VmRSS:")[1].split()[0]) * 1024 if "VmRSS:" in status else 0
                held += rss
                if rss > int(self.largest["rss"]):
                    uid = status.split("Uid:")[1].split()[0]
                    self.largest = {"rss": rss, "limits": limits, "cgroup": cgroup, "uid": uid}
            self.peak_bytes = max(self.peak_bytes, held)
            time.sleep(0.005)


def _limit(limits: str, name: str) -> str:
    return next(line.split()[-3] for line in limits.splitlines() if line.startswith(name))


def test_the_fork_copys_bytecode_is_compiled_within_the_sandboxs_limits(tmp_path, monkeypatch):
    # The reviewer's fork: the starter fork and two 8 MB sources of one long list in junk/ (git
    # compresses them to nothing). `compileall -j 0` compiled every source of the copy as this
    # process's user (root), outside the sandbox's cgroup and limits: over 5 GiB at once, and a fork
    # could ask for hundreds. Sources over the size cap are now left to the child; the others (one
    # of 400 KiB here, some 150 MB to compile) are compiled in the sandbox's cgroup, as its uid, by
    # processes whose memory and CPU time are bounded.
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    (fork / "junk").mkdir()
    for name in ("a.py", "b.py"):
        (fork / "junk" / name).write_text("x = [" + "0," * (4 << 20) + "]\n")
    (fork / "fla" / "table.py").write_text("x = [" + "0," * (200 << 10) + "]\n")
    watches: list[GroupWatch] = []
    compile_fork_copy = sandbox.compile_fork_copy

    def watched(*args):
        process = compile_fork_copy(*args)
        watches.append(GroupWatch(process))
        return process

    monkeypatch.setattr(sandbox, "compile_fork_copy", watched)
    with SandboxedChild(fork, "cpu", SandboxPolicy(allow_unsandboxed=True)) as child:
        child.precompiled(timeout=120)
        [watch] = watches
        watch.thread.join()
        copy = child.workdir / "fork"
        shown = SANDBOX_FORK if child.isolation == "namespaces" else str(copy)
        for source in ("fla/layers/quasar.py", "fla/table.py"):
            bytecode = Path(importlib.util.cache_from_source(str(copy / source)))
            # Compiled, naming the source where the child sees it.
            assert marshal.loads(bytecode.read_bytes()[16:]).co_filename == f"{shown}/{source}"
        assert not (copy / "junk" / "__pycache__").exists()
        confinement = child.confinement
    assert watch.peak_bytes < COMPILE_WORKERS * COMPILE_ADDRESS_SPACE_BYTES, watch.peak_bytes
    largest = watch.largest
    assert int(largest["rss"]) > 64 << 20, "the 400 KiB source's compilation was not seen"
    assert _limit(str(largest["limits"]), "Max address space") == str(COMPILE_ADDRESS_SPACE_BYTES)
    assert _limit(str(largest["limits"]), "Max cpu time") == str(COMPILE_CPU_SECONDS)
    if confinement.uid is not None:
        assert largest["uid"] == str(confinement.uid.uid)
    if confinement.cgroup is not None:
        assert all(folder.name in str(largest["cgroup"]) for folder in confinement.cgroup.directories.values())


_HOLD_A_SANDBOX = """
import sys, time
from quasar.evaluate.sandbox import SandboxedChild, SandboxPolicy
child = SandboxedChild(None, "cpu", SandboxPolicy())
child.start()
cgroups = child.confinement.cgroup.directories.values() if child.confinement.cgroup is not None else []
print(child.workdir, *sorted(set(map(str, cgroups))), flush=True)
time.sleep(60)
"""


def _line_of_a_killed_parent(script: str, *args: str) -> str:
    """The first line ``script`` prints, its process group then killed by SIGKILL (the parent of a
    sandbox killed outright, which releases nothing)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = parent.stdout.readline()
        os.killpg(parent.pid, signal.SIGKILL)
    finally:
        parent.wait()
    return line


def test_a_sandbox_whose_parent_was_killed_leaves_no_folder_or_cgroup_once_another_starts(tmp_path, monkeypatch):
    """A parent killed by SIGKILL (the validator's deadline on a worker, the OOM killer) closes
    nothing: its sandbox's folder in the temporary directory (the fork's copy, the harness) and its
    cgroups stayed on the host for good, one set per kill. The next sandbox started removes them
    (quasar/evaluate/leftovers.py), and leaves a live one's alone."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    workdir, *cgroups = map(Path, _line_of_a_killed_parent(_HOLD_A_SANDBOX).split())
    assert workdir.parent == tmp_path and (workdir / "harness").is_dir() and all(map(Path.is_dir, cgroups))
    # Started without waiting for the child's torch import: start() is where the sweep runs.
    live = SandboxedChild(None, "cpu", SandboxPolicy(allow_unsandboxed=True)).start()
    try:
        SandboxedChild(None, "cpu", SandboxPolicy(allow_unsandboxed=True)).start().close()
        assert live.workdir is not None and live.workdir.is_dir(), "a live sandbox's folder was removed"
        assert not workdir.exists(), "the killed parent's sandbox folder is left behind"
        assert not any(map(Path.exists, cgroups)), "the killed parent's cgroups are left behind"
    finally:
        live.close()
    assert sorted(path.name for path in tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's file is made with chown, as root")
def test_another_users_lock_file_in_the_temporary_folder_kills_nothing_at_a_sandbox_start(tmp_path, monkeypatch):
    """The temporary folder (/tmp) is every user's: a lock file there named as a sandbox's claim,
    written by another user, listed a folder whose ``cgroup.procs`` named any pid, and the sweep at
    a root validator's next sandbox start SIGKILLed that process (here a stand-in for a miner's).
    Only this user's claims are swept; the other user's stays for that user's own sandboxes."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        listed = tmp_path / "elsewhere" / f"{confinement.CGROUP_PREFIX}forged"
        listed.mkdir(parents=True)
        (listed / "cgroup.procs").write_text(f"{victim.pid}\n")
        forged = tmp_path / "quasar-eval-0123456789abcdef.lock"
        forged.write_text(f"{listed}\n")
        os.chown(forged, 65534, 65534)
        SandboxedChild(None, "cpu", SandboxPolicy(allow_unsandboxed=True)).start().close()
        time.sleep(0.1)
        assert victim.poll() is None, f"another user's lock file had process {victim.pid} killed"
        assert forged.is_file()
    finally:
        victim.kill()
        victim.wait()


_HOLD_A_SANDBOX_UID = """
import sys, time
from quasar.evaluate import confinement
from quasar.evaluate.sandbox import SandboxedChild, SandboxPolicy
confinement.UID_LOCK_DIRECTORIES = (sys.argv[1],)
child = SandboxedChild(None, "cpu", SandboxPolicy())
child.start()
print(child.confinement.uid.path, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox leases a uid of its own only as root")
def test_a_sandbox_uid_whose_parent_was_killed_leaves_no_lock_file_once_another_sandbox_starts(tmp_path, monkeypatch):
    """A parent killed by SIGKILL never releases its sandbox's uid: the uid's lock file stayed in
    /run/lock/quasar-sandbox-uids for good, one per kill up to the range's 65,536 (15 in three hours
    of test runs on the suite's machine, beside thousands an older version had left). The next
    sandbox started removes the files no live sandbox holds, and leaves a live one's alone."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    locks = tmp_path / "uid-locks"
    monkeypatch.setattr(confinement, "UID_LOCK_DIRECTORIES", (str(locks),))
    killed = Path(_line_of_a_killed_parent(_HOLD_A_SANDBOX_UID, str(locks)).strip())
    assert killed.parent == locks and killed.is_file()
    live = SandboxedChild(None, "cpu", SandboxPolicy()).start()
    try:
        SandboxedChild(None, "cpu", SandboxPolicy()).start().close()
        assert live.confinement is not None and live.confinement.uid is not None
        assert live.confinement.uid.path.is_file(), "a live sandbox's uid lock file was removed"
        assert not killed.exists(), "the killed parent's uid lock file is left behind"
    finally:
        live.close()
    assert list(locks.iterdir()) == []


@pytest.mark.skipif(
    os.geteuid() != 0, reason="only as root does the sandbox run as a uid of its own, which a umask shuts out"
)
def test_a_sandbox_started_under_umask_077_comes_up(tmp_path, monkeypatch):
    """A root validator under umask 077 (a hardened host's shell): the folders of the private root
    were made 0700 (`sandbox setup failed: [Errno 13] Permission denied: '/sandbox/home'`) and so
    was the harness's (`can't open file '/sandbox/harness/child.py': [Errno 13] Permission
    denied`): every evaluation failed, `sandbox unavailable`."""
    why = sandbox.sandbox_unavailable()
    if why:
        pytest.skip(f"no namespaced sandbox on this host: {why}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    previous = os.umask(0o077)
    try:
        with SandboxedChild(None, "cpu", SandboxPolicy()) as child:
            assert child.isolation == "namespaces"
            assert child.confinement is not None and child.confinement.uid is not None
    finally:
        os.umask(previous)


_EVALUATE_WITHOUT_UID_LOCKS = """
import json, os, subprocess, sys
from quasar.evaluate import evaluate
from quasar.validator.evaluator import result_from_report
from tests.evaluate_runs import FAST_CPU
# Neither folder for the sandbox uid locks can be had: /run/lock read-only, /tmp's one another user's.
os.makedirs("/tmp/quasar-sandbox-uids", mode=0o700, exist_ok=True)
for options, place in (("ro", "/run/lock"), ("uid=65534", "/tmp/quasar-sandbox-uids")):
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"{options},size=1m", "tmpfs", place], check=True)
report = evaluate(sys.argv[1], 64, None, FAST_CPU)
outcome = result_from_report(report)
print(json.dumps({"reasons": report.reasons, "error": outcome.error, "recorded": outcome.result is not None}))
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.isdir("/run/lock"), reason="needs root (a uid of its own per sandbox)"
)
def test_a_sandbox_whose_limits_this_host_cannot_set_up_is_the_validators_error_not_the_forks(tmp_path):
    """No folder for the sandbox uid locks (/run/lock read-only, /tmp full or another's): the
    evaluation's reason was `sandbox: the sandbox's limits could not be set up: ...`, a failure
    recorded against the fork and reported, where the host is at fault."""
    if sandbox.sandbox_unavailable():
        pytest.skip(f"no namespaced sandbox on this host: {sandbox.sandbox_unavailable()}")
    write_starter_fork(tmp_path / "fork")
    command = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _EVALUATE_WITHOUT_UID_LOCKS]
    done = subprocess.run(
        [*command, str(tmp_path / "fork")], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["reasons"][0].startswith("sandbox unavailable: the sandbox's limits could not be set up: "), seen
    assert not seen["recorded"] and "no directory for the sandbox uid locks" in seen["error"]
