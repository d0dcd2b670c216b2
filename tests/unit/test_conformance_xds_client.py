"""XdsClient protocol conformance: ACK/NACK versions and nonces, watcher
notifications (A88), resource timers (A57), deletions (A53/A88).

Scenarios from C-core test/core/xds/xds_client_test.cc, grpc-go xdsclient tests
(watchers, resource timers, ACK/NACK, does-not-exist, ignore_resource_deletion)
and grpc-java XdsClientImplTestBase.  Sans-IO over AdsState with a FakeClock.
"""

from __future__ import annotations

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from test_xds_client_ads_state import (
    CDS,
    EDS,
    INVALID,
    LDS,
    RDS,
    RecordingWatcher,
    _encode,
    connected_stream,
    make_state,
    res,
    response,
)

from pyxds.lb.api import OK_STATUS, Status
from pyxds.xds.ads_state import (
    DATA_ERROR_HANDLING_ENV,
    RESOURCE_TIMEOUT,
    RESOURCE_WRAPPER_TYPE_URL,
    AdsState,
    CacheState,
    data_error_handling_enabled,
)


def entry(state: AdsState, name: str):
    return next(e for e in state.snapshot() if e.name == name)


# ---------------------------------------------------------------- ACK / NACK


def test_new_subscription_after_ack_carries_acked_version_and_last_nonce():
    """grpc-java XdsClientImplTestBase (subscribe a second resource after an ACK);
    C-core XdsClientTest.SubscribeToMultipleResources."""
    state, _ = make_state()
    state.add_watcher(CDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(CDS, "v1", "n1", ("a", "x")))
    state.take_requests()
    state.add_watcher(CDS, "b", RecordingWatcher())
    (req,) = state.take_requests()
    assert (req.version_info, req.response_nonce) == ("v1", "n1")
    assert list(req.resource_names) == ["a", "b"]


def test_nack_of_whole_response_keeps_previous_version_for_later_requests():
    """grpc-go TestADS_NACK_InvalidFirstResponse / A27: version_info is the last
    accepted version; the nonce is the latest."""
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "ok")))
    state.take_requests()
    state.on_response(response(LDS, "2", "n2", ("a", INVALID)))
    (nack,) = state.take_requests()
    assert (nack.version_info, nack.response_nonce) == ("1", "n2")
    assert nack.error_detail.message.startswith("xDS response validation errors: [")
    state.add_watcher(LDS, "b", RecordingWatcher())
    (req,) = state.take_requests()
    assert (req.version_info, req.response_nonce) == ("1", "n2")


def test_invalid_resource_nobody_subscribed_is_still_nacked():
    """C-core ParseResource: the decode error goes in the NACK before the
    subscription is looked up."""
    state, _ = make_state()
    state.add_watcher(CDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("a", "ok"), ("other", INVALID)))
    (nack,) = state.take_requests()
    assert nack.version_info == ""
    assert "resource index 1: other:" in nack.error_detail.message
    assert entry(state, "a").state is CacheState.ACKED


def test_resource_error_without_name_is_nacked():
    """C-core HandleServerReportedResourceError: "resource_name unset"."""
    state, _ = make_state(a88=True)
    state.add_watcher(CDS, "a", RecordingWatcher())
    connected_stream(state)
    msg = response(CDS, "1", "n1", ("a", "ok"))
    msg.resource_errors.add().error_detail.code = grpc.StatusCode.NOT_FOUND.value[0]
    state.on_response(msg)
    (nack,) = state.take_requests()
    assert "resource_errors index 0: resource_name unset" in nack.error_detail.message


def test_resource_error_with_ok_status_is_nacked_and_ignored():
    """C-core: "error_detail must be non-OK"; the entry is untouched."""
    state, _ = make_state(a88=True)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "a", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("a", "ok")))
    state.take_requests()
    watcher.take()
    msg = response(CDS, "2", "n2", ("a", "ok"))
    err = msg.resource_errors.add()
    err.resource_name.name = "a"
    state.on_response(msg)
    (nack,) = state.take_requests()
    assert "resource_errors index 0: a: error_detail must be non-OK" in nack.error_detail.message
    assert watcher.take() == []
    assert entry(state, "a").state is CacheState.ACKED


