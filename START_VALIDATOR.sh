#!/usr/bin/env bash
# Start the QUASAR validator: ./START_VALIDATOR.sh [FLAGS...]
# Settings come from the environment and .env (the environment wins, as everywhere in QUASAR); flags
# given here win over both and are passed on to `python -m neurons.validator`. Checks the wallet,
# CUDA and (when VALIDATOR_API_URL is set) the submission API first (scripts/start_checks.sh).
# pm2: pm2 start ./START_VALIDATOR.sh --name quasar-validator --kill-timeout 30000
# (the kill timeout lets a running evaluation stop its sandbox cleanly on pm2 stop).
set -euo pipefail
ROLE=validator
# shellcheck source=scripts/start_checks.sh
. "$(dirname "$0")/scripts/start_checks.sh"
check_wallet
check_cuda
check_api
exec python -m neurons.validator "$@"
