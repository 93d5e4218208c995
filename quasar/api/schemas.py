"""Request and response bodies of the submission API, with their limits.

Requests refuse unknown fields, non-finite numbers and control characters, so what reaches the
service and the database is well-formed; each limit below is in the OpenAPI schema.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator

MAX_SEQUENCE_LENGTH = 100_000_000
MAX_TOKENS_PER_SEC = 1e15  # as quasar.scoring: far above any GPU, keeps every score finite
MAX_BENCHMARK_ENTRIES = 32
MAX_REASONS = 20
MAX_REASON_LENGTH = 1000
MAX_ID = 2**62

SubmissionId = Annotated[int, Field(ge=1, le=MAX_ID)]
SequenceLength = Annotated[int, Field(ge=1, le=MAX_SEQUENCE_LENGTH)]
TokensPerSec = Annotated[float, Field(gt=0, le=MAX_TOKENS_PER_SEC, allow_inf_nan=False)]
MeasuredTokensPerSec = Annotated[float, Field(ge=0, le=MAX_TOKENS_PER_SEC, allow_inf_nan=False)]
VramMb = Annotated[int, Field(ge=0, le=10_000_000)]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$", to_lower=True)]
Salt = Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]+$", min_length=32, max_length=128)]
# Checked in full by quasar.forks (the same rules the validator applies); here only bounded.
ForkUrl = Annotated[str, StringConstraints(min_length=1, max_length=512)]
CommitHash = Annotated[str, StringConstraints(min_length=1, max_length=64)]
# ss58 addresses are base58 (no 0, O, I, l).
HOTKEY_PATTERN = r"^[1-9A-HJ-NP-Za-km-z]{40,60}$"
Hotkey = Annotated[str, StringConstraints(pattern=HOTKEY_PATTERN)]
Benchmarks = Annotated[dict[SequenceLength, TokensPerSec], Field(max_length=MAX_BENCHMARK_ENTRIES)]
PeakVramMb = Annotated[float, Field(ge=0, le=10_000_000, allow_inf_nan=False)]
LengthStatus = Literal["ok", "oom", "timeout", "error", "skipped"]
MeasuredBenchmarks = Annotated[dict[SequenceLength, MeasuredTokensPerSec], Field(max_length=MAX_BENCHMARK_ENTRIES)]


def _printable(text: str) -> str:
    if any((ord(ch) < 32 and ch not in "\n\t") or ord(ch) == 127 for ch in text):
        raise ValueError("must not contain control characters")
    return text


Reason = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON_LENGTH), AfterValidator(_printable)]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitKernelRequest(Request):
    """A direct submission: evaluable at once, its time is now."""

    fork_url: ForkUrl = Field(description="https://github.com/OWNER/REPO (optionally .git)")
    commit_hash: CommitHash = Field(description="full 40-hex commit id")
    target_sequence_length: SequenceLength
    tokens_per_sec: TokensPerSec = Field(description="claimed tokens/sec at the target length")
    vram_mb: VramMb | None = None
    benchmarks: Benchmarks | None = Field(default=None, description="claimed {seq_len: tokens_per_sec}")


class CommitRequest(Request):
    """Phase 1 of commit-reveal: ``commitment_hash = sha256(salt + fork_url + commit_hash)``."""

    commitment_hash: Sha256Hex
    target_sequence_length: SequenceLength


class RevealRequest(Request):
    """Phase 2 of commit-reveal: the salt and what the commitment hides, with the claim."""

    submission_id: SubmissionId
    commitment_salt: Salt = Field(description="hex, at least 16 bytes")
    fork_url: ForkUrl
    commit_hash: CommitHash
    tokens_per_sec: TokensPerSec
    vram_mb: VramMb | None = None
    benchmarks: Benchmarks | None = None


class ReportedLength(Request):
    """What a validator measured at one sequence length."""

    seq_len: SequenceLength
    status: LengthStatus = Field(description="ok, oom, timeout, error or skipped (the harness's status)")
    tokens_per_sec: MeasuredTokensPerSec | None = None
    peak_vram_mb: PeakVramMb | None = Field(default=None, description="peak GPU memory the fork's process reported")
    correct: bool | None = Field(default=None, description="matched the reference here; null = not checked")


class ReportRequest(Request):
    """A validator's result for one submission it fetched."""

    submission_id: SubmissionId
    verdict: Literal["passed", "failed"] = Field(
        description="passed: correct, logits not failed and measured >= 0.9 x claimed; failed otherwise")
    correct: bool = Field(description="the layer's output matched the reference at every length run")
    logits_ok: bool | None = Field(default=None, description="logit verification result; null = not checked")
    measured_tokens_per_sec: MeasuredTokensPerSec | None = Field(
        default=None, description="measured tokens/sec at the target length; null = not measured")
    benchmarks: MeasuredBenchmarks | None = Field(default=None, description="measured {seq_len: tokens_per_sec}")
    reasons: list[Reason] = Field(default_factory=list, max_length=MAX_REASONS,
                                  description="why it failed (or notes), for the miner")
    lengths: list[ReportedLength] | None = Field(
        default=None, max_length=MAX_BENCHMARK_ENTRIES,
        description="per sequence length run: measured tokens/sec, peak memory, correctness; null = not sent "
                    "(reports from before this field have none)")

    @field_validator("lengths")
    @classmethod
    def _one_entry_per_length(cls, lengths: list[ReportedLength] | None) -> list[ReportedLength] | None:
        if lengths is not None and len({item.seq_len for item in lengths}) != len(lengths):
            raise ValueError("each seq_len may appear once")
        return lengths


