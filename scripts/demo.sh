#!/usr/bin/env bash
# The README's demo command: install pyxds, run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_python.sh
"$PY" -m pip install --quiet --disable-pip-version-check -e .
# C-core logs a backend's GOAWAY at INFO; keep the timeline readable.
export GRPC_VERBOSITY="${GRPC_VERBOSITY:-ERROR}"
"$PY" -m pyxds.cli demo "$@"
