"""A validator whose submission API moves to another database: a fresh one (a new server, a switch
from PostgreSQL to SQLite, a database lost), whose ids start at 1 again, or a backup older than what
the validator fetched, whose ids go back and are given to other submissions. The API's id alone
names a submission only within one database: the validator knows a submission by its id and its
content (docs/validator.md, "When the API's database is replaced"). A real API over SQLite files on
127.0.0.1, the dev chain and the validator's own loop; the GPU is a stand-in that measures a known
speed, and holds an evaluation for as long as a test says."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from sqlalchemy import select

from api_fixtures import FORK, ApiServer, api_config, commit_of
from quasar import config
from quasar.api.client import ApiClient, Claim
from quasar.api.db import EvaluationReport, Submission
from quasar.api.schemas import MAX_ID
from quasar.validator.devices import Device
from quasar.validator.evaluator import EvaluationOutcome
from quasar.validator.loop import Validator
from quasar.validator.records import EvaluationKey, EvaluationResult
from quasar.validator.state import ValidatorState
from quasar.validator.state_files import IMPORTED_AFTER, REFUSED, REPORTED
from test_validator_hosts import Passing

SPEEDS = {"a": 3e5, "b": 2e5, "c": 1e5}
COMMITS = {name: commit_of(n + 1) for n, name in enumerate(SPEEDS)}
TARGET = 1_000_000


class Evaluation:
    """Done, at its miner's known speed, as soon as it starts, unless its commit is held."""

    def __init__(self, key: EvaluationKey, device: Device, speed: float, held: set[str]):
        self.key, self.device, self.held = key, device, held
        result = EvaluationResult(correct=True, measured_tokens_per_sec=speed, benchmarks={TARGET: speed})
        self._outcome = EvaluationOutcome(result=result)

    def poll(self) -> EvaluationOutcome | None:
        return None if self.key.commit_hash in self.held else self._outcome

    def cancel(self) -> None:
        pass

    def kill(self) -> None:
        pass


class KnownSpeeds:
    def __init__(self):
        self.speeds = {commit: SPEEDS[name] for name, commit in COMMITS.items()}
        self.held: set[str] = set()
        self.started: list[str] = []

    def start(self, key: EvaluationKey, device: Device) -> Evaluation:
        self.started.append(key.commit_hash)
        return Evaluation(key, device, self.speeds[key.commit_hash], self.held)


@pytest.fixture
def subnet(chain, wallets):
    for name in SPEEDS:
        chain.publish_endpoint(wallets[name], "192.0.2.1", 8001)
    chain.register_wallet(wallets["stranger"])
    chain.set_owner(wallets["stranger"].hotkey.ss58_address)
    chain.set_hyperparameters(commit_reveal_enabled=False, weights_rate_limit=0)
    return chain


@contextmanager
def serving(chain, wallets, path: Path) -> Iterator[ApiServer]:
    """The API over the SQLite file ``path`` (created when missing)."""
    with ApiServer(api_config(wallets["api"].hotkey.ss58_address), chain, f"sqlite:///{path}") as server:
        yield server


def submit(server: ApiServer, wallets, miner: str) -> int:
    with ApiClient(server.url, wallets[miner], api_hotkey=wallets["api"].hotkey.ss58_address) as client:
        return client.submit_kernel(Claim(FORK, COMMITS[miner], SPEEDS[miner]), TARGET).submission_id


@contextmanager
def validators(chain, wallets, tmp_path: Path, url: str, roles: dict[str, int]) -> Iterator[dict[str, Validator]]:
    """A process of v1 per role (its devices), each with its state file and client of the API at ``url``."""
    with ExitStack() as stack:
        running = {}
        for role, devices in roles.items():
            settings = config.resolve(
                {"network": "devchain", "netuid": "24", "device": "cpu", "epoch_blocks": "100", "validator_role": role},
                environ={},
                dotenv_path=None,
            )
            state = stack.enter_context(ValidatorState.open(tmp_path / f"{role}.sqlite3"))
            api = stack.enter_context(ApiClient(url, wallets["v1"], api_hotkey=wallets["api"].hotkey.ss58_address))
            running[role] = Validator(
                settings,
                chain,
                api,
                wallets["v1"],
                KnownSpeeds(),
                Passing(),
                state,
                devices=[Device(f"gpu{n}", str(n)) for n in range(devices)],
            )
        yield running


def move(validator: Validator, server: ApiServer) -> None:
    """Where the subnet owner publishes the API's new address (quasar.api.lookup.ApiFollower)."""
    validator.api.retarget(server.url, None)


def reports(server: ApiServer) -> dict[int, tuple[str, float | None]]:
    """The API's reports, by submission: the commit of the submission and the figure reported on it."""
    with server.database.read() as session:
        rows = session.execute(
            select(
                EvaluationReport.submission_id, Submission.commit_hash, EvaluationReport.measured_tokens_per_sec
            ).join(Submission, Submission.id == EvaluationReport.submission_id)
        )
        return {submission_id: (commit, measured) for submission_id, commit, measured in rows}


def steps(validator: Validator, count: int) -> None:
    for _ in range(count):
        assert not validator.step().failed_phases


