"""One streaming call a subchannel keeps open to its own backend while it is
READY: what the out-of-band ORCA stream (gRFC A51, :mod:`pyxds.channel.orca_oob`)
and the client-side health watch (gRFC A17, :mod:`pyxds.channel.health_check`)
have in common (C-core's ``SubchannelStreamClient``).

:class:`StreamClient` is the call's life cycle; a subclass says which call
(``METHOD``, :meth:`StreamClient._request`), how a message parses
(:meth:`StreamClient.parse`, on the thread that reads it: an exception ends
the call) and what it means (:meth:`StreamClient._on_message`, on the
channel's serializer), and when one is wanted (:meth:`StreamClient._wanted`).

Rules (A17 "Client Workflow", A51 "Out of Band Metrics Reporting"):

* While a call is wanted and the subchannel is READY, one call runs to the
  subchannel's address.  It is cancelled when the subchannel leaves READY
  (connection lost, GOAWAY, shutdown) or the call is no longer wanted; a
  cancelled call's status is not waited for.
* A call that ends UNIMPLEMENTED is not retried on that connection
  (:meth:`StreamClient._on_unimplemented`).  Any other end is retried: at
  once when the call had delivered a message, else after an exponential
  backoff (gRPC's connection backoff, reset by every message;
  :meth:`StreamClient._on_backoff` is told when the wait starts).
* The backoff belongs to one stream on one connection: it starts afresh
  whenever the call is stopped rather than retried (the subchannel left
  READY, the call is no longer wanted, or it restarts with another request:
  ORCA's period), as C-core makes a new ``SubchannelStreamClient`` each
  time (``HealthProducer``, ``OrcaProducer``).  The subchannel's
  ``reset_backoff()`` does not touch it (C-core's ``Subchannel::ResetBackoff``
  resets the connection backoff only).
* No thread per stream (issue 18: threads bounded by a constant).  An
  asyncio subchannel's call runs on its own grpc.aio channel, in a task on
  its event loop.  A sync subchannel's runs as a ``grpc.aio`` call on the
  process's xDS stream loop (:mod:`pyxds.xds.stream_loop`), on a *side
  channel*: a ``grpc.aio`` channel to the same destination with the same
  credentials and options (``Transport.aio_twin``; through the same A29
  TLS relay), since grpcio's sync API cannot read a streaming call without
  a thread blocked on it (plus the grpcio channel's spin thread).  On a
  grpcio :mod:`pyxds.channel.grpc_aio_twin` was checked against, that
  channel shares the sync channel's C-core subchannel, so the stream runs
  on the subchannel's own connection, as C-core's does (and the side
  channel is a lean ``grpc_aio_twin.Twin`` whose call is read without
  grpc.aio's call objects); elsewhere it opens a second connection
  (docs/differences-from-c-core.md).  The side channel
  is tied to the subchannel's connection: opened with the first call while
  the subchannel is READY, kept across restarts and retries,
  closed when the subchannel leaves READY, the call is no longer wanted,
  the backend answers UNIMPLEMENTED, or the subchannel shuts down (the
  channel's ``close()`` waits for it as for the subchannel's own
  connection: :attr:`StreamClient.side`).
  A transport without an ``aio_twin`` reads the call on a daemon thread.
* A side connection's channel is watched on the stream loop (no thread,
  no polling): when it leaves READY after it was READY, the connection the
  call ran on is gone (A51: a GOAWAY cancels the stream), even where the
  subchannel's polled state never showed it (the process's connectivity
  monitor does not see an IDLE that RPCs already reconnected between two
  of its checks, :mod:`pyxds.connectivity` rule 1).  The call is cancelled
  and the side closed, as when the subchannel leaves READY; the next call
  starts at once when the subchannel's grpcio channel is READY again (its
  next connection), else when the subchannel reports READY, or after the
  backoff should that report never come (the monitor asked to look at
  once).  Before, such a call stayed on the old connection until the
  server ended it (its GOAWAY grace: by default never).
* The stream is not counted as an RPC of the transport: it never keeps a
  retired connection open.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, ClassVar

import grpc
import grpc.aio

if TYPE_CHECKING:  # subchannel.py imports the users of this module
    from pyxds.channel.subchannel import SubchannelCore

from pyxds.channel import grpc_aio_twin
from pyxds.lb.api import ConnectivityState, Status
from pyxds.xds import stream_loop
from pyxds.xds.backoff import ExponentialBackoff

__all__ = ["Ended", "OnMessage", "Request", "StreamClient"]

_log = logging.getLogger(__name__)

_READY = ConnectivityState.READY
#: a call's end: (code, details); None only for a call that never ran
Ended = Callable[[grpc.StatusCode | None, str], None]
#: a parsed message, handed on from the reading thread
OnMessage = Callable[[Any], None]


class Request:
    """What a call sends and how its messages parse (one small object per
    call: the runners below take it whole)."""

    __slots__ = ("method", "message", "parse")

    def __init__(self, method: str, message: Any, parse: Callable[[bytes], Any]) -> None:
        self.method = method
        #: the request message (anything with ``SerializeToString``)
        self.message = message
        #: raw response bytes -> the message (raises: the call ends)
        self.parse = parse


class StreamClient:
    """The call of one subchannel and its life cycle (module docstring).
    Every method runs on the channel's serializer."""

    __slots__ = (
        "_core",
        "_serializer",
        "_clock",
        "_backoff",
        "_unwatch_core",
        "_generation",
        "_cancel_call",
        "_retry_timer",
        "_unimplemented",
        "_got_message",
        "side",
        "calls_started",
    )

    #: the call's method path
    METHOD: ClassVar[str] = ""

    def __init__(self, core: SubchannelCore) -> None:
        self._core = core
        self._serializer = core._serializer
        self._clock = core._clock
        #: made with the first call that ends without a message (one per
        #: endpoint otherwise, for streams that never fail)
        self._backoff: ExponentialBackoff | None = None
        self._unwatch_core: Callable[[], None] | None = None
        self._generation = 0
        self._cancel_call: Callable[[], object] | None = None
        self._retry_timer: Any = None
        self._unimplemented = False
        self._got_message = False
        #: the side connection a sync subchannel's call runs on (module
        #: docstring); after it closed, the last one, until another opens
        #: (the channel's close() waits for its ``close_done``)
        self.side: stream_loop.LoopChannel | None = None
        self.calls_started = 0  # introspection (tests)

    # -- what a subclass says ---------------------------------------------
    def _wanted(self) -> bool:
        """Whether a call should run while the subchannel is READY."""
        raise NotImplementedError

    def _request(self) -> Any:
        """The request message of the next call."""
        raise NotImplementedError

    def parse(self, raw: bytes) -> Any:
        """A response message from its bytes, on the reading thread; an
        exception ends the call (C-core cancels it), which is then retried."""
        raise NotImplementedError

    def _on_message(self, message: Any) -> None:
        """A parsed message of the running call."""

    def _on_call_start(self) -> None:
        """A call is starting (its request about to be sent)."""

    def _on_backoff(self) -> None:
        """A call ended without a message: the next one waits the backoff."""

    def _on_unimplemented(self, details: str) -> None:
        """The backend answered UNIMPLEMENTED: no call on this connection."""

    def _on_state(self, state: ConnectivityState, status: Status) -> None:
        """The subchannel's connectivity (watched while a call may be wanted)."""
        if state is _READY:
            self._refresh()
        else:
            self._unimplemented = False  # a new connection may serve it
            self._stop()
            self._close_side()

    def _same_call(self) -> bool:
        """Whether the running (or backing-off) call still fits (ORCA: the
        period it asked for)."""
        return True

    # -- life cycle -----------------------------------------------------------
    def _watch_core(self) -> None:
        """Start following the subchannel (reports its state now)."""
        if self._unwatch_core is None:
            self._unwatch_core = self._core.watch(self._on_state)
        else:
            self._refresh()

    def _unwatch(self) -> None:
        """Cancel the call, close the side connection, stop following the
        subchannel."""
        self._stop()
        self._close_side()
        unwatch, self._unwatch_core = self._unwatch_core, None
        if unwatch is not None:
            unwatch()

    def _refresh(self) -> None:
        """Start, restart or keep the call as things stand."""
        if not self._wanted() or self._core.state is not _READY or self._unimplemented:
            self._stop()
            self._close_side()
            return
        if (self._cancel_call is not None or self._retry_timer is not None) and self._same_call():
            return  # running, or backing off: the timer starts it
        self._stop()
        self._start()

    def _stop(self) -> None:
        """End the call and any wait to retry it; the next call is a new
        stream's, with a fresh backoff (module docstring)."""
        self._generation += 1
        if self._backoff is not None:
            self._backoff.reset()
        cancel, self._cancel_call = self._cancel_call, None
        if cancel is not None:
            cancel()
        timer, self._retry_timer = self._retry_timer, None
        if timer is not None:
            timer.cancel()

    def _close_side(self) -> None:
        """Close the side connection (after the call's cancel: the loop runs
        them in that order); the next call opens a new one."""
        if self.side is not None and not self.side.closed:
            self.side.close(wait=False)

    @property
    def running(self) -> bool:
        """Whether a call is running (introspection)."""
        return self._cancel_call is not None

    # -- the call ---------------------------------------------------------------
    def _start(self) -> None:
        transport = self._core.transport
        if transport is None or transport.channel is None:
            return
        channel = transport.channel
        self._generation += 1
        generation = self._generation
        self._got_message = False
        self.calls_started += 1
        self._on_call_start()
        request = Request(self.METHOD, self._request(), self.parse)
        sink = _Sink(self, generation)

        if getattr(transport, "runs_on_event_loop", False):  # an AioTransport
            loop: asyncio.AbstractEventLoop = getattr(transport, "_loop")  # noqa: B009
            spawn = getattr(transport, "spawn")  # noqa: B009
            self._cancel_call = _run_aio(loop, lambda: transport.channel, spawn, request, sink)
            return
        twin = getattr(transport, "aio_twin", None)
        make = twin() if twin is not None else None
        if make is None:
            self._cancel_call = _run_sync(channel, request, sink.message, sink.end)
            return
        if self.side is None or self.side.closed:
            self.side = _open_side(make, self._side_lost_on_loop)
        self._cancel_call = _run_on_side(self.side, request, sink)

    def _side_lost_on_loop(self, side: stream_loop.LoopChannel) -> None:
        """The side connection's channel left READY (on the stream loop)."""
        self._serializer.run(lambda: self._side_lost(side))

    def _side_lost(self, side: stream_loop.LoopChannel) -> None:
        """The connection the call ran on is gone (module docstring)."""
        if side is not self.side or side.closed:
            return  # closed by us meanwhile
        self._stop()
        self._close_side()
        transport = self._core.transport
        if not self._wanted() or self._core.state is not _READY or transport is None:
            return
        if transport.ready_now():
            self._start()  # on its next connection
            return
        transport.suspect()  # the subchannel's report restarts it (_on_state)
        self._retry_after(self._next_delay())

    def _deliver(self, generation: int, message: Any) -> None:
        if generation != self._generation:
            return
        self._got_message = True
        if self._backoff is not None:
            self._backoff.reset()
        self._on_message(message)

    def _ended(self, generation: int, code: grpc.StatusCode | None, details: str) -> None:
        if generation != self._generation:
            return  # cancelled or replaced by us
        self._cancel_call = None
        if code is grpc.StatusCode.UNIMPLEMENTED:
            self._unimplemented = True
            self._close_side()
            self._on_unimplemented(details)
            return
        if not self._wanted() or self._core.state is not _READY:
            return
        if self._got_message:
            delay = 0.0
        else:
            delay = self._next_delay()
            self._on_backoff()
        self._retry_after(delay)

    def _next_delay(self) -> float:
        if self._backoff is None:
            self._backoff = ExponentialBackoff(getattr(self._core._backoff, "_rng", None))
        return self._backoff.next_delay()

    def _retry_after(self, delay: float) -> None:
        generation = self._generation
        self._retry_timer = self._clock.call_later(delay, lambda: self._retry(generation))

    def _retry(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._retry_timer = None
        if self._wanted() and self._core.state is _READY and not self._unimplemented:
            self._start()


class _Sink:
    """Where one call's messages and end go (any thread): onto the channel's
    serializer, tagged with the call's generation."""

    __slots__ = ("_stream", "_generation")

    def __init__(self, stream: StreamClient, generation: int) -> None:
        self._stream = stream
        self._generation = generation

    def message(self, message: Any) -> None:
        stream, generation = self._stream, self._generation
        stream._serializer.run(lambda: stream._deliver(generation, message))

    def end(self, code: grpc.StatusCode | None, details: str) -> None:
        stream, generation = self._stream, self._generation
        stream._serializer.run(lambda: stream._ended(generation, code, details))


def _run_sync(
    channel: grpc.Channel, request: Request, on_message: OnMessage, on_end: Ended
) -> Callable[[], object]:
    """Run the call on a daemon thread (a transport without an ``aio_twin``);
    returns its cancel."""
    stream = channel.unary_stream(
        request.method,
        request_serializer=type(request.message).SerializeToString,
        response_deserializer=request.parse,
    )
    try:
        call = stream(request.message)
    except Exception as err:  # the grpcio channel closed under us
        on_end(grpc.StatusCode.UNAVAILABLE, str(err))
        return lambda: None

    def read() -> None:
        code: grpc.StatusCode | None = grpc.StatusCode.OK
        details = ""
        try:
            for message in call:
                on_message(message)
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
        except Exception as err:
            code, details = grpc.StatusCode.UNKNOWN, str(err)
        on_end(code, details)

    threading.Thread(target=read, name="pyxds-subchannel-stream", daemon=True).start()
    return call.cancel


def _open_side(
    make: Callable[[], Any], on_lost: Callable[[stream_loop.LoopChannel], None]
) -> stream_loop.LoopChannel:
    """A side connection: the ``grpc.aio`` channel ``make()`` makes, on the
    process's stream loop, with its first call's start (lazy: one hand-off
    to the loop per endpoint, not two); ``on_lost(side)`` when its
    connection is gone (:class:`~pyxds.xds.stream_loop.LoopChannel`)."""
    return stream_loop.LoopChannel(make, lazy=True, on_lost=on_lost)


def _run_on_side(
    side: stream_loop.LoopChannel, request: Request, sink: _Sink
) -> Callable[[], None]:
    """Run the call on ``side`` (a reader on the stream loop, which
    ``side.close()`` lets end first); returns its cancel."""
    reader = _Reader(side.loop, side, None, request, sink)
    side.post(reader.start)
    return reader.cancel


def _run_aio(
    loop: asyncio.AbstractEventLoop,
    channel: Callable[[], Any],
    spawn: Callable[[Coroutine[Any, Any, None]], object],
    request: Request,
    sink: _Sink,
) -> Callable[[], None]:
    """Run the call on ``channel()`` (a grpc.aio channel of ``loop``) in a
    task ``spawn`` starts on ``loop``; returns its cancel (any thread)."""
    reader = _Reader(loop, channel, spawn, request, sink)
    if not loop.is_closed():
        loop.call_soon_threadsafe(reader.start)
    return reader.cancel


class _Reader:
    """One call read on an event loop: :meth:`start` (on the loop) runs
    it in a task, :meth:`cancel` (any thread) ends it.  One small object per
    call rather than closures and a dict (issue 18: memory per endpoint).
    Its channel is a side connection's (a ``LoopChannel``: a
    :class:`~pyxds.channel.grpc_aio_twin.Twin`, read by a
    :class:`~pyxds.channel.grpc_aio_twin.UnaryStreamReader` without a task,
    or a grpc.aio channel made the public way, read in a task) or an
    AioTransport's (``source()``, its tasks made by ``spawn``)."""

    __slots__ = (
        "_loop",
        "_source",
        "_spawn",
        "_request",
        "_sink",
        "_cancelled",
        "_call",
        "_parse",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        source: stream_loop.LoopChannel | Callable[[], Any],
        spawn: Callable[[Coroutine[Any, Any, None]], object] | None,
        request: Request,
        sink: _Sink,
    ) -> None:
        self._loop = loop
        self._source = source
        self._spawn = spawn
        self._request: Request | None = request
        #: where its messages and end go (one object, not two bound methods)
        self._sink = sink
        self._cancelled = False
        #: the running call (on the loop), once it started: a Twin's C-core
        #: call or a grpc.aio call
        self._call: Any = None
        #: a Twin's call's messages parse with it (``request.parse``)
        self._parse: Callable[[bytes], Any] | None = None

    def _channel(self) -> Any:
        source = self._source
        if isinstance(source, stream_loop.LoopChannel):
            return source.channel
        return source()

    def _run(self, reader: Coroutine[Any, Any, None]) -> None:
        source = self._source
        if self._spawn is None and isinstance(source, stream_loop.LoopChannel):
            source.spawn(reader)
        else:
            assert self._spawn is not None
            self._spawn(reader)

    def start(self) -> None:
        if self._cancelled:
            return
        channel = self._channel()
        if not isinstance(channel, grpc_aio_twin.Twin):
            self._run(self.read())
            return
        request = self._take_request()
        try:
            call = self._call = channel.call(request.method.encode())
        except Exception as err:  # closed under us
            self.end(grpc.StatusCode.UNKNOWN, str(err))
            return
        self._parse = request.parse
        reader = grpc_aio_twin.UnaryStreamReader(channel, call, self)
        source = self._source
        if isinstance(source, stream_loop.LoopChannel):
            source.track(reader)  # its close lets the reader end first
        reader.start(request.message.SerializeToString())

    def message(self, raw: bytes) -> None:
        """A Twin's call's message, as bytes (``grpc_aio_twin.Sink``)."""
        parse = self._parse
        assert parse is not None
        self._sink.message(parse(raw))

    def end(self, code: grpc.StatusCode, details: str) -> None:
        """The call ended (``grpc_aio_twin.Sink``)."""
        self._call = None
        self._sink.end(code, details)

    def cancel(self) -> None:
        self._cancelled = True
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._cancel_call)

    def _cancel_call(self) -> None:
        call = self._call
        if call is None:
            return
        if isinstance(call, grpc.aio.Call):
            call.cancel()
        else:
            grpc_aio_twin.cancel(call)

    def _take_request(self) -> Request:
        """The request, no longer held here (nor by the reading frame)."""
        request, self._request = self._request, None
        assert request is not None
        return request

    async def read(self) -> None:
        """The call on a grpc.aio channel made the public way."""
        code: grpc.StatusCode | None = grpc.StatusCode.OK
        details = ""
        try:
            aio_channel = self._channel()
            if aio_channel is None:  # closed before it was made
                raise grpc.aio.UsageError("channel closed")
            request = self._take_request()
            call = aio_channel.unary_stream(
                request.method,
                request_serializer=type(request.message).SerializeToString,
            )(request.message)
            self._call = call
            if self._cancelled:
                call.cancel()
            # call.read(), not ``async for`` (pyxds.xds.transport: a
            # suspended response iterator keeps its call, and the
            # connection, alive); messages come as bytes, parsed here so a
            # bad one ends the call as on the lean reader
            while (raw := await call.read()) is not grpc.aio.EOF:
                try:
                    message = request.parse(raw)
                except Exception:
                    call.cancel()
                    raise
                self._sink.message(message)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
        except Exception as err:
            code, details = grpc.StatusCode.UNKNOWN, str(err)
        self._call = None
        self._sink.end(code, details)
