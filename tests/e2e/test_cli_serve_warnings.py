"""``pyxds serve`` as a user runs it, on configs a client accepts but that cannot
serve (issue 22): warnings on stderr (file:line, the resource) at start and at
every reload, ``--strict`` refusing them, and the RPC to an empty cluster
failing with a status that names the cluster and why, through pyxds and
through grpcio's C-core."""

from __future__ import annotations

import concurrent.futures
import json
import re

import grpc
import pytest
from channel_fixtures import SERVICE, Backend, CoreXdsClient, ahead, core_note, pyxds_calls
from cli_process import PyxdsProcess, run_pyxds
from protos import echo_pb2, echo_pb2_grpc
from test_cli_serve import HCM, call_until, resources_for, write

import pyxds._api as pyxds

NO_WEIGHT = "    loadBalancingWeight: 1\n"


def line_of(text: str, needle: str, nth: int = 0) -> int:
    """1-based line of the ``nth`` line of ``text`` containing ``needle``."""
    return [i + 1 for i, line in enumerate(text.splitlines()) if needle in line][nth]


def warnings(proc: PyxdsProcess, after: int = 0) -> list[str]:
    return [line for line in proc.stderr_lines[after:] if line.startswith("warning: ")]


def test_warnings_name_file_line_and_resource_at_start_and_at_every_reload(tmp_path, echo_backends):
    (a,) = echo_backends(["backend-a"])
    path = str(tmp_path / "mesh.yaml")
    bad = (
        resources_for(a)
        .replace(NO_WEIGHT, "")
        .replace("route: {cluster: echo-cluster}", "route: {cluster: nowhere}")
    )
    write(path, bad)
    with PyxdsProcess("serve", path) as proc:
        proc.stdout_line()
        bootstrap = json.loads(proc.stdout_line())
        proc.wait_stderr(r"^clients: ")
        route_line = line_of(bad, "cluster: nowhere")
        locality_line = line_of(bad, "- locality:")
        assert warnings(proc) == [
            f"warning: {path}:{route_line}: RouteConfiguration echo-route: "
            "virtualHosts[0].routes[0].route.cluster: cluster nowhere is not defined in any "
            "file served with it: clients wait 15 s for it (the does-not-exist timer), then "
            "the RPCs this route matches fail",
            f"warning: {path}:{locality_line}: ClusterLoadAssignment echo-cluster: "
            "endpoints[0].loadBalancingWeight: locality {region=r1} has no "
            "loadBalancingWeight: gRPC ignores the locality (A27); cluster echo-cluster: no "
            "endpoints: locality without weight ignored",
        ]
        # Fixed: served, and no warning comes with the reload.
        mark = len(proc.stderr_lines)
        write(path, resources_for(a))
        proc.wait_stderr(r"^reloaded .*mesh\.yaml for every node", after=mark)
        assert warnings(proc, mark) == []
        with pyxds.insecure_channel("xds:///echo-service", bootstrap=bootstrap) as channel:
            call_until(echo_pb2_grpc.EchoStub(channel), "backend-a")
        # Broken again: the warning is back, before the reload line.
        mark = len(proc.stderr_lines)
        write(path, resources_for(a).replace(NO_WEIGHT, "    loadBalancingWeight: 0\n"))
        proc.wait_stderr(r"^reloaded ", after=mark)
        (again,) = warnings(proc, mark)
        assert again.startswith(f"warning: {path}:{line_of(bad, '- locality:') + 1}: ")
        assert "has loadBalancingWeight 0" in again
        assert proc.proc.poll() is None


