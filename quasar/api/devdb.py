"""Throwaway servers on loopback, for tests and the benchmarks: PostgreSQL, and the API itself (in
processes of its own, or in a thread of this one).

Uses the server binaries of the Debian ``postgresql`` package (``./scripts/test.sh`` installs it
when missing): ``initdb`` into a fresh temporary folder, ``pg_ctl start`` on a free 127.0.0.1 port,
trust authentication for one local superuser. PostgreSQL refuses to run as root, so as root the
server runs as the ``postgres`` system user (created by the package).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import httpx
import uvicorn
from starlette.types import ASGIApp

from quasar import config
from quasar.errors import QuasarError

SUPERUSER = "quasar"


class PostgresUnavailable(QuasarError, RuntimeError):
    """No PostgreSQL server could be started here; the message says why."""


def find_server_binaries() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl``: on PATH, else the newest /usr/lib/postgresql/N/bin."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: "
        "apt-get install -y postgresql (./scripts/test.sh does this)"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ThreadedServer:
    """``app`` served by uvicorn in a thread of this process on a free port of 127.0.0.1, from the
    start of a ``with`` block to its end. The socket is bound here, so no other process can take
    the port in between. As under ``serve``, uvicorn takes no client address from proxy headers
    (the API believes them only from its TRUSTED_PROXIES); ``options`` are more of uvicorn's (a
    server's own, such as quasar.inference.server.server_options)."""

    def __init__(self, app: ASGIApp, start_timeout_s: float = 30.0, **options: Any) -> None:
        self.app = app
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s
        config = {"log_level": "warning", "proxy_headers": False, "log_config": None, **options}
        self.server = uvicorn.Server(uvicorn.Config(app, **config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.__exit__()  # a server still starting is stopped before its socket closes
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


class TemporaryPostgres:
    """A PostgreSQL cluster in a temporary folder, listening on 127.0.0.1 only; removed by :meth:`stop`.

    ``durable=False`` turns off fsync (tests: only the API process is killed, never the machine);
    the load benchmark keeps PostgreSQL's defaults. ``root``: the folder to use (made if missing)
    instead of a new temporary one; ``prefix``: a command the server's tools run under (``nsenter
    ... --``: in a mount namespace where ``root/data`` is a disk of its own).
    """

    def __init__(self, durable: bool = True, root: Path | None = None, prefix: Sequence[str] = ()):
        self.durable = durable
        self.port = 0
        self._folder = root
        self.root: Path | None = None
        self._run_as: str | None = None
        self._prefix = list(prefix)

    def _run(self, *args: str, timeout: float = 120) -> None:
        command = list(args)
        if self._run_as:
            command = ["runuser", "-u", self._run_as, "--", *command]
        command = [*self._prefix, *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise PostgresUnavailable(f"{Path(args[0]).name} failed: {(result.stderr or result.stdout).strip()}")

    def start(self) -> TemporaryPostgres:
        binaries = find_server_binaries()
        self.root = self._folder or Path(tempfile.mkdtemp(prefix="quasar-pg-"))
        self.root.mkdir(parents=True, exist_ok=True)
        data, sockets = self.root / "data", self.root / "sockets"
        sockets.mkdir()
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "running as root and there is no 'postgres' user to run the server as"
                ) from None
            self._run_as = "postgres"
            for path in (self.root, sockets):
                os.chown(path, account.pw_uid, account.pw_gid)
        try:
            self._run(
                str(binaries / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"
            )
            self.port = free_port()
            options = [f"-p {self.port}", f"-k {sockets}", "-c listen_addresses=127.0.0.1", "-c max_connections=300"]
            if not self.durable:
                options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
            self._run(
                str(binaries / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(self.root / "server.log"),
                "-o",
                " ".join(options),
                "-w",
                "-t",
                "60",
                "start",
            )
        except (PostgresUnavailable, OSError, subprocess.TimeoutExpired) as error:
            log = self.root / "server.log"
            detail = log.read_text()[-2000:] if log.exists() else ""
            self.stop()
            raise PostgresUnavailable(f"could not start PostgreSQL: {error}\n{detail}") from None
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg2://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database ``name`` (letters, digits, underscores) and return its URL."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"database name {name!r}: use letters, digits and underscores")
        import psycopg2  # here, not at the top: this module's free_port serves SQLite-only callers too

        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres")
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return self.url(name)

    def stop(self) -> None:
        if self.root is None:
            return
        data = self.root / "data"
        # Under a prefix the data folder may be a disk mounted in another namespace, its files out
        # of this process's sight: pg_ctl, run there, finds the server (or says there is none).
        if self._prefix or (data / "postmaster.pid").exists():
            binaries = find_server_binaries()
            try:
                self._run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop", timeout=60)
            except (PostgresUnavailable, subprocess.TimeoutExpired):
                pass  # already gone; the folder is removed below either way
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> TemporaryPostgres:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def start_api_process(
    workdir: Path,
    database_url: str,
    chain_path: Path,
    api_hotkey: str,
    *,
    submissions_per_hour: int = 1_000_000,
    workers: int = 1,
    trusted_proxies: str = "",
    timeout_s: float = 120.0,
    settings: Mapping[str, str] | None = None,
    checkout: Path | None = None,
    prefix: Sequence[str] = (),
) -> tuple[subprocess.Popen, str]:
    """Start ``python -m quasar.api serve --workers N`` on a free port over the dev chain at ``chain_path``.

    ``settings``: more settings, as environment variables (``{"API_HEADER_TIMEOUT": "1"}``).
    ``checkout``: the tree whose ``quasar.api`` runs (default the one this module is from).
    ``prefix``: a command the server runs under (``nsenter ... --``: in another mount namespace).
    Runs in ``workdir`` (so no checkout's ``.env`` is read) and logs to ``workdir/server-PORT.log``;
    returns the process and its base URL once ``/health`` answers (with several workers: once
    each of them has started), or raises RuntimeError with the log's tail. The server runs in a
    session of its own: ``os.killpg(process.pid, SIGKILL)`` kills it with all its workers at once.
    """
    port = free_port()
    root = checkout or Path(__file__).resolve().parents[2]
    environ = {
        **os.environ,
        "API_HOTKEY": api_hotkey,
        "SUBTENSOR_NETWORK": "devchain",
        "NETUID": config.OPTIONS_BY_KEY["netuid"].default,  # a new DevChain file's netuid
        "DEVCHAIN_PATH": str(chain_path),
        "SUBMISSIONS_PER_HOUR": str(submissions_per_hour),
        "PYTHONPATH": str(root),
        "LOGGING_DEBUG": "false",
        "TRUSTED_PROXIES": trusted_proxies,
        **(settings or {}),
    }
    log_path = workdir / f"server-{port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "quasar.api",
                "serve",
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--database-url",
                database_url,
            ],
            cwd=workdir,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the API server exited:\n{log_path.read_text()[-3000:]}")
        try:
            started = log_path.read_text().count("Application startup complete")
            if started >= workers and httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the API server did not come up in {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")
