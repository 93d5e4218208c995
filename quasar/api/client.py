"""A client of the submission API for miners, validators and tools: signs each request with the
wallet's hotkey for the API's hotkey and returns the typed response bodies of ``quasar.api.schemas``.

The API's host may be taken over, or a process pointed at a fake one, so an answer is bounded: the
whole exchange ends within the client's timeout (counted in all, not per read) and the body within
``max_answer_bytes``; what is not the endpoint's JSON is an :class:`ApiClientError` of one short
line. Redirects are never followed (a signed request goes only to ``base_url``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError
from pydantic_core import SchemaValidator

from quasar.api import schemas
from quasar.auth import sign_request
from quasar.cutoff import AnswerLate, AnswerRefused, exchange, quoted
from quasar.errors import QuasarError

Model = TypeVar("Model", bound=BaseModel)

MAX_PROBLEMS_SHOWN = 3
# An API refusal's detail, as callers log it and show it to users: one line, at most this long.
MAX_DETAIL_CHARS = 1000
# The largest answer read (the API's largest, a page of submissions with every validator's
# verdicts, is a few megabytes).
MAX_ANSWER_BYTES = 32 * 1024 * 1024


# Core schema types that hold many values; an answer's validation stops at the first bad one of each.
_COLLECTIONS = frozenset({"list", "tuple", "set", "frozenset", "dict"})


def _failing_fast(schema: Any) -> Any:
    """A copy of the pydantic core ``schema`` in which every list, tuple, set and dict stops at its
    first bad item (``fail_fast``)."""
    if isinstance(schema, dict):
        copied = {key: _failing_fast(value) for key, value in schema.items()}
        if copied.get("type") in _COLLECTIONS:
            copied["fail_fast"] = True
        return copied
    if isinstance(schema, list):
        return [_failing_fast(item) for item in schema]
    return schema


@functools.cache
def _answer_validator(model: type[BaseModel]) -> SchemaValidator:
    """``model``'s validator, failing fast. Pydantic otherwise reports every bad item: a 32 MiB answer
    of 16 million bad items took 21 GB and two minutes to refuse, of which three are shown."""
    # Not prebuilt: pydantic-core would reuse each model's own validator, which does not fail fast.
    return SchemaValidator(_failing_fast(model.__pydantic_core_schema__), _use_prebuilt=False)


class ApiClientError(QuasarError):
    """The API refused a request (``status`` and its ``detail``), or gave no usable answer (status 0:
    it could not be reached, or its answer was not the JSON the endpoint returns: callers retry)."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"{status}: {detail}" if status else detail)
        self.status = status
        self.detail = detail


def _by_length(figures: Mapping[int, float] | None) -> dict[str, float] | None:
    """Per-length figures as a JSON object (its keys are strings)."""
    return None if figures is None else {str(length): value for length, value in figures.items()}


@dataclass(frozen=True)
class Claim:
    """What a miner claims (``schemas.Claim``), the same in a direct submission and in a reveal: its
    fork at a commit, the tokens/sec it measured there and, optionally, its memory and per-length
    figures. Sent as given: the API checks it (and says what is wrong)."""

    fork_url: str
    commit_hash: str
    tokens_per_sec: float
    vram_mb: int | None = None
    benchmarks: Mapping[int, float] | None = None

    def payload(self) -> dict[str, Any]:
        """The JSON fields of ``schemas.Claim``."""
        return {
            "fork_url": self.fork_url,
            "commit_hash": self.commit_hash,
            "tokens_per_sec": self.tokens_per_sec,
            "vram_mb": self.vram_mb,
            "benchmarks": _by_length(self.benchmarks),
        }


