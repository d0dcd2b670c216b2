"""Differential: the client's A39 HTTP filter chain, pyxds against grpcio
1.85's C-core ``xds:///`` channel on the same pyxds.server and backend.

Each case is one listener (and target) of one snapshot, its filters fault
filters (A33) aborting with a code of their own, so the status an RPC ends
with names the filter instance and config that acted: several instances of
one filter type with overrides by instance name, overrides merged per name
across levels, an override of another filter's type, and
``HttpFilter.disabled`` / ``FilterConfig.disabled`` (A39 is silent on them;
C-core 1.85 honours them with Envoy's meaning, measured here; grpc-go's
``xds_http_filters_test.go`` DisabledInOverride / EnabledInOverride).  The
sans-I/O cases are in ``tests/unit/test_conformance_http_filters.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest
from channel_fixtures import Backend, CoreXdsClient, pyxds_calls, wait_until
from envoy.config.route.v3 import route_components_pb2

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

NODE = "http-filters-differential"


def abort(code: int):
    return b.fault_config(abort_grpc_status=code, abort_percent=100)


def fault(name: str, code: int | None, disabled: bool = False):
    flt = b.fault_filter(name=name, config=b.fault_config() if code is None else abort(code))
    flt.disabled = disabled
    return flt


def wrapped(code: int, disabled: bool):
    fc = route_components_pb2.FilterConfig(disabled=disabled)
    fc.config.Pack(abort(code))
    return fc


def disabled_other():
    """A disabled FilterConfig around another filter's override type."""
    fc = route_components_pb2.FilterConfig(disabled=True)
    fc.config.Pack(b.stateful_session_per_route())
    return fc


def route(vh=None, route_over=None, cluster_over=None):
    """A route config of one virtual host, one route to cluster c (a
    weighted cluster when it has overrides), with these overrides."""
    if cluster_over:
        r = b.route(prefix="", weighted_clusters={"c": 1}, typed_per_filter_config=route_over)
        for key, msg in cluster_over.items():
            r.route.weighted_clusters.clusters[0].typed_per_filter_config[key].CopyFrom(b.pack(msg))
    else:
        r = b.route(prefix="", cluster="c", typed_per_filter_config=route_over)
    return [b.virtual_host("vh", routes=[r], typed_per_filter_config=vh)]


#: name -> (listener filters, virtual hosts, the outcome C-core 1.85 gives)
CASES = {
    "by-name": (
        [fault("f1", 7), fault("f2", 8)],
        route(route_over={"f1": b.fault_config()}),
        "error:RESOURCE_EXHAUSTED",
    ),
    "merged-levels": (
        [fault("f1", 7), fault("f2", None)],
        route(vh={"f1": abort(9)}, route_over={"f2": b.fault_config()}),
        "error:FAILED_PRECONDITION",
    ),
    "other-type": (
        [fault("fault", 12)],
        route(route_over={"fault": b.stateful_session_per_route(disabled=True)}),
        "error:UNIMPLEMENTED",
    ),
    "base-disabled": ([fault("fault", 12, disabled=True)], route(), "a0"),
    "base-disabled-first": (
        [fault("f1", 7, disabled=True), fault("f2", 8)],
        route(),
        "error:RESOURCE_EXHAUSTED",
    ),
    "enabled-by-route": (
        [fault("fault", 12, disabled=True)],
        route(route_over={"fault": abort(7)}),
        "error:PERMISSION_DENIED",
    ),
    "enabled-by-vhost": (
        [fault("fault", 12, disabled=True)],
        route(vh={"fault": wrapped(9, False)}),
        "error:FAILED_PRECONDITION",
    ),
    "route-disables": (
        [fault("fault", 12)],
        route(vh={"fault": wrapped(9, False)}, route_over={"fault": wrapped(7, True)}),
        "a0",
    ),
    "cluster-disables": (
        [fault("fault", 12)],
        route(route_over={"fault": abort(7)}, cluster_over={"fault": wrapped(8, True)}),
        "a0",
    ),
    "enabled-by-other-type": (
        [fault("fault", 12, disabled=True)],
        route(route_over={"fault": b.stateful_session_per_route()}),
        "error:UNIMPLEMENTED",
    ),
    "disabled-other-type": (
        [fault("fault", 12)],
        route(route_over={"fault": disabled_other()}),
        "a0",
    ),
    "other-type-passed-over": (
        [fault("fault", 12)],
        route(vh={"fault": abort(9)}, route_over={"fault": b.stateful_session_per_route()}),
        "error:FAILED_PRECONDITION",
    ),
    "passed-over-to-disabled": (
        [fault("fault", 12, disabled=True)],
        route(
            route_over={"fault": wrapped(7, True)},
            cluster_over={"fault": b.stateful_session_per_route()},
        ),
        "error:PERMISSION_DENIED",
    ),
    "route-reenables": (
        [fault("fault", 12)],
        route(vh={"fault": wrapped(9, True)}, route_over={"fault": abort(7)}),
        "error:PERMISSION_DENIED",
    ),
}


