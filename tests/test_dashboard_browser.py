"""The dashboard in a real browser: the API on 127.0.0.1 with a few submissions and reports, its pages
opened in Debian's headless Chromium (driven by Playwright against /usr/bin/chromium; no browser is
downloaded), checked and photographed at desktop and phone widths under the test's temp folder.

Skipped where /usr/bin/chromium is missing; ./scripts/test.sh installs it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from api_fixtures import COMMIT, FORK, Api, ApiServer, Clock, api_config
from quasar.api.client import Claim
from quasar.api.rules import commitment_hash, new_salt

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
HIDDEN_FORK, HIDDEN_COMMIT = "https://github.com/bob/unrevealed-kernels", "b0b" * 13 + "b"
REASONS = [
    "T=1024: the output differs from the reference (relative error 0.41 > 0.01; worst 64-token block from token 64)",
    "logit check not run: the evaluation failed",
    "<script>document.title='pwned'</script>",
]
HOSTILE_REASON = "kernel raised: \u202eelif eht ni"  # a right-to-left override, never closed

# Each pair of texts, in the page's visible charts, whose boxes as drawn meet.
MEETING_TEXTS = """() => {
  const met = [];
  for (const chart of document.querySelectorAll("svg.chart")) {
    if (!chart.getBoundingClientRect().width) continue;
    const texts = [...chart.querySelectorAll("text")].map(text => [text.textContent, text.getBoundingClientRect()]);
    texts.forEach(([name, a], i) => texts.slice(i + 1).forEach(([other, b]) => {
      if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) met.push([name, other]);
    }));
  }
  return met;
}"""

# Whether the first element matching the selector is drawn left to right: its first character left
# of its last.
READS_LEFT_TO_RIGHT = """selector => {
  const text = document.querySelector(selector).firstChild, range = document.createRange();
  const left = at => {
    range.setStart(text, at);
    range.setEnd(text, at + 1);
    return range.getBoundingClientRect().left;
  };
  return left(0) < left(text.length - 1);
}"""

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"no Chromium at {CHROMIUM}: install Debian's "
    "chromium package (./scripts/test.sh does) to run the dashboard's browser test",
)


@contextmanager
def chromium_page(tmp_path: Path) -> Iterator[Page]:
    """A page of Debian's headless Chromium at the desktop's size, its profile in ``tmp_path``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=DESKTOP,
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def figures(*rows: tuple[int, float, float, bool]) -> list[dict]:
    return [
        {"seq_len": n, "status": "ok", "tokens_per_sec": tps, "peak_vram_mb": mb, "correct": ok}
        for n, tps, mb, ok in rows
    ]


def populate(api: Api) -> dict[str, int]:
    """Two rounds: the honest miner a improves, c fails, b's commitment stays unrevealed."""
    a, b, c, v1, v2 = (api.client(name) for name in ("a", "b", "c", "v1", "v2"))
    early = a.submit_kernel(Claim(FORK, "1" * 40, 2.0e5), 1_000_000)
    for validator, measured in ((v1, 2.1e5), (v2, 2.05e5)):
        validator.fetch_work()
        validator.report(
            early.submission_id,
            "passed",
            True,
            True,
            measured,
            lengths=figures((512, 3.0e5, 300, True), (1024, 2.9e5, 420, True), (1_000_000, measured, 3400, True)),
        )
    api.chain.advance(360 - api.chain.current_block() % 360)  # the next round
    honest = a.submit_kernel(Claim(FORK, COMMIT, 6.0e7), 1_000_000)
    hostile = c.submit_kernel(Claim("https://github.com/carol/flash-linear-attention", "c" * 40, 2.0e8), 1_000_000)
    b.commit(commitment_hash(new_salt(), HIDDEN_FORK, HIDDEN_COMMIT), 1_000_000)
    for validator, scale in ((v1, 1.0), (v2, 0.99)):
        validator.fetch_work()
        validator.report(
            honest.submission_id,
            "passed",
            True,
            True,
            6.16e7 * scale,
            lengths=figures(
                (512, 3.1e6 * scale, 310, True),
                (1024, 6.0e6 * scale, 330, True),
                (2048, 1.1e7 * scale, 360, True),
                (1_000_000, 6.16e7 * scale, 3500, True),
            ),
        )
        validator.report(
            hostile.submission_id,
            "failed",
            False,
            None,
            2.2e8 * scale,
            reasons=REASONS,
            lengths=figures(
                (512, 9.0e6 * scale, 200, True),
                (1024, 1.7e7 * scale, 210, False),
                (2048, 3.3e7 * scale, 220, False),
                (1_000_000, 2.2e8 * scale, 900, False),
            ),
        )
    api.chain.advance(1)  # reports count from the block after they arrive
    return {"honest": honest.submission_id, "hostile": hostile.submission_id}


