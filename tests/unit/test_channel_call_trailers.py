"""The channel's one hook for per-call backend metrics (A51): the pick's
``PickComplete.on_call_trailers`` gets the attempt's trailing metadata just
before ``on_call_done``; only attempts that reached a subchannel call; a
raising hook never stops ``on_call_done`` nor fails the RPC."""

from __future__ import annotations

import grpc
import pytest
from test_channel_picks import h, ready_subchannel  # noqa: F401 - fixture
from test_channel_support import FakeGrpcError

from pyxds.channel.core import trailing_metadata_of
from pyxds.lb.api import OK_STATUS, PickComplete, Picker, Status
from pyxds.lb.xds_cluster_impl import XdsClusterImplPicker

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class FinishedCall:
    """A finished sync grpcio call as far as the channel reads it."""

    def __init__(self, trailers) -> None:
        self._trailers = trailers

    def trailing_metadata(self):
        return self._trailers


def picked(h, events, raising: bool = False):  # noqa: F811 - fixture name
    sub = ready_subchannel(h)

    def trailers(md):
        events.append(("trailers", tuple(md)))
        if raising:
            raise RuntimeError("policy bug")

    class P(Picker):
        def pick(self, args):
            return PickComplete(sub, lambda s: events.append(("done", s.code)), trailers)

    h.publish(P())
    rpc = h.core.new_rpc("/svc/M", None, 5.0, False)
    assert h.core.try_pick(rpc) is not None
    return rpc


def test_trailers_reach_the_pick_before_its_status(h):  # noqa: F811
    events: list = []
    rpc = picked(h, events)
    rpc.finish(OK_STATUS, FinishedCall((("k", "v"), ("b-bin", b"\x01"))))
    assert events == [("trailers", (("k", "v"), ("b-bin", b"\x01"))), ("done", grpc.StatusCode.OK)]


def test_failed_call_trailers_are_read_from_the_error(h):  # noqa: F811
    events: list = []
    rpc = picked(h, events)
    err = FakeGrpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
    err.trailing_metadata = lambda: (("x", "1"),)
    rpc.finish(Status(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy"), err)
    assert events == [("trailers", (("x", "1"),)), ("done", grpc.StatusCode.RESOURCE_EXHAUSTED)]


def test_an_attempt_that_never_reached_a_subchannel_has_no_trailers(h):  # noqa: F811
    events: list = []
    rpc = picked(h, events)
    rpc.attempt_done(Status(UNAVAILABLE, "subchannel closed"))
    assert events == [("done", UNAVAILABLE)]


def test_a_raising_trailers_hook_does_not_stop_on_call_done(h):  # noqa: F811
    events: list = []
    rpc = picked(h, events, raising=True)
    rpc.finish(OK_STATUS, FinishedCall((("k", "v"),)))
    assert events[-1] == ("done", grpc.StatusCode.OK)


def test_trailers_hook_runs_once_per_attempt(h):  # noqa: F811
    events: list = []
    rpc = picked(h, events)
    rpc.finish(OK_STATUS, FinishedCall((("k", "v"),)))
    rpc.finish(OK_STATUS, FinishedCall((("k", "v"),)))
    rpc.attempt_done(OK_STATUS, FinishedCall((("k", "v"),)))
    assert [e[0] for e in events] == ["trailers", "done"]


def test_trailing_metadata_of_reads_every_kind_of_finished_call():
    class Status_:
        def trailing_metadata(self):
            return (("a", "1"),)

    class Cython:
        _status = Status_()

    class AioCall:
        _cython_call = Cython()

        async def trailing_metadata(self):  # never awaited by the channel
            return ()

    class CoroutineOnly:
        async def trailing_metadata(self):
            return (("a", "1"),)

    assert trailing_metadata_of(AioCall()) == (("a", "1"),)
    assert trailing_metadata_of(FinishedCall(None)) == ()
    assert trailing_metadata_of(CoroutineOnly()) == ()
    assert trailing_metadata_of(object()) == ()


@pytest.mark.parametrize("with_hook", [True, False])
def test_cluster_impl_passes_the_trailers_hook_through(with_hook):
    from pyxds.lb.call_counters import cluster_counters

    hook = (lambda md: None) if with_hook else None

    class Child(Picker):
        def pick(self, args):
            return PickComplete(object(), None, hook)

    counters = cluster_counters("c-trailers", None)
    picker = XdsClusterImplPicker(Child(), (), counters, 1024, None)
    result = picker.pick(None)
    assert isinstance(result, PickComplete) and result.on_call_trailers is hook
    result.on_call_done(OK_STATUS)


def test_cluster_impl_rebuilds_every_field_pick_complete_has():
    # xds_cluster_impl rebuilds PickComplete positionally (for speed): this
    # fails when PickComplete gains a field that rebuild would drop.
    import dataclasses

    assert [f.name for f in dataclasses.fields(PickComplete)] == [
        "subchannel",
        "on_call_done",
        "on_call_trailers",
        "attempt_labels",
        "metadata",
    ]
