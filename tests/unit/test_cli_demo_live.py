"""The demo's live view renders steps, per-backend shares and the timeline."""

from __future__ import annotations

import collections
import io

from rich.console import Console

from pyxds.cli import demo_live
from pyxds.cli.demo import STEPS


def test_live_view_shows_the_step_the_share_table_and_the_timeline(monkeypatch):
    monkeypatch.setattr(demo_live.LiveView, "PAUSE", 0.0)
    view = demo_live.LiveView()
    view.step(1, "75/25 split")
    view.traffic(collections.Counter({"main": 75, "canary": 25, "error UNAVAILABLE": 0}))
    view.say("[  0.1s] 1. RDS splits greeter [not markup]")
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(view)
    text = out.getvalue()
    assert "75/25 split" in text and f"0/{STEPS}" in text
    assert "main" in text and "75.0%" in text and "25.0%" in text
    assert "[not markup]" in text  # timeline text is shown as is


def test_run_live_returns_the_demo_status(monkeypatch):
    monkeypatch.setattr(demo_live.LiveView, "PAUSE", 0.0)

    def fake_demo(say, progress) -> int:
        progress.step(1, "one")
        say("line")
        return 3

    assert demo_live.run_live(fake_demo) == 3