def _snapshot(backend, extra=None, version=None) -> Snapshot:
    """Every case's listener and routes (and ``extra``: one more listener
    name -> (filters, virtual hosts)), cluster c on ``backend``."""
    cases = {n: (f, vhs) for n, (f, vhs, _) in CASES.items()} | (extra or {})
    return Snapshot(
        listeners=[b.listener(n, http_filters=f) for n, (f, _) in cases.items()],
        routes=[b.route_config(f"{n}-route", vhs) for n, (_, vhs) in cases.items()],
        clusters=[b.cluster("c")],
        endpoints=[
            b.endpoints("c", [b.locality(zone="z", priority=0, endpoints=[backend.address])])
        ],
        version=version,
    )


@pytest.fixture(scope="module")
def setup():
    server = ManagementServer().start()
    backend = Backend("a0").start()
    core = CoreXdsClient(server.bootstrap(node_id=NODE))
    opened: list[grpc.Channel] = []
    try:
        server.set_snapshot(_snapshot(backend))

        def channel(target: str) -> grpc.Channel:
            ch = pyxds.insecure_channel(target, bootstrap=server.bootstrap(node_id=NODE))
            opened.append(ch)
            return ch

        yield SimpleNamespace(core=core, channel=channel, server=server, backend=backend)
    finally:
        for ch in opened:
            ch.close()
        core.close()
        backend.stop()
        server.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_filter_instance_and_config_that_acts_agree_with_c_core(setup, case):
    """The same listener and routes through both clients: every RPC ends
    the same way (the filter instance and config that acted), and that is
    what grpcio 1.85's C-core was measured to do."""
    core, channel = setup.core, setup.channel
    target = f"xds:///{case}"
    want = CASES[case][2]
    ours = channel(target)
    assert wait_until(lambda: pyxds_calls(ours, 3, timeout=5) == {want: 3}, 15), pyxds_calls(
        ours, 3, timeout=5, details=True
    )
    assert core.call(3, target=target, timeout=5) == {want: 3}


def test_listener_updates_change_the_filters_of_a_running_channel_like_c_core(setup):
    """C-core LdsRdsInteractionTest.HcmConfigUpdatedWithoutRdsChange and
    beyond, on one channel each: a fault filter added to the listener (same
    RDS name), its config changed, emptied, the filter renamed, a route
    override added (an RDS change), the filter removed: after each update
    both clients' RPCs end as the new config says."""
    core, channel = setup.core, setup.channel
    target = "xds:///updates"
    ours = channel(target)
    plain = route()
    steps = [
        ([], plain, "a0"),
        ([fault("fault", 7)], plain, "error:PERMISSION_DENIED"),
        ([fault("fault", 8)], plain, "error:RESOURCE_EXHAUSTED"),
        ([fault("fault", None)], plain, "a0"),
        ([fault("other", 9)], plain, "error:FAILED_PRECONDITION"),
        ([fault("other", 9)], route(route_over={"other": abort(10)}), "error:ABORTED"),
        ([], plain, "a0"),
    ]
    for i, (filters, vhs, want) in enumerate(steps):
        setup.server.set_snapshot(
            _snapshot(setup.backend, {"updates": (filters, vhs)}, version=f"u{i}")
        )
        assert wait_until(lambda w=want: pyxds_calls(ours, 3, timeout=5) == {w: 3}, 15), i
        assert wait_until(lambda w=want: core.call(3, target=target, timeout=5) == {w: 3}, 15), i
