"""How the ``pyxds`` command fails: one line naming the cause and the fix.

Exit status 2 is a usage error (bad command line, bad input file at start),
1 a runtime error (control plane unreachable, port taken, listener missing).
No traceback reaches the user.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

USAGE = 2
RUNTIME = 1


class CliError(Exception):
    """A failure to report as ``pyxds: error: <message>`` with exit ``code``."""

    def __init__(self, message: str, code: int = RUNTIME) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str) -> int:
    print(f"pyxds: error: {message}", file=sys.stderr, flush=True)
    return RUNTIME


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that says where to get help."""

    def error(self, message: str) -> NoReturn:
        print(
            f"{self.prog}: error: {message} (see '{self.prog} --help')",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(USAGE)


def seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds > 0 (``nan``, ``inf``, 0
    and negatives are usage errors naming the option)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number of seconds > 0")
    return value
