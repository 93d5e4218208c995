#!/usr/bin/env bash
# The style checks CI runs before the tests (configured in pyproject.toml): ruff's lint rules,
# ruff's formatting (checked, never rewritten here) and mypy over quasar and neurons. Sets up
# .venv first when it is missing. `ruff format .` and `ruff check --fix .` repair most findings.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup_venv.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
