"""The public web dashboard, served by the API: the round's leaderboard, the round clock and the API's
health (``GET /``), a miner's history (``/dashboard/miners/{hotkey}``), a submission's page
(``/dashboard/submissions/{id}``) and the validators' agreement with the consensus
(``/dashboard/validators``).

Server-rendered HTML from the same service layer as the JSON endpoints (so it shows exactly what
they return, and nothing of an unrevealed commitment but its hash), Jinja2 templates shipped in
``quasar/api/templates`` with autoescaping on (fork URLs and reasons are the miners' own text),
CSS inline in the page and charts drawn here as SVG: the pages load nothing else.
A page is rendered once per chain block and kept (quasar.api.readcache), like the leaderboard's
JSON: a new verdict shows from the next block on.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from quasar import scoring
from quasar.api import schemas
from quasar.api.charts import NARROW, WIDE, Layout, Series, bar_chart, compact, line_chart
from quasar.api.readcache import BlockCache
from quasar.api.service import ApiError, SubmissionService
from quasar.api.status import StatusReader
from quasar.terminal import short_hotkey

TEMPLATES_DIR = Path(__file__).with_name("templates")
RECENT_SUBMISSIONS = 20
MINER_SUBMISSIONS = 50
STATE_LABELS = {
    "committed": "committed",
    "expired": "expired",
    "revealed": "revealed",
    "queued": "queued",
    "deferred": "deferred",
    "superseded": "superseded",
    "lapsed": "lapsed",
    "being_evaluated": "being evaluated",
    "awaiting_quorum": "awaiting quorum",
    "disputed": "disputed",
    "passed": "passed",
    "failed": "failed",
    "copy": "copy",
}
# fullmatch: "$" would also match before a trailing newline.
_HOTKEY = re.compile(schemas.HOTKEY_PATTERN.removeprefix("^").removesuffix("$"))
# The round a page shows (``?round=N``); the current one when absent.
RoundQuery = Annotated[int | None, Query(alias="round", ge=0, le=2**40)]
# The page of a miner's submissions (``?page=N``, MINER_SUBMISSIONS a page, newest first).
PageQuery = Annotated[int, Query(alias="page", ge=1, le=2**31)]
RoundRender = Callable[[int | None], HTMLResponse]
_ID = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit() also takes "²", which int() refuses


def count(value: int) -> str:
    """A count with thousands separators (``1,024``), as every figure on the pages."""
    return f"{value:,}"


def tokens(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def tokens_both(value: float | None) -> Markup:
    """The full figure, and a compact one that narrow screens show instead (``61.3M``)."""
    if value is None:
        return Markup("–")
    return Markup('<span class="full">{}</span><span class="compact">{}</span>').format(f"{value:,.0f}", compact(value))


def utc(timestamp: float | None) -> str:
    if timestamp is None:
        return "–"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M UTC")


def duration(seconds: float) -> str:
    """``3 d 04 h``, ``1 h 05 min``, ``12 min``, ``40 s``: the round clock."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days:,} d {hours:02d} h"
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min" if minutes else f"{secs} s"


def memory(megabytes: float | None) -> str:
    if megabytes is None:
        return "–"
    return f"{megabytes / 1024:,.2f} GiB" if megabytes >= 1024 else f"{megabytes:,.0f} MiB"


def yes_no(value: bool | None, unknown: str = "not checked") -> str:
    return unknown if value is None else ("passed" if value else "failed")


def sentence(text: str) -> str:
    """``text`` with its first letter capitalised and the rest as written (Jinja's ``capitalize``
    lowercases the rest, and a hotkey quoted in it with them)."""
    return text[:1].upper() + text[1:]


def percent(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.0f}%"


