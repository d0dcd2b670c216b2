"""A88's env-var guard in the XdsClient: ``fail_on_data_errors``,
``resource_timer_is_transient_error`` and xRFC TP3 ``resource_errors`` are
used only with ``GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING`` on.

gRFC A88 "Temporary environment variable protection": "This env var will
guard using the new response fields from [xRFC TP3] and the new server
features "fail_on_data_errors" and "resource_timer_is_transient_error"."
C-core's test/core/xds/xds_client_test.cc checks each one off
(ResourceErrorFromServerIgnoredIfNotEnabled,
ResourceTimerIsTransientErrorIgnoredUnlessEnabled,
ResourceValidationFailureForCachedResourceWithFailOnDataErrorsDisabled),
grpc-java gates them the same way (GrpcXdsClientImplTestBase
ldsResourceDeleted_failOnDataErrorsIgnoredWithoutEnvVar,
ldsResourceNacked_withFailOnDataErrorsDisabled_isAmbientError), and
grpcio 1.85 was seen doing so live
(tests/e2e/test_differential_xds_data_errors.py).  Sans-IO over AdsState.
"""

from __future__ import annotations

import grpc
from test_xds_client_ads_state import (
    CDS,
    INVALID,
    LDS,
    RecordingWatcher,
    connected_stream,
    make_state,
    res,
    response,
    with_error,
)

from pyxds.xds.ads_state import RESOURCE_TIMEOUT, CacheState


def _entry(state, name):
    return next(e for e in state.snapshot() if e.name == name)


def _cached_then(state, type_url: str, name: str, *second: tuple[str, str], clock=None):
    """Watch ``name``, cache it at version "1" (nonce "A"), then (5 s later
    on ``clock``, if given) apply a version "2" response (nonce "B") of
    ``second``; returns the watcher, holding the second response's events."""
    watcher = RecordingWatcher()
    state.add_watcher(type_url, name, watcher)
    connected_stream(state)
    state.on_response(response(type_url, "1", "A", (name, "v")))
    watcher.take()
    if clock is not None:
        clock.advance(5)
    state.on_response(response(type_url, "2", "B", *second))
    return watcher


def test_server_reported_resource_error_is_ignored_when_a88_is_off():
    """C-core XdsClientTest.ResourceErrorFromServerIgnoredIfNotEnabled: no
    watcher event, the entry stays REQUESTED, the response is ACKed; the
    resource sent next is delivered."""
    state, _ = make_state(a88=False)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "foo1", watcher)
    connected_stream(state)
    state.on_response(
        with_error(response(CDS, "1", "A"), "foo1", grpc.StatusCode.PERMISSION_DENIED, "nope")
    )
    assert watcher.take() == []
    e = _entry(state, "foo1")
    assert e.state is CacheState.REQUESTED and e.error_state is None
    (ack,) = state.take_requests()
    assert (ack.version_info, ack.response_nonce) == ("1", "A")
    assert not ack.HasField("error_detail")
    state.on_response(response(CDS, "2", "B", ("foo1", "v")))
    assert watcher.take() == [("changed", res(CDS, "foo1", "v"))]


def test_malformed_resource_error_is_not_nacked_when_a88_is_off():
    """C-core parses ``resource_errors`` only with the env var on, so an
    entry without a name (NACKed with it on) is not looked at."""
    state, _ = make_state(a88=False)
    state.add_watcher(CDS, "a", RecordingWatcher())
    connected_stream(state)
    msg = response(CDS, "1", "n1", ("a", "ok"))
    msg.resource_errors.add().error_detail.code = grpc.StatusCode.NOT_FOUND.value[0]
    state.on_response(msg)
    (ack,) = state.take_requests()
    assert ack.version_info == "1" and not ack.HasField("error_detail")


def test_transient_timer_feature_is_ignored_when_a88_is_off():
    """C-core XdsClientTest.ResourceTimerIsTransientErrorIgnoredUnlessEnabled:
    the timer is 15 s and reports does-not-exist (NOT_FOUND)."""
    state, clock = make_state(a88=False, resource_timer_is_transient_error=True)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "foo1", watcher)
    connected_stream(state)
    clock.advance(RESOURCE_TIMEOUT - 0.01)
    assert watcher.take() == []
    clock.advance(0.02)
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND
    assert _entry(state, "foo1").state is CacheState.DOES_NOT_EXIST


def test_nack_of_cached_resource_is_ambient_with_fail_on_data_errors_when_a88_is_off():
    """C-core XdsClientTest.ResourceValidationFailureForCachedResourceWith
    FailOnDataErrorsDisabled: an ambient error, the resource kept (CSDS
    NACKED with the old resource), and a new watcher gets the resource then
    the ambient error."""
    state, _ = make_state(a88=False, fail_on_data_errors=True)
    watcher = _cached_then(state, CDS, "foo1", ("foo1", INVALID))
    ((kind, status),) = watcher.take()
    assert kind == "ambient" and "invalid resource" in status.details
    e = _entry(state, "foo1")
    assert e.state is CacheState.NACKED and e.raw is not None and e.version_info == "1"
    assert e.error_state is not None and e.error_state.version_info == "2"
    late = RecordingWatcher()
    state.add_watcher(CDS, "foo1", late)
    assert late.take() == [("changed", res(CDS, "foo1", "v")), ("ambient", status)]