def test_resource_error_for_unsubscribed_name_is_ignored():
    state, _ = make_state(a88=True)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "a", watcher)
    connected_stream(state)
    msg = response(CDS, "1", "n1", ("a", "ok"))
    err = msg.resource_errors.add()
    err.resource_name.name = "zzz"
    err.error_detail.code = grpc.StatusCode.NOT_FOUND.value[0]
    state.on_response(msg)
    (ack,) = state.take_requests()
    assert not ack.HasField("error_detail") and ack.version_info == "1"
    assert watcher.take() == [("changed", res(CDS, "a", "ok"))]


def test_resource_wrapper_name_names_the_resource():
    """C-core: the Resource wrapper's name wins over the decoded one."""
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(EDS, "wrapped", watcher)
    connected_stream(state)
    inner = discovery_pb2.Resource(name="wrapped")
    inner.resource.type_url = EDS
    inner.resource.value = _encode(EDS, "inner", "v")
    msg = discovery_pb2.DiscoveryResponse(type_url=EDS, version_info="1", nonce="n1")
    msg.resources.add(type_url=RESOURCE_WRAPPER_TYPE_URL, value=inner.SerializeToString())
    state.on_response(msg)
    assert watcher.take() == [("changed", res(EDS, "inner", "v"))]


# ---------------------------------------------------------------- watchers (A88)


def test_second_watcher_after_nack_of_uncached_resource_gets_the_error():
    """C-core XdsClientTest.ResourceValidationFailure: a later watcher sees the
    same error at once."""
    state, _ = make_state()
    first = RecordingWatcher()
    state.add_watcher(LDS, "a", first)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", INVALID)))
    ((kind, status),) = first.take()
    second = RecordingWatcher()
    state.add_watcher(LDS, "a", second)
    assert second.take() == [(kind, status)]
    assert kind == "changed" and isinstance(status, Status)


def test_second_watcher_after_nack_of_cached_resource_gets_resource_then_ambient():
    """A88 "New Watchers Started After Ambient Errors"; C-core
    ResourceValidationFailureForCachedResource."""
    state, _ = make_state()
    first = RecordingWatcher()
    state.add_watcher(RDS, "r", first)
    connected_stream(state)
    state.on_response(response(RDS, "1", "n1", ("r", "good")))
    state.on_response(response(RDS, "2", "n2", ("r", INVALID)))
    assert [k for k, _ in first.take()] == ["changed", "ambient"]
    second = RecordingWatcher()
    state.add_watcher(RDS, "r", second)
    calls = second.take()
    assert calls[0] == ("changed", res(RDS, "r", "good"))
    assert calls[1][0] == "ambient" and "invalid resource" in calls[1][1].details


def test_valid_update_after_nack_is_delivered_and_clears_the_error():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v1")))
    state.on_response(response(CDS, "2", "n2", ("c", INVALID)))
    watcher.take()
    state.on_response(response(CDS, "3", "n3", ("c", "v3")))
    assert watcher.take() == [("changed", res(CDS, "c", "v3"))]
    e = entry(state, "c")
    assert e.state is CacheState.ACKED and e.error_state is None and e.version_info == "3"


def test_deleted_resource_that_comes_back_is_delivered_again():
    """grpc-go TestLDSWatch_ResourceRemoved (re-added afterwards)."""
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    state.on_response(response(LDS, "2", "n2"))
    assert [k for k, _ in watcher.take()] == ["changed", "changed"]
    state.on_response(response(LDS, "3", "n3", ("a", "v")))
    assert watcher.take() == [("changed", res(LDS, "a", "v"))]


def test_lds_deletion_drops_resource_by_default_as_grpcio_does(monkeypatch):
    """C-core 1.85 without GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING:
    drop_cached_resource = !ignore_resource_deletion."""
    monkeypatch.delenv(DATA_ERROR_HANDLING_ENV, raising=False)
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    watcher.take()
    state.on_response(response(LDS, "2", "n2"))
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("value,expected", [("true", True), ("1", True), ("false", False)])
def test_a88_deletion_default_follows_c_core_env_switch(monkeypatch, value, expected):
    monkeypatch.setenv(DATA_ERROR_HANDLING_ENV, value)
    assert data_error_handling_enabled() is expected


