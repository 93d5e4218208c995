"""``quasar bench api-month`` and ``validator-month`` (quasar/bench/api_month.py,
validator_month.py), at tiny sizes: the rows they write are the ones the API and the validator
read back, every read is timed, the files they keep hold what they say, the step's queries cost the
same at two sizes with the step's indexes and grow without them, and their tables fit 80 columns."""

from __future__ import annotations

import json
import sqlite3

import pytest

from quasar.bench import api_month, dashboard_pages, validator_month
from quasar.cli import main
from quasar.validator.state import ValidatorState


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


def count(path, sql: str) -> int:
    with sqlite3.connect(path) as connection:
        return connection.execute(sql).fetchone()[0]


def test_api_month_writes_each_day_and_times_every_read_on_what_the_api_reads_back(tmp_path, capsys):
    keep, figures_file = tmp_path / "keep", tmp_path / "figures.json"
    argv = ["--days", "1", "2", "--miners", "4", "--commitments", "300", "600", "--keep", str(keep)]
    assert main(["bench", "api-month", *argv, "--json", str(figures_file)]) == 0
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines()), printed
    assert "day 1" in printed and "day 2" in printed and "reports of a validator with none" in printed
    figures = json.loads(figures_file.read_text())
    rounds = api_month.ROUNDS_PER_DAY
    assert [(day["day"], day["rounds"], day["submissions"]) for day in figures["days"]] == [
        (1, rounds, rounds * 4 * 12),
        (2, 2 * rounds, 2 * rounds * 4 * 12),
    ]
    for day in figures["days"]:
        assert list(day["reads"]) == [key for key, _ in api_month.READS]
        assert all(t["n"] == 7 and t["min_ms"] <= t["median_ms"] <= t["max_ms"] for t in day["reads"].values())
        # The API read the rows back: the newest round's 4 miners x 4 evaluated submissions judged,
        # and a round of the bounded history for every round written (fewer than HISTORY_ROUNDS).
        assert day["judged"] == 4 * 4 and day["history_rounds"] == day["rounds"]
    database = keep / api_month.DATABASE_FILE
    assert count(database, "SELECT count(*) FROM submissions") == 2 * rounds * 4 * 12
    assert count(database, "SELECT count(*) FROM submissions WHERE state = 'ready'") == 2 * rounds * 4 * 4
    assert count(database, "SELECT count(*) FROM evaluation_reports") == 2 * rounds * 4 * 4 * 3
    commitments = figures["commitments"]
    assert [(each["commitments"], each["shown"], each["timing"]["n"]) for each in commitments] == [
        (300, 100, 5),
        (600, 100, 5),
    ]
    assert count(keep / api_month.COMMITMENTS_FILE, "SELECT count(*) FROM submissions WHERE state = 'committed'") == 600


def test_validator_month_keeps_a_state_file_with_its_rows_and_its_indexes(tmp_path, capsys):
    keep, figures_file = tmp_path / "keep", tmp_path / "figures.json"
    argv = ["--evaluations", "200", "400", "--keep", str(keep), "--json", str(figures_file)]
    assert main(["bench", "validator-month", *argv]) == 0
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines()), printed
    assert "scored()" in printed and "│         400 │" in printed
    figures = json.loads(figures_file.read_text())
    assert [(each["evaluations"], each["scored_rows"]) for each in figures] == [(200, 200), (400, 400)]
    assert all(each["indexed"]["n"] == 5 and each["scanned"]["n"] == 5 for each in figures)
    state = keep / validator_month.STATE_FILE
    assert count(state, "SELECT count(*) FROM evaluations") == 400
    assert count(state, "SELECT count(*) FROM submissions WHERE report_state = 'reported'") == 400
    # The indexes dropped for the "before" figures are back in the file kept.
    with sqlite3.connect(state) as connection:
        indexes = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert set(validator_month.STEP_INDEXES) <= indexes


