"""A stand-in for GitHub on 127.0.0.1: the part of it a QUASAR miner uses, over bare repositories on disk.

The local network runs it so that its miners run the real ``python -m neurons.miner`` with
``GITHUB_API_URL`` = :attr:`GitHubStandIn.api_url` and ``GIT_REMOTE_BASE`` =
:attr:`GitHubStandIn.file_base`; the miner's tests use it the same way and also over HTTP
(:attr:`GitHubStandIn.git_base`). It is GitHub's outer boundary only; the miner's code path is
the one it takes against github.com.

Repositories live at ``root/OWNER/NAME.git`` (bare); :meth:`GitHubStandIn.add_repository` puts
one there. Served, as GitHub does:

- ``GET /api/repos/{owner}/{name}``: the repository (``full_name``, ``name``, ``fork``,
  ``default_branch``, ``parent``), or 404;
- ``POST /api/repos/{owner}/{name}/forks``: forks it into the token's account (202), as a new
  bare clone that becomes readable only after ``fork_delay_polls`` GETs (GitHub creates forks
  asynchronously);
- ``/git/{owner}/{name}.git/...``: git's smart HTTP protocol (``git http-backend``, push
  allowed) behind HTTP basic auth whose password must be a known token.

A bearer token that is not in ``tokens`` is answered 401 ``Bad credentials``; reading needs no
token, forking does. :attr:`GitHubStandIn.calls` and :attr:`GitHubStandIn.git_passwords` record
what was asked (the passwords only to show which token git sent; never logged).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import subprocess
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

from quasar.gitenv import NO_USER_CONFIGURATION
from quasar.localnet.forks import ForkWriteError, run_git

logger = logging.getLogger(__name__)

DEFAULT_BRANCH = "main"
_REPO = re.compile(r"/api/repos/([A-Za-z0-9-]+)/([A-Za-z0-9._-]+)")
_FORKS = re.compile(r"/api/repos/([A-Za-z0-9-]+)/([A-Za-z0-9._-]+)/forks")


def send_bytes(
    handler: BaseHTTPRequestHandler, status: int, payload: bytes, headers: Sequence[tuple[str, str]] = ()
) -> None:
    """Answer ``handler``'s request: ``status``, ``headers``, the length and ``payload``."""
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


def send_json(handler: BaseHTTPRequestHandler, status: int, body: object) -> None:
    """Answer ``handler``'s request with ``body`` as JSON (the stand-ins of HTTP APIs)."""
    send_bytes(handler, status, json.dumps(body).encode(), [("Content-Type", "application/json")])


