"""Differential, gRFC A75 with A50 and A55: outlier detection sits above
xds_override_host (C-core's cds.cc: outlier_detection -> xds_cluster_impl ->
xds_override_host -> priority), so the RPCs of a stateful session are
counted like any other, and an ejected endpoint keeps its sessions (A75's
override-host picker reads the subchannel's connectivity state; C-core's
outlier detection ejects through the health watch, A61).

Cluster c1: backends b0 and b1, failure-percentage outlier detection
(threshold 50 %, 10 calls, 2 hosts).  A session pinned to b0 by its cookie
sends RPCs that fail; RPCs without a cookie go round robin and succeed.
b0's failures are its session's: counted, they eject b0, and RPCs without a
cookie then reach b1 only, while the session still reaches b0.  pyxds's
channel and grpcio's C-core ``xds:///`` channel against the same
pyxds.server must do alike.  (Before A75's tree pyxds did not count the
session's RPCs: b0 was never ejected.)
"""

from __future__ import annotations

import time

import pytest
from channel_fixtures import LISTENER, TARGET, CoreXdsClient, pyxds_calls, running_backends
from test_differential_outlier_detection import od_snapshot
from test_stateful_session import COOKIE, FAIL, PATH, WHO, cookie_for

import pyxds._api as pyxds
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

ROUND = 20  # RPCs of each kind per round
DEADLINE = 10.0  # seconds for b0's ejection to show


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("b0", "b1")


def session_snapshot(backends) -> Snapshot:
    """c1 with outlier detection behind a listener with the stateful
    session filter (A55)."""
    addresses = [backends["b0"].address, backends["b1"].address]
    shot = od_snapshot((), cluster_name="c1", priorities=[addresses], threshold=50)
    _listener_t, route_t, cluster_t, eds_t = list(shot._by_type)
    session_filter = b.stateful_session_filter(cookie_name=COOKIE, path=PATH, ttl=120)
    return Snapshot(
        listeners=[b.listener(LISTENER, http_filters=[session_filter])],
        routes=list(shot.resources(route_t).values()),
        clusters=list(shot.resources(cluster_t).values()),
        endpoints=list(shot.resources(eds_t).values()),
    )


def session_run(calls, session) -> dict:
    """Rounds of failing session RPCs and plain ones until the plain ones
    stop reaching b0 (or the deadline); then where each kind goes."""
    start = time.monotonic()
    rounds = 0
    while time.monotonic() - start < DEADLINE:
        rounds += 1
        calls(ROUND, FAIL, session, "INTERNAL")
        if "b0" not in calls(ROUND, WHO, None, ""):
            break
    return {
        "rounds": rounds,
        "plain": dict(calls(40, WHO, None, "")),
        "session": dict(calls(10, WHO, session, "")),
    }


def test_a_session_s_failures_eject_its_endpoint_which_keeps_the_session_as_c_core(
    xds_server, backends
):
    node = "differential-outlier-detection-session"
    xds_server.set_snapshot(session_snapshot(backends), node_id=node)
    bootstrap = xds_server.bootstrap(node_id=node)
    session = cookie_for(backends["b0"].address)
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    try:
        ours = session_run(
            lambda n, method, md, request: pyxds_calls(channel, n, method, md, request=request),
            session,
        )
    finally:
        channel.close()
    core = CoreXdsClient(bootstrap)
    try:
        theirs = session_run(
            lambda n, method, md, request: core.call(n, method, md, request=request), session
        )
    finally:
        core.close()
    print(f"\nA75 session counted: pyxds {ours}\n                     C-core {theirs}")
    assert theirs["plain"] == {"b1": 40}  # b0 ejected
    assert theirs["session"] == {"b0": 10}  # its session stays
    assert ours["plain"] == theirs["plain"]
    assert ours["session"] == theirs["session"]
