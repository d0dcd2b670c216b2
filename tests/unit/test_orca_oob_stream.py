"""The channel's OOB ORCA stream manager (A51 "The LB Policy API") over a
fake subchannel core and a fake call: one call per subchannel at the
smallest period, restarted when that period changes, stopped off READY and
with the last watcher; retried with backoff after a failure (at once after a
call that delivered a report); never after UNIMPLEMENTED on a connection.

Each rule holds for both ways a sync subchannel's call is run: on a side
connection on the stream loop (a transport with an ``aio_twin``: no
thread) and on a thread (one without).  The side connection's own rules:
one per subchannel connection, kept across restarts and retries, closed
(after the call's cancel) when the subchannel leaves READY, the last
watcher leaves, the stream is closed or the backend answers UNIMPLEMENTED."""

from __future__ import annotations

import random

import grpc
import pytest
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.channel import orca_oob, subchannel_stream
from pyxds.lb.api import OK_STATUS, ConnectivityState
from pyxds.testing import FakeClock
from pyxds.xds.backoff import ExponentialBackoff

READY = ConnectivityState.READY


class Serializer:
    def run(self, fn):
        fn()


class FakeSide:
    """Stands in for a side connection (a LoopChannel on the stream loop)."""

    def __init__(self, log: list, make) -> None:
        self.log = log
        self.make = make
        self.closed = False

    def close(self, before=None, wait: bool = True) -> None:
        assert not wait  # never blocks the serializer
        self.closed = True
        self.log.append(("close side", self))


class SyncTransport:
    """A sync transport: ``aio_twin`` when ``side`` (else none, as a
    transport that cannot make one)."""

    def __init__(self, side: bool) -> None:
        self.channel = object()
        self.maker = object()
        self._side = side
        #: what ``ready_now()`` says: the grpcio channel's state at this moment
        self.ready = True
        self.suspected = 0

    def aio_twin(self):
        return (lambda: self.maker) if self._side else None

    def ready_now(self) -> bool:
        return self.ready

    def suspect(self) -> None:
        self.suspected += 1


class FakeCore:
    def __init__(self, side: bool = True) -> None:
        self.address = "10.0.0.1:80"
        self._serializer = Serializer()
        self._clock = FakeClock()
        self._backoff = ExponentialBackoff(random.Random(1))
        self.state = READY
        self.status = OK_STATUS
        self.transport = SyncTransport(side)
        self._watchers: list = []

    def watch(self, fn):
        self._watchers.append(fn)
        fn(self.state, OK_STATUS)
        return lambda: self._watchers.remove(fn)

    def set_state(self, state, status=OK_STATUS) -> None:
        self.state, self.status = state, status
        for fn in list(self._watchers):
            fn(state, status)

    def reset_backoff(self) -> None:
        """``SubchannelCore.reset_backoff``: its connection backoff only."""
        self._backoff.reset()


class Calls:
    """Stands in for grpcio: records each started call, the side connections
    opened and the order of cancels and closes (``log``)."""

    def __init__(self, side: bool) -> None:
        self.side = side
        self.started: list[dict] = []
        self.sides: list[FakeSide] = []
        self.log: list = []

    def __call__(self, on, request, on_report, on_end=None):
        if on_end is None:  # _run_on_side's sink (_run_sync: its two methods)
            on_report, on_end = on_report.message, on_report.end
        call = {
            "period": (
                request.message.report_interval.ToNanoseconds() / 1e9
                if hasattr(request.message, "report_interval")
                else None  # another stream's request (the A17 health watch)
            ),
            "request": request.message,
            "method": request.method,
            "report": on_report,
            "cancelled": False,
            "ended": False,
            "on": on,
        }

        def end(code, details) -> None:
            call["ended"] = True
            on_end(code, details)

        call["end"] = end
        self.started.append(call)

        def cancel() -> None:
            call["cancelled"] = True
            self.log.append(("cancel", on))

        return cancel

    def open_side(self, make, on_lost=None) -> FakeSide:
        side = FakeSide(self.log, make)
        side.on_lost = on_lost
        self.sides.append(side)
        return side

    @property
    def live(self) -> list[dict]:
        return [c for c in self.started if not c["cancelled"] and not c["ended"]]

    @property
    def open_sides(self) -> list[FakeSide]:
        return [s for s in self.sides if not s.closed]


@pytest.fixture(params=["side", "thread"])
def calls(request, monkeypatch):
    fake = Calls(request.param == "side")
    monkeypatch.setattr(subchannel_stream, "_run_sync", fake)
    monkeypatch.setattr(subchannel_stream, "_run_on_side", fake)
    monkeypatch.setattr(subchannel_stream, "_open_side", fake.open_side)
    yield fake
    if not fake.side:
        assert fake.sides == []  # no aio_twin: never a side connection


def FakeCore_for(calls: Calls) -> FakeCore:
    return FakeCore(side=calls.side)


