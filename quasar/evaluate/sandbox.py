"""Start the fork's code in a sandboxed child process and end it completely.

:class:`SandboxedChild` copies the fork (without ``.git``) and the harness's child code into a
fresh temporary directory the parent owns (``start``; ``wait_started`` waits for its first reply,
so the caller can work while the child imports torch; a child started before its fork is known
gets it from :meth:`SandboxedChild.provide_fork`, before ``load``), starts ``sandbox_init.py`` under ``unshare``
(new network, mount, PID, IPC and UTS namespaces; see that file for the private root it builds),
and talks to it over a pipe pair it owns (protocol.py). Given ``cpus``, the child starts with that
CPU affinity (pinning.py). Its stdout and stderr go to one pipe the parent drains: the first and
last :data:`KEPT_OUTPUT_BYTES` are kept, and a child writing more than ``max_output_bytes`` in all
is killed. The child's environment holds only what :func:`scrubbed_environment` lists: no tokens,
no wallet paths, HOME and TMPDIR inside the sandbox. Closing kills the whole process group (the PID
namespace takes every descendant with its init), then looks for stragglers carrying the sandbox's
marker variable and kills those too. If the parent itself dies (even by SIGKILL), the parent-death
signal takes the sandbox with it.

Isolation levels (``SandboxedChild.isolation``):

- ``namespaces``: the full sandbox above, as root (child runs as ``nobody``) or as an ordinary
  user through an unprivileged user namespace;
- ``none``: only with ``allow_unsandboxed=True``, when namespaces are unavailable (or for
  tests): scrubbed environment, resource limits, process-group kill, marker scan. The fork's code
  can then read whatever the validator's user can and use the network; the report says so.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from quasar.errors import QuasarError
from quasar.evaluate import pinning, protocol, syscall_filter
from quasar.evaluate.captured_output import CapturedOutput
from quasar.evaluate.confinement import Confinement, ConfinementError
from quasar.evaluate.environment import evaluation_environment
from quasar.evaluate.gpus import assigned_gpu, nvidia_gpus
from quasar.evaluate.sandbox_layout import (
    NOBODY,
    SANDBOX_FORK,
    SANDBOX_HARNESS,
    SANDBOX_HOME,
    SANDBOX_SITE,
    SandboxPolicy,
    python_executable,
    root_mounts,
)
from quasar.evaluate.stragglers import MARKER_VARIABLE, kill_marked_processes

logger = logging.getLogger(__name__)

HARNESS_FILES = ("child.py", "protocol.py", "workload.py", "sandbox_init.py", "syscall_filter.py")
HARNESS_DIR = Path(__file__).resolve().parent
# A fork bigger than this (without .git) is refused rather than copied.
MAX_FORK_BYTES = 512 * 1024 * 1024
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
# The child's first reply (Python and torch imported) must come within this many seconds.
STARTUP_SECONDS = 180


class SandboxError(QuasarError):
    """The sandbox could not be set up or the child misbehaved at the process level."""


class SandboxUnavailable(SandboxError):
    """Namespaces cannot be created here; running needs ``allow_unsandboxed``."""


def namespaces_supported() -> tuple[bool, str]:
    """Whether this machine can give the child its own namespaces, and why not."""
    if not sys.platform.startswith("linux"):
        return False, f"namespaces need Linux, this is {sys.platform}"
    if shutil.which("unshare") is None:
        return False, "the unshare command (util-linux) is not installed"
    return True, ""


def _die_with_parent() -> None:
    """In the forked launcher before exec: SIGKILL when the parent dies (where setpriv is missing)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


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
    the sources the import check read), without following links out of it, world-readable."""
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
    for directory, _, filenames in os.walk(destination):
        os.chmod(directory, 0o755)
        for name in filenames:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)


class SandboxedChild:
    """One sandboxed child process serving the harness's requests; use as a context manager."""

    def __init__(
        self,
        fork_dir: str | os.PathLike | None,
        device: str,
        policy: SandboxPolicy,
        spin_seconds: float = 0.0,
        cpus: frozenset[int] | None = None,
        shared: protocol.SharedArea | None = None,
    ):
        # None: the child starts with an empty fork directory, filled by provide_fork() before ``load``.
        self.fork_source = Path(fork_dir).resolve() if fork_dir is not None else None
        # Where the child may put large payloads (protocol.SharedArea); the caller's, which outlives the child.
        self.shared = shared
        # Set once close() has returned: no process of the sandbox is left to write to the shared area.
        self.gone = threading.Event()
        self.device = device
        self.policy = policy
        # Both ends busy-poll the pipe this long before sleeping (protocol.Channel).
        self.spin_seconds = spin_seconds
        # The CPUs the child is started on (pinning.py); None leaves it the parent's.
        self.cpus = cpus
        # The CPUs the child said it may run on, in its first reply (before any fork code ran).
        self.child_cpus: list[int] | None = None
        self.marker = secrets.token_hex(16)
        self.output = CapturedOutput()
        self.isolation = "none"
        self.isolation_note = ""
        self.stragglers_killed = 0
        self.workdir: Path | None = None
        self.process: subprocess.Popen | None = None
        self.channel: protocol.Channel | None = None
        self._parent_fds: list[int] = []
        self._drain_thread: threading.Thread | None = None
        # How the child was started ("root", "userns" or "none"), and whether it has replied yet.
        self._mode = "none"
        self._replied = False
        self.flood_reason = ""
        # The sandbox's own limits (confinement.py), and whether its seccomp filter is loaded.
        self.confinement: Confinement | None = None
        self.seccomp = False
        # Which GPU device nodes the sandbox holds (namespaced, on CUDA).
        self.gpu_note = ""
        # The compilation of the fork copy's bytecode (_start_precompile), while it runs.
        self._compiling: subprocess.Popen | None = None

    # --- paths as the child sees them ---

    def _layout(self, namespaced: bool) -> tuple[str, str, str]:
        assert self.workdir is not None
        if namespaced:
            return SANDBOX_FORK, SANDBOX_HARNESS, SANDBOX_HOME
        return str(self.workdir / "fork"), str(self.workdir / "harness"), str(self.workdir / "home")

    @property
    def fork_dir(self) -> str:
        return self._layout(self.isolation == "namespaces")[0]

    def _config(self, mode: str, child_fds: tuple[int, int]) -> dict:
        namespaced = mode != "none"
        _, harness, home = self._layout(namespaced)
        env = scrubbed_environment(home, self.device, self.policy, self.marker)
        sites = self._site_paths(namespaced)
        argv = [
            python_executable(),
            "-I",
            "-S",
            f"{harness}/child.py",
            str(child_fds[0]),
            str(child_fds[1]),
            "cuda" if self.device.startswith("cuda") else "cpu",
            repr(float(self.spin_seconds)),
            str(self.shared.fd if self.shared is not None else -1),
            json.dumps(sites),
        ]
        rlimits = {"CORE": 0, "NOFILE": self.policy.max_open_files, "FSIZE": self.policy.max_file_bytes}
        uid = gid = NOBODY
        if mode == "root":
            assert self.confinement is not None and self.confinement.uid is not None
            uid = gid = self.confinement.uid.uid
            # Counted per uid, and the uid is this sandbox's alone (confinement.py).
            rlimits["NPROC"] = self.policy.max_processes
        assert self.workdir is not None
        cgroup = self.confinement.cgroup if self.confinement is not None else None
        config = {
            "mode": mode,
            "read_fd": child_fds[0],
            "write_fd": child_fds[1],
            "argv": argv,
            "env": env,
            "cwd": home,
            "rlimits": rlimits,
            "uid": uid,
            "gid": gid,
            "root_dir": str(self.workdir / "root"),
            "cgroup_procs": cgroup.procs_files if cgroup is not None else [],
            "seccomp": self.seccomp,
        }
        if namespaced:
            assert self.workdir is not None
            config.update(root_mounts(self.workdir, mode, uid, self.policy, self._nvidia_devices()))
        return config

    def _site_paths(self, namespaced: bool) -> list[str]:
        """The child's site folders, as it sees them: the binds under /sandbox/site, or (without
        namespaces) folders of links to the environment's entries, made here."""
        sites = evaluation_environment().sites
        if namespaced:
            return [f"{SANDBOX_SITE}/{index}" for index in range(len(sites))]
        assert self.workdir is not None
        paths = []
        for index, site in enumerate(sites):
            folder = self.workdir / "site" / str(index)
            folder.mkdir(parents=True, exist_ok=True)
            for entry in site.entries:
                link = folder / entry
                if not link.exists():
                    link.symlink_to(os.path.join(site.path, entry))
            paths.append(str(folder))
        return paths

    def _nvidia_devices(self) -> list[str]:
        """The NVIDIA device nodes the sandbox holds: the driver's control nodes and its own GPU's,
        or every GPU's where the driver does not say which node is its GPU (noted in the report)."""
        if not self.device.startswith("cuda") or not os.path.isdir("/dev"):
            return []
        gpu = assigned_gpu(physical_gpu_id(self.device), nvidia_gpus())
        names = sorted(name for name in os.listdir("/dev") if name.startswith("nvidia"))
        per_gpu = [name for name in names if name[len("nvidia") :].isdigit()]
        if gpu is None:
            self.gpu_note = "every GPU's device node (which is its own is unknown here)"
            return [f"/dev/{name}" for name in names]
        self.gpu_note = f"its own GPU's device node only ({gpu.bus})"
        return [f"/dev/{name}" for name in names if name not in per_gpu or name == f"nvidia{gpu.minor}"]

    # --- lifecycle ---

    def __enter__(self) -> SandboxedChild:
        self.start()
        self.wait_started()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> SandboxedChild:
        """Copy the fork and the harness's files and start the child, without waiting for it (its
        interpreter imports torch: seconds, which the caller may spend on other work);
        :meth:`wait_started` waits. On a failure everything is closed before the error propagates."""
        self.workdir = Path(tempfile.mkdtemp(prefix="quasar-eval-"))
        try:
            if self.fork_source is not None:
                copy_tree(self.fork_source, self.workdir / "fork")
            else:
                (self.workdir / "fork").mkdir()
                os.chmod(self.workdir / "fork", 0o755)
            (self.workdir / "harness").mkdir(mode=0o755)
            for name in HARNESS_FILES:
                shutil.copyfile(HARNESS_DIR / name, self.workdir / "harness" / name)
                os.chmod(self.workdir / "harness" / name, 0o644)
            (self.workdir / "root").mkdir(mode=0o700)
            home = self.workdir / "home"
            (home / "tmp").mkdir(parents=True, mode=0o700)
            supported, why = namespaces_supported()
            self.seccomp, no_filter = syscall_filter.available()
            if supported and not self.seccomp:
                supported, why = False, f"no seccomp filter can be loaded ({no_filter})"
            if self.policy.force_unsandboxed:
                supported, why = False, "unsandboxed mode was forced"
            if supported:
                self._mode = "root" if os.geteuid() == 0 else "userns"
                self._confine(root=self._mode == "root")
                self._spawn(self._mode)
            else:
                self._spawn_unsandboxed(why)
            if self.fork_source is not None:
                self._start_precompile()
        except BaseException:
            self.close()
            raise
        return self

    def provide_fork(self, fork_dir: str | os.PathLike) -> None:
        """Copy the fork into a child started without one (its read-only fork directory is a bind
        of the one filled here, so the files appear inside); the child must not have loaded
        anything yet. Raises SandboxError for a fork that cannot be copied (too large)."""
        if self.workdir is None or self.fork_source is not None:
            raise SandboxError("provide_fork: the child was not started without a fork")
        self.fork_source = Path(fork_dir).resolve()
        copy_tree(self.fork_source, self.workdir / "fork")
        self._start_precompile()

    def _start_precompile(self) -> None:
        """Compile the fork copy's Python sources to bytecode now, in a process of their own on
        every core, beside the import check (the child, one pinned core, would compile a real fla
        tree's 571 modules itself at import: seconds). Only compiled, never run; where it fails or
        is late the child compiles what is missing, as Python always does."""
        assert self.workdir is not None
        shown = SANDBOX_FORK if self._mode != "none" else str(self.workdir / "fork")
        command = [
            python_executable(),
            "-I",
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            "-d",
            shown,
            str(self.workdir / "fork"),
        ]
        self._compiling = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
        )

    def precompiled(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the fork's bytecode, then stop its compilation."""
        if self._compiling is None:
            return
        try:
            self._compiling.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self._compiling.pid, signal.SIGKILL)
            self._compiling.wait()

    def wait_started(self) -> None:
        """Wait for the started child's first reply; where the namespaces fail to come up, start it
        again without them if the policy allows (else SandboxUnavailable). Closes on a failure."""
        try:
            if self._mode != "none":
                try:
                    self._await_first_reply()
                except SandboxUnavailable as error:
                    self._terminate()
                    self._spawn_unsandboxed(str(error))
                else:
                    self.isolation = "namespaces"
                    assert self.confinement is not None
                    self.isolation_note = (
                        "namespaces (network, mount, pid, ipc, uts); private read-only root, own /etc, "
                        "/sys of CPUs and driver only; seccomp; "
                        + ("" if self._mode == "root" else "unprivileged user namespace, ")
                        + self.confinement.describe()
                        + (f"; {self.gpu_note}" if self.gpu_note else "")
                    )
                    return
            self._await_first_reply()
        except BaseException:
            self.close()
            raise

    def _spawn_unsandboxed(self, why: str) -> None:
        if not self.policy.allow_unsandboxed:
            raise SandboxUnavailable(
                f"{why}; refusing to run the fork without a sandbox (pass --allow-unsandboxed to run it anyway)"
            )
        logger.warning("running the fork WITHOUT a sandbox: %s", why)
        self._mode = "none"
        self._confine(root=False)
        self._spawn("none")
        self.isolation = "none"
        self.isolation_note = f"UNSANDBOXED ({why}): fork code ran with this user's files and network"

    def _confine(self, root: bool) -> None:
        """The sandbox's own uid (as root) and cgroup, made afresh (confinement.py)."""
        if self.confinement is not None:
            self.confinement.release()
        try:
            self.confinement = Confinement.prepare(
                root, self.policy.memory_bytes, self.policy.max_processes, self.policy.cgroup_path
            )
        except ConfinementError as error:
            raise SandboxError(f"the sandbox's limits could not be set up: {error}") from None

    @property
    def killed_reason(self) -> str:
        """Why the parent or the sandbox's limits killed the child, or ``""``."""
        if self.flood_reason:
            return self.flood_reason
        return self.confinement.killed_reason() if self.confinement is not None else ""

    def _spawn(self, mode: str) -> None:
        assert self.workdir is not None
        to_child_read, to_child_write = os.pipe()
        from_child_read, from_child_write = os.pipe()
        try:
            # A larger pipe moves a layer output (up to GiBs) in fewer system calls.
            fcntl.fcntl(from_child_write, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        child_fds = (to_child_read, from_child_write)
        self._parent_fds = [to_child_write, from_child_read]
        config = self._config(mode, child_fds)
        init = [sys.executable, "-I", "-S", str(self.workdir / "harness" / "sandbox_init.py"), json.dumps(config)]
        if mode == "none":
            # sandbox_init.py sets its own parent-death signal.
            command = init
        else:
            # setpriv: unshare dies with this process (even on SIGKILL); --kill-child: the namespace's
            # init dies with unshare; the PID namespace: everything else dies with its init.
            command = ["unshare", "--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
            if mode == "userns":
                command[1:1] = ["--user", "--map-root-user"]
            command += init
            if shutil.which("setpriv") is not None:
                command = ["setpriv", "--pdeathsig", "KILL", *command]
        self.output = CapturedOutput()
        # A new process inherits the affinity of the thread that starts it, and so does all it starts.
        passed = child_fds + ((self.shared.fd,) if self.shared is not None else ())
        with pinning.pinned(self.cpus):
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=passed,
                start_new_session=True,
                env=config["env"],
                cwd=str(self.workdir),
                # Only where setpriv is missing; the hook makes one system call.
                preexec_fn=_die_with_parent if mode != "none" and command[0] != "setpriv" else None,  # noqa: PLW1509
            )
        os.close(to_child_read)
        os.close(from_child_write)
        self.channel = protocol.Channel(from_child_read, to_child_write, spin_seconds=self.spin_seconds)
        assert self.confinement is not None
        self.confinement.start_watchdog(self.process.pid, self._kill_group)
        self._drain_thread = threading.Thread(target=self._drain, daemon=True)
        self._drain_thread.start()

    def _await_first_reply(self) -> None:
        """Ping through a fresh sandbox: a setup failure arrives as a ``sandbox`` error instead."""
        assert self.channel is not None
        try:
            self.channel.send({"op": "ping"})
            reply, _ = self.channel.recv(deadline=time.monotonic() + STARTUP_SECONDS)
        except (protocol.ChannelError, OSError) as error:
            raise SandboxUnavailable(f"the sandbox did not start ({error}): {self.output.text()[-2000:]}") from None
        if reply.get("kind") == "sandbox":
            raise SandboxUnavailable(str(reply.get("error")))
        cpus = reply.get("cpus")
        if isinstance(cpus, list) and all(isinstance(cpu, int) and not isinstance(cpu, bool) for cpu in cpus):
            self.child_cpus = cpus
        self._replied = True

    def _drain(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        stream = self.process.stdout
        assert isinstance(stream, io.BufferedReader)  # Popen's pipe, opened in binary mode
        while True:
            chunk = stream.read1(1 << 16)
            if not chunk:
                return
            self.output.add(chunk)
            if self.output.total_bytes > self.policy.max_output_bytes and not self.output.flooded:
                self.output.flooded = True
                self.flood_reason = (
                    f"the fork wrote over {self.policy.max_output_bytes >> 20} MiB to "
                    "stdout/stderr; the child was killed"
                )
                self._kill_group()

    def drained(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the child's output to be read to its end (once every
        process of the sandbox has closed it)."""
        if self._drain_thread is not None:
            self._drain_thread.join(timeout=timeout)

    def _kill_group(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _terminate(self) -> None:
        self._kill_group()
        if self.process is not None:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                logger.error("sandbox launcher %d did not exit after SIGKILL", self.process.pid)
        # Before draining: a straggler holding the output pipe would keep it open.
        self.stragglers_killed += kill_marked_processes(self.marker)
        if self._drain_thread is not None:
            self._drain_thread.join(timeout=5)
        for fd in self._parent_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._parent_fds = []
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def close(self) -> None:
        """Kill everything the child started and delete the temporary directory (once)."""
        if self.gone.is_set():
            return
        try:
            # Only a child that has replied reads its pipe; one still starting is killed at once.
            running = self.process is not None and self.process.poll() is None
            if self._replied and self.channel is not None and running:
                try:
                    self.channel.send({"op": "exit"})
                    assert self.process is not None  # running says so
                    self.process.wait(timeout=2)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._terminate()
            self.precompiled(timeout=0)
            if self.confinement is not None:
                self.confinement.release()
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None
        finally:
            self.gone.set()
