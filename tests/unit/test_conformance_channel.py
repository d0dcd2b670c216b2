"""Channel conformance over fakes: C-core's transparent retry of an RPC
that never reached the server, for streaming RPCs too (C-core's retry
filter replays the cached send ops of any call that has not committed).

References: C-core test/core/end2end/tests/retry_transparent_not_sent_on_wire.cc,
retry_transparent_goaway.cc, retry_transparent_max_concurrent_streams.cc
(every call kind is retried when the stream was refused before it was
committed), retry_exceeds_buffer_size_in_initial_batch.cc (a call whose
sent messages exceed grpc.per_rpc_retry_buffer_size is committed).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from test_channel_picks import ready_subchannel
from test_channel_support import FakeGrpcError, Harness, new_rpc, run_blocking, streaming

from pyxds.channel.aio import AsyncRequestReplay
from pyxds.channel.calls import RequestReplay
from pyxds.lb.api import Endpoint, PickComplete, Picker
from pyxds.resolver.api import CallConfig, ConfigSelector

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
NOT_SENT = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:10.0.0.1:80"
REFUSED = "GOAWAY received; Error code: 0; Debug Text: Server shutdown"


class _Selector(ConfigSelector):
    def select(self, path, metadata):
        return CallConfig(call_attributes={"cluster": "c1"})


class Tracking(Picker):
    def __init__(self, sub):
        self.sub = sub
        self.done = []

    def pick(self, args):
        return PickComplete(self.sub, lambda status: self.done.append(status.code))


class FakeStream(grpc.RpcError):
    """A grpcio response-streaming call (a _MultiThreadedRendezvous) that
    the test drives: responses to hand out, then a final status."""

    def __init__(self, requests=None) -> None:
        self.requests = requests
        self.responses: list = []
        self.callbacks: list = []
        self._code = None
        self._details = ""

    def finish(self, code=grpc.StatusCode.OK, details=""):
        self._code, self._details = code, details
        for cb in self.callbacks:
            cb()

    def add_callback(self, cb):
        if self._code is not None:
            return False
        self.callbacks.append(cb)
        return True

    def __next__(self):
        if self.responses:
            return self.responses.pop(0)
        if self._code is None or self._code is grpc.StatusCode.OK:
            raise StopIteration
        raise self

    def code(self):
        return self._code

    def details(self):
        return self._details

    def cancel(self):
        self.finish(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
        return True


@pytest.fixture
def h():
    harness = Harness()
    harness.start()
    harness.resolve([Endpoint(("10.0.0.1:80",))], _Selector())
    harness.picker = Tracking(ready_subchannel(harness))
    harness.publish(harness.picker)
    yield harness
    harness.core.close()


def start_stream(h, replay=None):
    started: list[FakeStream] = []

    def start(transport, remaining):
        stream = FakeStream(replay.attempt() if replay is not None else None)
        started.append(stream)
        return stream

    rpc = new_rpc(h.core, "/svc/Stream", None, 5.0, False)
    call = streaming(rpc, start, replay)
    return call, started


def test_server_streaming_call_not_sent_is_sent_again_by_the_next_picker(h):
    """C-core retry_transparent_not_sent_on_wire: a stream that never left
    the client is sent again (A6 case 2), by a picker newer than the one
    that chose the lost connection."""
    call, started = start_stream(h)
    first_picker = h.picker
    started[0].finish(UNAVAILABLE, NOT_SENT)
    assert len(started) == 1 and not call.done()  # waits for the next picker
    h.picker = Tracking(first_picker.sub)
    h.publish(h.picker)
    assert len(started) == 2 and not call.done()
    started[1].responses = [b"r1"]
    assert next(call) == b"r1"
    started[1].finish()
    assert list(call) == []
    assert call.code() is grpc.StatusCode.OK
    assert first_picker.done == [UNAVAILABLE] and h.picker.done == [grpc.StatusCode.OK]


def test_reader_that_sees_the_refusal_first_reads_the_retried_calls_responses(h):
    """C-core retry_transparent_goaway: the application never sees the refusal."""
    call, started = start_stream(h)
    first = started[0]
    first._code, first._details = UNAVAILABLE, REFUSED  # failed, callback not run yet
    retried = []

    def late_callback():
        for cb in first.callbacks:
            cb()
        retried.append(True)
        started[1].responses = [b"after retry"]

    import threading

    timer = threading.Timer(0.05, late_callback)
    timer.start()
    assert next(call) == b"after retry"
    timer.join()
    assert retried and len(started) == 2


def test_streaming_call_refused_unseen_is_retried_only_once(h):
    call, started = start_stream(h)
    started[0].finish(UNAVAILABLE, REFUSED)
    started[1].finish(UNAVAILABLE, "Received RST_STREAM with error code 7)")  # REFUSED_STREAM
    assert len(started) == 2 and call.done()
    with pytest.raises(grpc.RpcError) as info:
        next(call)
    assert info.value.code() is UNAVAILABLE
    assert call.code() is UNAVAILABLE


def test_streaming_call_that_received_a_response_is_never_retried(h):
    """A call that got a response is committed (C-core: committed on the first
    received message); even a not-sent-looking status ends it."""
    call, started = start_stream(h)
    started[0].responses = [b"r1"]
    assert next(call) == b"r1"
    started[0].finish(UNAVAILABLE, REFUSED)
    assert len(started) == 1 and call.done()
    with pytest.raises(grpc.RpcError):
        next(call)


def test_streaming_failure_after_send_is_not_retried(h):
    call, started = start_stream(h)
    started[0].finish(UNAVAILABLE, "Socket closed")
    assert len(started) == 1 and call.code() is UNAVAILABLE


def test_client_stream_is_retried_with_its_requests_replayed_in_order(h):
    """The retry filter replays the messages the refused attempt had sent."""
    pulled = []

    def requests():
        for i in range(4):
            pulled.append(i)
            yield i

    replay = RequestReplay(requests())
    _call, started = start_stream(h, replay)
    assert [next(started[0].requests), next(started[0].requests)] == [0, 1]
    started[0].finish(UNAVAILABLE, REFUSED)
    assert len(started) == 2
    assert list(started[1].requests) == [0, 1, 2, 3]
    assert pulled == [0, 1, 2, 3]  # each request taken from the user once
    assert next(started[0].requests, "ended") == "ended"  # the old attempt took no more


def test_request_being_taken_when_the_attempt_is_retired_goes_to_the_retry():
    """grpcio's request thread of the refused call may be inside next() when
    the retry starts; the request it takes then is sent by the retry."""
    box = {}

    def requests():
        yield "a"
        box["retry"] = replay.attempt()  # the retry starts during this pull
        yield "b"
        yield "c"

    replay = RequestReplay(requests())
    old = replay.attempt()
    assert next(old) == "a"
    assert next(old) == "b"  # handed to the dead call, which drops it
    assert next(old, "ended") == "ended"
    assert list(box["retry"]) == ["a", "b", "c"]


def test_client_stream_past_the_retry_buffer_is_committed_and_not_retried(h):
    """C-core retry_exceeds_buffer_size_in_initial_batch: past
    per_rpc_retry_buffer_size the call is committed."""
    replay = RequestReplay(iter([b"x" * 10, b"y" * 10, b"z"]), limit=15)
    call, started = start_stream(h, replay)
    assert next(started[0].requests) == b"x" * 10
    assert replay.can_retry()
    assert next(started[0].requests) == b"y" * 10
    assert not replay.can_retry()
    started[0].finish(UNAVAILABLE, REFUSED)
    assert len(started) == 1 and call.code() is UNAVAILABLE


def test_committed_stream_keeps_nothing_once_replayed():
    replay = RequestReplay(iter(range(5)))
    first = replay.attempt()
    assert [next(first), next(first)] == [0, 1]
    second = replay.attempt()
    replay.commit()
    assert list(second) == [0, 1, 2, 3, 4]
    assert replay.buffer.log == []


def test_blocking_client_stream_is_retried_with_its_requests(h):
    """stream_unary with_call: the blocking path replays the requests too."""
    transport = h.transports.last("10.0.0.1:80")
    replay = RequestReplay(iter([b"a", b"b"]))
    sent = []

    def invoke(t, remaining):
        requests = list(replay.attempt()) if not sent else [next(replay.attempt())]
        sent.append(requests)
        if len(sent) == 1:
            raise FakeGrpcError(UNAVAILABLE, REFUSED)
        return b"resp", None

    del transport
    rpc = new_rpc(h.core, "/svc/Up", None, 5.0, False)
    # second attempt reads only its first request: the replay still has both
    assert run_blocking(rpc, invoke, replay) == (b"resp", None)
    assert sent == [[b"a", b"b"], [b"a"]]
    assert h.picker.done == [UNAVAILABLE, grpc.StatusCode.OK]


def test_blocking_client_stream_past_the_buffer_is_not_retried(h):
    replay = RequestReplay(iter([b"a" * 20]), limit=10)
    calls = []

    def invoke(t, remaining):
        calls.append(list(replay.attempt()))
        raise FakeGrpcError(UNAVAILABLE, REFUSED)

    rpc = new_rpc(h.core, "/svc/Up", None, 5.0, False)
    with pytest.raises(grpc.RpcError):
        run_blocking(rpc, invoke, replay)
    assert calls == [[b"a" * 20]]


def test_cancelled_streaming_call_is_not_retried(h):
    call, started = start_stream(h)
    assert call.cancel()
    assert len(started) == 1 and call.code() is grpc.StatusCode.CANCELLED
    assert h.picker.done == [grpc.StatusCode.CANCELLED]


def _collect(view):
    async def go():
        return [item async for item in view]

    return asyncio.run(go())


def test_aio_replay_replays_taken_requests_and_reads_the_source_once():
    """The asyncio twin of the replay rules (async or sync sources)."""
    pulled = []

    async def source():
        for i in range(4):
            pulled.append(i)
            yield i

    async def scenario():
        replay = AsyncRequestReplay(source())
        first = replay.attempt()
        assert [await first.__anext__(), await first.__anext__()] == [0, 1]
        second = replay.attempt()
        with pytest.raises(StopAsyncIteration):
            await first.__anext__()  # retired: takes nothing more
        return [item async for item in second]

    assert asyncio.run(scenario()) == [0, 1, 2, 3]
    assert pulled == [0, 1, 2, 3]


def test_aio_replay_of_a_sync_iterable_and_commit_past_the_limit():
    replay = AsyncRequestReplay([b"x" * 10, b"y" * 10], limit=15)
    assert _collect(replay.attempt()) == [b"x" * 10, b"y" * 10]
    assert not replay.can_retry()