def test_strict_refuses_at_start_with_every_line_and_exit_2(tmp_path, echo_backends):
    (a,) = echo_backends(["backend-a"])
    path = str(tmp_path / "mesh.yaml")
    bad = resources_for(a).replace(NO_WEIGHT, "")
    write(path, bad)
    done = run_pyxds("serve", "--strict", path, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {path}:{line_of(bad, '- locality:')}: ")
    assert lines[-1] == (
        "pyxds: error: 1 config that cannot serve (--strict): fix them (see the lines above), "
        "or drop --strict"
    )
    assert done.stdout == ""  # nothing served, no bootstrap printed
    # Without --strict the same file is served (a client accepts it).
    with PyxdsProcess("serve", path) as proc:
        assert proc.stdout_line().startswith("pyxds serve: serving ")


def test_strict_on_reload_keeps_the_last_good_version_served(tmp_path, echo_backends):
    a, b = echo_backends(["backend-a", "backend-b"])
    path = str(tmp_path / "mesh.yaml")
    write(path, resources_for(a))
    with PyxdsProcess("serve", "--strict", path) as proc:
        proc.stdout_line()
        bootstrap = json.loads(proc.stdout_line())
        with pyxds.insecure_channel("xds:///echo-service", bootstrap=bootstrap) as channel:
            stub = echo_pb2_grpc.EchoStub(channel)
            call_until(stub, "backend-a")
            mark = len(proc.stderr_lines)
            write(path, resources_for(b).replace(NO_WEIGHT, ""))
            proc.wait_stderr(r"still serving the last good version to every node", after=mark)
            refused = proc.stderr_lines[mark:]
            assert refused[0].startswith(f"error: {path}:")
            assert "ClusterLoadAssignment echo-cluster" in refused[0]
            assert refused[1] == (
                "error: 1 config that cannot serve (--strict); still serving the last good "
                "version to every node"
            )
            for _ in range(10):
                assert stub.Echo(echo_pb2.EchoRequest(), timeout=5).backend == "backend-a"
            write(path, resources_for(b))
            call_until(stub, "backend-b")


EVERY_KIND = """\
resources:
- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: echo-service
  apiListener:
    apiListener:
      "@type": {hcm}
      rds: {{routeConfigName: echo-route, configSource: {{ads: {{}}, resourceApiVersion: V3}}}}
      httpFilters:
      - {{name: router, typedConfig: {{"@type": {router}}}}}
- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: second
  apiListener:
    apiListener:
      "@type": {hcm}
      rds: {{routeConfigName: nowhere, configSource: {{ads: {{}}, resourceApiVersion: V3}}}}  #<
      httpFilters:
      - {{name: router, typedConfig: {{"@type": {router}}}}}
- "@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
  name: echo-route
  virtualHosts:
  - name: echo
    domains: ["*"]
    routes:
    - match: {{prefix: "", headers: [{{name: to, exactMatch: canary}}]}}
      route: {{cluster: canary}}
    - match: {{prefix: "", headers: [{{name: to, exactMatch: ghost}}]}}
      route: {{cluster: ghost}}  #<
    - match: {{prefix: "", headers: [{{name: to, exactMatch: sick}}]}}
      route: {{cluster: sick}}
    - match: {{prefix: "", headers: [{{name: to, exactMatch: agg}}]}}
      route: {{cluster: agg}}
    - match: {{prefix: "", headers: [{{name: to, exactMatch: noeds}}]}}
      route: {{cluster: noeds}}
    - match: {{prefix: ""}}
      route:
        weightedClusters:
          clusters: [{{name: main, weight: 1}}, {{name: noeds, weight: 0}}]  #<
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: main
  type: EDS
  edsClusterConfig: {{edsConfig: {{ads: {{}}, resourceApiVersion: V3}}}}
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: canary
  type: EDS
  edsClusterConfig: {{edsConfig: {{ads: {{}}, resourceApiVersion: V3}}}}
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: sick
  type: EDS
  edsClusterConfig: {{edsConfig: {{ads: {{}}, resourceApiVersion: V3}}}}
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: noeds
  type: EDS
  edsClusterConfig: {{edsConfig: {{ads: {{}}, resourceApiVersion: V3}}}}  #<
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: agg
  clusterType:
    name: envoy.clusters.aggregate
    typedConfig:
      "@type": type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig
      clusters: [gone1, gone2]  #<
- "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  clusterName: main
  endpoints:
  - locality: {{region: r1}}
    loadBalancingWeight: 1
    lbEndpoints:
    - endpoint: {{address: {{socketAddress: {{address: 127.0.0.1, portValue: {port}}}}}}}
  - locality: {{region: r2}}
    loadBalancingWeight: 0  #<
    lbEndpoints:
    - endpoint: {{address: {{socketAddress: {{address: 127.0.0.1, portValue: 1}}}}}}
- "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  clusterName: canary
  endpoints:
  - locality: {{region: r1}}  #<
    lbEndpoints:
    - endpoint: {{address: {{socketAddress: {{address: 127.0.0.1, portValue: {port}}}}}}}
- "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  clusterName: sick
  endpoints:  #<
  - locality: {{region: r1}}
    loadBalancingWeight: 1
    lbEndpoints:
    - endpoint: {{address: {{socketAddress: {{address: 127.0.0.1, portValue: {port}}}}}}}
      healthStatus: DRAINING
"""
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def every_kind(tmp_path) -> None:
    """The scenario of ``test_every_kind_at_once_...`` (raises what fails)."""
    a = Backend("backend-a").start()
    path = str(tmp_path / "mesh.yaml")
    text = EVERY_KIND.format(hcm=HCM, router=ROUTER, port=a.address.rsplit(":", 1)[1])
    write(path, text)
    with PyxdsProcess("serve", path) as proc:
        proc.stdout_line()
        bootstrap = json.loads(proc.stdout_line())
        proc.wait_stderr(r"^clients: ")
        marks = [i + 1 for i, line in enumerate(text.splitlines()) if "#<" in line]
        found = warnings(proc)
        assert [int(re.match(rf"warning: {re.escape(path)}:(\d+): ", w)[1]) for w in found] == (
            marks
        )
        core = CoreXdsClient(bootstrap)
        try:
            with (
                pyxds.insecure_channel("xds:///echo-service", bootstrap=bootstrap) as channel,
                concurrent.futures.ThreadPoolExecutor(1) as pool,
            ):
                # both clients' timers run at once
                theirs_first = pool.submit(core.call, 1, timeout=40)
                who = channel.unary_unary(f"/{SERVICE}/Who")
                assert who(b"", timeout=40, wait_for_ready=True) == b"backend-a"
                assert theirs_first.result() == {"backend-a": 1}
                # No weight: C-core's words, then the cluster and why.
                with pytest.raises(grpc.RpcError) as raised:
                    who(b"", timeout=5, metadata=[("to", "canary")])
                theirs = core.call(
                    1, metadata=[("to", "canary")], details=True, wait_for_ready=False
                )
                ((theirs_text, _),) = theirs.items()
                assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
                assert core_note(theirs_text) == "EDS resource canary: contains no localities"
                assert raised.value.details() == (
                    "EDS resource canary: contains no localities "
                    "(cluster canary: no endpoints: locality without weight ignored)"
                )
                # DRAINING: C-core keeps the endpoint in the EDS resource and drops it
                # below (xds_override_host), so it has no words for the case
                # ("no children in weighted_target policy (xDS node ID:...)").
                with pytest.raises(grpc.RpcError) as raised:
                    who(b"", timeout=5, metadata=[("to", "sick")])
                theirs = core.call(1, metadata=[("to", "sick")], details=True, wait_for_ready=False)
                ((theirs_text, _),) = theirs.items()
                assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
                assert theirs_text.startswith("error:UNAVAILABLE: no children in weighted_target")
                assert raised.value.details().endswith(
                    "(cluster sick: no endpoints: all endpoints unhealthy)"
                )
                # No EDS resource (after the 15 s timer): the resource, then the cluster.
                with pytest.raises(grpc.RpcError) as raised:
                    who(b"", timeout=5, metadata=[("to", "noeds")])
                theirs = core.call(
                    1, metadata=[("to", "noeds")], details=True, wait_for_ready=False
                )
                ((theirs_text, _),) = theirs.items()
                assert core_note(theirs_text).startswith("EDS resource noeds: does not exist")
                assert raised.value.details() == (
                    "EDS resource noeds does not exist (cluster noeds: no endpoints)"
                )
                # The same words in config_dump(), for every cluster that cannot serve.
                assert channel.config_dump()["cannot_serve"] == [
                    "cluster agg: aggregate cluster dependency graph for agg has no leaf clusters "
                    "(CDS resource gone1 does not exist; CDS resource gone2 does not exist)",
                    "cluster canary: no endpoints: locality without weight ignored",
                    "cluster ghost: CDS resource ghost does not exist",
                    "cluster gone1: CDS resource gone1 does not exist",
                    "cluster gone2: CDS resource gone2 does not exist",
                    "cluster noeds: no endpoints: EDS resource noeds does not exist",
                    "cluster sick: no endpoints: all endpoints unhealthy",
                ]
                # A reload that fails keeps the last good version served.
                mark = len(proc.stderr_lines)
                write(path, text.replace("portValue: 1}", "portValue: one}"))
                proc.wait_stderr(r"^error: .*still serving the last good version", after=mark)
                assert pyxds_calls(channel, 5) == {"backend-a": 5}
        finally:
            core.close()
            a.stop()
        assert proc.proc.poll() is None


def test_per_node_files_are_linted_as_the_group_that_node_gets(tmp_path, echo_backends):
    (a,) = echo_backends(["backend-a"])
    shared, canary = str(tmp_path / "shared.yaml"), str(tmp_path / "canary.yaml")
    write(shared, resources_for(a))
    bad = resources_for(a).replace(NO_WEIGHT, "")
    write(canary, bad)
    with PyxdsProcess("serve", shared, "--node-file", f"canary={canary}") as proc:
        proc.stdout_line()
        proc.wait_stderr(r"^clients: ")
        (line,) = warnings(proc)
        assert line.startswith(f"warning: {canary}:{line_of(bad, '- locality:')}: ")
        assert line.endswith("(files of node 'canary')")


EVERY_KIND_TEST = (
    "test_every_kind_at_once_warns_in_file_order_serves_and_names_empty_clusters_in_rpc_errors"
)


@pytest.fixture(scope="module", autouse=True)
def every_kind_outcome(request, tmp_path_factory):
    """``every_kind`` starts with the module (``ahead``): its clients' real
    15 s does-not-exist timers pass while the module's other tests run."""
    yield from ahead(request, EVERY_KIND_TEST, lambda: every_kind(tmp_path_factory.mktemp("kinds")))


# last: it ran all along (every_kind_outcome)
@pytest.mark.slow
def test_every_kind_at_once_warns_in_file_order_serves_and_names_empty_clusters_in_rpc_errors(
    every_kind_outcome,
):
    """Bad input: every kind of unusable-but-valid config in one file.  All the
    warnings, in file order; no crash; both clients serve the good route once
    their does-not-exist timers (15 s, real: the clusters no file defines)
    fire; an RPC to an empty cluster fails naming the cluster and why (pyxds:
    C-core's words, then "(cluster NAME: no endpoints: CAUSE)"; C-core: "no
    children in weighted_target policy (...)" around the same words); a reload
    that fails keeps the last good version served."""
    every_kind_outcome.result(timeout=120)
