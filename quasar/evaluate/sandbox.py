"""Start the fork's code in a sandboxed child process and end it completely.

The child's lifecycle. :class:`SandboxedChild` fills a fresh temporary directory the parent owns
with what the child is given (sandbox_contents.py: the fork's copy without ``.git``, the harness's
child code, its home; a child started before its fork is known gets it from
:meth:`SandboxedChild.provide_fork`, before ``load``), starts ``sandbox_init.py`` under ``unshare``
(new network, mount, PID, IPC and UTS namespaces; see that file for the private root it builds)
without waiting (``start``; ``wait_started`` waits for its first reply, so the caller can work
while the child imports torch), and talks to it over a pipe pair it owns (protocol.py). Given
``cpus``, the child starts with that CPU affinity (pinning.py). Its stdout and stderr go to one
pipe the parent drains: the first and last :data:`KEPT_OUTPUT_BYTES` are kept, and a child writing
more than ``max_output_bytes`` in all is killed. The child's environment holds only what
:func:`~quasar.evaluate.sandbox_contents.scrubbed_environment` lists: no tokens, no wallet paths,
HOME and TMPDIR inside the sandbox. Closing kills the whole process group (the PID namespace takes
every descendant with its init), then looks for stragglers carrying the sandbox's marker variable
and kills those too. If the parent itself dies (even by SIGKILL), the parent-death signal takes
the sandbox with it.

Isolation levels (``SandboxedChild.isolation``):

- ``namespaces``: the full sandbox above, as root (child runs as ``nobody``) or as an ordinary
  user through an unprivileged user namespace;
- ``none``: only with ``allow_unsandboxed=True``, when namespaces are unavailable (or for
  tests): scrubbed environment, resource limits, process-group kill, marker scan. The fork's code
  can then read whatever the validator's user can and use the network; the report says so.
"""

from __future__ import annotations

import fcntl
import functools
import io
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from quasar.evaluate import leftovers, pinning, protocol, syscall_filter
from quasar.evaluate.captured_output import CapturedOutput
from quasar.evaluate.confinement import Confinement, ConfinementError
from quasar.evaluate.sandbox_contents import (
    SandboxError,
    compile_fork_copy,
    copy_tree,
    nvidia_device_nodes,
    prepare_workdir,
    scrubbed_environment,
    site_paths,
)
from quasar.evaluate.sandbox_layout import (
    NOBODY,
    SANDBOX_FORK,
    SANDBOX_HARNESS,
    SANDBOX_HOME,
    SANDBOX_TRITON_SEED,
    SandboxPolicy,
    python_executable,
    root_mounts,
)
from quasar.evaluate.stragglers import kill_marked_processes

logger = logging.getLogger(__name__)

# The child's first reply (Python and torch imported) must come within this many seconds.
STARTUP_SECONDS = 180


class SandboxUnavailable(SandboxError):
    """This host cannot build the sandbox: namespaces (running needs ``allow_unsandboxed``), or its
    limits (a uid, a cgroup). The host's fault, never the fork's: a validator tries it again later."""


# The namespaces every sandbox gets (``unshare`` flags), and those an ordinary user adds first.
NAMESPACE_FLAGS = ("--net", "--mount", "--pid", "--ipc", "--uts", "--fork")
USER_NAMESPACE_FLAGS = ("--user", "--map-root-user")
# What a host refusing them lacks, for the operator (docs/validator.md, "Rented GPU containers").
NAMESPACES_NEED = (
    "the sandbox needs root with CAP_SYS_ADMIN (or unprivileged user namespaces) and a seccomp "
    "profile allowing unshare and mount, as a VM or bare metal gives and a container started with "
    "Docker's defaults (RunPod, Vast.ai and the like) does not"
)


def namespaces_supported() -> tuple[bool, str]:
    """Whether this machine can give the child its own namespaces, and why not: ``unshare`` is
    tried once per process with the sandbox's namespaces (a container without CAP_SYS_ADMIN, or
    under Docker's default seccomp profile, refuses them)."""
    if not sys.platform.startswith("linux"):
        return False, f"namespaces need Linux, this is {sys.platform}"
    if shutil.which("unshare") is None:
        return False, "the unshare command (util-linux) is not installed"
    return _namespaces_probe(os.geteuid() == 0)


def sandbox_unavailable() -> str:
    """Why this machine cannot build the sandbox (namespaces or the seccomp filter), or ``""``."""
    supported, why = namespaces_supported()
    if not supported:
        return why
    loaded, no_filter = syscall_filter.available()
    return "" if loaded else f"no seccomp filter can be loaded ({no_filter})"


@functools.cache
def _namespaces_probe(root: bool) -> tuple[bool, str]:
    command = ["unshare", *(() if root else USER_NAMESPACE_FLAGS), *NAMESPACE_FLAGS, "true"]
    try:
        probe = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"this host's unshare does not work ({error}): {NAMESPACES_NEED}"
    if probe.returncode == 0:
        return True, ""
    said = " ".join(probe.stderr.split())[-300:] or f"exit status {probe.returncode}"
    return False, f"this host refuses new namespaces ({said}): {NAMESPACES_NEED}"


