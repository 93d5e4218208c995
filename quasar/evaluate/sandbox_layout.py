"""The policy a sandbox is made with (its limits and permissions) and what its private root
holds: its folders, the host's directories it binds read-only, the Python installation without
its packages, the evaluation environment's entries, its own /etc, the parts of /sys it sees and
its device nodes (docs/validator.md, "The evaluation sandbox"). sandbox_init.py builds the root from
:func:`root_mounts`' part of its config.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from quasar.config.options import OPTIONS_BY_KEY
from quasar.evaluate.environment import evaluation_environment

SANDBOX_FORK = "/sandbox/fork"

SANDBOX_HARNESS = "/sandbox/harness"

SANDBOX_HOME = "/sandbox/home"

# The Triton cache seed (triton_seed.py), read-only, where the policy gives one.
SANDBOX_TRITON_SEED = "/sandbox/triton-seed"

# The evaluation environment's site folders inside the sandbox: /sandbox/site/0, /sandbox/site/1…
SANDBOX_SITE = "/sandbox/site"

NOBODY = 65534

# The sandbox's user and group names in its own /etc/passwd and /etc/group.
SANDBOX_USER = "sandbox"

# Read-only system directories of the private root (those that exist on this machine).
SYSTEM_DIRECTORIES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt/conda")

# What the sandbox's /etc holds of the host's: the dynamic linker's cache and configuration (the
# loader and Triton's `ldconfig -p` read them), the time zone, the name service switch (with the
# files below, lookups stay inside) and the alternatives' links (/usr/bin/cc and the like).
ETC_BINDS = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "alternatives")

# The parts of /sys the sandbox sees, read-only: the CPUs and NUMA nodes (os.cpu_count, torch's
# thread pools, the CUDA driver's placement) and the NVIDIA kernel modules' parameters.
SYS_BINDS = ("/sys/devices/system/cpu", "/sys/devices/system/node", "/sys/module/nvidia", "/sys/module/nvidia_uvm")


@dataclass(frozen=True)
class SandboxPolicy:
    """Limits and permissions of one sandboxed child."""

    allow_unsandboxed: bool = False
    # Force the unsandboxed mode even where namespaces work (tests of the fallback path).
    force_unsandboxed: bool = False
    home_tmpfs_bytes: int = 4 << 30
    tmp_tmpfs_bytes: int = 1 << 30
    shm_tmpfs_bytes: int = 1 << 30
    max_output_bytes: int = 64 << 20
    max_open_files: int = 4096
    # Processes and threads, through the sandbox's cgroup (or its own uid's RLIMIT_NPROC).
    max_processes: int = 4096
    max_file_bytes: int = 4 << 30
    # Memory of the sandbox's processes, through its cgroup or the watchdog (confinement.py).
    memory_bytes: int = int(OPTIONS_BY_KEY["sandbox_memory_mb"].default) << 20
    # A cgroup v2 folder, delegated to this process, to make the sandboxes' cgroups in; None: found.
    cgroup_path: str | None = None
    sys_paths: tuple[str, ...] = SYS_BINDS
    extra_readonly_paths: tuple[str, ...] = ()
    pytorch_cuda_alloc_conf: str = OPTIONS_BY_KEY["pytorch_cuda_alloc_conf"].default
    # A folder of what Triton compiled for the starter fork (triton_seed.py), copied into the
    # child's own cache at its start; None: the child compiles everything. Namespaced sandboxes
    # only: unsandboxed, the fork could write into it for later evaluations.
    triton_seed: str | None = None


DEVICE_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def python_executable() -> str:
    """The interpreter the child runs: this one's real file, outside any virtual environment
    (the child runs without ``site``; its packages are the evaluation environment's alone)."""
    return os.path.realpath(sys.executable)


def python_installation() -> list[str]:
    """Directories of the child's Python: the installation its real executable belongs to (the
    standard library, headers Triton compiles against, libpython) and that executable's folder."""
    executable = python_executable()
    prefix = os.path.dirname(os.path.dirname(executable))
    paths = {prefix, os.path.dirname(executable), sys.base_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "include", "platinclude"):
        path = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix}).get(key)
        if path:
            paths.add(path)
    return sorted(p for p in paths if os.path.isdir(p))


