"""Out-of-band ORCA streams on the channel's subchannels (gRFC A51 "Out of
Band Metrics Reporting", "The LB Policy API").

One :class:`OobStream` per :class:`~pyxds.channel.subchannel.SubchannelCore`
(created on the first subscription, :func:`oob_stream_of`), shared by every
LB policy that subscribed through ``ChannelSubchannel.watch_orca_oob``
(reached by :func:`pyxds.lb.orca.watch_oob`).

Rules:

* While there is at least one subscriber and the subchannel is READY, one
  ``xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`` call runs to the
  subchannel's address, asking for the smallest period any subscriber
  wants.  A subscription that changes that minimum restarts the call with
  the new period (the period is fixed when the call starts).
* Every report is delivered to every subscriber, on the channel's work
  serializer, as an ``OrcaLoadReport`` (parsed once).
* The call is cancelled when the subchannel leaves READY (connection lost,
  GOAWAY, shutdown) or the last subscriber leaves.
* A call that ends UNIMPLEMENTED is not retried on that connection: every
  subscriber that gave an ``on_unimplemented`` callback is told why (as is
  one that subscribes later, at once); when a subscriber gave none, it is
  logged at ERROR.  Any other end is retried, after an exponential backoff
  that is reset whenever a report arrives (the next attempt after a call
  that got a report starts at once).  A message that is not an
  ``OrcaLoadReport`` ends its call, so the same rule restarts it (C-core's
  ``SubchannelStreamClient`` cancels the call).
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
  the subchannel is READY, kept across restarts (a new period, a retry),
  closed when the subchannel leaves READY, the last subscriber leaves, the
  backend answers UNIMPLEMENTED, or the subchannel shuts down (the
  channel's ``close()`` waits for it as for the subchannel's own
  connection: :attr:`OobStream.side`).
  A transport without an ``aio_twin`` reads the call on a daemon thread.
* The stream is not counted as an RPC of the transport: it never keeps a
  retired connection open.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from google.protobuf import duration_pb2
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3.orca_pb2 import OrcaLoadReportRequest

if TYPE_CHECKING:  # subchannel.py imports this module: no runtime import back
    from pyxds.channel.subchannel import SubchannelCore

from pyxds.channel import grpc_aio_twin
from pyxds.lb.api import ConnectivityState, Status
from pyxds.lb.unwatch import slot_add, slot_items, slot_remove
from pyxds.xds import stream_loop
from pyxds.xds.backoff import ExponentialBackoff

__all__ = ["METHOD", "OobStream", "oob_stream_of"]

_log = logging.getLogger(__name__)

METHOD = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics"
METHOD_BYTES = METHOD.encode()
_READY = ConnectivityState.READY
Watcher = Callable[[OrcaLoadReport], None]
Unimplemented = Callable[[str], None]
Ended = Callable[[grpc.StatusCode | None, str], None]


def oob_stream_of(core: SubchannelCore) -> OobStream:
    """The OOB stream manager of ``core`` (created on first use)."""
    stream = getattr(core, "orca_oob", None)
    if stream is None:
        stream = OobStream(core)
        core.orca_oob = stream
    return stream


def _request(period: float) -> OrcaLoadReportRequest:
    """The StreamCoreMetrics request for ``period`` seconds, in whole
    milliseconds (rounded down), as grpcio 1.85's C-core asks (its durations
    are milliseconds): 0.0129 s asks 12 ms, 0.0004 s asks zero (the
    service's minimum, A51)."""
    millis = round(period * 1e9) // 1_000_000
    seconds, millis = divmod(millis, 1000)
    return OrcaLoadReportRequest(
        report_interval=duration_pb2.Duration(seconds=seconds, nanos=millis * 1_000_000)
    )


class OobStream:
    """The subscribers of one subchannel and the call serving them (module
    docstring).  Every method runs on the channel's serializer."""

    __slots__ = (
        "_core",
        "_serializer",
        "_clock",
        "_backoff",
        "_watchers",
        "_unimplemented_details",
        "_unwatch_core",
        "_generation",
        "_cancel_call",
        "_period",
        "_retry_timer",
        "_unimplemented",
        "_got_report",
        "side",
        "calls_started",
    )

    def __init__(self, core: SubchannelCore) -> None:
        self._core = core
        self._serializer = core._serializer
        self._clock = core._clock
        #: made with the first call that ends without a report (one per
        #: endpoint otherwise, for streams that never fail)
        self._backoff: ExponentialBackoff | None = None
        #: the subscriptions, in the order made: None, one (nearly always:
        #: the endpoint's one policy), or a tuple of two or more (replaced,
        #: never changed in place; no dict per endpoint, issue 18)
        self._watchers: _Subscription | tuple[_Subscription, ...] | None = None
        self._unimplemented_details = ""
        self._unwatch_core: Callable[[], None] | None = None
        self._generation = 0
        self._cancel_call: Callable[[], object] | None = None
        self._period: float | None = None
        self._retry_timer: Any = None
        self._unimplemented = False
        self._got_report = False
        #: the side connection a sync subchannel's call runs on (module
        #: docstring); after it closed, the last one, until another opens
        #: (the channel's close() waits for its ``close_done``)
        self.side: stream_loop.LoopChannel | None = None
        self.calls_started = 0  # introspection (tests)

    # -- subscribers --------------------------------------------------------
    def add(
        self, period: float, fn: Watcher, on_unimplemented: Unimplemented | None = None
    ) -> Callable[[], None]:
        subscription = _Subscription(self, max(0.0, float(period)), fn, on_unimplemented)
        self._watchers = slot_add(self._watchers, subscription)
        if on_unimplemented is not None and self._unimplemented:
            on_unimplemented(self._unimplemented_details)
        if self._unwatch_core is None:
            self._unwatch_core = self._core.watch(self._on_state)  # reports the state now
        else:
            self._refresh()
        return subscription

    def _remove(self, subscription: _Subscription) -> None:
        if subscription not in self._subscriptions():
            return
        self._watchers = slot_remove(self._watchers, subscription)
        if self._watchers is not None:
            self._refresh()
            return
        self._stop()
        self._close_side()
        unwatch, self._unwatch_core = self._unwatch_core, None
        if unwatch is not None:
            unwatch()

    def close(self) -> None:
        """The subchannel shut down: cancel the call, forget every subscriber
        (A51: no need to wait for the call's status)."""
        self._watchers = None
        self._stop()
        self._close_side()
        unwatch, self._unwatch_core = self._unwatch_core, None
        if unwatch is not None:
            unwatch()

    @property
    def period(self) -> float | None:
        """The period of the running call (None: no call)."""
        return self._period if self._cancel_call is not None else None

    def _wanted_period(self) -> float:
        return min(watch.period for watch in self._subscriptions())

    def _subscriptions(self) -> tuple[_Subscription, ...]:
        return slot_items(self._watchers)

    # -- subchannel state -----------------------------------------------------
    def _on_state(self, state: ConnectivityState, status: Status) -> None:
        if state is _READY:
            self._refresh()
        else:
            self._unimplemented = False  # a new connection may serve it
            self._stop()
            self._close_side()

    def _refresh(self) -> None:
        """Start, restart (new period) or keep the call as things stand."""
        if not self._watchers or self._core.state is not _READY or self._unimplemented:
            self._stop()
            self._close_side()
            return
        period = self._wanted_period()
        if self._cancel_call is not None and self._period == period:
            return
        if self._retry_timer is not None and self._period == period:
            return  # backing off: the timer starts it
        self._stop()
        self._start(period)

    def _stop(self) -> None:
        self._generation += 1
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

    # -- the call ---------------------------------------------------------------
    def _start(self, period: float) -> None:
        transport = self._core.transport
        if transport is None or transport.channel is None:
            return
        channel = transport.channel
        self._generation += 1
        generation = self._generation
        self._period = period
        self._got_report = False
        self.calls_started += 1
        request = _request(period)
        sink = _Sink(self, generation)
        on_report, on_end = sink.report, sink.end

        if getattr(transport, "runs_on_event_loop", False):  # an AioTransport
            loop: asyncio.AbstractEventLoop = getattr(transport, "_loop")  # noqa: B009
            self._cancel_call = _run_aio(
                loop, lambda: transport.channel, loop.create_task, request, on_report, on_end
            )
            return
        twin = getattr(transport, "aio_twin", None)
        make = twin() if twin is not None else None
        if make is None:
            self._cancel_call = _run_sync(channel, request, on_report, on_end)
            return
        if self.side is None or self.side.closed:
            self.side = _open_side(make)
        self._cancel_call = _run_on_side(self.side, request, on_report, on_end)

    def _deliver(self, generation: int, report: OrcaLoadReport) -> None:
        if generation != self._generation:
            return
        self._got_report = True
        if self._backoff is not None:
            self._backoff.reset()
        for watch in self._subscriptions():
            try:
                watch.fn(report)
            except Exception:
                _log.exception("pyxds: ORCA OOB watcher raised")

    def _ended(self, generation: int, code: grpc.StatusCode | None, details: str) -> None:
        if generation != self._generation:
            return  # cancelled or replaced by us
        self._cancel_call = None
        if code is grpc.StatusCode.UNIMPLEMENTED:
            self._unimplemented = True
            self._unimplemented_details = details
            self._close_side()
            subscriptions = self._subscriptions()
            told = [s.on_unimplemented for s in subscriptions if s.on_unimplemented is not None]
            if len(told) < len(subscriptions):
                _log.error(
                    "pyxds: %s does not implement OpenRcaService (%s); no out-of-band "
                    "load reports on this connection",
                    self._core.address,
                    details,
                )
            for fn in told:
                try:
                    fn(details)
                except Exception:
                    _log.exception("pyxds: ORCA OOB on_unimplemented raised")
            return
        if not self._watchers or self._core.state is not _READY:
            return
        if self._got_report:
            delay = 0.0
        else:
            if self._backoff is None:
                self._backoff = ExponentialBackoff(getattr(self._core._backoff, "_rng", None))
            delay = self._backoff.next_delay()
        period = self._period
        self._retry_timer = self._clock.call_later(delay, lambda: self._retry(generation, period))

    def _retry(self, generation: int, period: float | None) -> None:
        if generation != self._generation:
            return
        self._retry_timer = None
        if self._watchers and self._core.state is _READY and not self._unimplemented:
            self._start(self._wanted_period())


class _Subscription:
    """One subscriber of an :class:`OobStream`: its period, watcher and
    ``on_unimplemented``; calling it unsubscribes (any thread).  A slotted
    object, not a closure, a token and a tuple in a dict (issue 18: memory
    per endpoint)."""

    __slots__ = ("_stream", "period", "fn", "on_unimplemented")

    def __init__(
        self,
        stream: OobStream,
        period: float,
        fn: Watcher,
        on_unimplemented: Unimplemented | None,
    ) -> None:
        self._stream = stream
        self.period = period
        self.fn = fn
        self.on_unimplemented = on_unimplemented

    def __call__(self) -> None:
        stream = self._stream
        stream._serializer.run(lambda: stream._remove(self))


class _Sink:
    """Where one call's reports and end go (any thread): onto the channel's
    serializer, tagged with the call's generation."""

    __slots__ = ("_stream", "_generation")

    def __init__(self, stream: OobStream, generation: int) -> None:
        self._stream = stream
        self._generation = generation

    def report(self, report: OrcaLoadReport) -> None:
        stream, generation = self._stream, self._generation
        stream._serializer.run(lambda: stream._deliver(generation, report))

    def end(self, code: grpc.StatusCode | None, details: str) -> None:
        stream, generation = self._stream, self._generation
        stream._serializer.run(lambda: stream._ended(generation, code, details))


def _run_sync(
    channel: grpc.Channel, request: OrcaLoadReportRequest, on_report: Watcher, on_end: Ended
) -> Callable[[], object]:
    """Run the call on a daemon thread (a transport without an ``aio_twin``);
    returns its cancel."""
    stream = channel.unary_stream(
        METHOD,
        request_serializer=OrcaLoadReportRequest.SerializeToString,
        response_deserializer=OrcaLoadReport.FromString,
    )
    try:
        call = stream(request)
    except Exception as err:  # the grpcio channel closed under us
        on_end(grpc.StatusCode.UNAVAILABLE, str(err))
        return lambda: None

    def read() -> None:
        code: grpc.StatusCode | None = grpc.StatusCode.OK
        details = ""
        try:
            for report in call:
                on_report(report)
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
        except Exception as err:
            code, details = grpc.StatusCode.UNKNOWN, str(err)
        on_end(code, details)

    threading.Thread(target=read, name="pyxds-orca-oob", daemon=True).start()
    return call.cancel


def _open_side(make: Callable[[], Any]) -> stream_loop.LoopChannel:
    """A side connection: the ``grpc.aio`` channel ``make()`` makes, on the
    process's stream loop, with its first call's start (lazy: one hand-off
    to the loop per endpoint, not two)."""
    return stream_loop.LoopChannel(make, lazy=True)


def _run_on_side(
    side: stream_loop.LoopChannel, request: OrcaLoadReportRequest, on_report: Watcher, on_end: Ended
) -> Callable[[], None]:
    """Run the call on ``side`` (a reader task on the stream loop, which
    ``side.close()`` lets end first); returns its cancel."""
    reader = _Reader(side.loop, side, None, request, on_report, on_end)
    side.post(reader.start)
    return reader.cancel


def _run_aio(
    loop: asyncio.AbstractEventLoop,
    channel: Callable[[], Any],
    spawn: Callable[[Coroutine[Any, Any, None]], object],
    request: OrcaLoadReportRequest,
    on_report: Watcher,
    on_end: Ended,
) -> Callable[[], None]:
    """Run the call on ``channel()`` (a grpc.aio channel of ``loop``) in a
    task ``spawn`` starts on ``loop``; returns its cancel (any thread)."""
    reader = _Reader(loop, channel, spawn, request, on_report, on_end)
    if not loop.is_closed():
        loop.call_soon_threadsafe(reader.start)
    return reader.cancel


class UnparsedReport(ValueError):
    """A stream message that is not an ``OrcaLoadReport``: as in C-core
    (``SubchannelStreamClient``), the call is cancelled and the stream
    restarts, at once when the call had delivered a report, else after the
    backoff."""

    def __init__(self, cause: object) -> None:
        super().__init__(f"an out-of-band ORCA report did not parse: {cause}")


class _Reader:
    """One OOB call read on an event loop: :meth:`start` (on the loop) runs
    it in a task, :meth:`cancel` (any thread) ends it.  One small object per
    call rather than closures and a dict (issue 18: memory per endpoint).
    Its channel is a side connection's (a ``LoopChannel``: a
    :class:`~pyxds.channel.grpc_aio_twin.Twin`, read by
    :func:`~pyxds.channel.grpc_aio_twin.read_unary_stream` as the task
    itself, or a grpc.aio channel made the public way) or an AioTransport's
    (``source()``, its tasks made by ``spawn``)."""

    __slots__ = (
        "_loop",
        "_source",
        "_spawn",
        "_request",
        "_on_report",
        "_on_end",
        "_cancelled",
        "_call",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        source: stream_loop.LoopChannel | Callable[[], Any],
        spawn: Callable[[Coroutine[Any, Any, None]], object] | None,
        request: OrcaLoadReportRequest,
        on_report: Watcher,
        on_end: Ended,
    ) -> None:
        self._loop = loop
        self._source = source
        self._spawn = spawn
        self._request: OrcaLoadReportRequest | None = request
        self._on_report = on_report
        self._on_end = on_end
        self._cancelled = False
        #: the running call (on the loop), once it started: a Twin's C-core
        #: call or a grpc.aio call
        self._call: Any = None

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
        try:
            call = self._call = channel.call(METHOD_BYTES)
        except Exception as err:  # closed under us
            self._ended(grpc.StatusCode.UNKNOWN, str(err))
            return
        request = self._take_request().SerializeToString()
        self._run(
            grpc_aio_twin.read_unary_stream(channel, call, request, self._on_raw, self._ended)
        )

    def _ended(self, code: grpc.StatusCode, details: str) -> None:
        self._call = None
        self._on_end(code, details)

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

    def _take_request(self) -> OrcaLoadReportRequest:
        """The request, no longer held here (nor by the reading frame)."""
        request, self._request = self._request, None
        assert request is not None
        return request

    def _on_raw(self, raw: bytes) -> None:
        try:
            report = OrcaLoadReport.FromString(raw)
        except Exception as err:
            # C-core's rule: the call is cancelled and the stream restarts
            # (at once after a report on this call, else after the backoff);
            # read_unary_stream cancels the call on this error
            _log.warning("pyxds: an out-of-band ORCA report did not parse (%s)", err)
            raise UnparsedReport(err) from err
        self._on_report(report)

    async def read(self) -> None:
        """The call on a grpc.aio channel made the public way."""
        code: grpc.StatusCode | None = grpc.StatusCode.OK
        details = ""
        try:
            aio_channel = self._channel()
            if aio_channel is None:  # closed before it was made
                raise grpc.aio.UsageError("channel closed")
            call = aio_channel.unary_stream(
                METHOD,
                request_serializer=OrcaLoadReportRequest.SerializeToString,
                response_deserializer=OrcaLoadReport.FromString,
            )(self._take_request())
            self._call = call
            if self._cancelled:
                call.cancel()
            # call.read(), not ``async for`` (pyxds.xds.transport: a
            # suspended response iterator keeps its call, and the
            # connection, alive)
            while (report := await call.read()) is not grpc.aio.EOF:
                if report is None:  # grpc.aio logged why it did not parse
                    call.cancel()
                    raise UnparsedReport("not an OrcaLoadReport")
                self._on_report(report)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
        except Exception as err:
            code, details = grpc.StatusCode.UNKNOWN, str(err)
        self._call = None
        self._on_end(code, details)
