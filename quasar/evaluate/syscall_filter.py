"""The sandbox's seccomp filter: system calls a fork never needs, refused with EPERM.

Loaded by sandbox_init.py as the last step before it execs the child, so it binds the child and
everything the child starts (a filter survives ``execve`` and is inherited by ``fork``). The filter
is compiled by libseccomp (``libseccomp.so.2``, present wherever systemd or apt is), called through
ctypes: standard library only, as sandbox_init is, and no hand-written BPF.

Every other call is allowed (CUDA, Triton's compiler and torch use a wide and changing set). What
is refused, and why:

- the kernel keyrings (``add_key``, ``request_key``, ``keyctl``): keys outlive a process and are
  shared by every process of a uid, so one evaluation could leave data for a later one;
- new namespaces and joining others (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag;
  ``clone3``, whose flags a filter cannot read, answers ENOSYS so that C libraries fall back to
  ``clone``): a user namespace would hand the fork capabilities inside it;
- reaching into other processes or the kernel: ``ptrace``, ``process_vm_readv``/``writev``,
  ``pidfd_getfd``, ``kcmp``, ``bpf``, ``perf_event_open`` (also a timing side channel),
  ``userfaultfd`` and ``io_uring_*`` (both long sources of kernel exploits);
- changing a thread's CPU affinity (``sched_setaffinity``): the child starts pinned to the CPUs
  its evaluation was planned on (pinning.py); widening them would let a fork spin on the cores of
  the parent's timing thread or of a neighbour's evaluation and slow their measurements;
- secret memory (``memfd_secret``): its pages count as no process's anonymous or shared memory,
  so the memory watchdog that stands in for a cgroup (confinement.py) does not see them, and each
  process may hold its ``RLIMIT_MEMLOCK`` of them: a fork held 3 GiB so, 7 MiB in each of 438
  processes, under a watchdog's limit of 1.5 GiB. Nothing a fork runs needs it;
- mounts, modules, reboot, swap, clocks, host names and other administration (refused to a
  process without capabilities anyway; refused here whatever the kernel's rules).

Calls with another architecture's numbering (the 32-bit ``int 0x80`` entry on x86-64) kill the
thread: libseccomp's default for a foreign architecture.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno

LIBRARY = "libseccomp.so.2"

# System calls refused with EPERM (names unknown to this machine's libseccomp are skipped).
REFUSED = (
    "add_key",
    "request_key",
    "keyctl",
    "unshare",
    "setns",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "bpf",
    "perf_event_open",
    "sched_setaffinity",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "memfd_secret",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "iopl",
    "ioperm",
    "sethostname",
    "setdomainname",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
)
# clone() flags that make a new namespace (the low byte of clone's flags is the exit signal).
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

# libseccomp's constants (seccomp.h).
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7


def scmp_act_errno(code: int) -> int:
    """SCMP_ACT_ERRNO(code): the call fails with ``code``."""
    return 0x00050000 | (code & 0x0000FFFF)


class _ArgumentComparison(ctypes.Structure):
    """struct scmp_arg_cmp."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class FilterError(Exception):
    """libseccomp is missing or refused a step; the message names it."""


def load_library() -> ctypes.CDLL:
    """libseccomp, loaded with the prototypes used here; raises FilterError where it is missing."""
    try:
        library = ctypes.CDLL(LIBRARY, use_errno=True)
    except OSError:
        found = ctypes.util.find_library("seccomp")
        if found is None:
            raise FilterError(f"{LIBRARY} (libseccomp) is not installed (apt-get install libseccomp2)") from None
        try:
            library = ctypes.CDLL(found, use_errno=True)
        except OSError as error:
            # The loader's cache names a file that is gone or broken (deleted without ldconfig).
            raise FilterError(
                f"{LIBRARY} (libseccomp) cannot be loaded ({error}; apt-get install libseccomp2)"
            ) from None
    library.seccomp_init.restype = ctypes.c_void_p
    library.seccomp_init.argtypes = (ctypes.c_uint32,)
    library.seccomp_release.argtypes = (ctypes.c_void_p,)
    library.seccomp_syscall_resolve_name.restype = ctypes.c_int
    library.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
    library.seccomp_rule_add_array.restype = ctypes.c_int
    library.seccomp_rule_add_array.argtypes = (
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgumentComparison),
    )
    library.seccomp_load.restype = ctypes.c_int
    library.seccomp_load.argtypes = (ctypes.c_void_p,)
    return library


def available() -> tuple[bool, str]:
    """Whether this machine can load the filter (libseccomp found), and why not."""
    try:
        load_library()
    except FilterError as error:
        return False, str(error)
    return True, ""


def install(library: ctypes.CDLL | None = None) -> list[str]:
    """Load the filter into this process (no_new_privs must be set, or the process privileged);
    returns the refused calls this machine knows. Raises FilterError naming what failed."""
    library = library if library is not None else load_library()
    context = library.seccomp_init(SCMP_ACT_ALLOW)
    if not context:
        raise FilterError("seccomp_init failed")
    try:
        refused = []

        def add(action: int, name: str, comparisons: list[_ArgumentComparison]) -> bool:
            number = library.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                return False
            array = (_ArgumentComparison * len(comparisons))(*comparisons) if comparisons else None
            result = library.seccomp_rule_add_array(context, action, number, len(comparisons), array)
            if result != 0:
                raise FilterError(f"seccomp_rule_add({name}): {errno.errorcode.get(-result, result)}")
            return True

        for name in REFUSED:
            if add(scmp_act_errno(errno.EPERM), name, []):
                refused.append(name)
        for flag in CLONE_NAMESPACE_FLAGS.values():
            add(scmp_act_errno(errno.EPERM), "clone", [_ArgumentComparison(0, SCMP_CMP_MASKED_EQ, flag, flag)])
        refused.append("clone(CLONE_NEW*)")
        if add(scmp_act_errno(errno.ENOSYS), "clone3", []):
            refused.append("clone3 (ENOSYS)")
        result = library.seccomp_load(context)
        if result != 0:
            raise FilterError(f"seccomp_load: {errno.errorcode.get(-result, result)}")
        return refused
    finally:
        library.seccomp_release(context)
