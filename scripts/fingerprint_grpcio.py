"""Record the installed grpcio in the lean calls' ``VERIFIED`` tables.

The lean unary calls (``src/pyxds/channel/grpc_unary.py``,
``grpc_aio_unary.py``, ``grpc_aio_twin.py``) run only on a grpcio whose
functions they mirror were checked: a digest of those functions' compiled
code (one per CPython minor version: the bytecode differs) or, on a Python
with none recorded, of their source text.  After checking a new grpcio
release against the differential tests (tests/e2e/test_conformance_unary_lean.py,
test_conformance_aio_unary_lean.py), record it:

    .venv/bin/python scripts/fingerprint_grpcio.py                 # print this Python's digests
    .venv/bin/python scripts/fingerprint_grpcio.py --write \\
        --python .venv/bin/python --python /path/to/py3.12 --python /path/to/py3.13

``--write`` replaces each table with the code digests of every ``--python``
(each needs grpcio and this tree's dependencies installed, and must report
the same grpcio version) and the source digest, all labelled with that
version.  Without ``--write`` nothing is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = ("grpc_unary", "grpc_aio_unary", "grpc_aio_twin")

_PROBE = """
import json, sys, grpc, grpc.aio
from pyxds.channel import grpc_unary, grpc_aio_unary, grpc_aio_twin
modules = (grpc_unary, grpc_aio_unary, grpc_aio_twin)
print(json.dumps({
    "python": "%d.%d" % sys.version_info[:2],
    "grpcio": grpc.__version__,
    "code": [m.fingerprint() for m in modules],
    "source": [m.sources() for m in modules],
}))
"""


def probe(python: str) -> dict[str, Any]:
    """The digests ``python`` computes for this tree's lean modules."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [python, "-c", _PROBE], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def table(code: list[tuple[str, str]], source: str, version: str) -> str:
    """A ``VERIFIED = {...}`` block: the code digests (with their Pythons),
    then the source digest."""
    pythons = ", ".join(python for python, _ in code)
    lines = ["VERIFIED = {", f"    # their code (:func:`fingerprint`) on CPython {pythons}"]
    lines += [f'    "{digest}": "grpcio {version}",' for _, digest in code]
    lines += ["    # their source text (:func:`sources`), any Python"]
    lines += [f'    "{source}": "grpcio {version}",', "}"]
    return "\n".join(lines) + "\n"


def write(found: list[dict[str, Any]]) -> None:
    versions = {str(f["grpcio"]) for f in found}
    if len(versions) != 1:
        sys.exit(f"the Pythons have different grpcio versions: {sorted(versions)}")
    (version,) = versions
    block = re.compile(r"^VERIFIED = \{\n.*?^\}\n", re.M | re.S)
    for index, name in enumerate(MODULES):
        path = ROOT / "src" / "pyxds" / "channel" / f"{name}.py"
        text = path.read_text(encoding="utf-8")
        tables = list(block.finditer(text))
        if len(tables) != 1:
            sys.exit(f"{path}: expected one VERIFIED table")
        code = [(str(f["python"]), str(f["code"][index])) for f in found]
        new = table(code, str(found[0]["source"][index]), version)
        path.write_text(text[: tables[0].start()] + new + text[tables[0].end() :], encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: grpcio {version}, code on {[p for p, _ in code]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", help="an interpreter (repeatable)")
    parser.add_argument("--write", action="store_true", help="replace the VERIFIED tables")
    args = parser.parse_args()
    found = [probe(python) for python in (args.python or [sys.executable])]
    if args.write:
        write(found)
    else:
        for f in found:
            print(json.dumps(f))


if __name__ == "__main__":
    main()
