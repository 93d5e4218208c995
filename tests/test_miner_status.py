"""``python -m neurons.miner status`` and the miner's verdict log, against a real API on 127.0.0.1
(real wallets, the dev chain, both database backends)."""

from __future__ import annotations

import io
import json
import logging
from contextlib import contextmanager

import pytest
from rich.console import Console
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from api_fixtures import COMMIT, FORK
from neurons.miner import main as miner_main
from quasar.api.client import ApiClient, Claim
from quasar.api.rules import commitment_hash, new_salt
from quasar.api.schemas import MAX_BENCHMARK_ENTRIES, MAX_REASON_LENGTH, MAX_REASONS
from quasar.miner.status import (
    MAX_LOGGED_REASONS,
    MAX_REPORTS_SHOWN,
    MAX_VERDICTS_PER_POLL,
    VerdictWatcher,
    print_status,
)
from servers import serving

SECRET_FORK = "https://github.com/minera/unrevealed-kernels"
SECRET_COMMIT = "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2"
LONG_REASON = (
    "T=1024: the output differs from the reference (relative error 0.41 > 0.01; the first wrong "
    "64-token block starts at token 64: the kernel skips the recurrence beyond the first chunk)"
)
FIGURES = [
    {"seq_len": 512, "status": "ok", "tokens_per_sec": 9.1e6, "peak_vram_mb": 210.0, "correct": True},
    {"seq_len": 1024, "status": "ok", "tokens_per_sec": 1.7e7, "peak_vram_mb": 230.0, "correct": False},
    {"seq_len": 1_000_000, "status": "oom", "tokens_per_sec": None, "peak_vram_mb": 81_000.0, "correct": None},
]


def miner_with_history(api) -> dict[str, int]:
    """Miner a: a passing and a failing direct submission, then an unrevealed commitment."""
    a, v1 = api.client("a"), api.client("v1")
    good = a.submit_kernel(Claim(FORK, COMMIT, 6.0e7), 1_000_000)
    v1.fetch_work()  # reported on before the next (a newer one supersedes one without reports)
    v1.report(good.submission_id, "passed", True, True, 6.1e7)
    bad = a.submit_kernel(Claim("https://github.com/minera/fla-fast", "d" * 40, 2.0e8), 1_000_000)
    v1.fetch_work()
    v1.report(
        bad.submission_id,
        "failed",
        False,
        None,
        None,
        lengths=FIGURES,
        reasons=[LONG_REASON, "OOM at T=1,000,000, peak 81,000 MiB"],
    )
    committed = a.commit(commitment_hash(new_salt(), SECRET_FORK, SECRET_COMMIT), 1_000_000)
    return {"good": good.submission_id, "bad": bad.submission_id, "committed": committed.submission_id}


def rendered(call) -> str:
    console = Console(width=80, record=True, color_system=None)
    call(console)
    return console.export_text()


