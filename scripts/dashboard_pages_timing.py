"""The dashboard's pages over a database that ``quasar bench api-month --days N --keep DIR`` wrote:
each page's HTML size and server time (a request's whole time on 127.0.0.1), served by the API's app
over the chain the benchmark used (its 256 miners and 3 validators, late in the newest round).

A page is rendered once per chain block and target, so "first" is 7 distinct targets each asked
for the first time (7 past rounds, 7 miners, the last page of 7 others' submissions, 7
submissions) and "kept" 7 repeats of one of them: median (fastest–slowest) of each. Figures:
benchmarks/RESULTS.md, "The dashboard after days of a full subnet".

    python scripts/dashboard_pages_timing.py DIR/api_month.sqlite3 --days N
"""

from __future__ import annotations

import argparse
import http.client
import math
import statistics
import threading
import time
from pathlib import Path

import uvicorn

from quasar import config
from quasar.api.app import create_app
from quasar.api.dashboard import MINER_SUBMISSIONS
from quasar.api.service import ApiConfig
from quasar.bench.api_month import BLOCK_S, PER_ROUND, ROUND_BLOCKS, ROUNDS_PER_DAY, FixedChain, hotkeys

REPEATS, PORT = 7, 18765


def get(path: str) -> tuple[float, int]:
    """``path``'s time in milliseconds and its body's size in bytes."""
    connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    began = time.perf_counter()
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    elapsed = (time.perf_counter() - began) * 1000
    connection.close()
    if response.status != 200:
        raise SystemExit(f"{path}: {response.status}")
    return elapsed, len(body)


def spread(times: list[float]) -> str:
    return f"{statistics.median(times):.1f} ms ({min(times):.1f}–{max(times):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("database", type=Path)
    parser.add_argument("--days", type=int, required=True, help="the --days the database was written for")
    args = parser.parse_args()
    keys = hotkeys(256)
    chain = FixedChain(keys)
    chain.block = args.days * ROUNDS_PER_DAY * ROUND_BLOCKS - 10
    settings = config.resolve({"api_hotkey": "api"}, environ={}, dotenv_path=None)
    app = create_app(
        ApiConfig.from_settings(settings), chain, f"sqlite:///{args.database}", clock=lambda: chain.block * BLOCK_S
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=PORT, log_level="warning", log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    newest = args.days * ROUNDS_PER_DAY - 1
    last_page = math.ceil((newest + 1) * PER_ROUND / MINER_SUBMISSIONS)
    # The newest round's reported submission of miners 100–106 (the benchmark's ids run round by
    # round, miner by miner, 12 a miner; the last 4 of each are reported on).
    reported = [(newest * 256 + 100 + n) * 12 + 12 for n in range(REPEATS)]
    pages = {
        "/ (leaderboard)": [f"/?round={newest - n}" for n in range(REPEATS)],
        "/dashboard/validators": [f"/dashboard/validators?round={newest - n}" for n in range(REPEATS)],
        "/dashboard/miners/{hotkey}": [f"/dashboard/miners/{key}" for key in keys[100 : 100 + REPEATS]],
        "/dashboard/miners/{hotkey}?page=last": [
            f"/dashboard/miners/{key}?page={last_page}" for key in keys[110 : 110 + REPEATS]
        ],
        "/dashboard/submissions/{id}": [f"/dashboard/submissions/{sid}" for sid in reported],
    }
    try:
        for name, paths in pages.items():
            first = [get(path) for path in paths]
            kept = [get(paths[0])[0] for _ in range(REPEATS)]
            size = max(each[1] for each in first) / 1000
            print(f"{name:38} {size:7.1f} kB  first {spread([t for t, _ in first]):22} kept {spread(kept)}")
    finally:
        server.should_exit = True
        thread.join(timeout=30)


if __name__ == "__main__":
    main()
