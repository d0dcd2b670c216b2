"""CSDS side by side with grpcio's C-core (gRFC A40, A71 ``client_scope``).

The same targets, through the same management server and the same
resources, read through pyxds's CSDS service and through ``grpcio-csds``
over C-core (in a subprocess: C-core reads its bootstrap once per process).
Each case replays one of C-core's ``xds_csds_end2end_test.cc`` cases and
compares, per ``client_scope`` and resource: ``client_status``,
``version_info``, the NACKed version, which fields are set and the
``xds_config`` bytes. ``tests/e2e/test_admin_csds.py`` has the first
comparison (a NACKed Cluster); these are the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from backends import HERE
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
from ports import EXCLUSIVE, HeldPort

import pyxds._api as pyxds
import pyxds.admin
from pyxds.server import Snapshot
from pyxds.server import builders as b
from pyxds.server import inbound as ib

STATUS = csds_pb2.ClientConfig.GenericXdsConfig.DESCRIPTOR.fields_by_name["client_status"].enum_type

#: a field no xDS proto of grpcio 1.85 has (number 131071, varint 7)
UNKNOWN_FIELD = bytes([0xF8, 0xFF, 0x3F, 0x07])

_CORE = r"""
import sys
from concurrent import futures
import grpc, grpc_csds

server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.so_reuseport", 0)])
grpc_csds.add_csds_servicer(server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
targets = [t for t in sys.argv[1:] if not t.startswith("serve=")]
for serve in [t[len("serve="):] for t in sys.argv[1:] if t.startswith("serve=")]:
    xds_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), xds=True)
    xds_server.add_insecure_port(serve)
    xds_server.start()
channels = [grpc.insecure_channel(target) for target in targets]
for channel in channels:
    channel.subscribe(lambda state: None, try_to_connect=True)
