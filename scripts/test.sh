#!/usr/bin/env bash
# The project's test command: from a fresh clone on a fresh machine, set up .venv, install the
# project with its test extras, and run the whole suite. Extra arguments go to pytest.
#
# Settings (environment):
#   PYTEST_WORKERS=2   pytest-xdist worker processes (0: every test in this one process); each test
#                      file runs whole in one worker, so its module and session fixtures are built once
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup_venv.sh
# shellcheck disable=SC1091
. .venv/bin/activate

# install_debian_package PACKAGE WHAT_FAILS: apt-get install (after an update if the first try
# fails), as root or through passwordless sudo; on failure say what the suite loses.
install_debian_package() {
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo -n"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -q "$1" >/dev/null 2>&1 \
        || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "$1" >/dev/null; } \
        || echo "could not install $1: $2" >&2
}

# The submission API's tests also run on a throwaway PostgreSQL server: install the Debian package
# when its server binaries are missing (they live in /usr/lib/postgresql/N/bin, off PATH).
if ! command -v pg_ctl >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    install_debian_package postgresql "its API tests will fail under CI and skip locally"
fi

# The dashboard's browser test drives Debian's Chromium (never a downloaded browser).
if [ ! -x /usr/bin/chromium ]; then
    install_debian_package chromium "the dashboard's browser test will skip"
fi

# The inference server's clock-step test runs the server under libfaketime.
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then
    install_debian_package faketime "the inference server's clock-step test will skip"
fi

# Two workers for CI's two cores: in one process the suite kept 1.04 cores busy on average (most
# tests wait on one busy process: a server, a neuron, a sandboxed evaluation).
exec python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
