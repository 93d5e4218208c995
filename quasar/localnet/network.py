"""The local network: a whole QUASAR subnet on one machine, every part real. Its parts and the
order they start in are in parts.py (and docs/localnet.md); :class:`LocalNetwork` waits for the
round they play and reads its outcome from the API's database and the dev chain."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quasar.config import DEV_NETWORK
from quasar.localnet.host import read_weights_block
from quasar.localnet.options import (
    MINERS,
    NETUID,
    OWNER,
    VALIDATOR,
    LocalnetError,
    LocalnetOptions,
    evaluated_lengths,
)
from quasar.localnet.parts import NetworkParts, Progress
from quasar.localnet.processes import Child, wait_until
from quasar.localnet.summary import (
    MinerOutcome,
    RoundSummary,
    leaderboard_rows,
    miner_weight,
    verdict_of,
)

if TYPE_CHECKING:
    from quasar.api.db import Database, EvaluationReport


@dataclass(frozen=True)
class Submitted:
    """A miner's accepted submission."""

    name: str
    kind: str
    uid: int
    hotkey: str
    submission_id: int
    round_id: int
    fork_url: str
    commit: str
    target_sequence_length: int
    claimed_tokens_per_sec: float


class LocalNetwork(NetworkParts):
    """One local network in ``options.data_dir``; :meth:`start`, :meth:`wait_for_round`, :meth:`stop`."""

    def __init__(self, options: LocalnetOptions, progress: Progress, stop: threading.Event | None = None):
        super().__init__(options, progress)
        # Set by a stop signal (quasar/localnet/cli.py): the waits end on it even where Python
        # dropped the signal's KeyboardInterrupt.
        self.stop_requested = stop if stop is not None else threading.Event()
        self.database: Database | None = None
        self.submitted: list[Submitted] = []

    def start(self) -> None:
        """Build the network, start every process, and wait until both miners have submitted."""
        self._wait_for_submissions(self.start_parts())

    def _raise_if_stopped(self) -> None:
        if self.stop_requested.is_set():
            raise KeyboardInterrupt("stop requested")

    # --- the submissions ---

    def _wait_for_submissions(self, watched: list[Child]) -> None:
        """Wait until each miner has a submission in the API; a miner whose own evaluation failed
        (it does not submit) is a :class:`LocalnetError`."""
        self.progress.step("the miners fork, clone and evaluate their forks (sandboxed), push and submit")

        def submitted_all() -> bool:
            found = self._submissions()
            states = [
                f"{name}: "
                + (
                    f"submitted {found[name].commit[:12]} at T={found[name].target_sequence_length:,}"
                    if name in found
                    else self._miner_stage(name)
                )
                for name in MINERS.values()
            ]
            self.progress.detail(", ".join(states))
            return len(found) == len(MINERS)

        wait_until(
            submitted_all,
            self.options.round_timeout_s,
            f"the miners' submissions (their logs: {self.logs_dir}/miner-*.log)",
            watched,
            poll_s=0.5,
            on_poll=self._raise_if_stopped,
        )
        found = self._submissions()
        self.submitted = [found[name] for name in MINERS.values()]

    def _submissions(self) -> dict[str, Submitted]:
        """Each miner's first evaluable submission in the API, by miner name."""
        from sqlalchemy import select

        from quasar.api.db import Submission

        names = {self.hotkey(name): name for name in MINERS.values()}
        kinds = {name: kind for kind, name in MINERS.items()}
        found: dict[str, Submitted] = {}
        with self._database().read() as session:
            rows = session.scalars(
                select(Submission)
                .where(Submission.hotkey.in_(names), Submission.state == "ready")
                .order_by(Submission.id)
            )
            for row in rows:
                name = names[row.hotkey]
                found.setdefault(
                    name,
                    Submitted(
                        name=name,
                        kind=kinds[name],
                        uid=self.uids[name],
                        hotkey=row.hotkey,
                        submission_id=row.id,
                        round_id=row.round_id or 0,
                        fork_url=row.fork_url or "",
                        commit=row.commit_hash or "",
                        target_sequence_length=row.target_sequence_length,
                        claimed_tokens_per_sec=float(row.claimed_tokens_per_sec or 0.0),
                    ),
                )
        return found

    def _miner_stage(self, name: str) -> str:
        """What miner ``name`` is doing before it submits, from its workspace; raises
        :class:`LocalnetError` when its evaluation of its own fork failed."""
        from quasar.evaluate import EvaluationReport
        from quasar.miner.workspace import Workspace

        workspace = Workspace(self.miners_dir, self.hotkey(name))
        latest = workspace.reports / "latest.json"
        if not workspace.fork.is_dir():
            return "forking and cloning"
        if not latest.is_file():
            return "evaluating its fork"
        report = EvaluationReport.from_dict(json.loads(latest.read_text()))
        if not report.passed:
            raise LocalnetError(
                f"{name}'s fork failed its own evaluation on {self.options.device}, so it does not "
                f"submit: {'; '.join(report.reasons) or 'no measurement'} (its log: "
                f"{self.logs_dir / (name + '.log')})"
            )
        return "evaluated, submitting"

    # --- the round ---

    def _reports(self) -> dict[int, EvaluationReport]:
        """The validator's reports on this network's submissions, by submission id."""
        from sqlalchemy import select

        from quasar.api.db import EvaluationReport

        ids = [s.submission_id for s in self.submitted]
        with self._database().read() as session:
            rows = session.scalars(
                select(EvaluationReport).where(
                    EvaluationReport.submission_id.in_(ids), EvaluationReport.validator_hotkey == self.hotkey(VALIDATOR)
                )
            )
            return {row.submission_id: row for row in rows}

    def _database(self) -> Database:
        """The API's database, read directly (the local network's own, on SQLite)."""
        from quasar.api.db import Database

        if self.database is None:
            self.database = Database(self.api_database_url)
        return self.database

    def _leased(self) -> set[int]:
        from sqlalchemy import select

        from quasar.api.db import EvaluationLease

        with self._database().read() as session:
            return set(
                session.scalars(
                    select(EvaluationLease.submission_id).where(
                        EvaluationLease.validator_hotkey == self.hotkey(VALIDATOR)
                    )
                )
            )

    def _state_path(self) -> Path:
        from quasar.validator.state_files import default_state_path

        return default_state_path(self.validator_dir, DEV_NETWORK, NETUID, self.hotkey(VALIDATOR))

    def wait_for_round(self) -> RoundSummary:
        """Wait until the validator has reported on every submission and set weights after that;
        raise :class:`~quasar.localnet.processes.ChildFailed` if a child exits meanwhile."""
        assert self.validator is not None, "start() first"
        watched = list(self.children.running)
        self.progress.step("the validator fetches, evaluates (sandboxed), checks logits and reports")

        def reported_all() -> bool:
            reports, leased = self._reports(), self._leased()
            states = []
            for s in self.submitted:
                if s.submission_id in reports:
                    states.append(f"{s.name}: {verdict_of(reports[s.submission_id].verdict)}")
                elif s.submission_id in leased:
                    states.append(f"{s.name}: being evaluated")
                else:
                    states.append(f"{s.name}: waiting for the validator")
            self.progress.detail("validator: " + ", ".join(states))
            return len(reports) == len(self.submitted)

        wait_until(
            reported_all,
            self.options.round_timeout_s,
            "the validator's reports",
            watched,
            poll_s=0.5,
            on_poll=self._raise_if_stopped,
        )
        after = self.chain.current_block()
        self.progress.step(f"every submission is reported (block {after}); waiting for the validator's next weights")
        state_path = self._state_path()
        rules = self.options.hyperparameters
        # The next epoch, the rate limit and (commit-reveal) the epochs until the reveal, with room.
        blocks = self.options.epoch_blocks + rules.weights_rate_limit + rules.tempo * (rules.reveal_period_epochs + 1)
        timeout_s = max(60.0, 2 * blocks * self.options.block_time_s)
        wait_until(
            lambda: (read_weights_block(state_path) or -1) > after,
            timeout_s,
            "the validator's weights",
            watched,
            poll_s=0.2,
            on_poll=self._raise_if_stopped,
        )
        weights_block = read_weights_block(state_path) or after
        if rules.commit_reveal_enabled:
            self.progress.step(
                f"the validator committed weights at block {weights_block}; waiting for the chain to reveal them"
            )
            wait_until(
                lambda: self._revealed(weights_block),
                timeout_s,
                "the reveal of the validator's weights",
                watched,
                poll_s=0.2,
                on_poll=self._raise_if_stopped,
            )
        return self.summary(weights_block)

    def _revealed(self, commit_block: int) -> bool:
        """Whether the validator's commit of ``commit_block`` is revealed; LocalnetError when the chain
        dropped it (its weights broke a rule when they were revealed)."""
        validator = self.hotkey(VALIDATOR)
        commit = next(
            (c for c in self.chain.commits() if c.hotkey == validator and c.commit_block >= commit_block), None
        )
        if commit is None or commit.outcome is None:
            return False
        if commit.outcome != "revealed":
            raise LocalnetError(
                f"the chain dropped the validator's weights committed at block {commit_block} at their "
                f"reveal: {commit.outcome}"
            )
        return True

    def watch(self, on_new_weights: Callable[[RoundSummary], None], poll_s: float = 2.0) -> None:
        """Keep the network running until interrupted; call ``on_new_weights`` whenever the
        validator's weights on chain change (a submission from outside was ranked, say)."""
        last = self.chain.weights().get(self.uids[VALIDATOR], {})
        state_path = self._state_path()
        while True:
            self._raise_if_stopped()
            self.check_running()
            weights = self.chain.weights().get(self.uids[VALIDATOR], {})
            if weights != last:
                last = weights
                on_new_weights(self.summary(read_weights_block(state_path) or self.chain.current_block()))
            self.stop_requested.wait(poll_s)

    def summary(self, weights_block: int) -> RoundSummary:
        """The round as it stands: reports from the API, the leaderboard, the weights on chain."""
        from quasar.api.client import ApiClient

        reports = self._reports()
        weights = self.chain.weights().get(self.uids[VALIDATOR], {})
        round_id = self.submitted[0].round_id if self.submitted else 0
        with ApiClient(self.api_url) as client:
            board = client.leaderboard(round_id)
        uids_by_hotkey = {self.hotkey(name): uid for name, uid in self.uids.items()}
        miners = []
        for s in self.submitted:
            report = reports.get(s.submission_id)
            measured = None if report is None else report.measured_tokens_per_sec
            miners.append(
                MinerOutcome(
                    name=s.name,
                    kind=s.kind,
                    uid=s.uid,
                    hotkey=s.hotkey,
                    submission_id=s.submission_id,
                    fork_url=s.fork_url,
                    commit=s.commit,
                    target_sequence_length=s.target_sequence_length,
                    claimed_tokens_per_sec=s.claimed_tokens_per_sec,
                    verdict=verdict_of(None if report is None else report.verdict),
                    measured_tokens_per_sec=None if measured is None or not math.isfinite(measured) else measured,
                    reasons=tuple(report.reasons) if report is not None else (),
                    weight=miner_weight(weights, s.uid),
                )
            )
        notes = [self.reference_note]
        if self.options.device == "cpu":
            notes.append("evaluated on CPU at small lengths: tokens/s here are not benchmarks (CUDA is what counts)")
        return RoundSummary(
            weights=dict(weights),
            miners=tuple(miners),
            leaderboard=leaderboard_rows(board.entries, uids_by_hotkey),
            round_id=round_id,
            owner_uid=self.uids[OWNER],
            validator_uid=self.uids[VALIDATOR],
            weights_block=weights_block,
            device=self.options.device,
            reference_model=self.reference_model,
            seq_lens=evaluated_lengths(self.options),
            api_url=self.api_url,
            data_dir=str(self.data_dir),
            notes=tuple(notes),
        )

    def stop(self) -> None:
        """Stop every part (:meth:`NetworkParts.stop`) and let go of the API's database."""
        super().stop()
        if self.database is not None:
            self.database.dispose()
            self.database = None