class ApiClient:
    """Talks to the API at ``base_url`` as ``wallet``'s hotkey (a bittensor Wallet or keypair).

    ``api_hotkey`` is the receiver to sign for; when omitted it is read once from ``GET /health``
    (pin it in configuration where the network path to the API is not trusted).
    """

    def __init__(
        self,
        base_url: str,
        wallet: Any = None,
        api_hotkey: str | None = None,
        timeout: float = 30.0,
        http: httpx.Client | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ):
        self.base_url = base_url.rstrip("/")
        self.wallet = wallet
        self._api_hotkey = api_hotkey
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes
        self.http = http or httpx.Client(timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def retarget(self, base_url: str, api_hotkey: str | None) -> None:
        """Talk to the API at ``base_url`` from the next request on, signing for ``api_hotkey`` (None:
        read from its ``GET /health``): where the subnet owner moved it (quasar/api/lookup.py)."""
        self.base_url = base_url.rstrip("/")
        self._api_hotkey = api_hotkey

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def api_hotkey(self) -> str:
        if self._api_hotkey is None:
            self._api_hotkey = self.health().api_hotkey
        return self._api_hotkey

    # --- plumbing ---

    def signed(
        self, method: str, path: str, payload: Any | None = None, extra_headers: Mapping[str, str] | None = None
    ) -> httpx.Response:
        """Send a request signed by the wallet's hotkey; ``path`` may carry a query string."""
        if self.wallet is None:
            raise ApiClientError(0, "this client has no wallet to sign with")
        request = sign_request(self.wallet, method, self.base_url + path, self.api_hotkey, payload)
        headers = {**request.headers, **(extra_headers or {})}
        return self._exchange(request.method, request.url, content=request.body, headers=headers)

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> httpx.Response:
        return self._exchange(
            "GET", self.base_url + path, params={k: v for k, v in (params or {}).items() if v is not None}
        )

    def _exchange(self, method: str, url: str, **options: Any) -> httpx.Response:
        """One request and its whole answer, within ``timeout`` in all and ``max_answer_bytes``
        (:func:`quasar.cutoff.exchange`); the answer is returned read (ApiClientError otherwise,
        status 0)."""
        where = f"{method} {httpx.URL(url).copy_with(query=None)}"
        try:
            return exchange(self.http, method, url, self.timeout, self.max_answer_bytes, **options)
        except AnswerLate:
            raise ApiClientError(0, f"{where}: the API took longer than {self.timeout:g} s to answer") from None
        except AnswerRefused as refusal:
            raise ApiClientError(0, f"{where} {refusal}") from None
        except httpx.HTTPError as error:
            raise ApiClientError(
                0,
                f"cannot reach the API at {self.base_url}: {error}; check this host's network, and that the API "
                "runs at that address (VALIDATOR_API_URL, else the URL the subnet owner published on chain)",
            ) from None

    @staticmethod
    def _parse(response: httpx.Response, model: type[Model]) -> Model:
        """``response``'s body as ``model``; ApiClientError for a refusal, and for a body that is not
        that JSON (a proxy's HTML page, an API of another version), naming the endpoint and what was
        wrong in a few words, never the whole body."""
        if response.status_code >= 400:
            try:
                body = response.json()
            except (ValueError, RecursionError):
                body = None
            detail = body.get("detail", response.text) if isinstance(body, dict) else response.text
            raise ApiClientError(response.status_code, quoted(str(detail), MAX_DETAIL_CHARS))
        where = f"{response.request.method} {response.request.url.copy_with(query=None)}"
        try:
            body = response.json()
        except (ValueError, RecursionError):
            kind = response.headers.get("content-type", "no content type")
            raise ApiClientError(
                0,
                f"{where} answered {response.status_code} with a body that is not JSON ({quoted(kind)}): "
                f"{quoted(response.text)}",
            ) from None
        try:
            return cast(Model, _answer_validator(model).validate_python(body))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(map(str, item['loc'])) or 'body'}: {item['msg']}"
                for item in error.errors(include_url=False, include_input=False)[:MAX_PROBLEMS_SHOWN]
            )
            raise ApiClientError(
                0,
                f"{where} answered {response.status_code} with JSON that is not a {model.__name__} "
                f"({error.error_count()} problem(s): {quoted(problems)})",
            ) from None

    # --- public ---

    def health(self) -> schemas.Health:
        return self._parse(self._get("/health"), schemas.Health)

    def clock_offset(self) -> float | None:
        """Seconds this host's clock is ahead of the API's (negative: behind), to within half the
        round trip of one ``GET /health``; None from an API that does not say its time."""
        sent = time.time()
        server_time = self.health().server_time
        return None if server_time is None else (sent + time.time()) / 2 - server_time

    def current_round(self) -> schemas.RoundInfo:
        return self._parse(self._get("/get_current_round"), schemas.RoundInfo)

    def pending_reveals(self, hotkey: str | None = None) -> schemas.PendingReveals:
        return self._parse(self._get("/pending_reveals", {"hotkey": hotkey}), schemas.PendingReveals)

    def stats(self, hotkey: str | None = None) -> schemas.SubmissionStats:
        return self._parse(self._get("/get_submission_stats", {"hotkey": hotkey}), schemas.SubmissionStats)

    def leaderboard(self, round_id: int | None = None) -> schemas.Leaderboard:
        return self._parse(self._get("/leaderboard", {"round_id": round_id}), schemas.Leaderboard)

    def validator_reports(self, hotkey: str, after_id: int = 0, limit: int = 100) -> schemas.ValidatorReports:
        """``hotkey``'s reports above ``after_id``, oldest first (``GET /validators/{hotkey}/reports``)."""
        return self._parse(
            self._get(f"/validators/{quote(hotkey, safe='')}/reports", {"after_id": after_id, "limit": limit}),
            schemas.ValidatorReports,
        )

    def validators(self, round_id: int | None = None) -> schemas.ValidatorAgreements:
        """Each validator's weight and agreement with the consensus in a round (``GET /validators``)."""
        return self._parse(self._get("/validators", {"round_id": round_id}), schemas.ValidatorAgreements)

    def submission_status(self, submission_id: int) -> schemas.SubmissionStatus:
        """A submission's state, verdicts, reasons and figures (``GET /submissions/{id}``)."""
        return self._parse(self._get(f"/submissions/{int(submission_id)}"), schemas.SubmissionStatus)

    def miner_submissions(self, hotkey: str, limit: int = 20, offset: int = 0) -> schemas.SubmissionPage:
        """A miner's submissions with their status, newest first (``GET /miners/{hotkey}/submissions``)."""
        return self._parse(
            self._get(f"/miners/{quote(hotkey, safe='')}/submissions", {"limit": limit, "offset": offset}),
            schemas.SubmissionPage,
        )

    # --- miners ---

    def submit_kernel(self, claim: Claim, target_sequence_length: int) -> schemas.SubmissionAccepted:
        """Submit a kernel directly (``POST /submit_kernel``): evaluable at once, its time is now."""
        payload = {**claim.payload(), "target_sequence_length": target_sequence_length}
        return self._parse(self.signed("POST", "/submit_kernel", payload), schemas.SubmissionAccepted)

    def commit(self, commitment_hash: str, target_sequence_length: int) -> schemas.CommitAccepted:
        payload = {"commitment_hash": commitment_hash, "target_sequence_length": target_sequence_length}
        return self._parse(self.signed("POST", "/commit_submission", payload), schemas.CommitAccepted)

    def reveal(self, submission_id: int, salt: str, claim: Claim) -> schemas.SubmissionAccepted:
        """Reveal commitment ``submission_id`` (``POST /reveal_submission``): the salt and what the
        commitment hides, with the claim."""
        payload = {**claim.payload(), "submission_id": submission_id, "commitment_salt": salt}
        return self._parse(self.signed("POST", "/reveal_submission", payload), schemas.SubmissionAccepted)

    # --- validators ---

    def fetch_work(self, limit: int = 10) -> schemas.WorkBatch:
        return self._parse(self.signed("GET", f"/validator/pending?limit={int(limit)}"), schemas.WorkBatch)

    def report(
        self,
        submission_id: int,
        verdict: str,
        correct: bool,
        logits_ok: bool | None = None,
        measured_tokens_per_sec: float | None = None,
        benchmarks: Mapping[int, float] | None = None,
        reasons: Sequence[str] = (),
        lengths: Sequence[Mapping[str, Any]] | None = None,
        content_hash: str | None = None,
    ) -> schemas.ReportAccepted:
        """Report on a fetched submission; ``lengths``: per-length figures (``schemas.ReportedLength``
        fields); ``content_hash``: of the fork's kernel files (quasar/originality.py)."""
        payload = {
            "submission_id": submission_id,
            "verdict": verdict,
            "correct": correct,
            "logits_ok": logits_ok,
            "measured_tokens_per_sec": measured_tokens_per_sec,
            "benchmarks": _by_length(benchmarks),
            "reasons": list(reasons),
        }
        if lengths is not None:
            payload["lengths"] = [dict(item) for item in lengths]
        if content_hash is not None:
            payload["content_hash"] = content_hash
        return self._parse(self.signed("POST", "/validator/report", payload), schemas.ReportAccepted)
