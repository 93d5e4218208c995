"""What became of the miner's submissions: ``quasar status [--submission ID]`` and
the verdicts the running miner logs as validators report them.

Everything here comes from the API's public status endpoints (``GET /miners/{hotkey}/submissions``,
``GET /submissions/{id}``), so the miner sees what everyone sees: of a commitment it has not
revealed, only the hash; never the fork or commit its own state file holds.
"""

from __future__ import annotations

import itertools
import logging
from datetime import UTC, datetime

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from quasar.api import schemas
from quasar.api.charts import compact
from quasar.api.client import ApiClient, ApiClientError
from quasar.api.schemas import MAX_BENCHMARK_ENTRIES, MAX_REASON_LENGTH, MAX_REASONS
from quasar.chain.wallets import WalletError, open_wallet
from quasar.config import Settings
from quasar.miner.strategies.base import printable_line
from quasar.safe_text import without_terminal_controls
from quasar.terminal import short_hotkey

logger = logging.getLogger(__name__)

RECENT = 10
# What one poll of the running miner logs at most, whatever the API answers: a lying one could
# otherwise put its whole answer (up to the client's 32 MB) into the log at every poll.
MAX_VERDICTS_PER_POLL = 64  # verdicts logged by one poll; the rest by the next ones
MAX_LOGGED_REASONS = 1000  # characters of a verdict's reasons on its line (quasar status shows all)
# Reports shown of one submission (about one a validator: a subnet has at most 64 permits by default).
MAX_REPORTS_SHOWN = 64
STATE_STYLES = {
    "passed": "green",
    "failed": "red",
    "expired": "red",
    "copy": "red",
    "superseded": "dim",
    "lapsed": "dim",
}
STATE_LABELS = {"being_evaluated": "evaluating", "awaiting_quorum": "no quorum"}


def _when(timestamp: float | None) -> str:
    """``11-28 13:19`` (UTC), ``-`` for none, ``?`` for a time no date holds (NaN, infinite, past
    year 9999: only an API that lies sends it, and it must not end the table in a traceback)."""
    if timestamp is None:
        return "-"
    try:
        return datetime.fromtimestamp(timestamp, UTC).strftime("%m-%d %H:%M")
    except (ValueError, OverflowError, OSError):
        return "?"


def _tokens(value: float | None) -> str:
    return "-" if value is None else compact(value)


def _plain(value: object) -> Text:
    """``value`` as the text it is: what the API returns (a validator's reasons, say) is never read
    as console markup, which could style, link or (a tag closing nothing) raise, and its terminal
    controls show as ``?``: an API taken over could otherwise set the terminal's title or clear it."""
    return Text(without_terminal_controls(str(value)))


def _state(state: str) -> Text:
    return Text(STATE_LABELS.get(state, state), style=STATE_STYLES.get(state, "yellow"))


def verdict_summary(status: schemas.SubmissionStatus) -> str:
    """``2/2 pass``, ``0/1 pass``, or ``-`` before any report."""
    if not status.reports:
        return "-"
    passed = sum(report.verdict == "passed" for report in status.reports)
    return f"{passed}/{len(status.reports)} pass"


def submissions_table(page: schemas.SubmissionPage) -> Table:
    """The miner's submissions, newest first: state, target, claim, measured, verdicts (fits 80 columns)."""
    shown = len(page.submissions)
    title = f"submissions of {short_hotkey(page.hotkey or '')}: {shown} newest of {page.total}"
    table = Table(title=_plain(title), title_justify="left")
    for column in ("id", "state", "target", "claimed", "measured", "verdicts", "submitted"):
        table.add_column(column, justify="right" if column in ("id", "target", "claimed", "measured") else "left")
    for status in page.submissions:
        table.add_row(
            str(status.submission_id),
            _state(status.state),
            compact(status.target_sequence_length),
            _tokens(status.claimed_tokens_per_sec),
            _tokens(status.measured_tokens_per_sec),
            verdict_summary(status),
            _when(status.submitted_at),
        )
    if not page.submissions:
        table.add_row("-", "no submissions yet", "", "", "", "", "")
    return table


