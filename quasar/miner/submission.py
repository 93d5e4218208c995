"""Submitting the miner's best commit to the submission API: directly, or by commit-reveal.

- Direct: push the commit, then ``POST /submit_kernel``.
- Commit-reveal: draw a salt, save it in the state, *then* ``POST /commit_submission`` with
  ``sha256(salt + fork_url + commit)`` (docs/rules.md section 3). The commit stays unpublished
  until the reveal: once the chain reaches the block the API named, the miner pushes the
  commit and ``POST /reveal_submission``. After a crash, :meth:`Submitter.advance` finds an
  unacknowledged commitment among the API's pending reveals (or sends it again with the same
  salt) and reveals it when due.

An API id names a submission only within one database: the owner may move the API to a fresh one
(ids from 1 again) or restore an older backup. So the miner asks the API, by id, whether it still
holds its last submission (its hotkey, commit and target, revealed) or its pending commitment (its
hotkey and hash), every :data:`CONFIRM_EVERY_S` and before a reveal pushes the commit; one the
API no longer holds is submitted (or committed) again (docs/miner.md).

The claim is the harness's recommended claim at the target length, times ``CLAIM_SHARE``
(1 by default; less leaves room for a validator whose GPU is slower or busier than the
miner's, since a measurement under 0.9 × the claim fails); the miner submits only
when the weighted score of the claim beats the last submission by the minimum improvement.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from quasar import config, scoring
from quasar.api import schemas
from quasar.api.client import ApiClient, ApiClientError, Claim
from quasar.api.rules import commitment_hash, new_salt
from quasar.chain import Chain, ChainError
from quasar.evaluate import EvaluationReport
from quasar.evaluate.report import OK
from quasar.log import Repeats
from quasar.miner.github import GitError
from quasar.miner.state import Measurement, MinerState, PendingReveal, StateStore, SubmissionRecord

logger = logging.getLogger(__name__)

DIRECT = "direct"
COMMIT_REVEAL = "commit-reveal"
MODES = (DIRECT, COMMIT_REVEAL)
# The share of the recommended claim a miner submits unless CLAIM_SHARE says otherwise.
DEFAULT_CLAIM_SHARE = float(config.OPTIONS_BY_KEY["claim_share"].default)
# API answers worth retrying later: unreachable, rate-limited, the API's own trouble, and a refused
# signature (401: a clock off, which its operator sets right; a commitment is kept until its window closes).
_RETRY_STATUSES = {0, 401, 429, 500, 502, 503, 504}
# Seconds between two checks that the API still holds the last submission or pending commitment.
CONFIRM_EVERY_S = 300.0


def measurement_from_report(
    report: EvaluationReport, commit: str, claim_share: float = DEFAULT_CLAIM_SHARE
) -> Measurement | None:
    """What a passing evaluation of ``commit`` supports claiming (``claim_share`` of its recommended
    claim); None if it failed or has no claim."""
    if not 0.0 < claim_share <= 1.0:
        raise ValueError(f"claim_share must be above 0 and at most 1, got {claim_share}")
    if not report.passed or report.measured_tokens_per_sec is None or not report.recommended_claim:
        return None
    benchmarks = {
        int(key): float(item.tokens_per_sec)
        for key, item in report.lengths.items()
        if item.status == OK and item.tokens_per_sec
    }
    target = report.lengths.get(str(report.target_seq_len))
    vram = int(target.peak_vram_mb) if target is not None and target.peak_vram_mb is not None else None
    return Measurement(
        commit=commit,
        target_seq_len=report.target_seq_len,
        tokens_per_sec=float(report.measured_tokens_per_sec),
        claim=float(report.recommended_claim) * claim_share,
        benchmarks=benchmarks,
        vram_mb=vram,
        device_name=report.device_name,
        cv=target.cv if target is not None else None,
    )


def api_claim(fork_url: str, measurement: Measurement) -> Claim:
    """What the miner claims for ``measurement`` of its fork at ``fork_url``, as the API takes it."""
    return Claim(
        fork_url,
        measurement.commit,
        measurement.claim,
        vram_mb=measurement.vram_mb,
        benchmarks=measurement.benchmarks or None,
    )


def choose_target_length(report: EvaluationReport) -> int | None:
    """The length with the best weighted score (tokens/sec × league multiplier) among those that
    ran and were correct in ``report``; ties go to the shorter length (less memory). None if none did."""
    best: tuple[float, int] | None = None
    for item in report.lengths.values():
        if item.status != OK or item.correct is not True or not item.tokens_per_sec:
            continue
        score = item.tokens_per_sec * scoring.league_for(item.seq_len).multiplier
        if best is None or score > best[0] or (score == best[0] and item.seq_len < best[1]):
            best = (score, item.seq_len)
    return None if best is None else best[1]


def is_improvement(candidate: Measurement, last: SubmissionRecord | None, min_gain: float) -> bool:
    """Whether ``candidate`` is worth a new submission after ``last``: a different commit or
    length whose weighted score beats the last one's by more than ``min_gain``."""
    if last is None:
        return True
    previous = last.measurement
    if candidate.commit == previous.commit and candidate.target_seq_len == previous.target_seq_len:
        return False
    return candidate.weighted_score > previous.weighted_score * (1 + min_gain)


