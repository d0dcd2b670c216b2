"""Conformance: the channel's out-of-band ORCA stream (gRFC A51 "Out-of-Band
Metrics Reporting", the behaviour an LB policy sees) against the scenarios
of grpc-go ``orca/producer_test.go`` (``TestProducerBackoff``,
``TestProducerMultipleListeners``) and grpc-java
``xds/src/test/java/io/grpc/xds/orca/OrcaOobUtilTest.java``, beyond
tests/unit/test_orca_oob_stream.py (whose fake core and fake calls calls
this reuses; each case runs both ways a sync subchannel's call is run).

Backoff figures are the gRPC connection backoff pyxds uses for the stream:
1 s, 1.6 s, 2.56 s ... each +-20 % (``pyxds.xds.backoff``).
"""

from __future__ import annotations

import grpc
from test_orca_oob_stream import Calls, FakeCore
from test_orca_oob_stream import calls as calls  # the fixture, both ways
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.channel import orca_oob
from pyxds.lb.api import ConnectivityState

READY = ConnectivityState.READY
IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
REPORT = OrcaLoadReport(cpu_utilization=10, mem_utilization=0.1, utilization={"bob": 0.555})


def started_within(core: FakeCore, calls: Calls, low: float, high: float) -> None:
    """The next call starts after more than ``low`` and at most ``high`` seconds."""
    before = len(calls.started)
    core._clock.advance(low)
    assert len(calls.started) == before, f"retried before {low} s"
    core._clock.advance(high - low)
    assert len(calls.started) == before + 1, f"not retried by {high} s"


def test_backoff_grows_with_each_failure_and_a_report_resets_it(calls):
    """grpc-go TestProducerBackoff; grpc-java orcaReportingStreamClosedAndRetried:
    after a report the next call starts at once; failures without a report
    back off 1 s, 1.6 s, 2.56 s; a report starts the sequence over."""
    core = FakeCore(side=calls.side)
    stream = orca_oob.OobStream(core)
    got: list = []
    stream.add(123.0, got.append)
    assert [c["period"] for c in calls.started] == [123.0]
    calls.live[0]["report"](REPORT)
    assert got == [REPORT]
    calls.live[0]["end"](grpc.StatusCode.INTERNAL, "injected error")
    core._clock.advance(0)
    assert len(calls.started) == 2  # at once: the call had a report
    for low, high in ((0.8, 1.2), (1.28, 1.92), (2.048, 3.072)):
        calls.live[0]["end"](grpc.StatusCode.INTERNAL, "injected error")
        started_within(core, calls, low - 1e-6, high)
    assert all(c["period"] == 123.0 for c in calls.started)
    calls.live[0]["report"](REPORT)
    calls.live[0]["end"](grpc.StatusCode.INTERNAL, "injected error")
    core._clock.advance(0)
    assert len(calls.started) == 6  # at once again
    calls.live[0]["end"](grpc.StatusCode.INTERNAL, "injected error")
    started_within(core, calls, 0.8 - 1e-6, 1.2)  # the sequence started over
    assert got == [REPORT, REPORT]


def test_a_call_the_backend_ends_ok_without_a_report_is_retried_after_backoff(calls):
    """grpc-java orcaReportingStreamClosedAndRetried (onCompleted with no
    response backs off; after a response it restarts at once)."""
    core = FakeCore(side=calls.side)
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    calls.live[0]["end"](grpc.StatusCode.OK, "")
    core._clock.advance(0)
    assert len(calls.started) == 1
    started_within(core, calls, 0.8 - 1e-6, 1.2)
    calls.live[0]["report"](OrcaLoadReport())
    calls.live[0]["end"](grpc.StatusCode.OK, "")
    core._clock.advance(0)
    assert len(calls.started) == 3


def test_no_call_until_a_watcher_and_a_ready_connection(calls):
    """grpc-java reportingNotStartedUntilConfigured and
    updateReportingIntervalBeforeSubchannelReady."""
    core = FakeCore(side=calls.side)
    stream = orca_oob.OobStream(core)
    assert calls.started == []  # READY, nobody asked
    stream.add(2.0, lambda r: None)
    assert [c["period"] for c in calls.live] == [2.0]
    core.set_state(IDLE)
    core.set_state(CONNECTING)
    stream.add(1.0, lambda r: None)
    assert calls.live == []  # not READY: nothing starts
    core.set_state(READY)
    assert [c["period"] for c in calls.live] == [1.0]


