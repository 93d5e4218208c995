"""The validator's side of logit verification: challenge a miner's inference server and judge it.

Any failure to get a well-formed answer in time (unreachable, timeout, non-200, not JSON, wrong
fields or lengths) is a failed check whose reason says which; a well-formed answer is judged by
:func:`quasar.logits.verify_generation` against the validator's own reference model.

The miner's server may send anything, so the exchange is plain HTTP/1.1 (http.client) under one
deadline: every read and write of the socket waits at most until ``timeout_s`` after the request
began, so a server dripping a byte at a time cannot stretch a check (per-read timeouts, as
requests has, let one check run forever). No redirect is followed, no proxy or credentials of the
environment are used, and the answer must come uncompressed and within a size bound.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from quasar import auth
from quasar.logits import Challenge, LogitThresholds, ReferenceModel, verify_generation

log = logging.getLogger(__name__)

# JSON bytes per logit value ("-12.345678901234567," is 20) with room, plus the rest of the answer.
_BYTES_PER_LOGIT = 32
_BYTES_PER_TOKEN = 12
_ANSWER_OVERHEAD_BYTES = 4096
_CHUNK_BYTES = 1 << 16
_MAX_DETAIL_CHARS = 300


@dataclass(frozen=True)
class LogitCheck:
    """The outcome of one challenge; ``elapsed_sec`` is the round trip the validator measured,
    ``status`` the HTTP status of the miner's answer when one came."""

    passed: bool
    reason: str
    cosine: float | None = None
    max_abs_diff: float | None = None
    elapsed_sec: float | None = None
    status: int | None = None


class _Malformed(Exception):
    pass


class _Unreachable(Exception):
    pass


class _DeadlineSocket(socket.socket):
    """A socket whose reads and writes end by ``deadline`` (``time.monotonic()``), raising
    :class:`TimeoutError` after it, however the peer paces its bytes. http.client reads through
    ``makefile`` (``recv_into``) and writes with ``sendall``: those are the calls bounded."""

    deadline = 0.0

    def _arm(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the answer's deadline passed")
        self.settimeout(remaining)

    def recv_into(self, buffer, nbytes=0, flags=0):
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data, flags=0):
        self._arm()
        return super().sendall(data, flags)


def _connect(host: str, port: int, deadline: float) -> _DeadlineSocket:
    remaining = max(deadline - time.monotonic(), 0.001)
    try:
        plain = socket.create_connection((host, port), timeout=remaining)
    except TimeoutError:
        raise
    except OSError as error:
        raise _Unreachable(type(error).__name__) from None
    sock = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
    sock.deadline = deadline
    return sock


