"""The suite on a rented GPU container (RunPod, Vast.ai and the like): root without CAP_SYS_ADMIN,
Docker's default seccomp profile, a read-only /sys/fs/cgroup and a /dev/shm of 64 MiB, simulated
for one process tree by tests/container_host.py (docs/validator.md, "Rented GPU containers")."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from tests import container_host
from tests.processes import REPO_ROOT

UNAVAILABLE = container_host.unavailable()
pytestmark = pytest.mark.skipif(bool(UNAVAILABLE), reason=f"cannot simulate a rented container: {UNAVAILABLE}")


def in_container(script: str, timeout: float = 60, **options: int) -> subprocess.CompletedProcess[str]:
    """``python -c SCRIPT`` as on a rented container, in the repository; its output as text."""
    command = container_host.command(["python", "-c", textwrap.dedent(script)], **options)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def last_json(run: subprocess.CompletedProcess[str]) -> dict:
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_container_simulation_holds():
    run = in_container("""
        import json, os, subprocess
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        unshare = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
        shm = os.statvfs("/dev/shm")
        print(json.dumps({"sys_admin": int(status["CapEff"], 16) >> 21 & 1, "unshare": unshare.returncode,
                          "shm_mb": shm.f_blocks * shm.f_frsize >> 20,
                          "cgroup_ro": bool(os.statvfs("/sys/fs/cgroup").f_flag & os.ST_RDONLY)}))
    """)
    assert last_json(run) == {"sys_admin": 0, "unshare": 1, "shm_mb": 64, "cgroup_ro": True}


def test_a_read_only_cgroup_tree_gives_the_watchdog_without_a_warning_per_sandbox():
    """A sandbox's cgroup that could not be made was 'removed' too, each of its folders: on a
    read-only /sys/fs/cgroup every sandbox logged one WARNING per controller ('could not remove
    the sandbox cgroup ...: Read-only file system') for folders it never made."""
    run = in_container("""
        import json, logging
        logging.basicConfig()
        from quasar.evaluate import confinement
        cgroup, why = confinement.make_cgroup("quasar-sandbox-test", 1 << 30, 64)
        print(json.dumps({"made": cgroup is not None, "why": why}))
    """)
    made = last_json(run)
    # A cgroup v2 host whose own cgroup does not enable memory refuses before any folder is made.
    assert not made["made"] and ("Read-only file system" in made["why"] or "does not enable memory" in made["why"])
    assert "could not remove" not in run.stderr
