"""Tables shown beside log lines: whole on a terminal, in one record of at most 80 columns in a
plain log; the short forms of hotkeys and speeds."""

from __future__ import annotations

import io
import logging
import random

from rich.console import Console
from rich.logging import RichHandler

from quasar.log import setup_logging
from quasar.terminal import TABLE_WIDTH, compact_rate, compact_table, log_table, rendered_text, short_hotkey


def wide_table(rng: random.Random):
    table = compact_table("speeds")
    for column in ("uid", "hotkey", "tokens/s"):
        table.add_column(column, no_wrap=True)
    rows = [
        (
            str(rng.randrange(256)),
            "5" + "".join(rng.choice("abcdefXYZ123") for _ in range(47)),
            compact_rate(rng.uniform(1, 3e8)),
        )
        for _ in range(5)
    ]
    for row in rows:
        table.add_row(row[0], short_hotkey(row[1]), row[2])
    return table, rows


def test_a_plain_log_gets_the_table_in_one_record_at_80_columns():
    rng = random.Random()
    stream = io.StringIO()
    setup_logging(stream=stream)
    records = []
    collector = logging.Handler()
    collector.emit = records.append
    logging.getLogger().addHandler(collector)
    try:
        table, rows = wide_table(rng)
        log_table(logging.getLogger("quasar.test"), "weights set at block 7:", table)
    finally:
        logging.getLogger().removeHandler(collector)
    assert len(records) == 1
    lines = stream.getvalue().splitlines()
    assert "weights set at block 7:" in lines[0]
    assert all(len(line) <= TABLE_WIDTH for line in lines[1:])
    for uid, hotkey, rate in rows:
        assert any(short_hotkey(hotkey) in line and rate in line and uid in line for line in lines[1:])


def test_a_terminal_gets_the_table_printed_outside_the_record():
    out = io.StringIO()
    handler = RichHandler(console=Console(file=out, width=100, color_system=None))
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [handler]
    try:
        table, rows = wide_table(random.Random())
        log_table(logging.getLogger("quasar.test"), "ranking:", table)
    finally:
        root.handlers = saved
    lines = out.getvalue().splitlines()
    assert "ranking:" in lines[0]
    # Each row starts at the left edge, not in the record's message column.
    for uid, hotkey, rate in rows:
        assert any(line.startswith(f" {uid} ") and short_hotkey(hotkey) in line and rate in line for line in lines)


def test_nothing_is_shown_below_the_loggers_level():
    stream = io.StringIO()
    setup_logging(stream=stream)
    logging.getLogger("quasar.quiet").setLevel(logging.WARNING)
    log_table(logging.getLogger("quasar.quiet"), "hidden", wide_table(random.Random())[0])
    assert stream.getvalue() == ""


def test_compact_rate_against_the_plain_figure():
    rng = random.Random()
    for _ in range(1000):
        value = 10 ** rng.uniform(0, 9)
        shown = compact_rate(value)
        number, _, unit = shown.partition(" ")
        scale = {"M": 1e6, "k": 1e3, "": 1.0}[unit]
        assert abs(float(number.replace(",", "")) * scale - value) <= scale * (0.005 if unit == "M" else 0.05) + 0.5
    assert compact_rate(None) == "-"


def test_short_hotkeys_keep_both_ends():
    hotkey = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
    assert short_hotkey(hotkey) == "5GrwvaEF…utQY"
    assert short_hotkey("5short") == "5short"
    assert rendered_text("x" * 200, width=TABLE_WIDTH).count("\n") == 2
