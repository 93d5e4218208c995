#!/usr/bin/env bash
# Start the QUASAR miner inference server (pm2: `pm2 start ecosystem.config.js --only quasar-miner-inference`,
# or screen). Port MINER_INFERENCE_PORT (default 8001). Settings: flag > environment > .env > default, as for
# every command of the suite; extra arguments are passed as flags (e.g. --wallet.name miner --device cuda).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    echo "No .venv here: run ./scripts/setup_venv.sh once (it makes .venv and installs the suite)" >&2
    exit 1
fi
# shellcheck disable=SC1091
. .venv/bin/activate
exec python -m quasar.inference serve "$@"
