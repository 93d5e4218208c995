"""GET /pending_reveals (``service.pending_reveals``) as commitments that were never revealed pile
up: 256 hotkeys committing and never revealing, written into the API's own schema, the chain a few
blocks past the newest. Figures: benchmarks/RESULTS.md, "A month of submissions".

    python benchmarks/api_commitments.py /tmp/api_commitments.sqlite3 10000 100000 400000
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import time
from pathlib import Path

from api_month import HOTKEYS, FixedChain

from quasar import config
from quasar.api.db import Database
from quasar.api.service import ApiConfig, SubmissionService


def main(path: Path, sizes: list[int]) -> None:
    """Fill ``path`` up to each of ``sizes`` commitments and time the pending reveals there."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    database = Database(f"sqlite:///{path}")
    database.upgrade()
    chain = FixedChain()
    settings = config.resolve({"api_hotkey": "api"}, environ={}, dotenv_path=None)
    service = SubmissionService(ApiConfig.from_settings(settings), chain, database)
    connection = sqlite3.connect(path)
    filled = 0
    for size in sizes:
        with connection:
            connection.executemany(
                "INSERT INTO submissions (id, hotkey, method, state, commitment_hash, target_sequence_length, "
                "submitted_at, submitted_block, client_ip) VALUES (?, ?, 'commit_reveal', 'committed', ?, 65536, ?, ?, "
                "'10.0.0.1')",
                [(i + 1, HOTKEYS[i % 256], f"{i:064x}", i * 1.2, i // 10) for i in range(filled, size)],
            )
        filled = size
        chain.block = size // 10 + 5
        times = []
        for _ in range(5):
            started = time.perf_counter()
            pending = service.pending_reveals(None, 100).pending
            times.append((time.perf_counter() - started) * 1000)
        print(
            f"{size} commitments never revealed, {len(pending)} pending shown: median "
            f"{statistics.median(times):.1f} ms ({min(times):.1f}–{max(times):.1f}, n=5)",
            flush=True,
        )
    connection.close()
    database.dispose()


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(size) for size in sys.argv[2:]])
