"""One RPC's story (pyxds.channel.rpc.Rpc) on its own: the phases of its
attempts, what each step answers, and that every attempt reaches the LB
policy and the A66 attempt metrics exactly once.  No sockets, no threads:
a fake transport behind a real subchannel, a picker the test sets, a
seeded random, the RPC's answers checked directly."""

from __future__ import annotations

import random
from collections import defaultdict
from types import SimpleNamespace

import grpc
import pytest
from test_channel_picks import Selector, ready_subchannel
from test_channel_support import Harness, new_rpc

from pyxds import metrics
from pyxds.channel.call_metrics import counting
from pyxds.channel.request_buffer import PULL, RETIRED, RequestBuffer
from pyxds.channel.rpc import BACKOFF, DEADLINE_EXCEEDED, PICKING, RUNNING
from pyxds.lb.api import ATTEMPT_NOT_STARTED, OK_STATUS, Endpoint, PickComplete, Picker, Status
from pyxds.resolver.api import CallConfig
from pyxds.resolver.retry_policy import RetryPolicy

UNAVAILABLE = Status(grpc.StatusCode.UNAVAILABLE, "backend down")
REFUSED = Status(grpc.StatusCode.UNAVAILABLE, "Received RST_STREAM with error code 7)")
POLICY = RetryPolicy.from_xds(("unavailable",), 3, 0.1, 1.0)


class Tracking(Picker):
    """Completes every pick on one subchannel; records each attempt's report."""

    def __init__(self, sub):
        self.sub = sub
        self.done = []

    def pick(self, args):
        return PickComplete(self.sub, lambda status: self.done.append(status.code))


@pytest.fixture
def h():
    harness = Harness()
    harness.core.random = random.Random(7)
    harness.start()
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    harness.picker = Tracking(ready_subchannel(harness))
    harness.publish(harness.picker)
    harness.transport = harness.transports.last("10.0.0.1:80")
    yield harness
    harness.core.close()


def rpc_of(h, policy=POLICY, timeout=30.0, buffer=None):
    rpc = new_rpc(h.core, "/svc/M", [("k", "v")], timeout, False)
    rpc.call_config = CallConfig(retry_policy=policy)
    rpc.buffer = buffer
    return rpc


def routed_rpc_of(h, policy=POLICY):
    """An RPC routed by the channel's config selector (A66: its first
    attempt starts when it is routed)."""
    h.core.selector = Selector(CallConfig(retry_policy=policy))
    return new_rpc(h.core, "/svc/M", [("k", "v")], 30.0, False)


def no_metadata(call):
    return None, None


def headers(call):
    return (("server", "x"),), None


class Call:
    """A stand-in for one attempt's grpcio call (its identity is the attempt)."""


def test_a_completed_pick_starts_the_attempt_on_its_transport(h):
    rpc = rpc_of(h)
    assert rpc.phase == PICKING
    assert rpc.pick() is h.transport
    assert rpc.phase == RUNNING
    assert h.transport.calls_running == 1


def test_a_pick_on_a_transport_that_closed_is_reported_not_started_and_picked_again(h):
    rpc = rpc_of(h)
    h.transport.closed = True
    assert rpc.pick() is None  # at the channel's next publication
    assert rpc.phase == PICKING
    assert h.picker.done == [ATTEMPT_NOT_STARTED.code]


def test_a_failed_pick_ends_the_rpc_with_its_status(h):
    rpc = rpc_of(h, policy=None)

    class Failing(Picker):
        def pick(self, args):
            from pyxds.lb.api import PickFail

            return PickFail(UNAVAILABLE)

    h.publish(Failing())
    assert rpc.pick() is UNAVAILABLE
    assert rpc.done


def test_a_cancel_while_picking_ends_the_rpc_cancelled_before_any_pick(h):
    rpc = rpc_of(h)
    assert rpc.cancel()
    status = rpc.pick()
    assert status.code is grpc.StatusCode.CANCELLED
    assert rpc.done and h.transport.calls_running == 0
    assert h.picker.done == []  # nothing was picked
    assert not rpc.cancel()  # over already


def test_no_attempt_starts_once_the_deadline_passed(h):
    rpc = rpc_of(h, timeout=-1.0)
    assert rpc.pick() is DEADLINE_EXCEEDED
    assert rpc.done and h.transport.calls_running == 0
    assert h.picker.done == [grpc.StatusCode.DEADLINE_EXCEEDED]  # the pick, reported once


