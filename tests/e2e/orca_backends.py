"""Backends for the WRR / ORCA e2e tests: grpcio servers on 127.0.0.1
whose load reports come from :mod:`pyxds.orca`.

Methods (bytes in, bytes out):
  /pyxds.test.Echo/Who      unary: returns the backend's name
  /pyxds.test.Echo/Stream   unary-stream: the name int(request) times
Every call records ``cpu`` and qps 100 (per-call trailer), and the same
values are kept in a ServerMetricRecorder served by OpenRcaService (OOB)
with a 0.1 s minimum interval.  ``garbage=True``: the handler sets a
malformed ORCA trailer instead of recording.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from ports import EXCLUSIVE

from pyxds.lb.orca import ORCA_TRAILER, ORCA_TRAILER_MIRROR
from pyxds.orca import (
    OrcaServerInterceptor,
    ServerMetricRecorder,
    add_orca_service,
    call_metric_recorder,
)

SERVICE = "pyxds.test.Echo"
#: per-endpoint reports: qps 100 at cpu 0.1 vs 0.9: weights 1000 : 111 = 90 % : 10 %
HEAVY, LIGHT = 0.1, 0.9


class OrcaBackend:
    """A grpcio server on 127.0.0.1 answering /pyxds.test.Echo/Who with its
    name, reporting ``cpu`` and qps 100 per call (pyxds.orca interceptor) and
    out of band (pyxds.orca OpenRcaService at up to 10 reports/s)."""

    def __init__(
        self, name: str, cpu: float, garbage: bool = False, oob_service: bool = True
    ) -> None:
        self.name = name
        self.garbage = garbage
        self.cpu = cpu
        self.served: collections.Counter = collections.Counter()
        self.recorder = ServerMetricRecorder()
        self.set_load(cpu)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16),
            interceptors=[OrcaServerInterceptor()],
            options=[EXCLUSIVE],
        )

        def record() -> None:
            self.served[name] += 1
            if self.garbage:
                return
            recorder = call_metric_recorder()
            assert recorder is not None
            recorder.record_cpu_utilization(self.cpu).record_qps(100.0)

        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            record()
            if self.garbage:
                bad = b"\xff\xff\xff\xff"
                context.set_trailing_metadata(((ORCA_TRAILER, bad), (ORCA_TRAILER_MIRROR, bad)))
            return name.encode()

        def stream(request: bytes, context: grpc.ServicerContext):
            record()
            for _ in range(int(request or b"1")):
                yield name.encode()

        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        "Who": grpc.unary_unary_rpc_method_handler(who),
                        "Stream": grpc.unary_stream_rpc_method_handler(stream),
                    },
                ),
            )
        )
        if oob_service:
            add_orca_service(self._server, self.recorder, min_report_interval=0.1)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def set_load(self, cpu: float) -> None:
        self.cpu = cpu
        self.recorder.set_cpu_utilization(cpu)
        self.recorder.set_qps(100.0)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.stop(None).wait(5)


def wrr_policy(
    oob: bool,
    oob_period: float | None = None,
    metric_names: tuple[str, ...] = (),
    penalty: float | None = None,
) -> Any:
    """A WrrLocality over ClientSideWeightedRoundRobin (A52/A58): blackout
    0 s, weight updates every 0.1 s; ``oob``: enableOobLoadReport;
    ``oob_period``: oobReportingPeriod in seconds (0.1 s with ``oob``);
    ``metric_names``: A114's metric_names_for_computing_utilization;
    ``penalty``: error_utilization_penalty."""
    from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
        client_side_weighted_round_robin_pb2 as cswrr_pb2,
    )
    from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2
    from google.protobuf import duration_pb2, wrappers_pb2

    from pyxds.server import builders as b

    cswrr = cswrr_pb2.ClientSideWeightedRoundRobin(
        blackout_period=duration_pb2.Duration(seconds=0),
        weight_update_period=duration_pb2.Duration(nanos=100_000_000),
        metric_names_for_computing_utilization=metric_names,
    )
    if oob_period is None and oob:
        oob_period = 0.1
    if oob_period is not None:
        cswrr.oob_reporting_period.FromNanoseconds(int(oob_period * 1e9))
    if oob:
        cswrr.enable_oob_load_report.CopyFrom(wrappers_pb2.BoolValue(value=True))
    if penalty is not None:
        cswrr.error_utilization_penalty.CopyFrom(wrappers_pb2.FloatValue(value=penalty))
    inner = b._load_balancing_policy([("wrr", cswrr)])
    return wrr_locality_pb2.WrrLocality(endpoint_picking_policy=inner)


def wrr_snapshot(
    cluster: str,
    addresses: list[str],
    oob: bool,
    version: str,
    oob_period: float | None = None,
    metric_names: tuple[str, ...] = (),
    penalty: float | None = None,
) -> Any:
    """The channel fixtures' listener and route to one WRR cluster over ``addresses``."""
    from channel_fixtures import route, snapshot

    from pyxds.server import builders as b
    from pyxds.server.snapshot import Snapshot

    base = snapshot([route(prefix="", cluster=cluster)], {cluster: []})
    listener_t, route_t, _cluster_t, _eds_t = list(base._by_type)
    policy = wrr_policy(oob, oob_period, metric_names, penalty)
    return Snapshot(
        listeners=list(base.resources(listener_t).values()),
        routes=list(base.resources(route_t).values()),
        clusters=[b.cluster(cluster, load_balancing_policy=[("wrr_locality", policy)])],
        endpoints=[b.endpoints(cluster, [b.locality(zone=f"{cluster}-z", endpoints=addresses)])],
        version=version,
    )


def warm_then_count(
    channel: Any, core: Any, n: int, warm: int = 300, **call_args: Any
) -> tuple[collections.Counter, collections.Counter]:
    """``warm`` calls on the pyxds ``channel``, then on the C-core client
    ``core`` (connections, first reports, weight updates), then ``n`` on
    each: (pyxds counts, C-core counts) as channel_fixtures counts them."""
    from channel_fixtures import pyxds_calls

    pyxds_calls(channel, warm, **call_args)
    core.call(warm, **call_args)
    return pyxds_calls(channel, n, **call_args), core.call(n, **call_args)


@contextlib.contextmanager
def both_clients(server: Any, node: str) -> Iterator[tuple[Any, Any]]:
    """(a pyxds xds: channel, a C-core CoreXdsClient) on ``server``'s
    bootstrap for ``node``, both closed at the end."""
    from channel_fixtures import TARGET, CoreXdsClient

    import pyxds._api as pyxds

    bootstrap = server.bootstrap(node_id=node)
    core = CoreXdsClient(bootstrap)
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    try:
        yield channel, core
    finally:
        channel.close()
        core.close()
