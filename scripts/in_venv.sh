#!/usr/bin/env bash
# Run a command with this checkout's .venv active, from the checkout's folder (the servers' START
# scripts: ./scripts/in_venv.sh python -m quasar.api serve FLAGS...); without a .venv, say how to make it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    echo "No .venv here: run ./scripts/setup_venv.sh once (it installs the suite there)" >&2
    exit 1
fi
# shellcheck disable=SC1091
. .venv/bin/activate
exec "$@"
