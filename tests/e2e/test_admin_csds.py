"""CSDS (gRFC A40, A71 client_scope): a real CSDS client reads pyxds's xDS state
through ``pyxds.admin.add_admin_servicers``, and the answer has the shape of
grpcio's own CSDS service (``grpcio-csds`` over C-core) for the same control plane."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
from backends import HERE
from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
from ports import EXCLUSIVE
from protos import echo_pb2, echo_pb2_grpc
from test_differential_csds import Core

import pyxds._api as pyxds
import pyxds.admin
from pyxds.server import Snapshot
from pyxds.server import builders as b

TARGET = "xds:///echo-service"
#: the target's CSDS client_scope, as C-core writes it (its URI re-serialized)
SCOPE = "xds:/echo-service"
STATUS = csds_pb2.ClientConfig.GenericXdsConfig.DESCRIPTOR.fields_by_name["client_status"].enum_type


def snapshot(backend, cluster_kind_ok: bool = True) -> Snapshot:
    cluster = b.cluster("echo-cluster")
    if not cluster_kind_ok:
        cluster = cluster_pb2.Cluster()
        cluster.CopyFrom(b.cluster("echo-cluster"))
        cluster.type = cluster_pb2.Cluster.STATIC  # gRPC clients reject it: NACK
    return Snapshot(
        listeners=[b.listener("echo-service", route_config_name="echo-route")],
        routes=[
            b.route_config(
                "echo-route", [b.virtual_host("v", ["*"], [b.route(cluster="echo-cluster")])]
            )
        ],
        clusters=[cluster],
        endpoints=[b.endpoints("echo-cluster", [b.locality(endpoints=[backend.address])])],
    )


def admin_server() -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[EXCLUSIVE])
    pyxds.admin.add_admin_servicers(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def fetch(address: str, exclude: bool = False) -> csds_pb2.ClientStatusResponse:
    with grpc.insecure_channel(address) as channel:
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel)
        request = csds_pb2.ClientStatusRequest(exclude_resource_contents=exclude)
        return stub.FetchClientStatus(request, timeout=10)


def configs_of(response, node_id: str) -> list:
    return [c for c in response.config if c.node.id == node_id]


def status_table(config) -> dict:
    """(type, name) -> (client_status, version, error_state version or None)."""
    return {
        (x.type_url.rsplit(".", 1)[1], x.name): (
            STATUS.values_by_number[x.client_status].name,
            x.version_info,
            x.error_state.version_info if x.HasField("error_state") else None,
        )
        for x in config.generic_xds_configs
    }


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.05)


@pytest.fixture
def admin():
    server, address = admin_server()
    yield address
    server.stop(None)


def test_csds_reports_acked_and_nacked_resources_with_scope_versions_and_error(
    xds_server, echo_backends, admin
):
    (backend,) = echo_backends(1)
    xds_server.set_snapshot(snapshot(backend))
    bootstrap = xds_server.bootstrap(node_id="csds-acked-nacked")
    with pyxds.insecure_channel(TARGET, bootstrap=bootstrap) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        stub.Echo(echo_pb2.EchoRequest(), timeout=10, wait_for_ready=True)
        xds_server.set_snapshot(snapshot(backend, cluster_kind_ok=False))
        xds_server.wait_for_nack("CDS", timeout=10)

        def nacked():
            configs = configs_of(fetch(admin), "csds-acked-nacked")
            return configs if configs and "NACKED" in str(status_table(configs[0])) else None

        (config,) = wait_for(nacked)
        assert config.client_scope == SCOPE
        assert status_table(config) == {
            ("Listener", "echo-service"): ("ACKED", "1", None),
            ("RouteConfiguration", "echo-route"): ("ACKED", "1", None),
            ("Cluster", "echo-cluster"): ("NACKED", "1", "2"),
            ("ClusterLoadAssignment", "echo-cluster"): ("ACKED", "1", None),
        }
        cds = next(x for x in config.generic_xds_configs if x.type_url.endswith("Cluster"))
        assert "unknown discovery type" in cds.error_state.details
        assert cds.error_state.last_update_attempt.seconds > 0
        assert cds.last_updated.seconds > 0
        assert cds.xds_config.type_url.endswith("envoy.config.cluster.v3.Cluster")
        # The NACKed cluster keeps serving its last good version.
        assert stub.Echo(echo_pb2.EchoRequest(), timeout=5).backend == backend.name
        # exclude_resource_contents drops the resources, not their status.
        (bare,) = configs_of(fetch(admin, exclude=True), "csds-acked-nacked")
        assert not any(x.HasField("xds_config") for x in bare.generic_xds_configs)
        assert status_table(bare) == status_table(config)
    # A closed channel's client is gone from CSDS.
    wait_for(lambda: not configs_of(fetch(admin), "csds-acked-nacked"))


def test_csds_lists_requested_and_does_not_exist_names(xds_server, admin):
    xds_server.set_snapshot(Snapshot())
    bootstrap = xds_server.bootstrap(node_id="csds-missing")
    with pyxds.insecure_channel("xds:///nowhere", bootstrap=bootstrap) as channel:
        # An RPC starts resolution; the listener never comes.
        with pytest.raises(grpc.RpcError):
            channel.unary_unary("/x.Y/Z")(b"", timeout=0.5)
        (config,) = wait_for(lambda: configs_of(fetch(admin), "csds-missing"))
        assert config.client_scope == "xds:/nowhere"
        assert status_table(config)[("Listener", "nowhere")][0] in ("REQUESTED", "DOES_NOT_EXIST")


def test_stream_client_status_answers_each_request_and_aio_servers_work(xds_server, echo_backends):
    (backend,) = echo_backends(1)
    xds_server.set_snapshot(snapshot(backend))
    bootstrap = xds_server.bootstrap(node_id="csds-aio")

    async def main() -> list:
        server = grpc.aio.server(options=[EXCLUSIVE])
        pyxds.admin.add_admin_servicers(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel)
                one = await stub.FetchClientStatus(csds_pb2.ClientStatusRequest(), timeout=10)
                call = stub.StreamClientStatus(timeout=10)
                answers = []
                for _ in range(2):
                    await call.write(csds_pb2.ClientStatusRequest())
                    answers.append(await call.read())
                await call.done_writing()
                return [one, *answers]
        finally:
            await server.stop(None)

    with pyxds.insecure_channel(TARGET, bootstrap=bootstrap) as channel:
        echo_pb2_grpc.EchoStub(channel).Echo(
            echo_pb2.EchoRequest(), timeout=10, wait_for_ready=True
        )
        responses = asyncio.run(main())
    assert len(responses) == 3
    for response in responses:
        (config,) = configs_of(response, "csds-aio")
        assert {s for s, _, _ in status_table(config).values()} == {"ACKED"}


#: target forms whose client_scope C-core writes differently from the target
SCOPE_TARGETS = (
    "xds:///echo-service",
    "xds:echo-service",
    "xds:///echo%20service",
    "xds:///a:b@c",
    "xds:///echo-service?q=1",
)


def test_client_scope_is_the_target_written_as_c_core_writes_it(xds_server, echo_backends, admin):
    # A71/A40: client_scope is the key channels look their XdsClient up by;
    # the same targets through C-core (grpcio-csds) and pyxds give the same keys.
    (backend,) = echo_backends(1)
    names = ("echo-service", "echo service", "a:b@c")
    xds_server.set_snapshot(
        Snapshot(
            listeners=[b.listener(name, route_config_name="echo-route") for name in names],
            routes=[
                b.route_config(
                    "echo-route", [b.virtual_host("v", ["*"], [b.route(cluster="echo-cluster")])]
                )
            ],
            clusters=[b.cluster("echo-cluster")],
            endpoints=[b.endpoints("echo-cluster", [b.locality(endpoints=[backend.address])])],
        )
    )
    core = Core(xds_server.bootstrap(node_id="scope-core"), SCOPE_TARGETS)
    try:
        # a target's XdsClient (and scope) exists once its channel resolves
        configs = wait_for(
            lambda: (c := configs_of(fetch(core.address), "scope-core")) and len(c) == 5 and c
        )
    finally:
        core.close()
    theirs = sorted(c.client_scope for c in configs)
    bootstrap = xds_server.bootstrap(node_id="scope-pyxds")
    channels = [pyxds.insecure_channel(target, bootstrap=bootstrap) for target in SCOPE_TARGETS]
    try:
        for channel in channels:
            echo_pb2_grpc.EchoStub(channel).Echo(
                echo_pb2.EchoRequest(), timeout=10, wait_for_ready=True
            )
        mine = sorted(c.client_scope for c in configs_of(fetch(admin), "scope-pyxds"))
    finally:
        for channel in channels:
            channel.close()
    assert theirs == [
        "xds:/a:b@c",
        "xds:/echo%20service",
        "xds:/echo-service",
        "xds:/echo-service?q=1",
        "xds:echo-service",
    ]
    assert mine == theirs


_CORE_CSDS = r"""
import json, sys
from concurrent import futures
import grpc, grpc_csds
from protos import echo_pb2, echo_pb2_grpc

