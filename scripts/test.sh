#!/usr/bin/env bash
# The project's test command: from a fresh clone on a fresh machine, set up .venv, install the
# project with its test extras, and run the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup_venv.sh
# shellcheck disable=SC1091
. .venv/bin/activate

# The submission API's tests also run on a throwaway PostgreSQL server: install the Debian package
# when its server binaries are missing (they live in /usr/lib/postgresql/N/bin, off PATH).
if ! command -v pg_ctl >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo -n"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -q postgresql >/dev/null 2>&1 \
        || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q postgresql >/dev/null; } \
        || echo "could not install postgresql: its API tests will fail under CI and skip locally" >&2
fi

# The dashboard's browser test drives Debian's Chromium (never a downloaded browser): install it the same way.
if [ ! -x /usr/bin/chromium ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo -n"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -q chromium >/dev/null 2>&1 \
        || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q chromium >/dev/null; } \
        || echo "could not install chromium: the dashboard's browser test will skip" >&2
fi

exec python -m pytest "$@"