def site_folders() -> list[str]:
    """Every folder of installed packages this machine's Pythons may have, that exists: this
    process's own, its base installation's, Debian's, and those on ``sys.path``."""
    candidates = set(site.getsitepackages()) | {site.getusersitepackages()}
    for key in ("purelib", "platlib"):
        candidates.add(sysconfig.get_paths()[key])
        candidates.add(sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})[key])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates |= {
        "/usr/lib/python3/dist-packages",
        f"/usr/lib/{version}/site-packages",
        f"/usr/local/lib/{version}/dist-packages",
        f"/usr/local/lib/{version}/site-packages",
    }
    candidates |= {entry for entry in sys.path if os.path.basename(entry) in ("site-packages", "dist-packages")}
    return sorted(os.path.normpath(c) for c in candidates if c and os.path.isdir(c))


def inside_any(path: str, folders: list[str]) -> bool:
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


def etc_files(uid: int) -> dict[str, str]:
    """The files written into the sandbox's /etc: its users, groups and hosts, nothing of the host's."""
    accounts = (("root", 0), ("nobody", NOBODY)) + (((SANDBOX_USER, uid),) if uid not in (0, NOBODY) else ())
    users = "".join(
        f"{name}:x:{number}:{number}:{name}:{SANDBOX_HOME}:/usr/sbin/nologin\n" for name, number in accounts
    )
    groups = "".join(f"{name}:x:{number}:\n" for name, number in accounts)
    return {"passwd": users, "group": groups, "hosts": "127.0.0.1 localhost\n::1 localhost\n", "hostname": "sandbox\n"}


def outermost(paths: list[str]) -> list[str]:
    """Drop paths that lie inside another path of the list."""
    kept: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths}, key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def root_mounts(workdir: Path, mode: str, uid: int, policy: SandboxPolicy, devices: list[str]) -> dict:
    """The private root's part of sandbox_init.py's config: read-only binds (the system, the Python
    installation, the evaluation environment's entries, the fork's and the harness's copies under
    ``workdir``), root-level links, the package folders hidden inside what is bound, the /etc and
    /sys it holds, ``devices`` and its writable tmpfs (owned by ``uid`` as root)."""
    folders = site_folders()
    directories = list(SYSTEM_DIRECTORIES) + python_installation() + list(policy.extra_readonly_paths)
    for variable in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"):
        directories += [p for p in os.environ.get(variable, "").split(":") if p and not inside_any(p, folders)]
    binds, links = [], []
    for path in outermost([p for p in directories if os.path.lexists(p)]):
        if os.path.islink(path) and os.path.dirname(path) == "/":
            links.append([os.readlink(path), path])
        elif os.path.isdir(path):
            binds.append([path, path])
    bound = [target for _, target in binds]
    for index, environment_site in enumerate(evaluation_environment().sites):
        binds += [
            [os.path.join(environment_site.path, entry), f"{SANDBOX_SITE}/{index}/{entry}"]
            for entry in environment_site.entries
        ]
    binds += [[str(workdir / "fork"), SANDBOX_FORK], [str(workdir / "harness"), SANDBOX_HARNESS]]
    if policy.triton_seed is not None and os.path.isdir(policy.triton_seed):
        binds.append([policy.triton_seed, SANDBOX_TRITON_SEED])
    owner = f",uid={uid},gid={uid}" if mode == "root" else ""
    return {
        "ro_binds": binds,
        "symlinks": links,
        "hidden": [folder for folder in folders if inside_any(folder, bound)],
        "etc_files": etc_files(uid),
        "etc_binds": list(ETC_BINDS),
        "sys_binds": [path for path in policy.sys_paths if os.path.isdir(path)],
        "devices": [d for d in DEVICE_NODES if os.path.exists(d)] + devices,
        "tmpfs": [
            [SANDBOX_HOME, f"mode=0700,size={policy.home_tmpfs_bytes}{owner}"],
            ["/tmp", f"mode=1777,size={policy.tmp_tmpfs_bytes}"],
            ["/dev/shm", f"mode=1777,size={policy.shm_tmpfs_bytes}"],
        ],
    }
