#!/usr/bin/env bash
# The README's test command: install pyxds with its test extras, lint, test.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_python.sh
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]"
"$PY" -m ruff check src tests bench
"$PY" -m ruff format --check src tests bench
"$PY" -m pytest "$@"
