"""Logging never prints a configured secret."""

import http.server
import io
import logging
import threading

import httpx

from quasar.log import setup_logging


def test_secret_values_are_masked_in_log_output():
    stream = io.StringIO()
    setup_logging(debug=False, secrets=["tok_12345"], stream=stream)
    logging.getLogger("quasar.test").info("pushing with token %s to %s", "tok_12345", "origin")
    output = stream.getvalue()
    assert "tok_12345" not in output
    assert "pushing with token *** to origin" in output


def test_http_requests_are_logged_only_when_debugging():
    """httpx logs every request at INFO; a validator polling the API would print one line a second."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *args: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        for debug in (False, True):
            stream = io.StringIO()
            setup_logging(debug=debug, stream=stream)
            httpx.get(url)
            assert ("HTTP Request: GET" in stream.getvalue()) == debug, stream.getvalue()
    finally:
        server.shutdown()
        setup_logging(stream=io.StringIO())