def test_status_table_and_detail_fit_80_columns_and_never_show_an_unrevealed_fork(start_api):
    api = start_api()
    ids = miner_with_history(api)
    hotkey = api.wallets["a"].hotkey.ss58_address
    client = api.client("a")

    overview = rendered(lambda console: print_status(console, client, hotkey, None))
    assert all(len(line) <= 80 for line in overview.splitlines()), overview
    rows = [line for line in overview.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == [str(ids["committed"]), str(ids["bad"]), str(ids["good"])]
    assert "committed" in rows[0] and "failed" in rows[1] and "0/1 pass" in rows[1] and "1/1 pass" in rows[2]
    assert "submission " + str(ids["committed"]) in overview and "not revealed" in overview
    for secret in ("unrevealed-kernels", SECRET_COMMIT):
        assert secret not in overview

    detail = rendered(lambda console: print_status(console, client, hotkey, ids["bad"]))
    assert all(len(line) <= 80 for line in detail.splitlines()), detail
    flat = " ".join(" ".join(detail.split()).split(" - "))
    assert "failed by validator" in detail and " ".join(LONG_REASON.split()) in " ".join(detail.split())
    assert "OOM at T=1,000,000" in flat and "oom" in detail and "81,000 MiB" in detail and "wrong" in detail
    assert "https://github.com/minera/fla-fast" in detail.replace("\n", "").replace(" ", "")


@pytest.mark.parametrize(
    "fork",
    [
        "https://github.com/a-rather-long-github-username/flash-linear-attention",
        "https://github.com/" + "m" * 39 + "/" + "flash-linear-attention-" * 3 + "x",
    ],
    ids=["longer-than-its-column", "longer-than-a-line"],
)
def test_a_fork_url_too_long_for_its_column_is_shown_whole_on_its_own_line(start_api, fork):
    """`quasar status` in an 80-column terminal folded a fork's URL longer than its column (about
    68 characters) mid-word, 'flash-linear-attenti' ending a line and 'on' beginning the next: a
    URL the miner copies. It is shown whole on the line under its label; one longer than the line
    is left whole for the terminal to wrap, not folded by the table with blanks put into it."""
    api = start_api()
    submitted = api.client("a").submit_kernel(Claim(fork, COMMIT, 6.0e7), 1_000_000)
    hotkey = api.wallets["a"].hotkey.ss58_address
    detail = rendered(lambda console: print_status(console, api.client("a"), hotkey, submitted.submission_id))
    lines = [line.rstrip() for line in detail.splitlines()]
    assert fork in lines, lines
    assert lines[lines.index(fork) - 1] == "fork", lines
    assert all(len(line) <= 80 for line in lines if line != fork), lines
    rows = {line.split()[0]: line for line in lines if line}
    value_column = {label: len(row) - len(row.split(maxsplit=1)[1]) for label, row in rows.items() if " " in row}
    assert value_column["commit"] == value_column["state"] == value_column["submitted"], lines  # still aligned


def test_status_command_uses_the_miners_wallet_and_api_flags(start_api, capsys):
    api = start_api()
    ids = miner_with_history(api)
    wallet = api.wallets["a"]
    flags = [
        "--wallet.name",
        wallet.name,
        "--wallet.hotkey",
        "default",
        "--wallet.path",
        wallet.path,
        "--api.url",
        api.url,
    ]
    assert miner_main(["status", *flags]) == 0
    out = capsys.readouterr().out
    assert f"{ids['bad']} │ failed" in out and SECRET_COMMIT not in out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert miner_main(["status", "--submission", str(ids["bad"]), *flags]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"submission {ids['bad']}") and "OOM at T=1,000,000" in out
    assert miner_main(["status", "--submission", "999999", *flags]) == 1
    assert miner_main(["status", *flags[:-1], "http://127.0.0.1:9"]) == 1  # nothing listens there


def test_the_miner_logs_each_verdict_once_as_it_arrives(start_api, caplog):
    api = start_api()
    ids = miner_with_history(api)
    watcher = VerdictWatcher(api.client("a"), api.wallets["a"].hotkey.ss58_address)
    with caplog.at_level(logging.INFO, logger="quasar.miner.status"):
        assert sorted(watcher.poll()) == sorted(
            [(ids["good"], api.wallets["v1"].hotkey.ss58_address), (ids["bad"], api.wallets["v1"].hotkey.ss58_address)]
        )
        assert watcher.poll() == []
        api.client("v2").fetch_work()
        api.client("v2").report(ids["good"], "passed", True, True, 5.9e7)
        assert watcher.poll() == [(ids["good"], api.wallets["v2"].hotkey.ss58_address)]
    logged = [r for r in caplog.records if r.name == "quasar.miner.status"]
    failed = [r for r in logged if r.levelno == logging.WARNING]
    assert len(failed) == 1 and f"submission {ids['bad']} failed" in failed[0].message
    assert LONG_REASON in failed[0].message
    passed = [r.message for r in logged if r.levelno == logging.INFO]
    assert len(passed) == 2 and all(f"submission {ids['good']} passed" in m for m in passed)


def test_the_verdict_watcher_remembers_only_the_submissions_it_still_sees(start_api):
    """The running miner's watcher kept every (submission, validator) pair it ever logged: a pair
    per validator for each submission, about 10 an hour, for the miner's whole life (a month at 64
    validators: about 460,000). It keeps those of the submissions on the page it reads."""
    api = start_api()
    miner, validator = api.client("a"), api.client("v1")
    watcher = VerdictWatcher(miner, api.wallets["a"].hotkey.ss58_address, limit=1)
    for index in range(4):
        submitted = miner.submit_kernel(Claim(FORK, f"{index + 1:x}" * 40, 6.0e7), 1_000_000)
        validator.fetch_work()
        validator.report(submitted.submission_id, "passed", True, True, 6.1e7)
        assert watcher.poll() == [(submitted.submission_id, api.wallets["v1"].hotkey.ss58_address)]
        assert watcher.remembered == 1, "verdicts of submissions off the page are kept for good"


def hostile_report(api) -> int:
    """A direct submission of miner a that validator v1 fails with a hostile reason: console
    markup that closes a tag never opened, and a newline followed by a forged log line."""
    a, v1 = api.client("a"), api.client("v1")
    submitted = a.submit_kernel(Claim(FORK, COMMIT, 6.0e7), 1_000_000)
    v1.fetch_work()
    v1.report(submitted.submission_id, "failed", False, None, None, reasons=[HOSTILE_REASON])
    return submitted.submission_id


HOSTILE_REASON = "slow [/bold] [link=file:///etc/passwd]x[/link]\n2031-01-01 00:00:00 INFO    quasar.miner: all good"


def test_attack_a_validators_reason_with_console_markup_is_shown_as_written(start_api):
    """A validator's reason is printable text it chooses: ``[/bold]`` (a closing tag of rich's
    console markup that matches nothing) made ``quasar status`` end in a MarkupError traceback, and
    other tags (links, styles) acted. Whatever the API returns is shown as the text it is."""
    api = start_api()
    submission = hostile_report(api)
    hotkey = api.wallets["a"].hotkey.ss58_address
    detail = rendered(lambda console: print_status(console, api.client("a"), hotkey, submission))
    flat = " ".join(detail.split())
    assert "slow [/bold] [link=file:///etc/passwd]x[/link]" in flat


def test_attack_a_validators_reason_cannot_forge_a_line_of_the_miners_log(start_api, caplog):
    """A validator's reason may hold newlines: logged as it came, the text after one read as a
    line of the miner's own log (its time, level and logger forged). The reasons are logged on
    the verdict's one line."""
    api = start_api()
    hostile_report(api)
    watcher = VerdictWatcher(api.client("a"), api.wallets["a"].hotkey.ss58_address)
    with caplog.at_level(logging.INFO, logger="quasar.miner.status"):
        watcher.poll()
    [record] = [r for r in caplog.records if r.name == "quasar.miner.status"]
    assert "\n" not in record.getMessage() and "quasar.miner: all good" in record.getMessage()


@contextmanager
def lying_api(answers: dict[str, object]):
    """A stand-in of a lying or taken-over API on 127.0.0.1: each path answers 200 with its JSON,
    written as Python's json module writes it (NaN and Infinity included, as a hostile server may)."""

    async def answer(request):
        return Response(json.dumps(answers[request.url.path]), media_type="application/json")

    app = Starlette(routes=[Route(path, answer) for path in answers])
    with serving(app) as port, ApiClient(f"http://127.0.0.1:{port}") as client:
        yield client


def real_answers(api) -> tuple[str, dict]:
    """Miner a's hotkey and a failed submission's status as the real API writes it (JSON)."""
    submission = hostile_report(api)
    return api.wallets["a"].hotkey.ss58_address, api.client("a").submission_status(submission).model_dump(mode="json")


TITLE_AND_CLEAR = "\x1b]0;pwned\x07\x1b[2J\x9b2J"


def test_attack_a_lying_api_cannot_send_terminal_escapes_through_quasar_status(start_api):
    """Every text of the API's answer reached the miner's terminal as it came: an API taken over set
    the terminal's title and cleared the screen (ESC ] 0;...BEL, ESC [2J, the C1 CSI) through a
    reason, the state's words, the league, the fork, the commit, a length's status or a validator's
    hotkey. They are shown with ``?`` for each control, the rest as written."""
    hotkey, status = real_answers(start_api())
    for field in ("state_reason", "league", "fork_url", "commit_hash"):
        status[field] = field + TITLE_AND_CLEAR
    [report] = status["reports"]
    report["validator_hotkey"] = "5" * 20 + TITLE_AND_CLEAR
    report["reasons"] = ["slow" + TITLE_AND_CLEAR]
    report["lengths"] = [{"seq_len": 1024, "status": "ok" + TITLE_AND_CLEAR, "tokens_per_sec": 1.0e6}]
    report["lengths"][0].update(peak_vram_mb=None, correct=False)
    page = {"hotkey": hotkey + TITLE_AND_CLEAR, "total": 1, "offset": 0, "limit": 10, "submissions": [status]}
    with lying_api({f"/miners/{hotkey}/submissions": page}) as client:
        terminal = io.StringIO()
        print_status(Console(file=terminal, force_terminal=True, width=80), client, hotkey, None)
    shown = terminal.getvalue()
    for control in ("\x1b]", "\x07", "\x1b[2J", "\x9b"):
        assert control not in shown, f"{control!r} reached the terminal"
    assert "slow?]0;pwned??[2J?2J" in shown and "state_reason?]0;pwned" in shown


@pytest.mark.parametrize("when", [float("nan"), float("inf"), 1e300, -1e300])
def test_attack_a_lying_apis_times_do_not_end_quasar_status_in_a_traceback(start_api, when):
    """A time a date cannot hold (NaN, infinite, years beyond 9999) in a submission or a report
    ended ``quasar status`` in a ValueError or OverflowError traceback; it is shown as ``?``."""
    hotkey, status = real_answers(start_api())
    status["submitted_at"] = status["reports"][0]["reported_at"] = when
    with lying_api({"/submissions/7": status}) as client:
        detail = rendered(lambda console: print_status(console, client, hotkey, 7))
    assert "submitted  ? UTC" in detail and "at ? UTC" in detail


def test_attack_a_lying_api_cannot_flood_the_running_miners_log_with_verdicts(start_api, caplog):
    """The running miner asks for its 10 newest submissions every 15 s and logs each verdict once,
    known by its submission's time. A lying API answering with more submissions than asked, many
    reports and long reasons, under a new time at every poll, had all of it logged at every poll, up
    to the client's 32 MB (measured: 20 MB a poll from one reason, 10,000 lines from a thousand
    submissions of ten reports), until pm2's log filled the disk. A poll reads the submissions it
    asked for, logs at most MAX_VERDICTS_PER_POLL verdicts (the rest at the next polls) and a
    verdict's reasons in at most MAX_LOGGED_REASONS characters."""
    hotkey, status = real_answers(start_api())
    polls = iter(range(1, 100))
    reasons = ["slow " * 100] * 20
    reports = [dict(status["reports"][0], validator_hotkey=f"5{v:047d}", reasons=reasons) for v in range(30)]
    page = {"hotkey": hotkey, "total": 30, "offset": 0, "limit": 10}

    async def lying_page(request):
        submitted_at = status["submitted_at"] + next(polls)
        listed = [dict(status, submission_id=n, submitted_at=submitted_at, reports=reports) for n in range(30)]
        return Response(json.dumps({**page, "submissions": listed}), media_type="application/json")

    app = Starlette(routes=[Route(f"/miners/{hotkey}/submissions", lying_page)])
    with serving(app) as port, ApiClient(f"http://127.0.0.1:{port}") as client:
        watcher = VerdictWatcher(client, hotkey)
        with caplog.at_level(logging.INFO, logger="quasar.miner.status"):
            logged = [watcher.poll() for _ in range(2)]
    assert [len(verdicts) for verdicts in logged] == [MAX_VERDICTS_PER_POLL] * 2
    assert {submission for verdicts in logged for submission, _ in verdicts} <= set(range(10))
    lines = [record.getMessage() for record in caplog.records if record.name == "quasar.miner.status"]
    assert len(lines) == 2 * MAX_VERDICTS_PER_POLL
    assert max(len(line) for line in lines) < MAX_LOGGED_REASONS + 300


def test_attack_a_lying_apis_huge_answer_does_not_flood_quasar_status(start_api):
    """``quasar status`` printed whatever the API answered: a thousand submissions when it asked for
    ten, and in the detail every report, reason and length however many (measured: a 30 MB answer
    printed 400,000 lines in 24 s). It shows the submissions it asked for, at most
    MAX_REPORTS_SHOWN reports, and of each report what a validator may send the API: MAX_REASONS
    reasons of at most MAX_REASON_LENGTH characters, MAX_BENCHMARK_ENTRIES lengths."""
    hotkey, status = real_answers(start_api())
    length = {"seq_len": 1024, "status": "ok", "tokens_per_sec": 1.0e6, "peak_vram_mb": None, "correct": False}
    report = dict(status["reports"][0], reasons=["slow " * 1000] * 40, lengths=[length] * 100)
    reports = [dict(report, validator_hotkey=f"5{v:047d}") for v in range(MAX_REPORTS_SHOWN + 6)]
    listed = [dict(status, submission_id=n, reports=reports if n == 0 else []) for n in range(1000)]
    page = {"hotkey": hotkey, "total": 1000, "offset": 0, "limit": 10, "submissions": listed}
    with lying_api({f"/miners/{hotkey}/submissions": page}) as client:
        shown = rendered(lambda console: print_status(console, client, hotkey, None))
    rows = [line for line in shown.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == [str(n) for n in range(10)]
    assert shown.count(" by validator ") == MAX_REPORTS_SHOWN and "and 6 more reports" in shown
    lines = shown.splitlines()
    assert sum(line.startswith("  - slow") for line in lines) == MAX_REPORTS_SHOWN * MAX_REASONS
    assert sum(line.lstrip().startswith("1,024 ") for line in lines) == MAX_REPORTS_SHOWN * MAX_BENCHMARK_ENTRIES
    assert len(shown.replace("\n", "")) < MAX_REPORTS_SHOWN * MAX_REASONS * (MAX_REASON_LENGTH + 300)


def test_attack_a_lying_apis_validator_hotkey_cannot_break_a_line_of_the_miners_log(start_api, caplog):
    """The reasons are logged on the verdict's one line, but the validator's hotkey was not: a lying
    API naming a validator '\\nERROR  …\\nx1' broke the verdict's line in the miner's log with its
    own line. The hotkey is logged printable, on the one line too."""
    hotkey, status = real_answers(start_api())
    status["reports"][0]["validator_hotkey"] = "\nERROR  " + "5" * 30 + "\nx1"
    page = {"hotkey": hotkey, "total": 1, "offset": 0, "limit": 10, "submissions": [status]}
    with lying_api({f"/miners/{hotkey}/submissions": page}) as client:
        with caplog.at_level(logging.INFO, logger="quasar.miner.status"):
            VerdictWatcher(client, hotkey).poll()
    [record] = [r for r in caplog.records if r.name == "quasar.miner.status"]
    assert "\n" not in record.getMessage() and "by validator ERROR …5 x1:" in record.getMessage()
