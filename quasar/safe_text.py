"""Text from others (a fork, a miner, a validator, an API) made safe to show in a terminal.

Imports nothing heavy: the evaluation's report and the logging setup both use it.
"""

from __future__ import annotations

import re

# What drives a terminal rather than shows on it: control characters but newline and tab (escape
# sequences, carriage returns, bells) and the bidirectional controls that make a line read
# otherwise than it is.
TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def without_terminal_controls(text: str) -> str:
    """``text`` with each of :data:`TERMINAL_CONTROLS` replaced by ``?`` (newlines and tabs kept)."""
    return TERMINAL_CONTROLS.sub("?", text)
