"""What a sandboxed child is given (sandbox.py starts it and ends it): its working folder, with a
copy of the fork (without ``.git``, compiled to bytecode beside it within the sandbox's limits)
and the harness's files the child runs; its site folders; the NVIDIA device nodes it holds; and
its whole environment, scrubbed of the parent's (no tokens, no wallet paths; HOME and TMPDIR
inside the sandbox)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from quasar.errors import QuasarError
from quasar.evaluate.environment import evaluation_environment
from quasar.evaluate.gpus import assigned_gpu, nvidia_gpus
from quasar.evaluate.sandbox_layout import SANDBOX_SITE, SandboxPolicy, python_executable
from quasar.evaluate.stragglers import MARKER_VARIABLE

HARNESS_FILES = ("child.py", "protocol.py", "workload.py", "sandbox_init.py", "syscall_filter.py")
HARNESS_DIR = Path(__file__).resolve().parent
# The packages a fork's code may not use (docs/rules.md section 4 step 2), under fla/ops/.
FORBIDDEN_PACKAGES = ("gla", "kda")
# A fork bigger than this (without .git) is refused rather than copied.
MAX_FORK_BYTES = 512 * 1024 * 1024
# The bytecode compiled beside the import check (compile_fork_copy): of sources up to this size
# (compiling one takes some 400 times its size in memory: two 8 MB files of a list took over
# 5 GiB), by up to this many processes, each held to this address space and CPU time.
MAX_COMPILED_SOURCE_BYTES = 512 << 10
COMPILE_WORKERS = 4
COMPILE_ADDRESS_SPACE_BYTES = 512 << 20
COMPILE_CPU_SECONDS = 60
# Variables passed through from the parent's environment when set: library lookup and device
# selection only, never credentials.
PASSED_VARIABLES = (
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "TRITON_LIBCUDA_PATH",
    "TRITON_PTXAS_PATH",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
)


class SandboxError(QuasarError):
    """The sandbox could not be set up or the child misbehaved at the process level."""


def scrubbed_environment(home: str, device: str, policy: SandboxPolicy, marker: str) -> dict[str, str]:
    """The child's whole environment: nothing of the parent's except :data:`PASSED_VARIABLES`."""
    python_bin = os.path.dirname(python_executable())
    env = {
        "PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": f"{home}/tmp",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "XDG_CACHE_HOME": f"{home}/.cache",
        "TRITON_CACHE_DIR": f"{home}/.triton/cache",
        "TORCHINDUCTOR_CACHE_DIR": f"{home}/.cache/torchinductor",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTORCH_CUDA_ALLOC_CONF": policy.pytorch_cuda_alloc_conf,
        MARKER_VARIABLE: marker,
    }
    for name in PASSED_VARIABLES:
        if name in os.environ:
            env[name] = os.environ[name]
    if device.startswith("cuda"):
        physical = physical_gpu_id(device)
        gpu = assigned_gpu(physical, nvidia_gpus())
        # By UUID where the driver says it: the one GPU whose device node the sandbox holds.
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid if gpu is not None else physical
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def physical_gpu_id(device: str) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of ``cuda`` / ``cuda:N`` in this process's view (an index
    in PCI order, a ``GPU-`` UUID or a MIG id). Raises SandboxError for a device not visible."""
    index = int(device.split(":")[1]) if ":" in device else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    choices = [v.strip() for v in visible.split(",")] if visible else None
    if choices is not None and index >= len(choices):
        raise SandboxError(f"device {device}: CUDA_VISIBLE_DEVICES={visible} has no device {index}")
    return choices[index] if choices is not None else str(index)


def copy_tree(source: Path, destination: Path) -> None:
    """Copy a fork without ``.git`` and its bytecode caches (the sandbox compiles its own, from
    the sources the import check read), without following links out of it, world-readable; and
    with stand-ins in place of ``fla.ops.gla`` and ``fla.ops.kda`` (:func:`stand_in_forbidden`)."""
    total = 0

    def ignore(directory: str, names: list[str]) -> set[str]:
        nonlocal total
        skipped = {".git"} if directory == str(source) else set()
        skipped |= {name for name in names if name == "__pycache__"}
        for name in names:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                resolved = os.path.realpath(path)
                if not (resolved == str(source) or resolved.startswith(str(source) + os.sep)):
                    skipped.add(name)
            elif os.path.isfile(path):
                total += os.path.getsize(path)
        if total > MAX_FORK_BYTES:
            raise SandboxError(f"the fork is larger than {MAX_FORK_BYTES >> 20} MiB without .git")
        return skipped

    shutil.copytree(source, destination, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    stand_in_forbidden(destination)
    for directory, _, filenames in os.walk(destination):
        os.chmod(directory, 0o755)
        for name in filenames:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)


def stand_in_forbidden(copy: Path) -> None:
    """Put stand-ins (ops_stand_in.py) in place of ``fla/ops/gla`` and ``fla/ops/kda`` in the
    fork's copy ``copy``, whatever they are there (folders, files, links) or where there is none:
    the import check reads only some files (docs/rules.md section 4 step 2), so code elsewhere in
    the fork could reach their kernels. Where ``fla/ops`` is a link to a folder of the copy (its
    root included), the stand-ins go in that folder; where it is none, ``fla.ops`` cannot be
    imported."""
    root = os.path.realpath(copy)
    ops = os.path.realpath(copy / "fla" / "ops")
    # The copy's root itself may be fla/ops (a link to "..").
    if not (ops == root or ops.startswith(root + os.sep)) or not os.path.isdir(ops):
        return
    for name in FORBIDDEN_PACKAGES:
        package = os.path.join(ops, name)
        if os.path.isdir(package) and not os.path.islink(package):
            shutil.rmtree(package)
        elif os.path.lexists(package):
            os.unlink(package)
        os.mkdir(package)
        shutil.copyfile(HARNESS_DIR / "ops_stand_in.py", os.path.join(package, "__init__.py"))


