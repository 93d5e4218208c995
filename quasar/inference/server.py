"""The miner inference server: the reference model behind ``POST /inference``, for validators only.

Endpoints:
- ``POST /inference`` ``{prompt: [int], gen_len: int, logits_at_step: int}`` →
  ``{tokens: [int], captured_logits: [float], elapsed_sec: float}``: greedy decoding with the KV
  cache, the full-vocabulary logits at ``logits_at_step`` (1 = right after the prompt);
  ``elapsed_sec`` is the generation time, queue wait excluded.
- ``GET /model_info``: the model, dtype, device, vocabulary and this server's limits.
- ``GET /health``: liveness and queue depth, unsigned (for the operator's monitoring).

Signed endpoints need a ``btauth/1`` request addressed to this miner's hotkey from a hotkey with a
validator permit on the subnet (401 unsigned/bad signature/replay, 403 no permit). Callers are
checked against the metagraph read at most once per chain block (quasar/api/chaincache.py; the block
number is polled every half block), so no request rate makes the server load its chain node; when the
chain cannot be read, callers are checked against the last metagraph read while it is at most
``permit_max_stale_s`` (an hour) old, and after that signed requests get 503 (the caller cannot be
checked: retry later); the log gets a warning when such an outage begins and a line when it ends,
not one per request. Bad bodies get 422 with the field at fault, oversized bodies 413. The model
runs one request at a time on a single worker thread; at most ``queue_size`` more wait, at most
``max_pending_per_caller`` of one caller's running or waiting, and beyond that requests get 503.

Anyone on the internet can reach the server, so run it with :func:`server_options`: a request's
line and headers must stay under ``max_header_bytes`` (else 431) and arrive within
``header_timeout_s`` (else 408), and its body within ``body_timeout_s`` (else 408), so no
connection is held open or fills memory by dribbling bytes (quasar/api/protocol.py); and one
client address (an IPv6 one by its /64) holds at most ``max_connections_per_client`` connections
at once, more are answered 503 and closed, so one host cannot take every file descriptor. The log
gets a line per inference, at most one a minute for each caller (the next counts those between: a
permit holder may send them as fast as the model answers); refused requests, which anyone can send,
only at debug level.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError
from starlette.concurrency import run_in_threadpool

from quasar import auth, config
from quasar.api.chaincache import CachedMetagraphChain
from quasar.api.protocol import Deadline, LimitedHttpToolsProtocol
from quasar.api.rules import address_key
from quasar.chain import Chain, ChainError, Metagraph
from quasar.errors import QuasarError
from quasar.logits import ChallengeError, ReferenceModel, check_request

log = logging.getLogger(__name__)

# Bytes a JSON token id may take in a request body, with separators and some whitespace.
_BYTES_PER_PROMPT_TOKEN = 12
_MAX_REASON_ERRORS = 3
_MAX_GET_BODY_BYTES = 1024
# How far before the newest accepted nonce the replay store still holds nonces (the SDK store's 60 s).
NONCE_RETENTION_S = 60.0


def _setting_default(key: str) -> int:
    return int(config.OPTIONS_BY_KEY[key].default)


@dataclass(frozen=True)
class InferenceLimits:
    """What one server accepts; a validator's challenges must fit inside (docs/miner.md, "Miner
    inference server"). The defaults of those with a setting are the setting's (INFERENCE_*)."""

    max_prompt_len: int = _setting_default("inference_max_prompt_len")
    max_gen_len: int = _setting_default("inference_max_gen_len")
    queue_size: int = _setting_default("inference_queue_size")
    max_header_bytes: int = 16 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_connections_per_client: int = _setting_default("inference_max_connections_per_client")
    # A validator checks one miner at a time; its last request may still run after it gave up.
    max_pending_per_caller: int = 2
    # How old the last metagraph read may be to check callers by while the chain cannot be read.
    permit_max_stale_s: float = 3600.0
    # How long a request waits for a chain read before the last permits are used (PermitCheck): a
    # tenth of the 30 s a validator waits for the whole answer (LOGITS_TIMEOUT), inference included.
    permit_read_wait_s: float = 3.0
    # A caller's inferences are logged at most one line per this many seconds, the next counting
    # those served meanwhile: a permit holder may send them as fast as the model answers.
    inference_log_every_s: float = 60.0

    @property
    def max_body_bytes(self) -> int:
        return self.max_prompt_len * _BYTES_PER_PROMPT_TOKEN + 1024


