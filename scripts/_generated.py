"""What the ``scripts/gen_*.py`` generators share: write the generated file,
or with ``--check`` say whether it is up to date."""

from __future__ import annotations

import pathlib
import sys


def write_or_check(out: pathlib.Path, data: bytes, script: str) -> int:
    """Write ``data`` to ``out`` (exit status 0), or with ``--check`` in the
    arguments compare instead: 1 and a message naming ``script`` if they differ."""
    if "--check" in sys.argv[1:]:
        if not out.exists() or out.read_bytes() != data:
            print(f"{out} is out of date: run scripts/{script}", file=sys.stderr)
            return 1
        return 0
    out.write_bytes(data)
    return 0
