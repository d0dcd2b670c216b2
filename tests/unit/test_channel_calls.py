"""DeferredCall (``future()`` and streams) over fakes: a non-blocking RPC
whose pick waits, then delegates to the subchannel's call; completion,
deadlines, cancel and the one transparent retry."""

from __future__ import annotations

import grpc
import pytest
from test_channel_picks import PickCompletePicker, Selector, ready_subchannel
from test_channel_support import FnMethod, Harness, new_rpc

from pyxds.channel.calls import FutureCall, StreamingCall
from pyxds.channel.rpc import STALE_PICKER_GRACE
from pyxds.lb.api import Endpoint, PickComplete, Picker, QueuePicker, Status
from pyxds.resolver.api import CallConfig

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class FakeFuture:
    """A grpcio future/call that the test finishes."""

    def __init__(self) -> None:
        self.callbacks = []
        self._code = None
        self._details = ""
        self._result = None
        self.cancelled_ = False

    def finish(self, code=grpc.StatusCode.OK, details="", result=b"ok"):
        self._code, self._details, self._result = code, details, result
        for cb in self.callbacks:
            cb()

    def add_callback(self, cb):
        if self._code is not None:
            return False
        self.callbacks.append(cb)
        return True

    def code(self):
        return self._code

    def details(self):
        return self._details

    def result(self, timeout=None):
        if self._code is not grpc.StatusCode.OK:
            raise grpc.RpcError()
        return self._result

    def cancel(self):
        self.cancelled_ = True
        self.finish(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
        return True


@pytest.fixture
def h():
    harness = Harness()
    harness.start()
    harness.committed = []
    harness.resolve(
        [Endpoint(("10.0.0.1:80",))],
        Selector(CallConfig(on_committed=lambda: harness.committed.append(1))),
    )
    yield harness
    harness.core.close()


def start_future(h, timeout=5.0, wait_for_ready=False):
    started = []

    def start(transport, remaining):
        future = FakeFuture()
        started.append((future, remaining))
        return future

    rpc = new_rpc(h.core, "/svc/M", None, timeout, wait_for_ready)
    return FutureCall(rpc, FnMethod(start), None, None, None), started


class Tracking(Picker):
    def __init__(self, sub):
        self.sub = sub
        self.done = []

    def pick(self, args):
        return PickComplete(self.sub, self.done.append)


def test_future_returns_at_once_and_starts_its_call_when_a_picker_arrives(h):
    h.publish(QueuePicker())
    call, started = start_future(h)
    assert not call.done() and started == []
    picker = Tracking(ready_subchannel(h))
    h.publish(picker)
    assert len(started) == 1 and 0 < started[0][1] <= 5.0
    started[0][0].finish(result=b"resp")
    assert call.result(1) == b"resp" and call.done()
    assert picker.done == [Status(grpc.StatusCode.OK)]
    assert h.committed == [1]


def test_a_call_waiting_for_its_pick_names_its_kind_then_reads_as_the_call_it_became(h):
    h.publish(QueuePicker())
    call, started = start_future(h)
    stream = StreamingCall(
        new_rpc(h.core, "/svc/S", None, 5.0, False), FnMethod(None), None, None, None
    )
    assert (str(call), str(stream)) == (
        "<pyxds FutureCall (pick pending)>",
        "<pyxds StreamingCall (pick pending)>",
    )
    stream.cancel()  # ended by the channel: grpcio's text
    assert str(stream).startswith("<_MultiThreadedRendezvous of RPC that terminated with:")
    assert "StatusCode.CANCELLED" in str(stream)
    h.publish(Tracking(ready_subchannel(h)))
    assert str(call) == str(started[0][0])  # the subchannel call's
    started[0][0].finish()


def test_future_queued_past_its_deadline_fails_with_deadline_exceeded(h):
    h.publish(QueuePicker())
    call, started = start_future(h, timeout=1.0)
    h.clock.advance(1.01)
    with pytest.raises(grpc.RpcError) as info:
        call.result(1)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    h.publish(PickCompletePicker(ready_subchannel(h)))
    assert started == []
    assert h.committed == [1]


def test_cancel_while_queued_fails_it_and_nothing_starts_later(h):
    h.publish(QueuePicker())
    call, started = start_future(h)
    assert call.cancel()
    assert call.done() and call.code() is grpc.StatusCode.CANCELLED
    h.publish(PickCompletePicker(ready_subchannel(h)))
    assert started == []
    assert h.committed == [1]


def test_future_refused_unseen_is_retried_once_on_a_new_pick(h):
    picker = Tracking(ready_subchannel(h))
    h.publish(picker)
    call, started = start_future(h)
    started[0][0].finish(UNAVAILABLE, "GOAWAY received; Error code: 0")
    assert len(started) == 2 and not call.done()
    started[1][0].finish(UNAVAILABLE, "Received RST_STREAM with error code 7)")
    assert len(started) == 2 and call.done()
    assert call.code() is UNAVAILABLE
    assert [s.code for s in picker.done] == [UNAVAILABLE, UNAVAILABLE]
    assert h.committed == [1]


def test_future_that_never_left_the_client_goes_again_with_each_newer_picker(h):
    # A6 case 2: no limit but the deadline; never twice with the same picker.
    sub = ready_subchannel(h)
    pickers = [Tracking(sub)]
    h.publish(pickers[0])
    call, started = start_future(h)
    for attempt in range(3):
        started[attempt][0].finish(UNAVAILABLE, "failed to connect to all addresses; last error: x")
        assert len(started) == attempt + 1 and not call.done()  # the stale picker is not used
        pickers.append(Tracking(sub))
        h.publish(pickers[-1])
        assert len(started) == attempt + 2
    started[3][0].finish()
    assert call.done() and call.code() is grpc.StatusCode.OK
    assert [[s.code for s in p.done] for p in pickers] == [[UNAVAILABLE]] * 3 + [
        [grpc.StatusCode.OK]
    ]


def test_done_callbacks_run_once_with_the_call(h):
    h.publish(PickCompletePicker(ready_subchannel(h)))
    call, started = start_future(h)
    seen = []
    call.add_done_callback(seen.append)
    started[0][0].finish()
    call.add_done_callback(seen.append)
    assert seen == [call, call]


def policy_selector(h):
    from pyxds.resolver.retry_policy import RetryPolicy

    policy = RetryPolicy.from_xds(("unavailable",), 3, 1.0, 1.0)
    return Selector(CallConfig(retry_policy=policy, on_committed=lambda: h.committed.append(1)))


def test_future_retried_by_its_policy_starts_the_next_attempt_after_the_backoff(h):
    import random

    h.core.selector = policy_selector(h)
    h.core.random = random.Random(1)
    wait = 1.0 * random.Random(1).uniform(0.8, 1.2)  # A6: +-20 % jitter
    picker = Tracking(ready_subchannel(h))
    h.publish(picker)
    call, started = start_future(h)
    started[0][0].finish(UNAVAILABLE, "backend down")
    assert len(started) == 1 and not call.done()
    h.clock.advance(wait * 0.9)
    assert len(started) == 1
    h.clock.advance(wait * 0.2)
    assert len(started) == 2
    started[1][0].finish(result=b"resp")
    assert call.result(1) == b"resp"
    assert [s.code for s in picker.done] == [UNAVAILABLE, grpc.StatusCode.OK]
    assert h.committed == [1]


def test_future_cancelled_during_its_backoff_ends_cancelled_and_starts_nothing(h):
    h.core.selector = policy_selector(h)
    picker = Tracking(ready_subchannel(h))
    h.publish(picker)
    call, started = start_future(h)
    started[0][0].finish(UNAVAILABLE, "backend down")
    assert call.cancel()
    assert call.done() and call.code() is grpc.StatusCode.CANCELLED
    h.clock.advance(2.0)
    assert len(started) == 1
    assert [s.code for s in picker.done] == [UNAVAILABLE]  # the one attempt, once
    assert h.committed == [1]


def test_future_that_never_left_the_client_is_picked_again_after_the_grace(h):
    # No newer picker within STALE_PICKER_GRACE (the connection was re-made
    # between two connectivity checks): the same picker is asked again,
    # on the deadline clock (FakeClock here), not at the deadline.
    picker = Tracking(ready_subchannel(h))
    h.publish(picker)
    call, started = start_future(h)
    started[0][0].finish(UNAVAILABLE, "failed to connect to all addresses; last error: x")
    h.clock.advance(STALE_PICKER_GRACE / 2)
    assert len(started) == 1 and not call.done()
    h.clock.advance(STALE_PICKER_GRACE)
    assert len(started) == 2 and not call.done()
    started[1][0].finish()
    assert call.code() is grpc.StatusCode.OK
    assert [s.code for s in picker.done] == [UNAVAILABLE, grpc.StatusCode.OK]


def test_future_whose_newer_picker_came_within_the_grace_is_not_picked_again_by_its_timer(h):
    sub = ready_subchannel(h)
    h.publish(Tracking(sub))
    call, started = start_future(h)
    started[0][0].finish(UNAVAILABLE, "failed to connect to all addresses; last error: x")
    newer = Tracking(sub)
    h.publish(newer)
    assert len(started) == 2
    h.clock.advance(STALE_PICKER_GRACE * 2)  # the grace's timer, if left, would pick again
    assert len(started) == 2 and not call.done()
    started[1][0].finish()
    assert call.code() is grpc.StatusCode.OK and len(newer.done) == 1