class InferenceRequest(BaseModel):
    """The body of ``POST /inference`` (types only; ranges are checked against the model)."""

    model_config = ConfigDict(extra="forbid")

    prompt: list[StrictInt]
    gen_len: StrictInt
    logits_at_step: StrictInt


class WorkerBusy(QuasarError):
    """The worker refuses a job: its queue is full, or the caller holds its share; says which."""


class BoundedWorker:
    """Runs blocking jobs one at a time on one thread, refusing more than ``queue_size`` waiting
    and more than ``per_caller`` running or waiting from one caller: the queue is shared by every
    validator, and one that kept it full would get every other validator's challenge refused.

    The counts are kept on the event loop and released when a job really ends (a request whose
    client left keeps its place until its job finishes or is cancelled before starting), so
    the model never runs two requests at once and the bounds are exact.
    """

    def __init__(self, queue_size: int, per_caller: int):
        self.capacity = queue_size + 1
        self.per_caller = per_caller
        self.pending = 0
        self._callers: dict[str, int] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")

    async def run(self, job: Callable[[], Any], caller: str) -> Any:
        if self.pending >= self.capacity:
            raise WorkerBusy(f"inference queue full ({self.pending} requests running or waiting)")
        if self._callers.get(caller, 0) >= self.per_caller:
            raise WorkerBusy(f"at most {self.per_caller} of your requests run or wait at once")
        loop = asyncio.get_running_loop()
        self.pending += 1
        self._callers[caller] = self._callers.get(caller, 0) + 1
        future = self._executor.submit(job)
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release, caller))
        return await asyncio.wrap_future(future)

    def _release(self, caller: str) -> None:
        self.pending -= 1
        self._callers[caller] -= 1
        if not self._callers[caller]:
            del self._callers[caller]

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