class Health(BaseModel):
    status: Literal["ok"]
    api_hotkey: str = Field(description="sign requests for this receiver (btauth/1)")
    netuid: int
    current_block: int
    blocks_until_reveal: int
    reveal_window_blocks: int
    round_blocks: int


class RoundInfo(BaseModel):
    round_id: int
    start_block: int
    end_block: int
    current_block: int
    blocks_left: int
    seconds_left_estimate: float


class SubmissionAccepted(BaseModel):
    submission_id: int
    hotkey: str
    state: str
    submitted_at: float
    submitted_block: int
    round_id: int | None


class CommitAccepted(BaseModel):
    submission_id: int
    hotkey: str
    commit_block: int
    reveal_from_block: int
    reveal_until_block: int
    submitted_at: float


class PendingReveal(BaseModel):
    submission_id: int
    hotkey: str
    commitment_hash: str
    target_sequence_length: int
    commit_block: int
    reveal_from_block: int
    reveal_until_block: int
    state: Literal["waiting", "open"]


class PendingReveals(BaseModel):
    current_block: int
    pending: list[PendingReveal]


class SubmissionStats(BaseModel):
    current_block: int
    current_round: int
    submissions: int
    ready: int
    awaiting_reveal: int
    expired_commitments: int
    hotkeys: int
    reports: int
    submissions_this_round: int
    hotkey: str | None = None
    hotkey_submissions: int | None = None


class WorkItem(BaseModel):
    """A submission for a validator to evaluate, held for it until ``lease_expires_at``."""

    submission_id: int
    hotkey: str
    fork_url: str
    commit_hash: str
    target_sequence_length: int
    claimed_tokens_per_sec: float
    vram_mb: int | None
    benchmarks: dict[int, float] | None
    submitted_at: float
    round_id: int
    lease_expires_at: float


class WorkBatch(BaseModel):
    items: list[WorkItem]
    lease_seconds: float


class ReportAccepted(BaseModel):
    report_id: int
    submission_id: int
    failure_counted: bool = Field(description="this report charged a failed validation to the miner's IP")


class LeaderboardEntry(BaseModel):
    place: int
    hotkey: str
    submission_id: int
    league: str
    multiplier: float
    target_sequence_length: int
    claimed_tokens_per_sec: float
    measured_tokens_per_sec: float = Field(description="median over validators' reports")
    weighted_score: float
    share: float
    validators: int = Field(description="reports behind this entry")
    submitted_at: float


class Leaderboard(BaseModel):
    round_id: int
    epsilon: float
    entries: list[LeaderboardEntry]
    unassigned: float = Field(description="shares of unfilled places (burned to the subnet owner)")
    evaluated_submissions: int


class ErrorBody(BaseModel):
    detail: str


# --- submission status (GET /submissions/{id}, GET /miners/{hotkey}/submissions) ---

SubmissionState = Literal["committed", "expired", "revealed", "queued", "being_evaluated", "passed", "failed"]


class LengthFigures(BaseModel):
    """One validator's figures at one sequence length (only tokens/sec for reports from before
    per-length figures were sent: ``status`` and the rest are then null)."""

    seq_len: int
    status: str | None
    tokens_per_sec: float | None
    peak_vram_mb: float | None
    correct: bool | None


class ValidatorVerdict(BaseModel):
    """One validator's report on a submission, as the miner and the public see it."""

    validator_hotkey: str
    verdict: Literal["passed", "failed"]
    correct: bool
    logits_ok: bool | None
    measured_tokens_per_sec: float | None
    lengths: list[LengthFigures]
    reasons: list[str]
    reported_at: float


class SubmissionStatus(BaseModel):
    """Where a submission stands. Before a commitment is revealed only its hash, target, time and
    reveal window are shown: ``fork_url``, ``commit_hash``, the claim and reports are null/empty."""

    submission_id: int
    hotkey: str
    method: Literal["direct", "commit_reveal"]
    state: SubmissionState
    target_sequence_length: int
    league: str
    submitted_at: float = Field(description="the commit's time for commit-reveal: the tie-break time")
    submitted_block: int
    commitment_hash: str | None
    reveal_from_block: int | None
    reveal_until_block: int | None
    revealed: bool
    ready_at: float | None = Field(description="when it became evaluable (direct submission or reveal)")
    round_id: int | None
    fork_url: str | None
    commit_hash: str | None
    claimed_tokens_per_sec: float | None
    vram_mb: int | None
    claimed_benchmarks: dict[int, float] | None
    measured_tokens_per_sec: float | None = Field(description="median over the validators' reports")
    weighted_score: float | None = Field(description="verified tokens/sec x league multiplier; 0 when ineligible")
    validators_evaluating: int = Field(description="validators holding a lease on it without a report yet")
    reports: list[ValidatorVerdict]


class SubmissionPage(BaseModel):
    """A page of submissions, newest first."""

    hotkey: str | None
    total: int
    offset: int
    limit: int
    submissions: list[SubmissionStatus]


class RoundPoint(BaseModel):
    """A miner's best evaluated submission in one round."""

    round_id: int
    submission_id: int
    measured_tokens_per_sec: float
    weighted_score: float
    state: Literal["passed", "failed"]


class MinerHistory(BaseModel):
    hotkey: str
    rounds: list[RoundPoint]