def _die_with_parent() -> None:
    """In the forked launcher before exec: SIGKILL when the parent dies (where setpriv is missing)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


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
        # Files of the Triton cache seed the child copied into its cache at its start (triton_seed.py).
        self.seeded_files = 0
        self.marker = secrets.token_hex(16)
        self.output = CapturedOutput()
        self.isolation = "none"
        self.isolation_note = ""
        self.stragglers_killed = 0
        self.workdir: Path | None = None
        self._claim: leftovers.Claim | None = None  # holds the workdir (leftovers.py)
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

    # --- paths as the child sees them, and its config ---

    def _layout(self, namespaced: bool) -> tuple[str, str, str]:
        assert self.workdir is not None
        if namespaced:
            return SANDBOX_FORK, SANDBOX_HARNESS, SANDBOX_HOME
        return str(self.workdir / "fork"), str(self.workdir / "harness"), str(self.workdir / "home")

    @property
    def fork_dir(self) -> str:
        return self._layout(self.isolation == "namespaces")[0]

    def _config(self, mode: str, child_fds: tuple[int, int]) -> dict:
        """What sandbox_init.py is given: the child's command, environment, limits, user and root."""
        assert self.workdir is not None
        namespaced = mode != "none"
        _, harness, home = self._layout(namespaced)
        env = scrubbed_environment(home, self.device, self.policy, self.marker)
        sites = site_paths(self.workdir, namespaced)
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
            devices, self.gpu_note = nvidia_device_nodes(self.device)
            config.update(root_mounts(self.workdir, mode, uid, self.policy, devices))
        return config

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
        leftovers.sweep()  # what sandboxes of killed parents left (leftovers.py)
        self._claim = leftovers.Claim()
        self.workdir = self._claim.workdir
        try:
            prepare_workdir(self.workdir, self.fork_source)
            self.seccomp, _ = syscall_filter.available()
            why = "unsandboxed mode was forced" if self.policy.force_unsandboxed else sandbox_unavailable()
            if not why:
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
        """Compile the fork copy's sources to bytecode beside the import check (compile_fork_copy),
        within the sandbox's cgroup and as its uid."""
        assert self.workdir is not None and self.confinement is not None
        shown = SANDBOX_FORK if self._mode != "none" else str(self.workdir / "fork")
        uid = self.confinement.uid.uid if self.confinement.uid is not None else None
        cgroup = self.confinement.cgroup
        self._compiling = compile_fork_copy(self.workdir, shown, uid, cgroup.procs_files if cgroup is not None else [])

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
        # A compilation still running under the limits replaced here starts again under the new ones.
        compiling = self._compiling is not None and self._compiling.poll() is None
        self.precompiled(timeout=0)
        self._mode = "none"
        self._confine(root=False)
        self._spawn("none")
        if compiling:
            self._start_precompile()
        self.isolation = "none"
        assert self.confinement is not None  # made by _confine above
        self.isolation_note = (
            f"UNSANDBOXED ({why}): fork code ran with this user's files and network; {self.confinement.describe()}"
        )

    def _confine(self, root: bool) -> None:
        """The sandbox's own uid (as root) and cgroup, made afresh (confinement.py)."""
        if self.confinement is not None:
            self.confinement.release()
        try:
            self.confinement = Confinement.prepare(
                root, self.policy.memory_bytes, self.policy.max_processes, self.policy.cgroup_path
            )
        except ConfinementError as error:
            raise SandboxUnavailable(f"the sandbox's limits could not be set up: {error}") from None
        if self._claim is not None and self.confinement.cgroup is not None:
            self._claim.record_cgroups(self.confinement.cgroup.directories.values())

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
            users = USER_NAMESPACE_FLAGS if mode == "userns" else ()
            command = ["unshare", *users, *NAMESPACE_FLAGS, "--kill-child", *init]
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
                preexec_fn=_die_with_parent if mode != "none" and command[0] != "setpriv" else None,
            )
        os.close(to_child_read)
        os.close(from_child_write)
        self.channel = protocol.Channel(from_child_read, to_child_write, spin_seconds=self.spin_seconds)
        assert self.confinement is not None
        self.confinement.start_watchdog(
            self.process.pid, self._kill_group, self.shared.fd if self.shared is not None else None
        )
        self._drain_thread = threading.Thread(target=self._drain, daemon=True)
        self._drain_thread.start()

    def _await_first_reply(self) -> None:
        """Ping through a fresh sandbox: a setup failure arrives as a ``sandbox`` error instead."""
        assert self.channel is not None
        try:
            seed = {"triton_seed": SANDBOX_TRITON_SEED} if self._mode != "none" and self.policy.triton_seed else {}
            self.channel.send({"op": "ping", **seed})
            reply, _ = self.channel.recv(deadline=time.monotonic() + STARTUP_SECONDS)
        except (protocol.ChannelError, OSError) as error:
            raise SandboxUnavailable(
                f"the sandbox did not start ({error}): {self.output.text()[-2000:].strip()}"
            ) from None
        if reply.get("kind") == "sandbox":
            raise SandboxUnavailable(str(reply.get("error")))
        # Sent before any fork code ran, yet checked like every number from the child: whole
        # numbers in range (Linux numbers CPUs below 8,192).
        cpus = reply.get("cpus")
        if isinstance(cpus, list) and all(protocol.is_count(cpu) and cpu < 1 << 13 for cpu in cpus):
            self.child_cpus = cpus
        seeded = reply.get("seeded")
        self.seeded_files = seeded if protocol.is_count(seeded) and seeded < 1 << 31 else 0
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
            if self._claim is not None:
                self._claim.release()  # the workdir with it
            self.workdir = None
        finally:
            self.gone.set()
