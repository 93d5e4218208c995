#!/usr/bin/env bash
# Start the QUASAR miner: forks, optimizes, benchmarks, pushes and submits (see README).
#   ./START_MINER.sh [flags]                      flags go to the miner (python -m neurons.miner --help)
#   pm2 start ./START_MINER.sh --name quasar-miner (or: pm2 start ecosystem.config.js)
#   screen -S miner ./START_MINER.sh
# Settings come from .env (exported to the miner; variables already set in the environment win, as
# everywhere in QUASAR). Checks GITHUB_TOKEN, GITHUB_USERNAME, the wallet, CUDA and (when
# VALIDATOR_API_URL is set) the submission API first.
set -euo pipefail
cd "$(dirname "$0")"

# Messages go to stderr wrapped at words within 80 columns (a longer word, a path, whole on its
# own line): a terminal would split a path or a command to copy mid-word.
say() {
    printf 'START_MINER: %s\n' "$*" | fmt -w 80 >&2
}

fail() {
    say "$@"
    exit 1
}

if [ -f .env ]; then
    # The environment wins over .env: remember it, read .env, then restore what was already set.
    saved_environment=$(export -p | grep -v '^declare -[a-zA-Z]*r')
    set -a
    # shellcheck disable=SC1091
    . ./.env
    set +a
    eval "$saved_environment"
fi

if [ ! -f .venv/bin/activate ]; then
    fail "no .venv here: run ./scripts/setup_venv.sh once (it makes .venv and installs the suite)"
fi
# shellcheck disable=SC1091
. .venv/bin/activate

[ -n "${GITHUB_TOKEN:-}" ] || fail "GITHUB_TOKEN is not set: put a GitHub token that may fork and push in .env"
[ -n "${GITHUB_USERNAME:-}" ] || fail "GITHUB_USERNAME is not set: put the GitHub account that owns your fork in .env"

# Flags given to this script override the environment for the checks below too.
device="${DEVICE:-cuda}"
api_url="${VALIDATOR_API_URL:-}"
wallet_name="${WALLET_NAME:-${WALLET_MINER_NAME:-quasar_miner}}"
wallet_hotkey="${WALLET_HOTKEY:-default}"
wallet_path="${WALLET_PATH:-~/.bittensor/wallets}"
previous=""
for argument in "$@"; do
    case "$previous" in
        --device) device="$argument" ;;
        --api.url) api_url="$argument" ;;
        --wallet.name) wallet_name="$argument" ;;
        --wallet.hotkey) wallet_hotkey="$argument" ;;
        --wallet.path) wallet_path="$argument" ;;
    esac
    case "$argument" in
        --device=*) device="${argument#*=}" ;;
        --api.url=*) api_url="${argument#*=}" ;;
        --wallet.name=*) wallet_name="${argument#*=}" ;;
        --wallet.hotkey=*) wallet_hotkey="${argument#*=}" ;;
        --wallet.path=*) wallet_path="${argument#*=}" ;;
    esac
    previous="$argument"
done
wallet_path=${wallet_path/#\~/$HOME}
path_flag=""
if [ "$wallet_path" != "$HOME/.bittensor/wallets" ]; then
    path_flag=" --wallet-path $wallet_path"
fi
for file in "$wallet_path/$wallet_name/coldkeypub.txt" "$wallet_path/$wallet_name/hotkeys/$wallet_hotkey"; do
    [ -f "$file" ] || fail "wallet file $file does not exist: create the wallet" \
        "(btcli wallet create --wallet $wallet_name --wallet-hotkey $wallet_hotkey$path_flag)" \
        "or set WALLET_PATH / WALLET_NAME / WALLET_HOTKEY (or --wallet.path / --wallet.name / --wallet.hotkey)"
done

if [ "$device" != "cpu" ]; then
    python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
        || fail "DEVICE=$device but PyTorch sees no CUDA GPU (check nvidia-smi, the driver and" \
                "CUDA_VISIBLE_DEVICES); DEVICE=cpu only tries the miner out"
fi

if [ -z "$api_url" ]; then
    say "VALIDATOR_API_URL is empty: the miner reads the submission API's URL from the chain," \
        "where the subnet owner published it"
else
    curl -fsS --max-time 10 "${api_url%/}/health" >/dev/null 2>&1 \
        || fail "the submission API at $api_url does not answer GET /health: check VALIDATOR_API_URL" \
                "and that the API is running, or leave it empty to use the URL the subnet owner published on chain"
fi

exec python -m neurons.miner "$@"