def test_dashboard_pages_in_headless_chromium(tmp_path, chain, wallets):
    clock = Clock()
    server = ApiServer(
        api_config(wallets["api"].hotkey.ss58_address), chain, f"sqlite:///{tmp_path}/api.sqlite3", clock
    )
    api = Api(server.__enter__(), chain, wallets, clock)
    try:
        ids = populate(api)
        with chromium_page(tmp_path) as page:
            outside: list[str] = []
            page.on("request", lambda request: None if request.url.startswith(api.url) else outside.append(request.url))
            for size_name, size in (("desktop", DESKTOP), ("phone", PHONE)):
                page.set_viewport_size(size)
                page.goto(api.url + "/")
                rows = page.locator("#leaderboard tbody tr")
                assert rows.count() == 1
                assert rows.first.locator("td").first.inner_text() == "1"
                assert "60%" in rows.first.inner_text()
                assert page.locator("#recent tbody tr").count() == 4
                assert HIDDEN_FORK not in page.content()
                # The page's own CSS applies under its Content-Security-Policy.
                assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(15, 23, 42)"
                page.screenshot(path=str(tmp_path / f"leaderboard-{size_name}.png"), full_page=True)
                if size_name == "phone":  # nothing wider than the phone's screen but the tables' own scroll
                    width = page.evaluate("document.documentElement.scrollWidth")
                    assert width <= PHONE["width"], width
                    # and the ranking's columns all fit without scrolling its table
                    overflow = page.evaluate(
                        "(t => t.scrollWidth - t.parentElement.clientWidth)(document.getElementById('leaderboard'))"
                    )
                    assert overflow <= 0, overflow

                page.goto(f"{api.url}/dashboard/submissions/{ids['hostile']}")
                assert page.locator("h1 .badge").inner_text() == "failed"
                assert page.locator(".why li").first.inner_text() == REASONS[0] + " (2 of 2 validators)"
                # once above and under each validator
                assert page.get_by_text(REASONS[0], exact=True).count() == 3
                assert page.get_by_text(REASONS[2], exact=True).count() == 3  # shown as text, never run
                assert page.title() == f"Submission {ids['hostile']} · QUASAR"
                chart = page.locator("svg.chart:visible")  # one drawn for desktops, one for phones
                assert chart.count() == 1 and chart.bounding_box()["width"] > 300
                assert chart.locator("rect[fill='#dc2626']").count() == 6  # 3 wrong lengths x 2 validators
                assert page.evaluate(MEETING_TEXTS) == [], size_name  # every label readable
                page.screenshot(path=str(tmp_path / f"submission-failed-{size_name}.png"), full_page=True)

            page.set_viewport_size(DESKTOP)
            page.goto(api.url + "/")
            page.locator("#leaderboard tbody tr a").first.click()
            page.wait_for_url("**/dashboard/miners/**")
            assert page.locator("svg.chart:visible circle").count() == 2  # two rounds
            page.screenshot(path=str(tmp_path / "miner-desktop.png"), full_page=True)
            page.goto(api.url + "/")
            page.get_by_role("link", name="validators", exact=True).click()
            page.wait_for_url("**/dashboard/validators?round=*")
            rows = page.locator("#validators tbody tr")
            assert rows.count() == 2 and "100%" in rows.first.inner_text()  # both agreed on both verdicts
            page.set_viewport_size(PHONE)
            assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
            page.screenshot(path=str(tmp_path / "validators-phone.png"), full_page=True)
            assert outside == []
    finally:
        for client in api.clients.values():
            client.close()
        server.__exit__(None, None, None)
    shots = sorted(path.name for path in tmp_path.glob("*.png"))
    assert shots == [
        "leaderboard-desktop.png",
        "leaderboard-phone.png",
        "miner-desktop.png",
        "submission-failed-desktop.png",
        "submission-failed-phone.png",
        "validators-phone.png",
    ]


