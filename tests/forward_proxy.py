"""A forwarding HTTP proxy on 127.0.0.1, as a host whose only way out is a proxy has (``HTTP_PROXY``):
it takes absolute-form requests (``GET http://host:port/path``), asks the origin and relays the
answer whole, redirects included (the client follows them, through the proxy again).

``hosts`` maps names only the proxy can resolve (``hub.invalid``) to the address it sends their
requests to; every other host is asked as named. :attr:`requests` lists each forwarded URL.
"""

from __future__ import annotations

import http.client
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from servers import QuietHandler, ThreadedServers

# Hop-by-hop headers (RFC 9110 §7.6.1) are the proxy's own on each side, never relayed.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "upgrade"}


class ForwardProxy(ThreadedServers):
    """Forward plain-HTTP requests on a free 127.0.0.1 port until :meth:`close`."""

    def __init__(self, hosts: dict[str, str] | None = None):
        self.hosts = dict(hosts or {})
        self.requests: list[tuple[str, str]] = []  # (method, absolute URL) of every request, in order
        super().__init__(self._handler())

    @property
    def url(self) -> str:
        """The value for ``HTTP_PROXY``."""
        return self.server_url()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(QuietHandler):
            def do_HEAD(self) -> None:
                self._forward()

            def do_GET(self) -> None:
                self._forward()

            def _forward(self) -> None:
                target = urlsplit(self.path)
                if target.scheme != "http" or not target.hostname:
                    self.send_error(400, "absolute-form http:// URL expected")
                    return
                proxy.requests.append((self.command, self.path))
                host = proxy.hosts.get(target.hostname, target.hostname)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                origin = http.client.HTTPConnection(host, target.port or 80, timeout=10)
                try:
                    path = target.path + (f"?{target.query}" if target.query else "")
                    origin.request(self.command, path, None, headers)
                    answer = origin.getresponse()
                    data = answer.read()
                except OSError as error:
                    self.send_error(502, f"origin {target.netloc}: {error}")
                    return
                finally:
                    origin.close()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP | {"content-length"}:
                        self.send_header(key, value)
                # A HEAD's answer names the length of the body a GET would have.
                self.send_header("Content-Length", answer.getheader("Content-Length") or str(len(data)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(data)

        return Handler
