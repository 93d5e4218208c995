"""The hot path of ``POST /submit_kernel``, answered by an ASGI middleware before FastAPI's routing.

Direct submissions are the API's most frequent signed write, and at a round's start they arrive
together. FastAPI's routing, dependency resolution, thread-pool hop and serialization cost about as
much CPU as the submission's own work (benchmarks/RESULTS.md, "Where a request's time goes"), so
the lane takes the same steps itself: read the body, verify the signature (the route's own
``authenticate``), validate the body with the route's model, make the same service call in a
thread, and answer with the same JSON.

The route in app.py is the reference and stays: the lane answers only a request it can take all the
way to the service. Everything else goes on to the route unchanged, with the body the lane read:
another method or path, a query string, no Content-Length or one over the limit, a content type
other than JSON, a signature that does not verify, a body the model refuses. So every refusal made
before the service call is the route's own, and what the service raises is answered through the
same mapping as the route's (quasar/api/errors.py). tests/test_api_fastlane.py sends the same
random requests to a server with the lane and one without, and compares the answers byte for byte.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from quasar.api import schemas
from quasar.api.errors import error_response
from quasar.api.servicecore import Authenticated

PATH = "/submit_kernel"

Authenticate = Callable[[Request, bytes], Awaitable[Authenticated]]
Submit = Callable[[schemas.SubmitKernelRequest, Authenticated], schemas.SubmissionAccepted]


class SubmitFastLane:
    """ASGI middleware: signed direct submissions straight to ``submit``; the rest to ``app``.

    ``authenticate(request, body)`` verifies the signature and names the caller (raising
    ``AuthFailure`` if it does not verify); ``submit(payload, caller)`` is the route's service call,
    run on ``threads`` (it waits for the database)."""

    def __init__(
        self, app: ASGIApp, authenticate: Authenticate, submit: Submit, threads: Executor, max_body_bytes: int
    ):
        self.app = app
        self.authenticate = authenticate
        self.submit = submit
        self.threads = threads
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._takes(scope):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:  # the client went away before sending its body
            return
        request = Request(scope)
        try:
            caller = await self.authenticate(request, body)
            payload = schemas.SubmitKernelRequest.model_validate(json.loads(body))
        except Exception:  # the route answers: 401, 422 and their messages are its own
            await self.app(scope, _replay(body, receive), send)
            return
        try:
            loop = asyncio.get_running_loop()
            accepted = await loop.run_in_executor(self.threads, self.submit, payload, caller)
            response = JSONResponse(accepted.model_dump(mode="json"), status_code=201)
        except Exception as error:
            response = error_response(error, "POST", PATH)
        await response(scope, receive, send)

    def _takes(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH or scope["query_string"]:
            return False
        length = content_type = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"content-type":
                content_type = value
        return (
            content_type == b"application/json"
            and length is not None
            and length.isdigit()
            and int(length) <= self.max_body_bytes
        )


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the route: the body already read, then whatever the client sends next."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
