"""``pyxds inspect`` as a user runs it, against ``pyxds serve`` (both subprocesses)."""

from __future__ import annotations

import json
import signal
import time

import pytest
from channel_fixtures import ahead
from cli_process import PyxdsProcess, run_pyxds
from test_cli_serve import HCM, write

MESH = """\
resources:
- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: echo-service
  apiListener:
    apiListener:
      "@type": {hcm}
      rds: {{routeConfigName: echo-route, configSource: {{ads: {{}}, resourceApiVersion: V3}}}}
      httpFilters:
      - name: router
        typedConfig: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
- "@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
  name: echo-route
  virtualHosts:
  - name: echo
    domains: ["*"]
    routes:
    - match: {{prefix: /pyxds.test.Echo/}}
      route:
        weightedClusters:
          clusters: [{{name: main, weight: 3}}, {{name: canary, weight: 1}}]
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: main
  type: EDS
  connectTimeout: 1s
  edsClusterConfig: {{edsConfig: {{ads: {{}}, resourceApiVersion: V3}}}}
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: canary
  type: {canary_type}
  edsClusterConfig: {{edsConfig: {{ads: {{}}, resourceApiVersion: V3}}}}
- "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  clusterName: main
  endpoints:
  - locality: {{region: r1, zone: z1}}
    loadBalancingWeight: {weight}
    lbEndpoints:
    - endpoint: {{address: {{socketAddress: {{address: 127.0.0.1, portValue: 1}}}}}}
      healthStatus: HEALTHY
  - locality: {{region: r2}}
    priority: 1
    loadBalancingWeight: 1
    lbEndpoints:
    - endpoint: {{address: {{socketAddress: {{address: 127.0.0.1, portValue: 2}}}}}}
- "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  clusterName: canary
  endpoints:
  - locality: {{region: r1}}
    lbEndpoints:
    - endpoint: {{address: {{socketAddress: {{address: 127.0.0.1, portValue: 3}}}}}}
"""


def mesh(canary_type: str = "EDS", weight: int = 3) -> str:
    return MESH.format(hcm=HCM, canary_type=canary_type, weight=weight)


def start_serve(tmp_path, procs: list[PyxdsProcess], text: str, *flags: str):
    """``pyxds serve`` of ``text`` (appended to ``procs``): (process, file, bootstrap file)."""
    path = str(tmp_path / "mesh.yaml")
    write(path, text)
    proc = PyxdsProcess("serve", *flags, path)
    procs.append(proc)
    proc.stdout_line()
    bootstrap = tmp_path / "bootstrap.json"
    bootstrap.write_text(proc.stdout_line())
    return proc, path, str(bootstrap)


@pytest.fixture
def serve(tmp_path):
    procs: list[PyxdsProcess] = []
    yield lambda text, *flags: start_serve(tmp_path, procs, text, *flags)
    for proc in procs:
        proc.close()


REAL_TIMER_TEST = "test_inspect_of_a_missing_listener_exits_1_after_the_does_not_exist_timer"


@pytest.fixture(scope="module", autouse=True)
def missing_listener_inspect(request, tmp_path_factory):
    """``pyxds inspect`` of a listener the control plane does not have, with
    the default timer: (seconds it ran, its outcome).  It starts with the
    module (``ahead``), so its real 15 s pass while the other tests run."""
    procs: list[PyxdsProcess] = []

    def run():
        _, _, bootstrap = start_serve(tmp_path_factory.mktemp("missing"), procs, mesh())
        started = time.monotonic()
        done = run_pyxds("inspect", "xds:///nope", "--bootstrap", bootstrap, "--timeout", "30")
        return time.monotonic() - started, done

    try:
        yield from ahead(
            request,
            "test_inspect_of_a_missing_listener_exits_1_after_the_does_not_exist_timer",
            run,
        )
    finally:
        for proc in procs:
            proc.close()


