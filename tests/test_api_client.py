"""The API client against real HTTP servers on 127.0.0.1 that answer 200 with something other than the
API's JSON (a proxy's HTML page, an API of another version): a clear ApiClientError, never a
JSONDecodeError or a pydantic ValidationError escaping into a miner's or validator's loop."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from quasar.api.client import MAX_QUOTED_CHARS, ApiClient, ApiClientError
from servers import serving

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