class PermitCheck:
    """Who may call: a hotkey with a validator permit in the metagraph read through ``chain``.

    When the chain cannot be read, callers are checked against the last metagraph read, while it was
    read at most ``max_stale_s`` ago; then, or with none read yet, the :class:`ChainError` is raised
    (503). Refusing at once failed the miner in every validator's check during an outage of its own
    node. Permits change at most once an epoch (360 blocks, 72 min on finney), so a snapshot under
    an hour old misses at most one epoch's changes, and a hotkey that lost its permit there gets no
    more than any permit holder: a share of the queue. While that snapshot is in hand, the chain is
    read by one read at a time off the requests, and a request waits for it at most ``read_wait_s``
    from when it began (none once a read has failed), then is checked against the snapshot while the
    read goes on: a failing read takes the chain layer's retries (14 s, or minutes on a hung node),
    longer than a validator waits (LOGITS_TIMEOUT, 30 s), so waiting for one, even the first of an
    outage, failed every check meanwhile. The read's failure begins the outage, its answer becomes
    the snapshot. An outage logs a warning when it begins and a line when it ends: anyone can sign
    requests (a new hotkey costs nothing), and a line for each one while the chain is down would
    grow the log at their pace.
    """

    def __init__(
        self, chain: Chain, max_stale_s: float, read_wait_s: float, clock: Callable[[], float] = time.monotonic
    ):
        self.chain = chain
        self.max_stale_s = max_stale_s
        self.read_wait_s = read_wait_s
        self.clock = clock
        self._lock = threading.Lock()  # authorize runs on the server's thread pool
        self._read: tuple[float, Metagraph] | None = None  # the last metagraph read, and when
        self._outage_since: float | None = None
        self._reading: tuple[float, Future[Metagraph]] | None = None  # the read on its own thread, and when it began

    def authorize(self, hotkey: str) -> None:
        """:data:`auth.Authorizer`: :class:`auth.AuthFailure` (403) without a permit; ChainError
        when the chain cannot be read and no metagraph was read within ``max_stale_s``."""
        neuron = self._metagraph().by_hotkey(hotkey)
        if neuron is None or not neuron.validator_permit:
            raise auth.AuthFailure(403, f"hotkey {hotkey} has no validator permit on subnet {self.chain.netuid}")

    def _metagraph(self) -> Metagraph:
        with self._lock:
            now = self.clock()
            snapshot = self._read if self._read is not None and self._fresh(self._read[0], now) else None
            if snapshot is not None:
                reading, wait_s = self._join_read(now)
        if snapshot is None:
            return self._read_chain()  # nothing to check callers by meanwhile: wait for the chain
        try:
            return reading.result(timeout=wait_s)
        except TimeoutError:
            return snapshot[1]

    def _join_read(self, now: float) -> tuple[Future[Metagraph], float]:
        """The read under way (started if none is) and how long a request arriving at ``now`` waits
        for it; called holding the lock."""
        if self._reading is None:
            self._reading = (now, Future())
            threading.Thread(
                target=self._read_off_requests, args=(self._reading[1],), name="permit-read", daemon=True
            ).start()
        began, reading = self._reading
        if self._outage_since is not None:
            return reading, 0.0
        return reading, max(0.0, began + self.read_wait_s - now)

    def _fresh(self, read_at: float, now: float) -> bool:
        return now - read_at <= self.max_stale_s

    def _read_off_requests(self, reading: Future[Metagraph]) -> None:
        """One read, on its own thread; the requests meanwhile wait for it or use the last permits."""
        try:
            reading.set_result(self._read_chain())
        except Exception as error:  # the waiting requests raise it (ChainError: 503)
            reading.set_exception(error)
        finally:
            with self._lock:
                self._reading = None

    def _read_chain(self) -> Metagraph:
        try:
            metagraph = self.chain.metagraph()
        except ChainError as error:
            now = self.clock()
            with self._lock:
                last = self._read
                if self._outage_since is None:
                    self._outage_since = now
                    log.warning(
                        "cannot read the chain to check callers' validator permits: %s; %s", error, self._plan(now)
                    )
            if last is None or not self._fresh(last[0], now):
                raise
            return last[1]
        with self._lock:
            self._read = (self.clock(), metagraph)
            if self._outage_since is not None:
                log.info(
                    "the chain can be read again after %.0f s; callers' permits are checked again",
                    self._read[0] - self._outage_since,
                )
                self._outage_since = None
        return metagraph

    def _plan(self, now: float) -> str:
        """What signed requests get during the outage beginning at ``now`` (for its warning)."""
        if self._read is None:
            return "signed requests get 503 (no metagraph read yet)"
        left = self.max_stale_s - (now - self._read[0])
        return (
            f"callers are checked against the last validator permits read ({now - self._read[0]:.0f} s ago) "
            f"until they are {self.max_stale_s:g} s old, {max(left, 0):.0f} s from now; then signed requests get 503"
        )