print(port, flush=True)
sys.stdin.read()
"""


class Core:
    """grpcio-csds over C-core, with channels to ``targets`` resolving (a
    target ``serve=<address>``: a ``grpc.server(xds=True)`` on it instead)."""

    def __init__(self, bootstrap: dict, targets: tuple[str, ...]) -> None:
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        env["PYTHONPATH"] = HERE
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CORE, *targets],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(self.proc.communicate(timeout=10)[1][-2000:])
        self.address = f"127.0.0.1:{int(line)}"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def admin() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[EXCLUSIVE])
    pyxds.admin.add_admin_servicers(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def fetch(address: str, request: Any = None) -> Any:
    with grpc.insecure_channel(address) as channel:
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel)
        return stub.FetchClientStatus(request or csds_pb2.ClientStatusRequest(), timeout=10)


Table = dict[str, dict[tuple[str, str], tuple[Any, ...]]]


def tables(response: Any, node_id: str) -> Table:
    """scope -> (type, name) -> (status, version, NACKed version, set fields,
    xds_config, error_state fields)."""
    out: Table = {}
    for config in response.config:
        if config.node.id != node_id:
            continue
        out[config.client_scope] = {
            (x.type_url.rsplit(".", 1)[1], x.name): (
                STATUS.values_by_number[x.client_status].name,
                x.version_info,
                x.error_state.version_info if x.HasField("error_state") else None,
                tuple(sorted(f.name for f, _ in x.ListFields())),
                x.xds_config.SerializeToString(),
                tuple(sorted(f.name for f, _ in x.error_state.ListFields())),
            )
            for x in config.generic_xds_configs
        }
        DETAILS[node_id, config.client_scope] = {
            (x.type_url.rsplit(".", 1)[1], x.name): x.error_state.details
            for x in config.generic_xds_configs
            if x.HasField("error_state")
        }
    return out


#: (node id, scope) -> (type, name) -> error_state.details of the last fetch
DETAILS: dict[tuple[str, str], dict[tuple[str, str], str]] = {}


def statuses(table: Table) -> dict[str, dict[tuple[str, str], str]]:
    return {scope: {k: v[0] for k, v in t.items()} for scope, t in table.items()}


def side_by_side(
    xds_server: Any,
    admin: str,
    targets: tuple[str, ...],
    ready: Callable[[Table], bool],
    then: Callable[[], None] | None = None,
    after: Callable[[Table], bool] | None = None,
) -> tuple[Table, Table, Any, Any]:
    """Open ``targets`` in C-core and pyxds (one node id each), wait until
    both CSDS answers satisfy ``ready``; then run ``then`` and wait for
    ``after``. Returns both tables and both raw ``node`` protos."""
    core = Core(xds_server.bootstrap(node_id="csds-core", cluster="c1"), targets)
    bootstrap = xds_server.bootstrap(node_id="csds-pyxds", cluster="c1")
    channels = [pyxds.insecure_channel(t, bootstrap=bootstrap) for t in targets]
    try:
        for channel in channels:
            channel.subscribe(lambda state: None, try_to_connect=True)

        def both(predicate: Callable[[Table], bool]) -> tuple[Table, Table, Any, Any]:
            deadline = time.monotonic() + 20
            while True:
                mine_r, theirs_r = fetch(admin), fetch(core.address)
                mine, theirs = tables(mine_r, "csds-pyxds"), tables(theirs_r, "csds-core")
                if predicate(mine) and predicate(theirs):
                    node = next(c.node for c in mine_r.config if c.node.id == "csds-pyxds")
                    core_node = next(c.node for c in theirs_r.config if c.node.id == "csds-core")
                    return mine, theirs, node, core_node
                if time.monotonic() > deadline:
                    raise AssertionError(f"not reached:\npyxds {mine}\nC-core {theirs}")
                time.sleep(0.1)

        result = both(ready)
        if then is not None:
            then()
            assert after is not None
            result = both(after)
        return result
    finally:
        for channel in channels:
            channel.close()
        core.close()


def route(name: str, *clusters: str) -> Any:
    routes = [b.route(prefix="", cluster=c) for c in clusters]
    return b.route_config(name, [b.virtual_host("v", ["*"], routes)])


def with_unknown_field(msg: Any) -> Any:
    """``msg`` carrying a field of a newer xDS API (kept as an unknown field)."""
    return type(msg).FromString(msg.SerializeToString() + UNKNOWN_FIELD)


def good_snapshot(backend_address: str = "127.0.0.1:1") -> Snapshot:
    return Snapshot(
        listeners=[with_unknown_field(b.listener("csds-a", route_config_name="route-a"))],
        routes=[route("route-a", "cluster-a")],
        clusters=[b.cluster("cluster-a")],
        endpoints=[b.endpoints("cluster-a", [b.locality(endpoints=[backend_address])])],
    )


def test_acked_resources_node_and_xds_config_bytes_match_c_core(xds_server, admin):
    """C-core ``XdsConfigDumpVanilla``: LDS/RDS/CDS/EDS ACKED at version 1
    with the resource as sent (here with a field of a newer xDS API, which
    both keep: A40 "Expose xDS Config As Is"), and the node (A40 "Generated
    Node Information")."""
    xds_server.set_snapshot(good_snapshot())

    def acked(t: Table) -> bool:
        return len(t.get("xds:/csds-a", {})) == 4 and all(
            v[0] == "ACKED" for v in t["xds:/csds-a"].values()
        )

    mine, theirs, node, core_node = side_by_side(xds_server, admin, ("xds:///csds-a",), acked)
    assert mine == theirs
    listener = mine["xds:/csds-a"]["Listener", "csds-a"]
    assert UNKNOWN_FIELD in listener[4]
    # The node as the control plane sees it: the bootstrap's, plus the
    # generated user agent and client features (their values differ).
    assert node.cluster == core_node.cluster == "c1"
    assert node.user_agent_name and node.user_agent_version
    assert core_node.user_agent_name and core_node.user_agent_version
    assert set(core_node.client_features) <= set(node.client_features)


@pytest.mark.parametrize(
    "broken",
    [
        "listener_without_api_listener",
        "rds_vhost_without_domains",
        "inline_vhost_without_domains",
        "eds_locality_missing",
    ],
)
def test_nacked_resource_matches_c_core(xds_server, admin, broken):
    """C-core ``XdsConfigDumpListenerError``, ``XdsConfigDumpRouteError`` (RDS
    and inline) and ``XdsConfigDumpEndpointError``: the bad update is
    NACKED, the resource keeps version 1 and its resource, and
    ``error_state`` has version 2."""
    good = good_snapshot()
    if broken == "inline_vhost_without_domains":
        good = good.replace(
            listeners=[b.listener("csds-a", route_config=route("route-a", "cluster-a"))],
            routes=[],
        )
    xds_server.set_snapshot(good)
    kind = {
        "listener": "Listener",
        "rds": "RouteConfiguration",
        "inline": "Listener",
        "eds": "ClusterLoadAssignment",
    }[broken.split("_")[0]]
    name = {
        "Listener": "csds-a",
        "RouteConfiguration": "route-a",
        "ClusterLoadAssignment": "cluster-a",
    }[kind]

    def break_it() -> None:
        if broken == "listener_without_api_listener":
            xds_server.update(listeners=[listener_pb2.Listener(name="csds-a")])
        elif broken == "rds_vhost_without_domains":
            bad = route("route-a", "cluster-a")
            del bad.virtual_hosts[0].domains[:]
            xds_server.update(routes=[bad])
        elif broken == "inline_vhost_without_domains":
            bad = route("route-a", "cluster-a")
            del bad.virtual_hosts[0].domains[:]
            xds_server.update(listeners=[b.listener("csds-a", route_config=bad)])
        else:
            cla = endpoint_pb2.ClusterLoadAssignment(cluster_name="cluster-a")
            group = cla.endpoints.add()
            group.load_balancing_weight.value = 1
            group.lb_endpoints.add().endpoint.address.socket_address.port_value = 2
            xds_server.update(endpoints=[cla])

    def acked(t: Table) -> bool:
        entries = t.get("xds:/csds-a", {})
        return (
            (kind, name) in entries
            and all(v[0] == "ACKED" for v in entries.values())
            and (len(entries) == (3 if broken == "inline_vhost_without_domains" else 4))
        )

    def nacked(t: Table) -> bool:
        return t.get("xds:/csds-a", {}).get((kind, name), ("",))[0] == "NACKED"

    mine, theirs, _, _ = side_by_side(
        xds_server, admin, ("xds:///csds-a",), acked, then=break_it, after=nacked
    )
    assert mine == theirs
    status, version, rejected, fields, _, error_fields = mine["xds:/csds-a"][kind, name]
    assert (status, version, rejected) == ("NACKED", "1", "2")
    assert "xds_config" in fields and "error_state" in fields
    assert error_fields == ("details", "last_update_attempt", "version_info")
    # The same framing and field; the problem in pyxds's layout (documented).
    core = DETAILS["csds-core", "xds:/csds-a"][kind, name]
    details = DETAILS["csds-pyxds", "xds:/csds-a"][kind, name]
    assert core.startswith("invalid resource: ") and details.startswith("invalid resource: ")
    field = {
        "listener_without_api_listener": "Listener has neither address nor ApiListener",
        "rds_vhost_without_domains": "virtual_hosts[0].domains",
        "inline_vhost_without_domains": "HttpConnectionManager].route_config.virtual_hosts[0]",
        "eds_locality_missing": "endpoints[0].locality",
    }[broken]
    assert field in core and field in details


def test_requested_resources_match_c_core(xds_server, admin):
    """C-core ``XdsConfigDumpListenerRequested`` and
    ``XdsConfigDumpClusterRequested``: a listener the server never sends and
    two clusters it never sends stay REQUESTED (no version, no resource, no
    time), each in its own target's ``client_scope`` (A71)."""
    xds_server.set_snapshot(
        Snapshot(
            listeners=[b.listener("csds-a", route_config_name="route-a")],
            routes=[route("route-a", "cluster-1", "cluster-2")],
        )
    )

    def seen(t: Table) -> bool:
        a = t.get("xds:/csds-a", {})
        return ("Cluster", "cluster-2") in a and ("Listener", "csds-missing") in t.get(
            "xds:/csds-missing", {}
        )

    mine, theirs, _, _ = side_by_side(
        xds_server, admin, ("xds:///csds-a", "xds:///csds-missing"), seen
    )
    assert mine == theirs
    assert statuses(mine) == {
        "xds:/csds-a": {
            ("Listener", "csds-a"): "ACKED",
            ("RouteConfiguration", "route-a"): "ACKED",
            ("Cluster", "cluster-1"): "REQUESTED",
            ("Cluster", "cluster-2"): "REQUESTED",
        },
        "xds:/csds-missing": {("Listener", "csds-missing"): "REQUESTED"},
    }
    assert mine["xds:/csds-missing"]["Listener", "csds-missing"][3] == (
        "client_status",
        "name",
        "type_url",
    )


def test_deleted_listener_matches_c_core(xds_server, admin):
    """C-core ``CsdsShortAdsTimeoutTest`` DOES_NOT_EXIST, reached without the
    timer: a Listener the server withdraws after it was ACKED (LDS responses
    are the whole set) is DOES_NOT_EXIST with no resource, no version and
    an ``error_state`` naming the deleting version (A88 "Cache Entry
    States": "The entry will contain an error indicating how the deletion
    occurred"); the other target's scope is unchanged."""
    xds_server.set_snapshot(
        Snapshot(
            listeners=[
                b.listener("csds-a", route_config_name="route-a"),
                b.listener("csds-b", route_config_name="route-a"),
            ],
            routes=[route("route-a", "cluster-a")],
            clusters=[b.cluster("cluster-a")],
            endpoints=[b.endpoints("cluster-a", [b.locality(endpoints=["127.0.0.1:1"])])],
        )
    )

    def ready(t: Table) -> bool:
        return all(
            len(t.get(scope, {})) == 4 and {v[0] for v in t[scope].values()} == {"ACKED"}
            for scope in ("xds:/csds-a", "xds:/csds-b")
        )

    def gone(t: Table) -> bool:
        entry = t.get("xds:/csds-b", {}).get(("Listener", "csds-b"), ("",))
        return entry[0] == "DOES_NOT_EXIST"

    mine, theirs, _, _ = side_by_side(
        xds_server,
        admin,
        ("xds:///csds-a", "xds:///csds-b"),
        ready,
        then=lambda: xds_server.remove(listeners=["csds-b"]),
        after=gone,
    )
    assert mine == theirs
    assert mine["xds:/csds-b"]["Listener", "csds-b"][:4] == (
        "DOES_NOT_EXIST",
        "",
        "2",
        ("client_status", "error_state", "name", "type_url"),
    )
    assert DETAILS["csds-pyxds", "xds:/csds-b"]["Listener", "csds-b"] == "does not exist"
    assert DETAILS["csds-core", "xds:/csds-b"]["Listener", "csds-b"] == "does not exist"
    assert {v[0] for v in mine["xds:/csds-a"].values()} == {"ACKED"}


def test_xds_server_scope_matches_c_core(xds_server, admin):
    """A71/A40 ``client_scope`` of an xDS-enabled server's XdsClient: C-core
    keys it ``#server`` (``XdsClient`` for servers, grpcio-csds lists it
    under that scope); alone in its process (no channel to share a client
    with), pyxds's server is the same scope with the same entries: its
    Listener and the RouteConfiguration it names, ACKED (A36)."""
    held = HeldPort(shared=True)
    template = "grpc/server?xds.resource.listening_address=%s"
    try:

        def server_listener(address: str) -> Any:
            hcm = ib.inbound_hcm(None, rds="server-route")
            name = template.replace("%s", address)
            return ib.server_listener(name, address, [ib.filter_chain(hcm)])

        core_bootstrap = xds_server.bootstrap(
            node_id="csds-core", server_listener_resource_name_template=template
        )
        core = Core(core_bootstrap, (f"serve={held.address}",))
        ours = pyxds.xds_server(
            futures.ThreadPoolExecutor(max_workers=2),
            options=[EXCLUSIVE],
            bootstrap=xds_server.bootstrap(
                node_id="csds-pyxds", server_listener_resource_name_template=template
            ),
        )
        port = ours.add_insecure_port("127.0.0.1:0")
        ours.start()
        try:
            routes = [ib.inbound_route_config("server-route")]
            xds_server.set_snapshot(
                Snapshot(listeners=[server_listener(held.address)], routes=routes, version="1"),
                node_id="csds-core",
            )
            xds_server.set_snapshot(
                Snapshot(
                    listeners=[server_listener(f"127.0.0.1:{port}")], routes=routes, version="1"
                ),
                node_id="csds-pyxds",
            )

            def scoped(address: str, node_id: str, listening: str) -> dict[Any, Any] | None:
                table = tables(fetch(address), node_id).get("#server", {})
                if len(table) != 2 or {v[0] for v in table.values()} != {"ACKED"}:
                    return None
                return {
                    (kind, name.replace(listening, "ADDRESS")): value[:4]
                    for (kind, name), value in table.items()
                }

            deadline = time.monotonic() + 20
            while True:
                mine = scoped(admin, "csds-pyxds", f"127.0.0.1:{port}")
                theirs = scoped(core.address, "csds-core", held.address)
                if (mine and theirs) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        finally:
            ours.stop(None).wait(10)
            core.close()
    finally:
        held.close()
    assert mine == theirs
    assert mine is not None and set(mine) == {
        ("Listener", "grpc/server?xds.resource.listening_address=ADDRESS"),
        ("RouteConfiguration", "server-route"),
    }


def test_node_matchers_are_refused_where_c_core_ignores_them(xds_server, admin):
    """A40 "Detail: Node Matching": a request with node matchers fails
    INVALID_ARGUMENT (grpc-java ``fetchClientConfig_invalidArgument``,
    grpc-go ``buildClientStatusRespForReq``); grpcio-csds over C-core
    ignores the request and answers, and ignores ``exclude_resource_contents``
    too, which pyxds honours (docs/differences-from-c-core.md)."""
    xds_server.set_snapshot(good_snapshot())
    request = csds_pb2.ClientStatusRequest()
    request.node_matchers.add().node_id.exact = "csds-core"
    core = Core(xds_server.bootstrap(node_id="csds-core"), ("xds:///csds-a",))
    try:
        assert isinstance(fetch(core.address, request), csds_pb2.ClientStatusResponse)
        bare = csds_pb2.ClientStatusRequest(exclude_resource_contents=True)
        deadline = time.monotonic() + 20
        while not any(
            v[0] == "ACKED"
            for v in tables(fetch(core.address), "csds-core").get("xds:/csds-a", {}).values()
        ):
            assert time.monotonic() < deadline, "C-core never ACKed the Listener"
            time.sleep(0.1)
        (config,) = fetch(core.address, bare).config
        assert any(x.HasField("xds_config") for x in config.generic_xds_configs)
    finally:
        core.close()
    with pytest.raises(grpc.RpcError) as refused:
        fetch(admin, request)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "node_matchers not supported"
    # On a stream: the answer before it is sent, then the stream ends.
    with grpc.insecure_channel(admin) as channel:
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel)
        answers = stub.StreamClientStatus(
            iter([csds_pb2.ClientStatusRequest(), request, csds_pb2.ClientStatusRequest()]),
            timeout=10,
        )
        first = next(answers)
        assert isinstance(first, csds_pb2.ClientStatusResponse)
        with pytest.raises(grpc.RpcError) as ended:
            next(answers)
    assert ended.value.code() is grpc.StatusCode.INVALID_ARGUMENT
