"""The channel reaper's wake-ups (pyxds/channel/lifecycle.py, rule 3): it
sleeps while a channel is open and looks only after one closed or went.

Each case runs in a fresh interpreter: the reaper is a process-wide thread,
and channels other tests left open would keep it alive here."""

from __future__ import annotations

import pathlib
import subprocess
import sys

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")

_SCRIPT = r"""
import gc, queue, sys, threading, time
from pyxds.channel import lifecycle

class Recording(queue.SimpleQueue):
    def __init__(self):
        self.timeouts = []
        self.asked = threading.Event()
    def get(self, block=True, timeout=None):
        self.timeouts.append(timeout)
        self.asked.set()
        return super().get(block, timeout)

class Core:
    closed = False
    def close(self):
        self.closed = True

def settle(q):
    # the reaper is waiting in get() (asked) and asks nothing more for 0.3 s:
    # with REAPER_LINGER 0.05 a timed wait would have asked 6 times more
    assert q.asked.wait(10)
    asked = len(q.timeouts)
    time.sleep(0.3)
    return asked, len(q.timeouts)

def gone():
    deadline = time.monotonic() + 10
    while lifecycle._reaper is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return lifecycle._reaper is None

lifecycle.REAPER_LINGER = 0.05
lifecycle._reap = q = Recording()
core = Core()
lifecycle.track(core)
before, after = settle(q)
assert (before, after) == (1, 1) and q.timeouts == [None], q.timeouts
if sys.argv[1] == "closed":
    core.close()
    lifecycle.closed(core)
else:  # dropped unclosed, never released: only its weak reference tells
    del core
    gc.collect()
assert gone(), "the reaper did not exit after the last channel " + sys.argv[1]
assert q.timeouts == [None, lifecycle.REAPER_LINGER], q.timeouts
print("ok")
"""


def _run(case: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, case],
        env={"PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_reaper_sleeps_while_a_channel_is_open_and_exits_after_it_closed() -> None:
    done = _run("closed")
    assert done.stdout.strip() == "ok", done.stderr


def test_a_channel_collected_unclosed_wakes_the_reaper_to_exit() -> None:
    done = _run("went")
    assert done.stdout.strip() == "ok", done.stderr
