#!/usr/bin/env bash
# The README's test command: install pyxds with its test extras, lint, test.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
python3 -m ruff check src tests bench
python3 -m ruff format --check src tests bench
python3 -m pytest "$@"
