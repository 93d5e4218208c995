#!/usr/bin/env bash
# The QUASAR local network on this machine, in one command: sets up .venv when needed, then runs
# `python -m quasar.localnet` (dev chain, submission API, a validator, an honest and a hostile
# miner; evaluation on CUDA when present, else on CPU at small lengths) and prints the verdicts,
# the leaderboard and the weights set on chain.
#   ./START_LOCALNET.sh               keep the network running after the first round (Ctrl-C stops it)
#   ./START_LOCALNET.sh --once        exit after the first round
#   ./START_LOCALNET.sh --once --json print only the summary, as JSON
# Files, wallets and logs go to ./localnet-data (--data-dir DIR); --help lists every option.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup_venv.sh
exec .venv/bin/python -m quasar.localnet "$@"