def test_a88_mode_lds_deletion_is_ambient_and_keeps_resource(monkeypatch):
    """A88 table: LDS/CDS deletion, cached, no fail_on_data_errors:
    OnAmbientError(NOT_FOUND), keep; CSDS shows DOES_NOT_EXIST with the resource."""
    monkeypatch.setenv(DATA_ERROR_HANDLING_ENV, "true")
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v")))
    watcher.take()
    state.on_response(response(CDS, "2", "n2"))
    ((kind, status),) = watcher.take()
    assert kind == "ambient" and status.code == grpc.StatusCode.NOT_FOUND
    e = entry(state, "c")
    assert e.state is CacheState.DOES_NOT_EXIST and e.raw is not None


def test_a88_mode_fail_on_data_errors_deletion_drops(monkeypatch):
    monkeypatch.setenv(DATA_ERROR_HANDLING_ENV, "true")
    state, _ = make_state(fail_on_data_errors=True)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v")))
    watcher.take()
    state.on_response(response(CDS, "2", "n2"))
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND


def test_deletion_of_resource_never_received_is_left_to_the_timer():
    """C-core: a subscribed resource not yet received is not deleted by its
    absence (the response may predate the subscription)."""
    state, clock = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    late = RecordingWatcher()
    connected_stream(state)
    state.add_watcher(LDS, "b", late)
    state.take_requests()
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    assert late.take() == []
    clock.advance(RESOURCE_TIMEOUT)
    ((kind, status),) = late.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND


def test_connectivity_error_then_resource_arrives_delivers_resource():
    """A57: a stream failing before any response tells watchers without a
    resource; the resource then arriving on the next stream is delivered."""
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(EDS, "e", watcher)
    connected_stream(state)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.UNAVAILABLE
    assert "connection refused" in status.details
    connected_stream(state)
    state.on_response(response(EDS, "1", "n1", ("e", "v")))
    assert watcher.take() == [("changed", res(EDS, "e", "v"))]


def test_connectivity_error_for_cached_resource_is_ambient_and_cleared_by_same_resource():
    """A88 table row 4; C-core NotifyWatchersOnAmbientError(OK) on an
    identical resource after the channel recovered."""
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v")))
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "bye"), had_response=False)
    watcher.take()
    # a new stream whose first attempt fails before any response
    connected_stream(state)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "refused"))
    ((kind, _status),) = watcher.take()
    assert kind == "ambient"
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v")))
    assert watcher.take() == [("ambient", OK_STATUS)]


# ---------------------------------------------------------------- timers (A57)


def test_timer_restarts_in_full_on_new_stream_when_first_stream_failed_before_response():
    """A57: "the client should start the timeout period again when it sends
    the initial subscription for the resource on the reestablished stream"."""
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT - 1)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "x"))
    watcher.take()
    state.on_stream_started()
    state.take_requests()
    clock.advance(RESOURCE_TIMEOUT)  # not connected: no timer runs
    assert watcher.take() == []
    state.on_stream_connected()
    clock.advance(RESOURCE_TIMEOUT - 0.5)
    assert watcher.take() == []
    clock.advance(0.5)
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND
    assert entry(state, "a").state is CacheState.DOES_NOT_EXIST


def test_timer_of_resource_subscribed_later_starts_when_its_request_is_sent():
    state, clock = make_state()
    state.add_watcher(CDS, "a", RecordingWatcher())
    connected_stream(state)
    clock.advance(10)
    later = RecordingWatcher()
    state.add_watcher(CDS, "b", later)
    assert not state.timer_pending(CDS, "b")
    state.take_requests()
    assert state.timer_pending(CDS, "b")
    clock.advance(RESOURCE_TIMEOUT - 1)
    assert later.take() == []
    clock.advance(1)
    assert [k for k, _ in later.take()] == ["changed"]


