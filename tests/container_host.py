"""Run a command as on a rented GPU container (RunPod, Vast.ai and the like), for one process tree.

Such a host gives root inside a container started with Docker's defaults: no CAP_SYS_ADMIN (nor
the other capabilities Docker drops), Docker's default seccomp profile (new namespaces, mounts and
the kernel keyrings refused with EPERM, ``clone3`` with ENOSYS), a ``/dev/shm`` of 64 MiB and a
read-only ``/sys/fs/cgroup``. This module gives one command the same, without touching the rest of
the machine: it re-runs itself in a private mount namespace (``unshare --mount``), mounts a small
tmpfs on ``/dev/shm`` (and, asked, on a folder for ``TMPDIR``), remounts every cgroup mount
read-only, loads a seccomp filter like Docker's, and execs the command through ``setpriv`` with
Docker's capability set. Needs root with CAP_SYS_ADMIN, ``unshare``, ``setpriv`` and libseccomp:
:func:`unavailable` says why not, for a test's skip.

    python tests/container_host.py [--shm-mb 64] [--small-tmpdir-mb N] [--without-libseccomp] -- COMMAND ARGS...
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from quasar.evaluate import syscall_filter  # noqa: E402

# Docker's default capabilities (moby's oci/caps/defaults.go); CAP_SYS_ADMIN is not among them.
DOCKER_CAPABILITIES = (
    "chown",
    "dac_override",
    "fsetid",
    "fowner",
    "mknod",
    "net_raw",
    "setgid",
    "setuid",
    "setfcap",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "kill",
    "audit_write",
)
# What Docker's default seccomp profile refuses without CAP_SYS_ADMIN, of what the suite could use.
DOCKER_REFUSED = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
)
# Where the mount namespace puts its own tmpfs for scratch folders (hiding the host's /mnt there only).
SCRATCH = Path("/mnt")
# "namespace" once re-run in its own mount namespace, "container" in the command it runs.
INSIDE = "QUASAR_TEST_CONTAINER_INSIDE"
# libseccomp's filter attribute for setting no_new_privs at load (seccomp.h).
SCMP_FLTATR_CTL_NNP = 3


def unavailable() -> str:
    """Why this machine cannot simulate the container here, or ``""``."""
    if not sys.platform.startswith("linux"):
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root (to make a mount namespace and drop capabilities from it)"
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux)"
    ok, why = syscall_filter.available()
    if not ok:
        return f"needs libseccomp to simulate Docker's seccomp profile ({why})"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a mount namespace here (already in a container?): {probe.stderr.strip()}"
    return ""


def command(
    inner: list[str], shm_mb: int = 64, small_tmpdir_mb: int = 0, without_libseccomp: bool = False
) -> list[str]:
    """The command line that runs ``inner`` as on a rented container (``without_libseccomp``: one
    whose libseccomp files are gone, the loader's cache still naming them)."""
    flags = ["--shm-mb", str(shm_mb), "--small-tmpdir-mb", str(small_tmpdir_mb)]
    flags += ["--without-libseccomp"] if without_libseccomp else []
    return [sys.executable, __file__, *flags, "--", *inner]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _cgroup_mounts() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            point = fields[4]
            if fstype in ("cgroup", "cgroup2") or point == "/sys/fs/cgroup":
                points.append(point)
    return sorted(set(points), key=len, reverse=True)


def _remove_libseccomp(loaded: str) -> None:
    """Remove libseccomp's files from this mount namespace's view (an overlay over its folder),
    leaving the loader's cache naming them, as an image that deleted them without ldconfig."""
    folder = os.path.dirname(os.path.realpath(loaded))
    scratch = SCRATCH / "libseccomp"
    scratch.mkdir()
    (scratch / "upper").mkdir()
    (scratch / "work").mkdir()
    _mount(
        "-t", "overlay", "overlay", "-o", f"lowerdir={folder},upperdir={scratch}/upper,workdir={scratch}/work", folder
    )
    for name in os.listdir(folder):
        if name.startswith("libseccomp.so"):
            os.unlink(os.path.join(folder, name))


def _loaded_path(name: str) -> str:
    with open("/proc/self/maps") as maps:
        return next(line.split()[-1] for line in maps if name in line)


def _load_docker_filter(library: ctypes.CDLL) -> None:
    context = library.seccomp_init(syscall_filter.SCMP_ACT_ALLOW)
    try:
        # libseccomp sets no_new_privs by default; Docker's runtime does not.
        library.seccomp_attr_set(ctypes.c_void_p(context), SCMP_FLTATR_CTL_NNP, 0)
        for name in DOCKER_REFUSED:
            number = library.seccomp_syscall_resolve_name(name.encode())
            if number >= 0:
                library.seccomp_rule_add_array(context, syscall_filter.scmp_act_errno(errno.EPERM), number, 0, None)
        clone = library.seccomp_syscall_resolve_name(b"clone")
        for flag in syscall_filter.CLONE_NAMESPACE_FLAGS.values():
            comparison = syscall_filter._ArgumentComparison(0, syscall_filter.SCMP_CMP_MASKED_EQ, flag, flag)
            array = (syscall_filter._ArgumentComparison * 1)(comparison)
            library.seccomp_rule_add_array(context, syscall_filter.scmp_act_errno(errno.EPERM), clone, 1, array)
        clone3 = library.seccomp_syscall_resolve_name(b"clone3")
        library.seccomp_rule_add_array(context, syscall_filter.scmp_act_errno(errno.ENOSYS), clone3, 0, None)
        if library.seccomp_load(context) != 0:
            raise OSError(ctypes.get_errno(), "seccomp_load failed")
    finally:
        library.seccomp_release(context)


def main() -> None:
    if os.environ.get(INSIDE) != "namespace":
        # Every mount below is made in a mount namespace of this process tree's own, never the host's.
        os.environ[INSIDE] = "namespace"
        os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable, *sys.argv])
    parser = argparse.ArgumentParser()
    parser.add_argument("--shm-mb", type=int, default=64)
    parser.add_argument("--small-tmpdir-mb", type=int, default=0)
    parser.add_argument("--without-libseccomp", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    inner = args.command[1:] if args.command[:1] == ["--"] else args.command
    # This namespace's own scratch space, gone with it: nothing is left on the host's disk.
    _mount("-t", "tmpfs", "-o", "size=16m,mode=1777", "tmpfs", str(SCRATCH))
    # Loaded before its files may be removed: this process's filter still needs it.
    library = syscall_filter.load_library()
    if args.without_libseccomp:
        _remove_libseccomp(_loaded_path("libseccomp.so"))
    _mount("-t", "tmpfs", "-o", f"size={args.shm_mb}m,mode=1777", "tmpfs", "/dev/shm")
    if args.small_tmpdir_mb:
        small = str(SCRATCH / "tmpdir")
        os.mkdir(small)
        _mount("-t", "tmpfs", "-o", f"size={args.small_tmpdir_mb}m,mode=1777", "tmpfs", small)
        os.environ["TMPDIR"] = small
    for point in _cgroup_mounts():
        _mount("-o", "remount,bind,ro", point)
    os.environ[INSIDE] = "container"
    # Loaded while privileged (as runc does), so no_new_privs stays unset, as in a Docker container.
    _load_docker_filter(library)
    caps = "-all," + ",".join(f"+{cap}" for cap in DOCKER_CAPABILITIES)
    os.execvp("setpriv", ["setpriv", f"--bounding-set={caps}", "--inh-caps=-all", "--", *inner])


if __name__ == "__main__":
    main()
