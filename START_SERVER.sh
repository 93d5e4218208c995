#!/usr/bin/env bash
# Start the QUASAR submission API (works under pm2: `pm2 start ./START_SERVER.sh --name quasar-api`, or screen).
# Settings come from .env in this folder (read by quasar.config: DATABASE_URL, API_HOST, API_PORT
# (default 8000), API_WORKERS, API_HOTKEY, SUBTENSOR_NETWORK...); extra arguments are passed on as flags,
# e.g. ./START_SERVER.sh --port 8000 --workers 2 --database-url postgresql://quasar@127.0.0.1:5432/quasar
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    echo "No .venv here: run ./scripts/setup_venv.sh once (it makes .venv and installs the suite)" >&2
    exit 1
fi
# shellcheck disable=SC1091
. .venv/bin/activate
exec python -m quasar.api serve "$@"