def test_unsubscribe_cancels_timer_and_resubscribe_starts_a_new_one():
    state, clock = make_state()
    handle = state.add_watcher(EDS, "e", RecordingWatcher())
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT - 1)
    state.remove_watcher(handle)
    state.take_requests()
    assert not state.timer_pending(EDS, "e")
    watcher = RecordingWatcher()
    state.add_watcher(EDS, "e", watcher)
    state.take_requests()
    clock.advance(RESOURCE_TIMEOUT - 1)
    assert watcher.take() == []
    clock.advance(1)
    assert [k for k, _ in watcher.take()] == ["changed"]


def test_does_not_exist_then_resource_arrives_then_absence_deletes():
    """grpc-go does-not-exist tests: a resource reported missing by the timer
    that then arrives is delivered and cached normally."""
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT)
    watcher.take()
    state.on_response(response(CDS, "1", "n1", ("c", "v")))
    assert watcher.take() == [("changed", res(CDS, "c", "v"))]
    assert entry(state, "c").state is CacheState.ACKED


def test_nacked_uncached_resource_gets_a_timer_again_on_the_next_stream():
    """A57: on a restarted stream the timeout applies again to every resource
    not already cached (C-core ResourceTimer: not cached, not DOES_NOT_EXIST)."""
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", INVALID)))
    state.take_requests()  # the NACK: no new timer on this stream
    assert not state.timer_pending(CDS, "c")
    assert [k for k, _ in watcher.take()] == ["changed"]
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "x"))
    connected_stream(state)
    assert state.timer_pending(CDS, "c")
    clock.advance(RESOURCE_TIMEOUT)
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND
    assert entry(state, "c").state is CacheState.DOES_NOT_EXIST


def test_nacked_resource_resent_on_the_next_stream_cancels_its_timer():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", INVALID)))
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "x"))
    connected_stream(state)
    watcher.take()
    state.on_response(response(CDS, "1", "n1", ("c", INVALID)))
    assert not state.timer_pending(CDS, "c")
    clock.advance(RESOURCE_TIMEOUT * 2)
    assert watcher.take() == []  # the same NACK again: nothing new


def test_does_not_exist_resource_gets_no_new_timer_on_the_next_stream():
    state, clock = make_state()
    state.add_watcher(EDS, "e", RecordingWatcher())
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "x"), had_response=True)
    connected_stream(state)
    assert not state.timer_pending(EDS, "e")


def test_transient_timeout_repeated_on_a_later_stream_is_not_reported_twice():
    state, clock = make_state(a88=True, resource_timer_is_transient_error=True)
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    clock.advance(30)
    assert [k for k, _ in watcher.take()] == ["changed"]
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "x"), had_response=True)
    connected_stream(state)
    assert state.timer_pending(LDS, "a")  # TIMEOUT is not DOES_NOT_EXIST: try again
    clock.advance(30)
    assert watcher.take() == []
    assert entry(state, "a").state is CacheState.TIMEOUT


# ---------------------------------------------------------------- channel failure and new watches


def test_new_watch_of_uncached_name_during_channel_failure_gets_the_error_at_once():
    """C-core XdsClientTest.ConnectionFails and WatchResource ("returning
    cached channel error"): the channel keeps its failure until a response,
    and a watch started meanwhile hears it at once, also for a name that was
    never subscribed before; no does-not-exist while the stream is down."""
    state, clock = make_state()
    first = RecordingWatcher()
    state.add_watcher(CDS, "a", first)
    connected_stream(state)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    ((kind, error),) = first.take()
    assert kind == "changed" and error.code == grpc.StatusCode.UNAVAILABLE
    late = RecordingWatcher()
    state.add_watcher(CDS, "b", late)
    assert late.take() == [("changed", error)]
    clock.advance(RESOURCE_TIMEOUT * 2)  # no stream: no resource timer
    assert first.take() == [] and late.take() == []
    # The next stream fails the same way: nobody hears it twice.
    state.on_stream_started()
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert first.take() == [] and late.take() == []
    # Reconnected: the resource arrives for both names.
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("a", "x"), ("b", "y")))
    assert first.take() == [("changed", res(CDS, "a", "x"))]
    assert late.take() == [("changed", res(CDS, "b", "y"))]


