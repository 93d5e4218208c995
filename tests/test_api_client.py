"""The API client against real HTTP servers on 127.0.0.1 that answer 200 with something other than the
API's JSON (a proxy's HTML page, an API of another version): a clear ApiClientError, never a
JSONDecodeError or a pydantic ValidationError escaping into a miner's or validator's loop."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from quasar.api.client import MAX_DETAIL_CHARS, ApiClient, ApiClientError, Claim
from quasar.cutoff import MAX_QUOTED_CHARS
from quasar.localnet.host import make_wallet
from servers import accept_connections, read_head, serving

# A maintenance page as a reverse proxy serves it, far longer than an error message may quote.
PROXY_PAGE = (
    "<html><head><title>Down for maintenance</title></head><body>" + "<p>back soon</p>" * 5000 + "</body></html>"
)


async def proxy_page(request):
    return HTMLResponse(PROXY_PAGE)


async def other_version(request):
    return JSONResponse({"status": "ok", "current_block": "soon"})


@pytest.fixture(scope="module")
def proxy_url():
    with serving(Starlette(routes=[Route("/{path:path}", proxy_page)])) as port:
        yield f"http://127.0.0.1:{port}"


def test_a_200_that_is_not_json_is_an_api_client_error_naming_the_endpoint(proxy_url):
    with ApiClient(proxy_url) as client, pytest.raises(ApiClientError) as raised:
        client.miner_submissions("5" + "a" * 47, limit=5)
    message = str(raised.value)
    assert message.startswith(
        f"GET {proxy_url}/miners/5{'a' * 47}/submissions answered 200 with a body that is not JSON "
        "(text/html; charset=utf-8): <html><head><title>Down for maintenance</title>"
    )
    assert raised.value.status == 0  # no usable answer: callers retry, as when the API is unreachable
    assert len(message) < 3 * MAX_QUOTED_CHARS + 200  # the page's 80 KB are not in the log


def test_an_api_out_of_reach_is_said_with_the_cure():
    """A validator whose API (the one the subnet owner published) did not answer logged at each
    step 'fetch failed; going on: ApiClientError: cannot reach the API at URL: [Errno 111]
    Connection refused', and nothing of what to check."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"  # nothing listens once it is closed
    with ApiClient(url) as client, pytest.raises(ApiClientError) as raised:
        client.health()
    message = str(raised.value)
    assert raised.value.status == 0 and message.startswith(f"cannot reach the API at {url}: "), message
    assert "Connection refused" in message, message
    assert message.endswith(
        "; check this host's network, and that the API runs at that address (VALIDATOR_API_URL, "
        "else the URL the subnet owner published on chain)"
    ), message


def test_json_that_is_not_the_endpoints_model_is_an_api_client_error_saying_what_is_wrong():
    with (
        serving(Starlette(routes=[Route("/health", other_version)])) as port,
        ApiClient(f"http://127.0.0.1:{port}") as client,
    ):
        with pytest.raises(ApiClientError) as raised:
            client.health()
    message = str(raised.value)
    assert message.startswith(f"GET http://127.0.0.1:{port}/health answered 200 with JSON that is not a Health (")
    assert "current_block: Input should be a valid integer" in message and raised.value.status == 0


# --- a hostile API: answers that never end, never fit, or are not what an error is ---


class RawServer:
    """A TCP server on 127.0.0.1 that reads one request per connection and answers with ``answer(conn)``,
    counting the bytes it managed to send (``sent``)."""

    def __init__(self, answer):
        self.answer = answer
        self.sent = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        accept_connections(self.sock, self._handle)

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            if not read_head(conn):
                return
            try:
                self.answer(conn, self)
            except OSError:
                pass  # the client hung up: what the limits are for

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self.sock.close()


def trickle(conn: socket.socket, server: RawServer, data: bytes, every_s: float = 0.2) -> None:
    for index in range(len(data)):
        server.send(conn, data[index : index + 1])
        time.sleep(every_s)


def trickled_status_line(conn, server):
    trickle(conn, server, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + b"x-padding: 1\r\n" * 1000)


