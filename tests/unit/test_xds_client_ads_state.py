"""Sans-IO tests of the ADS state machine (pyxds.xds.ads_state): gRFC A27,
A28 "Multiple watches for the same resource", A57, A88, and the xDS-client
traps of TRAPS.md.  No sockets; time is a FakeClock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from pyxds.lb.api import OK_STATUS, Status
from pyxds.testing.fake_clock import FakeClock
from pyxds.xds.ads_state import (
    RESOURCE_TIMEOUT,
    RESOURCE_WRAPPER_TYPE_URL,
    TRANSIENT_RESOURCE_TIMEOUT,
    AdsState,
    CacheState,
)

LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
INVALID = "INVALID"


# --------------------------------------------------------------------------- fakes


@dataclass(frozen=True)
class FakeResource:
    type_url: str
    name: str
    value: str


@dataclass(frozen=True)
class FakeDecodeResult:
    name: str | None
    resource: Any = None
    error: str | None = None


def _encode(type_url: str, name: str, value: str) -> bytes:
    if type_url == LDS:
        return listener_pb2.Listener(name=name, stat_prefix=value).SerializeToString()
    if type_url == RDS:
        msg = route_pb2.RouteConfiguration(name=name)
        msg.virtual_hosts.add(name=value)
        return msg.SerializeToString()
    if type_url == CDS:
        return cluster_pb2.Cluster(name=name, alt_stat_name=value).SerializeToString()
    msg = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    msg.endpoints.add().locality.region = value
    return msg.SerializeToString()


class FakeType:
    """A ResourceType: a resource is (name, value); value "INVALID" fails."""

    def __init__(self, type_url: str, short_name: str, required: bool) -> None:
        self.type_url = type_url
        self.short_name = short_name
        self.all_resources_required_in_sotw = required

    def decode(self, data: bytes) -> FakeDecodeResult:
        if self.type_url == LDS:
            msg = listener_pb2.Listener.FromString(data)
            name, value = msg.name, msg.stat_prefix
        elif self.type_url == RDS:
            msg = route_pb2.RouteConfiguration.FromString(data)
            name, value = msg.name, msg.virtual_hosts[0].name if msg.virtual_hosts else ""
        elif self.type_url == CDS:
            msg = cluster_pb2.Cluster.FromString(data)
            name, value = msg.name, msg.alt_stat_name
        else:
            msg = endpoint_pb2.ClusterLoadAssignment.FromString(data)
            name = msg.cluster_name
            value = msg.endpoints[0].locality.region if msg.endpoints else ""
        if not name:
            return FakeDecodeResult(None, error="name: field not present")
        if value == INVALID:
            return FakeDecodeResult(name, error=f"value: {value!r} is not valid")
        return FakeDecodeResult(name, FakeResource(self.type_url, name, value))


TYPES = {
    LDS: FakeType(LDS, "LDS", True),
    RDS: FakeType(RDS, "RDS", False),
    CDS: FakeType(CDS, "CDS", True),
    EDS: FakeType(EDS, "EDS", False),
}


@dataclass
class FakeServer:
    server_uri: str = "xds.example:443"
    ignore_resource_deletion: bool = False
    fail_on_data_errors: bool = False
    resource_timer_is_transient_error: bool = False


@dataclass
class RecordingWatcher:
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def on_resource_changed(self, resource_or_status: Any) -> None:
        self.calls.append(("changed", resource_or_status))

    def on_ambient_error(self, status: Status) -> None:
        self.calls.append(("ambient", status))

    def take(self) -> list[tuple[str, Any]]:
        calls, self.calls = self.calls, []
        return calls


NODE = base_pb2.Node(id="node-1", cluster="cluster-1")


def make_state(
    clock: FakeClock | None = None, a88: bool | None = None, **features: bool
) -> tuple[AdsState, FakeClock]:
    """``a88``: GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING on/off (None: the
    environment's), which A88's server features and TP3 errors need."""
    clock = clock or FakeClock()
    state = AdsState(
        FakeServer(**features),
        NODE,
        resource_types=TYPES,
        clock=clock,
        wall_clock=lambda: 1_700_000_000.0 + clock.now(),
        data_error_handling=a88,
    )
    return state, clock


def response(
    type_url: str, version: str, nonce: str, *resources: tuple[str, str]
) -> discovery_pb2.DiscoveryResponse:
    msg = discovery_pb2.DiscoveryResponse(type_url=type_url, version_info=version, nonce=nonce)
    for name, value in resources:
        msg.resources.add(type_url=type_url, value=_encode(type_url, name, value))
    return msg


def res(type_url: str, name: str, value: str) -> FakeResource:
    return FakeResource(type_url, name, value)


def connected_stream(state: AdsState) -> list[discovery_pb2.DiscoveryRequest]:
    state.on_stream_started()
    state.on_stream_connected()
    return state.take_requests()


# --------------------------------------------------------------------------- requests


def test_first_request_of_stream_carries_node_later_ones_do_not():
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    state.add_watcher(CDS, "c", RecordingWatcher())
    requests = connected_stream(state)
    assert [r.type_url for r in requests] == [LDS, CDS]
    assert requests[0].node == NODE
    assert not requests[1].HasField("node")
    state.add_watcher(LDS, "b", RecordingWatcher())
    (later,) = state.take_requests()
    assert not later.HasField("node")


def test_no_requests_while_no_stream_is_up():
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    assert state.take_requests() == []


def test_new_name_is_appended_to_subscribed_names_of_its_type():
    state, _ = make_state()
    state.add_watcher(CDS, "c1", RecordingWatcher())
    connected_stream(state)
    state.add_watcher(CDS, "c2", RecordingWatcher())
    (request,) = state.take_requests()
    assert list(request.resource_names) == ["c1", "c2"]
    assert request.type_url == CDS


def test_watchers_of_one_name_share_one_subscription():
    state, _ = make_state()
    w1, w2 = RecordingWatcher(), RecordingWatcher()
    state.add_watcher(LDS, "a", w1)
    connected_stream(state)
    state.add_watcher(LDS, "a", w2)
    assert state.take_requests() == []
    state.on_response(response(LDS, "1", "n1", ("a", "v1")))
    assert w1.take() == [("changed", res(LDS, "a", "v1"))]
    assert w2.take() == [("changed", res(LDS, "a", "v1"))]


def test_new_watcher_of_cached_resource_is_told_at_once():
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v1")))
    late = RecordingWatcher()
    state.add_watcher(LDS, "a", late)
    assert late.take() == [("changed", res(LDS, "a", "v1"))]


def test_new_watcher_sees_resource_then_standing_ambient_error():
    state, _ = make_state()
    state.add_watcher(CDS, "c", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v1")))
    state.on_response(response(CDS, "2", "n2", ("c", INVALID)))
    late = RecordingWatcher()
    state.add_watcher(CDS, "c", late)
    calls = late.take()
    assert calls[0] == ("changed", res(CDS, "c", "v1"))
    assert calls[1][0] == "ambient" and "invalid" in calls[1][1].details


def test_watcher_executor_receives_every_call():
    state, _ = make_state()
    queued: list[Any] = []
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher, executor=queued.append)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v1")))
    assert watcher.calls == []  # nothing runs outside the executor
    for fn in queued:
        fn()
    assert watcher.take() == [("changed", res(LDS, "a", "v1"))]


# --------------------------------------------------------------------------- dedupe


def test_unchanged_resource_in_later_response_notifies_nobody():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(EDS, "e", watcher)
    connected_stream(state)
    state.on_response(response(EDS, "1", "n1", ("e", "v1")))
    watcher.take()
    state.on_response(response(EDS, "2", "n2", ("e", "v1")))
    assert watcher.take() == []
    (ack,) = state.take_requests()
    assert ack.version_info == "2"
    state.on_response(response(EDS, "3", "n3", ("e", "v2")))
    assert watcher.take() == [("changed", res(EDS, "e", "v2"))]


def test_identical_resources_redelivered_after_stream_restart_notify_nobody():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v1")))
    watcher.take()
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "goaway"))
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v1")))
    assert watcher.take() == []


# --------------------------------------------------------------------------- cancel


def test_cancelling_last_watcher_unsubscribes_and_drops_cache_entry():
    state, _ = make_state()
    w1, w2 = RecordingWatcher(), RecordingWatcher()
    h1 = state.add_watcher(CDS, "c1", w1)
    h2 = state.add_watcher(CDS, "c1", w2)
    state.add_watcher(CDS, "c2", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c1", "v"), ("c2", "v")))
    state.take_requests()
    state.remove_watcher(h1)
    assert state.take_requests() == []  # another watcher remains
    state.remove_watcher(h2)
    (request,) = state.take_requests()
    assert list(request.resource_names) == ["c2"]
    assert request.version_info == "1" and request.response_nonce == "n1"
    assert [e.name for e in state.snapshot()] == ["c2"]


def test_cancelling_last_watcher_of_a_type_sends_empty_subscription():
    state, _ = make_state()
    handle = state.add_watcher(RDS, "r", RecordingWatcher())
    connected_stream(state)
    state.remove_watcher(handle)
    (request,) = state.take_requests()
    assert request.type_url == RDS and list(request.resource_names) == []


def test_cancelled_watcher_gets_no_queued_call():
    state, _ = make_state()
    queued: list[Any] = []
    watcher = RecordingWatcher()
    handle = state.add_watcher(LDS, "a", watcher, executor=queued.append)
    state.add_watcher(LDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v1")))
    state.remove_watcher(handle)
    for fn in queued:
        fn()
    assert watcher.calls == []


def test_resubscribing_after_cancel_starts_from_empty_entry():
    state, _ = make_state()
    handle = state.add_watcher(EDS, "e", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(EDS, "1", "n1", ("e", "v1")))
    state.remove_watcher(handle)
    again = RecordingWatcher()
    state.add_watcher(EDS, "e", again)
    assert again.take() == []
    assert [e.state for e in state.snapshot()] == [CacheState.REQUESTED]


# --------------------------------------------------------------------------- ACK / NACK


def test_ack_carries_new_version_and_nonce():
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    (first,) = connected_stream(state)
    assert first.version_info == "" and first.response_nonce == ""
    state.on_response(response(LDS, "v7", "nonce-7", ("a", "x")))
    (ack,) = state.take_requests()
    assert (ack.version_info, ack.response_nonce) == ("v7", "nonce-7")
    assert list(ack.resource_names) == ["a"]
    assert not ack.HasField("error_detail")


def test_nack_carries_previous_version_and_lists_every_invalid_resource():
    state, _ = make_state()
    watchers = {n: RecordingWatcher() for n in ("a", "b", "c")}
    for name, watcher in watchers.items():
        state.add_watcher(CDS, name, watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("a", "a1"), ("b", "b1"), ("c", "c1")))
    state.take_requests()
    for watcher in watchers.values():
        watcher.take()
    state.on_response(response(CDS, "2", "n2", ("a", INVALID), ("b", "b2"), ("c", INVALID)))
    (nack,) = state.take_requests()
    assert nack.version_info == "1"
    assert nack.response_nonce == "n2"
    assert nack.error_detail.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    detail = nack.error_detail.message
    assert "resource index 0: a: value: 'INVALID' is not valid" in detail
    assert "resource index 2: c: value: 'INVALID' is not valid" in detail
    assert "b:" not in detail
    # the valid resource of the same response is applied
    assert watchers["b"].take() == [("changed", res(CDS, "b", "b2"))]
    # the invalid ones keep their last good version: an ambient error
    ((kind, status),) = watchers["a"].take()
    assert kind == "ambient" and "invalid resource" in status.details


def test_nack_is_sent_once_then_later_requests_have_no_error_detail():
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", INVALID)))
    (nack,) = state.take_requests()
    assert nack.HasField("error_detail")
    state.add_watcher(LDS, "b", RecordingWatcher())
    (later,) = state.take_requests()
    assert not later.HasField("error_detail")
    assert later.version_info == ""


def test_ack_after_an_unsent_nack_carries_no_error_detail():
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", INVALID)))
    state.on_response(response(LDS, "2", "n2", ("a", "ok")))
    (ack,) = state.take_requests()
    assert (ack.version_info, ack.response_nonce) == ("2", "n2")
    assert not ack.HasField("error_detail")


def test_nack_of_resource_never_cached_is_reported_as_resource_error():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(EDS, "e", watcher)
    connected_stream(state)
    state.on_response(response(EDS, "1", "n1", ("e", INVALID)))
    ((kind, status),) = watcher.take()
    assert kind == "changed" and isinstance(status, Status)
    assert status.code == grpc.StatusCode.UNAVAILABLE
    assert "EDS resource e" in status.details and "is not valid" in status.details


def test_nack_with_fail_on_data_errors_drops_cached_resource():
    state, _ = make_state(a88=True, fail_on_data_errors=True)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v1")))
    watcher.take()
    state.on_response(response(CDS, "2", "n2", ("c", INVALID)))
    ((kind, status),) = watcher.take()
    assert kind == "changed" and isinstance(status, Status)
    (entry,) = state.snapshot()
    assert entry.state is CacheState.NACKED and entry.raw is None


def test_undecodable_and_wrongly_typed_resources_are_nacked():
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    connected_stream(state)
    msg = response(LDS, "1", "n1", ("a", "ok"))
    msg.resources.add(type_url=LDS, value=listener_pb2.Listener().SerializeToString())
    msg.resources.add(type_url=CDS, value=_encode(CDS, "x", "y"))
    state.on_response(msg)
    (nack,) = state.take_requests()
    assert "resource index 1: name: field not present" in nack.error_detail.message
    assert f'resource index 2: incorrect resource type "{CDS}"' in nack.error_detail.message


def test_duplicate_resource_name_in_response_is_applied_in_order_not_nacked():
    """C-core ParseResource has no duplicate check: each copy is applied."""
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(EDS, "e", watcher)
    connected_stream(state)
    state.on_response(response(EDS, "1", "n1", ("e", "v1"), ("e", "v2")))
    (ack,) = state.take_requests()
    assert not ack.HasField("error_detail") and ack.version_info == "1"
    assert watcher.take() == [("changed", res(EDS, "e", "v1")), ("changed", res(EDS, "e", "v2"))]


def test_resources_nobody_subscribed_are_ignored():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v"), ("other", "v")))
    assert watcher.take() == [("changed", res(CDS, "c", "v"))]
    assert [e.name for e in state.snapshot()] == ["c"]


def test_response_for_type_never_requested_is_not_answered():
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v")))
    assert state.take_requests() == []  # an ACK would subscribe to the wildcard


def test_resource_wrapper_is_unwrapped():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    inner = any_pb2.Any(type_url=LDS, value=_encode(LDS, "a", "wrapped"))
    wrapper = discovery_pb2.Resource(name="a", resource=inner)
    msg = discovery_pb2.DiscoveryResponse(type_url=LDS, version_info="1", nonce="n")
    msg.resources.add(type_url=RESOURCE_WRAPPER_TYPE_URL, value=wrapper.SerializeToString())
    state.on_response(msg)
    assert watcher.take() == [("changed", res(LDS, "a", "wrapped"))]


# --------------------------------------------------------------------------- xRFC TP3 errors


def with_error(msg, name: str, code: grpc.StatusCode, message: str):
    err = msg.resource_errors.add()
    err.resource_name.name = name
    err.error_detail.code = code.value[0]
    err.error_detail.message = message
    return msg


def test_server_reported_not_found_for_uncached_resource_is_resource_error():
    state, clock = make_state(a88=True)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(with_error(response(CDS, "1", "n1"), "c", grpc.StatusCode.NOT_FOUND, "gone"))
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND
    assert "gone" in status.details
    (entry,) = state.snapshot()
    assert entry.state is CacheState.RECEIVED_ERROR
    assert entry.error_state is not None and entry.error_state.details == "gone"
    clock.advance(RESOURCE_TIMEOUT * 2)
    assert watcher.take() == []  # the timer was cancelled
    (ack,) = state.take_requests()
    assert ack.version_info == "1" and not ack.HasField("error_detail")


@pytest.mark.parametrize(
    "code, fail_on_data_errors, expected",
    [
        (grpc.StatusCode.NOT_FOUND, False, "ambient"),
        (grpc.StatusCode.PERMISSION_DENIED, True, "changed"),
        (grpc.StatusCode.NOT_FOUND, True, "changed"),
        (grpc.StatusCode.UNAVAILABLE, True, "ambient"),
    ],
)
def test_server_reported_error_for_cached_resource_follows_a88_table(
    code, fail_on_data_errors, expected
):
    state, _ = make_state(a88=True, fail_on_data_errors=fail_on_data_errors)
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    watcher.take()
    state.on_response(with_error(response(LDS, "2", "n2"), "a", code, "server says no"))
    ((kind, status),) = watcher.take()
    assert kind == expected and status.code == code
    (entry,) = state.snapshot()
    assert entry.state is CacheState.RECEIVED_ERROR
    assert (entry.raw is None) == (expected == "changed")


# --------------------------------------------------------------------------- deletion


@pytest.mark.parametrize("type_url", [LDS, CDS])
def test_lds_and_cds_resource_absent_from_response_is_deleted(type_url):
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(type_url, "x", watcher)
    state.add_watcher(type_url, "y", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(type_url, "1", "n1", ("x", "v"), ("y", "v")))
    watcher.take()
    state.on_response(response(type_url, "2", "n2", ("y", "v")))
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND
    assert "x does not exist" in status.details
    x = next(e for e in state.snapshot() if e.name == "x")
    assert x.state is CacheState.DOES_NOT_EXIST and x.raw is None
    (ack,) = state.take_requests()
    assert ack.version_info == "2"  # a deletion is not a NACK


@pytest.mark.parametrize("type_url", [RDS, EDS])
def test_rds_and_eds_resource_absent_from_response_is_not_deleted(type_url):
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(type_url, "x", watcher)
    state.add_watcher(type_url, "y", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(type_url, "1", "n1", ("x", "v"), ("y", "v")))
    watcher.take()
    state.on_response(response(type_url, "2", "n2", ("y", "v2")))
    assert watcher.take() == []
    x = next(e for e in state.snapshot() if e.name == "x")
    assert x.state is CacheState.ACKED


def test_ignore_resource_deletion_keeps_resource_and_reports_ambient():
    state, _ = make_state(ignore_resource_deletion=True)
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    state.add_watcher(LDS, "b", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v"), ("b", "v")))
    watcher.take()
    state.on_response(response(LDS, "2", "n2", ("b", "v")))
    ((kind, status),) = watcher.take()
    assert kind == "ambient" and status.code == grpc.StatusCode.NOT_FOUND
    a = next(e for e in state.snapshot() if e.name == "a")
    assert a.state is CacheState.DOES_NOT_EXIST and a.raw is not None
    # the resource comes back unchanged: the ambient condition clears
    state.on_response(response(LDS, "3", "n3", ("a", "v"), ("b", "v")))
    assert watcher.take() == [("ambient", OK_STATUS)]


def test_fail_on_data_errors_wins_over_ignore_resource_deletion():
    """A88 on: ``ignore_resource_deletion`` is ignored, ``fail_on_data_errors`` drops."""
    state, _ = make_state(a88=True, ignore_resource_deletion=True, fail_on_data_errors=True)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "a", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("a", "v")))
    watcher.take()
    state.on_response(response(CDS, "2", "n2"))
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND
    (entry,) = state.snapshot()
    assert entry.state is CacheState.DOES_NOT_EXIST and entry.raw is None


def test_nacked_resource_is_not_a_missing_one():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    watcher.take()
    state.on_response(response(LDS, "2", "n2", ("a", INVALID)))
    ((kind, _status),) = watcher.take()
    assert kind == "ambient"  # not deleted


def test_resource_requested_but_never_received_is_not_deleted_by_absence():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "a", RecordingWatcher())
    state.add_watcher(CDS, "b", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("a", "v")))
    assert watcher.take() == []
    assert state.timer_pending(CDS, "b")


def test_stale_version_after_reconnect_is_not_read_as_deletion():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "9", "n1", ("c", "v")))
    watcher.take()
    state.on_stream_closed(OK_STATUS)
    (resend,) = connected_stream(state)
    assert resend.version_info == "9" and resend.response_nonce == ""
    state.on_response(response(CDS, "3", "x1", ("c", "v")))
    assert watcher.take() == []
    (ack,) = state.take_requests()
    assert ack.version_info == "3"


# --------------------------------------------------------------------------- resource timer


def test_resource_timer_does_not_start_before_stream_is_connected():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    state.on_stream_started()
    state.take_requests()
    clock.advance(RESOURCE_TIMEOUT * 10)
    assert watcher.take() == []
    state.on_stream_connected()
    clock.advance(RESOURCE_TIMEOUT - 0.01)
    assert watcher.take() == []
    clock.advance(0.02)
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND
    assert status.details == "LDS resource a does not exist"


def test_resource_timer_does_not_start_before_request_is_sent():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", RecordingWatcher())
    connected_stream(state)
    state.add_watcher(CDS, "c", watcher)
    clock.advance(RESOURCE_TIMEOUT + 1)
    assert watcher.take() == []
    state.take_requests()
    clock.advance(RESOURCE_TIMEOUT + 1)
    assert watcher.take()[0][1].code == grpc.StatusCode.NOT_FOUND


def test_resource_timer_expiry_caches_does_not_exist_and_tells_late_watchers():
    state, clock = make_state()
    state.add_watcher(EDS, "e", RecordingWatcher())
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT)
    (entry,) = state.snapshot()
    assert entry.state is CacheState.DOES_NOT_EXIST
    late = RecordingWatcher()
    state.add_watcher(EDS, "e", late)
    ((kind, status),) = late.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND


def test_resource_timer_is_cancelled_when_resource_arrives():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(RDS, "r", watcher)
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT - 1)
    state.on_response(response(RDS, "1", "n1", ("r", "v")))
    clock.advance(RESOURCE_TIMEOUT)
    assert watcher.take() == [("changed", res(RDS, "r", "v"))]
    assert not state.timer_pending(RDS, "r")


def test_resource_timer_is_cancelled_when_invalid_resource_arrives():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(RDS, "r", watcher)
    connected_stream(state)
    state.on_response(response(RDS, "1", "n1", ("r", INVALID)))
    watcher.take()
    clock.advance(RESOURCE_TIMEOUT * 2)
    assert watcher.take() == []


def test_resource_timer_is_bound_to_its_stream():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT - 1)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "reset"))
    watcher.take()  # the connectivity error
    clock.advance(RESOURCE_TIMEOUT * 3)  # disconnected: no timer runs
    assert watcher.take() == []
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT - 1)
    assert watcher.take() == []  # restarted in full on the new stream
    clock.advance(1)
    assert watcher.take()[0][1].code == grpc.StatusCode.NOT_FOUND


def test_resource_timer_not_restarted_on_reconnect_for_cached_resource():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v")))
    state.on_stream_closed(OK_STATUS)
    connected_stream(state)
    assert not state.timer_pending(CDS, "c")
    clock.advance(RESOURCE_TIMEOUT * 2)
    assert watcher.take() == [("changed", res(CDS, "c", "v"))]


def test_transient_error_timer_variant_waits_30s_and_reports_unavailable_timeout():
    state, clock = make_state(a88=True, resource_timer_is_transient_error=True)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT + 1)
    assert watcher.take() == []
    clock.advance(TRANSIENT_RESOURCE_TIMEOUT - RESOURCE_TIMEOUT)
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.UNAVAILABLE
    # C-core ResourceTimerIsTransientFailure names the server too
    assert status.details == "timeout obtaining CDS resource c from xDS server xds.example:443"
    (entry,) = state.snapshot()
    assert entry.state is CacheState.TIMEOUT


def test_resource_arriving_after_does_not_exist_is_delivered():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT)
    watcher.take()
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    assert watcher.take() == [("changed", res(LDS, "a", "v"))]
    (entry,) = state.snapshot()
    assert entry.state is CacheState.ACKED


def test_response_implies_connected_and_starts_timers():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", RecordingWatcher())
    state.add_watcher(LDS, "b", watcher)
    state.on_stream_started()
    state.take_requests()
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    clock.advance(RESOURCE_TIMEOUT)
    assert watcher.take()[0][1].code == grpc.StatusCode.NOT_FOUND


# --------------------------------------------------------------------------- stream closure


def test_stream_closed_after_response_is_routine():
    state, _ = make_state()
    cached, waiting = RecordingWatcher(), RecordingWatcher()
    state.add_watcher(LDS, "a", cached)
    state.add_watcher(LDS, "b", waiting)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    cached.take()
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "max connection age"))
    assert cached.take() == [] and waiting.take() == []


def test_stream_closed_before_any_response_is_connectivity_error():
    state, _ = make_state()
    cached, waiting = RecordingWatcher(), RecordingWatcher()
    state.add_watcher(LDS, "a", cached)
    state.add_watcher(LDS, "b", waiting)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    cached.take()
    state.on_stream_closed(OK_STATUS)
    connected_stream(state)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    ((kind, status),) = cached.take()
    assert kind == "ambient" and status.code == grpc.StatusCode.UNAVAILABLE
    assert "connection refused" in status.details and "xds.example:443" in status.details
    ((kind, status),) = waiting.take()
    assert kind == "changed" and status.code == grpc.StatusCode.UNAVAILABLE
    # cached resources stay in use (A57)
    a = next(e for e in state.snapshot() if e.name == "a")
    assert a.state is CacheState.ACKED and a.raw is not None


def test_repeated_identical_connectivity_error_is_reported_once():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    for _ in range(3):
        state.on_stream_started()
        state.take_requests()
        state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "refused"))
    assert len(watcher.take()) == 1


def test_ambient_error_clears_with_ok_when_unchanged_resource_returns():
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v")))
    state.on_stream_closed(OK_STATUS)
    connected_stream(state)
    state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "down"))
    watcher.take()
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("c", "v")))
    assert watcher.take() == [("ambient", OK_STATUS)]


def test_reconnect_resends_every_subscription_with_versions_and_node_but_no_nonce():
    state, _ = make_state()
    state.add_watcher(LDS, "a", RecordingWatcher())
    state.add_watcher(EDS, "e", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(LDS, "L1", "n1", ("a", "v")))
    state.on_response(response(EDS, "E1", "n2", ("e", "v")))
    state.take_requests()
    state.on_stream_closed(OK_STATUS)
    assert state.take_requests() == []
    requests = connected_stream(state)
    assert [(r.type_url, r.version_info, r.response_nonce) for r in requests] == [
        (LDS, "L1", ""),
        (EDS, "E1", ""),
    ]
    assert requests[0].node == NODE
    assert list(requests[1].resource_names) == ["e"]


def test_type_with_no_subscriptions_is_not_resent_on_new_stream():
    state, _ = make_state()
    handle = state.add_watcher(RDS, "r", RecordingWatcher())
    state.add_watcher(LDS, "a", RecordingWatcher())
    connected_stream(state)
    state.remove_watcher(handle)
    state.take_requests()
    state.on_stream_closed(OK_STATUS)
    requests = connected_stream(state)
    assert [r.type_url for r in requests] == [LDS]


def test_shutdown_drops_calls_already_queued():
    state, _ = make_state()
    queued: list[Any] = []
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher, executor=queued.append)
    connected_stream(state)
    state.on_response(response(LDS, "1", "n1", ("a", "v")))
    state.shutdown()
    for fn in queued:
        fn()
    assert watcher.calls == []


def test_shutdown_cancels_timers_and_silences_watchers():
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "a", watcher)
    connected_stream(state)
    state.shutdown()
    clock.advance(RESOURCE_TIMEOUT * 2)
    assert watcher.take() == []
    assert clock.pending == []


# --------------------------------------------------------------------------- CSDS states


def test_cache_entry_states_for_csds():
    state, clock = make_state()
    for name in ("requested", "acked", "nacked", "gone"):
        state.add_watcher(CDS, name, RecordingWatcher())
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("acked", "v"), ("nacked", "v"), ("gone", "v")))
    clock.advance(5)
    state.on_response(response(CDS, "2", "n2", ("acked", "v"), ("nacked", INVALID)))
    entries = {e.name: e for e in state.snapshot()}
    assert entries["requested"].state is CacheState.REQUESTED
    assert entries["requested"].version_info == "" and entries["requested"].raw is None
    assert entries["acked"].state is CacheState.ACKED
    assert entries["acked"].version_info == "2"
    assert entries["acked"].last_updated == 1_700_000_005.0
    nacked = entries["nacked"]
    assert nacked.state is CacheState.NACKED
    assert nacked.version_info == "1" and nacked.raw is not None
    assert nacked.error_state is not None
    assert nacked.error_state.version_info == "2"
    assert "is not valid" in nacked.error_state.details
    assert nacked.error_state.last_update_attempt == 1_700_000_005.0
    assert entries["gone"].state is CacheState.DOES_NOT_EXIST


# --------------------------------------------------------------------------- real resource types


def test_same_real_resources_twice_notify_nobody():
    """TRAPS "configs and equality": decoded resources compare structurally, so
    re-sent identical LDS/RDS/CDS/EDS resources are no-ops."""
    from pyxds.server import builders as b
    from pyxds.xds import resources

    protos = {
        resources.LISTENER_TYPE_URL: b.listener("l", route_config_name="r"),
        resources.ROUTE_CONFIG_TYPE_URL: b.route_config(
            "r", [b.virtual_host("vh", ["*"], [b.route(prefix="", cluster="c")])]
        ),
        resources.CLUSTER_TYPE_URL: b.cluster("c"),
        resources.ENDPOINTS_TYPE_URL: b.endpoints(
            "c", [b.locality(endpoints=["127.0.0.1:1", "127.0.0.1:2"])]
        ),
    }
    clock = FakeClock()
    state = AdsState(FakeServer(), NODE, resource_types=resources.RESOURCE_TYPES, clock=clock)
    watchers = {}
    for type_url, proto in protos.items():
        name = getattr(proto, "name", "") or proto.cluster_name
        watchers[type_url] = RecordingWatcher()
        state.add_watcher(type_url, name, watchers[type_url])
    connected_stream(state)
    for round_ in ("1", "2"):
        for type_url, proto in protos.items():
            msg = discovery_pb2.DiscoveryResponse(
                type_url=type_url, version_info=round_, nonce=f"{type_url}-{round_}"
            )
            msg.resources.add(type_url=type_url, value=proto.SerializeToString())
            state.on_response(msg)
        if round_ == "1":
            for watcher in watchers.values():
                ((kind, value),) = watcher.take()
                assert kind == "changed" and not isinstance(value, Status)
    assert all(w.take() == [] for w in watchers.values())
    assert {e.state for e in state.snapshot()} == {CacheState.ACKED}
