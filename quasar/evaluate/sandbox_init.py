"""Set up the sandbox from inside its fresh namespaces, then exec the child.

Run by the parent as ``[unshare --net --mount --pid --ipc --uts --fork --kill-child [--user
--map-root-user]] python -I -S sandbox_init.py CONFIG_JSON``; standard library only. It first
joins the sandbox's cgroups, if the parent made any (confinement.py), so everything it starts is
counted there. In the new mount namespace it builds a private root on a tmpfs that holds only:

- read-only binds: the system directories (``/usr``, ``/bin``, ``/lib``…), the Python
  installation without its site-packages, the evaluation environment's packages
  (``/sandbox/site``, environment.py), the fork's copy (``/sandbox/fork``) and the harness's
  copy (``/sandbox/harness``); everything else of the host (``/root``, ``/home``, the validator's
  checkout and virtual environment, wallets, ``/run``, ``/var``, ``/tmp``) does not exist inside;
- an ``/etc`` of its own: the dynamic linker's cache and configuration, the time zone and the
  compiler alternatives bound from the host, and ``passwd``, ``group`` and ``hosts`` written for
  the sandbox (no host names, users, keys or machine id);
- size-limited writable tmpfs: ``/sandbox/home`` (HOME, caches), ``/tmp`` and ``/dev/shm``;
- a minimal ``/dev`` (null, zero, full, random, urandom, the NVIDIA device nodes), a fresh
  ``/proc`` of the new PID namespace and a ``/sys`` of the few read-only parts the config names
  (CPU and NUMA topology, and what CUDA reads);

then ``pivot_root`` into it and detaches the old root, so nothing else is reachable even by path.
Privileges are then dropped: as real root, to the sandbox's own uid and gid; as an ordinary user
(the ``--user`` variant), into a nested user namespace whose uid is unmapped, which removes every
capability at exec and locks the mounts. ``no_new_privs`` is set, the parent-death signal is
SIGKILL, the OOM killer prefers this process, and resource limits apply; the seccomp filter
(syscall_filter.py) is loaded last; then ``execve`` of the child with the scrubbed environment.
Mode ``none`` (``--allow-unsandboxed``) skips the namespaces and mounts but keeps the rest.

A setup failure is reported on the harness's channel as ``{ok: false, kind: "sandbox", error}``
and the process exits with status 70, before any fork code ran.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import protocol
import syscall_filter

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
# statvfs flags that a bind remount must keep (the kernel refuses to clear locked ones).
_KEPT_FLAGS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
EXIT_SETUP_FAILED = 70

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class SetupError(Exception):
    """A step of the sandbox setup failed; the message names the step."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")


