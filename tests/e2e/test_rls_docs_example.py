"""docs/rls.md's example, run as a user runs it: a script in a subprocess
(RouteLookupServer, ManagementServer, backends and a pyxds channel on
127.0.0.1); it prints what the page says it prints.  Run again without its
``channel.close()``: the script still ends promptly and quietly."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXPECTED = [
    "alice -> gold",
    "bob -> silver",
    "mallory -> bronze",
    "carol -> bronze",
    "alice -> gold",
    "lookups: ['alice', 'bob', 'mallory', 'carol']",
]


def example() -> str:
    (code,) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "rls.md").read_text(), re.S)
    return code


@pytest.mark.parametrize("close", [True, False], ids=["closed", "never-closed"])
def test_the_docs_example_prints_what_the_page_says(tmp_path, close):
    code = example()
    if not close:
        code = code.replace("    channel.close()\n", "")
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == EXPECTED
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
