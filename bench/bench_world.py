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

#: Python source of ``thread_sample()``, put in front of the benches' client
#: scripts (they run with ``python -c``): every thread of the process by id,
#: as (name, ns on a CPU, ns runnable waiting for one, voluntary switches
#: (its wake-ups), involuntary ones (preemptions)), from ``/proc/self/task``;
#: Python threads by their Python name, the others by the kernel's.
THREAD_SAMPLE = r"""
def thread_sample():
    import os, threading
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                status = dict(line.split(":", 1) for line in f)
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                on_cpu, waiting = map(int, f.read().split()[:2])
        except OSError:  # the thread ended meanwhile
            continue
        switches = [int(status[k + "_ctxt_switches"]) for k in ("voluntary", "nonvoluntary")]
        out[tid] = (names.get(int(tid)) or status["Name"].strip(), on_cpu, waiting, *switches)
    return out
"""


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
