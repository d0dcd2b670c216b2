"""ADS protocol details of the XdsClient replayed from C-core's
test/core/xds/xds_client_test.cc cases the earlier conformance rounds did
not cover: per-type version and nonce, an empty response after the last
name of a type is withdrawn, a response mixing every kind of bad resource,
the ACK of a response carrying an unsubscribed resource, and the request a
resubscription sends.  Sans-IO over AdsState with a FakeClock.
"""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2
from test_xds_client_ads_state import (
    CDS,
    EDS,
    INVALID,
    LDS,
    RDS,
    RESOURCE_TIMEOUT,
    RESOURCE_WRAPPER_TYPE_URL,
    RecordingWatcher,
    _encode,
    connected_stream,
    make_state,
    res,
    response,
)

from pyxds.status import OK_STATUS
from pyxds.xds.ads_state import CacheState


def _states(state) -> dict[str, CacheState]:
    return {e.name: e.state for e in state.snapshot()}


def test_each_resource_type_keeps_its_own_version_and_nonce():
    """C-core XdsClientTest.MultipleResourceTypes: the first request of a
    second type carries neither the first type's version nor its nonce."""
    state, _ = make_state()
    state.add_watcher(EDS, "foo1", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(EDS, "1", "A", ("foo1", "v")))
    state.take_requests()
    state.add_watcher(RDS, "bar1", RecordingWatcher())
    (req,) = state.take_requests()
    assert (req.type_url, req.version_info, req.response_nonce) == (RDS, "", "")
    state.on_response(response(RDS, "2", "B", ("bar1", "whee")))
    (ack,) = state.take_requests()
    assert (ack.type_url, ack.version_info, ack.response_nonce) == (RDS, "2", "B")


def test_empty_response_after_last_name_withdrawn_is_acked_and_kept_for_resubscribe():
    """C-core XdsClientTest.MultipleResourceTypes: after the last watch of a
    type is cancelled the client sends an empty subscription; the server's
    empty response for that type is ACKed (version, nonce, no names), and a
    later subscription of that type carries that version and nonce."""
    state, _ = make_state()
    watcher = RecordingWatcher()
    handle = state.add_watcher(EDS, "foo1", watcher)
    connected_stream(state)
    state.on_response(response(EDS, "1", "A", ("foo1", "v")))
    state.take_requests()
    watcher.take()
    state.remove_watcher(handle)
    (unsub,) = state.take_requests()
    assert (unsub.version_info, unsub.response_nonce, list(unsub.resource_names)) == (
        "1",
        "A",
        [],
    )
    state.on_response(response(EDS, "1", "C"))
    (ack,) = state.take_requests()
    assert (ack.version_info, ack.response_nonce, list(ack.resource_names)) == ("1", "C", [])
    assert not ack.HasField("error_detail")
    state.add_watcher(EDS, "foo2", watcher)
    (sub,) = state.take_requests()
    assert (sub.version_info, sub.response_nonce, list(sub.resource_names)) == (
        "1",
        "C",
        ["foo2"],
    )
    state.on_response(response(EDS, "1", "D", ("foo2", "w")))
    assert watcher.take() == [("changed", res(EDS, "foo2", "w"))]


def test_response_mixing_every_kind_of_bad_resource_is_nacked_per_resource():
    """C-core XdsClientTest.ResourceValidationFailureMultipleResources: an
    invalid resource whose name is known (foo1), bytes that do not parse
    (foo2: its name is unknown, so its watcher hears nothing and it stays
    REQUESTED), an empty Any, an undecodable Resource wrapper, a wrapped
    resource that does not parse (foo3: named by the wrapper, so its
    watcher gets the error) and a valid one (foo4, applied).  The NACK lists
    resource indexes 0-4 in order."""
    state, _ = make_state()
    watchers = {name: RecordingWatcher() for name in ("foo1", "foo2", "foo3", "foo4")}
    for name, watcher in watchers.items():
        state.add_watcher(CDS, name, watcher)
    connected_stream(state)
    msg = discovery_pb2.DiscoveryResponse(type_url=CDS, version_info="1", nonce="A")
    msg.resources.add(type_url=CDS, value=_encode(CDS, "foo1", INVALID))
    msg.resources.add(type_url=CDS, value=b"\xff\xff")
    msg.resources.add()
    msg.resources.add(type_url=RESOURCE_WRAPPER_TYPE_URL, value=b"\xff\xff")
    wrapper = discovery_pb2.Resource(name="foo3")
    wrapper.resource.type_url = CDS
    wrapper.resource.value = b"\xff\xff"
    msg.resources.add().Pack(wrapper)
    msg.resources.add(type_url=CDS, value=_encode(CDS, "foo4", "v"))
    state.on_response(msg)
    for name in ("foo1", "foo3"):
        ((kind, status),) = watchers[name].take()
        assert kind == "changed" and f"resource {name}: invalid resource" in status.details
    assert watchers["foo2"].take() == []
    assert watchers["foo4"].take() == [("changed", res(CDS, "foo4", "v"))]
    assert _states(state) == {
        "foo1": CacheState.NACKED,
        "foo2": CacheState.REQUESTED,
        "foo3": CacheState.NACKED,
        "foo4": CacheState.ACKED,
    }
    (nack,) = state.take_requests()
    detail = nack.error_detail.message
    marks = [detail.index(f"resource index {i}: ") for i in range(5)]
    assert marks == sorted(marks), detail
    assert "resource index 0: foo1: " in detail and "resource index 4: foo3: " in detail
    assert 'resource index 2: incorrect resource type ""' in detail
    assert "resource index 3: Can't decode Resource proto wrapper" in detail
    assert sorted(nack.resource_names) == ["foo1", "foo2", "foo3", "foo4"]


