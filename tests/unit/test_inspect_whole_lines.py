"""``pyxds inspect`` prints each line whole: a status longer than the
terminal is not broken mid-message ("... TRANSIENT_FAILURE from" /
"XdsClusterManagerLb"), off a terminal (80 columns) nor on a narrow one."""

from __future__ import annotations

import io

import pytest

from pyxds.cli import inspect_server, inspect_view

STATUS = (
    "UNAVAILABLE: no children READY: TRANSIENT_FAILURE from XdsClusterManagerLb "
    "for cluster main (connection refused at 127.0.0.1:50051)"
)


@pytest.mark.parametrize("columns", ["80", "40"])
def test_a_status_longer_than_the_terminal_is_printed_on_one_line(columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", columns)
    dump = {
        "target": "xds:///echo-service",
        "state": "TRANSIENT_FAILURE",
        "status": STATUS,
        "cannot_serve": ["cluster canary: no endpoints: locality without weight ignored"],
    }
    out = io.StringIO()
    inspect_view.render(dump, out)
    first, *rest = out.getvalue().splitlines()
    assert first == (
        f"xds:///echo-service TRANSIENT_FAILURE  {STATUS}  "
        "cluster canary: no endpoints: locality without weight ignored"
    )
    assert rest and all(line[0] in "└├│ " for line in rest)  # tree lines only
    assert all(line == line.rstrip() for line in rest)  # not padded to the longest


def test_a_long_server_verdict_is_printed_on_one_line(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    verdict = "not served: " + STATUS
    model = {"address": "0.0.0.0:50051", "verdict": verdict, "listener": "l", "status": "ACKED"}
    model["version"] = "1"
    out = io.StringIO()
    inspect_server.render(model, out)
    assert out.getvalue().splitlines()[0] == f"xDS server 0.0.0.0:50051 {verdict}"
