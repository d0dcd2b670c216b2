#!/usr/bin/env bash
# The README's test command: install pyxds with its test extras, lint, type
# check (mypy --strict on the files [tool.mypy] names in pyproject.toml: the
# package, the typed example in tests/typing, docs/examples), test.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_python.sh
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]"
# C-core's OpenTelemetry plugin, for the A66 metrics differential
# (tests/e2e/test_differential_metrics.py). Its releases pin grpcio to the
# exact X.Y.0, so it goes in without its dependencies over the X.Y.z grpcio
# pip chose above; without a release for this grpcio the test says so and skips.
grpc_minor=$("$PY" -c 'import grpc; print(".".join(grpc.__version__.split(".")[:2]))')
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps "grpcio-observability==$grpc_minor.*" \
    || echo "note: no grpcio-observability $grpc_minor.*; the metrics differential will skip" >&2
"$PY" -m ruff check src tests bench typings
"$PY" -m ruff format --check src tests bench typings
"$PY" -m mypy
"$PY" -m pytest "$@"