def test_one_call_at_the_smallest_period_restarted_when_it_changes(calls):
    core = FakeCore_for(calls)
    stream = orca_oob.OobStream(core)
    got: list = []
    cancel_slow = stream.add(5.0, got.append)
    cancel_fast = stream.add(1.0, got.append)
    assert [c["period"] for c in calls.live] == [1.0]
    calls.live[0]["report"](OrcaLoadReport(cpu_utilization=0.5))
    assert len(got) == 2  # every watcher, same report
    cancel_fast()
    assert [c["period"] for c in calls.live] == [5.0]
    cancel_slow()
    assert calls.live == []


def test_call_stops_off_ready_and_restarts_on_ready(calls):
    core = FakeCore_for(calls)
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    core.set_state(ConnectivityState.IDLE)
    assert calls.live == []
    core.set_state(READY)
    assert len(calls.live) == 1 and len(calls.started) == 2


def test_failed_call_is_retried_after_backoff_and_at_once_after_a_report(calls):
    core = FakeCore_for(calls)
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    first = calls.started[0]
    first["end"](grpc.StatusCode.UNAVAILABLE, "reset")
    assert len(calls.started) == 1
    core._clock.advance(0.7)  # the first backoff is 1 s +-20 %
    assert len(calls.started) == 1
    core._clock.advance(0.6)
    assert len(calls.started) == 2
    second = calls.started[1]
    second["report"](OrcaLoadReport())
    second["end"](grpc.StatusCode.UNAVAILABLE, "reset")
    core._clock.advance(0)
    assert len(calls.started) == 3  # a report reset the backoff: at once


def test_a_new_connection_or_a_new_period_starts_the_backoff_afresh(calls):
    """C-core's OrcaProducer makes a new SubchannelStreamClient (a new
    backoff) when the subchannel becomes READY and when the period changes:
    the first failed call after either waits the first delay (1 s +-20 %)."""
    core = FakeCore_for(calls)
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    for _ in range(3):  # 1 s, 1.6 s, 2.56 s (each +-20 %)
        calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")
        core._clock.advance(3.1)
    core.set_state(ConnectivityState.IDLE)
    core.set_state(READY)
    calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")
    core._clock.advance(1.2 + 1e-6)
    assert len(calls.started) == 6
    calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")  # 1.6 s +-20 % now
    stream.add(0.5, lambda r: None)  # a new period: a new call at once
    assert len(calls.started) == 7
    calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")
    core._clock.advance(1.2 + 1e-6)
    assert len(calls.started) == 8


def test_unimplemented_is_not_retried_on_that_connection(calls):
    core = FakeCore_for(calls)
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    calls.started[0]["end"](grpc.StatusCode.UNIMPLEMENTED, "no service")
    core._clock.advance(300)
    stream.add(0.5, lambda r: None)  # even a new period does not retry it
    assert len(calls.started) == 1
    core.set_state(ConnectivityState.IDLE)  # a new connection may serve it
    core.set_state(READY)
    assert len(calls.started) == 2


def test_close_cancels_the_call_and_forgets_watchers(calls):
    core = FakeCore_for(calls)
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    stream.close()
    assert calls.live == [] and core._watchers == []


def test_a_subscription_leaves_once_and_the_others_keep_their_order(calls):
    """Subscribers are kept without a dict (issue 18): each subscription is
    its own, even for one function twice; leaving twice leaves once; the
    others hear every report in the order they subscribed."""
    core = FakeCore_for(calls)
    stream = orca_oob.OobStream(core)
    heard: list = []
    first = stream.add(1.0, lambda r: heard.append("a"))
    middle = stream.add(2.0, lambda r: heard.append("b"))
    stream.add(3.0, lambda r: heard.append("a again"))
    middle()
    middle()
    calls.live[0]["report"](OrcaLoadReport(cpu_utilization=0.5))
    assert heard == ["a", "a again"]
    first()
    assert [c["period"] for c in calls.live] == [3.0]  # the call follows the one left
    calls.live[0]["report"](OrcaLoadReport(cpu_utilization=0.5))
    assert heard == ["a", "a again", "a again"]


# -- the side connection of a sync subchannel (no thread per stream) ---------


@pytest.fixture
def side_calls(monkeypatch):
    fake = Calls(True)
    monkeypatch.setattr(subchannel_stream, "_run_sync", None)  # never a thread
    monkeypatch.setattr(subchannel_stream, "_run_on_side", fake)
    monkeypatch.setattr(subchannel_stream, "_open_side", fake.open_side)
    return fake


def test_one_side_connection_per_connection_kept_across_restarts_and_retries(side_calls):
    calls = side_calls
    core = FakeCore()
    stream = orca_oob.OobStream(core)
    stream.add(5.0, lambda r: None)
    assert len(calls.sides) == 1 and calls.sides[0].make() is core.transport.maker
    stream.add(1.0, lambda r: None)  # a smaller period restarts the call ...
    calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")
    core._clock.advance(2)  # ... and a failed one is retried, after backoff
    assert len(calls.started) == 3 and len(calls.live) == 1
    assert len(calls.sides) == 1 and calls.open_sides == calls.sides  # on the same one
    assert all(c["on"] is calls.sides[0] for c in calls.started)
    assert stream.side is calls.sides[0]