class GitHubStandIn:
    """GitHub's fork endpoints and git's smart HTTP over the repositories under ``root``.

    ``tokens`` maps each accepted token to the account it belongs to. Use as a context manager,
    or :meth:`start` and :meth:`stop`; the port is picked free on ``host`` at construction.
    """

    def __init__(self, root: Path, tokens: dict[str, str], fork_delay_polls: int = 2, host: str = "127.0.0.1"):
        self.root = Path(root).absolute()
        self.tokens = dict(tokens)
        self.fork_delay_polls = fork_delay_polls
        self.repos: dict[str, dict] = {}  # by lower-case OWNER/NAME (GitHub names are case-insensitive)
        self.hidden: dict[str, int] = {}  # new forks: GETs still answered 404
        self.calls: list[tuple[str, str]] = []
        self.git_passwords: list[str] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer((host, 0), self._handler())
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="github-stand-in", daemon=True)

    @property
    def api_url(self) -> str:
        """The miner's ``GITHUB_API_URL``."""
        return self.url + "/api"

    @property
    def git_base(self) -> str:
        """The repositories over git's smart HTTP (``GIT_REMOTE_BASE``; the token is checked)."""
        return self.url + "/git"

    @property
    def file_base(self) -> str:
        """The same repositories as local bare repositories (``GIT_REMOTE_BASE=file:///...``)."""
        return self.root.as_uri()

    def bare(self, full_name: str) -> Path:
        """The bare repository of ``OWNER/NAME``."""
        owner, name = full_name.split("/")
        return self.root / owner / f"{name}.git"

    def add_repository(self, full_name: str, source: Path, parent: str | None = None) -> Path:
        """Make the git checkout ``source`` the repository ``OWNER/NAME`` (a fork of ``parent``
        when given); returns its bare repository."""
        bare = self.bare(full_name)
        self._clone_bare(str(source), bare)
        with self.lock:
            self.repos[full_name.lower()] = {
                "full_name": full_name,
                "fork": parent is not None,
                "parent": parent,
                "default_branch": DEFAULT_BRANCH,
            }
        return bare

    @staticmethod
    def _clone_bare(source: str, bare: Path) -> None:
        bare.parent.mkdir(parents=True, exist_ok=True)
        run_git(bare.parent, "clone", "--quiet", "--bare", source, str(bare))
        run_git(bare, "config", "http.receivepack", "true")

    def start(self) -> None:
        self.thread.start()
        logger.info("GitHub stand-in on %s over %s", self.url, self.root)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> GitHubStandIn:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _repository(self, full_name: str) -> dict | None:
        """The repository's JSON, or None while it is missing or (a new fork) still hidden."""
        key = full_name.lower()
        with self.lock:
            record = self.repos.get(key)
            if record is None:
                return None
            if self.hidden.get(key, 0) > 0:
                self.hidden[key] -= 1
                return None
        return _repo_json(record)

    def _fork(self, upstream: str, account: str) -> tuple[int, dict]:
        """Fork ``upstream`` into ``account``: (status, body)."""
        with self.lock:
            source = self.repos.get(upstream.lower())
            if source is None:
                return 404, {"message": "Not Found"}
            full_name = f"{account}/{source['full_name'].split('/')[1]}"
            key = full_name.lower()
            if key not in self.repos:
                try:
                    self._clone_bare(str(self.bare(source["full_name"])), self.bare(full_name))
                except ForkWriteError as error:
                    logger.error("GitHub stand-in: forking %s failed: %s", upstream, error)
                    return 500, {"message": "fork failed"}
                self.repos[key] = {
                    "full_name": full_name,
                    "fork": True,
                    "parent": source["full_name"],
                    "default_branch": source["default_branch"],
                }
                self.hidden[key] = self.fork_delay_polls
            return 202, _repo_json(self.repos[key])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                logger.debug("GitHub stand-in: " + format, *args)

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

            def _account(self) -> str | None | Literal[False]:
                """The bearer token's account; None without a token; False for an unknown one."""
                header = self.headers.get("Authorization")
                if header is None:
                    return None
                match = re.fullmatch(r"Bearer (\S+)", header)
                return stand_in.tokens.get(match.group(1), False) if match else False

            def _dispatch(self, method: str) -> None:
                with stand_in.lock:
                    stand_in.calls.append((method, self.path))
                if self.path.startswith("/git/"):
                    self._git(method)
                    return
                account = self._account()
                if account is False:
                    send_json(self, 401, {"message": "Bad credentials"})
                    return
                get, fork = _REPO.fullmatch(self.path), _FORKS.fullmatch(self.path)
                if method == "GET" and get:
                    record = stand_in._repository(f"{get.group(1)}/{get.group(2)}")
                    if record is None:
                        send_json(self, 404, {"message": "Not Found"})
                    else:
                        send_json(self, 200, record)
                elif method == "POST" and fork:
                    if account is None:
                        send_json(self, 401, {"message": "Requires authentication"})
                        return
                    send_json(self, *stand_in._fork(f"{fork.group(1)}/{fork.group(2)}", account))
                else:
                    send_json(self, 404, {"message": "Not Found"})

            def _git(self, method: str) -> None:
                header = self.headers.get("Authorization", "")
                password = None
                if header.startswith("Basic "):
                    _, _, password = base64.b64decode(header[6:]).decode(errors="replace").partition(":")
                    with stand_in.lock:
                        stand_in.git_passwords.append(password)
                if password not in stand_in.tokens:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="GitHub"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = self._read_body()
                path, _, query = self.path[len("/git") :].partition("?")
                env = {
                    "PATH": os.environ.get("PATH", ""),
                    "GIT_PROJECT_ROOT": str(stand_in.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "REQUEST_METHOD": method,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_USER": stand_in.tokens[password],
                    "REMOTE_ADDR": "127.0.0.1",
                    **NO_USER_CONFIGURATION,
                }
                for name in ("Content-Encoding", "Git-Protocol"):
                    if self.headers.get(name):
                        env["HTTP_" + name.upper().replace("-", "_")] = self.headers[name]
                result = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False)
                head, _, payload = result.stdout.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.decode(errors="replace").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                send_bytes(self, status, payload, headers)

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        return Handler


def _repo_json(record: dict) -> dict:
    data = {
        "full_name": record["full_name"],
        "name": record["full_name"].split("/")[1],
        "fork": record["fork"],
        "default_branch": record["default_branch"],
    }
    if record["parent"]:
        data["parent"] = {"full_name": record["parent"]}
    return data