class InferenceLog:
    """Logs the inferences served, at most one line per caller per ``every_s``; the next line of that
    caller says how many were served meanwhile. Called on the event loop only."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self.clock = clock
        self._said: dict[str, tuple[float, int]] = {}  # caller -> (when its last line was said, served since)

    def served(self, caller: str, text: str) -> None:
        """``caller`` was served the inference ``text`` describes."""
        now = self.clock()
        said = self._said.get(caller)
        if said is not None and now - said[0] < self.every_s:
            self._said[caller] = (said[0], said[1] + 1)
            return
        more = f" (and {said[1]} more since its last line, {now - said[0]:.0f} s ago)" if said and said[1] else ""
        log.info("%s%s", text, more)
        # Kept while there is something to say: at most a line a window for each permit holder.
        self._said = {key: value for key, value in self._said.items() if value[1] or now - value[0] < self.every_s}
        self._said[caller] = (now, 0)


def _error(status_code: int, reason: str) -> JSONResponse:
    return JSONResponse({"detail": reason}, status_code=status_code)


def _validation_reason(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:_MAX_REASON_ERRORS]:
        where = ".".join(str(part) for part in item["loc"])
        parts.append(f"{where}: {item['msg']}" if where else item["msg"])
    more = error.error_count() - _MAX_REASON_ERRORS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


class ClientConnections:
    """How many connections each client address holds, against one limit (one server's count)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open: dict[str, int] = {}

    def admit(self, key: str) -> bool:
        if self.open.get(key, 0) >= self.limit:
            return False
        self.open[key] = self.open.get(key, 0) + 1
        return True

    def release(self, key: str) -> None:
        self.open[key] -= 1
        if not self.open[key]:
            del self.open[key]


class InferenceProtocol(LimitedHttpToolsProtocol):
    """The API's header-limited protocol, with at most ``connections.limit`` connections per
    client address (counted on the event loop: connections are made and lost there), and a request
    body due ``body_timeout_s`` after its headers: a route waiting for its body answers 408 itself
    (:func:`_read_body`); one that answered without reading it (``GET /health``, a 404) has its
    connection closed then, instead of reading a dribbled body forever."""

    def __init__(self, *args, connections: ClientConnections, body_timeout_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self._connections = connections
        self._client_key: str | None = None
        self._body_deadline = Deadline(self.loop, body_timeout_s, self._body_timeout)

    def _body_timeout(self) -> None:
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._body_deadline.arm()  # the route is still answering (a late body gets its 408)
        else:
            self.transport.close()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self._refused is None and not self.transport.is_closing():
            self._body_deadline.arm()

    def on_message_complete(self) -> None:
        self._body_deadline.disarm()
        super().on_message_complete()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        key = address_key(self.client[0]) if self.client else ""  # the peer (host, port) uvicorn read
        if self._connections.admit(key):
            self._client_key = key
        else:
            self._refuse(503, f"more than {self._connections.limit} connections from your address")

    def connection_lost(self, exc: Exception | None) -> None:
        self._body_deadline.disarm()
        if self._client_key is not None:
            self._connections.release(self._client_key)
            self._client_key = None
        super().connection_lost(exc)


def server_options(limits: InferenceLimits) -> dict[str, Any]:
    """uvicorn's options for one server (besides host and port): the connection limits of ``limits``."""
    protocol = functools.partial(
        InferenceProtocol,
        max_header_bytes=limits.max_header_bytes,
        header_timeout_s=limits.header_timeout_s,
        connections=ClientConnections(limits.max_connections_per_client),
        body_timeout_s=limits.body_timeout_s,
    )
    return {"http": protocol, "server_header": False}


async def _stream_body(request: Request, limit: int) -> bytes | None:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_body(request: Request, limit: int, timeout_s: float, too_large: str) -> bytes | JSONResponse:
    """The raw body, or the answer refusing it: 413 (``too_large``) once it exceeds ``limit`` bytes
    (declared or streamed), 408 when it has not all arrived within ``timeout_s``."""
    try:
        body = await asyncio.wait_for(_stream_body(request, limit), timeout_s)
    except TimeoutError:
        answer = _error(408, f"the request body did not arrive within {timeout_s:g} s")
        answer.headers["Connection"] = "close"
        return answer
    return _error(413, too_large) if body is None else body


def create_inference_app(
    model: ReferenceModel,
    chain: Chain,
    self_hotkey: str,
    limits: InferenceLimits = InferenceLimits(),
) -> FastAPI:
    """The inference server app for ``model``; requests must be addressed to ``self_hotkey``.

    ``model`` needs ``generate(prompt, gen_len, logits_at_step)`` and the attributes of
    :class:`~quasar.logits.ReferenceModel`; it is loaded once by the caller and shared. ``chain`` is
    read through a per-block cache: its metagraph once per new block, its block number every half block.
    """
    nonce_store = auth.RecentNonces(NONCE_RETENTION_S)
    cached = CachedMetagraphChain(chain, block_poll_s=chain.block_time_s / 2)
    permits = PermitCheck(cached, limits.permit_max_stale_s, limits.permit_read_wait_s)
    worker = BoundedWorker(limits.queue_size, limits.max_pending_per_caller)
    served = InferenceLog(limits.inference_log_every_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        worker.shutdown()

    app = FastAPI(
        title="QUASAR miner inference server", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )

    async def authenticated(request: Request, body: bytes) -> str:
        """The caller's hotkey; :class:`auth.AuthFailure` (401/403, or 503 when the chain that says
        who holds a permit cannot be read and the last metagraph read is too old)."""
        target = auth.request_target(request.url.path, request.url.query)
        try:
            caller = await run_in_threadpool(
                auth.authenticate,
                request.headers,
                body,
                method=request.method,
                target=target,
                self_hotkey=self_hotkey,
                nonce_store=nonce_store,
                authorize=permits.authorize,
            )
        except ChainError:
            raise auth.AuthFailure(
                503, "the miner cannot read the chain to check the caller's validator permit now; retry later"
            ) from None
        return caller

    @app.get("/health")
    async def health() -> dict:
        # No model name: it may be a folder of the miner's machine, and anyone may ask (model_info is signed).
        # The hotkey is public (the chain lists it with this endpoint); the miner's start compares it with its own.
        return {"status": "ok", "pending": worker.pending, "capacity": worker.capacity, "hotkey": self_hotkey}

    @app.get("/model_info")
    async def model_info(request: Request) -> Response:
        body = await _read_body(
            request, _MAX_GET_BODY_BYTES, limits.body_timeout_s, f"request body over {_MAX_GET_BODY_BYTES} bytes"
        )
        if isinstance(body, Response):
            return body
        try:
            await authenticated(request, body)
        except auth.AuthFailure as failure:
            return _error(failure.status_code, failure.reason)
        return JSONResponse(
            {
                "model": model.name,
                "dtype": model.dtype_name,
                "device": str(model.device),
                "vocab_size": model.vocab_size,
                "ordinary_vocab_end": model.ordinary_tokens.end,
                "max_positions": model.max_positions,
                "max_prompt_len": limits.max_prompt_len,
                "max_gen_len": limits.max_gen_len,
                "queue_size": limits.queue_size,
                "hotkey": self_hotkey,
            }
        )

    @app.post("/inference")
    async def inference(request: Request) -> Response:
        too_large = (
            f"request body over {limits.max_body_bytes} bytes (prompts hold at most {limits.max_prompt_len} tokens)"
        )
        body = await _read_body(request, limits.max_body_bytes, limits.body_timeout_s, too_large)
        if isinstance(body, Response):
            return body
        try:
            caller = await authenticated(request, body)
        except auth.AuthFailure as failure:
            # Debug only: anyone can be refused, as fast as they send.
            log.debug("refused %s %s: %s", request.method, request.url.path, failure.reason)
            return _error(failure.status_code, failure.reason)
        try:
            parsed = InferenceRequest.model_validate_json(body)
        except ValidationError as error:
            return _error(422, _validation_reason(error))
        try:
            if len(parsed.prompt) > limits.max_prompt_len:
                raise ChallengeError(f"prompt: {len(parsed.prompt)} tokens, at most {limits.max_prompt_len} accepted")
            if parsed.gen_len > limits.max_gen_len:
                raise ChallengeError(f"gen_len: {parsed.gen_len}, at most {limits.max_gen_len} accepted")
            check_request(parsed.prompt, parsed.gen_len, parsed.logits_at_step, model.vocab_size, model.max_positions)
        except ChallengeError as error:
            return _error(422, str(error))

        def job() -> tuple[bytes, float]:
            # Serialized here too: a full-vocabulary JSON answer would stall the event loop.
            started = time.perf_counter()
            generation = model.generate(parsed.prompt, parsed.gen_len, parsed.logits_at_step)
            elapsed = time.perf_counter() - started
            payload = {
                "tokens": list(generation.tokens),
                "captured_logits": generation.logits.tolist(),
                "elapsed_sec": elapsed,
            }
            return json.dumps(payload, separators=(",", ":")).encode(), elapsed

        try:
            answer, elapsed = await worker.run(job, caller)
        except WorkerBusy as busy:
            return _error(503, f"{busy}; retry later")
        except Exception:  # the model failed (out of memory, driver error): log it, tell the caller only that
            log.exception(
                "inference failed for %s (prompt %d tokens, gen_len %d)", caller, len(parsed.prompt), parsed.gen_len
            )
            return _error(500, "inference failed on the miner; see the miner's log")
        served.served(
            caller,
            f"inference for {caller}: prompt {len(parsed.prompt)} tokens, gen_len {parsed.gen_len}, "
            f"step {parsed.logits_at_step}, {elapsed:.3f} s",
        )
        return Response(answer, media_type="application/json")

    return app
