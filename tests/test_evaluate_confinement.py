"""The limits that keep evaluations apart (quasar/evaluate/confinement.py), the evaluation
environment (environment.py) and the seccomp filter (syscall_filter.py), on this machine's real
kernel: real cgroups, uids, processes and libseccomp."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quasar.evaluate import confinement, environment, syscall_filter

ROOT = Path(__file__).resolve().parent.parent


def test_two_live_sandboxes_never_hold_the_same_uid_and_a_freed_one_is_taken_again(tmp_path, monkeypatch):
    monkeypatch.setattr(confinement, "UID_LOCK_DIRECTORIES", (str(tmp_path / "locks"),))
    # Two slots only: the second lease must take the other one, a third finds none.
    monkeypatch.setattr(confinement, "UID_SLOTS", 2)
    first = confinement.lease_uid()
    second = confinement.lease_uid()
    assert {first.uid, second.uid} == {confinement.UID_BASE, confinement.UID_BASE + 1}
    with pytest.raises(confinement.ConfinementError, match="no free sandbox uid"):
        confinement.lease_uid(attempts=20)
    first.release()
    assert confinement.lease_uid().uid == first.uid


def test_released_uids_leave_no_lock_file_behind(tmp_path, monkeypatch):
    """Each uid leased left its lock file in /run/lock/quasar-sandbox-uids for good: a file per
    evaluation a root validator ever ran, up to the range's 65,536. A release removes it."""
    monkeypatch.setattr(confinement, "UID_LOCK_DIRECTORIES", (str(tmp_path / "locks"),))
    held = confinement.lease_uid()
    for _ in range(300):
        confinement.lease_uid().release()
    assert [path.name for path in (tmp_path / "locks").iterdir()] == [str(held.uid)]
    held.release()
    assert not list((tmp_path / "locks").iterdir())


def test_a_uid_held_by_another_process_is_not_leased(tmp_path, monkeypatch):
    monkeypatch.setattr(confinement, "UID_LOCK_DIRECTORIES", (str(tmp_path / "locks"),))
    monkeypatch.setattr(confinement, "UID_SLOTS", 2)
    (tmp_path / "locks").mkdir(mode=0o700)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(tmp_path / "locks" / str(confinement.UID_BASE))!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("HELD", flush=True)
        time.sleep(60)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "HELD"
        assert confinement.lease_uid().uid == confinement.UID_BASE + 1
    finally:
        holder.kill()
        holder.wait()


def _own_cgroup_or_skip(memory: int, tasks: int) -> confinement.Cgroup:
    cgroup, why = confinement.make_cgroup(
        confinement.CGROUP_PREFIX + f"test-{os.getpid()}", memory, tasks, os.environ.get("SANDBOX_CGROUP") or None
    )
    if cgroup is None:
        pytest.skip(f"no cgroup for a sandbox here: {why}")
    return cgroup


def joining(cgroup: confinement.Cgroup, script: str) -> list[str]:
    """The command of a Python child that joins ``cgroup`` first, as sandbox_init.py does, and then
    runs ``script`` (dedented)."""
    join = f"for procs in {cgroup.procs_files!r}:\n    open(procs, 'w').write('0')\n"
    return [sys.executable, "-c", join + textwrap.dedent(script)]


