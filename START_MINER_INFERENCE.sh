#!/usr/bin/env bash
# Start the QUASAR miner inference server (pm2: `pm2 start ecosystem.config.js --only quasar-miner-inference`,
# or screen). Port MINER_INFERENCE_PORT. Settings: flag > environment > .env > default (`quasar config`
# lists the defaults), as for every command of the suite; extra arguments are passed as flags
# (e.g. --wallet.name miner --device cuda).
exec "$(dirname "$0")/scripts/in_venv.sh" python -m quasar.inference serve "$@"