def prepare_workdir(workdir: Path, fork: Path | None) -> None:
    """Fill the sandbox's fresh working folder: the fork's copy (an empty folder for a child
    started without its fork, filled later), the harness's files, the private root's mount point
    and the child's home with its tmp."""
    if fork is not None:
        copy_tree(fork, workdir / "fork")
    else:
        (workdir / "fork").mkdir()
        os.chmod(workdir / "fork", 0o755)
    # Modes set by chmod: mkdir's is narrowed by the umask, and under 077 the sandbox's uid could
    # not read its harness.
    (workdir / "harness").mkdir()
    os.chmod(workdir / "harness", 0o755)
    for name in HARNESS_FILES:
        shutil.copyfile(HARNESS_DIR / name, workdir / "harness" / name)
        os.chmod(workdir / "harness" / name, 0o644)
    (workdir / "root").mkdir(mode=0o700)
    home = workdir / "home"
    (home / "tmp").mkdir(parents=True, mode=0o700)


def compiled_sources(fork: Path) -> list[str]:
    """The sources of the fork copy ``fork`` that are compiled beside the import check: regular
    ``.py`` files of at most :data:`MAX_COMPILED_SOURCE_BYTES`, relative to it, largest first."""
    found = []
    for directory, _, names in os.walk(fork):
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(".py"):
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode) and info.st_size <= MAX_COMPILED_SOURCE_BYTES:
                    found.append((info.st_size, os.path.relpath(path, fork)))
    return [path for _, path in sorted(found, reverse=True)]


def compile_fork_copy(workdir: Path, shown: str, uid: int | None, cgroup_procs: list[str]) -> subprocess.Popen:
    """Start compiling the fork copy's sources (:func:`compiled_sources`) to bytecode, in
    processes of their own on several cores, beside the import check (the child, one pinned core,
    would compile a real fla tree's 571 modules itself at import: seconds); ``shown``: the fork's
    folder as the child sees it. fork_bytecode.py compiles them within the sandbox's limits:
    in its cgroups (``cgroup_procs``), as its ``uid`` (None: this process's), each process held
    to :data:`COMPILE_ADDRESS_SPACE_BYTES` and :data:`COMPILE_CPU_SECONDS`. Only compiled, never
    run; where it fails or is late the child compiles what is missing, as Python always does."""
    fork = workdir / "fork"
    sources = compiled_sources(fork)
    if uid is not None:
        # The sandbox's uid writes the bytecode: it is given the cache folders, nothing else.
        for folder in {os.path.dirname(source) for source in sources}:
            cache = fork / folder / "__pycache__"
            cache.mkdir(mode=0o755, exist_ok=True)
            os.chown(cache, uid, uid, follow_symlinks=False)
    config = {
        "cgroup_procs": cgroup_procs,
        "rlimits": {"AS": COMPILE_ADDRESS_SPACE_BYTES, "CPU": COMPILE_CPU_SECONDS, "CORE": 0},
        "uid": uid,
        "workers": min(COMPILE_WORKERS, os.cpu_count() or 1),
        "shown": shown,
    }
    # NUL-ended: a file's name may hold a newline.
    with tempfile.TemporaryFile() as listing:
        listing.write(b"".join(os.fsencode(source) + b"\0" for source in sources))
        listing.seek(0)
        return subprocess.Popen(
            [python_executable(), "-I", "-S", str(HARNESS_DIR / "fork_bytecode.py"), json.dumps(config)],
            stdin=listing,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=fork,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
        )


def site_paths(workdir: Path, namespaced: bool) -> list[str]:
    """The child's site folders, as it sees them: the binds under /sandbox/site, or (without
    namespaces) folders of links to the environment's entries, made in ``workdir``."""
    sites = evaluation_environment().sites
    if namespaced:
        return [f"{SANDBOX_SITE}/{index}" for index in range(len(sites))]
    paths = []
    for index, site in enumerate(sites):
        folder = workdir / "site" / str(index)
        folder.mkdir(parents=True, exist_ok=True)
        for entry in site.entries:
            link = folder / entry
            if not link.exists():
                link.symlink_to(os.path.join(site.path, entry))
        paths.append(str(folder))
    return paths


def nvidia_device_nodes(device: str) -> tuple[list[str], str]:
    """The NVIDIA device nodes the sandbox of ``device`` holds: the driver's control nodes and its
    own GPU's, or every GPU's where the driver does not say which node is its GPU; and a note
    saying which, for the report ("" where it holds none)."""
    if not device.startswith("cuda") or not os.path.isdir("/dev"):
        return [], ""
    gpu = assigned_gpu(physical_gpu_id(device), nvidia_gpus())
    names = sorted(name for name in os.listdir("/dev") if name.startswith("nvidia"))
    per_gpu = [name for name in names if name[len("nvidia") :].isdigit()]
    if gpu is None:
        return [f"/dev/{name}" for name in names], "every GPU's device node (which is its own is unknown here)"
    nodes = [f"/dev/{name}" for name in names if name not in per_gpu or name == f"nvidia{gpu.minor}"]
    return nodes, f"its own GPU's device node only ({gpu.bus})"
