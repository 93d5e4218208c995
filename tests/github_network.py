"""The network between a validator and GitHub, standing in for both: an HTTP proxy on 127.0.0.1
(reached through ``https_proxy``, as an operator's proxy is) that refuses the tunnel, or opens it
and answers as github.com over TLS (a certificate of a test CA that ``GIT_SSL_CAINFO`` names) with
one HTTP status to every request, or cuts the connection once git has asked, or serves bare
repositories as GitHub's smart HTTP does (``git http-backend``), cutting a fetch's pack partway
where asked. Real git and curl talk to it; nothing leaves this machine.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
from pathlib import Path

from servers import accept_connections, read_head

REFUSE = "refuse"  # the proxy answers the tunnel with 502
CUT = "cut"  # the tunnel opens, TLS starts, and the connection closes once a request came
SERVE = "serve"  # GitHub serves the repositories under ``root`` (git http-backend), cut as ``cut_after`` says


def make_github_certificate(folder: Path) -> tuple[Path, Path, Path]:
    """A test CA and a certificate for github.com it signed: (CA file, certificate, key)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    certificate, key, request = folder / "github.pem", folder / "github.key", folder / "github.csr"
    extensions = folder / "github.ext"
    extensions.write_text("subjectAltName=DNS:github.com\n")
    for command in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2"]
        + ["-subj", "/CN=quasar test CA", "-addext", "basicConstraints=critical,CA:TRUE"]
        + ["-addext", "keyUsage=critical,keyCertSign"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", request, "-subj", "/CN=github.com"],
        ["x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", certificate]
        + ["-days", "2", "-extfile", extensions],
    ):
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return ca, certificate, key


class GitHubProxy:
    """The proxy; ``mode`` is REFUSE, CUT or an HTTP status GitHub answers with. Use as a context manager."""

    def __init__(
        self, mode: str | int, certificate: Path, key: Path, root: Path | None = None, cut_after: int | None = None
    ):
        self.mode = mode
        # SERVE: the folder holding OWNER/REPO bare repositories, and how many bytes of a fetch's
        # pack are sent before the connection is cut (None: all of it).
        self.root = root
        self.cut_after = cut_after
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(certificate, key)
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def __enter__(self) -> GitHubProxy:
        accept_connections(self._socket, self._answer)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._socket.close()

    def _serve_git(self, tls: ssl.SSLSocket, received: bytes) -> None:
        """Answer one request as GitHub's smart HTTP does, through ``git http-backend``."""
        head, _, body = received.partition(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _ = request_line.split(" ")
        headers = {name.strip().lower(): value.strip() for name, value in (h.split(":", 1) for h in header_lines)}
        while len(body) < int(headers.get("content-length", 0)):
            body += tls.recv(65536)
        path, _, query = target.partition("?")
        env = {
            "PATH": "/usr/bin:/bin",
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "GIT_PROTOCOL": headers.get("git-protocol", ""),
            "HTTP_CONTENT_ENCODING": headers.get("content-encoding", ""),
        }
        done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False)
        cgi_head, _, content = done.stdout.partition(b"\r\n\r\n")
        cgi = dict(line.split(": ", 1) for line in cgi_head.decode("latin-1").split("\r\n") if line)
        status = cgi.pop("Status", "200 OK")
        fields = "".join(f"{name}: {value}\r\n" for name, value in cgi.items())
        fields += f"Content-Length: {len(content)}\r\nConnection: close\r\n"
        tls.sendall(f"HTTP/1.1 {status}\r\n{fields}\r\n".encode())
        # A fetch's pack cut partway: the connection closes with the length announced unsent.
        tls.sendall(content[: self.cut_after] if method == "POST" and self.cut_after is not None else content)

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            try:
                if not read_head(connection):
                    return
                if self.mode == REFUSE:
                    connection.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                    return
                connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                with self._tls.wrap_socket(connection, server_side=True) as tls:
                    received = read_head(tls)
                    if not received or self.mode == CUT:
                        return
                    if self.mode == SERVE:
                        self._serve_git(tls, received)
                        return
                    tls.sendall(
                        f"HTTP/1.1 {self.mode} Status\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
                    )
            except (OSError, ssl.SSLError):
                return
