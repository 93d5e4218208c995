#!/usr/bin/env bash
# Start the QUASAR miner (works under pm2: `pm2 start ./START_MINER.sh --name quasar-miner`, or screen).
# Settings come from .env; extra arguments are passed to the miner as flags.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    echo "No .venv here: run ./scripts/test.sh once (or python3 -m venv .venv && pip install -e .)" >&2
    exit 1
fi
# shellcheck disable=SC1091
. .venv/bin/activate
exec python -m neurons.miner "$@"