def test_a_sandbox_cgroup_carries_its_limits_and_is_removed_with_what_is_left_in_it():
    cgroup = _own_cgroup_or_skip(256 << 20, 17)
    try:
        if "pids" in cgroup.directories:
            assert (cgroup.directories["pids"] / "pids.max").read_text().strip() == "17"
        memory = cgroup.directories["memory"]
        limit = memory / ("memory.max" if cgroup.version == 2 else "memory.limit_in_bytes")
        assert int(limit.read_text()) == 256 << 20
        # A process that joins (as sandbox_init.py does) is counted there and killed on removal.
        sleeper = subprocess.Popen(
            joining(
                cgroup,
                """
                import time
                print("JOINED", flush=True)
                time.sleep(60)
                """,
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert sleeper.stdout.readline().strip() == "JOINED"
        assert str(sleeper.pid) in (cgroup.directories["memory"] / "cgroup.procs").read_text().split()
    finally:
        cgroup.remove()
    assert sleeper.wait(timeout=10) == -9
    assert not any(directory.exists() for directory in cgroup.directories.values())


def test_a_cgroup_refuses_processes_over_its_limit():
    cgroup = _own_cgroup_or_skip(1 << 30, 8)
    if "pids" not in cgroup.directories:
        cgroup.remove()
        pytest.skip("no pids controller for the sandbox's cgroup here")
    try:
        done = subprocess.run(
            joining(
                cgroup,
                """
                import os, signal, time
                children = []
                try:
                    while len(children) < 100:
                        pid = os.fork()
                        if pid == 0:
                            time.sleep(30)
                            os._exit(0)
                        children.append(pid)
                except OSError as error:
                    print("REFUSED", len(children), error.errno, flush=True)
                # The children hold the output pipe: ended now, not after their 30 s.
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                """,
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        refused = done.stdout.split()
        assert refused[0] == "REFUSED" and int(refused[1]) < 8 and refused[2] == "11", done
    finally:
        cgroup.remove()


def test_the_watchdog_kills_a_sandbox_over_its_memory_and_says_so():
    hog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import subprocess, sys, time
        # The memory is held by a grandchild: the watchdog sums the whole tree.
        subprocess.Popen([sys.executable, "-c", "x = bytearray(400 << 20); import time; time.sleep(60)"])
        time.sleep(60)
    """),
        ],
        start_new_session=True,
    )
    killed = []

    def kill() -> None:
        killed.append(time.monotonic())
        os.killpg(hog.pid, 9)

    watchdog = confinement.MemoryWatchdog(hog.pid, 200 << 20, kill)
    try:
        deadline = time.monotonic() + 30
        while not killed and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        watchdog.stop()
        if hog.poll() is None:
            os.killpg(hog.pid, 9)
    assert killed and "over the sandbox's limit of 200 MiB" in watchdog.tripped
    assert watchdog.peak_bytes > 200 << 20


def test_the_watchdog_leaves_a_sandbox_under_its_limit_alone():
    calm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    watchdog = confinement.MemoryWatchdog(calm.pid, 1 << 30, lambda: pytest.fail("killed"))
    try:
        assert calm.wait(timeout=30) == 0
    finally:
        watchdog.stop()
    assert watchdog.tripped == "" and 0 < watchdog.peak_bytes < 1 << 30


def test_the_watchdog_counts_shared_memory_but_not_the_parents_area_for_outputs():
    # A process maps and fills the parent's area (a memory file it inherits, as the child the
    # shared area for outputs) and 300 MiB of shared memory of its own: a shared mapping and a
    # memory file it keeps open, mapped or not. Its own count, each page once; the area's does not.
    area = os.memfd_create("quasar-shared-output")
    os.ftruncate(area, 300 << 20)
    hog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import mmap, os, sys, time
        area = mmap.mmap(int(sys.argv[1]), 300 << 20)
        area.write(bytes(300 << 20))
        mapping = mmap.mmap(-1, 100 << 20, flags=mmap.MAP_SHARED)
        mapping.write(bytes(100 << 20))
        unmapped = os.memfd_create("unmapped")
        os.write(unmapped, bytes(100 << 20))
        mapped = os.memfd_create("mapped")
        os.ftruncate(mapped, 100 << 20)
        view = mmap.mmap(mapped, 100 << 20)
        view.write(bytes(100 << 20))
        print("FILLED", flush=True)
        time.sleep(60)
    """),
            str(area),
        ],
        pass_fds=(area,),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert hog.stdout.readline().strip() == "FILLED"
        status = os.fstat(area)
        outside = {(status.st_dev, status.st_ino)}
        pids = confinement.descendants(hog.pid)
        exact = confinement.sandbox_bytes(pids, outside)
        assert 300 << 20 <= exact < 400 << 20, exact >> 20
        # Without the smaps of each process: the area's pages and the mapped file's counted again.
        assert confinement.sandbox_bytes(pids, outside, exact_above=1 << 62) >= exact + (300 << 20)
        killed: list[float] = []
        watchdog = confinement.MemoryWatchdog(hog.pid, 450 << 20, lambda: killed.append(1), frozenset(outside))
        time.sleep(4 * confinement.WATCHDOG_SECONDS)
        watchdog.stop()
        assert not killed and 300 << 20 <= watchdog.peak_bytes, watchdog.peak_bytes >> 20
        watchdog = confinement.MemoryWatchdog(hog.pid, 250 << 20, lambda: killed.append(1), frozenset(outside))
        time.sleep(4 * confinement.WATCHDOG_SECONDS)
        watchdog.stop()
        assert killed and "over the sandbox's limit of 250 MiB" in watchdog.tripped
    finally:
        os.killpg(hog.pid, 9)
        hog.wait()
        os.close(area)


def test_descendants_find_the_whole_process_tree():
    tree = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                                  "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
                                  "time.sleep(30)"])
        time.sleep(30)
    """),
        ]
    )
    try:
        deadline = time.monotonic() + 20
        while len(confinement.descendants(tree.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        found = confinement.descendants(tree.pid)
        assert found[0] == tree.pid and len(found) == 3
        assert all(Path(f"/proc/{pid}").exists() for pid in found)
    finally:
        for pid in reversed(confinement.descendants(tree.pid)):
            os.kill(pid, 9)
        tree.wait()


# --- the evaluation environment -----------------------------------------------------------------


def _slow_environment(roots: tuple[str, ...]) -> dict[str, str]:
    """The closure by importlib.metadata's own lookups and parsing (the slow, plain way)."""
    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        key = environment.canonical(name)
        if key in found:
            continue
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[key] = distribution.version
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return found


