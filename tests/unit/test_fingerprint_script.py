"""scripts/fingerprint_grpcio.py computes what the lean calls check: the
digests it prints for this Python are the ones their ``VERIFIED`` tables
hold for the installed grpcio (so a grpcio bump is recorded with it)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import grpc

from pyxds.channel import grpc_aio_twin, grpc_aio_unary, grpc_unary

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_script_prints_the_digests_the_lean_calls_verify() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fingerprint_grpcio.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["grpcio"] == grpc.__version__
    modules = (grpc_unary, grpc_aio_unary, grpc_aio_twin)
    for module, code, source in zip(modules, found["code"], found["source"], strict=True):
        assert module.VERIFIED.get(code) == f"grpcio {grpc.__version__}", module.__name__
        assert module.VERIFIED.get(source) == f"grpcio {grpc.__version__}", module.__name__