server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.so_reuseport", 0)])
grpc_csds.add_csds_servicer(server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(sys.argv[1])
echo_pb2_grpc.EchoStub(channel).Echo(echo_pb2.EchoRequest(), timeout=20, wait_for_ready=True)
print(port, flush=True)
sys.stdin.read()
"""


def test_csds_has_the_shape_of_grpcio_csds_over_c_core(xds_server, echo_backends, admin):
    (backend,) = echo_backends(1)
    xds_server.set_snapshot(snapshot(backend))
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(xds_server.bootstrap(node_id="csds-core"))
    env["PYTHONPATH"] = HERE
    core = subprocess.Popen(
        [sys.executable, "-c", _CORE_CSDS, TARGET],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        core_address = f"127.0.0.1:{int(core.stdout.readline())}"
        with pyxds.insecure_channel(
            TARGET, bootstrap=xds_server.bootstrap(node_id="csds-pyxds")
        ) as channel:
            stub = echo_pb2_grpc.EchoStub(channel)
            stub.Echo(echo_pb2.EchoRequest(), timeout=10, wait_for_ready=True)
            xds_server.set_snapshot(snapshot(backend, cluster_kind_ok=False))
            wait_for(lambda: len(xds_server.nacks("CDS")) >= 2)

            def both():
                (mine,) = configs_of(fetch(admin), "csds-pyxds")
                (theirs,) = configs_of(fetch(core_address), "csds-core")
                if "NACKED" in str(status_table(mine)) and "NACKED" in str(status_table(theirs)):
                    return mine, theirs
                return None

            mine, theirs = wait_for(both, timeout=15)
        # A71: the key of the target's XdsClient; C-core writes the parsed
        # URI again (the empty authority left out), and so does pyxds.
        assert mine.client_scope == theirs.client_scope == SCOPE
        assert status_table(mine) == status_table(theirs)
        assert set(mine.ListFields()[i][0].name for i in range(len(mine.ListFields()))) == set(
            theirs.ListFields()[i][0].name for i in range(len(theirs.ListFields()))
        )
        for a, b_ in zip(
            sorted(mine.generic_xds_configs, key=lambda x: (x.type_url, x.name)),
            sorted(theirs.generic_xds_configs, key=lambda x: (x.type_url, x.name)),
            strict=True,
        ):
            assert {f.name for f, _ in a.ListFields()} == {f.name for f, _ in b_.ListFields()}
            assert a.xds_config == b_.xds_config
    finally:
        core.stdin.close()
        core.wait(10)