class _Facts:
    """A submission's facts, a label and its value a row. A value to copy (the fork's URL, a hash)
    too long to sit beside its label is shown whole on the line under it, where rich would fold it
    mid-word; one longer than the line is left whole for the terminal to wrap (printed uncropped)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str | Text, bool]] = []

    def add_row(self, label: str, value: str | Text, whole: bool = False) -> None:
        """Add ``label`` and ``value``; ``whole``: a value to copy, never folded."""
        self.rows.append((label, value, whole))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        label_width = max(len(label) for label, _, _ in self.rows)
        room = options.max_width - label_width - 2  # the grid's padding between label and value
        grid = _facts_grid(label_width)
        for label, value, whole in self.rows:
            shown = value if isinstance(value, Text) else Text(value)
            if whole and shown.cell_len > room:
                grid.add_row(label, "")
                yield grid
                yield Text(shown.plain, no_wrap=True, overflow="ignore")
                grid = _facts_grid(label_width)
            else:
                grid.add_row(label, value)
        if grid.row_count:
            yield grid


def _facts_grid(label_width: int) -> Table:
    """A grid of labels at least ``label_width`` wide (the facts' parts align) and their values."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True, min_width=label_width)
    grid.add_column(overflow="fold")
    return grid


def _facts(status: schemas.SubmissionStatus) -> _Facts:
    facts = _Facts()
    method = "commit-reveal" if status.method == "commit_reveal" else "direct"
    facts.add_row("state", _state(status.state))
    if status.state_reason:
        facts.add_row("why", _plain(status.state_reason))
    facts.add_row("method", method)
    facts.add_row("target", _plain(f"T={status.target_sequence_length:,} ({status.league} league)"))
    facts.add_row("submitted", f"{_when(status.submitted_at)} UTC, block {status.submitted_block:,}")
    if not status.revealed:
        facts.add_row("commitment", _plain(status.commitment_hash or "-"), whole=True)
        facts.add_row("reveal", f"blocks {status.reveal_from_block:,} to {status.reveal_until_block:,}")
        return facts
    facts.add_row("fork", _plain(status.fork_url or "-"), whole=True)
    facts.add_row("commit", _plain(status.commit_hash or "-"), whole=True)
    facts.add_row("round", str(status.round_id))
    facts.add_row("claimed", f"{status.claimed_tokens_per_sec:,.0f} tok/s")
    measured = (
        "-"
        if status.measured_tokens_per_sec is None
        else f"{status.measured_tokens_per_sec:,.0f} tok/s (the validators' consensus)"
    )
    facts.add_row("measured", measured)
    facts.add_row("score", "-" if status.weighted_score is None else f"{status.weighted_score:,.0f}")
    if status.validators_evaluating:
        facts.add_row("evaluating", f"{status.validators_evaluating} validator(s) now")
    return facts


def _lengths_table(report: schemas.ValidatorVerdict) -> Table:
    table = Table(box=None, pad_edge=False, padding=(0, 2, 0, 2))
    for column in ("T", "status", "tok/s", "peak mem", "output"):
        table.add_column(column, justify="right" if column in ("T", "tok/s", "peak mem") else "left")
    for item in report.lengths[:MAX_BENCHMARK_ENTRIES]:
        output = "-" if item.correct is None else Text("correct", "green") if item.correct else Text("wrong", "red")
        memory = "-" if item.peak_vram_mb is None else f"{item.peak_vram_mb:,.0f} MiB"
        table.add_row(f"{item.seq_len:,}", _plain(item.status or "-"), _tokens(item.tokens_per_sec), memory, output)
    return table


def submission_detail(status: schemas.SubmissionStatus) -> Group:
    """One submission: its facts, then each validator's verdict, reasons and per-length figures.

    Of an answer no API that keeps the rules gives, only as much is shown as one that does can
    hold: MAX_REPORTS_SHOWN reports, and of each what a validator may send (MAX_REASONS reasons of
    MAX_REASON_LENGTH characters, MAX_BENCHMARK_ENTRIES lengths); an API that lies cannot flood
    the terminal."""
    parts: list = [Text(f"submission {status.submission_id}", style="bold"), _facts(status)]
    if not status.revealed:
        parts.append(Text("not revealed: validators see it once it is", style="dim"))
    for report in status.reports[:MAX_REPORTS_SHOWN]:
        logits = {True: "passed", False: "failed", None: "not checked"}[report.logits_ok]
        style = "green" if report.verdict == "passed" else "red"
        parts.append(
            Text.assemble(
                "\n",
                (report.verdict, f"bold {style}"),
                f" by validator {without_terminal_controls(short_hotkey(report.validator_hotkey))} at "
                f"{_when(report.reported_at)} UTC; logits {logits}",
            )
        )
        if report.reasons:
            reasons = Table.grid(padding=(0, 1))
            reasons.add_column(no_wrap=True)
            reasons.add_column(overflow="fold")
            for reason in report.reasons[:MAX_REASONS]:
                reasons.add_row("  -", _plain(reason[:MAX_REASON_LENGTH]))
            parts.append(reasons)
        if report.lengths:
            parts.append(_lengths_table(report))
    if len(status.reports) > MAX_REPORTS_SHOWN:
        parts.append(Text(f"\nand {len(status.reports) - MAX_REPORTS_SHOWN} more reports", style="dim"))
    if status.revealed and not status.reports:
        parts.append(Text("no validator has reported yet", style="dim"))
    return Group(*parts)


def print_status(console: Console, client: ApiClient, hotkey: str, submission_id: int | None) -> None:
    """The table of recent submissions and the newest in detail, or only submission ``submission_id``."""
    # Uncropped: a value to copy longer than the line is left whole for the terminal to wrap.
    if submission_id is not None:
        console.print(submission_detail(client.submission_status(submission_id)), crop=False)
        return
    page = client.miner_submissions(hotkey, limit=RECENT)
    page.submissions = page.submissions[:RECENT]  # an API that lies may send more
    console.print(submissions_table(page))
    if page.submissions:
        console.print()
        console.print(submission_detail(page.submissions[0]), crop=False)


def run_status(settings: Settings, submission_id: int | None, console: Console | None = None) -> int:
    """``quasar status``: the miner's submissions from the API; exit status 1 when the
    wallet cannot be read or the API refuses or cannot be reached."""
    console = console or Console()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its request lines would interleave with the tables
    from quasar.api.lookup import ApiNotFound, find_api
    from quasar.chain import ChainError, said_with_cure
    from quasar.chain.factory import connect

    try:
        hotkey = open_wallet(settings, "miner").hotkey.ss58_address
        url = settings.validator_api_url or find_api(settings, connect(settings)).url
    except (WalletError, ApiNotFound, ChainError) as error:
        prefix = "" if isinstance(error, WalletError) else "cannot find the submission API: "
        logger.error("%s%s", prefix, said_with_cure(error))
        return 1
    with ApiClient(url) as client:
        try:
            print_status(console, client, hotkey, submission_id)
        except ApiClientError as error:
            logger.error("the submission API at %s: %s", url, error)
            return 1
    return 0


class VerdictWatcher:
    """Logs each validator's verdict on this miner's recent submissions once, as it arrives.

    A verdict is known by its submission's id, the API's time of that submission and the validator:
    an id alone names a submission only within one database, and an API moved to a fresh one or
    restored from an older backup gives the miner's next submission an id it has seen."""

    def __init__(self, client: ApiClient, hotkey: str, limit: int = RECENT):
        self.client = client
        self.hotkey = hotkey
        self.limit = limit
        self._seen: set[tuple[int, float, str]] = set()

    def poll(self) -> list[tuple[int, str]]:
        """Fetch the recent submissions and log verdicts not logged before, at most
        MAX_VERDICTS_PER_POLL (the rest at the next polls); returns their (submission, validator)
        keys. API errors are logged at debug level and retried at the next poll."""
        try:
            page = self.client.miner_submissions(self.hotkey, limit=self.limit)
        except ApiClientError as error:
            logger.debug("cannot read this miner's submissions from the API: %s", error)
            return []
        asked = page.submissions[: self.limit]  # an API that lies may send more
        unseen = (
            (status, report)
            for status in asked
            for report in status.reports
            if (status.submission_id, status.submitted_at, report.validator_hotkey) not in self._seen
        )
        new = []
        for status, report in itertools.islice(unseen, MAX_VERDICTS_PER_POLL):
            self._seen.add((status.submission_id, status.submitted_at, report.validator_hotkey))
            new.append((status.submission_id, report.validator_hotkey))
            self._log(status, report)
        # Only the page's submissions are remembered: the page holds the newest, so one that left
        # it never comes back, and the set stays bounded however long the miner runs.
        listed = {(status.submission_id, status.submitted_at) for status in asked}
        self._seen = {key for key in self._seen if key[:2] in listed}
        return new

    @property
    def remembered(self) -> int:
        """How many (submission, validator) pairs are held to log each verdict once."""
        return len(self._seen)

    @staticmethod
    def _log(status: schemas.SubmissionStatus, report: schemas.ValidatorVerdict) -> None:
        measured = "-" if report.measured_tokens_per_sec is None else f"{report.measured_tokens_per_sec:,.0f}"
        validator = printable_line(short_hotkey(report.validator_hotkey))  # on the verdict's one line too
        text = (
            f"submission {status.submission_id} {report.verdict} by validator {validator}: "
            f"measured {measured} tok/s at T={status.target_sequence_length:,} (claimed "
            f"{status.claimed_tokens_per_sec:,.0f}); now {STATE_LABELS.get(status.state, status.state)}"
        )
        if report.verdict == "passed":
            logger.info("%s", text)
        else:
            reasons = "; ".join(printable_line(reason) for reason in report.reasons)
            if len(reasons) > MAX_LOGGED_REASONS:
                reasons = f"{reasons[:MAX_LOGGED_REASONS]}… (quasar status --submission {status.submission_id})"
            logger.warning("%s; reasons: %s", text, reasons or "none given")
