"""A66/A78 metrics of pyxds channels through the OpenTelemetry SDK's in-memory
reader: names, units and labels as the gRFC tables, values from real RPCs over
a real ADS stream."""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import time

import grpc
import pytest
from channel_fixtures import until_answered
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
SCOPE = "xds:/echo-service"  # the XdsClient's key (A71), C-core's form of TARGET
#: A78's metrics (WRR, pick_first, XdsClient): off by default, named here
A78 = sorted(set(pyxds.metrics.INSTRUMENTS) - pyxds.metrics.DEFAULT_METRICS)


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
    pyxds.metrics.enable(otel_sdk.MeterProvider(metric_readers=[reader]), enable_metrics=A78)
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
    "grpc_lb_locality": "grpc.lb.locality",
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
        # the XdsClient's metrics carry its key, the target as C-core writes it
        server = {"grpc_target": SCOPE, "grpc_xds_server": xds_server.address}
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
            grpc_target=SCOPE,
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
            grpc_target=SCOPE,
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
            for _ in range(3):  # the first waits for its pick, the others start at once
                await stub.Echo(request, timeout=10, wait_for_ready=True)
            assert len([r async for r in stub.EchoStream(streamed, timeout=10)]) == 3

    asyncio.run(aio())
    unary = {"grpc_method": "pyxds.test.Echo/Echo", "grpc_target": TARGET, "grpc_status": "OK"}
    stream = {**unary, "grpc_method": "pyxds.test.Echo/EchoStream"}
    (sent,) = with_labels(points(reader, SENT), **unary)
    (rcvd,) = with_labels(points(reader, RCVD), **unary)
    assert (sent.count, sent.sum) == (5, 5 * request.ByteSize())
    assert (rcvd.count, rcvd.sum) == (5, 5 * reply.ByteSize())
    (sent,) = with_labels(points(reader, SENT), **stream)
    (rcvd,) = with_labels(points(reader, RCVD), **stream)
    assert (sent.count, sent.sum) == (2, 2 * streamed.ByteSize())
    assert (rcvd.count, rcvd.sum) == (2, 6 * reply.ByteSize())


def test_an_rpc_that_fails_before_it_is_routed_has_a_call_but_no_attempt(reader, xds_server):
    """A66: attempts are created "after name resolution and after any xDS
    HTTP filters but before the LB pick": an RPC to a target with no
    Listener ends without one (as C-core, tests/e2e/
    test_differential_metrics.py), its call duration has its status."""
    xds_server.set_snapshot(Snapshot())
    with (
        pyxds.insecure_channel("xds:///missing", bootstrap=xds_server.bootstrap()) as channel,
        pytest.raises(grpc.RpcError) as failed,
    ):
        channel.unary_unary("/x.Y/Z", _registered_method=True)(b"", timeout=0.3)
    labels = {"grpc_method": "x.Y/Z", "grpc_target": "xds:///missing"}
    for name in ("grpc.client.attempt.started", "grpc.client.attempt.duration", SENT, RCVD):
        assert with_labels(points(reader, name), **labels) == [], name
    calls = with_labels(points(reader, "grpc.client.call.duration"), **labels)
    assert [(p.count, p.attributes["grpc.status"]) for p in calls] == [
        (1, failed.value.code().name)
    ]


LOCALITY_A = '{region="us-east", zone="us-east-1a", sub_zone="rack-1"}'
LOCALITY_B = '{region="eu-west", zone="eu-west-1b", sub_zone=""}'


def two_locality_snapshot(a, b_, load_balancing_policy=None) -> Snapshot:
    """Cluster "two" over two localities of one backend each (LB policy: round
    robin across localities by equal weight, or ``load_balancing_policy``)."""
    route = b.route_config("two-route", [b.virtual_host("v", ["*"], [b.route(cluster="two")])])
    return Snapshot(
        listeners=[b.listener("two-service", route_config_name="two-route")],
        routes=[route],
        clusters=[b.cluster("two", load_balancing_policy=load_balancing_policy)],
        endpoints=[
            b.endpoints(
                "two",
                [
                    b.locality("us-east", "us-east-1a", "rack-1", endpoints=[a.address]),
                    b.locality("eu-west", "eu-west-1b", "", endpoints=[b_.address]),
                ],
            )
        ],
    )


@pytest.fixture
def locality_reader():
    reader = InMemoryMetricReader()
    pyxds.metrics.enable(
        otel_sdk.MeterProvider(metric_readers=[reader]),
        optional_labels=["grpc.lb.locality", "grpc.lb.backend_service"],
        enable_metrics=A78,
    )
    try:
        yield reader
    finally:
        pyxds.metrics.disable()


