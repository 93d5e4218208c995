#!/usr/bin/env bash
# Create .venv when missing and install the project into it with its test extras; reinstall only
# when the dependency files changed since the last install. Used by ./scripts/test.sh and
# ./START_LOCALNET.sh; run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi

stamp=.venv/.quasar-install-stamp
wanted=$(cat requirements.txt requirements-test.txt setup.py pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    echo "setup_venv: installing the project into .venv (the first time takes a few minutes)" >&2
    .venv/bin/python -m pip install -q --upgrade pip
    # torch first and exactly as pinned, so nothing that depends on it pulls another build.
    .venv/bin/python -m pip install -q "$(grep -E '^torch==' requirements.txt)"
    .venv/bin/python -m pip install -q -e ".[test]"
    echo "$wanted" > "$stamp"
fi
