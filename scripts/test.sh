#!/usr/bin/env bash
# The README's test command: install pyxds with its test extras, lint, type
# check (mypy --strict on the files [tool.mypy] names in pyproject.toml: the
# package, the typed example in tests/typing, docs/examples), test.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_python.sh
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]"
"$PY" -m ruff check src tests bench typings
"$PY" -m ruff format --check src tests bench typings
"$PY" -m mypy
"$PY" -m pytest "$@"