def test_side_connection_closes_after_the_call_when_the_subchannel_leaves_ready(side_calls):
    calls = side_calls
    core = FakeCore()
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    first = calls.sides[0]
    core.set_state(ConnectivityState.IDLE)
    assert calls.log == [("cancel", first), ("close side", first)]
    assert calls.open_sides == [] and stream.side is first  # close() waits for it
    core.set_state(ConnectivityState.CONNECTING)
    assert len(calls.sides) == 1  # nothing opens until READY
    core.set_state(READY)
    assert len(calls.sides) == 2 and calls.live[0]["on"] is calls.sides[1]
    assert stream.side is calls.sides[1]


def test_side_connection_closes_with_the_last_watcher_and_with_the_stream(side_calls):
    calls = side_calls
    core = FakeCore()
    stream = orca_oob.OobStream(core)
    cancel_a = stream.add(1.0, lambda r: None)
    cancel_b = stream.add(2.0, lambda r: None)
    cancel_a()
    assert calls.open_sides == calls.sides  # one watcher left: kept
    cancel_b()
    assert calls.open_sides == [] and calls.live == []
    assert calls.log[-2:] == [("cancel", calls.sides[0]), ("close side", calls.sides[0])]
    stream.add(1.0, lambda r: None)  # a new watcher: a new side connection
    assert len(calls.open_sides) == 1 and len(calls.sides) == 2
    stream.close()
    assert calls.open_sides == [] and calls.live == []


def test_side_connection_closes_on_unimplemented_and_a_new_connection_opens_another(side_calls):
    calls = side_calls
    core = FakeCore()
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    calls.started[0]["end"](grpc.StatusCode.UNIMPLEMENTED, "no service")
    assert calls.open_sides == []
    core._clock.advance(300)
    stream.add(0.5, lambda r: None)
    assert len(calls.sides) == 1 and len(calls.started) == 1  # not retried
    core.set_state(ConnectivityState.IDLE)
    core.set_state(READY)
    assert len(calls.sides) == 2 and len(calls.live) == 1


def test_a_lost_side_connection_moves_the_call_to_the_subchannels_next_connection(side_calls):
    """A51: a GOAWAY (or a lost connection) cancels the stream.  The side
    connection's channel leaving READY says so even where the subchannel's
    polled state never showed an IDLE (RPCs reconnected it between two
    checks): the call is cancelled, the side closed, and a new call starts
    at once on a new side when the grpcio channel is READY again."""
    calls = side_calls
    core = FakeCore()
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    first = calls.sides[0]
    first.on_lost(first)
    assert calls.log == [("cancel", first), ("close side", first)]
    assert len(calls.sides) == 2 and [c["on"] for c in calls.live] == [calls.sides[1]]
    assert core.transport.suspected == 0
    first.on_lost(first)  # late or repeated: nothing more
    assert len(calls.started) == 2 and len(calls.sides) == 2


def test_a_lost_side_connection_waits_for_the_subchannel_when_not_reconnected(side_calls):
    """The grpcio channel not READY at that moment: the monitor is asked to
    look at once (``suspect``) and the subchannel's own reports decide (IDLE
    stops, READY restarts); should none come (an IDLE it missed again), the
    call is retried after the first backoff delay (1 s +-20 %)."""
    calls = side_calls
    core = FakeCore()
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    core.transport.ready = False
    calls.sides[0].on_lost(calls.sides[0])
    assert core.transport.suspected == 1 and calls.live == [] and calls.open_sides == []
    core.set_state(ConnectivityState.IDLE)
    core._clock.advance(5)
    assert calls.live == []  # IDLE: nothing until READY
    core.set_state(READY)
    assert len(calls.live) == 1 and len(calls.sides) == 2
    calls.sides[1].on_lost(calls.sides[1])  # and no report at all this time
    core._clock.advance(0.8 - 1e-6)
    assert len(calls.started) == 2
    core._clock.advance(0.4 + 1e-6)
    assert len(calls.started) == 3 and calls.live[0]["on"] is calls.sides[2]


def test_an_asyncio_subchannel_runs_its_call_on_its_own_loop_without_a_side(monkeypatch):
    started: list = []

    def run_aio(loop, channel, spawn, request, sink):
        started.append((loop, channel()))
        return lambda: None

    monkeypatch.setattr(subchannel_stream, "_run_aio", run_aio)
    monkeypatch.setattr(subchannel_stream, "_open_side", None)  # never a side connection
    core = FakeCore()
    transport = type(
        "AioTransport",
        (),
        {
            "runs_on_event_loop": True,
            "channel": object(),
            "_loop": FakeLoop(),
            "spawn": FakeLoop().create_task,
        },
    )()
    core.transport = transport
    orca_oob.OobStream(core).add(1.0, lambda r: None)
    assert started == [(transport._loop, transport.channel)]


class FakeLoop:
    def create_task(self, coro):  # pragma: no cover - the fake _run_aio never spawns
        raise AssertionError
