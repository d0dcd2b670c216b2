"""Property tests of the ADS state machine: random interleavings of watches,
cancels, stream starts and closes, responses and time (A57, A88, TRAPS)."""

from __future__ import annotations

import itertools
from typing import Any

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_xds_client_ads_state import (
    CDS,
    EDS,
    INVALID,
    NODE,
    TYPES,
    FakeResource,
    FakeServer,
    response,
)

from pyxds.lb.api import Status
from pyxds.testing.fake_clock import FakeClock
from pyxds.xds.ads_state import RESOURCE_TIMEOUT, AdsState, CacheState

NAMES = ("a", "b", "c")
TYPE_URLS = (CDS, EDS)  # one SotW-complete type, one not

op = st.one_of(
    st.tuples(st.just("watch"), st.sampled_from(TYPE_URLS), st.sampled_from(NAMES)),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
    st.tuples(st.just("start")),
    st.tuples(st.just("connect")),
    st.tuples(st.just("close"), st.booleans()),
    st.tuples(
        st.just("respond"),
        st.sampled_from(TYPE_URLS),
        st.lists(
            st.tuples(st.sampled_from(NAMES), st.sampled_from(["v1", "v2", INVALID])),
            max_size=3,
            unique_by=lambda r: r[0],
        ),
    ),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 5.0, RESOURCE_TIMEOUT])),
)


class Watcher:
    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.calls: list[tuple[str, Any]] = []
        self.cancelled = False
        self.calls_after_cancel = 0

    def on_resource_changed(self, value: Any) -> None:
        if self.cancelled:
            self.calls_after_cancel += 1
        self.calls.append(("changed", value))

    def on_ambient_error(self, status: Status) -> None:
        if self.cancelled:
            self.calls_after_cancel += 1
        self.calls.append(("ambient", status))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40), fail_on_data_errors=st.booleans(), a88=st.booleans())
def test_random_event_sequences_keep_invariants(ops, fail_on_data_errors, a88):
    clock = FakeClock()
    state = AdsState(
        FakeServer(fail_on_data_errors=fail_on_data_errors),
        NODE,
        resource_types=TYPES,
        clock=clock,
        data_error_handling=a88,
    )
    handles: list[tuple[Any, Watcher]] = []
    stream_up = connected = False
    first_request_sent = False
    nonce = 0
    for step in ops:
        kind = step[0]
        if kind == "watch":
            watcher = Watcher((step[1], step[2]))
            handles.append((state.add_watcher(step[1], step[2], watcher), watcher))
        elif kind == "cancel" and handles:
            handle, watcher = handles.pop(step[1] % len(handles))
            state.remove_watcher(handle)
            watcher.cancelled = True
        elif kind == "start":
            state.on_stream_started()
            stream_up, connected, first_request_sent = True, False, False
        elif kind == "connect" and stream_up:
            state.on_stream_connected()
            connected = True
        elif kind == "close" and stream_up:
            state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, "x"), step[1])
            stream_up = connected = False
        elif kind == "respond" and stream_up:
            nonce += 1
            state.on_response(response(step[1], str(nonce), str(nonce), *step[2]))
            connected = True
        elif kind == "advance":
            before = {id(w): len(w.calls) for _, w in handles}
            clock.advance(step[1])
            if not connected:
                # no resource timer runs while the stream is not connected
                for _, w in handles:
                    new = w.calls[before[id(w)] :]
                    assert not any(
                        isinstance(v, Status) and v.code == grpc.StatusCode.NOT_FOUND
                        for _, v in new
                    )
        requests = state.take_requests()
        if not stream_up:
            assert requests == []
        for request in requests:
            assert request.HasField("node") == (not first_request_sent)
            first_request_sent = True

    for _, watcher in handles:
        # identical resources are never delivered twice in a row
        resources = [v for k, v in watcher.calls if k == "changed"]
        for prev, cur in itertools.pairwise(resources):
            if isinstance(prev, FakeResource) and isinstance(cur, FakeResource):
                assert prev != cur
        assert all(not isinstance(v, FakeResource) or v.name == watcher.key[1] for v in resources)
    for handle, watcher in handles:
        assert watcher.calls_after_cancel == 0, handle
    for entry in state.snapshot():
        if entry.state is CacheState.ACKED:
            assert entry.raw is not None
        if entry.state in (CacheState.REQUESTED, CacheState.TIMEOUT):
            assert entry.raw is None
