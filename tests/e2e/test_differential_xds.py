"""Differential: the same scenarios through pyxds and through grpcio's own
C-core ``xds:///`` channel (in a subprocess: C-core reads its bootstrap once
per process), against the same pyxds.server and backends.  Both must agree:
the same backends for deterministic cases, distributions within tolerance,
the same failover direction within a time bound."""

from __future__ import annotations

import collections
import threading

import grpc
import pytest
from channel_fixtures import (
    SERVICE,
    TARGET,
    Backend,
    CoreXdsClient,
    call_until,
    header,
    pyxds_calls,
    route,
    running_backends,
    snapshot,
    wait_until,
)

import pyxds._api as pyxds
from pyxds.server import ManagementServer

FAST_BACKOFF = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 300)]


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("a0", "b0", "c0", "d0")


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id="differential"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(server):
    ch = pyxds.insecure_channel(
        TARGET, bootstrap=server.bootstrap(node_id="differential"), options=FAST_BACKOFF
    )
    yield ch
    ch.close()


def both_settle(core, channel, expected: set[str], n: int = 20, timeout: float = 10.0) -> None:
    assert wait_until(lambda: set(pyxds_calls(channel, n)) == expected, timeout)
    assert wait_until(lambda: set(core.call(n)) == expected, timeout)


def test_split_agrees_with_c_core(server, backends, core, channel):
    server.set_snapshot(
        snapshot(
            [route(prefix="", weighted_clusters={"ca": 75, "cb": 25})],
            {"ca": [[backends["a0"].address]], "cb": [[backends["b0"].address]]},
        )
    )
    both_settle(core, channel, {"a0", "b0"}, n=40)
    ours = pyxds_calls(channel, 4000)
    theirs = core.call(4000)
    p_ours, p_theirs = ours["a0"] / 4000, theirs["a0"] / 4000
    assert set(ours) == set(theirs) == {"a0", "b0"}
    # bounds of 5 standard deviations (one run in millions fails them by
    # chance; 3 sd failed about one in 150): a share's sd is
    # sqrt(0.75 * 0.25 / 4000) = 0.0068, the difference's sqrt(2) times that
    sd = (0.75 * 0.25 / 4000) ** 0.5
    assert abs(p_ours - 0.75) < 5 * sd and abs(p_theirs - 0.75) < 5 * sd
    assert abs(p_ours - p_theirs) < 5 * sd * 2**0.5


def test_path_and_header_routing_agree_with_c_core(server, backends, core, channel):
    server.set_snapshot(
        snapshot(
            [
                route(path=f"/{SERVICE}/Sleep", cluster="cb"),
                route(prefix="", headers=[header("x-env", exact="canary")], cluster="cc"),
                route(prefix="", headers=[header("x-env", prefix="can")], cluster="cd"),
                route(prefix=f"/{SERVICE}/", cluster="ca"),
            ],
            {
                "ca": [[backends["a0"].address]],
                "cb": [[backends["b0"].address]],
                "cc": [[backends["c0"].address]],
                "cd": [[backends["d0"].address]],
            },
        )
    )
    both_settle(core, channel, {"a0"})
    cases = [
        (f"/{SERVICE}/Who", []),
        (f"/{SERVICE}/Who", [("x-env", "canary")]),
        (f"/{SERVICE}/Who", [("x-env", "canada")]),
        (f"/{SERVICE}/Who", [("x-env", "prod")]),
        (f"/{SERVICE}/Sleep", []),
        (f"/{SERVICE}/Sleep", [("x-env", "canary")]),
    ]
    for method, md in cases:
        ours = pyxds_calls(channel, 5, method=method, metadata=md)
        theirs = core.call(5, method=method, metadata=md)
        assert ours == theirs, (method, md, ours, theirs)
        assert len(ours) == 1  # deterministic


def test_priority_failover_and_back_agree_with_c_core(server, backends, core, channel):
    p0 = Backend("dp0").start()
    try:
        server.set_snapshot(
            snapshot(
                [route(prefix="", cluster="cp")], {"cp": [[p0.address], [backends["d0"].address]]}
            )
        )
        both_settle(core, channel, {"dp0"})
        p0.stop()
        ours = call_until(channel, "d0", 10)
        theirs = core.until("d0", 10)
        assert ours < 10 and "__elapsed__" in theirs
        assert abs(ours - theirs["__elapsed__"] / 1000) < 5
        p0.start()
        ours_back = call_until(channel, "dp0", 15)
        theirs_back = core.until("dp0", 15)
        assert ours_back < 15 and "__elapsed__" in theirs_back
        both_settle(core, channel, {"dp0"})
    finally:
        p0.stop()


def test_route_switch_agrees_with_c_core_and_pyxds_fails_nothing(server, backends, core, channel):
    server.set_snapshot(
        snapshot([route(prefix="", cluster="cold")], {"cold": [[backends["a0"].address]]})
    )
    both_settle(core, channel, {"a0"})
    counts: collections.Counter = collections.Counter()
    stop = threading.Event()

    def load():
        mc = channel.unary_unary(f"/{SERVICE}/Who")
        while not stop.is_set():
            try:
                counts[mc(b"", timeout=5).decode()] += 1
            except grpc.RpcError as err:
                counts["error:" + err.code().name] += 1

    thread = threading.Thread(target=load)
    thread.start()
    try:
        assert wait_until(lambda: sum(counts.values()) > 0, 5)  # the load runs
        server.set_snapshot(
            snapshot([route(prefix="", cluster="cnew")], {"cnew": [[backends["c0"].address]]})
        )
        theirs = core.until("c0", 10)
        assert wait_until(lambda: counts["c0"] > 50, 10)
    finally:
        stop.set()
        thread.join(10)
    assert not [k for k in counts if k.startswith("error")]
    assert not [k for k in theirs if k.startswith("error")]
    both_settle(core, channel, {"c0"})


def test_drops_and_missing_routes_fail_alike_in_c_core(server, backends, core, channel):
    server.set_snapshot(
        snapshot(
            [route(path=f"/{SERVICE}/Sleep", cluster="cdrop")],
            {"cdrop": [[backends["a0"].address]]},
            drops={"cdrop": {"lb": 1_000_000}},
        )
    )
    dropped = {"error:UNAVAILABLE": 5}
    sleep = f"/{SERVICE}/Sleep"
    assert wait_until(lambda: pyxds_calls(channel, 5, method=sleep) == dropped, 10)
    assert wait_until(lambda: core.call(5, method=sleep) == dropped, 10)
    # no route for Who: both fail it, wait_for_ready or not
    assert pyxds_calls(channel, 5) == core.call(5) == {"error:UNAVAILABLE": 5}