def _environment() -> Environment:
    environment = Environment(
        loader=FileSystemLoader(str(TEMPLATES_DIR)),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # The templates call each formatter by its function's name.
    environment.filters.update(
        {f.__name__: f for f in (count, tokens, tokens_both, utc, memory, yes_no, duration, percent, sentence)}
    )
    environment.filters.update(short=short_hotkey, state_label=lambda state: STATE_LABELS.get(state, state))
    # The rules the pages explain come from the code that applies them.
    environment.globals.update(place_shares=scoring.PLACE_SHARES)
    return environment


def distinct_reasons(status: schemas.SubmissionStatus) -> list[tuple[str, int]]:
    """Each reason the validators gave, once, with how many gave it (in the order first given)."""
    counts: dict[str, int] = {}
    for report in status.reports:
        for reason in dict.fromkeys(report.reasons):
            counts[reason] = counts.get(reason, 0) + 1
    return list(counts.items())


def responsive(draw: Callable[[Layout], str]) -> Markup:
    """A chart drawn for desktops and for phones; the page's CSS shows the one that fits (the charts
    escape their own labels)."""
    return Markup(f'<div class="chart-wide">{draw(WIDE)}</div><div class="chart-narrow">{draw(NARROW)}</div>')


def lengths_chart(status: schemas.SubmissionStatus) -> Markup | None:
    """Measured tokens/sec per length, one bar per validator (wrong lengths in red); None without figures."""
    lengths = sorted({item.seq_len for report in status.reports for item in report.lengths})
    if not lengths:
        return None
    series = []
    for report in status.reports:
        by_length = {item.seq_len: item for item in report.lengths}
        series.append(
            Series(
                name=f"validator {short_hotkey(report.validator_hotkey)}",
                values=[by_length[n].tokens_per_sec if n in by_length else None for n in lengths],
                failed=[n in by_length and by_length[n].correct is False for n in lengths],
            )
        )
    return responsive(
        lambda layout: bar_chart(
            f"submission {status.submission_id}: measured tokens/s per sequence length",
            [f"T={compact(n) if layout is NARROW else f'{n:,}'}" for n in lengths],
            series,
            "tokens/s",
            layout,
        )
    )


def history_chart(history: schemas.MinerHistory) -> Markup | None:
    """A miner's measured tokens/sec per round (failed rounds in red); None before any evaluation."""
    if not history.rounds:
        return None
    return responsive(
        lambda layout: line_chart(
            f"{short_hotkey(history.hotkey)}: measured tokens/s per round",
            [f"round {point.round_id}" for point in history.rounds],
            [point.measured_tokens_per_sec for point in history.rounds],
            "tokens/s",
            failed=[point.state == "failed" for point in history.rounds],
            layout=layout,
        )
    )


def dashboard_router(service: SubmissionService, status_reader: StatusReader, reads: BlockCache) -> APIRouter:
    """The dashboard's pages as a router for the API app (kept out of the OpenAPI schema); each page
    is rendered once per chain block and target, like the leaderboard's JSON (``reads``)."""
    router = APIRouter(include_in_schema=False)
    templates = _environment()

    def page(name: str, status_code: int = 200, **context) -> HTMLResponse:
        html = templates.get_template(name).render(health=_health(), round=_round(), **context)
        return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})

    def _health() -> dict:
        try:
            block = service.current_block()
        except ApiError as error:
            return {
                "ok": False,
                "detail": error.detail,
                "netuid": service.chain.netuid,
                "api_hotkey": service.config.api_hotkey,
            }
        return {"ok": True, "block": block, "netuid": service.chain.netuid, "api_hotkey": service.config.api_hotkey}

    def _round() -> schemas.RoundInfo | None:
        try:
            return service.current_round()
        except ApiError:
            return None

    def in_one_read(render: Callable[..., HTMLResponse]) -> Callable[..., HTMLResponse]:
        """``render`` with every read it makes in one database snapshot (one transaction)."""

        @functools.wraps(render)
        def rendered(*args: object) -> HTMLResponse:
            with service.database.read():
                return render(*args)

        return rendered

    def not_found(what: str) -> HTMLResponse:
        return page("error.html", 404, title="Not found", message=what)

    # Query parameters a page does not take are ignored (a link with tracking parameters still
    # works); the cache keys a page by the parameters it takes (quasar/api/readcache.py).

    def round_page(path: str) -> Callable[[RoundRender], RoundRender]:
        """Serve the decorated ``render(round_id)`` at ``path`` (``?round=N``, default the current
        round; a round that has not begun is a 422 page), cached by round (a past round among the
        cache's pooled targets) and read in one snapshot; the route takes the render's name."""

        def register(render: RoundRender) -> RoundRender:
            rendered = in_one_read(render)

            @router.get(path, response_class=HTMLResponse, name=render.__name__)
            async def serve(request: Request, round_id: RoundQuery = None) -> Response:
                try:
                    past = service.past_round(round_id, "round")
                except ApiError as error:
                    if error.status != 422:
                        raise
                    return await run_in_threadpool(page, "error.html", 422, title="No such round", message=error.detail)
                return await reads.page(request, lambda: rendered(round_id), {"round": round_id}, past)

            return render

        return register

    @round_page("/")
    def index(round_id: int | None) -> HTMLResponse:
        board = service.leaderboard(round_id)
        recent = status_reader.submissions(None, RECENT_SUBMISSIONS, 0)
        return page("index.html", title=f"Leaderboard, round {board.round_id}", board=board, recent=recent.submissions)

    @round_page("/dashboard/validators")
    def validators(round_id: int | None) -> HTMLResponse:
        agreements = service.validator_agreement(round_id)
        return page(
            "validators.html",
            title=f"Validators, round {agreements.round_id}",
            agreements=agreements,
            quorum=service.quorum,
        )

    @router.get("/dashboard/miners/{hotkey}", response_class=HTMLResponse)
    async def miner(request: Request, hotkey: str, page_number: PageQuery = 1) -> Response:
        return await reads.page(request, lambda: miner_page(hotkey, page_number), {"page": page_number})

    @in_one_read
    def miner_page(hotkey: str, page_number: int) -> HTMLResponse:
        if not _HOTKEY.fullmatch(hotkey):
            return page(
                "error.html", 422, title="Not a hotkey", message="a miner's page is /dashboard/miners/<its ss58 hotkey>"
            )
        history = status_reader.history(hotkey)
        submissions = status_reader.submissions(hotkey, MINER_SUBMISSIONS, (page_number - 1) * MINER_SUBMISSIONS)
        if not submissions.total:
            return not_found(f"no submissions from {hotkey}")
        pages = -(-submissions.total // MINER_SUBMISSIONS)
        if page_number > pages:
            return not_found(f"no page {page_number} of {hotkey}'s submissions: they fill {pages}")
        return page(
            "miner.html",
            title=f"Miner {short_hotkey(hotkey)}",
            hotkey=hotkey,
            history=history,
            page_of=submissions,
            page_number=page_number,
            pages=pages,
            chart=history_chart(history),
        )

    @router.get("/dashboard/submissions/{submission_id}", response_class=HTMLResponse)
    async def submission(request: Request, submission_id: str) -> Response:
        return await reads.page(request, lambda: submission_page(submission_id))

    @in_one_read
    def submission_page(submission_id: str) -> HTMLResponse:
        if not _ID.fullmatch(submission_id) or not 1 <= int(submission_id) <= schemas.MAX_ID:
            return page(
                "error.html",
                422,
                title="Not a submission id",
                message="a submission's page is /dashboard/submissions/<its number>",
            )
        status = status_reader.submission(int(submission_id))
        if status is None:
            return not_found(f"no submission {submission_id}")
        return page(
            "submission.html",
            title=f"Submission {status.submission_id}",
            status=status,
            chart=lengths_chart(status),
            reasons=distinct_reasons(status),
        )

    return router
