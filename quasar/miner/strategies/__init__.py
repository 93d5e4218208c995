"""Optimization strategies of the miner: each proposes candidate edits to fla/ops/quasar/.

- :class:`TuningStrategy` searches the tunables the fork declares and reads from
  ``fla/ops/quasar/tuning.json`` (the contract is in tuning.py) for the miner's GPU;
- :class:`AgentStrategy` asks a language model behind an OpenAI-compatible chat API for edits.

Every candidate is checked when made (base.py) and evaluated by the same harness validators use.
"""

from quasar.miner.strategies.agent import AgentStrategy
from quasar.miner.strategies.base import (
    ERROR,
    FAILED,
    KEPT,
    REJECTED,
    SLOWER,
    AppliedEdit,
    Attempt,
    Candidate,
    EditRejected,
    Strategy,
    StrategyError,
    check_changes,
    check_edit_path,
)
from quasar.miner.strategies.tuning import TUNING_FILE, TuningFileError, TuningStrategy, read_space

__all__ = [
    "ERROR",
    "FAILED",
    "KEPT",
    "REJECTED",
    "SLOWER",
    "TUNING_FILE",
    "AgentStrategy",
    "AppliedEdit",
    "Attempt",
    "Candidate",
    "EditRejected",
    "Strategy",
    "StrategyError",
    "TuningFileError",
    "TuningStrategy",
    "check_changes",
    "check_edit_path",
    "read_space",
]
