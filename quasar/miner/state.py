"""What the miner remembers across restarts, in ``state.json`` of its workspace, written atomically.

- ``best``: the best commit so far and what the harness measured for it;
- ``last_submission``: what was last submitted (the miner resubmits only on improvement, or when
  the API no longer holds it: quasar/miner/submission.py);
- ``pending_reveal``: a commit-reveal in flight, with its salt. It is written *before* the
  commitment is sent, so a crash between the two never loses the salt: after a restart the
  miner finds its commitment (or sends it again) and reveals it when the chain allows;
- ``target_seq_len`` and the commit it was chosen on;
- ``attempts``: the latest candidates tried, so a restart does not try them again.

Every write goes to a temporary file in the same folder, is flushed to disk and renamed over
the old file: a crash leaves either the old state or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quasar import scoring
from quasar.errors import QuasarError
from quasar.miner.files import replace_file
from quasar.miner.strategies.base import Attempt

STATE_FORMAT = 1
MAX_ATTEMPTS_KEPT = 500


class MinerStateError(QuasarError, ValueError):
    """The state file cannot be read; the message names the file and the field."""


def _check(data: Mapping[str, Any], name: str, kinds: tuple[type, ...], where: str, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        expected = " or ".join(kind.__name__ for kind in kinds)
        raise ValueError(f"{where}.{name}: expected {expected}, got {value!r}")
    return value


def _benchmarks(data: Mapping[str, Any], where: str) -> dict[int, float]:
    raw = data.get("benchmarks") or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}.benchmarks: expected an object")
    try:
        return {int(length): float(tps) for length, tps in raw.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{where}.benchmarks: expected {{length: tokens/sec}}") from None


@dataclass(frozen=True)
class Measurement:
    """What the harness measured for one commit at one target length, and the claim it supports."""

    commit: str
    target_seq_len: int
    tokens_per_sec: float
    claim: float  # the harness's recommended claim: target / slowest timed run
    benchmarks: dict[int, float] = field(default_factory=dict)
    vram_mb: int | None = None
    device_name: str = ""
    cv: float | None = None  # coefficient of variation of the timed runs at the target

    @property
    def weighted_score(self) -> float:
        """The claim times the league multiplier: what validators will rank (docs/rules.md section 5)."""
        return self.claim * scoring.league_for(self.target_seq_len).multiplier

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["benchmarks"] = {str(k): v for k, v in self.benchmarks.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Measurement:
        return cls(
            commit=_check(data, "commit", (str,), where),
            target_seq_len=_check(data, "target_seq_len", (int,), where),
            tokens_per_sec=float(_check(data, "tokens_per_sec", (int, float), where)),
            claim=float(_check(data, "claim", (int, float), where)),
            benchmarks=_benchmarks(data, where),
            vram_mb=_check(data, "vram_mb", (int,), where, optional=True),
            device_name=_check(data, "device_name", (str,), where, optional=True) or "",
            cv=_check(data, "cv", (int, float), where, optional=True),
        )


@dataclass(frozen=True)
class SubmissionRecord:
    """A submission the API accepted (direct, or a revealed commitment)."""

    submission_id: int | None
    mode: str
    fork_url: str
    measurement: Measurement
    submitted_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "submission_id": self.submission_id,
            "mode": self.mode,
            "fork_url": self.fork_url,
            "measurement": self.measurement.to_dict(),
            "submitted_at": self.submitted_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> SubmissionRecord:
        measurement = _check(data, "measurement", (dict,), where)
        return cls(
            submission_id=_check(data, "submission_id", (int,), where, optional=True),
            mode=_check(data, "mode", (str,), where),
            fork_url=_check(data, "fork_url", (str,), where),
            measurement=Measurement.from_dict(measurement, f"{where}.measurement"),
            submitted_at=float(_check(data, "submitted_at", (int, float), where)),
        )


@dataclass(frozen=True)
class PendingReveal:
    """A commit-reveal in flight. ``submission_id`` is None until the API has acknowledged the commitment."""

    salt: str
    fork_url: str
    commitment_hash: str
    measurement: Measurement
    created_at: float
    submission_id: int | None = None
    reveal_from_block: int | None = None
    reveal_until_block: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["measurement"] = self.measurement.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> PendingReveal:
        measurement = _check(data, "measurement", (dict,), where)
        return cls(
            salt=_check(data, "salt", (str,), where),
            fork_url=_check(data, "fork_url", (str,), where),
            commitment_hash=_check(data, "commitment_hash", (str,), where),
            measurement=Measurement.from_dict(measurement, f"{where}.measurement"),
            created_at=float(_check(data, "created_at", (int, float), where)),
            submission_id=_check(data, "submission_id", (int,), where, optional=True),
            reveal_from_block=_check(data, "reveal_from_block", (int,), where, optional=True),
            reveal_until_block=_check(data, "reveal_until_block", (int,), where, optional=True),
        )


@dataclass
class MinerState:
    """Everything in ``state.json`` (see the module docstring)."""

    hotkey: str
    fork_url: str | None = None
    target_seq_len: int | None = None
    target_commit: str | None = None
    best: Measurement | None = None
    last_submission: SubmissionRecord | None = None
    pending_reveal: PendingReveal | None = None
    attempts: list[Attempt] = field(default_factory=list)

    def record(self, attempt: Attempt) -> None:
        """Remember ``attempt``, keeping the newest :data:`MAX_ATTEMPTS_KEPT`."""
        self.attempts.append(attempt)
        del self.attempts[:-MAX_ATTEMPTS_KEPT]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "hotkey": self.hotkey,
            "fork_url": self.fork_url,
            "target_seq_len": self.target_seq_len,
            "target_commit": self.target_commit,
            "best": self.best.to_dict() if self.best else None,
            "last_submission": self.last_submission.to_dict() if self.last_submission else None,
            "pending_reveal": self.pending_reveal.to_dict() if self.pending_reveal else None,
            "attempts": [attempt.to_dict() for attempt in self.attempts],
        }

    @classmethod
    def from_dict(cls, data: Any) -> MinerState:
        """Rebuild from :meth:`to_dict`; raises ValueError naming the first bad field."""
        if not isinstance(data, dict):
            raise ValueError("the state must be a JSON object")
        if data.get("format") != STATE_FORMAT:
            raise ValueError(f"format: expected {STATE_FORMAT}, got {data.get('format')!r}")
        where = "state"
        best = _check(data, "best", (dict,), where, optional=True)
        last = _check(data, "last_submission", (dict,), where, optional=True)
        pending = _check(data, "pending_reveal", (dict,), where, optional=True)
        attempts = _check(data, "attempts", (list,), where, optional=True) or []
        parsed_attempts = []
        for index, item in enumerate(attempts):
            try:
                parsed_attempts.append(Attempt.from_dict(item))
            except (ValueError, TypeError) as error:
                raise ValueError(f"state.attempts[{index}]: {error}") from None
        return cls(
            hotkey=_check(data, "hotkey", (str,), where),
            fork_url=_check(data, "fork_url", (str,), where, optional=True),
            target_seq_len=_check(data, "target_seq_len", (int,), where, optional=True),
            target_commit=_check(data, "target_commit", (str,), where, optional=True),
            best=Measurement.from_dict(best, "state.best") if best else None,
            last_submission=SubmissionRecord.from_dict(last, "state.last_submission") if last else None,
            pending_reveal=PendingReveal.from_dict(pending, "state.pending_reveal") if pending else None,
            attempts=parsed_attempts,
        )


class StateStore:
    """``state.json`` at ``path``: :meth:`load` once at start, :meth:`save` after every change."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def load(self, hotkey: str) -> MinerState:
        """The saved state, or a fresh one when there is none; :class:`MinerStateError` when unreadable."""
        if not self.path.exists():
            return MinerState(hotkey=hotkey)
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            state = MinerState.from_dict(data)
        except (OSError, UnicodeDecodeError) as error:
            raise MinerStateError(f"cannot read the miner state {self.path}: {error}") from None
        except ValueError as error:
            raise MinerStateError(
                f"the miner state {self.path} is damaged ({error}); move it away to start afresh "
                "(a pending commit-reveal's salt is in it)"
            ) from None
        if state.hotkey != hotkey:
            raise MinerStateError(f"the miner state {self.path} belongs to hotkey {state.hotkey}, not {hotkey}")
        return state

    def save(self, state: MinerState) -> None:
        """Write ``state`` whole and durably (quasar/miner/files.py); mode 0600. A write that fails
        (a full disk) leaves the previous file as it was and raises an OSError naming it."""
        text = json.dumps(state.to_dict(), indent=2, allow_nan=False)
        replace_file(self.path, text, "save the miner state", durable=True, says_kept=True)
