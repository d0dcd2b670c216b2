"""The test suite's files can all be collected in one pytest run.

pytest imports test modules by basename (rootdir-relative packages are not
used here), so two test files with one name in ``tests/unit`` and
``tests/e2e`` make the whole run stop at collection ("import file
mismatch"), which a run of either directory alone never shows.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_no_two_test_modules_share_a_basename() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py") if ".venv" not in path.parts)
    shared = sorted(name for name, count in names.items() if count > 1)
    assert not shared, f"test modules with the same basename in two directories: {shared}"