def test_resource_named_only_by_bytes_that_do_not_parse_keeps_its_timer():
    """Continuation of ResourceValidationFailureMultipleResources: nothing
    named foo2, so its does-not-exist timer is not cancelled (A57)."""
    state, clock = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "foo2", watcher)
    connected_stream(state)
    msg = discovery_pb2.DiscoveryResponse(type_url=CDS, version_info="1", nonce="A")
    msg.resources.add(type_url=CDS, value=b"\xff\xff")
    state.on_response(msg)
    assert watcher.take() == []
    clock.advance(RESOURCE_TIMEOUT)
    ((kind, status),) = watcher.take()
    assert kind == "changed" and "does not exist" in status.details


def test_ack_of_response_whose_resource_is_no_longer_subscribed_names_what_is():
    """C-core XdsClientTest.UnsubscribeAndResubscribeRace / grpc-go
    TestADS_ACK_NACK_ResourceIsNotRequestedAnymore: a response for a name
    withdrawn meanwhile is ACKed with the current names and notifies nobody."""
    state, _ = make_state()
    kept = RecordingWatcher()
    handle = state.add_watcher(EDS, "foo1", RecordingWatcher())
    state.add_watcher(EDS, "foo2", kept)
    connected_stream(state)
    state.remove_watcher(handle)
    (unsub,) = state.take_requests()
    assert list(unsub.resource_names) == ["foo2"]
    state.on_response(response(EDS, "1", "B", ("foo1", "v"), ("foo2", "w")))
    assert kept.take() == [("changed", res(EDS, "foo2", "w"))]
    (ack,) = state.take_requests()
    assert (ack.version_info, ack.response_nonce, list(ack.resource_names)) == (
        "1",
        "B",
        ["foo2"],
    )
    assert list(_states(state)) == ["foo2"]


def test_lds_response_with_an_empty_resource_applies_the_valid_one_and_nacks():
    """C-core XdsClientTest.WildcardCapableResponseWithEmptyResource: the
    valid Listener is delivered, the empty Any is NACKed by index, and the
    Listener is not read as deleted."""
    state, _ = make_state(a88=False)
    watcher = RecordingWatcher()
    state.add_watcher(LDS, "wc1", watcher)
    connected_stream(state)
    msg = response(LDS, "1", "A", ("wc1", "v"))
    msg.resources.add()
    state.on_response(msg)
    assert watcher.take() == [("changed", res(LDS, "wc1", "v"))]
    (nack,) = state.take_requests()
    assert nack.response_nonce == "A"
    assert nack.error_detail.message == (
        f'xDS response validation errors: [resource index 1: incorrect resource type "" '
        f'(should be "{LDS}")]'
    )
    assert _states(state) == {"wc1": CacheState.ACKED}


def test_watch_added_and_cancelled_before_any_send_of_its_type_sends_no_wildcard():
    """xDS protocol ("wildcard" subscriptions): the first request of a type
    with no resource_names subscribes to every resource of that type (for
    LDS/CDS).  A type whose only watch is cancelled before its first request
    goes out on the stream is never sent, so no LDS wildcard is asked for
    (C-core sends a type only once it has subscriptions, AdsCall)."""
    state, _ = make_state()
    state.add_watcher(CDS, "c", RecordingWatcher())
    connected_stream(state)
    handle = state.add_watcher(LDS, "l", RecordingWatcher())
    state.remove_watcher(handle)
    assert state.take_requests() == []
    # and on the next stream only CDS is resubscribed
    state.on_stream_closed(OK_STATUS, had_response=True)
    assert [r.type_url for r in connected_stream(state)] == [CDS]
