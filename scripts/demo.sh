#!/usr/bin/env bash
# The README's demo command: install pyxds, run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e .
python3 -m pyxds.cli demo "$@"
