"""The validator's side of logit verification: challenge a miner's inference server and judge it.

Any failure to get a well-formed answer in time (unreachable, timeout, non-200, not JSON, wrong
fields or lengths) is a failed check whose reason says which; a well-formed answer is judged by
:func:`quasar.logits.verify_generation` against the validator's own reference model.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import requests

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
    """The outcome of one challenge; ``elapsed_sec`` is the round trip the validator measured."""

    passed: bool
    reason: str
    cosine: float | None = None
    max_abs_diff: float | None = None
    elapsed_sec: float | None = None


class _Malformed(Exception):
    pass


def _fetch(signed: auth.SignedRequest, timeout_s: float, max_bytes: int) -> tuple[int, bytes]:
    """POST and read the whole answer within ``timeout_s`` (checked between chunks) and ``max_bytes``.

    A server dribbling bytes can hold one read up to ``timeout_s``, so the worst case is about
    twice ``timeout_s``; it still fails as too slow.
    """
    deadline = time.monotonic() + timeout_s
    with requests.post(
        signed.url, data=signed.body, headers=signed.headers, timeout=timeout_s, stream=True, allow_redirects=False
    ) as response:
        chunks, size = [], 0
        for chunk in response.iter_content(_CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise _Malformed(f"answer larger than {max_bytes} bytes")
            if time.monotonic() > deadline:
                raise requests.Timeout()
            chunks.append(chunk)
        return response.status_code, b"".join(chunks)


def _parse_answer(body: bytes, challenge: Challenge, vocab_size: int) -> tuple[list[int], list[float]]:
    try:
        answer = json.loads(body)
    except ValueError:
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
    return tokens, logits


def _detail(body: bytes) -> str:
    try:
        detail = json.loads(body).get("detail", "")
    except (ValueError, AttributeError):
        detail = body.decode("utf-8", "replace")
    return str(detail)[:_MAX_DETAIL_CHARS]


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
    except requests.Timeout:
        return LogitCheck(
            False, f"no complete answer from {url} within {timeout_s:g} s", elapsed_sec=time.monotonic() - started
        )
    except requests.ConnectionError as error:
        return LogitCheck(
            False, f"miner endpoint {url} unreachable: {type(error).__name__}", elapsed_sec=time.monotonic() - started
        )
    except (requests.RequestException, _Malformed) as error:
        return LogitCheck(
            False, f"bad answer from {url}: {error or type(error).__name__}", elapsed_sec=time.monotonic() - started
        )
    elapsed = time.monotonic() - started
    if status != 200:
        return LogitCheck(False, f"miner endpoint answered HTTP {status}: {_detail(body)}", elapsed_sec=elapsed)
    try:
        tokens, logits = _parse_answer(body, challenge, reference_model.vocab_size)
    except _Malformed as error:
        return LogitCheck(False, f"malformed answer: {error}", elapsed_sec=elapsed)
    comparison = verify_generation(reference_model, challenge, tokens, logits, thresholds)
    log.debug("logit check of %s: %s", miner_hotkey, comparison.reason)
    return LogitCheck(comparison.passed, comparison.reason, comparison.cosine, comparison.max_abs_diff, elapsed)