def test_nack_of_cached_resource_drops_it_with_fail_on_data_errors_when_a88_is_on():
    """C-core XdsClientTest.ResourceValidationFailureForCachedResourceWith
    FailOnDataErrors: the same NACK drops the resource; a new watcher gets
    the error at once."""
    state, _ = make_state(a88=True, fail_on_data_errors=True)
    watcher = _cached_then(state, CDS, "foo1", ("foo1", INVALID))
    ((kind, status),) = watcher.take()
    assert kind == "changed" and "invalid resource" in status.details
    assert _entry(state, "foo1").raw is None
    late = RecordingWatcher()
    state.add_watcher(CDS, "foo1", late)
    assert late.take() == [("changed", status)]


def test_deletion_follows_a53_alone_when_a88_is_off():
    """C-core without the env var: ``fail_on_data_errors`` is not looked at,
    ``ignore_resource_deletion`` keeps a deleted LDS/CDS resource (ambient
    NOT_FOUND) and its absence drops it."""
    kept, _ = make_state(a88=False, ignore_resource_deletion=True, fail_on_data_errors=True)
    dropped, _ = make_state(a88=False, fail_on_data_errors=True)
    for state, want in ((kept, "ambient"), (dropped, "changed")):
        watcher = _cached_then(state, LDS, "a")
        ((kind, status),) = watcher.take()
        assert (kind, status.code) == (want, grpc.StatusCode.NOT_FOUND)
        assert (_entry(state, "a").raw is not None) == (want == "ambient")


def test_deletion_ignores_ignore_resource_deletion_when_a88_is_on():
    """A88 "Deprecating ignore_resource_deletion": with the env var on the
    A53 feature is ignored; a deletion is ambient unless
    ``fail_on_data_errors`` (C-core XdsClientTest.ResourceDeletionIgnoredByDefault,
    ResourceDeletionWithFailOnDataErrors)."""
    kept, _ = make_state(a88=True)
    dropped, _ = make_state(a88=True, ignore_resource_deletion=True, fail_on_data_errors=True)
    for state, want in ((kept, "ambient"), (dropped, "changed")):
        watcher = _cached_then(state, CDS, "wc1")
        ((kind, status),) = watcher.take()
        assert (kind, status.code) == (want, grpc.StatusCode.NOT_FOUND)
        assert _entry(state, "wc1").state is CacheState.DOES_NOT_EXIST


def test_csds_entry_of_a_dropped_deletion_has_no_resource_fields_and_the_deletion_error():
    """C-core XdsClientTest.ResourceDeletionWithFailOnDataErrors (CSDS part):
    DOES_NOT_EXIST, no resource, version or update time, and error_state
    ("does not exist", the deleting response's version and time)."""
    state, clock = make_state(a88=True, fail_on_data_errors=True)
    _cached_then(state, LDS, "wc1", clock=clock)
    e = _entry(state, "wc1")
    assert e.state is CacheState.DOES_NOT_EXIST
    assert (e.raw, e.version_info, e.last_updated) == (None, "", None)
    assert e.error_state is not None
    assert (e.error_state.details, e.error_state.version_info) == ("does not exist", "2")
    assert e.error_state.last_update_attempt == 1_700_000_005.0
    # grpc-go TestLDSWatch_NewWatcherForRemovedResource, C-core: a new
    # watcher hears the does-not-exist at once
    late = RecordingWatcher()
    state.add_watcher(LDS, "wc1", late)
    ((kind, status),) = late.take()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND


def test_csds_entry_of_an_ignored_deletion_keeps_the_resource_fields_and_shows_the_error():
    """C-core XdsClientTest.ResourceDeletionIgnoredByDefault (CSDS part): the
    kept resource with its own version and time, and error_state
    ("does not exist", "2", the deletion's time)."""
    state, clock = make_state(a88=True)
    _cached_then(state, LDS, "wc1", clock=clock)
    e = _entry(state, "wc1")
    assert e.state is CacheState.DOES_NOT_EXIST
    assert e.raw is not None and (e.version_info, e.last_updated) == ("1", 1_700_000_000.0)
    assert e.error_state is not None
    assert (e.error_state.details, e.error_state.version_info) == ("does not exist", "2")
    assert e.error_state.last_update_attempt == 1_700_000_005.0
    # a new watcher gets the kept resource, then the deletion as ambient error
    late = RecordingWatcher()
    state.add_watcher(LDS, "wc1", late)
    (first, (kind, status)) = late.take()
    assert first == ("changed", res(LDS, "wc1", "v"))
    assert kind == "ambient" and status.code == grpc.StatusCode.NOT_FOUND
    # back again: ACKED, the error gone
    state.on_response(response(LDS, "3", "C", ("wc1", "w")))
    e = _entry(state, "wc1")
    assert (e.state, e.version_info, e.error_state) == (CacheState.ACKED, "3", None)


def test_csds_entry_of_a_nack_that_dropped_the_resource_has_no_resource_fields():
    """C-core ResourceValidationFailureForCachedResourceWithFailOnDataErrors
    (CSDS part): NACKED, no resource fields, error_state of the NACK."""
    state, clock = make_state(a88=True, fail_on_data_errors=True)
    _cached_then(state, CDS, "foo1", ("foo1", INVALID), clock=clock)
    e = _entry(state, "foo1")
    assert e.state is CacheState.NACKED
    assert (e.raw, e.version_info, e.last_updated) == (None, "", None)
    assert e.error_state is not None and e.error_state.version_info == "2"