def test_new_watch_during_channel_failure_still_times_out_once_reconnected():
    """The channel error stands in for the resource until the next stream is
    connected; then the resource timer runs and reports does-not-exist."""
    state, clock = make_state()
    state.add_watcher(EDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "down"))
    late = RecordingWatcher()
    state.add_watcher(EDS, "b", late)
    assert [s.code for _, s in late.take()] == [grpc.StatusCode.UNAVAILABLE]
    state.on_stream_started()
    state.take_requests()
    state.on_stream_connected()
    clock.advance(RESOURCE_TIMEOUT)
    ((kind, status),) = late.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND
    assert entry(state, "b").state is CacheState.DOES_NOT_EXIST


def test_new_watch_after_channel_recovered_hears_no_stale_error():
    """A response clears the channel failure (C-core SetHealthyLocked): later
    watches of new names start clean."""
    state, _ = make_state()
    state.add_watcher(CDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "down"))
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("a", "x")))
    late = RecordingWatcher()
    state.add_watcher(CDS, "b", late)
    assert late.take() == []


def test_new_watch_of_cached_name_during_channel_failure_gets_resource_then_ambient_error():
    """A88 "New Watchers Started After Ambient Errors" with the channel error."""
    state, _ = make_state()
    first = RecordingWatcher()
    state.add_watcher(LDS, "a", first)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "x")))
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "down"), had_response=False)
    first.take()
    late = RecordingWatcher()
    state.add_watcher(LDS, "a", late)
    ((k1, value), (k2, error)) = late.take()
    assert (k1, value) == ("changed", res(LDS, "a", "x"))
    assert k2 == "ambient" and error.code == grpc.StatusCode.UNAVAILABLE


def test_resubscribe_before_response_then_resource_arrives_gets_no_does_not_exist():
    """C-core ResourceDoesNotExistUnsubscribeAndResubscribeWhileSendMessagePending
    (grpc#29583): the timer of the resubscribed name is cancelled by the
    resource that answers it."""
    state, clock = make_state()
    watcher = RecordingWatcher()
    handle = state.add_watcher(CDS, "a", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "A", ("a", "x")))
    state.take_requests()
    state.remove_watcher(handle)
    state.add_watcher(CDS, "a", watcher)
    (req,) = state.take_requests()
    assert list(req.resource_names) == ["a"] and state.timer_pending(CDS, "a")
    watcher.take()
    state.on_response(response(CDS, "1", "B", ("a", "x")))
    assert watcher.take() == [("changed", res(CDS, "a", "x"))]
    clock.advance(RESOURCE_TIMEOUT * 2)
    assert watcher.take() == []
    assert entry(state, "a").state is CacheState.ACKED


def test_nack_with_a_valid_resource_keeps_the_previous_version():
    """Issue 4 / the xDS protocol: a NACK carries the previous version even
    when some resources of the response were valid and applied.  (C-core
    alone sends the new version then; grpc-go and grpc-java do not.)"""
    state, _ = make_state()
    state.add_watcher(CDS, "a", RecordingWatcher())
    state.add_watcher(CDS, "b", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(CDS, "1", "A", ("a", "x"), ("b", "y")))
    state.take_requests()
    state.on_response(response(CDS, "2", "B", ("a", INVALID), ("b", "z")))
    (nack,) = state.take_requests()
    assert (nack.version_info, nack.response_nonce) == ("1", "B")
    assert "resource index 0: a:" in nack.error_detail.message
    assert entry(state, "b").version_info == "2"


def test_undecodable_resource_wrapper_is_nacked_and_the_rest_applied():
    """C-core XdsClientTest.ResourceValidationFailureMultipleResources: an
    invalid Resource wrapper is listed in the NACK; the valid resource of the
    same response is applied."""
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "a", watcher)
    connected_stream(state)
    msg = response(CDS, "1", "A", ("a", "x"))
    msg.resources.add(type_url=RESOURCE_WRAPPER_TYPE_URL, value=b"\xff\xff")
    state.on_response(msg)
    (nack,) = state.take_requests()
    assert "resource index 1: Can't decode Resource proto wrapper" in nack.error_detail.message
    assert watcher.take() == [("changed", res(CDS, "a", "x"))]
