"""The submission API's HTTP layer: routes, hotkey-signed requests, client IPs, limits and error mapping.

State-changing requests carry ``btauth/1`` headers (``bittensor.http_auth``) signed by the caller's
hotkey for this API's hotkey (``GET /health`` names it), over the exact method, path with query,
body bytes and a fresh nonce; the nonce store is a database table, written in the request's own
transaction, so a replay is refused in every API process and after restarts. Miners must be
registered on the subnet, validators must hold a validator permit; both come from the chain.

Status codes: 400 bad request or commitment mismatch, 401 authentication, 403 not allowed or IP
banned, 404 unknown, 409 conflicts (too early, already done, a copy), 413 body too large, 422
invalid fields or unknown query parameters, 429 rate limit, 503 database or chain busy. Every
error body is ``{"detail": "..."}``; an unexpected error is logged and answered with a plain 500,
never a traceback (quasar/api/errors.py). Every response carries the headers of
``SECURITY_HEADERS``; there is no ``/docs`` page (it would load scripts from a CDN): the schema is
``/openapi.json``.
"""

import pathlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.types import DecoratedCallable
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from quasar import auth
from quasar.api import rules, schemas
from quasar.api.clockwatch import ClockWatch
from quasar.api.dashboard import dashboard_router
from quasar.api.db import Database, DatabaseBusy
from quasar.api.errors import error_response
from quasar.api.fastlane import SubmitFastLane
from quasar.api.readcache import BlockCache
from quasar.api.service import NONCE_RETENTION_S, ApiConfig, ApiError, Authenticated, SubmissionService
from quasar.api.sharedpages import SharedPages
from quasar.api.status import StatusReader
from quasar.chain import Chain, ChainError

