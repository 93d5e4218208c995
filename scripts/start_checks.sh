# The start-up START_MINER.sh and START_VALIDATOR.sh share, sourced by both with ROLE (miner or
# validator) set: from the checkout's folder, .env's settings exported (the environment's winning)
# and .venv active, then the checks each script calls. A check that fails names what to fix and
# exits 1, so pm2 shows why. ARGUMENTS holds the script's arguments, the process's flags (which
# win over both).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SCRIPT_NAME=$(basename "$0" .sh)
ARGUMENTS=("$@")

# Messages go to stderr wrapped at words within 80 columns (a longer word, a path, whole on its
# own line), a flag on the line of its value (joined by a no-break space, which fmt does not break
# at, for the wrapping): a terminal would split a path or a command to copy mid-word.
say() {
    printf '%s: %s\n' "$SCRIPT_NAME" "$*" \
        | sed -E 's/(^|[^[:alnum:]_-])(--[[:alnum:]_.-]+) ([^[:space:]-])/\1\2\xc2\xa0\3/g' \
        | fmt -w 80 | sed 's/\xc2\xa0/ /g' >&2
}

fail() {
    say "$@"
    exit 1
}

# The .env's variables exported, those the shell already sets keeping their values (the
# environment wins over .env, as everywhere in QUASAR). The .env is the one the process reads
# (quasar/config/settings.py): the file QUASAR_DOTENV names (none where it is set empty), else the
# checkout's; the checks and the process must read the same settings, so it is read by the same
# parser (python-dotenv), not sourced by bash: an unquoted value with a space (a path in
# "~/GPU work") is one value to the process, and was a command to bash. A .env that other users
# may read is said (`cp .env.example .env` under the usual umask 022 makes it so).
load_dotenv() {
    local file=./.env exports mode
    if [ -n "${QUASAR_DOTENV+set}" ]; then
        [ -n "$QUASAR_DOTENV" ] || return 0
        file=${QUASAR_DOTENV/#\~/$HOME}
        [[ "$file" == */* ]] || file=./$file # a bare name is a file here, not one on PATH
        [ -f "$file" ] || fail "QUASAR_DOTENV names $QUASAR_DOTENV, which is not a file: name a .env" \
            "file there, or set it empty to read none"
    fi
    [ -f "$file" ] || return 0
    mode=$(stat -c %a "$file")
    if (((8#$mode & 8#044) != 0)); then
        say "$file is readable by other users of this machine (mode $mode), and a .env holds" \
            "secrets (GITHUB_TOKEN, AGENT_API_KEY): chmod 600 $file"
    fi
    # shellcheck disable=SC2046 # the shell's variable names, one word each
    exports=$(python - "$file" $(compgen -v) <<'PY'
import re
import shlex
import sys

from dotenv import dotenv_values

kept = set(sys.argv[2:])
for name, value in dotenv_values(sys.argv[1]).items():
    if value is not None and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and name not in kept:
        print(f"export {name}={shlex.quote(value)}")
PY
    ) || fail "could not read the settings in $file (above)"
    eval "$exports"
}

activate_venv() {
    [ -x .venv/bin/python ] || fail "no .venv here: run ./scripts/setup_venv.sh once (it makes .venv and installs the suite)"
    # shellcheck disable=SC1091
    . .venv/bin/activate
}

# The settings the process will run with, as it reads them (quasar.cli.neuron_settings: the
# neuron's own parser given ARGUMENTS, then the .env, the environment and the defaults), into the
# variables the checks read: the checks keep no default or precedence rule of their own, and see
# a flag's prefix (--wallet.nam) or a ~USER path as the process does. A bad flag or value is
# refused here with the process's own message.
read_settings() {
    local assignments
    assignments=$(python - "$ROLE" "${ARGUMENTS[@]}" <<'PY'
import os
import shlex
import sys

from quasar.chain.btcli import DEFAULT_WALLET_PATH
from quasar.cli import neuron_settings

role = sys.argv[1]
settings = neuron_settings(role, sys.argv[2:])
wallets = str(settings.wallet_dir)
values = {
    "wallet_name": settings.wallet_name_for(role),
    "wallet_hotkey": settings.wallet_hotkey,
    "wallet_dir": wallets,
    # The --wallet-path btcli needs: none for its own folder.
    "btcli_wallet_path": "" if wallets == os.path.expanduser(DEFAULT_WALLET_PATH) else wallets,
    "device": settings.device,
    "api_url": settings.validator_api_url,
}
for name, value in values.items():
    print(f"setting_{name}={shlex.quote(value)}")
PY
    ) || exit # argparse said what is wrong, as the process would have
    eval "$assignments"
}

# The wallet's coldkey and hotkey files exist: those of the wallet the process will open.
check_wallet() {
    local name=$setting_wallet_name hotkey=$setting_wallet_hotkey wallets=$setting_wallet_dir path_flag="" file
    if [ -n "$setting_btcli_wallet_path" ]; then
        path_flag=" --wallet-path $setting_btcli_wallet_path"
    fi
    for file in "$wallets/$name/coldkeypub.txt" "$wallets/$name/hotkeys/$hotkey"; do
        [ -f "$file" ] || fail "wallet file $file does not exist: create the wallet" \
            "(btcli wallet create --wallet $name --wallet-hotkey $hotkey$path_flag)" \
            "or set WALLET_PATH / WALLET_NAME / WALLET_HOTKEY (or --wallet.path / --wallet.name / --wallet.hotkey)"
    done
}

check_cuda() {
    local device=$setting_device
    [ "$device" != "cpu" ] || return 0
    python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
        || fail "DEVICE=$device but PyTorch sees no CUDA GPU (check nvidia-smi, the driver," \
                "CUDA_VISIBLE_DEVICES and that .venv has a CUDA build of torch); DEVICE=cpu only" \
                "tries the $ROLE out (CPU results are not benchmarks)"
}

check_api() {
    local url=$setting_api_url
    if [ -z "$url" ]; then
        say "VALIDATOR_API_URL is empty: the $ROLE reads the submission API's URL from the chain," \
            "where the subnet owner published it"
        return 0
    fi
    command -v curl >/dev/null || fail "curl is not installed (needed to check the submission API): apt-get install curl"
    curl -fsS --max-time 10 "$url/health" >/dev/null 2>&1 \
        || fail "the submission API at $url does not answer GET /health: check VALIDATOR_API_URL" \
                "(or --api.url) and that the API runs (./START_SERVER.sh), or leave it empty to use the" \
                "URL the subnet owner published on chain"
}

# -h/--help is the process's, shown whatever the checks would say of this host: a new operator
# asks for it before the wallet or the GPU is there.
show_help() {
    local argument
    for argument in "${ARGUMENTS[@]}"; do
        case $argument in
            -h | --help) exec python -m "neurons.$ROLE" "${ARGUMENTS[@]}" ;;
        esac
    done
}

activate_venv
show_help
load_dotenv
read_settings
