"""One RPC's attempts, sans I/O: the call engine the sync and asyncio call
objects share (gRFC A6 "Retry Policy", A44; A31 for the CallConfig).

Theory of operation
-------------------

A pyxds RPC is a sequence of *attempts*; each attempt is one pick and, if
the pick chose a subchannel, one grpcio call on that subchannel's channel.
:class:`Attempts` is the state of one RPC's attempts.  It performs no I/O:
it never blocks, sleeps, starts a thread, a timer or an asyncio task, and it
never starts a grpcio call.  The call objects (``calls.py`` for the sync
channel: ``blocking_unary``, ``FutureCall``, ``StreamingCall``; ``aio.py``
for ``grpc.aio``) are adapters: they wait for picks and backoffs their own
way (a blocked thread, a timer, an awaited sleep), start the grpcio call
the engine asks for, and feed the engine what happened.  Every decision is
taken here, the same way for all of them.

Phases (:attr:`Attempts.phase`)::

    PICKING --picked(core)--> RUNNING --ended(): retry--> BACKOFF/PICKING
       |  \\--picked(None)/not_sent()--> PICKING (nothing was sent)
       \\--picked(Status)--> DONE        RUNNING --ended(): final--> DONE

Events and the actions they answer:

* :meth:`Attempts.picked` (the pick's outcome): the transport to start the
  attempt on (counted on it), or ``None``: nothing was started, pick again
  now; or a ``Status``: the RPC is over with it (a failed pick, a drop, the
  deadline, a cancel that came while picking).
* :meth:`Attempts.not_sent`: starting the grpcio call failed before
  anything was sent (its channel closed under us): pick again now.
  :meth:`Attempts.start_failed` tells that case from a start that raised
  because of the call's own arguments, which ends the RPC (picking again
  would raise again, forever).
* :meth:`Attempts.commit`: the RPC committed (A6 "Retry Policy": a
  response, a ``write()`` the engine cannot keep, or the request buffer
  past its limit); no retry from then on.  Response headers commit too:
  :meth:`ended` is told the attempt's initial metadata.
* :meth:`Attempts.ended` (an attempt's grpcio call ended with a status):
  the seconds to wait before the next attempt (a fresh pick), or ``None``:
  the RPC is over with that status.  An UNAVAILABLE attempt also tells its
  transport its connection may be gone (``Transport.suspect()``: a polled
  transport looks at once, issue 18).  Decided once per attempt, whichever of
  the adapter's readers and its call-ended callback sees the end first; a
  later report of the same attempt (its grpcio call object identifies it)
  gets the same answer, and any report once the RPC is over gets None.
* :meth:`Attempts.cancel`: the application cancelled; no retry from then on.

Rules:

1. The decision is the RPC's :class:`~pyxds.channel.retry.RetryState`,
   reached through ``Rpc.retry_after`` (the policy is the one of the RPC's
   own CallConfig, A31; the wait never goes past the deadline).
2. Each attempt reaches the LB policy exactly once, through
   ``Rpc.attempt_done`` (trailers hook, then ``on_call_done``, then the A66
   attempt metrics) for an attempt followed by another, and through
   ``Rpc.finish`` for the last one (which also commits the CallConfig and
   ends the call metrics).  A pick that chose a subchannel on which nothing
   was started is reported as ``ATTEMPT_NOT_STARTED``.
3. Committed (see above) or cancelled: the RPC ends with the attempt's
   status.
4. The deadline: an attempt is not started once it has passed; the RPC
   ends with DEADLINE_EXCEEDED.

The request buffer of a client-streaming RPC is :class:`RequestBuffer`,
sans I/O too; ``calls.RequestReplay`` (threads) and
``aio.AsyncRequestReplay`` (asyncio) are its two iterator faces.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import grpc

from pyxds.channel.core import DEADLINE_EXCEEDED, Rpc
from pyxds.channel.subchannel import SubchannelCore, Transport
from pyxds.lb.api import ATTEMPT_NOT_STARTED, Status

__all__ = [
    "BACKOFF",
    "CANCELLED",
    "DONE",
    "PICKING",
    "RETRY_BUFFER_SIZE",
    "RUNNING",
    "Attempts",
    "BufferView",
    "RequestBuffer",
]

PICKING = "picking"
RUNNING = "running"
BACKOFF = "backoff"
DONE = "done"

_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
CANCELLED = Status(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")

#: C-core's default ``grpc.per_rpc_retry_buffer_size``: once the requests
#: sent on an attempt add up to more than this, the RPC is committed (no
#: retry) and its requests are no longer kept.
RETRY_BUFFER_SIZE = 256 * 1024


class Attempts:
    """See the module docstring."""

    __slots__ = (
        "rpc",
        "buffer",
        "phase",
        "committed",
        "cancelled",
        "remaining",
        "transport",
        "_retried",
    )

    def __init__(self, rpc: Rpc, buffer: RequestBuffer | None = None) -> None:
        self.rpc = rpc
        #: the requests kept for a retry (client-streaming RPCs)
        self.buffer = buffer
        self.phase = PICKING
        #: a response or a write() committed the RPC (buffer overflow and
        #: response headers are read at the attempt's end)
        self.committed = False
        self.cancelled = False
        #: seconds left to the deadline when the running attempt started
        #: (None: no deadline): the adapter's timeout for its grpcio call
        self.remaining: float | None = None
        #: the transport of the running (or last) attempt
        self.transport: Transport | None = None
        #: (call, delay) of each attempt followed by another (made at the
        #: first retry: an RPC that is not retried never builds it)
        self._retried: list[tuple[Any, float]] | None = None

    # -- events ----------------------------------------------------------
    def picked(self, outcome: SubchannelCore | Status) -> Transport | Status | None:
        """The pick ended with ``outcome`` (a SubchannelCore or a Status)."""
        rpc = self.rpc
        if self.cancelled:
            outcome = CANCELLED
        if isinstance(outcome, Status):
            self.finish(outcome)
            return outcome
        if rpc.deadline is not None:
            remaining = self.remaining = rpc.remaining()
            if remaining is not None and remaining <= 0:  # e.g. after a backoff
                self.finish(DEADLINE_EXCEEDED)
                return DEADLINE_EXCEEDED
        transport = outcome.transport
        if transport is None or not transport.call_started():
            rpc.attempt_done(ATTEMPT_NOT_STARTED)
            return None
        self.phase = RUNNING
        self.transport = transport
        return transport

    def not_sent(self, transport: Transport) -> None:
        """Starting the attempt's call on ``transport`` failed before anything
        was sent: the pick is reported as not started; pick again now."""
        transport.call_finished()
        self.rpc.attempt_done(ATTEMPT_NOT_STARTED)
        self.phase = PICKING

    def start_failed(self, transport: Transport) -> bool:
        """Starting the attempt's grpcio call on ``transport`` raised.

        True: the transport had closed under us (grpcio's "Cannot invoke RPC
        on closed channel!"), so nothing was sent: as :meth:`not_sent`, pick
        again now.  False: the call's own arguments are wrong (malformed
        metadata, a timeout that is not a number: grpcio raises the same on
        its own channel, and would again on any subchannel); the count on
        the transport is given back and the adapter ends the RPC with the
        error, never picking again for it.
        """
        if transport.closed:
            self.not_sent(transport)
            return True
        transport.call_finished()
        return False

    def commit(self) -> None:
        """The RPC committed: no retry from now on, no request kept."""
        self.committed = True
        if self.buffer is not None:
            self.buffer.commit()

    def cancel(self) -> bool:
        """The application cancels; False when the RPC was already over."""
        if self.phase is DONE:
            return False
        self.cancelled = True
        return True

    def reported(self, call: Any) -> bool:
        """Whether the end of the attempt ``call`` was decided already (or
        the RPC is over)."""
        return self._delay_of(call) is not None or self.phase is DONE

    def _delay_of(self, call: Any) -> float | None:
        retried = self._retried
        if retried is not None:
            for decided, delay in retried:
                if decided is call:
                    return delay
        return None

    def ended(
        self,
        call: Any,
        status: Status,
        read_metadata: Callable[[Any], tuple[Any, Any]] | None = None,
    ) -> float | None:
        """The attempt ``call`` ended with ``status``: seconds to wait before
        the next attempt, or None (the RPC is over, finished here).
        ``read_metadata(call)`` gives the attempt's (initial, trailing)
        metadata, read only for a failed attempt (non-empty initial metadata
        = response headers = committed; trailers: the server's pushback)."""
        delay = self._delay_of(call)
        if delay is not None or self.phase is DONE:
            return delay  # decided already
        if not status.ok and not self.cancelled:
            if status.code is _UNAVAILABLE and self.transport is not None:
                self.transport.suspect()  # its connection may be gone: look now
            initial, trailing = read_metadata(call) if read_metadata is not None else (None, None)
            buffer = self.buffer
            committed = (
                self.committed or bool(initial) or (buffer is not None and not buffer.recording)
            )
            delay = self.rpc.retry_after(status, trailing, committed)
        if delay is None:
            self.finish(status, call)
        else:
            if self._retried is None:
                self._retried = []
            self._retried.append((call, delay))
            self.rpc.attempt_done(status, call)
            self.phase = BACKOFF if delay > 0 else PICKING
        return delay

    def finish(self, status: Status, call: Any = None) -> bool:
        """The RPC is over with ``status`` (``call``: its last attempt's
        grpcio call); False when it was over already."""
        if self.phase is DONE:
            return False
        self.phase = DONE
        self.rpc.finish(status, call)
        return True

    @property
    def done(self) -> bool:
        return self.phase is DONE


def size_of(message: Any) -> int:
    """The size a request counts for in the retry buffer."""
    byte_size = getattr(message, "ByteSize", None)
    if byte_size is not None:
        try:
            return int(byte_size())
        except Exception:
            pass
    if isinstance(message, (bytes, bytearray, str)):
        return len(message)
    return sys.getsizeof(message)


#: :meth:`RequestBuffer.next_kept`: take the next request from the source
PULL = object()
#: :meth:`RequestBuffer.next_kept`: the attempt's iterator is retired
RETIRED = object()


class BufferView:
    """One attempt's position in the buffer."""

    __slots__ = ("epoch", "index")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.index = 0


class RequestBuffer:
    """The requests of a client-streaming RPC, kept until it commits so that
    a retry can send them again (C-core's retry filter caches the send ops
    of an uncommitted call the same way).  Sans I/O: the faces take the
    requests from the user's iterator and serialize access.

    * Every attempt gets its own view (:meth:`view`); it first replays the
      requests already taken, in order, then takes new ones.  Requests are
      taken from the user's iterator once, in order, never twice.
    * A new view retires the previous one: it takes no more requests.  A
      request a retired view was taking when it was retired is kept for the
      next attempt (grpcio's request consumer of a failed call never loses
      one).
    * The RPC commits (no retry, nothing more kept) at :meth:`commit` or
      once the kept requests add up to more than ``limit`` bytes (A6
      ``grpc.per_rpc_retry_buffer_size``).
    """

    __slots__ = ("limit", "log", "size", "recording", "epoch")

    def __init__(self, limit: int = RETRY_BUFFER_SIZE) -> None:
        self.limit = limit
        self.log: list[Any] = []
        self.size = 0
        self.recording = True
        self.epoch = 0

    def commit(self) -> None:
        self.recording = False

    def view(self) -> BufferView:
        """A new attempt's view (retires the previous one)."""
        self.epoch += 1
        return BufferView(self.epoch)

    def next_kept(self, view: BufferView) -> Any:
        """The next request of ``view`` from the buffer, or :data:`PULL`
        (take one from the source, then :meth:`taken`) or :data:`RETIRED`."""
        if view.epoch != self.epoch:
            return RETIRED
        if view.index < len(self.log):
            view.index += 1
            return self.log[view.index - 1]
        if not self.recording and self.log:
            self.log = []  # replayed in full after the commit: nothing more to keep
            view.index = 0
        return PULL

    def behind(self, view: BufferView) -> bool:
        """Whether ``view`` has kept requests to replay or was retired (a
        face that waited for its turn to pull asks again)."""
        return view.epoch != self.epoch or view.index < len(self.log)

    def taken(self, view: BufferView, item: Any) -> bool:
        """``item`` was just taken from the source for ``view``; False: the
        view was retired meanwhile (the item is kept for the next attempt)."""
        retired = view.epoch != self.epoch
        if self.recording or retired:
            self.log.append(item)
            if not retired:
                view.index += 1
            self.size += size_of(item)
            if self.size > self.limit:
                self.recording = False
        return not retired


def counting(
    sizes: list[int],
    serializer: Callable[[Any], bytes] | None,
    deserializer: Callable[[bytes], Any] | None,
) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """A66 ``grpc.client.attempt.{sent,rcvd}_total_compressed_message_size``:
    the (serializer, deserializer) of one attempt's grpcio call that add the
    serialized size of each request to ``sizes[0]`` and of each response to
    ``sizes[1]`` (``Rpc.sizes``, recorded at the attempt's end).  Used only
    while metrics are on: the attempt then gets its own grpcio multicallable."""

    def serialize(message: Any) -> bytes:
        data: bytes = message if serializer is None else serializer(message)
        sizes[0] += len(data)
        return data

    def deserialize(data: bytes) -> Any:
        sizes[1] += len(data)
        return data if deserializer is None else deserializer(data)

    return serialize, deserialize
