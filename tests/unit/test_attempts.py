"""The sans-IO attempt engine (pyxds.channel.attempts) on its own: the
phases of one RPC's attempts, what each event answers, and that every
attempt reaches the LB policy and the A66 attempt metrics exactly once.
No sockets, no threads: a fake transport, a seeded random, the engine's
answers checked directly."""

from __future__ import annotations

import random
from collections import defaultdict
from types import SimpleNamespace

import grpc
import pytest
from test_channel_support import FakeTransport, Harness

from pyxds import metrics
from pyxds.channel.attempts import (
    BACKOFF,
    PICKING,
    PULL,
    RETIRED,
    RUNNING,
    Attempts,
    RequestBuffer,
    counting,
)
from pyxds.channel.core import DEADLINE_EXCEEDED
from pyxds.lb.api import ATTEMPT_NOT_STARTED, OK_STATUS, Status
from pyxds.resolver.api import CallConfig
from pyxds.resolver.retry_policy import RetryPolicy

UNAVAILABLE = Status(grpc.StatusCode.UNAVAILABLE, "backend down")
REFUSED = Status(grpc.StatusCode.UNAVAILABLE, "Received RST_STREAM with error code 7)")
POLICY = RetryPolicy.from_xds(("unavailable",), 3, 0.1, 1.0)


@pytest.fixture
def h():
    harness = Harness()
    harness.core.random = random.Random(7)
    yield harness
    harness.core.close()


def new_rpc(h, policy=POLICY, timeout=30.0):
    rpc = h.core.new_rpc("/svc/M", [("k", "v")], timeout, False)
    rpc.call_config = CallConfig(retry_policy=policy)
    return rpc


def picked_core():
    """A pick's outcome: a subchannel core with a live transport."""
    transport = FakeTransport("10.0.0.1:80", None, lambda state: None)
    return SimpleNamespace(transport=transport), transport


def pick(rpc, done):
    """What ChannelCore.try_pick leaves on the RPC for a completed pick."""
    rpc.on_call_done = lambda status: done.append(status.code)


def no_metadata(call):
    return None, None


def headers(call):
    return (("server", "x"),), None


class Call:
    """A stand-in for one attempt's grpcio call (its identity is the attempt)."""


def test_a_completed_pick_starts_the_attempt_on_its_transport(h):
    attempts = Attempts(new_rpc(h))
    outcome, transport = picked_core()
    assert attempts.phase == PICKING
    assert attempts.picked(outcome) is transport
    assert attempts.phase == RUNNING
    assert transport._active == 1


def test_a_pick_on_a_transport_that_closed_is_reported_not_started_and_picked_again(h):
    rpc = new_rpc(h)
    done = []
    pick(rpc, done)
    attempts = Attempts(rpc)
    outcome, transport = picked_core()
    transport.closed = True
    assert attempts.picked(outcome) is None
    assert attempts.phase == PICKING
    assert done == [ATTEMPT_NOT_STARTED.code]


def test_a_failed_pick_ends_the_rpc_with_its_status(h):
    rpc = new_rpc(h)
    attempts = Attempts(rpc)
    assert attempts.picked(UNAVAILABLE) is UNAVAILABLE
    assert attempts.done and rpc._finished


def test_a_cancel_while_picking_ends_the_rpc_cancelled_at_the_pick(h):
    attempts = Attempts(new_rpc(h))
    assert attempts.cancel()
    outcome, transport = picked_core()
    status = attempts.picked(outcome)
    assert status.code is grpc.StatusCode.CANCELLED
    assert attempts.done and transport._active == 0
    assert not attempts.cancel()  # over already


def test_no_attempt_starts_once_the_deadline_passed(h):
    rpc = new_rpc(h, timeout=-1.0)
    attempts = Attempts(rpc)
    outcome, transport = picked_core()
    assert attempts.picked(outcome) is DEADLINE_EXCEEDED
    assert attempts.done and transport._active == 0


def test_a_start_that_sent_nothing_is_reported_not_started_and_picked_again(h):
    rpc = new_rpc(h)
    done = []
    pick(rpc, done)
    attempts = Attempts(rpc)
    outcome, transport = picked_core()
    attempts.picked(outcome)
    attempts.not_sent(transport)
    assert transport._active == 0
    assert done == [ATTEMPT_NOT_STARTED.code]
    assert attempts.phase == PICKING


