"""The local network's child processes: each started with its output in a log file, watched, and
stopped in reverse order of start (also on Ctrl-C, SIGTERM or an error).

Children run in their own sessions, so a Ctrl-C at the terminal reaches only the local network,
which then stops them in order (the validator first, so it puts a running evaluation back
cleanly); each also gets SIGTERM from the kernel if the local network dies (``PR_SET_PDEATHSIG``),
so none outlives it.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from quasar.errors import QuasarError

logger = logging.getLogger(__name__)

STOP_GRACE_S = 30.0
LOG_TAIL_LINES = 25
_PR_SET_PDEATHSIG = 1


class ChildFailed(QuasarError, RuntimeError):
    """A child process exited or did not become ready; the message names it and its log file."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def log_tail(path: Path) -> str:
    """The last :data:`LOG_TAIL_LINES` lines of the log at ``path`` ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        return ""


@dataclass
class Child:
    """One running child: its name (as shown to the user), process and log file."""

    name: str
    process: subprocess.Popen
    log_path: Path

    def exited(self) -> int | None:
        return self.process.poll()

    def failure(self, what: str) -> ChildFailed:
        tail = log_tail(self.log_path)
        return ChildFailed(f"{self.name} {what}; its log is {self.log_path}" + (f":\n{tail}" if tail else ""))

    def check_running(self) -> None:
        """Raise :class:`ChildFailed` (with the end of its log) if the child has exited."""
        code = self.exited()
        if code is not None:
            raise self.failure(f"exited with status {code}")


class Children:
    """The children started so far; :meth:`stop_all` stops them, last started first."""

    def __init__(self, log_dir: Path, cwd: Path, environment: Mapping[str, str]):
        self.log_dir = log_dir
        self.cwd = cwd
        self.environment = dict(environment)
        self.running: list[Child] = []

    def start(
        self, name: str, command: Sequence[str], log_name: str, environment: Mapping[str, str] | None = None
    ) -> Child:
        """Start ``command`` with stdout and stderr appended to ``log_dir/log_name``, in the
        children's environment plus ``environment`` (settings without a flag, secrets among them:
        they are never written to the log)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / log_name
        with open(log_path, "ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                list(command),
                cwd=self.cwd,
                env={**self.environment, **(environment or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        child = Child(name, process, log_path)
        self.running.append(child)
        logger.debug("started %s (pid %d): %s", name, process.pid, " ".join(command))
        return child

    def stop(self, child: Child) -> int | None:
        """SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`; returns the exit status."""
        if child.exited() is None:
            self._signal(child, signal.SIGTERM)
            try:
                child.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop within %g s; killing it", child.name, STOP_GRACE_S)
                self._signal(child, signal.SIGKILL)
                child.process.wait()
        if child in self.running:
            self.running.remove(child)
        return child.process.returncode

    def stop_all(self) -> None:
        for child in reversed(list(self.running)):
            self.stop(child)

    @staticmethod
    def _signal(child: Child, signum: int) -> None:
        # The child leads its own session: signal only the child, never its session's other
        # processes here (the validator stops its evaluation workers itself; SIGKILL's orphans
        # get SIGTERM through their own PR_SET_PDEATHSIG).
        try:
            child.process.send_signal(signum)
        except ProcessLookupError:
            pass


def wait_until(
    ready: Callable[[], bool],
    timeout_s: float,
    what: str,
    watched: Sequence[Child] = (),
    poll_s: float = 0.2,
    on_poll: Callable[[], None] | None = None,
) -> None:
    """Poll ``ready`` until it is true; raise :class:`ChildFailed` if a watched child exits, or
    TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if ready():
            return
        for child in watched:
            child.check_running()
        if on_poll is not None:
            on_poll()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)
