"""A66/A78 metrics of pyxds channels through the OpenTelemetry SDK's in-memory
reader: names, units and labels as the gRFC tables, values from real RPCs over
a real ADS stream."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import grpc
import pytest
from cli_process import cli_env
from envoy.config.cluster.v3 import cluster_pb2
from protos import echo_pb2, echo_pb2_grpc

import pyxds._api as pyxds
import pyxds.aio
import pyxds.metrics
from pyxds.server import Snapshot
from pyxds.server import builders as b

otel_sdk = pytest.importorskip("opentelemetry.sdk.metrics")
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

TARGET = "xds:///echo-service"


def snapshot(backend, bad_cluster: bool = False) -> Snapshot:
    cluster = b.cluster("echo-cluster")
    if bad_cluster:
        cluster = cluster_pb2.Cluster()
        cluster.CopyFrom(b.cluster("echo-cluster"))
        cluster.type = cluster_pb2.Cluster.STATIC
    route = b.route_config(
        "echo-route", [b.virtual_host("v", ["*"], [b.route(cluster="echo-cluster")])]
    )
    return Snapshot(
        listeners=[b.listener("echo-service", route_config_name="echo-route")],
        routes=[route],
        clusters=[cluster],
        endpoints=[b.endpoints("echo-cluster", [b.locality(endpoints=[backend.address])])],
    )


@pytest.fixture
def reader():
    reader = InMemoryMetricReader()
    pyxds.metrics.enable(otel_sdk.MeterProvider(metric_readers=[reader]))
    try:
        yield reader
    finally:
        pyxds.metrics.disable()


def points(reader, name: str) -> list:
    """Every data point of metric ``name`` (with .attributes), and check its unit."""
    data = reader.get_metrics_data()
    found = []
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    assert metric.unit == pyxds.metrics.INSTRUMENTS[name].unit
                    found.extend(metric.data.data_points)
    return found


_LABEL = {
    "grpc_method": "grpc.method",
    "grpc_target": "grpc.target",
    "grpc_status": "grpc.status",
    "grpc_xds_server": "grpc.xds.server",
    "grpc_xds_authority": "grpc.xds.authority",
    "grpc_xds_cache_state": "grpc.xds.cache_state",
    "grpc_xds_resource_type": "grpc.xds.resource_type",
}


def with_labels(found: list, **labels: str) -> list:
    labels = {_LABEL[k]: v for k, v in labels.items()}
    return [p for p in found if all(p.attributes.get(k) == v for k, v in labels.items())]


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError("metric never appeared")
        time.sleep(0.05)
    return value


def test_attempt_pick_first_and_xds_client_metrics_have_a78_names_units_labels(
    reader, xds_server, echo_backends
):
    (backend,) = echo_backends(1)
    xds_server.set_snapshot(snapshot(backend))
    with pyxds.insecure_channel(TARGET, bootstrap=xds_server.bootstrap()) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for _ in range(5):
            stub.Echo(echo_pb2.EchoRequest(), timeout=10, wait_for_ready=True)

        method = {"grpc_method": "pyxds.test.Echo/Echo", "grpc_target": TARGET}
        (started,) = with_labels(points(reader, "grpc.client.attempt.started"), **method)
        assert started.value == 5
        (duration,) = with_labels(
            points(reader, "grpc.client.attempt.duration"), **method, grpc_status="OK"
        )
        assert duration.count == 5 and 0 < duration.sum < 50
        (call,) = with_labels(
            points(reader, "grpc.client.call.duration"), **method, grpc_status="OK"
        )
        assert call.count == 5 and call.sum >= duration.sum  # a call spans its attempts
        (succeeded,) = with_labels(
            points(reader, "grpc.lb.pick_first.connection_attempts_succeeded"), grpc_target=TARGET
        )
        assert succeeded.value >= 1
        server = {"grpc_target": TARGET, "grpc_xds_server": xds_server.address}
        valid = with_labels(points(reader, "grpc.xds_client.resource_updates_valid"), **server)
        assert {p.attributes["grpc.xds.resource_type"] for p in valid} == {
            "envoy.config.listener.v3.Listener",
            "envoy.config.route.v3.RouteConfiguration",
            "envoy.config.cluster.v3.Cluster",
            "envoy.config.endpoint.v3.ClusterLoadAssignment",
        }
        (connected,) = with_labels(points(reader, "grpc.xds_client.connected"), **server)
        assert connected.value == 1
        acked = with_labels(
            points(reader, "grpc.xds_client.resources"),
            grpc_target=TARGET,
            grpc_xds_authority="#old",
            grpc_xds_cache_state="acked",
        )
        assert len(acked) == 4 and all(p.value == 1 for p in acked)

        # A NACK counts an invalid resource and leaves the cluster nacked_but_cached.
        xds_server.set_snapshot(snapshot(backend, bad_cluster=True))
        xds_server.wait_for_nack("CDS", timeout=10)
        (invalid,) = wait_for(
            lambda: with_labels(
                points(reader, "grpc.xds_client.resource_updates_invalid"),
                **server,
                grpc_xds_resource_type="envoy.config.cluster.v3.Cluster",
            )
        )
        assert invalid.value == 1
        assert with_labels(
            points(reader, "grpc.xds_client.resources"),
            grpc_target=TARGET,
            grpc_xds_cache_state="nacked_but_cached",
            grpc_xds_resource_type="envoy.config.cluster.v3.Cluster",
        )

        # The backend goes away: its pick_first counts a disconnection.
        backend.stop()
        wait_for(
            lambda: with_labels(
                points(reader, "grpc.lb.pick_first.disconnections"), grpc_target=TARGET
            )
        )

        # The control plane goes away: the next stream fails without a response.
        xds_server.stop()
        wait_for(lambda: with_labels(points(reader, "grpc.xds_client.server_failure"), **server))
        (connected,) = with_labels(points(reader, "grpc.xds_client.connected"), **server)
        assert connected.value == 0


SENT = "grpc.client.attempt.sent_total_compressed_message_size"
RCVD = "grpc.client.attempt.rcvd_total_compressed_message_size"


def test_attempt_message_sizes_are_the_serialized_bytes_of_each_attempt(
    reader, xds_server, echo_backends
):
    """A66 per-attempt sent/received message bytes (no compression: the
    serialized size), for the sync calls (call, future, stream) and aio."""
    (backend,) = echo_backends(1)
    xds_server.set_snapshot(snapshot(backend))
    request = echo_pb2.EchoRequest(message="hello")
    streamed = echo_pb2.EchoRequest(message="hello", count=3)
    reply = echo_pb2.EchoReply(message="hello", backend=backend.name)
    with pyxds.insecure_channel(TARGET, bootstrap=xds_server.bootstrap()) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        stub.Echo(request, timeout=10, wait_for_ready=True)
        stub.Echo.future(request, timeout=10).result()
        assert len(list(stub.EchoStream(streamed, timeout=10))) == 3

    async def aio() -> None:
        async with pyxds.aio.insecure_channel(TARGET, bootstrap=xds_server.bootstrap()) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Echo(request, timeout=10, wait_for_ready=True)
            assert len([r async for r in stub.EchoStream(streamed, timeout=10)]) == 3

    asyncio.run(aio())
    unary = {"grpc_method": "pyxds.test.Echo/Echo", "grpc_target": TARGET, "grpc_status": "OK"}
    stream = {**unary, "grpc_method": "pyxds.test.Echo/EchoStream"}
    (sent,) = with_labels(points(reader, SENT), **unary)
    (rcvd,) = with_labels(points(reader, RCVD), **unary)
    assert (sent.count, sent.sum) == (3, 3 * request.ByteSize())
    assert (rcvd.count, rcvd.sum) == (3, 3 * reply.ByteSize())
    (sent,) = with_labels(points(reader, SENT), **stream)
    (rcvd,) = with_labels(points(reader, RCVD), **stream)
    assert (sent.count, sent.sum) == (2, 2 * streamed.ByteSize())
    assert (rcvd.count, rcvd.sum) == (2, 6 * reply.ByteSize())


def test_failed_attempts_are_recorded_with_their_status(reader, xds_server):
    xds_server.set_snapshot(Snapshot())
    with (
        pyxds.insecure_channel("xds:///missing", bootstrap=xds_server.bootstrap()) as channel,
        pytest.raises(grpc.RpcError),
    ):
        channel.unary_unary("/x.Y/Z")(b"", timeout=0.3)
    found = with_labels(
        points(reader, "grpc.client.attempt.duration"),
        grpc_method="x.Y/Z",
        grpc_target="xds:///missing",
    )
    assert [p.attributes["grpc.status"] for p in found] in (
        ["DEADLINE_EXCEEDED"],
        ["UNAVAILABLE"],
    )
    calls = with_labels(
        points(reader, "grpc.client.call.duration"),
        grpc_method="x.Y/Z",
        grpc_target="xds:///missing",
    )
    assert [(p.count, p.attributes["grpc.status"]) for p in calls] == [
        (1, found[0].attributes["grpc.status"])
    ]


def test_metrics_off_import_no_opentelemetry_and_record_nothing():
    code = (
        "import sys, pyxds, pyxds.metrics\n"
        "ch = pyxds.insecure_channel('127.0.0.1:1')\n"
        "try:\n"
        "    ch.unary_unary('/x.Y/Z')(b'', timeout=0.2)\n"
        "except Exception:\n"
        "    pass\n"
        "ch.close()\n"
        "assert pyxds.metrics.RECORDER is None\n"
        "assert not any(m.startswith('opentelemetry') for m in sys.modules), 'otel imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