def test_a_start_that_raised_on_a_closed_transport_is_not_sent_and_picked_again(h):
    """grpcio's "Cannot invoke RPC on closed channel!": the subchannel's
    channel closed between the pick and the start; nothing left the client."""
    rpc = new_rpc(h)
    done = []
    pick(rpc, done)
    attempts = Attempts(rpc)
    outcome, transport = picked_core()
    attempts.picked(outcome)
    transport.retire(force=True)
    assert attempts.start_failed(transport) is True
    assert done == [ATTEMPT_NOT_STARTED.code]
    assert attempts.phase == PICKING


def test_a_start_that_raised_on_an_open_transport_ends_the_rpc_without_picking_again(h):
    """Malformed metadata or timeout: grpcio raises the same on every
    subchannel, so picking again would spin forever (it did, on aio and on
    blocking calls); the count is given back and the adapter ends the RPC."""
    rpc = new_rpc(h)
    done = []
    pick(rpc, done)
    attempts = Attempts(rpc)
    outcome, transport = picked_core()
    attempts.picked(outcome)
    assert attempts.start_failed(transport) is False
    assert transport._active == 0 and not transport.closed
    assert done == []  # the adapter's finish reports the pick, once
    attempts.finish(Status(grpc.StatusCode.UNKNOWN, "ValueError: bad metadata"))
    assert done == [grpc.StatusCode.UNKNOWN]
    assert attempts.done


def test_a_retryable_failure_waits_the_jittered_backoff_then_picks_again(h):
    rpc = new_rpc(h)
    done = []
    pick(rpc, done)
    attempts = Attempts(rpc)
    attempts.picked(picked_core()[0])
    delay = attempts.ended(Call(), UNAVAILABLE, no_metadata)
    assert delay == pytest.approx(random.Random(7).uniform(0, 0.1))
    assert attempts.phase == BACKOFF
    assert done == [grpc.StatusCode.UNAVAILABLE]  # the attempt reached the LB once
    assert not rpc._finished
    assert rpc.send_metadata == (("k", "v"), ("grpc-previous-rpc-attempts", "1"))


def test_the_same_attempt_reported_twice_is_decided_once(h):
    """A reader of the responses and the call's end callback both see the
    failure: one decision, one report to the LB, one counted attempt."""
    rpc = new_rpc(h)
    done = []
    pick(rpc, done)
    attempts = Attempts(rpc)
    attempts.picked(picked_core()[0])
    call = Call()
    first = attempts.ended(call, UNAVAILABLE, no_metadata)
    assert attempts.reported(call)
    assert attempts.ended(call, UNAVAILABLE, no_metadata) == first
    assert done == [grpc.StatusCode.UNAVAILABLE]
    assert rpc.retry.attempts == 2


def test_attempts_end_at_the_policy_max_and_the_last_one_finishes_the_rpc(h):
    rpc = new_rpc(h)
    done = []
    attempts = Attempts(rpc)
    delays = []
    for _ in range(10):
        pick(rpc, done)
        attempts.picked(picked_core()[0])
        delay = attempts.ended(Call(), UNAVAILABLE, no_metadata)
        if delay is None:
            break
        delays.append(delay)
    assert len(delays) == 3  # num_retries 3: 4 attempts
    assert done == [grpc.StatusCode.UNAVAILABLE] * 4
    assert attempts.done and rpc._finished


def test_an_ok_attempt_finishes_the_rpc(h):
    rpc = new_rpc(h)
    done = []
    pick(rpc, done)
    attempts = Attempts(rpc)
    attempts.picked(picked_core()[0])
    assert attempts.ended(Call(), OK_STATUS) is None
    assert attempts.done and done == [grpc.StatusCode.OK]


def test_response_headers_commit_the_rpc(h):
    attempts = Attempts(new_rpc(h))
    attempts.picked(picked_core()[0])
    assert attempts.ended(Call(), UNAVAILABLE, headers) is None
    assert attempts.done


def test_a_response_commits_the_rpc(h):
    attempts = Attempts(new_rpc(h))
    attempts.picked(picked_core()[0])
    attempts.commit()
    assert attempts.ended(Call(), UNAVAILABLE, no_metadata) is None


def test_requests_past_the_buffer_limit_commit_the_rpc(h):
    buffer = RequestBuffer(limit=4)
    attempts = Attempts(new_rpc(h), buffer)
    attempts.picked(picked_core()[0])
    view = buffer.view()
    assert buffer.next_kept(view) is PULL
    buffer.taken(view, b"12345")
    assert not buffer.recording
    assert attempts.ended(Call(), UNAVAILABLE, no_metadata) is None


