"""Request and response bodies of the submission API, with their limits.

Requests refuse unknown fields, non-finite numbers and control characters, and take every value
only in its own JSON type (strict: ``true`` is not a length, ``"5e4"`` is not a number; a
benchmark's length is the one JSON object key, a string of digits), so what reaches the service
and the database is well-formed; each limit and pattern below is in the OpenAPI schema.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    field_validator,
)
from pydantic.types import Strict

from quasar.api import rules
from quasar.config.values import MAX_SEQ_LEN, MIN_SEQ_LEN

MAX_SEQUENCE_LENGTH = 100_000_000
MAX_TOKENS_PER_SEC = 1e15  # as quasar.scoring: far above any GPU, keeps every score finite
MAX_BENCHMARK_ENTRIES = 32
MAX_REASONS = 20
MAX_REASON_LENGTH = 1000
MAX_ID = 2**62
MAX_NOT_RANKED_SHOWN = 100

SubmissionId = Annotated[int, Strict(), Field(ge=1, le=MAX_ID)]
SequenceLength = Annotated[int, Strict(), Field(ge=1, le=MAX_SEQUENCE_LENGTH)]
# A miner's target: a length the validators' evaluation runs (docs/rules.md section 3).
TargetLength = Annotated[int, Strict(), Field(ge=MIN_SEQ_LEN, le=MAX_SEQ_LEN)]
TokensPerSec = Annotated[float, Strict(), Field(gt=0, le=MAX_TOKENS_PER_SEC, allow_inf_nan=False)]
MeasuredTokensPerSec = Annotated[float, Strict(), Field(ge=0, le=MAX_TOKENS_PER_SEC, allow_inf_nan=False)]
VramMb = Annotated[int, Strict(), Field(ge=0, le=10_000_000)]
SHA256_PATTERN = r"^[0-9a-fA-F]{64}$"
Sha256Hex = Annotated[str, StringConstraints(pattern=SHA256_PATTERN, to_lower=True)]
Salt = Annotated[
    str, StringConstraints(pattern=r"^[0-9a-fA-F]+$", min_length=rules.SALT_MIN_HEX, max_length=rules.SALT_MAX_HEX)
]
# The forms quasar.forks accepts (a GitHub repository; a local path or file:/// URL only on a dev
# network). The service checks them in full, with the same rules as the validator and a message
# naming what is wrong; the patterns tell clients (and the OpenAPI schema) the shape.
FORK_URL_PATTERN = (
    r"^(?:[Hh][Tt][Tt][Pp][Ss]://[Gg][Ii][Tt][Hh][Uu][Bb]\.[Cc][Oo][Mm]/[A-Za-z0-9-]{1,39}"
    r"/[A-Za-z0-9._-]{1,104}/?|[Ff][Ii][Ll][Ee]:///[A-Za-z0-9._/+@,=-]*|/[A-Za-z0-9._/+@,=-]*)$"
)
COMMIT_PATTERN = r"^[0-9a-fA-F]{40}$"
ForkUrl = Annotated[
    str, StringConstraints(min_length=1, max_length=512), Field(json_schema_extra={"pattern": FORK_URL_PATTERN})
]
CommitHash = Annotated[
    str, StringConstraints(min_length=1, max_length=64), Field(json_schema_extra={"pattern": COMMIT_PATTERN})
]
# ss58 addresses are base58 (no 0, O, I, l).
HOTKEY_PATTERN = r"^[1-9A-HJ-NP-Za-km-z]{40,60}$"
Hotkey = Annotated[str, StringConstraints(pattern=HOTKEY_PATTERN)]


def _length_key(value: object) -> object:
    """A JSON object key naming a sequence length ("512") as the integer; anything else as it is
    (and then refused as not an integer)."""
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else value


LengthKey = Annotated[int, BeforeValidator(_length_key), Strict(), Field(ge=1, le=MAX_SEQUENCE_LENGTH)]
Benchmarks = Annotated[dict[LengthKey, TokensPerSec], Field(max_length=MAX_BENCHMARK_ENTRIES)]
PeakVramMb = Annotated[float, Strict(), Field(ge=0, le=10_000_000, allow_inf_nan=False)]
LengthStatus = Literal["ok", "oom", "timeout", "error", "skipped"]
MeasuredBenchmarks = Annotated[dict[LengthKey, MeasuredTokensPerSec], Field(max_length=MAX_BENCHMARK_ENTRIES)]


def _printable(text: str) -> str:
    if any((ord(ch) < 32 and ch not in "\n\t") or ord(ch) == 127 for ch in text):
        raise ValueError("must not contain control characters")
    return text


Reason = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON_LENGTH), AfterValidator(_printable)]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Claim(Request):
    """What a miner claims, the same in a direct submission and in a reveal: its fork at a commit
    and the tokens/sec it measured there (with, optionally, its memory and per-length figures)."""

    fork_url: ForkUrl = Field(description="https://github.com/OWNER/REPO (optionally .git)")
    commit_hash: CommitHash = Field(description="full 40-hex commit id")
    tokens_per_sec: TokensPerSec = Field(description="claimed tokens/sec at the target length")
    vram_mb: VramMb | None = None
    benchmarks: Benchmarks | None = Field(default=None, description="claimed {seq_len: tokens_per_sec}")


class SubmitKernelRequest(Claim):
    """A direct submission: evaluable at once, its time is now."""

    target_sequence_length: TargetLength


class CommitRequest(Request):
    """Phase 1 of commit-reveal: ``commitment_hash = sha256(salt + fork_url + commit_hash)``."""

    commitment_hash: Sha256Hex
    target_sequence_length: TargetLength


class RevealRequest(Claim):
    """Phase 2 of commit-reveal: the salt and what the commitment hides, with the claim."""

    submission_id: SubmissionId
    commitment_salt: Salt = Field(description="hex, at least 16 bytes")


class ReportedLength(Request):
    """What a validator measured at one sequence length."""

    seq_len: SequenceLength
    status: LengthStatus = Field(description="ok, oom, timeout, error or skipped (the harness's status)")
    tokens_per_sec: MeasuredTokensPerSec | None = None
    peak_vram_mb: PeakVramMb | None = Field(default=None, description="peak GPU memory the fork's process reported")
    correct: StrictBool | None = Field(default=None, description="matched the reference here; null = not checked")


class ReportRequest(Request):
    """A validator's result for one submission it fetched."""

    submission_id: SubmissionId
    verdict: Literal["passed", "failed"] = Field(
        description="passed: correct, logits not failed and measured >= 0.9 x claimed; failed otherwise"
    )
    correct: StrictBool = Field(description="the layer's output matched the reference at every length run")
    logits_ok: StrictBool | None = Field(default=None, description="logit verification result; null = not checked")
    measured_tokens_per_sec: MeasuredTokensPerSec | None = Field(
        default=None, description="measured tokens/sec at the target length; null = not measured"
    )
    benchmarks: MeasuredBenchmarks | None = Field(default=None, description="measured {seq_len: tokens_per_sec}")
    reasons: list[Reason] = Field(
        default_factory=list, max_length=MAX_REASONS, description="why it failed (or notes), for the miner"
    )
    lengths: list[ReportedLength] | None = Field(
        default=None,
        max_length=MAX_BENCHMARK_ENTRIES,
        description="per sequence length run: measured tokens/sec, peak memory, correctness; null = not sent "
        "(reports from before this field have none)",
    )
    content_hash: Sha256Hex | None = Field(
        default=None,
        description="sha256 of the fork's kernel files (fla/ops/quasar/) normalised as "
        "quasar.originality.content_hash does; null = not computed (the fork was not cloned)",
    )

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
    server_time: float | None = Field(
        None, description="the API's clock (unix seconds) as it answered: signed requests must agree with it"
    )


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


