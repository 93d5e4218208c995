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


def test_a_host_refusing_namespaces_is_named_once_and_the_unsandboxed_run_says_so(tmp_path):
    """The namespaces were taken as there wherever the unshare command was: check-sandbox said
    'namespaces: yes' on a container refusing them, and every evaluation started unshare, saw it
    fail, and refused (or fell back) with '[Errno 32] Broken pipe' and unshare's line."""
    run = in_container(f"""
        import json
        from quasar.evaluate.sandbox import SandboxedChild, SandboxPolicy, SandboxUnavailable, namespaces_supported
        from quasar.starter_fork import write_starter_fork
        write_starter_fork({str(tmp_path / "fork")!r})
        supported, why = namespaces_supported()
        try:
            with SandboxedChild({str(tmp_path / "fork")!r}, "cpu", SandboxPolicy()):
                refused = ""
        except SandboxUnavailable as error:
            refused = str(error)
        with SandboxedChild({str(tmp_path / "fork")!r}, "cpu", SandboxPolicy(allow_unsandboxed=True)) as child:
            isolation, note = child.isolation, child.isolation_note
        print(json.dumps({{"supported": supported, "why": why, "refused": refused, "isolation": isolation,
                          "note": note}}))
    """)
    found = last_json(run)
    assert not found["supported"]
    assert found["why"].startswith(
        "this host refuses new namespaces (unshare: unshare failed: Operation not permitted)"
    )
    assert "CAP_SYS_ADMIN" in found["why"]
    assert found["refused"].startswith(found["why"]) and "--allow-unsandboxed" in found["refused"]
    assert found["isolation"] == "none" and found["note"].startswith(f"UNSANDBOXED ({found['why']})")
    assert "Broken pipe" not in found["refused"] + found["note"] + run.stderr
    assert "\n" not in found["note"]
    # What stands in for the read-only cgroup tree, and why.
    assert "; memory watchdog (16,384 MiB; tasks not limited; no cgroup: " in found["note"]


def quasar_in_container(
    arguments: list[str], tmp_path, shm_mb: int = 64, **environ: str
) -> subprocess.CompletedProcess[str]:
    """``python -m quasar ARGUMENTS`` as on a rented container (its /dev/shm of ``shm_mb`` MiB),
    with no .env and ``environ`` added."""
    command = container_host.command(["python", "-m", "quasar", *arguments], shm_mb=shm_mb)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "QUASAR_DOTENV": "", "HOME": str(tmp_path), **environ}
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_a_validator_on_a_host_without_the_sandbox_stops_at_start_naming_it(tmp_path):
    """It started, leased work and failed every evaluation on its side, each failure telling to
    'pass --allow-unsandboxed', a flag a validator does not take."""
    run = quasar_in_container(["validator", "--subtensor.network", "devchain"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    errors = [line for line in (run.stdout + run.stderr).splitlines() if "ERROR" in line]
    assert len(errors) == 1, run.stdout + run.stderr
    assert "the evaluation sandbox cannot be built on this host: this host refuses new namespaces" in errors[0]
    assert "CAP_SYS_ADMIN" in errors[0] and "--allow-unsandboxed" not in errors[0]


MINER = {
    "GITHUB_TOKEN": "ghp_container_test",
    "GITHUB_USERNAME": "miner",
    "DEVICE": "cpu",
    "TARGET_SEQUENCE_LENGTH": "64",
}


def test_a_miner_on_a_host_without_the_sandbox_stops_at_start_naming_miner_allow_unsandboxed(tmp_path):
    """Every candidate's benchmark failed ('pass --allow-unsandboxed', which the miner does not take)
    and was counted as a failed candidate."""
    refused = quasar_in_container(["miner", "--subtensor.network", "devchain"], tmp_path, **MINER)
    assert refused.returncode == 1
    assert "set MINER_ALLOW_UNSANDBOXED=true" in refused.stderr and "refuses new namespaces" in refused.stderr


def test_a_miner_allowed_to_run_unsandboxed_says_so_once_and_goes_on(tmp_path):
    allowed = quasar_in_container(
        ["miner", "--subtensor.network", "devchain"], tmp_path, **MINER, MINER_ALLOW_UNSANDBOXED="true"
    )
    assert "benchmarking candidates WITHOUT the sandbox (MINER_ALLOW_UNSANDBOXED): this host refuses" in allowed.stderr
    # It goes on to the next check: the wallet, missing here.
    assert allowed.returncode == 1 and "hotkey file" in allowed.stderr


def check_sandbox_in_container(
    tmp_path, *flags: str, shm_mb: int = 64
) -> tuple[subprocess.CompletedProcess[str], dict]:
    arguments = ["check-sandbox", "--device", "cpu", "--out", str(tmp_path), *flags]
    run = quasar_in_container(arguments, tmp_path, shm_mb=shm_mb)
    assert all(len(line) <= 80 for line in run.stdout.splitlines()), run.stdout
    summary = json.loads((tmp_path / "sandbox.json").read_text())
    return run, {row["measure"]: row["holds"] for row in summary["measures"]} | summary["variants"]["default"]


def test_check_sandbox_says_the_host_refuses_namespaces_and_what_each_role_can_do(tmp_path):
    """It said 'namespaces: yes' (the unshare command was there) and then failed the starter fork."""
    run, found = check_sandbox_in_container(tmp_path)
    assert run.returncode == 1
    assert found["namespaces"] is False and found["own uid"] is False
    assert "No sandbox on this host: a validator will not start here" in run.stdout
    assert "MINER_ALLOW_UNSANDBOXED=true" in run.stdout


def test_check_sandbox_allowed_unsandboxed_runs_the_starter_fork_and_says_unsandboxed(tmp_path):
    """It took no --allow-unsandboxed, though its failure told to pass it. The evaluation needs
    no /dev/shm: it passes with 1 MiB there (a rented container gives 64)."""
    run, found = check_sandbox_in_container(tmp_path, "--allow-unsandboxed", shm_mb=1)
    assert run.returncode == 0, run.stdout + run.stderr
    assert found["verdict"] == "pass" and found["sandbox"].startswith("UNSANDBOXED (this host refuses new namespaces")
    assert "sandbox: UNSANDBOXED" in run.stdout


def test_libseccomp_removed_behind_the_loaders_cache_is_named_not_a_traceback():
    """Its files gone and ld.so.cache still naming them (deleted without ldconfig), the second
    attempt to load it raised OSError out of syscall_filter.available(): check-sandbox, every
    sandbox's start and the start checks ended in a traceback."""
    run = in_container(
        """
        import json
        from quasar.evaluate import syscall_filter
        from quasar.evaluate.sandbox import sandbox_unavailable
        print(json.dumps({"available": syscall_filter.available(), "sandbox": sandbox_unavailable()}))
        """,
        without_libseccomp=True,
    )
    found = last_json(run)
    assert found["available"][0] is False
    assert found["available"][1].startswith("libseccomp.so.2 (libseccomp) cannot be loaded (")
    assert "apt-get install libseccomp2" in found["available"][1]
    assert found["sandbox"].startswith("this host refuses new namespaces")