def test_a_fresh_api_database_whose_ids_start_again_gets_its_submissions_evaluated(subnet, wallets, tmp_path, caplog):
    """Before: the validator took B's submission 1 for A's submission 1 that it had evaluated, and
    never evaluated it (nor any submission of B below A's last id), saying nothing."""
    with serving(subnet, wallets, tmp_path / "a.sqlite3") as a:
        assert [submit(a, wallets, "a"), submit(a, wallets, "b")] == [1, 2]
        with validators(subnet, wallets, tmp_path, a.url, {"full": 2}) as running:
            validator = running["full"]
            steps(validator, 3)
            assert reports(a) == {1: (COMMITS["a"], 3e5), 2: (COMMITS["b"], 2e5)}
            with serving(subnet, wallets, tmp_path / "b.sqlite3") as b:
                move(validator, b)
                assert submit(b, wallets, "c") == 1
                steps(validator, 3)
                assert validator.evaluator.started == [COMMITS["a"], COMMITS["b"], COMMITS["c"]]
                assert reports(b) == {1: (COMMITS["c"], 1e5)}
            # A's submission 1 keeps its result, under an id of the validator's own, and ranks.
            ranked = {record.submission.hotkey: record.submission.submission_id for record in validator.state.scored()}
            hotkey = {name: wallets[name].hotkey.ss58_address for name in SPEEDS}
            assert ranked == {hotkey["c"]: 1, hotkey["b"]: 2, hotkey["a"]: MAX_ID + 1}
    assert f"the API's submission 1 is {hotkey['c']}'s" in caplog.text


def test_an_api_restored_from_an_older_backup_gets_no_result_under_another_submissions_id(
    subnet, wallets, tmp_path, caplog
):
    """The backup holds submission 1 only. b's submission 2 is being evaluated when the API is
    restored; c's submission then takes id 2. Before: the validator reported b's figure as c's
    submission's, and never reported submission 1 again, whose report the backup does not hold."""
    with serving(subnet, wallets, tmp_path / "a.sqlite3") as a:
        assert submit(a, wallets, "a") == 1
        with sqlite3.connect(tmp_path / "a.sqlite3") as live, sqlite3.connect(tmp_path / "backup.sqlite3") as copy:
            live.backup(copy)
        with validators(subnet, wallets, tmp_path, a.url, {"full": 2}) as running:
            validator = running["full"]
            steps(validator, 2)
            assert reports(a) == {1: (COMMITS["a"], 3e5)}
            validator.evaluator.held.add(COMMITS["b"])
            assert submit(a, wallets, "b") == 2
            steps(validator, 1)
            a.__exit__(None, None, None)
            with serving(subnet, wallets, tmp_path / "backup.sqlite3") as restored:
                move(validator, restored)
                assert submit(restored, wallets, "c") == 2
                steps(validator, 2)
                validator.evaluator.held.clear()
                steps(validator, 2)
                assert reports(restored) == {1: (COMMITS["a"], 3e5), 2: (COMMITS["c"], 1e5)}
            kept = {record.submission.commit_hash: record for record in validator.state.submissions()}
            assert kept[COMMITS["b"]].submission.submission_id == MAX_ID + 1
            assert (kept[COMMITS["b"]].report_state, kept[COMMITS["b"]].report_detail) == (
                REFUSED,
                "not reported: the API's submission 2 is another one now",
            )
            assert kept[COMMITS["a"]].report_state == REPORTED
    assert "handed out submission 1 again, which this validator reported" in caplog.text


def test_a_primary_reads_its_workers_reports_again_from_an_api_database_whose_ids_went_back(subnet, wallets, tmp_path):
    """The primary read its hotkey's reports up to A's report 2. Before: it kept asking B for the
    reports after 2, and never added its worker's results there (B's reports 1 and 2)."""
    with serving(subnet, wallets, tmp_path / "a.sqlite3") as a:
        submit(a, wallets, "a"), submit(a, wallets, "b")
        with validators(subnet, wallets, tmp_path, a.url, {"worker": 1, "primary": 1}) as running:
            worker, primary = running["worker"], running["primary"]
            for _ in range(2):
                steps(worker, 1), steps(primary, 1)
            assert primary.state.get_meta(IMPORTED_AFTER) == "2"
            with serving(subnet, wallets, tmp_path / "b.sqlite3") as b:
                move(worker, b), move(primary, b)
                assert [submit(b, wallets, "c"), submit(b, wallets, "a")] == [1, 2]
                steps(worker, 3)
                assert reports(b) == {1: (COMMITS["c"], 1e5), 2: (COMMITS["a"], 3e5)}
                steps(primary, 2)
            scored = {
                record.submission.submission_id: record.submission.commit_hash for record in primary.state.scored()
            }
            assert {1: scored.pop(1), 2: scored.pop(2)} == {1: COMMITS["c"], 2: COMMITS["a"]}
            # A's submissions 1 and 2, kept under ids of the primary's own.
            assert sorted(scored.values()) == [COMMITS["a"], COMMITS["b"]] and min(scored) > MAX_ID
