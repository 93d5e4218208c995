"""Property-based fuzzing of every endpoint from the API's own OpenAPI schema (schemathesis): valid and
invalid inputs, sent unsigned and signed by a registered hotkey (so body validation is reached, not
only the 401), must never get a 5xx. Runs against the real server on SQLite and on PostgreSQL: the app
in a thread, and ``python -m quasar.api serve --workers 2`` (the dev chain allows local fork paths)."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
import schemathesis
from bittensor import http_auth
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

from quasar.api.devdb import start_api_process

EXAMPLES_PER_OPERATION = 20


def body_bytes(kwargs: dict) -> bytes:
    if "json" in kwargs:
        return json.dumps(kwargs["json"]).encode()
    data = kwargs.get("data")
    if data is None:
        return b""
    return data if isinstance(data, bytes) else str(data).encode()


@pytest.fixture(params=[1, 2], ids=["in-thread", "2-workers"])
def fuzz_target(request, tmp_path, chain, wallets, database_url, start_api):
    """(base URL, wallets, API hotkey) of a server that accepts local fork paths."""
    api_hotkey = wallets["api"].hotkey.ss58_address
    if request.param == 1:
        api = start_api(allow_local_forks=True)
        yield api.url, wallets, api_hotkey
        return
    process, url = start_api_process(tmp_path, database_url, chain.path, api_hotkey, workers=request.param)
    yield url, wallets, api_hotkey
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)


@pytest.mark.slow
def test_no_endpoint_answers_5xx_to_fuzzed_requests(fuzz_target):
    url, wallets, api_hotkey = fuzz_target
    schema = schemathesis.openapi.from_dict(httpx.get(url + "/openapi.json").json())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 14  # the dashboard pages are not in the schema
    http = httpx.Client(timeout=30)
    seen: dict[int, int] = {}

    def send(case, sign: bool) -> None:
        kwargs = case.as_transport_kwargs(base_url=url)
        body = body_bytes(kwargs)
        headers = {k: v for k, v in kwargs.get("headers", {}).items() if k.lower() != "content-length"}
        request = http.build_request(
            kwargs["method"], kwargs["url"], params=kwargs.get("params"), headers=headers, content=body
        )
        if sign:
            signer = wallets["v1" if case.path.startswith("/validator") else "a"]
            target = request.url.raw_path.decode("ascii")
            request.headers.update(
                http_auth.sign(signer, method=request.method, path=target, body=body, receiver_ss58=api_hotkey)
            )
        response = http.send(request)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, (case.method, case.path, kwargs, response.text)
        assert "Traceback" not in response.text

    for operation in operations:
        for mode in GenerationMode:

            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode), sign=st.booleans())
            def fuzz(case, sign):
                send(case, sign)

            try:
                fuzz()
            except Unsatisfiable:
                # An operation without parameters or body has no invalid form to generate.
                assert mode is GenerationMode.NEGATIVE, operation.label
    http.close()
    # The signed half reached validation and the handlers, not only the signature check.
    assert seen.get(422, 0) > 0 and seen.get(401, 0) > 0 and any(200 <= status < 300 for status in seen), seen