class EvaluatedSubmission(BaseModel):
    """What a validator evaluates of a submission: whose, which fork and commit, at what target and
    claim, and where it stands for originality."""

    submission_id: int
    hotkey: str
    fork_url: str
    commit_hash: str
    target_sequence_length: int
    claimed_tokens_per_sec: float
    submitted_at: float
    round_id: int
    # 0 from an API older than this field: copies are then ordered by submission id, as that API did.
    counts_from_block: int = Field(
        0,
        description="the chain block it counts from for originality (docs/rules.md section 5): a direct "
        "submission's, or the block its commitment's reveal window opened",
    )


class WorkItem(EvaluatedSubmission):
    """A submission for a validator to evaluate, held for it until ``lease_expires_at``."""

    vram_mb: int | None
    benchmarks: dict[int, float] | None
    lease_expires_at: float


class WorkBatch(BaseModel):
    items: list[WorkItem]
    lease_seconds: float


class ReportAccepted(BaseModel):
    report_id: int
    submission_id: int
    failure_counted: bool = Field(
        description="with this report the validators' consensus failed the submission, "
        "and a failed validation was charged to the miner's IP"
    )


ConsensusState = Literal["awaiting_quorum", "disputed", "passed", "failed"]


class ConsensusView(BaseModel):
    """The validators' consensus on a submission (quasar/consensus.py): validators vote with their stake."""

    state: ConsensusState = Field(description="awaiting_quorum and disputed are not settled yet")
    validators_reported: int = Field(description="validators whose reports count (a permit, and stake) that reported")
    validators: int = Field(description="validators whose reports count, on the subnet now")
    reported_stake_share: float
    passed_stake_share: float
    failed_stake_share: float
    reason: str = Field(description="the state in words")
    content_hash: str | None = Field(description="the kernel content hash validators holding a majority reported")


