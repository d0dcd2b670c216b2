"""Resource files (YAML and JSON, Envoy's JSON form) and the ``python -m pyxds.server`` entry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from backends import CoreClient, RawAdsClient, resource_names_of

from pyxds.server import (
    CLUSTER,
    CLUSTER_LOAD_ASSIGNMENT,
    LISTENER,
    ROUTE_CONFIGURATION,
    ResourceFileError,
    Snapshot,
    dump_resources,
    load_resources,
    parse_resources,
)
from pyxds.server import builders as b

HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network."
    "http_connection_manager.v3.HttpConnectionManager"
)
RR_TYPE = "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"

YAML_TEMPLATE = textwrap.dedent(
    """\
    version: "7"
    resources:
    - "@type": type.googleapis.com/envoy.config.listener.v3.Listener
      name: echo-service
      apiListener:
        apiListener:
          "@type": HCM_TYPE
          rds:
            routeConfigName: echo-route
            configSource: {ads: {}, resourceApiVersion: V3}
          httpFilters:
          - name: router
            typedConfig:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
    - "@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
      name: echo-route
      virtualHosts:
      - name: echo
        domains: ["*"]
        routes:
        - match: {prefix: ""}
          route: {cluster: echo-cluster}
    - "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
      name: echo-cluster
      type: EDS
      edsClusterConfig:
        edsConfig: {ads: {}, resourceApiVersion: V3}
      loadBalancingPolicy:
        policies:
        - typedExtensionConfig:
            name: rr
            typedConfig:
              "@type": RR_TYPE
    - "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
      clusterName: echo-cluster
      endpoints:
      - locality: {region: r1}
        loadBalancingWeight: 1
        lbEndpoints:
        - endpoint:
            address:
              socketAddress: {address: 127.0.0.1, portValue: PORT}
    """
)
YAML = YAML_TEMPLATE.replace("HCM_TYPE", HCM_TYPE).replace("RR_TYPE", RR_TYPE)


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_yaml_file_loads_every_type_with_nested_any_resolved(tmp_path):
    snapshot = load_resources(write(tmp_path, "r.yaml", YAML.replace("PORT", "5000")))
    assert snapshot.version == "7"
    assert [x.name for x in snapshot.listeners] == ["echo-service"]
    hcm_any = snapshot.listeners[0].api_listener.api_listener
    assert hcm_any.type_url.endswith("HttpConnectionManager")
    assert [r.name for r in snapshot.routes] == ["echo-route"]
    cluster = snapshot.clusters[0]
    assert cluster.load_balancing_policy.policies[0].typed_extension_config.name == "rr"
    assert (
        snapshot.endpoints[0]
        .endpoints[0]
        .lb_endpoints[0]
        .endpoint.address.socket_address.port_value
        == 5000
    )


def test_json_file_with_a_bare_list_loads(tmp_path):
    resources = [
        {"@type": CLUSTER, "name": "c1", "type": "EDS"},
        {"@type": LISTENER, "name": "l1"},
    ]
    snapshot = load_resources(write(tmp_path, "r.json", json.dumps(resources)))
    assert snapshot.version is None
    assert [c.name for c in snapshot.clusters] == ["c1"]
    assert [x.name for x in snapshot.listeners] == ["l1"]


def test_dumped_snapshot_parses_back_to_the_same_resources():
    snapshot = Snapshot(
        listeners=[b.listener("l", "r", max_stream_duration=2.5)],
        routes=[
            b.route_config(
                "r",
                [
                    b.virtual_host(
                        "v",
                        ["*"],
                        [
                            b.route(
                                path="/pkg.Svc/Method",
                                headers=[b.header_matcher("x", safe_regex="a.*")],
                                weighted_clusters={"a": 1, "b": 2},
                                runtime_fraction=0.5,
                            ),
                        ],
                    )
                ],
            )
        ],
        clusters=[b.cluster("agg", aggregate_children=["a", "b"]), b.cluster("a", max_requests=9)],
        endpoints=[b.endpoints("a", [b.locality(endpoints=["127.0.0.1:1"])], {"lb": 10})],
        version="3",
    )
    assert parse_resources(json.loads(json.dumps(dump_resources(snapshot)))) == snapshot


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("resources: 5", "resources: expected a list, got int"),
        ("[1]", r"resources\[0\]: expected an object"),
        ('[{"@type": "type.googleapis.com/foo.Bar"}]', r"resources\[0\]: @type: expected one of"),
        (
            f'[{{"@type": "{CLUSTER}", "name": "c", "type": "NOPE"}}]',
            r"resources\[0\]\.type: Invalid enum value NOPE",
        ),
        (
            f'[{{"@type": "{CLUSTER}", "name": "c"}}, {{"@type": "{CLUSTER}", "name": "c"}}]',
            r"resources\[1\]: name: duplicate resource name 'c' \(also resources\[0\]\)",
        ),
        (f'[{{"@type": "{CLUSTER}"}}]', r"resources\[0\]: name: missing"),
        (
            f'[{{"@type": "{CLUSTER}", "name": "c"}}, {{"@type": "{CLUSTER_LOAD_ASSIGNMENT}"}}]',
            r"resources\[1\]: clusterName: missing",
        ),
        (
            f"[{{'@type': '{CLUSTER}', name: c, edsClusterConfig: {{edsConfig: {{adss: {{}}}}}}}}]",
            r"resources\[0\]\.edsClusterConfig\.edsConfig\.adss: .*no field named \"adss\"",
        ),
        ("{resources: [], verison: 2}", "unknown key 'verison'"),
        ("{resources: [], version: true}", "version: expected a string, got True"),
        ("", "empty file"),
        ("{foo: 1}", "expected a list or a mapping with 'resources'"),
        ("[unclosed", "invalid YAML"),
    ],
)
def test_bad_resource_file_names_the_file_and_the_entry(tmp_path, text, error):
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ResourceFileError, match=error) as info:
        load_resources(path)
    assert str(info.value).startswith(path)


def test_non_utf8_file_is_a_resource_file_error_naming_the_file(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00resources: []")
    with pytest.raises(ResourceFileError, match="not UTF-8 text") as info:
        load_resources(path)
    assert str(info.value).startswith(str(path))


def test_missing_file_is_a_resource_file_error(tmp_path):
    with pytest.raises(ResourceFileError, match="cannot read"):
        load_resources(tmp_path / "nope.yaml")


def test_resources_from_a_yaml_file_route_core_client_rpcs(tmp_path, xds_server, echo_backends):
    (backend,) = echo_backends(["from-file"])
    xds_server.set_snapshot(
        load_resources(write(tmp_path, "r.yaml", YAML.replace("PORT", str(backend.port))))
    )
    with CoreClient(xds_server.bootstrap(), "xds:///echo-service") as client:
        assert client.call(3) == {"from-file": 3}
    for type_url in (LISTENER, ROUTE_CONFIGURATION, CLUSTER, CLUSTER_LOAD_ASSIGNMENT):
        xds_server.wait_for_ack(type_url, "7", timeout=5)


def test_module_entry_serves_a_file_until_terminated(tmp_path):
    path = write(tmp_path, "r.yaml", YAML.replace("PORT", "5000"))
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyxds.server", "--file", path, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "serving" in banner, proc.stderr.read() if proc.poll() is not None else banner
        bootstrap = json.loads(proc.stdout.readline())
        address = bootstrap["xds_servers"][0]["server_uri"]
        with RawAdsClient(address) as client:
            client.send(LISTENER, ["echo-service"])
            response = client.recv(timeout=10)
        assert resource_names_of(response) == ["echo-service"]
        assert response.version_info == "7"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_module_entry_reloads_the_file_on_sighup(tmp_path):
    path = write(tmp_path, "r.yaml", YAML.replace("PORT", "5000"))
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyxds.server", "--file", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        address = json.loads(proc.stdout.readline())["xds_servers"][0]["server_uri"]
        with RawAdsClient(address) as client:
            client.send(CLUSTER_LOAD_ASSIGNMENT, ["echo-cluster"])
            first = client.recv(timeout=10)
            client.ack(first, ["echo-cluster"])
            write(tmp_path, "r.yaml", YAML.replace("PORT", "6000").replace('"7"', '"8"'))
            proc.send_signal(signal.SIGHUP)
            second = client.recv(timeout=10)
        assert (first.version_info, second.version_info) == ("7", "8")
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_module_entry_reports_a_bad_file_and_exits_2(tmp_path):
    path = write(tmp_path, "bad.yaml", "resources: 5")
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "pyxds.server", "--file", path],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert done.returncode == 2
    assert "resources: expected a list" in done.stderr


def test_module_entry_reports_a_binary_file_and_exits_2(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00")
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "pyxds.server", "--file", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert f"error: {path}: not UTF-8 text" in done.stderr
    assert "Traceback" not in done.stderr


def test_module_entry_keeps_serving_when_a_reload_finds_a_bad_file(tmp_path):
    path = write(tmp_path, "r.yaml", YAML.replace("PORT", "5000"))
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyxds.server", "--file", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        address = json.loads(proc.stdout.readline())["xds_servers"][0]["server_uri"]
        with open(path, "wb") as f:
            f.write(b"\xff\xfe\x00")
        proc.send_signal(signal.SIGHUP)
        assert "reload failed" in proc.stderr.readline()
        assert proc.poll() is None
        with RawAdsClient(address) as client:
            client.send(LISTENER, ["echo-service"])
            assert client.recv(timeout=10).version_info == "7"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
