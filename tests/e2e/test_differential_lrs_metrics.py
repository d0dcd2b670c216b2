"""Differential LRS custom metrics (gRFC A64 as amended by A85): pyxds and
grpcio's C-core send the same RPCs to the same pyxds.orca backend (which
reports per call: the standard ``endpoint-load-metrics-bin`` trailer C-core
reads, and the ``x-endpoint-load-metrics-bin`` mirror pyxds reads), through
one pyxds.server config whose cluster has ``lrs_server: self`` and
``lrs_report_endpoint_metrics``; the ORCA metrics each client reports over
LRS, summed over its reports, must be equal: the same names, counts and
totals, per locality.  Also with A85 switched off
(GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION=false in both clients: A64's
rule, every named metric under its own name).
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
import pytest
from channel_fixtures import LISTENER, SERVICE, TARGET, CoreXdsClient, pyxds_calls, wait_until
from ports import EXCLUSIVE

import pyxds._api as pyxds
from pyxds.orca import OrcaServerInterceptor, call_metric_recorder
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

N = 40
CLUSTER = "lrs-metrics"
METRICS = [
    "named_metrics.foo",
    "cpu_utilization",
    "mem_utilization",
    "application_utilization",
    "not_a_field",
]


class MetricsBackend:
    """A grpcio server reporting, on every Who call, cpu 0.25, mem 0.5,
    application 0.75 and named metrics foo=2, bar=3 (pyxds.orca)."""

    def __init__(self) -> None:
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            interceptors=[OrcaServerInterceptor()],
            options=[EXCLUSIVE],
        )

        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            recorder = call_metric_recorder()
            assert recorder is not None
            recorder.record_cpu_utilization(0.25).record_memory_utilization(0.5)
            recorder.record_application_utilization(0.75)
            recorder.record_named_metric("foo", 2.0).record_named_metric("bar", 3.0)
            return b"m0"

        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE, {"Who": grpc.unary_unary_rpc_method_handler(who)}
                ),
            )
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.stop(None).wait(5)


@pytest.fixture(scope="module")
def backend():
    started = MetricsBackend()
    yield started
    started.stop()


def lrs_snapshot(address: str, metrics: list[str], policy: Any = None) -> Snapshot:
    """LISTENER -> CLUSTER (LRS on, reporting ``metrics``; ``policy``: its
    ``load_balancing_policy``, as builders.cluster takes it) -> ``address``."""
    return Snapshot(
        listeners=[b.listener(LISTENER)],
        routes=[
            b.route_config(
                f"{LISTENER}-route",
                [b.virtual_host("vh", routes=[b.route(prefix="", cluster=CLUSTER)])],
            )
        ],
        clusters=[
            b.cluster(
                CLUSTER,
                lrs_server=True,
                lrs_report_endpoint_metrics=metrics,
                load_balancing_policy=policy,
            )
        ],
        endpoints=[b.endpoints(CLUSTER, [b.locality(region="r", zone="z", endpoints=[address])])],
    )


@pytest.fixture
def server(backend):
    srv = ManagementServer(lrs_interval=1.0).start()
    srv.set_snapshot(lrs_snapshot(backend.address, METRICS))
    yield srv
    srv.stop()


def metric_totals(server, node: str) -> dict[str, tuple[int, float]]:
    """(metric name -> (requests, total)) summed over every report of the
    node, the top-level A85 fields under their own names."""
    out: dict[str, list] = {}

    def add(name: str, count: int, total: float) -> None:
        entry = out.setdefault(name, [0, 0.0])
        entry[0] += count
        entry[1] += total

    requests = 0
    for record in server.lrs.reports(CLUSTER, node):
        for loc in record.stats.upstream_locality_stats:
            requests += loc.total_successful_requests
            for field in ("cpu_utilization", "mem_utilization", "application_utilization"):
                if loc.HasField(field):
                    value = getattr(loc, field)
                    add(field, value.num_requests_finished_with_metric, value.total_metric_value)
            for metric in loc.load_metric_stats:
                add(
                    metric.metric_name,
                    metric.num_requests_finished_with_metric,
                    metric.total_metric_value,
                )
    out["requests"] = [requests, 0.0]
    return {k: (int(v[0]), round(v[1], 9)) for k, v in out.items()}


def reported(server, node: str, want: int) -> dict:
    assert wait_until(lambda: metric_totals(server, node)["requests"][0] >= want, timeout=15)
    return metric_totals(server, node)


def run_both(server, node: str, env: dict | None = None) -> tuple[dict, dict]:
    ours_node, core_node = f"{node}-pyxds", f"{node}-core"
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=ours_node))
    core = CoreXdsClient(server.bootstrap(node_id=core_node), env=env)
    try:
        assert pyxds_calls(channel, N) == {"m0": N}
        assert core.call(N) == {"m0": N}
        return reported(server, ours_node, N), reported(server, core_node, N)
    finally:
        channel.close()
        core.close()


def test_lrs_metric_totals_equal_c_core_s(server):
    ours, theirs = run_both(server, "lrs-m")
    assert ours == theirs
    assert ours == {
        "requests": (N, 0.0),
        "cpu_utilization": (N, N * 0.25),
        "mem_utilization": (N, N * 0.5),
        "application_utilization": (N, N * 0.75),
        "named_metrics.foo": (N, N * 2.0),  # bar is not listed
    }


def test_lrs_metric_totals_equal_c_core_s_with_a85_switched_off(server, monkeypatch):
    monkeypatch.setenv("GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION", "false")
    ours, theirs = run_both(
        server, "lrs-m-legacy", env={"GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION": "false"}
    )
    assert ours == theirs
    assert ours == {"requests": (N, 0.0), "foo": (N, N * 2.0), "bar": (N, N * 3.0)}


# -- found in review (review55): which calls count, which metrics a report lacks -------------


class MixedBackend:
    """A pyxds.orca backend whose methods report differently: ``Who`` cpu
    0.25 and foo=2; ``Sleep`` nothing; ``Fail`` cpu 0.5 and foo=1, then
    fails the call; ``Meta`` only bar=3 (no utilization recorded)."""

    def __init__(self) -> None:
        def recorder():
            got = call_metric_recorder()
            assert got is not None
            return got

        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            recorder().record_cpu_utilization(0.25).record_named_metric("foo", 2.0)
            return b"m0"

        def nothing(request: bytes, context: grpc.ServicerContext) -> bytes:
            return b"m0"

        def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
            recorder().record_cpu_utilization(0.5).record_named_metric("foo", 1.0)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")
            raise AssertionError("unreachable")

        def only_named(request: bytes, context: grpc.ServicerContext) -> bytes:
            recorder().record_named_metric("bar", 3.0)
            return b"m0"

        handlers = {"Who": who, "Sleep": nothing, "Fail": fail, "Meta": only_named}
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            interceptors=[OrcaServerInterceptor()],
            options=[EXCLUSIVE],
        )
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {m: grpc.unary_unary_rpc_method_handler(h) for m, h in handlers.items()},
                ),
            )
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def stop(self) -> None:
        self._server.stop(None).wait(5)


def test_failed_calls_and_reports_lacking_a_metric_count_as_in_c_core():
    """A64/A85 counting, against C-core: a report counts for every listed
    top-level utilization (0 when the backend recorded none) and for each
    named metric it has; a call without a report counts for nothing; a
    failed call's report counts too."""
    backend = MixedBackend()
    srv = ManagementServer(lrs_interval=1.0).start()
    try:
        all_named = ["named_metrics.*", "cpu_utilization", "mem_utilization"]
        srv.set_snapshot(lrs_snapshot(f"127.0.0.1:{backend.port}", all_named))
        channel = pyxds.insecure_channel(TARGET, bootstrap=srv.bootstrap(node_id="mixed-pyxds"))
        core = CoreXdsClient(srv.bootstrap(node_id="mixed-core"))
        try:
            n = 5
            for method in ("Who", "Sleep", "Fail", "Meta"):
                path = f"/{SERVICE}/{method}"
                want = {"error:PERMISSION_DENIED" if method == "Fail" else "m0": n}
                assert pyxds_calls(channel, n, method=path) == want
                assert core.call(n, method=path) == want
            ours = reported(srv, "mixed-pyxds", 3 * n)
            theirs = reported(srv, "mixed-core", 3 * n)
        finally:
            channel.close()
            core.close()
        assert ours == theirs
        assert ours == {
            "requests": (3 * n, 0.0),  # successful ones; Fail's are errors
            "cpu_utilization": (3 * n, n * 0.25 + n * 0.5),  # Who, Fail and Meta (0)
            "mem_utilization": (3 * n, 0.0),
            "named_metrics.foo": (2 * n, n * 2.0 + n * 1.0),
            "named_metrics.bar": (n, n * 3.0),
        }
    finally:
        srv.stop()
        backend.stop()