class LeaderboardEntry(BaseModel):
    place: int
    hotkey: str
    submission_id: int
    league: str
    multiplier: float
    target_sequence_length: int
    claimed_tokens_per_sec: float
    measured_tokens_per_sec: float = Field(
        description="the consensus figure: the highest that passing validators holding more than half of the "
        "stake measured at least"
    )
    weighted_score: float
    share: float
    validators: int = Field(description="validators whose reports count that reported on it")
    reported_stake_share: float = Field(description="share of the validators' stake that reported on it")
    submitted_at: float


NotRankedState = Literal["awaiting_quorum", "disputed", "copy"]


class NotRanked(BaseModel):
    """An evaluated submission of the round that is not ranked (yet), and why."""

    submission_id: int
    hotkey: str
    state: NotRankedState
    reason: str
    validators_reported: int
    reported_stake_share: float


class Leaderboard(BaseModel):
    round_id: int
    epsilon: float
    entries: list[LeaderboardEntry]
    unassigned: float = Field(description="shares of unfilled places (burned to the subnet owner)")
    evaluated_submissions: int
    quorum_stake_share: float = Field(description="share of the stake that must report before a submission is judged")
    quorum_min_validators: int
    validators: int = Field(description="validators whose reports count, on the subnet now")
    awaiting_quorum: int
    disputed: int
    failed: int
    copies: int
    not_ranked: list[NotRanked] = Field(
        description="the round's newest evaluated submissions awaiting a quorum, disputed or copies "
        f"(at most {MAX_NOT_RANKED_SHOWN})"
    )


class ValidatorAgreement(BaseModel):
    """How one validator's reports in a round compare with the validators' settled consensus."""

    validator_hotkey: str
    stake: float | None = Field(description="its stake now; null when it holds no permit now")
    stake_share: float = Field(description="its weight in the consensus now (0: its reports count for nothing)")
    reports: int = Field(description="its reports on the round's submissions")
    judged: int = Field(description="of those, on submissions whose consensus is settled")
    agreed: int = Field(description="of those, with the consensus's verdict")
    disagreed: int
    agreement: float | None = Field(description="agreed / judged")
    median_deviation: float | None = Field(
        description="median of |its figure / the consensus figure - 1| where it and the consensus passed"
    )


class ValidatorAgreements(BaseModel):
    round_id: int
    validators: list[ValidatorAgreement]


class ReportedWork(EvaluatedSubmission):
    """One report of a validator with the submission it is on, as the validator's processes share
    their results (``VALIDATOR_ROLE``)."""

    report_id: int
    verdict: Literal["passed", "failed"]
    correct: bool
    logits_ok: bool | None
    measured_tokens_per_sec: float | None
    benchmarks: dict[int, float] | None
    reasons: list[str]
    content_hash: str | None
    reported_at: float


class ValidatorReports(BaseModel):
    """A validator's reports after ``after_id``, oldest first."""

    validator_hotkey: str
    reports: list[ReportedWork]


class ErrorBody(BaseModel):
    detail: str


# --- submission status (GET /submissions/{id}, GET /miners/{hotkey}/submissions) ---

SubmissionState = Literal[
    "committed",
    "expired",
    "revealed",
    "queued",
    "deferred",
    "superseded",
    "lapsed",
    "being_evaluated",
    "awaiting_quorum",
    "disputed",
    "passed",
    "failed",
    "copy",
]


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
    counted: bool = Field(description="its validator's report counts in the consensus now (a permit, and stake)")
    content_hash: str | None


class SubmissionStatus(BaseModel):
    """Where a submission stands. Before a commitment is revealed only its hash, target, time and
    reveal window are shown: ``fork_url``, ``commit_hash``, the claim and reports are null/empty."""

    submission_id: int
    hotkey: str
    method: Literal["direct", "commit_reveal"]
    state: SubmissionState
    state_reason: str | None = Field(description="the state in words, where there is more to say")
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
    measured_tokens_per_sec: float | None = Field(description="the consensus figure once passed")
    weighted_score: float | None = Field(
        description="verified tokens/sec x league multiplier once passed; 0 when failed or a copy"
    )
    validators_evaluating: int = Field(description="validators holding a lease on it without a report yet")
    consensus: ConsensusView | None = Field(description="the validators' consensus; null before any report")
    copy_of: int | None = Field(description="the earlier submission of another hotkey this one copies")
    superseded_by: int | None = Field(
        description="the newer submission of its hotkey that replaced it before any validator reported on it"
    )
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
