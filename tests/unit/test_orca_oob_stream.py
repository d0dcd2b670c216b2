"""The channel's OOB ORCA stream manager (A51 "The LB Policy API") over a
fake subchannel core and a fake call: one call per subchannel at the
smallest period, restarted when that period changes, stopped off READY and
with the last watcher; retried with backoff after a failure (at once after a
call that delivered a report); never after UNIMPLEMENTED on a connection."""

from __future__ import annotations

import random

import grpc
import pytest
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.channel import orca_oob
from pyxds.lb.api import OK_STATUS, ConnectivityState
from pyxds.testing import FakeClock
from pyxds.xds.backoff import ExponentialBackoff

READY = ConnectivityState.READY


class Serializer:
    def run(self, fn):
        fn()


class FakeCore:
    def __init__(self) -> None:
        self.address = "10.0.0.1:80"
        self._serializer = Serializer()
        self._clock = FakeClock()
        self._backoff = ExponentialBackoff(random.Random(1))
        self.state = READY
        self.transport = type("T", (), {"channel": object()})()
        self._watchers: list = []

    def watch(self, fn):
        self._watchers.append(fn)
        fn(self.state, OK_STATUS)
        return lambda: self._watchers.remove(fn)

    def set_state(self, state) -> None:
        self.state = state
        for fn in list(self._watchers):
            fn(state, OK_STATUS)


class Calls:
    """Stands in for grpcio: records each started call."""

    def __init__(self) -> None:
        self.started: list[dict] = []

    def __call__(self, channel, request, on_report, on_end):
        call = {
            "period": request.report_interval.ToNanoseconds() / 1e9,
            "report": on_report,
            "end": on_end,
            "cancelled": False,
        }
        self.started.append(call)
        return lambda: call.update(cancelled=True)

    @property
    def live(self) -> list[dict]:
        return [c for c in self.started if not c["cancelled"]]


@pytest.fixture
def calls(monkeypatch):
    fake = Calls()
    monkeypatch.setattr(orca_oob, "_run_sync", fake)
    return fake


def test_one_call_at_the_smallest_period_restarted_when_it_changes(calls):
    core = FakeCore()
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
    core = FakeCore()
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    core.set_state(ConnectivityState.IDLE)
    assert calls.live == []
    core.set_state(READY)
    assert len(calls.live) == 1 and len(calls.started) == 2


def test_failed_call_is_retried_after_backoff_and_at_once_after_a_report(calls):
    core = FakeCore()
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


def test_unimplemented_is_not_retried_on_that_connection(calls):
    core = FakeCore()
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
    core = FakeCore()
    stream = orca_oob.OobStream(core)
    stream.add(1.0, lambda r: None)
    stream.close()
    assert calls.live == [] and core._watchers == []
