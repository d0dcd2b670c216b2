"""Client-side health checking (gRFC A17 "Client Workflow") on one
subchannel: the health a watcher sees, over a fake subchannel core and fake
``grpc.health.v1.Health/Watch`` calls (the fakes of
tests/unit/test_orca_oob_stream.py; each case runs both ways a sync
subchannel's call is run: on a side connection on the stream loop, and on a
thread).

Every transition reaches the watcher once and in order: CONNECTING until
the first answer, READY for SERVING, TRANSIENT_FAILURE "<address>: backend
unhealthy" otherwise (C-core's words, ``health_check_client.cc``); the
call's failure backs off in TRANSIENT_FAILURE, or restarts at once after an
answer; UNIMPLEMENTED is READY with an ERROR logged and no retry on that
connection; the call stops when the subchannel leaves READY or the last
watcher leaves.  Backoff: gRPC's connection backoff (1 s +-20 %, x1.6), afresh
on each connection (C-core: a new SubchannelStreamClient)."""

from __future__ import annotations

import logging

import grpc
import pytest
from test_orca_oob_stream import Calls, FakeCore
from test_orca_oob_stream import calls as calls  # the fixture, both ways
from test_orca_oob_stream import side_calls as side_calls  # the fixture, on a side

from pyxds.channel import health_check
from pyxds.channel.health_check import HealthChecks, parse_status, service_name
from pyxds.lb.api import OK_STATUS, ConnectivityState, Status

READY = ConnectivityState.READY
IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
TF = ConnectivityState.TRANSIENT_FAILURE
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3
#: the fake core's address as C-core's statuses name it
LABEL = "ipv4:10.0.0.1:80"
UNHEALTHY = (TF, Status(grpc.StatusCode.UNAVAILABLE, f"{LABEL}: backend unhealthy"))
BACKING_OFF = (
    TF,
    Status(
        grpc.StatusCode.UNAVAILABLE, f"{LABEL}: health check call failed; will retry after backoff"
    ),
)


class Seen:
    """A health watcher: every report, in order."""

    def __init__(self) -> None:
        self.reports: list[tuple[ConnectivityState, Status]] = []

    def __call__(self, state: ConnectivityState, status: Status) -> None:
        self.reports.append((state, status))

    @property
    def states(self) -> list[ConnectivityState]:
        return [state for state, _ in self.reports]


def watched(calls: Calls, name: str = "") -> tuple[FakeCore, HealthChecks, Seen]:
    core = FakeCore(side=calls.side)
    checks = HealthChecks(name)
    seen = Seen()
    checks.watch(core, seen)
    return core, checks, seen


def test_connecting_until_the_first_answer_then_each_answer_once_in_order(calls):
    """A17: CONNECTING until the first response; SERVING -> READY, any other
    status -> TRANSIENT_FAILURE; TRANSIENT_FAILURE -> READY with no stop at
    CONNECTING.  One Watch call, asking for the configured service."""
    _core, _checks, seen = watched(calls, "grpc.test.Echo")
    assert seen.reports == [(CONNECTING, OK_STATUS)]
    (call,) = calls.started
    assert call["method"] == "/grpc.health.v1.Health/Watch"
    assert call["request"].SerializeToString() == b"\x0a\x0egrpc.test.Echo"
    for status in (SERVING, NOT_SERVING, NOT_SERVING, SERVICE_UNKNOWN, SERVING):
        call["report"](status)
    assert seen.reports == [
        (CONNECTING, OK_STATUS),
        (READY, OK_STATUS),
        UNHEALTHY,
        (READY, OK_STATUS),
    ]
    assert len(calls.started) == 1


def test_the_empty_service_name_asks_for_the_servers_overall_health(calls):
    """A17: "" is the server's overall health: HealthCheckRequest{service: ""}
    serializes to no bytes at all (proto3 default), as C-core sends it."""
    watched(calls, "")
    assert calls.started[0]["request"].SerializeToString() == b""


