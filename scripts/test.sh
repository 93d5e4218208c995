#!/usr/bin/env bash
# The project's test command: from a fresh clone on a fresh machine, set up .venv, install the
# project with its test extras, and run the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

# Reinstall only when the dependency files changed since the last install.
stamp=.venv/.quasar-install-stamp
wanted=$(cat requirements.txt requirements-test.txt setup.py pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    python -m pip install -q --upgrade pip
    # torch first and exactly as pinned, so nothing that depends on it pulls another build.
    python -m pip install -q "$(grep -E '^torch==' requirements.txt)"
    python -m pip install -q -e ".[test]"
    echo "$wanted" > "$stamp"
fi

exec python -m pytest "$@"
