#!/usr/bin/env bash
# Start the QUASAR submission API (works under pm2: `pm2 start ./START_SERVER.sh --name quasar-api`, or screen).
# Settings come from .env in this folder (read by quasar.config: DATABASE_URL, API_HOST, API_PORT,
# API_WORKERS, API_HOTKEY, SUBTENSOR_NETWORK...; `quasar config` lists the defaults); extra arguments
# are passed on as flags, e.g.
#   ./START_SERVER.sh --port 8000 --workers 2 --database-url postgresql://quasar@127.0.0.1:5432/quasar
exec "$(dirname "$0")/scripts/in_venv.sh" python -m quasar.api serve "$@"
