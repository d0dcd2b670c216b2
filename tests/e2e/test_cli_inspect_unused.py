"""``pyxds inspect`` shows what the client really uses (issue 22): a locality
without ``loadBalancingWeight`` is drawn as ignored and why, its endpoints and
UNHEALTHY/DRAINING ones as not used, and the state line names the cluster
that cannot serve and why; ``--json`` (``config_dump()``) has the same words.
Both commands run as subprocesses, as a user runs them."""

from __future__ import annotations

import json

import pytest
from cli_process import PyxdsProcess, run_pyxds
from test_cli_inspect import mesh
from test_cli_serve import write

CANARY = "cluster canary: no endpoints: locality without weight ignored"
WIDE = {"COLUMNS": "250"}  # one tree line per node (rich wraps at 80 off a terminal)


@pytest.fixture
def bootstrap(tmp_path):
    """``pyxds serve`` of inspect's mesh: canary's only locality has no weight."""
    path = str(tmp_path / "mesh.yaml")
    write(path, mesh().replace("healthStatus: HEALTHY", "healthStatus: DRAINING"))
    with PyxdsProcess("serve", path) as proc:
        proc.stdout_line()
        out = tmp_path / "bootstrap.json"
        out.write_text(proc.stdout_line())
        yield str(out)


def test_inspect_json_marks_the_ignored_locality_and_names_the_cluster(bootstrap):
    done = run_pyxds("inspect", "xds:///echo-service", "--bootstrap", bootstrap, "--json")
    assert done.returncode == 0, done.stderr
    dump = json.loads(done.stdout)
    assert dump["cannot_serve"] == [CANARY]
    canary = dump["xds_config"]["clusters"]["canary"]
    assert canary["endpoints"] == 0
    assert canary["ignored_localities"] == [
        {"region": "r1", "zone": "", "sub_zone": "", "why": "no load_balancing_weight (A27)"}
    ]
    # main: its priority-0 endpoint is DRAINING (not used), priority 1 serves.
    assert dump["xds_config"]["clusters"]["main"]["endpoints"] == 1
    assert "ignored_localities" not in dump["xds_config"]["clusters"]["main"]


def test_inspect_tree_draws_ignored_and_unused_as_such_and_says_why_on_the_state_line(
    bootstrap,
):
    done = run_pyxds("inspect", "xds:///echo-service", "--bootstrap", bootstrap, env=WIDE)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("xds:///echo-service ") and lines[0].endswith(CANARY)
    out = done.stdout
    assert "cannot serve: no endpoints: locality without weight ignored" in out
    assert "locality region=r1 IGNORED: no load_balancing_weight: gRPC ignores the locality" in out
    assert "127.0.0.1:3  health UNKNOWN  not used: its locality is ignored" in out
    assert (
        "127.0.0.1:1  health DRAINING  not used: health DRAINING: no new traffic "
        "(stateful sessions may stay, A55)" in out
    )
    assert "locality region=r2 (weight 1)" in out