def test_a_subchannel_not_ready_reports_its_own_state_and_runs_no_call(calls):
    core = FakeCore(side=calls.side)
    core.state = IDLE
    seen = Seen()
    HealthChecks("").watch(core, seen)
    assert seen.reports == [(IDLE, OK_STATUS)] and calls.started == []
    core.set_state(CONNECTING)
    core.set_state(READY)
    assert seen.states == [IDLE, CONNECTING]  # CONNECTING -> READY: still CONNECTING
    assert len(calls.live) == 1
    calls.live[0]["report"](SERVING)
    failure = Status(grpc.StatusCode.UNAVAILABLE, "connection lost")
    core.set_state(TF, failure)
    assert seen.reports[-2:] == [(READY, OK_STATUS), (TF, failure)]
    assert calls.live == [] and calls.open_sides == []  # cancelled, side closed


def test_unimplemented_is_ready_logged_and_not_retried_on_that_connection(calls, caplog):
    """A17: Watch failing UNIMPLEMENTED disables health checking for the
    subchannel: READY, an ERROR logged (C-core's words), no retry; a new
    connection checks again."""
    core, _checks, seen = watched(calls)
    with caplog.at_level(logging.ERROR, logger=health_check.__name__):
        calls.live[0]["end"](grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
    assert seen.reports == [(CONNECTING, OK_STATUS), (READY, OK_STATUS)]
    assert "health checking Watch method returned UNIMPLEMENTED" in caplog.text
    core._clock.advance(300)
    assert len(calls.started) == 1 and calls.open_sides == []
    core.set_state(IDLE)
    core.set_state(READY)
    assert len(calls.live) == 1
    assert seen.states[-2:] == [IDLE, CONNECTING]


def test_a_failed_call_without_an_answer_backs_off_in_transient_failure(calls):
    """A17: any other failure -> TRANSIENT_FAILURE and a retry after the
    exponential backoff; CONNECTING when the next call starts."""
    core, _checks, seen = watched(calls)
    calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")
    assert seen.reports[-1] == BACKING_OFF
    core._clock.advance(0.8 - 1e-6)
    assert len(calls.started) == 1
    core._clock.advance(0.4 + 1e-6)
    assert len(calls.started) == 2
    assert seen.reports[-1] == (CONNECTING, OK_STATUS)
    calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")
    core._clock.advance(1.28 - 1e-6)  # the second backoff: 1.6 s +-20 %
    assert len(calls.started) == 2
    core._clock.advance(0.64 + 1e-6)
    assert len(calls.started) == 3


def test_each_connection_starts_the_backoff_afresh_and_reset_backoff_leaves_it(calls):
    """C-core makes a new SubchannelStreamClient (a new backoff) each time
    the subchannel becomes READY (``HealthProducer::HealthChecker``), so a
    new connection's first failed call waits the first delay (1 s +-20 %),
    not the next one of the last connection's sequence.  The subchannel's
    ``reset_backoff()`` resets its connection backoff only
    (``Subchannel::ResetBackoff``): a health call backing off waits on."""
    core, _checks, seen = watched(calls)
    for _ in range(3):  # 1 s, 1.6 s, 2.56 s (each +-20 %)
        calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")
        core._clock.advance(3.1)
    calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")  # the fourth: ~4.1 s
    core.reset_backoff()
    core._clock.advance(3.2)
    assert len(calls.started) == 4 and seen.reports[-1] == BACKING_OFF
    core.set_state(IDLE)
    core.set_state(READY)
    assert len(calls.started) == 5
    calls.live[0]["end"](grpc.StatusCode.UNAVAILABLE, "reset")
    core._clock.advance(1.2 + 1e-6)
    assert len(calls.started) == 6


def test_a_goaway_seen_on_the_side_connection_checks_the_next_connection(side_calls):
    """A GOAWAY the subchannel's polled state missed (its side connection's
    channel left READY; RPCs already reconnected it): as C-core on a new
    connection, CONNECTING until the new call's first answer, then its
    answer."""
    calls = side_calls
    _core, _checks, seen = watched(calls)
    calls.live[0]["report"](SERVING)
    calls.sides[0].on_lost(calls.sides[0])
    assert len(calls.started) == 2 and calls.live[0]["on"] is calls.sides[1]
    assert seen.states == [CONNECTING, READY, CONNECTING]
    calls.live[0]["report"](NOT_SERVING)
    assert seen.reports[-1] == UNHEALTHY


def test_a_failed_call_that_had_answered_restarts_at_once(calls):
    """A17: a response resets the backoff, "so the next attempt will occur
    immediately": no TRANSIENT_FAILURE in between, CONNECTING again."""
    core, _checks, seen = watched(calls)
    calls.live[0]["report"](SERVING)
    calls.live[0]["end"](grpc.StatusCode.INTERNAL, "stream reset")
    core._clock.advance(0)
    assert len(calls.started) == 2 and len(calls.live) == 1
    assert seen.states == [CONNECTING, READY, CONNECTING]


def test_watchers_share_one_call_which_stops_with_the_last(calls):
    """One stream per subchannel whatever the number of watchers (C-core's
    HealthProducer); a later watcher is told the current health at once;
    the call is cancelled when the last leaves, and unwatching twice is a
    no-op."""
    core, checks, first = watched(calls)
    calls.live[0]["report"](NOT_SERVING)
    second = Seen()
    unwatch_second = checks.watch(core, second)
    assert second.reports == [UNHEALTHY] and len(calls.started) == 1
    stream = checks.stream_of(core)
    assert stream is not None
    stream._remove(first)
    assert len(calls.live) == 1
    unwatch_second()
    unwatch_second()
    assert calls.live == [] and checks.stream_of(core) is None
    assert calls.open_sides == []


def test_reports_of_a_cancelled_call_are_dropped(calls):
    """Shutdown races: an answer or an end that arrives after the watcher
    left, or from the call of a connection that is gone, changes nothing."""
    core, checks, seen = watched(calls)
    old = calls.live[0]
    core.set_state(IDLE)
    old["report"](SERVING)
    old["end"](grpc.StatusCode.CANCELLED, "")
    core._clock.advance(10)
    assert seen.states == [CONNECTING, IDLE]
    core.set_state(READY)
    new = calls.live[0]
    stream = checks.stream_of(core)
    assert stream is not None
    stream.close()
    new["report"](SERVING)
    new["end"](grpc.StatusCode.UNAVAILABLE, "")
    core._clock.advance(10)
    assert seen.states == [CONNECTING, IDLE, CONNECTING]
    assert len(calls.started) == 2


def test_a_reply_that_does_not_parse_is_an_error_of_the_call():
    """HealthCheckResponse's ``status`` (field 1); other fields skipped;
    bytes that are not a protobuf message fail (the call then ends and is
    retried, as C-core cancels it)."""
    assert parse_status(b"\x08\x01") == SERVING
    assert parse_status(b"\x08\x02") == NOT_SERVING
    assert parse_status(b"") == 0  # UNKNOWN: unhealthy
    assert parse_status(b"\x12\x03abc\x08\x01\x1d\x00\x00\x00\x00") == SERVING
    for raw in (b"\x08", b"\x12\x09ab", b"\x0f", b"\x00\x01"):
        with pytest.raises(ValueError, match="cannot parse health check response"):
            parse_status(raw)


@pytest.mark.parametrize(
    ("config", "options", "name"),
    [
        ({"healthCheckConfig": {"serviceName": "x"}}, [], "x"),
        ({"healthCheckConfig": {"serviceName": ""}}, [], ""),
        ({"healthCheckConfig": {}}, [], None),  # A17: unset serviceName: disabled
        ({"healthCheckConfig": None}, [], None),
        ({}, [], None),
        (None, [], None),  # an xds: target: the xds resolver's config
        ({"healthCheckConfig": {"serviceName": "x"}}, [("grpc.inhibit_health_checking", 1)], None),
        ({"healthCheckConfig": {"serviceName": "x"}}, [("grpc.inhibit_health_checking", 0)], "x"),
    ],
)
def test_which_channels_check_and_for_which_service(config, options, name):
    """A17 "Service Config Changes" and the channel option that inhibits it."""
    assert service_name(config, options) == name