def test_a_commit_stops_keeping_requests(h):
    buffer = RequestBuffer()
    attempts = Attempts(new_rpc(h), buffer)
    attempts.commit()
    assert not buffer.recording


def test_a_cancelled_rpc_is_not_retried(h):
    attempts = Attempts(new_rpc(h))
    attempts.picked(picked_core()[0])
    attempts.cancel()
    assert attempts.ended(Call(), UNAVAILABLE, no_metadata) is None
    assert attempts.done


def test_a_refused_attempt_is_sent_again_at_once_without_a_policy(h):
    """A6 transparent retry: a case of the engine like any retry."""
    rpc = new_rpc(h, policy=None)
    attempts = Attempts(rpc)
    attempts.picked(picked_core()[0])
    assert attempts.ended(Call(), REFUSED, no_metadata) == 0.0
    assert attempts.phase == PICKING
    attempts.picked(picked_core()[0])
    assert attempts.ended(Call(), REFUSED, no_metadata) is None  # once only


def test_a_report_after_the_rpc_ended_changes_nothing(h):
    rpc = new_rpc(h)
    done = []
    pick(rpc, done)
    attempts = Attempts(rpc)
    attempts.picked(picked_core()[0])
    attempts.ended(Call(), OK_STATUS)
    assert attempts.ended(Call(), UNAVAILABLE, no_metadata) is None
    assert not attempts.finish(UNAVAILABLE)
    assert done == [grpc.StatusCode.OK]


def test_buffer_views_replay_what_was_taken_and_a_new_view_retires_the_old():
    buffer = RequestBuffer()
    first = buffer.view()
    assert buffer.next_kept(first) is PULL
    assert buffer.taken(first, b"a")
    second = buffer.view()
    assert buffer.next_kept(first) is RETIRED
    assert buffer.next_kept(second) == b"a"
    assert buffer.next_kept(second) is PULL
    # a request the retired view was taking is kept for the live one
    assert not buffer.taken(first, b"b")
    assert buffer.behind(second)
    assert buffer.next_kept(second) == b"b"


class _Instrument:
    def __init__(self):
        self.values = []

    def record(self, value, labels):
        self.values.append((value, labels.get("grpc.status")))

    add = record


@pytest.fixture
def recorder():
    fake = SimpleNamespace(
        counters=defaultdict(_Instrument),
        histograms=defaultdict(_Instrument),
        labels=lambda _name, labels: labels,  # no optional labels to drop
    )
    metrics.RECORDER = fake  # type: ignore[assignment]
    try:
        yield fake
    finally:
        metrics.RECORDER = None


SENT = "grpc.client.attempt.sent_total_compressed_message_size"
RCVD = "grpc.client.attempt.rcvd_total_compressed_message_size"


def test_each_attempt_records_its_duration_and_message_sizes_once(h, recorder):
    """A66: one duration and one sent/received size per attempt, the failed
    ones included, with the attempt's own status and bytes."""
    rpc = new_rpc(h)
    attempts = Attempts(rpc)
    for status, sent, received in ((UNAVAILABLE, b"req", b""), (OK_STATUS, b"req", b"reply")):
        attempts.picked(picked_core()[0])
        serialize, deserialize = counting(rpc.sizes, None, None)
        serialize(sent)
        if received:
            deserialize(received)
        attempts.ended(Call(), status, no_metadata)
    assert [s for _, s in recorder.histograms["grpc.client.attempt.duration"].values] == [
        "UNAVAILABLE",
        "OK",
    ]
    assert recorder.histograms[SENT].values == [(3, "UNAVAILABLE"), (3, "OK")]
    assert recorder.histograms[RCVD].values == [(0, "UNAVAILABLE"), (5, "OK")]
    assert [s for _, s in recorder.histograms["grpc.client.call.duration"].values] == ["OK"]


def test_a_failed_last_attempt_is_recorded_once(h, recorder):
    rpc = new_rpc(h, policy=None)
    attempts = Attempts(rpc)
    attempts.picked(picked_core()[0])
    assert attempts.ended(Call(), UNAVAILABLE, no_metadata) is None
    assert len(recorder.histograms["grpc.client.attempt.duration"].values) == 1
    assert recorder.histograms[SENT].values == [(0, "UNAVAILABLE")]


def test_counting_serializers_wrap_the_users_and_count_serialized_bytes():
    sizes = [0, 0]
    serialize, deserialize = counting(sizes, lambda m: m.encode(), lambda b: b.decode())
    assert serialize("hello") == b"hello"
    assert deserialize(b"hi!") == "hi!"
    assert sizes == [5, 3]
