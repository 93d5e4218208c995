"""A Hugging Face Hub stand-in on 127.0.0.1: serves model folders saved to disk through the endpoints
huggingface_hub's ``snapshot_download``/``hf_hub_download`` (and so transformers' ``from_pretrained``)
call, with ``HF_ENDPOINT`` pointed at :attr:`HubStandIn.endpoint`:

- ``GET /api/models/{repo}[/revision/{rev}]``: the repo's info (``sha``, ``siblings``);
- ``GET /api/models/{repo}/tree/{rev}``: its files, sizes and blob ids (LFS ones with their sha256);
- ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``: ``X-Repo-Commit`` and ``ETag`` (the git blob id) on
  small files; on ``*.safetensors`` (LFS on the Hub) a 302 to ``/cdn/{sha256}`` with ``X-Linked-Etag``
  and ``X-Linked-Size``, as the Hub redirects to its CDN (a second port: another origin);
- ``GET /cdn/{sha256}``: the bytes, honouring ``Range`` (a download resumed after a cut).

After :meth:`HubStandIn.xet`, the LFS files are stored on Xet, as the Hub's are: the tree lists each
with its ``xetHash``, its ``resolve`` answer carries ``X-Xet-Hash`` and a ``Link`` to the token
route (``rel="xet-auth"``) beside the redirect, and ``GET /api/models/{repo}/xet-read-token/{rev}``
answers with ``X-Xet-Cas-Url`` (the CAS server hf_xet downloads from), ``X-Xet-Access-Token`` and
``X-Xet-Token-Expiration``. The redirect stays: it is the Hub's HTTP bridge, which a client without
hf_xet (or with ``HF_HUB_DISABLE_XET=1``) downloads through. A file's Xet hash is its sha256, which no
CAS server knows; :meth:`HubStandIn.xet_stored` stores the files on Xet for real: hf_xet uploads
them into a folder, its ``local://`` storage, which the token route names, and hf_xet downloads them
from there.

An unknown repo gets 401 ``RepoNotFound``, an unknown file 404 ``EntryNotFound`` with the commit, as
the Hub answers. Faults for a test: :meth:`answer` (every request gets a status, as a gated repo, a
rate limit or an outage), :meth:`cut` (a file's body ends, connection closed, after N bytes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

from servers import QuietHandler, ThreadedServers

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_SUFFIXES = (".safetensors", ".bin")


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Repo:
    def __init__(self, folder: Path):
        self.folder = folder
        self.xet_hashes: dict[str, str] = {}  # the Xet hash of each file a CAS holds; else its sha256
        self.files = {
            p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
        }
        self.blob_ids = {name: _git_blob_id(data) for name, data in self.files.items()}
        self.sha256 = {name: hashlib.sha256(data).hexdigest() for name, data in self.files.items()}

    def tree(self, xet: bool) -> list[dict]:
        entries = []
        for name, data in self.files.items():
            entry = {"type": "file", "path": name, "size": len(data), "oid": self.blob_ids[name]}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": self.sha256[name], "size": len(data), "pointerSize": 134}
                if xet:  # a Xet hash is 64 hex digits; the file's sha256 stands in for one no CAS holds
                    entry["xetHash"] = self.xet_hash(name)
            entries.append(entry)
        return entries

    def xet_hash(self, name: str) -> str:
        return self.xet_hashes.get(name, self.sha256[name])


# hf_xet's upload of the files named into the CAS named, as the Hub's storage holds them: their Xet hashes.
_XET_UPLOAD = """
import json, sys
import hf_xet
with hf_xet.XetSession().new_upload_commit(endpoint=sys.argv[1]) as commit:
    uploads = [commit.start_upload_file(path) for path in sys.argv[2:]]
