#!/usr/bin/env bash
# Start the QUASAR miner: forks, optimizes, benchmarks, pushes and submits (see README).
#   ./START_MINER.sh [flags]                      flags go to the miner (python -m neurons.miner --help)
#   pm2 start ./START_MINER.sh --name quasar-miner (or: pm2 start ecosystem.config.js)
#   screen -S miner ./START_MINER.sh
# Settings come from .env (exported to the miner; variables already set in the environment win, as
# everywhere in QUASAR). Checks GITHUB_TOKEN, GITHUB_USERNAME, the wallet, CUDA and (when
# VALIDATOR_API_URL is set) the submission API first (scripts/start_checks.sh).
set -euo pipefail
ROLE=miner
# shellcheck source=scripts/start_checks.sh
. "$(dirname "$0")/scripts/start_checks.sh"
[ -n "${GITHUB_TOKEN:-}" ] || fail "GITHUB_TOKEN is not set: put a GitHub token that may fork and push in .env"
[ -n "${GITHUB_USERNAME:-}" ] || fail "GITHUB_USERNAME is not set: put the GitHub account that owns your fork in .env"
check_wallet
check_cuda
check_api
exec python -m neurons.miner "$@"