def test_attempt_duration_carries_the_locality_of_the_endpoint_each_attempt_went_to(
    locality_reader, xds_server, echo_backends
):
    # A78 "Per-Call Metrics": xds_cluster_impl's picker sets grpc.lb.locality
    # (the A78 form) for the endpoint it picked; enabled as an optional label.
    a, b_ = echo_backends(2)
    xds_server.set_snapshot(two_locality_snapshot(a, b_))
    target = "xds:///two-service"
    with pyxds.insecure_channel(target, bootstrap=xds_server.bootstrap()) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)

        def echo() -> list[str]:
            return [stub.Echo(echo_pb2.EchoRequest(), timeout=10, wait_for_ready=True).backend]

        # until both answered: each locality is picked once it is READY
        served = collections.Counter(until_answered(echo, {a.name, b_.name}))
    assert set(served) == {a.name, b_.name}
    found = with_labels(
        points(locality_reader, "grpc.client.attempt.duration"),
        grpc_method="pyxds.test.Echo/Echo",
        grpc_target=target,
        grpc_status="OK",
    )
    by_locality = {p.attributes["grpc.lb.locality"]: p.count for p in found}
    assert by_locality == {LOCALITY_A: served[a.name], LOCALITY_B: served[b_.name]}
    # A89: the cluster the attempts went to
    assert {p.attributes["grpc.lb.backend_service"] for p in found} == {"two"}


def test_aio_attempt_duration_carries_the_locality_too(locality_reader, xds_server, echo_backends):
    import asyncio

    import pyxds.aio

    a, b_ = echo_backends(2)
    xds_server.set_snapshot(two_locality_snapshot(a, b_))
    target = "xds:///two-service"

    async def main() -> collections.Counter:
        async with pyxds.aio.insecure_channel(target, bootstrap=xds_server.bootstrap()) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            served = collections.Counter()
            for _ in range(10):
                reply = await stub.Echo(echo_pb2.EchoRequest(), timeout=10, wait_for_ready=True)
                served[reply.backend] += 1
            return served

    served = asyncio.run(main())
    found = with_labels(points(locality_reader, "grpc.client.attempt.duration"), grpc_target=target)
    by_locality = {p.attributes["grpc.lb.locality"]: p.count for p in found}
    assert by_locality == {LOCALITY_A: served[a.name], LOCALITY_B: served[b_.name]}


def test_wrr_metrics_carry_the_locality_of_their_weighted_target_child(
    locality_reader, xds_server, echo_backends
):
    # A78 "Weighted Target LB Policy": each locality's WRR instance records
    # its scheduler updates under its locality.
    from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
        client_side_weighted_round_robin_pb2 as cswrr_pb2,
    )
    from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2
    from google.protobuf import duration_pb2

    cswrr = cswrr_pb2.ClientSideWeightedRoundRobin(
        blackout_period=duration_pb2.Duration(seconds=0),
        weight_update_period=duration_pb2.Duration(nanos=100_000_000),
    )
    policy = wrr_locality_pb2.WrrLocality(
        endpoint_picking_policy=b._load_balancing_policy([("wrr", cswrr)])
    )
    a, b_ = echo_backends(2)
    xds_server.set_snapshot(two_locality_snapshot(a, b_, [("wrr_locality", policy)]))
    target = "xds:///two-service"
    with pyxds.insecure_channel(target, bootstrap=xds_server.bootstrap()) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        for _ in range(10):
            stub.Echo(echo_pb2.EchoRequest(), timeout=10, wait_for_ready=True)

        def both_localities():
            found = with_labels(
                points(locality_reader, "grpc.lb.wrr.rr_fallback"), grpc_target=target
            )
            localities = {p.attributes["grpc.lb.locality"] for p in found}
            return localities if localities == {LOCALITY_A, LOCALITY_B} else None

        wait_for(both_localities)
        weights = with_labels(
            points(locality_reader, "grpc.lb.wrr.endpoint_weights"), grpc_target=target
        )
        # no ORCA reports from these backends: every weight recorded is 0
        assert {p.attributes["grpc.lb.locality"] for p in weights} == {LOCALITY_A, LOCALITY_B}
        assert {p.attributes["grpc.lb.backend_service"] for p in weights} == {"two"}  # A89
        assert all(p.sum == 0 and p.count >= 1 for p in weights)


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
