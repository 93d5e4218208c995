#!/usr/bin/env bash
# Start the QUASAR miner inference server (pm2: `pm2 start ./START_MINER_INFERENCE.sh --name quasar-inference`,
# or screen). Port MINER_INFERENCE_PORT (default 8001). Settings come from .env; extra arguments are passed
# as flags (e.g. --wallet.name miner --wallet.hotkey default --device cuda).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    echo "No .venv here: run ./scripts/test.sh once (or python3 -m venv .venv && pip install -e .)" >&2
    exit 1
fi
# Export .env to the process too: Hugging Face and CUDA read their own variables
# (HF_HOME, HF_HUB_OFFLINE, CUDA_VISIBLE_DEVICES) from the environment.
if [ -f .env ]; then
    set -a
    # shellcheck disable=SC1091
    . ./.env
    set +a
fi
# shellcheck disable=SC1091
. .venv/bin/activate
exec python -m quasar.inference serve "$@"