@dataclass(eq=False)
class Submitter:
    """Submits for one hotkey through ``client`` in ``mode``, keeping ``state`` saved in ``store``.

    ``publish(commit)`` makes ``commit`` fetchable at ``fork_url`` (a git push); it is called
    right before a direct submission and right before a reveal.
    """

    client: ApiClient
    chain: Chain
    state: MinerState
    store: StateStore
    mode: str
    fork_url: str
    publish: Callable[[str], None]
    min_gain: float = 0.0
    confirm_every_s: float = CONFIRM_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _confirmed_at: float | None = field(default=None, init=False)
    # A refusal met at every try (every 15 s while the miner waits): said once, then every 10 minutes.
    _repeats: Repeats = field(default_factory=lambda: Repeats(logger), init=False)
    # The measurement last said to wait for the pending reveal: a cycle offers its baseline at its
    # start and its best at its end, often the same one, which is said once.
    _said_waiting: Measurement | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"submission mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    def _save(self) -> None:
        self.store.save(self.state)

    def submit_if_better(self, measurement: Measurement) -> bool:
        """Submit ``measurement`` if it improves on the last submission and nothing is pending.
        Returns True when a submission (or commitment) was made."""
        if self.state.pending_reveal is not None:
            if measurement != self._said_waiting:
                logger.info(
                    "a commit-reveal is pending (%s); the next submission waits for its reveal",
                    self.state.pending_reveal.measurement.commit[:12],
                )
                self._said_waiting = measurement
            return False
        if not is_improvement(measurement, self.state.last_submission, self.min_gain):
            return False
        if self.mode == DIRECT:
            return self._submit_direct(measurement)
        self._start_commit_reveal(measurement)
        return True

    def _publish(self, commit: str) -> bool:
        """Push ``commit``; a failure is logged (and retried at the next submission), never raised."""
        try:
            self.publish(commit)
        except GitError as error:
            logger.error("cannot publish %s to %s, so it is not submitted yet: %s", commit[:12], self.fork_url, error)
            return False
        return True

    def _submit_direct(self, measurement: Measurement) -> bool:
        if not self._publish(measurement.commit):
            return False
        try:
            accepted = self.client.submit_kernel(api_claim(self.fork_url, measurement), measurement.target_seq_len)
            submission_id: int | None = accepted.submission_id
        except ApiClientError as error:
            duplicate = re.search(r"already submitted as submission (\d+)", error.detail)
            if error.status != 409 or duplicate is None:
                self._log_refusal("submission", error)
                return False
            submission_id = int(duplicate.group(1))  # sent before a crash; the API has it
        self._accepted()
        self.state.last_submission = SubmissionRecord(submission_id, DIRECT, self.fork_url, measurement, time.time())
        self._save()
        logger.info(
            "submitted %s at T=%d claiming %s tokens/s (submission %s)",
            measurement.commit[:12],
            measurement.target_seq_len,
            f"{measurement.claim:,.0f}",
            submission_id,
        )
        return True

    def _start_commit_reveal(self, measurement: Measurement) -> None:
        salt = new_salt()
        digest = commitment_hash(salt, self.fork_url, measurement.commit)
        self.state.pending_reveal = PendingReveal(
            salt=salt, fork_url=self.fork_url, commitment_hash=digest, measurement=measurement, created_at=time.time()
        )
        try:
            self._save()  # the salt is on disk before the commitment leaves this machine
        except BaseException:
            # Not on disk (a full disk): forget it, or advance() would send a commitment that a
            # restart could never reveal. The next cycle tries again.
            self.state.pending_reveal = None
            raise
        self._send_commitment()

    def _send_commitment(self) -> None:
        pending = self.state.pending_reveal
        assert pending is not None
        try:
            accepted = self.client.commit(pending.commitment_hash, pending.measurement.target_seq_len)
        except ApiClientError as error:
            self._log_refusal("commitment", error)
            if error.status not in _RETRY_STATUSES:
                self.state.pending_reveal = None
                self._save()
            return
        self._accepted()
        self.state.pending_reveal = replace(
            pending,
            submission_id=accepted.submission_id,
            reveal_from_block=accepted.reveal_from_block,
            reveal_until_block=accepted.reveal_until_block,
        )
        self._save()
        logger.info(
            "committed %s as commitment %d; revealing from block %d (now %d)",
            pending.measurement.commit[:12],
            accepted.submission_id,
            accepted.reveal_from_block,
            accepted.commit_block,
        )

    def _find_commitment(self, pending: PendingReveal) -> PendingReveal | None:
        """The API's record of ``pending``'s commitment (sent before a crash), if it has one."""
        listed = self.client.pending_reveals(self._hotkey())
        for item in listed.pending:
            if item.commitment_hash == pending.commitment_hash:
                return replace(
                    pending,
                    submission_id=item.submission_id,
                    reveal_from_block=item.reveal_from_block,
                    reveal_until_block=item.reveal_until_block,
                )
        return None

    def _hotkey(self) -> str:
        return self.state.hotkey

    def _confirm_due(self) -> bool:
        now = self.clock()
        if self._confirmed_at is not None and now - self._confirmed_at < self.confirm_every_s:
            return False
        self._confirmed_at = now
        return True

    def _held(self, submission_id: int, matches: Callable[[schemas.SubmissionStatus], bool]) -> bool | None:
        """Whether the API holds ``submission_id`` as this hotkey's submission that ``matches``; None
        when it cannot say now (unreachable, or an API older than ``GET /submissions/{id}``, whose
        404 is not its "no submission")."""
        try:
            status = self.client.submission_status(submission_id)
        except ApiClientError as error:
            if error.status == 404 and error.detail.startswith(f"no submission {submission_id}"):
                return False
            logger.debug("cannot ask the API for submission %d: %s", submission_id, error)
            return None
        return status.hotkey == self.state.hotkey and matches(status)

    def _confirm_last(self) -> None:
        """Forget the last submission when the API no longer holds it, and submit the best again."""
        last = self.state.last_submission
        if last is None or last.submission_id is None:
            return
        measurement = last.measurement

        def same(status: schemas.SubmissionStatus) -> bool:
            return (
                status.revealed
                and (status.commit_hash or "").lower() == measurement.commit.lower()
                and status.target_sequence_length == measurement.target_seq_len
            )

        if self._held(last.submission_id, same) is not False:
            return
        logger.warning(
            "the API no longer holds submission %d (%s at T=%d): its database was replaced or restored "
            "from an older backup; submitting the best again",
            last.submission_id,
            measurement.commit[:12],
            measurement.target_seq_len,
        )
        self.state.last_submission = None
        self._save()
        if self.state.best is not None:
            self.submit_if_better(self.state.best)

    def _commitment_held(self, pending: PendingReveal) -> bool:
        """Whether the API holds ``pending``'s commitment (True when it cannot say now); when it does
        not, the commitment is sent again with its salt, for a new reveal window."""
        assert pending.submission_id is not None
        held = self._held(pending.submission_id, lambda status: status.commitment_hash == pending.commitment_hash)
        if held is not False:
            return True
        logger.warning(
            "the API no longer holds commitment %d of %s: its database was replaced or restored from an "
            "older backup; committing it again",
            pending.submission_id,
            pending.measurement.commit[:12],
        )
        self.state.pending_reveal = replace(
            pending, submission_id=None, reveal_from_block=None, reveal_until_block=None
        )
        self._save()
        self._send_commitment()
        return False

    def advance(self) -> bool:
        """Move a pending commit-reveal forward: acknowledge, (re)send, or reveal when the chain is
        at the reveal block; and, every ``confirm_every_s``, submit again what the API no longer
        holds (module docstring). Returns True when a reveal was accepted."""
        pending = self.state.pending_reveal
        if pending is None:
            if self._confirm_due():
                self._confirm_last()
            return False
        try:
            if pending.submission_id is not None and self._confirm_due() and not self._commitment_held(pending):
                return False
            if pending.submission_id is None:
                found = self._find_commitment(pending)
                if found is None:
                    self._repeats.say(
                        "resend",
                        logging.INFO,
                        f"commitment for {pending.measurement.commit[:12]} never reached the API; sending it again",
                    )
                    self._send_commitment()
                    return False
                self.state.pending_reveal = pending = found
                self._save()
                logger.info("found commitment %d sent before a restart", found.submission_id)
            return self._reveal_when_due(pending)
        except ApiClientError as error:
            self._log_refusal("commit-reveal", error)
            return False

    def _reveal_when_due(self, pending: PendingReveal) -> bool:
        assert pending.submission_id is not None and pending.reveal_from_block is not None
        try:
            block = self.chain.current_block()
        except ChainError as error:
            logger.warning("cannot read the chain's block to time the reveal: %s", error)
            return False
        if block < pending.reveal_from_block:
            logger.debug(
                "commitment %d reveals at block %d; chain at %d",
                pending.submission_id,
                pending.reveal_from_block,
                block,
            )
            return False
        if pending.reveal_until_block is not None and block > pending.reveal_until_block:
            logger.error(
                "the reveal window of commitment %d closed at block %d (chain at %d); dropping it",
                pending.submission_id,
                pending.reveal_until_block,
                block,
            )
            self.state.pending_reveal = None
            self._save()
            return False
        measurement = pending.measurement
        # Pushing makes the commit public for good: never for a commitment the API no longer holds.
        if not self._commitment_held(pending) or not self._publish(measurement.commit):
            return False
        try:
            self.client.reveal(pending.submission_id, pending.salt, api_claim(pending.fork_url, measurement))
        except ApiClientError as error:
            if error.status == 409 and "already revealed" in error.detail:
                logger.info("commitment %d was revealed before a restart", pending.submission_id)
            elif error.status == 409 and "too early" in error.detail:
                logger.info("the API says commitment %d is not due yet: %s", pending.submission_id, error.detail)
                return False
            else:
                self._log_refusal("reveal", error)
                if error.status not in _RETRY_STATUSES:
                    self.state.pending_reveal = None
                    self._save()
                return False
        self._accepted()
        self.state.last_submission = SubmissionRecord(
            pending.submission_id, COMMIT_REVEAL, pending.fork_url, measurement, time.time()
        )
        self.state.pending_reveal = None
        self._save()
        logger.info(
            "revealed commitment %d: %s at T=%d claiming %s tokens/s",
            pending.submission_id,
            measurement.commit[:12],
            measurement.target_seq_len,
            f"{measurement.claim:,.0f}",
        )
        return True

    def _accepted(self) -> None:
        """The API took a request: a refusal met again is said at once, in full."""
        for key in ("submission", "commitment", "resend", "commit-reveal", "reveal"):
            self._repeats.ended(key)

    def _log_refusal(self, what: str, error: ApiClientError) -> None:
        if error.status in _RETRY_STATUSES:
            level = logging.ERROR if error.status == 401 else logging.WARNING  # 401: its operator has a clock to set
            self._repeats.say(what, level, f"{what} not accepted now ({error}); will retry")
        else:
            logger.error("%s refused by the API: %s", what, error)