ROUNDS_PLAYED = 40  # two days of a full subnet's 72-minute rounds


def played_rounds(database_url: str, miner: str, validators: list[str], rounds: int) -> None:
    """``rounds`` rounds of one passed submission each from ``miner``, reported on by ``validators``,
    written straight into the API's tables (as quasar bench api-month fills them)."""
    connection = sqlite3.connect(database_url.removeprefix("sqlite:///"))
    with connection:
        for round_id in range(rounds):
            block = round_id * 360 + 10
            connection.execute(
                "INSERT INTO submissions (id, hotkey, method, state, target_sequence_length, submitted_at, "
                "submitted_block, ready_at, ready_block, round_id, fork_url, commit_hash, claimed_tokens_per_sec, "
                "client_ip) VALUES (?,?,'direct','ready',1000000,?,?,?,?,?,?,?,?,'10.0.0.1')",
                (round_id + 1, miner, block * 12.0, block, block * 12.0, block, round_id, FORK)
                + (f"{round_id:040x}", 9e7),
            )
            for validator in validators:
                connection.execute(
                    "INSERT INTO evaluation_reports (submission_id, validator_hotkey, reported_at, verdict, correct, "
                    "logits_ok, measured_tokens_per_sec, reasons, lengths, content_hash) "
                    "VALUES (?,?,?,'passed',1,1,?,'[]','[]',?)",
                    (round_id + 1, validator, block * 12.0 + 100, 5e7 + round_id * 1e6, f"{round_id:064x}"),
                )
    connection.close()


def overlapping(boxes: list[dict]) -> list[tuple[dict, dict]]:
    """The pairs of neighbouring text boxes (left to right) that run into each other."""
    boxes = sorted(boxes, key=lambda box: box["x"])
    return [(a, b) for a, b in zip(boxes, boxes[1:]) if a["x"] + a["width"] > b["x"]]


def test_a_miners_chart_of_many_rounds_keeps_its_labels_apart(tmp_path, chain, wallets):
    """After two days (40 rounds) a miner's history chart labels only as many rounds and figures as
    fit side by side, the newest always; each point keeps its exact figure as a tooltip."""
    url = f"sqlite:///{tmp_path}/api.sqlite3"
    miner = wallets["a"].hotkey.ss58_address
    with ApiServer(api_config(wallets["api"].hotkey.ss58_address), chain, url, Clock()) as server:
        played_rounds(url, miner, [wallets[v].hotkey.ss58_address for v in ("v1", "v2")], ROUNDS_PLAYED)
        chain.advance(ROUNDS_PLAYED * 360 - chain.current_block() + 5)
        with chromium_page(tmp_path) as page:
            for size_name, size in (("desktop", DESKTOP), ("phone", PHONE)):
                page.set_viewport_size(size)
                page.goto(f"{server.url}/dashboard/miners/{miner}")
                chart = page.locator("svg.chart:visible")
                assert chart.locator("circle").count() == ROUNDS_PLAYED
                shot = tmp_path / f"miner-{ROUNDS_PLAYED}-rounds-{size_name}.png"
                page.screenshot(path=str(shot), full_page=True)
                for kind in ("axis", "value"):
                    texts = chart.locator(f"text.{kind}")
                    boxes = [texts.nth(i).bounding_box() for i in range(texts.count())]
                    row = max(box["y"] for box in boxes) if kind == "axis" else None
                    boxes = [box for box in boxes if row is None or box["y"] == row]  # not the y axis
                    assert overlapping(boxes) == [], (size_name, kind, len(boxes))
                    edge = chart.bounding_box()
                    cut = [box for box in boxes if box["x"] + box["width"] > edge["x"] + edge["width"]]
                    assert cut == [], (size_name, kind, edge)  # the newest label is not cut off
                assert chart.locator("text.axis", has_text=f"round {ROUNDS_PLAYED - 1}").count() == 1
                assert chart.locator("circle title").last.text_content() == "round 39: 89,000,000 tokens/s"
                assert page.evaluate(MEETING_TEXTS) == [], size_name


