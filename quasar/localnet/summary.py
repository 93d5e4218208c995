"""What one round of the local network ended with, as data (pure), as JSON and as rich tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape

from quasar.terminal import compact_rate, compact_table, short_hotkey

# A miner's verdict in the summary: the validator's report ("passed"/"failed"), or none yet.
PASS, FAIL, NOT_REPORTED = "pass", "fail", "not reported"
_VERDICTS = {"passed": PASS, "failed": FAIL}


def verdict_of(reported: str | None) -> str:
    """The summary's verdict for the API report verdict ``reported`` (None: no report)."""
    if reported is None:
        return NOT_REPORTED
    if reported not in _VERDICTS:
        raise ValueError(f"unknown report verdict {reported!r}; expected passed or failed")
    return _VERDICTS[reported]


@dataclass(frozen=True)
class MinerOutcome:
    """One miner of the local network and how its submission fared."""

    name: str
    kind: str
    uid: int
    hotkey: str
    submission_id: int
    fork_url: str
    commit: str
    target_sequence_length: int
    claimed_tokens_per_sec: float
    verdict: str
    measured_tokens_per_sec: float | None
    reasons: tuple[str, ...]
    weight: float


@dataclass(frozen=True)
class LeaderboardRow:
    """One placed entry of the API's leaderboard for the round."""

    place: int
    uid: int | None
    hotkey: str
    league: str
    measured_tokens_per_sec: float
    weighted_score: float
    share: float


@dataclass(frozen=True)
class RoundSummary:
    """The outcome of a round: the validator's weights on chain (uid -> weight), each miner, the
    API's leaderboard, and where the network ran."""

    weights: dict[int, float]
    miners: tuple[MinerOutcome, ...]
    leaderboard: tuple[LeaderboardRow, ...]
    round_id: int
    owner_uid: int
    validator_uid: int
    weights_block: int
    device: str
    reference_model: str
    seq_lens: tuple[int, ...]
    api_url: str
    data_dir: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object: ``weights`` maps each uid (a string) to its weight; ``miners`` lists
        uid, hotkey, kind and verdict (and the rest of each miner's outcome)."""
        return {
            "weights": {str(uid): weight for uid, weight in sorted(self.weights.items())},
            "miners": [
                {
                    "uid": m.uid,
                    "hotkey": m.hotkey,
                    "kind": m.kind,
                    "verdict": m.verdict,
                    "name": m.name,
                    "submission_id": m.submission_id,
                    "fork_url": m.fork_url,
                    "commit": m.commit,
                    "target_sequence_length": m.target_sequence_length,
                    "claimed_tokens_per_sec": m.claimed_tokens_per_sec,
                    "measured_tokens_per_sec": m.measured_tokens_per_sec,
                    "reasons": list(m.reasons),
                    "weight": m.weight,
                }
                for m in self.miners
            ],
            "leaderboard": [
                {
                    "place": r.place,
                    "uid": r.uid,
                    "hotkey": r.hotkey,
                    "league": r.league,
                    "measured_tokens_per_sec": r.measured_tokens_per_sec,
                    "weighted_score": r.weighted_score,
                    "share": r.share,
                }
                for r in self.leaderboard
            ],
            "round_id": self.round_id,
            "owner_uid": self.owner_uid,
            "validator_uid": self.validator_uid,
            "weights_block": self.weights_block,
            "device": self.device,
            "reference_model": self.reference_model,
            "seq_lens": list(self.seq_lens),
            "api_url": self.api_url,
            "data_dir": self.data_dir,
            "notes": list(self.notes),
        }


def miner_weight(weights: Mapping[int, float], uid: int) -> float:
    """The weight on ``uid`` (0 when the validator set none on it)."""
    return float(weights.get(uid, 0.0))


def render_summary(summary: RoundSummary, console: Console, uid_names: Mapping[int, str]) -> None:
    """Print the miners, the API's leaderboard and the weights on chain as tables that fit 80
    columns (a failed miner's first reason is listed under the miners' table).

    ``uid_names`` names the network's neurons by uid (owner, validator, miners) for the weights table.
    """
    miners = compact_table(f"Miners (round {summary.round_id}, evaluated on {summary.device})")
    for column in ("uid", "miner", "fork", "target", "claimed", "measured", "verdict"):
        miners.add_column(
            column,
            justify="right" if column in ("uid", "target", "claimed", "measured") else "left",
            no_wrap=column != "miner",
        )
    reasons = []
    for m in summary.miners:
        style = "green" if m.verdict == PASS else "red" if m.verdict == FAIL else "yellow"
        miners.add_row(
            str(m.uid),
            escape(m.name),
            escape(m.kind),
            f"{m.target_sequence_length:,}",
            compact_rate(m.claimed_tokens_per_sec),
            compact_rate(m.measured_tokens_per_sec),
            f"[{style}]{m.verdict}[/{style}]",
        )
        if m.reasons and m.verdict != PASS:
            reasons.append(f"uid {m.uid} {escape(m.name)}: {escape(m.reasons[0])}")
    console.print(miners)
    for reason in reasons:
        console.print(reason, highlight=False)

    board = compact_table(f"Leaderboard of round {summary.round_id} (submission API)")
    for column in ("place", "uid", "hotkey", "league", "measured", "score", "share"):
        board.add_column(column, justify="left" if column in ("hotkey", "league") else "right", no_wrap=True)
    for row in summary.leaderboard:
        board.add_row(
            str(row.place),
            "-" if row.uid is None else str(row.uid),
            short_hotkey(row.hotkey),
            row.league,
            compact_rate(row.measured_tokens_per_sec),
            compact_rate(row.weighted_score),
            f"{row.share:.2f}",
        )
    if not summary.leaderboard:
        board.add_row("-", "-", "none", "", "", "", "")
        board.caption, board.caption_justify = "no eligible submission", "left"
    console.print(board)

    weights = compact_table(
        f"Weights set by the validator (uid {summary.validator_uid}) at block {summary.weights_block}"
    )
    for column in ("uid", "neuron", "weight"):
        weights.add_column(column, justify="left" if column == "neuron" else "right")
    for uid, weight in sorted(summary.weights.items(), key=lambda item: (-item[1], item[0])):
        name = uid_names.get(uid, "")
        if uid == summary.owner_uid:
            name = f"{name} (subnet owner: unassigned places burn here)"
        weights.add_row(str(uid), escape(name), f"{weight:.4f}")
    console.print(weights)
    for note in summary.notes:
        console.print(f"note: {escape(note)}", highlight=False)


def leaderboard_rows(entries: Sequence[Any], uids: Mapping[str, int]) -> tuple[LeaderboardRow, ...]:
    """The API's leaderboard entries (``quasar.api.schemas.LeaderboardEntry``) with uids by hotkey."""
    return tuple(
        LeaderboardRow(
            place=e.place,
            uid=uids.get(e.hotkey),
            hotkey=e.hotkey,
            league=e.league,
            measured_tokens_per_sec=e.measured_tokens_per_sec,
            weighted_score=e.weighted_score,
            share=e.share,
        )
        for e in entries
    )