def test_the_environment_is_the_evaluation_packages_and_what_they_require():
    found = environment.evaluation_environment()
    assert found.distributions == _slow_environment(environment.EVALUATION_PACKAGES)
    assert {"torch", "numpy", "einops", "transformers"} <= set(found.distributions)
    for foreign in ("bittensor", "fastapi", "sqlalchemy", "uvicorn", "gitpython", "quasar-subnet"):
        assert foreign not in found.distributions
    entries = {entry for site in found.sites for entry in site.entries}
    assert {"torch", "numpy", "transformers", "einops"} <= entries
    assert not entries & {"bittensor", "fastapi", "quasar", "git"}
    assert any(entry.startswith("torch-") and entry.endswith(".dist-info") for entry in entries)
    for site in found.sites:
        assert all((Path(site.path) / entry).exists() for entry in site.entries)
    text = found.describe()
    assert text.startswith("torch ") and "packages they need" in text


def test_a_missing_evaluation_package_is_named():
    found = environment.evaluation_environment(("numpy", "no-such-package-quasar"))
    assert found.missing == ("no-such-package-quasar",)
    assert "no-such-package-quasar not installed" in found.describe()


# --- the seccomp filter ------------------------------------------------------------------------


def test_the_filter_refuses_its_calls_in_a_process_and_its_children_and_allows_the_rest():
    available, why = syscall_filter.available()
    if not available:
        pytest.skip(why)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import ctypes, errno, os, subprocess, sys, threading
        sys.path.insert(0, "quasar/evaluate")
        import syscall_filter
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(38, 1, 0, 0, 0)
        syscall_filter.install()
        def attempt(*arguments):
            result = libc.syscall(*arguments)
            return errno.errorcode.get(ctypes.get_errno(), "?") if result < 0 else "ok"
        print("add_key", attempt(248, b"user", b"k", b"v", 1, -4))
        print("unshare", attempt(272, 0x10000000))
        print("ptrace", attempt(101, 0, 0, 0, 0))
        print("clone3", attempt(435, 0, 0))
        print("memfd_secret", attempt(447, 0))
        thread = threading.Thread(target=lambda: print("thread ok")); thread.start(); thread.join()
        try:  # a fork widening its pinned CPUs to spin on a neighbour's
            os.sched_setaffinity(0, os.sched_getaffinity(0))
            print("affinity ok")
        except PermissionError:
            print("affinity EPERM")
        print(subprocess.run(["unshare", "--user", "true"], capture_output=True, text=True).returncode)
    """),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    lines = done.stdout.splitlines()
    assert lines[:7] == [
        "add_key EPERM",
        "unshare EPERM",
        "ptrace EPERM",
        "clone3 ENOSYS",
        "memfd_secret EPERM",
        "thread ok",
        "affinity EPERM",
    ], done
    assert lines[7] != "0", "a child process inherits the filter: unshare --user fails there too"


def test_check_sandbox_says_what_holds_here_and_runs_the_starter_fork_in_it(tmp_path):
    """On the DEVICE setting's device: its --device had its own default, cuda, DEVICE's default
    written again, and DEVICE=cpu still ran the starter fork on CUDA (refused where there is none)."""
    command = [sys.executable, "-m", "quasar", "check-sandbox", "--out", str(tmp_path)]
    refused = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, timeout=240, env={**os.environ, "DEVICE": "cuda:99"}
    )
    assert refused.returncode == 2 and "device cuda:99:" in " ".join(refused.stderr.split()), refused.stderr
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, timeout=240, env={**os.environ, "DEVICE": "cpu"}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    assert "/sys default: starter fork pass" in done.stdout
    found = json.loads((tmp_path / "sandbox.json").read_text())
    holds = {row["measure"]: row["holds"] for row in found["measures"]}
    assert set(holds) == {"namespaces", "seccomp filter", "own uid", "own cgroup", "environment"}
    assert holds["namespaces"] is (
        subprocess.run(["unshare", "--user", "--net", "true"]).returncode == 0 or os.geteuid() == 0
    )
    assert found["variants"]["default"]["verdict"] == "pass"
    assert "seccomp" in found["variants"]["default"]["sandbox"]


def test_the_watchdog_counts_pages_forked_processes_share_once():
    # A process holding 300 MiB forks eight children that only read it: about 300 MiB in all
    # (RssAnon would say 2.7 GiB), under a 1 GiB limit.
    family = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import os, time
        held = bytearray(300 << 20)
        for offset in range(0, len(held), 4096):
            held[offset] = 1
        for _ in range(8):
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
        print("FORKED", flush=True)
        time.sleep(30)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert family.stdout.readline().strip() == "FORKED"
        pids = confinement.descendants(family.pid)
        assert len(pids) == 9
        shared = sum(confinement.resident_bytes(pid) for pid in pids)
        assert 250 << 20 < shared < 600 << 20, shared >> 20
    finally:
        os.killpg(family.pid, 9)
        family.wait()