def _fetch(signed: auth.SignedRequest, timeout_s: float, max_bytes: int) -> tuple[int, bytes]:
    """POST and read the whole answer within ``timeout_s`` in all and ``max_bytes``.

    Raises TimeoutError past the deadline, :class:`_Unreachable` when no connection opens, and
    :class:`_Malformed` or ``http.client.HTTPException``/``OSError`` for a broken answer.
    """
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(signed.url)
    if parts.scheme != "http" or not parts.hostname:
        raise _Unreachable(f"not an http:// URL: {signed.url!r}")
    port = parts.port or 80
    connection = http.client.HTTPConnection(parts.hostname, port)  # never connects itself: it is given the socket
    connection.sock = _connect(parts.hostname, port, deadline)
    try:
        target = auth.request_target(parts.path or "/", parts.query)  # as auth.sign_request signed it
        # http.client asks for an uncompressed answer (Accept-Encoding: identity).
        connection.request(signed.method, target, body=signed.body, headers=signed.headers)
        response = connection.getresponse()
        encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise _Malformed(f"answer is compressed (Content-Encoding: {encoding[:40]}); send it uncompressed")
        chunks, size = [], 0
        while chunk := response.read(_CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise _Malformed(f"answer larger than {max_bytes} bytes")
            chunks.append(chunk)
        if response.length:  # http.client ends a body cut short quietly
            raise _Malformed(f"answer ended {response.length} bytes short of its Content-Length")
        return response.status, b"".join(chunks)
    finally:
        connection.close()


def _parse_answer(body: bytes, challenge: Challenge, vocab_size: int) -> tuple[list[int], list[float]]:
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
        raise _Malformed("answer is not JSON") from None
    if not isinstance(answer, dict):
        raise _Malformed("answer is not a JSON object")
    tokens, logits = answer.get("tokens"), answer.get("captured_logits")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise _Malformed("tokens is not a list of integers")
    if len(tokens) != challenge.gen_len:
        raise _Malformed(f"tokens has {len(tokens)} ids, expected gen_len {challenge.gen_len}")
    if not isinstance(logits, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in logits):
        raise _Malformed("captured_logits is not a list of numbers")
    if len(logits) != vocab_size:
        raise _Malformed(f"captured_logits has {len(logits)} values, expected the vocabulary size {vocab_size}")
    try:
        values = [float(x) for x in logits]  # an integer past float's range cannot be a logit
    except OverflowError:
        raise _Malformed("captured_logits holds an integer too large for a float") from None
    return tokens, values


def _printable(text: str) -> str:
    """``text`` cut to ``_MAX_DETAIL_CHARS`` with every unprintable character written as its escape
    (``\\n``, ``\\x1b``): a miner's words go into the validator's log, one line that says what
    it said, never a forged line or a terminal escape."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[:_MAX_DETAIL_CHARS])


def _detail(body: bytes) -> str:
    try:
        detail = json.loads(body).get("detail", "")
    except (ValueError, AttributeError, RecursionError):
        detail = body.decode("utf-8", "replace")
    return _printable(str(detail))


def verify_miner_logits(
    endpoint_url: str,
    miner_hotkey: str,
    wallet,
    reference_model: ReferenceModel,
    challenge: Challenge,
    timeout_s: float,
    thresholds: LogitThresholds,
) -> LogitCheck:
    """Send ``challenge`` signed by ``wallet`` to the miner at ``endpoint_url`` and judge the answer.

    ``endpoint_url`` is the server's base URL (``http://host:port``); the request is addressed to
    ``miner_hotkey``, which the server checks is its own. Never raises for the miner's faults.
    """
    url = endpoint_url.rstrip("/") + "/inference"
    signed = auth.sign_request(wallet, "POST", url, miner_hotkey, challenge.payload())
    max_bytes = (
        reference_model.vocab_size * _BYTES_PER_LOGIT + challenge.gen_len * _BYTES_PER_TOKEN + _ANSWER_OVERHEAD_BYTES
    )
    started = time.monotonic()
    try:
        status, body = _fetch(signed, timeout_s, max_bytes)
    except TimeoutError:
        return LogitCheck(
            False,
            f"no complete answer from {url} within {round(timeout_s, 2):g} s",
            elapsed_sec=time.monotonic() - started,
        )
    except _Unreachable as error:
        return LogitCheck(False, f"miner endpoint {url} unreachable: {error}", elapsed_sec=time.monotonic() - started)
    except (http.client.HTTPException, OSError, _Malformed) as error:
        reason = _printable(str(error)) or type(error).__name__
        return LogitCheck(False, f"bad answer from {url}: {reason}", elapsed_sec=time.monotonic() - started)
    elapsed = time.monotonic() - started
    if status != 200:
        reason = f"miner endpoint answered HTTP {status}: {_detail(body)}"
        return LogitCheck(False, reason, elapsed_sec=elapsed, status=status)
    try:
        tokens, logits = _parse_answer(body, challenge, reference_model.vocab_size)
    except _Malformed as error:
        return LogitCheck(False, f"malformed answer: {error}", elapsed_sec=elapsed, status=status)
    comparison = verify_generation(reference_model, challenge, tokens, logits, thresholds)
    log.debug("logit check of %s: %s", miner_hotkey, comparison.reason)
    return LogitCheck(comparison.passed, comparison.reason, comparison.cosine, comparison.max_abs_diff, elapsed, status)
