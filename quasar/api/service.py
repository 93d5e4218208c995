"""What the submission API does, independent of HTTP: submissions, commit-reveal, the validators' work
queue, reports, failures and bans, rounds and the leaderboard, as one :class:`SubmissionService`.

Its jobs live in modules of their own (quasar/api/servicecore.py says how they fit): the shared
state, transactions and bans (servicecore.py), who may submit (admission.py), what miners send
(intake.py), the validators' work and reports (worklist.py), the consensus and the leaderboard
(judging.py).
"""

from __future__ import annotations

from quasar.api.errors import ApiError
from quasar.api.intake import Intake
from quasar.api.judging import Judged, consensus_reports, evaluated_submissions, judge
from quasar.api.servicecore import NONCE_RETENTION_S, ApiConfig, Authenticated
from quasar.api.worklist import MAX_FETCHES_PER_VALIDATOR, WorkQueue

__all__ = [
    "MAX_FETCHES_PER_VALIDATOR",
    "NONCE_RETENTION_S",
    "ApiConfig",
    "ApiError",
    "Authenticated",
    "Judged",
    "SubmissionService",
    "consensus_reports",
    "evaluated_submissions",
    "judge",
]


class SubmissionService(Intake, WorkQueue):
    """The API's operations on one database and one chain."""
