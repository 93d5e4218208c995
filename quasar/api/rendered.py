"""A response as the API's read caches keep it, and what a cache shared by the server's workers
offers: what quasar/api/readcache.py (each worker's cache) and quasar/api/sharedpages.py (the
workers' shared store) both speak, so that neither imports the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fastapi.responses import Response

Target = tuple[str, bytes]  # (path, query string)


@dataclass(frozen=True)
class Rendered:
    """A response as sent: status, headers (content type and length included) and body."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    @classmethod
    def of(cls, response: Response) -> Rendered:
        return cls(response.status_code, tuple(response.raw_headers), bytes(response.body))

    def response(self) -> Response:
        response = Response(self.body, status_code=self.status)
        response.raw_headers = list(self.headers)
        return response


class SharedRenders(Protocol):
    """Rendered responses computed once for all of a server's workers (quasar/api/sharedpages.py)."""

    def render(self, target: Target, block: int, compute: Callable[[], Rendered]) -> Rendered:
        """``target``'s response at ``block``: another worker's, if one computed it, else ``compute()``'s."""
        ...