MAX_BODY_BYTES = 64 * 1024
# The submission fast lane runs as many submissions at once as FastAPI's thread pool would (anyio's limit).
LANE_THREADS = 40
MAX_PAGE = 100

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.ErrorBody} for status in (400, 401, 403, 404, 409, 413, 422, 429, 503)
}
# On every response. The dashboard's pages load nothing (CSS in the page, charts inline SVG), so
# nothing needs to be allowed but inline styles; no page may be framed.
SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
        b"form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """ASGI middleware: add :data:`SECURITY_HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _query_names(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route (its dependant) takes, its dependencies' included."""
    names = {param.alias for param in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _query_names(dependency)
    return frozenset(names)


async def known_query_only(request: Request) -> None:
    """Refuse (422) a query parameter the route does not take, naming it."""
    route = request.scope["route"]
    names = getattr(route, "quasar_query_names", None)
    if names is None:  # worked out once per route, and kept on it
        names = route.quasar_query_names = _query_names(route.dependant)
    unknown = sorted(set(request.query_params.keys()) - names)
    if unknown:
        raise ApiError(
            422,
            f"invalid request: unknown query parameter{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(name[:40]) for name in unknown[:5])}",
        )


STRICT_QUERY = [Depends(known_query_only)]


class BodySizeLimit:
    """Refuse request bodies over ``limit`` bytes with 413: by Content-Length before reading, or as
    soon as a streamed body passes the limit."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"request body is larger than {self.limit} bytes"
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            response = JSONResponse({"detail": too_large}, status_code=413, headers={"Connection": "close"})
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # FastAPI passes HTTPExceptions raised while reading the body on to its handler.
                    raise HTTPException(413, too_large)
            return message

        await self.app(scope, limited_receive, send)


class NoteNonce:
    """The nonce store ``http_auth.verify`` is given: it only takes note of the nonce, which the
    service records in the request's own transaction (:class:`Authenticated`), so a request costs
    one transaction, not two."""

    retention = NONCE_RETENTION_S  # verify() checks that the store outlives its freshness window

    def __init__(self):
        self.nonce_ns: int | None = None

    def check_and_store(self, _hotkey_ss58: str, nonce_ns: int) -> bool:
        self.nonce_ns = nonce_ns
        return True


def create_app(
    config: ApiConfig,
    chain: Chain,
    database: Database | str,
    clock: Callable[[], float] = time.time,
    fast_lane: bool = True,
    shared_pages: pathlib.Path | None = None,
    watch_clock: bool = True,
) -> FastAPI:
    """The API on ``database`` (a :class:`Database` or a URL; migrated to the newest schema here)
    and ``chain`` (registrations, permits and blocks). ``fast_lane``: answer signed direct
    submissions before routing (quasar/api/fastlane.py); off, the route answers them all.
    ``shared_pages``: a directory where the server's worker processes share their cached reads
    (quasar/api/sharedpages.py). ``watch_clock``: count the refusals for the clock and say when
    they show this host's clock off (quasar/api/clockwatch.py)."""
    if not config.api_hotkey:
        raise ValueError("API_HOTKEY is not set: the API needs its hotkey's ss58 address as the signed receiver")
    if isinstance(database, str):
        database = Database(database)
    database.upgrade()
    service = SubmissionService(config, chain, database, clock)
    registered, permitted = auth.require_registered(chain), auth.require_validator_permit(chain)
    clocks = ClockWatch() if watch_clock else None
    reads = BlockCache(service.current_block, shared=None if shared_pages is None else SharedPages(shared_pages))
    trusted = rules.parse_networks(config.trusted_proxies)

    lane_threads = ThreadPoolExecutor(LANE_THREADS, thread_name_prefix="submit")

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await run_in_threadpool(database.open_connections)  # before the first request
        yield
        lane_threads.shutdown(wait=True)
        reads.close()
        database.dispose()

    app = FastAPI(
        title="QUASAR submission API",
        version="1",
        description="Miners submit kernels (directly or by commit-reveal); validators fetch work, report "
        "measured results; the leaderboard ranks the validators' stake-weighted consensus. "
        "State-changing requests are signed with btauth/1 (bittensor.http_auth) for the hotkey "
        "GET /health shows.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.reads = reads  # the read cache, for operators' and tests' inspection

    # --- dependencies ---

    async def client_ip(request: Request) -> str:  # async: pure and quick, no trip to the thread pool
        peer = request.client.host if request.client else None
        return rules.address_key(rules.client_ip(peer, request.headers.getlist("x-forwarded-for"), trusted))

    async def raw_body(request: Request) -> bytes:
        return await request.body()

    def authenticate(request: Request, body: bytes, ip: str, miner: bool) -> Authenticated:
        """The signature is verified here; the chain, the nonce and bans are checked by the service,
        the nonce and bans in the transaction of what the request asks for."""
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        query = request.scope.get("query_string", b"").decode("latin-1")
        target = auth.request_target(raw_path.decode("latin-1"), query)
        noted = NoteNonce()
        hotkey = auth.authenticate(
            request.headers,
            body,
            method=request.method,
            target=target,
            self_hotkey=config.api_hotkey,
            nonce_store=noted,
        )
        assert noted.nonce_ns is not None, "verify() notes the nonce of every request it accepts"
        return Authenticated(hotkey, noted.nonce_ns, ip, miner, registered if miner else permitted)

    async def authenticated(request: Request, body: bytes, ip: str, miner: bool) -> Authenticated:
        """``authenticate`` on the event loop (CPU only: the signature); a refusal for the clock alone
        goes to ``clocks`` in a thread, as it reads the chain (quasar/api/clockwatch.py)."""
        try:
            return authenticate(request, body, ip, miner)
        except auth.ClockRefusal as refusal:
            if clocks is not None:
                await run_in_threadpool(clocks.refused, refusal, registered if miner else permitted)
            raise

    # The handler's thread does the rest.
    async def miner(
        request: Request, body: Annotated[bytes, Depends(raw_body)], ip: Annotated[str, Depends(client_ip)]
    ) -> Authenticated:
        return await authenticated(request, body, ip, miner=True)

    async def validator(
        request: Request, body: Annotated[bytes, Depends(raw_body)], ip: Annotated[str, Depends(client_ip)]
    ) -> Authenticated:
        return await authenticated(request, body, ip, miner=False)

    MinerCaller = Annotated[Authenticated, Depends(miner)]
    ValidatorCaller = Annotated[Authenticated, Depends(validator)]
    HotkeyFilter = Annotated[str | None, Query(pattern=schemas.HOTKEY_PATTERN, description="only this hotkey")]
    Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
    RoundId = Annotated[int | None, Query(ge=0, le=2**40, description="a round; default the current one")]

    def route(
        method: str, path: str, model: type[BaseModel], tag: str, status_code: int | None = None
    ) -> Callable[[DecoratedCallable], DecoratedCallable]:
        """Declare a JSON route answering ``model``: every route documents the error bodies of
        :data:`ERRORS` and refuses unknown query parameters (:data:`STRICT_QUERY`)."""
        return app.api_route(
            path,
            methods=[method],
            response_model=model,
            status_code=status_code,
            responses=ERRORS,
            dependencies=STRICT_QUERY,
            tags=[tag],
        )

    # --- public reads ---

    @route("GET", "/health", schemas.Health, "public")
    def health() -> schemas.Health:
        """Liveness, this API's hotkey (the receiver to sign for) and the commit-reveal parameters."""
        return schemas.Health(
            status="ok",
            api_hotkey=config.api_hotkey,
            netuid=chain.netuid,
            current_block=service.current_block(),
            blocks_until_reveal=config.blocks_until_reveal,
            reveal_window_blocks=config.reveal_window_blocks,
            round_blocks=config.round_blocks,
            server_time=auth.freshness_clock_ns() / 1e9,
        )

    # The leaderboard and the current round are cached per chain block (quasar.api.readcache).

    @route("GET", "/get_current_round", schemas.RoundInfo, "public")
    async def get_current_round(request: Request) -> Response:
        """The current round: a fixed number of chain blocks (ROUND_BLOCKS)."""
        return await reads.response(request, service.current_round, {})

    @route("GET", "/pending_reveals", schemas.PendingReveals, "public")
    def pending_reveals(hotkey: HotkeyFilter = None, limit: Limit = MAX_PAGE) -> schemas.PendingReveals:
        """Commitments not yet revealed whose reveal window has not closed."""
        return service.pending_reveals(hotkey, limit)

    @route("GET", "/get_submission_stats", schemas.SubmissionStats, "public")
    def get_submission_stats(hotkey: HotkeyFilter = None) -> schemas.SubmissionStats:
        """Counts of submissions, commitments and reports."""
        return service.stats(hotkey)

    @route("GET", "/leaderboard", schemas.Leaderboard, "public")
    async def leaderboard(request: Request, round_id: RoundId = None) -> Response:
        """A round ranked from the validators' stake-weighted consensus (docs/rules.md §5); default the
        current round (one that has not begun: 422). Reports count from the chain block after they arrive."""
        past = service.past_round(round_id, "round_id")
        return await reads.response(request, lambda: service.leaderboard(round_id), {"round_id": round_id}, past)

    @route("GET", "/validators", schemas.ValidatorAgreements, "public")
    async def validators(request: Request, round_id: RoundId = None) -> Response:
        """Each validator's weight in the consensus, and how its reports on a round's submissions
        compare with the settled consensus (default the current round; one that has not begun: 422)."""
        past = service.past_round(round_id, "round_id")
        return await reads.response(
            request, lambda: service.validator_agreement(round_id), {"round_id": round_id}, past
        )

    @route("GET", "/validators/{hotkey}/reports", schemas.ValidatorReports, "public")
    def validator_reports(
        hotkey: Annotated[str, Path(pattern=schemas.HOTKEY_PATTERN)],
        after_id: Annotated[int, Query(ge=0, le=schemas.MAX_ID)] = 0,
        limit: Limit = MAX_PAGE,
    ) -> schemas.ValidatorReports:
        """A validator's reports with an id above ``after_id``, oldest first, each with its submission
        (how the processes of one validator hotkey share their results)."""
        return service.validator_reports(hotkey, after_id, limit)

    # --- submission status (public; an unrevealed commitment shows only its hash: quasar/api/status.py) ---

    status_reader = StatusReader(service)
    Offset = Annotated[int, Query(ge=0, le=2**40)]

    @route("GET", "/submissions/{submission_id}", schemas.SubmissionStatus, "public")
    def submission_status(submission_id: Annotated[int, Path(ge=1, le=schemas.MAX_ID)]) -> schemas.SubmissionStatus:
        """A submission's state, and per validator that reported: verdict, figures per length, reasons."""
        status = status_reader.submission(submission_id)
        if status is None:
            raise ApiError(404, f"no submission {submission_id}")
        return status

    @route("GET", "/miners/{hotkey}/submissions", schemas.SubmissionPage, "public")
    def miner_submissions(
        hotkey: Annotated[str, Path(pattern=schemas.HOTKEY_PATTERN)], limit: Limit = 20, offset: Offset = 0
    ) -> schemas.SubmissionPage:
        """A miner's submissions with their status, newest first (``limit``/``offset`` page them)."""
        return status_reader.submissions(hotkey, limit, offset)

    app.include_router(dashboard_router(service, status_reader, reads))

    # --- miners (signed, registered hotkey, IP not banned) ---

    def submit(payload: schemas.SubmitKernelRequest, caller: Authenticated) -> schemas.SubmissionAccepted:
        return service.submit_direct(caller.hotkey, caller.client_ip, payload, caller)

    # The reference of the submission fast lane (quasar/api/fastlane.py), which answers most of its requests.
    @route("POST", "/submit_kernel", schemas.SubmissionAccepted, "miners", status_code=201)
    def submit_kernel(payload: schemas.SubmitKernelRequest, caller: MinerCaller) -> schemas.SubmissionAccepted:
        """Direct submission, evaluable at once."""
        return submit(payload, caller)

    @route("POST", "/commit_submission", schemas.CommitAccepted, "miners", status_code=201)
    def commit_submission(payload: schemas.CommitRequest, caller: MinerCaller) -> schemas.CommitAccepted:
        """Commit ``sha256(salt + fork_url + commit_hash)``; its time is the submission's time."""
        return service.commit(caller.hotkey, caller.client_ip, payload, caller)

    @route("POST", "/reveal_submission", schemas.SubmissionAccepted, "miners")
    def reveal_submission(payload: schemas.RevealRequest, caller: MinerCaller) -> schemas.SubmissionAccepted:
        """Reveal a commitment after BLOCKS_UNTIL_REVEAL blocks, inside the reveal window."""
        return service.reveal(caller.hotkey, caller.client_ip, payload, caller)

    # --- validators (signed, validator permit) ---

    @route("GET", "/validator/pending", schemas.WorkBatch, "validators")
    def validator_pending(caller: ValidatorCaller, limit: Limit = 10) -> schemas.WorkBatch:
        """Submissions this validator has not reported on, leased to it for EVALUATION_LEASE_S."""
        return service.fetch_work(caller.hotkey, limit, caller)

    @route("POST", "/validator/report", schemas.ReportAccepted, "validators", status_code=201)
    def validator_report(payload: schemas.ReportRequest, caller: ValidatorCaller) -> schemas.ReportAccepted:
        """One validator's result for a submission it fetched (once per submission)."""
        return service.report(caller.hotkey, payload, caller)

    # --- errors ---

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in error.errors()]
        return JSONResponse({"detail": "invalid request: " + "; ".join(problems)[:2000]}, status_code=422)

    async def mapped_error(request: Request, error: Exception) -> JSONResponse:
        return error_response(error, request.method, request.url.path)

    for error_type in (ApiError, auth.AuthFailure, DatabaseBusy, OperationalError, ChainError, Exception):
        app.add_exception_handler(error_type, mapped_error)

    app.add_middleware(BodySizeLimit, limit=MAX_BODY_BYTES)
    if fast_lane:

        async def authenticate_miner(request: Request, body: bytes) -> Authenticated:
            # Not ``miner``: a request refused here goes on to the route, whose ``miner`` counts a
            # refusal for the clock (``clocks``): counted here too, it cost two reads of the chain.
            return authenticate(request, body, await client_ip(request), miner=True)

        app.add_middleware(
            SubmitFastLane,
            authenticate=authenticate_miner,
            submit=submit,
            threads=lane_threads,
            max_body_bytes=MAX_BODY_BYTES,
        )
    app.add_middleware(reads.middleware)  # a cached read skips everything else
    app.add_middleware(SecurityHeaders)  # outermost: on every response
    return app