MANY_ROUNDS = 1_000  # a counted thousand is written 1,000, as every figure on the pages


def copied_and_failed(database_url: str, copier: str, failer: str, validators: list[str], rounds: int) -> dict:
    """After ``played_rounds``: ``copier`` submits the first round's commit again in the last round
    (a copy), and ``failer`` a submission every validator fails with ``HOSTILE_REASON``."""
    connection = sqlite3.connect(database_url.removeprefix("sqlite:///"))
    block = (rounds - 1) * 360 + 20
    ids = {"copy": rounds + 1, "failed": rounds + 2}
    with connection:
        for name, hotkey, commit in (("copy", copier, f"{0:040x}"), ("failed", failer, "f" * 40)):
            connection.execute(
                "INSERT INTO submissions (id, hotkey, method, state, target_sequence_length, submitted_at, "
                "submitted_block, ready_at, ready_block, round_id, fork_url, commit_hash, claimed_tokens_per_sec, "
                "client_ip) VALUES (?,?,'direct','ready',1000000,?,?,?,?,?,?,?,9e7,'10.0.0.2')",
                (ids[name], hotkey, block * 12.0, block, block * 12.0, block, rounds - 1, FORK, commit),
            )
            passed = name == "copy"
            for validator in validators:
                connection.execute(
                    "INSERT INTO evaluation_reports (submission_id, validator_hotkey, reported_at, verdict, correct, "
                    "logits_ok, measured_tokens_per_sec, reasons, lengths, content_hash) "
                    "VALUES (?,?,?,?,?,?,5e7,?,'[]',?)",
                    (ids[name], validator, block * 12.0 + 100, "passed" if passed else "failed", passed, passed)
                    + ("[]" if passed else json.dumps([HOSTILE_REASON]), f"{ids[name]:064x}"),
                )
    connection.close()
    return ids


def test_miners_texts_read_as_written(tmp_path, chain, wallets):
    """What the pages quote (a copy's original's hotkey, a validator's reason) reads exactly as it is
    and turns nothing of the page's own around; a count is written with thousands separators; a page
    naming a hotkey in full fits a phone."""
    url = f"sqlite:///{tmp_path}/api.sqlite3"
    hotkey = {name: wallets[name].hotkey.ss58_address for name in ("a", "b", "c", "v1", "v2")}
    validators = [hotkey["v1"], hotkey["v2"]]
    with ApiServer(api_config(wallets["api"].hotkey.ss58_address), chain, url, Clock()) as server:
        played_rounds(url, hotkey["a"], validators, MANY_ROUNDS)
        ids = copied_and_failed(url, hotkey["b"], hotkey["c"], validators, MANY_ROUNDS)
        chain.advance(MANY_ROUNDS * 360 - chain.current_block() + 5)
        with chromium_page(tmp_path) as page:
            page.goto(f"{server.url}/dashboard/submissions/{ids['copy']}")
            assert page.locator("h1 .badge").inner_text() == "copy"
            assert page.locator("#state-reason").inner_text().startswith(f"A copy of submission 1 by {hotkey['a']},")
            page.goto(f"{server.url}/dashboard/submissions/{ids['failed']}")
            assert page.locator(".why li").first.inner_text() == HOSTILE_REASON + " (2 of 2 validators)"
            # The page's own words after a reason read left to right: its override ends with it.
            assert page.evaluate(READS_LEFT_TO_RIGHT, ".why li .muted")
            page.goto(f"{server.url}/dashboard/miners/{hotkey['a']}")
            shown = page.locator("main > p.muted").inner_text()
            assert f"{MANY_ROUNDS:,} submissions" in shown, shown
            page.set_viewport_size(PHONE)
            page.goto(f"{server.url}/dashboard/miners/{hotkey['v1']}")  # a 404 naming the hotkey in full
            assert page.get_by_text(f"no submissions from {hotkey['v1']}").count() == 1
            assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
            page.goto(f"{server.url}/dashboard/submissions/{ids['copy']}")  # its reason names the original's
            assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