def test_watchers_join_and_leave_and_the_call_runs_at_the_smallest_interval(calls):
    """grpc-go TestProducerMultipleListeners; grpc-java
    reportWithMostFrequentIntervalRequested: a slower watcher joins without
    a restart; a faster one restarts the call; every report reaches every
    watcher then present and no other; the fastest leaving restarts the call
    at the next smallest interval, a slower one leaving changes nothing."""
    core = FakeCore(side=calls.side)
    stream = orca_oob.OobStream(core)
    got: dict[int, list] = {1: [], 2: [], 3: []}
    stream.add(123.0, got[1].append)
    first = calls.live[0]
    first["report"](REPORT)
    leave2 = stream.add(234.0, got[2].append)
    assert calls.live == [first]  # no restart
    first["report"](REPORT)
    leave3 = stream.add(56.0, got[3].append)
    assert first["cancelled"] and [c["period"] for c in calls.live] == [56.0]
    second = calls.live[0]
    second["report"](REPORT)
    second["report"](REPORT)
    assert [len(got[i]) for i in (1, 2, 3)] == [4, 3, 2]
    assert got[1][-1] is got[2][-1] is got[3][-1]  # one report object for all
    leave2()
    assert calls.live == [second]  # 56 s is still the smallest
    second["report"](REPORT)
    assert [len(got[i]) for i in (1, 2, 3)] == [5, 3, 3]
    leave3()
    assert second["cancelled"] and [c["period"] for c in calls.live] == [123.0]
    calls.live[0]["report"](REPORT)
    calls.live[0]["report"](REPORT)
    assert [len(got[i]) for i in (1, 2, 3)] == [7, 3, 3]


def test_a_watcher_with_the_interval_already_asked_for_keeps_the_call(calls):
    """grpc-java updateReportingIntervalWhenRpcActive ("Configuring with the
    same report interval again does not restart ORCA RPC")."""
    core = FakeCore(side=calls.side)
    stream = orca_oob.OobStream(core)
    stream.add(5.0, lambda r: None)
    call = calls.live[0]
    stream.add(5.0, lambda r: None)
    assert calls.live == [call] and len(calls.started) == 1


def test_a_new_interval_while_backing_off_starts_the_call_at_once(calls):
    """grpc-java updateReportingIntervalWhenRpcPendingRetry (C-core's producer
    also restarts its stream client when the interval changes)."""
    core = FakeCore(side=calls.side)
    stream = orca_oob.OobStream(core)
    leave = stream.add(1.0, lambda r: None)
    calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "closed")
    assert calls.live == [] and len(core._clock.pending) == 1  # backing off
    stream.add(10.0, lambda r: None)
    leave()  # the interval becomes 10 s
    assert [c["period"] for c in calls.live] == [10.0]
    core._clock.advance(5.0)  # the cancelled retry does not start a second call
    assert len(calls.live) == 1 and len(calls.started) == 2


def test_the_last_watcher_leaving_cancels_the_call_and_leaves_no_timer(calls):
    """grpc-java removeListener (the call is cancelled, nothing pending)."""
    core = FakeCore(side=calls.side)
    stream = orca_oob.OobStream(core)
    got: list = []
    leave = stream.add(1.0, got.append)
    call = calls.live[0]
    leave()
    assert call["cancelled"] and calls.live == []
    assert core._clock.pending == []
    call["report"](REPORT)  # a report racing the cancel reaches nobody
    assert got == []


def test_unimplemented_stops_until_the_subchannel_reconnects_and_then_reports_flow(calls):
    """grpc-java orcReportingDisabledWhenServiceNotImplemented: no backoff, no
    retry; a new connection starts reporting again."""
    core = FakeCore(side=calls.side)
    stream = orca_oob.OobStream(core)
    got: list = []
    told: list = []
    stream.add(1.0, got.append, told.append)
    calls.live[0]["end"](grpc.StatusCode.UNIMPLEMENTED, "unknown service")
    assert told == ["unknown service"]
    assert core._clock.pending == []
    core._clock.advance(60)
    assert len(calls.started) == 1
    core.set_state(IDLE)
    core.set_state(READY)
    assert len(calls.live) == 1
    calls.live[0]["report"](OrcaLoadReport())
    assert got == [OrcaLoadReport()]
