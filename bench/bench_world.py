"""The benches' world in a process of its own: ``e2e.py --serve`` (the
backends and the control plane), as a context manager that yields its
addresses and bootstrap and stops it (closing its stdin) on the way out."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


@contextlib.contextmanager
def world() -> Iterator[dict[str, Any]]:
    """{"address", "tls_address", "client_files", "bootstrap"} of a running world."""
    server = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "e2e.py"), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    try:
        yield json.loads(server.stdout.readline())
    finally:
        server.stdin.close()
        server.wait(10)