print(json.dumps([upload.result().xet_info.hash for upload in uploads]))
"""


class HubStandIn(ThreadedServers):
    """Serve ``repos`` (hub id → model folder) on a free 127.0.0.1 port until :meth:`close`."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = {repo_id: _Repo(Path(folder)) for repo_id, folder in repos.items()}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self._status: tuple[int, str] | None = None
        self._cuts: dict[str, int] = {}
        self._cas: str | None = None
        self._redirect: str | None = None
        # The CDN is a second port: huggingface_hub follows a redirect within the hub's origin
        # itself, and stops at one to another origin, taking the file's metadata from that answer.
        super().__init__(self._handler(), count=2)

    @property
    def endpoint(self) -> str:
        """The value for ``HF_ENDPOINT``."""
        return self.server_url(0)

    @property
    def cdn(self) -> str:
        """Where the LFS files' redirects point."""
        return self.server_url(1)

    def answer(self, status: int | None, error_code: str = "") -> None:
        """Answer every request with ``status`` (and ``X-Error-Code: error_code``); None: serve again."""
        self._status = None if status is None else (status, error_code)

    def redirect_to(self, origin: str | None) -> None:
        """Redirect the LFS files to ``origin`` (one that refuses connections, say) instead of the
        CDN's port; None: to the CDN again."""
        self._redirect = origin

    def xet(self, cas: str | None) -> None:
        """Serve the LFS files as stored on Xet, whose CAS server the token route names as ``cas``;
        None: as plain LFS files again."""
        self._cas = cas

    def xet_stored(self, folder: Path) -> str:
        """Store the LFS files on Xet for real: hf_xet uploads them into ``folder`` (its ``local://``
        storage, which the token route then names as the CAS) and they are served with their Xet hashes;
        that CAS URL. The upload runs in a process of its own, its hf_xet log in ``folder``."""
        cas = f"local://{folder}"
        for repo in self.repos.values():
            names = [name for name in repo.files if name.endswith(LFS_SUFFIXES)]
            uploaded = subprocess.run(
                [sys.executable, "-c", _XET_UPLOAD, cas, *(str(repo.folder / name) for name in names)],
                env={**os.environ, "HF_HOME": str(folder / "uploader")},
                capture_output=True,
                text=True,
                check=True,
            )
            repo.xet_hashes.update(zip(names, json.loads(uploaded.stdout)))
        self.xet(cas)
        return cas

    def cut(self, filename: str, after_bytes: int | None) -> None:
        """Close the connection after ``after_bytes`` of ``filename``'s body, every time; None: serve it whole."""
        if after_bytes is None:
            self._cuts.pop(filename, None)
        else:
            self._cuts[filename] = after_bytes

    def downloads(self, filename: str) -> int:
        """How many GETs of ``filename``'s bytes the stand-in has answered (its redirect target included)."""
        hashes = {repo.sha256.get(filename) for repo in self.repos.values()}
        return sum(
            1
            for method, path in self.requests
            if method == "GET" and (path.endswith("/" + filename) or path.rsplit("/", 1)[-1] in hashes)
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(QuietHandler):
            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _send(self, status: int, headers: dict[str, str], data: bytes = b"", body: bool = True) -> None:
                self.send_response(status)
                for key, value in {"Content-Length": str(len(data)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _error(self, status: int, code: str, body: bool, headers: dict[str, str] | None = None) -> None:
                message = json.dumps({"error": f"{code or 'error'} ({status})"}).encode()
                extra = {"X-Error-Code": code} if code else {}
                self._send(status, {"Content-Type": "application/json", **extra, **(headers or {})}, message, body)

            def _serve(self, body: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                hub.requests.append((self.command, path))
                if hub._status is not None:
                    self._error(*hub._status, body=body)
                    return
                api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/(revision|tree|xet-read-token)/([^/]+))?/?", path)
                resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                cdn = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
                repo_id = (api or resolve).group(1) if (api or resolve) else None
                if repo_id is not None and repo_id not in hub.repos:
                    self._error(401, "RepoNotFound", body)
                elif api is not None:
                    repo = hub.repos[api.group(1)]
                    if api.group(2) == "xet-read-token":
                        self._xet_token(body)
                        return
                    if api.group(2) == "tree":
                        data = json.dumps(repo.tree(hub._cas is not None)).encode()
                    else:
                        siblings = [{"rfilename": name} for name in repo.files]
                        data = json.dumps({"id": api.group(1), "sha": COMMIT, "siblings": siblings}).encode()
                    self._send(200, {"Content-Type": "application/json"}, data, body)
                elif resolve is not None:
                    self._resolve(resolve.group(1), resolve.group(3), body)
                elif cdn is not None:
                    found = [(r, n) for r in hub.repos.values() for n, h in r.sha256.items() if h == cdn.group(1)]
                    if not found:
                        self._error(404, "", body)
                    else:
                        repo, name = found[0]
                        self._content(name, repo.files[name], {"ETag": f'"{cdn.group(1)}"'}, body)
                else:
                    self._error(404, "", body)

            def _resolve(self, repo_id: str, name: str, body: bool) -> None:
                repo = hub.repos[repo_id]
                commit = {"X-Repo-Commit": COMMIT}
                if name not in repo.files:
                    self._error(404, "EntryNotFound", body, commit)
                elif name.endswith(LFS_SUFFIXES):
                    linked = {
                        "X-Linked-Etag": f'"{repo.sha256[name]}"',
                        "X-Linked-Size": str(len(repo.files[name])),
                        "ETag": f'"{repo.blob_ids[name]}"',
                    }
                    if hub._cas is not None:
                        token_route = f"{hub.endpoint}/api/models/{repo_id}/xet-read-token/{COMMIT}"
                        linked.update({"X-Xet-Hash": repo.xet_hash(name), "Link": f'<{token_route}>; rel="xet-auth"'})
                    linked["Location"] = f"{hub._redirect or hub.cdn}/cdn/{repo.sha256[name]}"
                    self._send(302, {**commit, **linked}, b"", body)
                else:
                    self._content(name, repo.files[name], {**commit, "ETag": f'"{repo.blob_ids[name]}"'}, body)

            def _xet_token(self, body: bool) -> None:
                if hub._cas is None:
                    self._error(404, "", body)
                    return
                expires = int(time.time()) + 3600
                token = {
                    "X-Xet-Cas-Url": hub._cas,
                    "X-Xet-Access-Token": "xet-token",
                    "X-Xet-Token-Expiration": str(expires),
                }
                data = json.dumps({"casUrl": hub._cas, "accessToken": "xet-token", "exp": expires}).encode()
                self._send(200, {"Content-Type": "application/json", **token}, data, body)

            def _content(self, name: str, data: bytes, headers: dict[str, str], body: bool) -> None:
                start = 0
                ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                if ranged is not None:
                    start = int(ranged.group(1))
                    total = len(data)
                    headers = {**headers, "Content-Range": f"bytes {start}-{total - 1}/{total}"}
                part = data[start:]
                self.send_response(206 if ranged else 200)
                for key, value in {"Content-Length": str(len(part)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                if not body:
                    return
                cut = hub._cuts.get(name)
                if cut is None:
                    self.wfile.write(part)
                    return
                self.wfile.write(part[: max(cut - start, 0)])
                self.wfile.flush()
                self.close_connection = True

        return Handler