def _encoded(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(_encoded(source), _encoded(target), _encoded(fstype), ctypes.c_ulong(flags), _encoded(data))
    _check(result, f"mount {source or fstype or ''} on {target}")


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _make_mountpoint(target: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if not os.path.exists(target):
            with open(target, "w"):
                pass


def _remount_readonly(target: str, extra: int = 0) -> None:
    kept = os.statvfs(target).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | extra
    for st_flag, ms_flag in _KEPT_FLAGS.items():
        if kept & st_flag:
            flags |= ms_flag
    _mount(None, target, None, flags)


def _submounts(root: str) -> list[str]:
    """Mount points at or under ``root`` (from /proc/self/mountinfo), outermost first."""
    points = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == root or point.startswith(root.rstrip("/") + "/"):
                points.append(point)
    return sorted(set(points), key=len)


def _bind(root: str, source: str, target: str) -> str:
    """Bind ``source`` (and its submounts) at ``target`` inside ``root``; the mount point inside."""
    inner = _inside(root, target)
    _make_mountpoint(inner, os.path.isdir(source))
    _mount(source, inner, None, MS_BIND | MS_REC)
    return inner


def _link(root: str, link_target: str, link_path: str) -> None:
    inner = _inside(root, link_path)
    os.makedirs(os.path.dirname(inner), mode=0o755, exist_ok=True)
    os.symlink(link_target, inner)


def _mount_tmpfs(root: str, target: str, options: str) -> None:
    inner = _inside(root, target)
    _make_mountpoint(inner, True)
    _mount("tmpfs", inner, "tmpfs", MS_NOSUID | MS_NODEV, options)


def join_cgroups(config: dict) -> None:
    """Move this process (and so all it starts) into the sandbox's cgroups."""
    for procs in config.get("cgroup_procs", []):
        try:
            with open(procs, "w") as joining:
                joining.write("0")
        except OSError as error:
            raise SetupError(f"join the cgroup {os.path.dirname(procs)}: {error.strerror}") from None


def _build_etc(root: str, config: dict) -> None:
    """The sandbox's /etc: files written from the config, host entries bound read-only."""
    etc = _inside(root, "/etc")
    _make_mountpoint(etc, True)
    _mount("tmpfs", etc, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for name, text in config["etc_files"].items():
        with open(os.path.join(etc, name), "w") as written:
            written.write(text)
        os.chmod(os.path.join(etc, name), 0o644)
    for name in config["etc_binds"]:
        source, inner = os.path.join("/etc", name), os.path.join(etc, name)
        if os.path.islink(source):
            os.symlink(os.readlink(source), inner)
        elif os.path.exists(source):
            _make_mountpoint(inner, os.path.isdir(source))
            _mount(source, inner, None, MS_BIND | MS_REC)
            _remount_readonly(inner, MS_NODEV)
    _remount_readonly(etc, MS_NODEV)


def build_root(config: dict) -> None:
    """Mount the private root under ``config['root_dir']`` and pivot into it."""
    root = config["root_dir"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")

    # Writable tmpfs first: a bind under one of them (a checkout or venv under /tmp) then lands on
    # top of it instead of being hidden by it. Those under /dev wait for /dev's own tmpfs.
    dev_tmpfs = [(target, options) for target, options in config["tmpfs"] if target.startswith("/dev/")]
    for target, options in config["tmpfs"]:
        if not target.startswith("/dev/"):
            _mount_tmpfs(root, target, options)

    readonly_targets = [_bind(root, source, target) for source, target in config["ro_binds"]]
    for link_target, link_path in config["symlinks"]:
        _link(root, link_target, link_path)
    # Empty read-only folders over the site-packages inside the bound Python installation: the
    # packages the child may import are the evaluation environment's alone (/sandbox/site).
    for hidden in config["hidden"]:
        inner = _inside(root, hidden)
        if os.path.isdir(inner):
            _mount("tmpfs", inner, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=0755,size=4k")
    _build_etc(root, config)

    dev = _inside(root, "/dev")
    _make_mountpoint(dev, True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m")
    for device in config["devices"]:
        _bind(root, device, device)
    for name, link_target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(link_target, os.path.join(dev, name))

    for target, options in dev_tmpfs:
        _mount_tmpfs(root, target, options)
    _remount_readonly(dev)

    proc = _inside(root, "/proc")
    _make_mountpoint(proc, True)
    _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    sys_dir = _inside(root, "/sys")
    _make_mountpoint(sys_dir, True)
    readonly_targets += [_bind(root, path, path) for path in config["sys_binds"] if os.path.isdir(path)]

    # Every bind is read-only, its submounts too (a recursive bind copies them writable).
    for target in readonly_targets:
        for point in _submounts(target):
            _remount_readonly(point, 0 if point.startswith(sys_dir) else MS_NODEV)

    old_root = _inside(root, "/.old_root")
    os.makedirs(old_root, mode=0o700)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise SetupError(f"pivot_root: unsupported machine {platform.machine()}")
    _check(_libc.syscall(number, root.encode(), old_root.encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old_root", MNT_DETACH), "detach the old root")
    os.rmdir("/.old_root")
    _remount_readonly("/", MS_NODEV)


def forget_unmapped_shared_memory() -> None:
    """In the sandbox's own IPC namespace, remove a System V shared memory segment once no process
    maps it: a segment outlives its mappings otherwise, memory that no process of the sandbox shows
    and that the memory watchdog (confinement.py) could not count. Where the kernel refuses the
    setting to a user namespace's root (older kernels do), the namespace keeps its default."""
    try:
        with open("/proc/sys/kernel/shm_rmid_forced", "w") as setting:
            setting.write("1")
    except OSError:
        pass


def drop_privileges(config: dict) -> None:
    """Leave root: setuid to nobody (real root), or a nested user namespace (ordinary user)."""
    if config["mode"] == "root":
        os.setgroups([])
        os.setgid(config["gid"])
        os.setuid(config["uid"])
        if os.getuid() != config["uid"] or os.geteuid() != config["uid"]:
            raise SetupError("setuid did not take effect")
    elif config["mode"] == "userns":
        _check(_libc.unshare(CLONE_NEWUSER), "unshare a nested user namespace")


def set_rlimits(rlimits: dict) -> None:
    """Each ``RLIMIT_<name>``, soft and hard, at its value (at the hard limit where that is lower)."""
    for name, value in rlimits.items():
        limit = getattr(resource, f"RLIMIT_{name}")
        _, hard = resource.getrlimit(limit)
        wanted = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (wanted, wanted))


def die_with_parent() -> None:
    """SIGKILL when the parent process dies (cleared by a credential change, not inherited by a fork)."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(pdeathsig)")


def apply_limits(config: dict) -> None:
    """Resource limits, no new privileges, and first in line for the OOM killer (before dropping root)."""
    set_rlimits(config["rlimits"])
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
    with open("/proc/self/oom_score_adj", "w") as adjust:
        adjust.write("1000")  # oom_preference.OOM_SCORE_ADJ, which the memory watchdog holds


def main() -> None:
    config = json.loads(sys.argv[1])
    # The private root's folders are made here, as root, for the sandbox's uid to traverse: a
    # validator's umask of 077 (a hardened host's) made them 0700, and the sandbox never started.
    os.umask(0o022)
    try:
        join_cgroups(config)
        # libseccomp is loaded while the host's library paths are still in view.
        library = syscall_filter.load_library() if config["seccomp"] else None
        if config["mode"] in ("root", "userns"):
            build_root(config)
            forget_unmapped_shared_memory()
        apply_limits(config)
        drop_privileges(config)
        # After the credential change, which clears it: die when unshare (or the parent) dies.
        die_with_parent()
        os.chdir(config["cwd"])
        if library is not None:
            syscall_filter.install(library)
    except (SetupError, OSError, syscall_filter.FilterError) as error:
        channel = protocol.Channel(config["read_fd"], config["write_fd"])
        channel.send({"ok": False, "kind": "sandbox", "error": f"sandbox setup failed: {error}"})
        sys.exit(EXIT_SETUP_FAILED)
    os.execve(config["argv"][0], config["argv"], config["env"])


if __name__ == "__main__":
    main()
