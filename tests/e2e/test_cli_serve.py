"""``pyxds serve`` as a user runs it: a subprocess serving a YAML file that the
test edits; a pyxds channel and grpcio's C-core (``xds:///``) both follow."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from backends import CoreClient
from cli_process import PyxdsProcess
from protos import echo_pb2, echo_pb2_grpc

import pyxds._api as pyxds

TEMPLATE = """\
resources:
- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: echo-service
  apiListener:
    apiListener:
      "@type": {hcm}
      rds:
        routeConfigName: echo-route
        configSource: {{ads: {{}}, resourceApiVersion: V3}}
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
    - match: {{prefix: ""}}
      route: {{cluster: echo-cluster}}
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: echo-cluster
  type: EDS
  edsClusterConfig:
    edsConfig: {{ads: {{}}, resourceApiVersion: V3}}
- "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  clusterName: echo-cluster
  endpoints:
  - locality: {{region: r1}}
    loadBalancingWeight: 1
    lbEndpoints:
    - endpoint:
        address:
          socketAddress: {{address: 127.0.0.1, portValue: {port}}}
"""


def write(path: str, text: str) -> None:
    """Save as an editor does: a new file renamed over the old one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


HCM = (
    "type.googleapis.com/envoy.extensions.filters.network"
    ".http_connection_manager.v3.HttpConnectionManager"
)


def resources_for(backend) -> str:
    return TEMPLATE.format(port=backend.address.rsplit(":", 1)[1], hcm=HCM)


def call_until(stub, name: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        got = stub.Echo(echo_pb2.EchoRequest(message="hi"), timeout=5, wait_for_ready=True).backend
        if got == name:
            return
        seen.append(got)
        time.sleep(0.02)
    raise AssertionError(f"{name} never answered; saw {sorted(set(seen))}")


@pytest.fixture
def served(tmp_path, echo_backends):
    a, b = echo_backends(["backend-a", "backend-b"])
    path = str(tmp_path / "mesh.yaml")
    write(path, resources_for(a))
    with PyxdsProcess("serve", path) as proc:
        assert proc.stdout_line().startswith("pyxds serve: serving ")
        bootstrap = json.loads(proc.stdout_line())
        yield proc, path, bootstrap, a, b


def test_edited_file_is_pushed_to_a_pyxds_channel_and_to_c_core(served):
    proc, path, bootstrap, _a, b = served
    with (
        pyxds.insecure_channel("xds:///echo-service", bootstrap=bootstrap) as channel,
        CoreClient(bootstrap) as core,
    ):
        stub = echo_pb2_grpc.EchoStub(channel)
        call_until(stub, "backend-a")
        assert core.call_until("backend-a", timeout=15)["backend-a"] == 1
        write(path, resources_for(b))
        proc.wait_stderr(r"reloaded .*mesh\.yaml for every node")
        call_until(stub, "backend-b")
        assert core.call_until("backend-b", timeout=15)["backend-b"] == 1
        assert set(core.call(20)) == {"backend-b"}
        eds = [
            e
            for e in channel.config_dump()["xds_client"]["generic_xds_configs"]
            if e["type_url"].endswith("ClusterLoadAssignment")
        ]
        assert [(e["client_status"], e["version_info"]) for e in eds] == [("ACKED", "2")]


def test_broken_file_keeps_the_last_good_version_and_names_file_line_and_field(served):
    proc, path, bootstrap, _a, b = served
    with pyxds.insecure_channel("xds:///echo-service", bootstrap=bootstrap) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        call_until(stub, "backend-a")
        broken = resources_for(b).replace("portValue: ", "portValue: port-")
        write(path, broken)
        line = proc.wait_stderr(r"^error: ")
        bad_line = 1 + broken.splitlines().index(
            next(x for x in broken.splitlines() if "port-" in x)
        )
        assert f"mesh.yaml:{bad_line}: resources[3]." in line
        assert "portValue" in line and "last good version" in line
        assert proc.proc.poll() is None
        for _ in range(20):
            assert stub.Echo(echo_pb2.EchoRequest(), timeout=5).backend == "backend-a"
        # A resource gRPC would NACK (a STATIC cluster) is refused the same way.
        write(path, resources_for(b).replace("type: EDS", "type: STATIC"))
        line = proc.wait_stderr(r"unknown discovery type", after=1)
        assert "mesh.yaml:" in line and "(echo-cluster)" in line
        # Fixed again: the new version goes out.
        write(path, resources_for(b))
        call_until(stub, "backend-b")


def test_sighup_reloads_without_watching(tmp_path, echo_backends):
    a, b = echo_backends(["backend-a", "backend-b"])
    path = str(tmp_path / "mesh.yaml")
    write(path, resources_for(a))
    with PyxdsProcess("serve", "--no-watch", "--node-id", "me", path) as proc:
        proc.stdout_line()
        bootstrap = json.loads(proc.stdout_line())
        assert bootstrap["node"]["id"] == "me"
        with pyxds.insecure_channel("xds:///echo-service", bootstrap=bootstrap) as channel:
            stub = echo_pb2_grpc.EchoStub(channel)
            call_until(stub, "backend-a")
            write(path, resources_for(b))
            time.sleep(0.5)  # not watched: nothing may change before the signal
            assert stub.Echo(echo_pb2.EchoRequest(), timeout=5).backend == "backend-a"
            proc.signal(signal.SIGHUP)
            call_until(stub, "backend-b")


def test_per_node_files_serve_each_node_its_own_resources(tmp_path, echo_backends):
    a, b = echo_backends(["backend-a", "backend-b"])
    shared, canary = str(tmp_path / "shared.yaml"), str(tmp_path / "canary.yaml")
    write(shared, resources_for(a))
    write(canary, resources_for(b))
    with PyxdsProcess("serve", shared, "--node-file", f"canary={canary}") as proc:
        proc.stdout_line()
        bootstrap = json.loads(proc.stdout_line())
        canary_bootstrap = {**bootstrap, "node": {"id": "canary"}}
        with (
            pyxds.insecure_channel("xds:///echo-service", bootstrap=bootstrap) as plain,
            pyxds.insecure_channel("xds:///echo-service", bootstrap=canary_bootstrap) as special,
        ):
            call_until(echo_pb2_grpc.EchoStub(plain), "backend-a")
            call_until(echo_pb2_grpc.EchoStub(special), "backend-b")
