"""Where a validator's state file lives, and reading it from another process while the validator
runs (quasar/validator/state.py holds the state itself)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path


def default_state_path(data_dir: str | os.PathLike, network: str, netuid: int, hotkey: str) -> Path:
    """The state file of ``hotkey`` validating subnet ``netuid`` on ``network``, under ``data_dir``."""
    return Path(os.path.expanduser(data_dir)) / f"state-{network}-{netuid}-{hotkey}.sqlite3"


def read_meta(path: str | os.PathLike, key: str) -> str | None:
    """The ``meta`` value ``key`` of the state file at ``path``, read by another process while the
    validator runs: read-only and without the validator's lock (WAL: the validator is never
    blocked). None when the file, its schema or the key is not there yet."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    except sqlite3.Error:  # being created
        return None
    return None if row is None else row[0]
