#!/usr/bin/env bash
# Start the QUASAR validator: ./START_VALIDATOR.sh [FLAGS...]
# Settings come from the environment and .env (the environment wins, as in quasar/config.py); flags
# given here win over both and are passed on to `python -m neurons.validator`.
# pm2: pm2 start ./START_VALIDATOR.sh --name quasar-validator --kill-timeout 30000
# (the kill timeout lets a running evaluation stop its sandbox cleanly on pm2 stop).
set -euo pipefail
cd "$(dirname "$0")"

# Messages go to stderr wrapped at words within 80 columns (a longer word, a path, whole on its
# own line): a terminal would split a path or a command to copy mid-word.
say() {
    printf 'START_VALIDATOR: %s\n' "$*" | fmt -w 80 >&2
}

fail() {
    say "$@"
    exit 1
}

if [ -f .env ]; then
    declare -A environment=()
    while IFS= read -r name; do
        if [ -n "${!name+set}" ]; then
            environment[$name]=${!name}
        fi
    done < <(sed -nE 's/^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=.*/\2/p' .env)
    set -a
    # shellcheck disable=SC1091
    . ./.env
    set +a
    for name in "${!environment[@]}"; do
        export "$name=${environment[$name]}"
    done
fi

if [ ! -x .venv/bin/python ]; then
    fail "no Python environment in $(pwd)/.venv: run ./scripts/setup_venv.sh once (it makes .venv and installs the suite)"
fi
# shellcheck disable=SC1091
. .venv/bin/activate

# The value a flag sets (last one wins, as argparse does), else the given default.
flag_value() {
    local name=$1 value=$2 next=0 argument
    for argument in "${ARGUMENTS[@]}"; do
        if [ "$next" = 1 ]; then
            value=$argument
            next=0
        elif [ "$argument" = "$name" ]; then
            next=1
        elif [[ "$argument" == "$name="* ]]; then
            value=${argument#*=}
        fi
    done
    printf '%s' "$value"
}
ARGUMENTS=("$@")

default_name=${WALLET_NAME:-${WALLET_VALIDATOR_NAME:-quasar_validator}}
wallet_name=$(flag_value --wallet.name "$default_name")
wallet_hotkey=$(flag_value --wallet.hotkey "${WALLET_HOTKEY:-default}")
wallet_path=$(flag_value --wallet.path "${WALLET_PATH:-~/.bittensor/wallets}")
wallet_path=${wallet_path/#\~/$HOME}
device=$(flag_value --device "${DEVICE:-cuda}")
api_url=$(flag_value --api.url "${VALIDATOR_API_URL:-}")
api_url=${api_url%/}

path_flag=""
if [ "$wallet_path" != "$HOME/.bittensor/wallets" ]; then
    path_flag=" --wallet-path $wallet_path"
fi
for file in "$wallet_path/$wallet_name/coldkeypub.txt" "$wallet_path/$wallet_name/hotkeys/$wallet_hotkey"; do
    if [ ! -f "$file" ]; then
        fail "wallet file $file does not exist: create the wallet (btcli wallet create --wallet $wallet_name --wallet-hotkey $wallet_hotkey$path_flag) or set WALLET_PATH / WALLET_NAME / WALLET_HOTKEY (or --wallet.path / --wallet.name / --wallet.hotkey)"
    fi
done

if [ "$device" != "cpu" ]; then
    if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        fail "DEVICE is $device but torch sees no CUDA device: check nvidia-smi and that .venv has a CUDA build of torch; DEVICE=cpu runs on CPU for a dev chain (CPU results are not benchmarks)"
    fi
fi

if [ -z "$api_url" ]; then
    say "VALIDATOR_API_URL is empty: the validator reads the submission API's URL from the chain, where the subnet owner published it"
else
    if ! command -v curl >/dev/null; then
        fail "curl is not installed (needed to check the submission API): apt-get install curl"
    fi
    if ! curl -fsS --max-time 10 "$api_url/health" >/dev/null 2>&1; then
        fail "the submission API at $api_url does not answer GET /health: start it (./START_SERVER.sh) or set VALIDATOR_API_URL (or --api.url) to where it runs, or leave it empty to use the URL the subnet owner published on chain"
    fi
fi

exec python -m neurons.validator "$@"