def trickled_body(conn, server):
    body = b'{"items": [], "lease_seconds": 1}' + b" " * 100_000
    server.send(conn, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
    trickle(conn, server, body)


def call_within(call, limit_s: float):
    """Run ``call`` in a thread; what it raised, or a failure when it is still running after ``limit_s``."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # handed to the test
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"the call was still waiting after {limit_s:g} s"
    return raised[0] if raised else None


@pytest.mark.parametrize("answer", [trickled_status_line, trickled_body], ids=["status line", "body"])
def test_an_answer_trickled_a_byte_at_a_time_ends_at_the_clients_timeout(answer, tmp_path):
    """httpx's timeout holds per read: a byte every 0.2 s under a 2 s timeout kept the validator's
    loop (its weights included) waiting for as long as the API pleased."""
    server = RawServer(answer)
    wallet = make_wallet(tmp_path, "validator")
    try:
        with ApiClient(server.url, wallet, api_hotkey=wallet.hotkey.ss58_address, timeout=2.0) as client:
            started = time.monotonic()
            error = call_within(lambda: client.fetch_work(limit=1), 15.0)
        assert isinstance(error, ApiClientError) and error.status == 0, error
        assert "took longer than 2 s" in str(error)
        assert time.monotonic() - started < 5.0
    finally:
        server.close()


def endless_json(conn, server):
    server.send(conn, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    block = b'{"items": [], "lease_seconds": 1, "x": "' + b"a" * (1 << 20)
    while server.sent < 512 << 20:
        server.send(conn, b"%x\r\n%s\r\n" % (len(block), block))


def declared_huge(conn, server):
    server.send(conn, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (10 << 30))
    while server.sent < 512 << 20:
        server.send(conn, b" " * (1 << 20))


@pytest.mark.parametrize("answer", [endless_json, declared_huge], ids=["streamed", "declared length"])
def test_an_answer_over_the_size_limit_is_refused_without_being_read_whole(answer):
    """The client read whatever the API sent into memory (an answer of 400 MB took the validator
    to 1.3 GB): it stops reading at ``max_answer_bytes``."""
    server = RawServer(answer)
    try:
        with ApiClient(server.url, max_answer_bytes=1 << 20) as client, pytest.raises(ApiClientError) as raised:
            client.health()
        assert raised.value.status == 0
        assert f"GET {server.url}/health answered with more than 1,048,576 bytes" in str(raised.value)
        time.sleep(0.5)
        assert server.sent < 64 << 20
    finally:
        server.close()


async def nested(request):
    return Response(b"[" * 100_000 + b"]" * 100_000, media_type="application/json")


async def list_error(request):
    return JSONResponse([1, 2], status_code=500)


async def long_detail(request):
    return JSONResponse(
        {"detail": "busy\n2026-01-01 INFO quasar.validator.loop: forged" + " x" * 1_000_000}, status_code=503
    )


async def compressed(request):
    # An encoding the client did not ask for, named at length: quoted on one short line.
    return Response(b"\x1f\x8b", headers={"Content-Encoding": "gzip, " + "br, " * 2000 + "gzip"})


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        (nested, "is not JSON"),
        (list_error, "500: [1,2]"),
        (long_detail, "503: busy 2026-01-01 INFO quasar.validator.loop: forged x x"),
        (compressed, "/health answered compressed (gzip, br, br, "),
    ],
    ids=[
        "JSON nested past the parser's depth",
        "an error that is not an object",
        "an error's long detail",
        "a compressed answer",
    ],
)
def test_an_unusable_answer_is_an_api_client_error_of_one_short_line(endpoint, expected):
    """JSON nested too deep (RecursionError) and an error body that is a list (AttributeError)
    escaped the client, ending a miner's start under pm2; an error's detail was quoted whole, lines
    and all (5 MB logged per validator step, and log lines forged)."""
    with (
        serving(Starlette(routes=[Route("/health", endpoint)])) as port,
        ApiClient(f"http://127.0.0.1:{port}") as client,
        pytest.raises(ApiClientError) as raised,
    ):
        client.health()
    message = str(raised.value)
    assert expected in message and "\n" not in message
    assert len(message) <= MAX_DETAIL_CHARS + 5  # "503: " and the detail


BAD_ITEMS = 2_000_000
# Two million zeros for reports, in 3.8 MiB: far under the size limit.
MANY_BAD_ITEMS = ('{"validator_hotkey": "x", "reports": [' + ",".join(["0"] * BAD_ITEMS) + "]}").encode()


async def many_bad_items(request):
    return Response(MANY_BAD_ITEMS, media_type="application/json")


def test_attack_an_answer_of_millions_of_bad_items_is_refused_at_the_first(tmp_path):
    """Pydantic reported every bad item of a list, and the client listed them all to show three: a
    lying API's 3.8 MiB of two million zeros took 8 s and 2.6 GB to refuse, its 32 MiB 21 GB (the
    OOM killer's, under pm2 a restart, and the same answer at the next step)."""
    route = Route(f"/validators/{'5' * 48}/reports", many_bad_items)
    with serving(Starlette(routes=[route])) as port, ApiClient(f"http://127.0.0.1:{port}") as client:
        started = time.monotonic()
        with pytest.raises(ApiClientError) as raised:
            client.validator_reports("5" * 48)
        assert time.monotonic() - started < 2.0
    assert "is not a ValidatorReports (1 problem(s): reports.0: Input should be a valid dictionary" in str(raised.value)


def test_attack_a_redirect_never_takes_a_miners_signed_claim_or_its_requests_elsewhere(tmp_path):
    """A taken-over API answering 307 would, were it followed, have the miner send its signed claim
    (its fork and commit before they are public, under commit-reveal) and its status requests to a
    host it names. The redirect is an error naming the endpoint; the other host gets nothing."""
    elsewhere: list[str] = []

    async def record(request):
        elsewhere.append(f"{request.method} {request.url.path} {(await request.body())[:60]!r}")
        return JSONResponse({})

    async def redirect(request):
        return Response(status_code=307, headers={"Location": f"{other}{request.url.path}"})

    wallet = make_wallet(tmp_path / "wallets", "miner")
    with (
        serving(Starlette(routes=[Route("/{path:path}", record, methods=["GET", "POST"])])) as other_port,
        serving(Starlette(routes=[Route("/{path:path}", redirect, methods=["GET", "POST"])])) as port,
        ApiClient(f"http://127.0.0.1:{port}", wallet, api_hotkey=wallet.hotkey.ss58_address) as client,
    ):
        other = f"http://127.0.0.1:{other_port}"
        calls = {
            "submit_kernel": lambda: client.submit_kernel(Claim("https://github.com/a/fla", "c" * 40, 1e6), 100_000),
            "miner_submissions": lambda: client.miner_submissions(wallet.hotkey.ss58_address),
        }
        for name, call in calls.items():
            with pytest.raises(ApiClientError) as raised:
                call()
            assert "answered 307" in str(raised.value), name
    assert elsewhere == []