def test_a_start_that_raised_on_a_closed_transport_is_not_sent_and_picked_again(h):
    """grpcio's "Cannot invoke RPC on closed channel!": the subchannel's
    channel closed between the pick and the start; nothing left the client."""
    rpc = rpc_of(h)
    transport = rpc.pick()
    transport.retire(force=True)
    assert rpc.start_failed(transport) is True
    assert transport.calls_running == 0
    assert h.picker.done == [ATTEMPT_NOT_STARTED.code]
    assert rpc.phase == PICKING


def test_a_start_that_raised_on_an_open_transport_ends_the_rpc_without_picking_again(h):
    """Malformed metadata or timeout: grpcio raises the same on every
    subchannel, so picking again would spin forever (it did, on aio and on
    blocking calls); the count is given back and the adapter ends the RPC."""
    rpc = rpc_of(h)
    transport = rpc.pick()
    assert rpc.start_failed(transport) is False
    assert transport.calls_running == 0 and not transport.closed
    assert h.picker.done == []  # the adapter's finish reports the pick, once
    rpc.finish(Status(grpc.StatusCode.UNKNOWN, "ValueError: bad metadata"))
    assert h.picker.done == [grpc.StatusCode.UNKNOWN]
    assert rpc.done


def test_a_retryable_failure_waits_the_jittered_backoff_then_picks_again(h):
    rpc = rpc_of(h)
    rpc.pick()
    delay = rpc.ended(Call(), UNAVAILABLE, no_metadata)
    assert delay == pytest.approx(0.1 * random.Random(7).uniform(0.8, 1.2))
    assert rpc.phase == BACKOFF
    assert h.picker.done == [grpc.StatusCode.UNAVAILABLE]  # the attempt reached the LB once
    assert not rpc.done
    assert rpc.send_metadata == (("k", "v"), ("grpc-previous-rpc-attempts", "1"))


def test_the_same_attempt_reported_twice_is_decided_once(h):
    """A reader of the responses and the call's end callback both see the
    failure: one decision, one report to the LB, one counted attempt."""
    rpc = rpc_of(h)
    rpc.pick()
    call = Call()
    first = rpc.ended(call, UNAVAILABLE, no_metadata)
    assert rpc.reported(call)
    assert rpc.ended(call, UNAVAILABLE, no_metadata) == first
    assert h.picker.done == [grpc.StatusCode.UNAVAILABLE]
    assert rpc.retry.attempts == 2


def test_attempts_end_at_the_policy_max_and_the_last_one_finishes_the_rpc(h):
    rpc = rpc_of(h)
    delays = []
    for _ in range(10):
        assert rpc.pick() is h.transport
        delay = rpc.ended(Call(), UNAVAILABLE, no_metadata)
        if delay is None:
            break
        delays.append(delay)
    assert len(delays) == 3  # num_retries 3: 4 attempts
    assert h.picker.done == [grpc.StatusCode.UNAVAILABLE] * 4
    assert rpc.done


def test_an_ok_attempt_finishes_the_rpc(h):
    rpc = rpc_of(h)
    rpc.pick()
    assert rpc.ended(Call(), OK_STATUS) is None
    assert rpc.done and h.picker.done == [grpc.StatusCode.OK]


def test_response_headers_commit_the_rpc(h):
    rpc = rpc_of(h)
    rpc.pick()
    assert rpc.ended(Call(), UNAVAILABLE, headers) is None
    assert rpc.done


def test_a_response_commits_the_rpc(h):
    rpc = rpc_of(h)
    rpc.pick()
    rpc.commit()
    assert rpc.ended(Call(), UNAVAILABLE, no_metadata) is None


def test_requests_past_the_buffer_limit_commit_the_rpc(h):
    buffer = RequestBuffer(limit=4)
    rpc = rpc_of(h, buffer=buffer)
    rpc.pick()
    view = buffer.view()
    assert buffer.next_kept(view) is PULL
    buffer.taken(view, b"12345")
    assert not buffer.recording
    assert rpc.ended(Call(), UNAVAILABLE, no_metadata) is None


def test_a_commit_stops_keeping_requests(h):
    buffer = RequestBuffer()
    rpc = rpc_of(h, buffer=buffer)
    rpc.commit()
    assert not buffer.recording


