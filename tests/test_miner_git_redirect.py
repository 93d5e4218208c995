"""The miner's git, holding its GitHub token, against a remote that redirects to another host (real
HTTP servers on 127.0.0.1, one of them named localhost: another host to git)."""

from __future__ import annotations

import base64

import pytest

from quasar.miner.github import Git, GitError, write_askpass
from servers import QuietHandler, ThreadedServers
from test_miner_standins import TOKEN


class AsksForCredentials(QuietHandler):
    """Another host: asks for basic credentials, and keeps the ones it is sent."""

    received: list[str] = []

    def do_GET(self) -> None:
        authorization = self.headers.get("Authorization")
        if authorization:
            self.received.append(base64.b64decode(authorization.split()[-1]).decode())
        self.send_response(404 if authorization else 401)
        self.send_header("WWW-Authenticate", 'Basic realm="elsewhere"')
        self.send_header("Content-Length", "0")
        self.end_headers()


class RedirectsElsewhere(QuietHandler):
    """The fork's remote, taken over or mistyped: every request is sent on to ``target``."""

    target = ""

    def do_GET(self) -> None:
        self.send_response(301)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_attack_a_remote_redirecting_to_another_host_is_never_sent_the_token(tmp_path):
    """git follows a remote's first redirect and asks its credential helper for the new host's; the
    miner's helper answers with the token whatever the host, so the host a remote redirected to got
    it (seen: 'alice:TOKEN' from the clone). The miner's git follows no redirect: the command fails,
    saying so, and no other host is sent anything."""
    with ThreadedServers(AsksForCredentials) as elsewhere:
        RedirectsElsewhere.target = elsewhere.server_url().replace("127.0.0.1", "localhost")
        with ThreadedServers(RedirectsElsewhere) as remote:
            git = Git(write_askpass(tmp_path / "askpass.sh"), "alice", TOKEN, "Alice", "alice@example.invalid", 60)
            with pytest.raises(GitError) as raised:
                url = f"{remote.server_url()}/alice/flash-linear-attention.git"
                git.run("clone", "--quiet", "--", url, str(tmp_path / "fork"), cwd=tmp_path, network=True)
    assert AsksForCredentials.received == []
    assert "redirect" in str(raised.value) and TOKEN not in str(raised.value)