def test_a_steps_queries_cost_the_same_at_two_sizes_with_the_step_indexes_and_grow_without(tmp_path):
    """SQLite's virtual-machine instructions, counted: a measure of the work that does not vary
    with the machine's load, as the timings do."""

    def instructions(state: ValidatorState) -> int:
        done = [0]

        def tick() -> int:
            done[0] += 1
            return 0

        state._connection.set_progress_handler(tick, 1)
        validator_month.step(state)
        state._connection.set_progress_handler(None, 1)
        return done[0]

    indexed, scanned = [], []
    with ValidatorState.open(tmp_path / "state.sqlite3") as state:
        for ids in (range(0, 200), range(200, 400)):
            validator_month.fill(state, ids)
            indexed.append(instructions(state))
            with validator_month.without_step_indexes(state._connection):
                scanned.append(instructions(state))
        assert instructions(state) == indexed[-1]  # the indexes made again
    assert indexed[0] == indexed[1], indexed
    assert scanned[1] > scanned[0] + 200 and scanned[0] > indexed[0], (scanned, indexed)


def test_a_folder_holding_an_earlier_runs_file_is_refused_and_the_file_kept(tmp_path, capsys):
    earlier = tmp_path / validator_month.STATE_FILE
    earlier.write_bytes(b"an earlier run")
    with pytest.raises(SystemExit, match="is there from an earlier run"):
        main(["bench", "validator-month", "--evaluations", "10", "--keep", str(tmp_path)])
    assert earlier.read_bytes() == b"an earlier run"
    for argv in (["api-month", "--days", "7", "1"], ["validator-month", "--evaluations", "10", "10"]):
        with pytest.raises(SystemExit) as exited:
            main(["bench", *argv])
        assert exited.value.code == 2 and "each must be larger than the one before" in capsys.readouterr().err


def test_a_json_file_or_keep_folder_that_cannot_be_written_is_refused_before_the_measuring(tmp_path, capsys):
    """--json was written only after the measuring (minutes at a month's size) and --keep made when it
    began: a folder missing or a file in the way ended the run in a traceback, the figures lost."""
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    cases = [
        (["--json", str(tmp_path / "missing" / "figures.json")], "--json", "no folder"),
        (["--json", str(tmp_path)], "--json", "is a folder"),
        (["--keep", str(blocker / "keep")], "--keep", "cannot make"),
    ]
    sizes = {"api-month": ["--days", "1", "--miners", "1"], "validator-month": ["--evaluations", "10"]}
    for command, sized in sizes.items():
        for argv, flag, why in cases:
            with pytest.raises(SystemExit) as exited:
                main(["bench", command, *sized, *argv])
            said = " ".join(f"{exited.value.code} {capsys.readouterr().err}".split())
            assert flag in said and why in said, said


def test_dashboard_pages_serves_api_months_database_and_times_every_page(tmp_path, capsys):
    """``quasar bench dashboard-pages`` over the database api-month kept: every page it names
    answers 200 (a target missing from the file would stop it naming the path), each is timed as
    many times as asked, and its table fits 80 columns."""
    keep, figures_file = tmp_path / "keep", tmp_path / "pages.json"
    assert main(["bench", "api-month", "--days", "1", "--miners", "4", "--keep", str(keep)]) == 0
    capsys.readouterr()
    database = keep / api_month.DATABASE_FILE
    argv = [str(database), "--days", "1", "--miners", "4", "--repeats", "2", "--json", str(figures_file)]
    assert main(["bench", "dashboard-pages", *argv]) == 0
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines()), printed
    figures = json.loads(figures_file.read_text())
    assert [each["page"] for each in figures] == list(dashboard_pages.page_targets(1, 4, 2))
    assert all(each["first"]["n"] == 2 and each["kept"]["n"] == 2 and each["kilobytes"] > 1 for each in figures)
    with pytest.raises(SystemExit, match="2"):
        main(["bench", "dashboard-pages", str(database), "--days", "1", "--miners", "4", "--repeats", "3"])
    assert "needs 6 miners' pages" in capsys.readouterr().err