def test_a_cancelled_rpc_is_not_retried(h):
    rpc = rpc_of(h)
    rpc.pick()
    rpc.cancel()
    assert rpc.ended(Call(), UNAVAILABLE, no_metadata) is None
    assert rpc.done


def test_a_refused_attempt_is_sent_again_at_once_without_a_policy(h):
    """A6 transparent retry: a case of the retry decision like any retry."""
    rpc = rpc_of(h, policy=None)
    rpc.pick()
    assert rpc.ended(Call(), REFUSED, no_metadata) == 0.0
    assert rpc.phase == PICKING
    rpc.pick()
    assert rpc.ended(Call(), REFUSED, no_metadata) is None  # once only


def test_a_report_after_the_rpc_ended_changes_nothing(h):
    rpc = rpc_of(h)
    rpc.pick()
    rpc.ended(Call(), OK_STATUS)
    assert rpc.ended(Call(), UNAVAILABLE, no_metadata) is None
    rpc.finish(UNAVAILABLE)
    assert h.picker.done == [grpc.StatusCode.OK]


def test_the_channel_counts_the_rpc_in_and_out_once(h):
    before = h.core.active_calls
    rpc = rpc_of(h)
    assert h.core.active_calls == before + 1
    rpc.pick()
    rpc.finish(OK_STATUS)
    rpc.finish(UNAVAILABLE)
    assert h.core.active_calls == before


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


class _Instruments(defaultdict):
    """Every instrument enabled: made on first use (``get`` too)."""

    def get(self, name, default=None):
        return self[name]


@pytest.fixture
def recorder():
    fake = SimpleNamespace(
        counters=_Instruments(_Instrument),
        histograms=_Instruments(_Instrument),
        labels=lambda _name, labels: labels,  # no optional labels to drop
        generic_method_attribute_filter=None,
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
    rpc = routed_rpc_of(h)
    for status, sent, received in ((UNAVAILABLE, b"req", b""), (OK_STATUS, b"req", b"reply")):
        rpc.pick()
        serialize, deserialize = counting(rpc.metrics.sizes, None, None)
        serialize(sent)
        if received:
            deserialize(received)
        rpc.ended(Call(), status, no_metadata)
    assert [s for _, s in recorder.histograms["grpc.client.attempt.duration"].values] == [
        "UNAVAILABLE",
        "OK",
    ]
    assert recorder.histograms[SENT].values == [(3, "UNAVAILABLE"), (3, "OK")]
    assert recorder.histograms[RCVD].values == [(0, "UNAVAILABLE"), (5, "OK")]
    assert [s for _, s in recorder.histograms["grpc.client.call.duration"].values] == ["OK"]


def test_a_failed_last_attempt_is_recorded_once(h, recorder):
    rpc = routed_rpc_of(h, policy=None)
    rpc.pick()
    assert rpc.ended(Call(), UNAVAILABLE, no_metadata) is None
    assert len(recorder.histograms["grpc.client.attempt.duration"].values) == 1
    assert recorder.histograms[SENT].values == [(0, "UNAVAILABLE")]


def test_metrics_off_cost_nothing_per_rpc(h):
    """While metrics are off an RPC carries no metrics state: the grpcio
    multicallable is the one cached on the transport."""
    rpc = rpc_of(h)
    assert rpc.metrics is None


def test_counting_serializers_wrap_the_users_and_count_serialized_bytes():
    sizes = [0, 0]
    serialize, deserialize = counting(sizes, lambda m: m.encode(), lambda b: b.decode())
    assert serialize("hello") == b"hello"
    assert deserialize(b"hi!") == "hi!"
    assert sizes == [5, 3]


def test_rpc_counts_are_read_without_itertools_pickling():
    """The channel's RPC counters (idleness, ``active_calls``) are read from
    the counter's ``repr`` (``count(N)``): itertools' ``__reduce__`` warns
    from Python 3.12 on and is gone in 3.14.  A counter whose ``__reduce__``
    is gone is still read (the old reader failed on it)."""
    import itertools

    from pyxds.channel.core import _count_of

    counter = itertools.count(1)
    for _ in range(1234):
        next(counter)
    assert _count_of(counter) == 1234

    class Unpicklable:
        def __repr__(self) -> str:
            return repr(counter)

        def __reduce__(self):
            raise TypeError("itertools.count has no __reduce__ (Python 3.14)")

    assert _count_of(Unpicklable()) == 1234  # type: ignore[arg-type]
