"""The live view of ``pyxds demo`` (rich): step progress, a per-backend share
table that updates as RPCs complete, and the timeline's last lines."""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
from rich.progress import Progress as Bar
from rich.table import Table

from pyxds.cli.demo import STEPS, Progress

_LOG_LINES = 12


class LiveView(Progress):
    """Receives the demo's steps, traffic counts and timeline lines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bar = Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
        self._task = self._bar.add_task("starting", total=STEPS)
        self._counts: collections.Counter[str] = collections.Counter()
        self._lines: collections.deque[str] = collections.deque(maxlen=_LOG_LINES)

    #: Steps take well under a second; a pause lets a person read each one.
    PAUSE = 0.8

    def step(self, number: int, title: str) -> None:
        with self._lock:
            self._bar.update(self._task, completed=number - 1, description=title)
            if number < STEPS:  # the traffic table stays on screen for the final dump step
                self._counts = collections.Counter()
        time.sleep(self.PAUSE)

    def traffic(self, counts: collections.Counter[str]) -> None:
        with self._lock:
            self._counts = collections.Counter(counts)

    def say(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def __rich__(self) -> Group:
        with self._lock:
            table = Table(title="RPCs by backend (this step)", expand=False)
            table.add_column("backend")
            table.add_column("RPCs", justify="right")
            table.add_column("share", justify="right")
            table.add_column("", min_width=20)
            total = sum(self._counts.values()) or 1
            for name, n in sorted(self._counts.items()):
                share = n / total
                style = "red" if name.startswith("error") else "green"
                table.add_row(
                    escape(name), str(n), f"{share:.1%}", f"[{style}]{'█' * round(share * 20)}[/]"
                )
            log = Panel(escape("\n".join(self._lines)), title="timeline", border_style="dim")
            return Group(self._bar.get_renderable(), table, log)


def run_live(run_demo: Callable[..., int]) -> int:
    """Run ``run_demo(say, progress)`` under a rich Live display.

    C-core writes its own log lines (a backend's GOAWAY at INFO) straight to
    file descriptor 2, which would tear the live display: while it runs, fd 2
    goes to a temporary file, shown afterwards only if the demo failed.
    """
    view = LiveView()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            with Live(view, refresh_per_second=8, transient=False):
                code = run_demo(view.say, view)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        if code != 0:
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
    return code