def test_inspect_json_shows_clusters_and_priorities(serve):
    _, _, bootstrap = serve(mesh())
    done = run_pyxds("inspect", "xds:///echo-service", "--bootstrap", bootstrap, "--json")
    assert done.returncode == 0, done.stderr
    dump = json.loads(done.stdout)
    names = {
        (e["type_url"].rsplit(".", 1)[1], e["name"], e["client_status"])
        for e in dump["xds_client"]["generic_xds_configs"]
    }
    assert ("Cluster", "main", "ACKED") in names and ("Cluster", "canary", "ACKED") in names
    cla = next(
        e
        for e in dump["xds_client"]["generic_xds_configs"]
        if e["name"] == "main" and e["type_url"].endswith("ClusterLoadAssignment")
    )
    assert sorted(g.get("priority", 0) for g in cla["xds_config"]["endpoints"]) == [0, 1]
    assert set(dump["xds_config"]["clusters"]) == {"main", "canary"}


def test_inspect_tree_shows_routes_priorities_localities_endpoints_and_ignored_fields(serve):
    _, _, bootstrap = serve(mesh())
    done = run_pyxds("inspect", "xds:///echo-service", "--bootstrap", bootstrap)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Listener echo-service ACKED v1" in out
    assert 'prefix "/pyxds.test.Echo/" -> split main 75%, canary 25%' in out
    assert "Cluster main ACKED v1  type EDS, lb ROUND_ROBIN" in out
    assert "priority 0" in out and "priority 1" in out
    assert "locality region=r1, zone=z1 (weight 3)" in out
    assert "127.0.0.1:1  health HEALTHY" in out
    assert "Cluster main: connect_timeout" in out
    assert "[" not in out.replace("[/", "").split("\n")[0]  # no raw markup


def test_inspect_shows_the_nack_reason(serve):
    _, _, bootstrap = serve(mesh(canary_type="STATIC"), "--no-validate")
    done = run_pyxds("inspect", "xds:///echo-service", "--bootstrap", bootstrap)
    assert done.returncode == 0, done.stderr
    assert "Cluster canary NACKED" in done.stdout
    assert "unknown discovery type" in done.stdout


def test_inspect_watch_follows_an_edited_file(serve):
    _, path, bootstrap = serve(mesh())
    with PyxdsProcess(
        "inspect", "xds:///echo-service", "--bootstrap", bootstrap, "--json", "--watch"
    ) as watch:

        def main_weights(line: str) -> list:
            dump = json.loads(line)
            cla = next(
                e
                for e in dump["xds_client"]["generic_xds_configs"]
                if e["name"] == "main" and e["type_url"].endswith("LoadAssignment")
            )
            return [g.get("load_balancing_weight") for g in cla["xds_config"]["endpoints"]]

        assert main_weights(watch.stdout_line()) == [3, 1]
        write(path, mesh(weight=7))
        for _ in range(20):  # bounded: each line is one change (subchannel states too)
            if main_weights(watch.stdout_line()) == [7, 1]:
                break
        else:
            raise AssertionError("inspect --watch never showed the new weight")


def test_inspect_interrupted_by_ctrl_c_exits_130_without_a_traceback(serve):
    _, _, bootstrap = serve(mesh())
    with PyxdsProcess(
        "inspect", "xds:///echo-service", "--bootstrap", bootstrap, "--watch"
    ) as watch:
        watch.stdout_line()  # it is connected and printing
        watch.signal(signal.SIGINT)
        assert watch.proc.wait(10) == 130
        assert watch.all_stderr() == []  # no traceback, no C-core log line


def test_inspect_of_an_unreachable_control_plane_exits_1_with_one_line(tmp_path, ports):
    port = ports.hold().port
    bootstrap = tmp_path / "b.json"
    bootstrap.write_text(
        json.dumps(
            {
                "xds_servers": [
                    {"server_uri": f"127.0.0.1:{port}", "channel_creds": [{"type": "insecure"}]}
                ],
                "node": {"id": "n"},
            }
        )
    )
    done = run_pyxds("inspect", "xds:///echo-service", "--bootstrap", str(bootstrap))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"cannot reach the control plane at 127.0.0.1:{port}" in done.stderr
    assert "check server_uri" in done.stderr


# last: it ran all along (missing_listener_inspect)
@pytest.mark.slow
def test_inspect_of_a_missing_listener_exits_1_after_the_does_not_exist_timer(
    missing_listener_inspect,
):
    """A57's does-not-exist timer, unshortened, on the CLI's XdsClient."""
    took, done = missing_listener_inspect.result(timeout=90)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0
    assert "listener 'nope' does not exist on the control plane" in done.stderr
    assert 15.0 <= took < 30, took
