"""Call objects of the sync channel: what users' code holds.

* :func:`blocking_unary`: ``__call__`` / ``with_call`` of the unary-response
  kinds, on the caller's thread.
* :class:`DeferredCall`: a non-blocking RPC (``future()``, and the streaming
  calls) whose pick may have to wait.  It returns at once; once picked it
  delegates to the grpcio call object on the subchannel; before that, and
  when the channel failed it, it answers from its own state.
* :class:`ChannelRpcError`: an RPC the channel itself ended (no route, a
  pick failure or drop, deadline while queued, channel closed).  A real
  ``grpc.RpcError`` that is also a ``grpc.Call`` and a ``grpc.Future``, like
  grpcio's own ``_InactiveRpcError``: ``code()``, ``details()``, empty
  metadata.
* :class:`RequestReplay`: the thread face of a client stream's request buffer.

These are the thread adapters of :class:`pyxds.channel.rpc.Rpc` (the
asyncio calls are its other adapters): the RPC decides every step (pick,
attempt, retry and its backoff, the end); an adapter waits its way (a
blocking thread waits for the channel's next publication and sleeps its
backoffs; a non-blocking call registers a wake-up and arms timers), starts
the grpcio call the RPC names (:meth:`GrpcMethod.start`) and tells the RPC
how it ended.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc

from pyxds.channel import grpc_generic
from pyxds.channel.grpc_calls import (
    SERIALIZE_FAILED,
    GrpcMethod,
    call_metadata,
    stream_status,
    unary_status,
)
from pyxds.channel.request_buffer import (
    PULL,
    RETIRED,
    RETRY_BUFFER_SIZE,
    BufferView,
    Replay,
    RequestBuffer,
)
from pyxds.channel.response_metadata import CallWithMetadata, ResponseAdditions, additions_of
from pyxds.channel.rpc import CANCELLED, DEADLINE_EXCEEDED, Rpc
from pyxds.channel.subchannel import Transport
from pyxds.lb.api import OK_STATUS, Status

_Response = TypeVar("_Response")

__all__ = [
    "SERIALIZE_FAILED",
    "ChannelRpcError",
    "DeferredCall",
    "FutureCall",
    "RequestReplay",
    "StreamingCall",
    "blocking_unary",
]


class RequestReplay(Replay):
    """The thread face of a client-streaming RPC's
    :class:`~pyxds.channel.request_buffer.RequestBuffer` (its rules): each attempt
    iterates :meth:`attempt`; requests are taken from the user's iterator
    (``iter()`` at the first pull, as grpcio) one pull at a time."""

    def __init__(self, requests: Iterable[Any], limit: int = RETRY_BUFFER_SIZE) -> None:
        self._requests = requests
        self._source: Iterator[Any] | None = None
        self.buffer = RequestBuffer(limit)
        self._lock = threading.Lock()  # the buffer
        self._pull_lock = threading.Lock()  # one pull from the source at a time

    def can_retry(self) -> bool:
        return self.buffer.recording

    def commit(self) -> None:
        self.buffer.commit()

    def attempt(self) -> Iterator[Any]:
        """The request iterator of a new attempt (retires the previous one)."""
        with self._lock:
            return _AttemptRequests(self, self.buffer.view())

    def _next(self, view: BufferView) -> Any:
        with self._pull_lock:
            with self._lock:
                item = self.buffer.next_kept(view)
            if item is RETIRED:
                raise StopIteration
            if item is not PULL:
                return item
            if self._source is None:
                self._source = iter(self._requests)
            item = next(self._source)  # StopIteration: the requests ended
            with self._lock:
                # a retired view hands it to its dead call; the buffer keeps it
                self.buffer.taken(view, item)
            return item


class _AttemptRequests:
    __slots__ = ("_replay", "_view")

    def __init__(self, replay: RequestReplay, view: BufferView) -> None:
        self._replay = replay
        self._view = view

    def __iter__(self) -> _AttemptRequests:
        return self

    def __next__(self) -> Any:
        return self._replay._next(self._view)


def status_of(call: Any) -> Status:
    try:
        code = call.code()
        details = call.details()
    except Exception:
        return Status(grpc.StatusCode.UNKNOWN, "call ended without status")
    return Status(code if code is not None else grpc.StatusCode.UNKNOWN, details or "")


def _traceback_of(error: grpc.RpcError) -> Any:
    """The traceback of raising ``error``, as grpcio's failed calls give."""
    try:
        raise error
    except grpc.RpcError:
        return sys.exc_info()[2]


class _EndedCall(grpc_generic.CallFuture[Any]):
    """A call the channel ended itself (``status``), before or instead of a
    subchannel call: the grpc.Call and grpc.Future of a finished call."""

    def __init__(
        self, status: Status, initial_metadata: Any = (), trailing_metadata: Any = ()
    ) -> None:
        super().__init__()
        self._status = status
        self._initial_metadata = initial_metadata
        self._trailing_metadata = trailing_metadata

    # grpc.Call / grpc.RpcContext
    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return self._status.details

    def initial_metadata(self) -> Any:
        return self._initial_metadata

    def trailing_metadata(self) -> Any:
        return self._trailing_metadata

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:  # type: ignore[override]  # None: no deadline, as grpcio
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    # grpc.Future
    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def add_done_callback(self, fn: Callable[[grpc.Future[Any]], None]) -> None:
        fn(self)

    # iterator protocol, for a streaming call
    def __iter__(self) -> _EndedCall:
        return self


def _ended_text(kind: str, status: Status) -> str:
    """How grpcio prints a failed call (``_InactiveRpcError`` for a blocking
    call's error, ``_MultiThreadedRendezvous`` for a future or a response
    stream), with its debug_error_string line."""
    return (
        f"<{kind} of RPC that terminated with:\n"
        f'\tstatus = {status.code}\n\tdetails = "{status.details}"\n'
        f'\tdebug_error_string = "{_debug_text(status)}"\n>'
    )


def _debug_text(status: Status) -> str:
    """grpcio 1.85's debug_error_string of a call the channel failed:
    ``CODE:details`` (e.g. "DEADLINE_EXCEEDED:Deadline Exceeded")."""
    return f"{status.code.name}:{status.details}"


class ChannelRpcError(_EndedCall, grpc.RpcError):
    """An RPC failed by the channel, before or instead of a subchannel call."""

    def debug_error_string(self) -> str:
        return _debug_text(self._status)

    def result(self, timeout: float | None = None) -> NoReturn:
        raise self

    def exception(self, timeout: float | None = None) -> Exception:
        return self

    def traceback(self, timeout: float | None = None) -> Any:
        return _traceback_of(self)

    def __next__(self) -> NoReturn:
        raise self

    def __str__(self) -> str:
        return _ended_text("_InactiveRpcError", self._status)

    __repr__ = __str__


class OkEndCall(_EndedCall):
    """An RPC the channel ended with OK before any attempt (A33's OK abort:
    gRPC "will react as if it has immediately received trailing metadata
    from the server with the status OK"): it stands in for the grpcio call
    never made, finished as grpcio's is when a server answers OK with
    trailers only: response None, no streamed responses, details ""."""

    def __init__(self) -> None:
        super().__init__(OK_STATUS)

    def debug_error_string(self) -> str:
        return ""

    def result(self, timeout: float | None = None) -> None:
        return None

    def exception(self, timeout: float | None = None) -> None:
        return None

    def traceback(self, timeout: float | None = None) -> None:
        return None

    def __next__(self) -> Any:
        raise StopIteration


class DeferredCall(grpc.RpcError, grpc_generic.CallFuture[_Response]):
    """A non-blocking RPC: the thread-and-timer adapter of its
    :class:`~pyxds.channel.rpc.Rpc`.

    ``_unary_response``: the call has one response (``future()``).

    Each attempt starts with ``method.start(transport, rpc, request, ...,
    verb)`` (``future()`` for unary responses, the call itself for
    streams) on the picked subchannel's grpcio channel.  Picks run on
    whichever thread publishes (or the caller's), under the call's lock; a
    queued pick registers a wake-up with the channel and a timer at the
    deadline; a wait (a fault delay, a backoff) is a timer on the deadline
    clock; the grpcio call's terminal callback reports each attempt's end.
    Until a subchannel call exists, and when the channel failed the RPC, it
    answers from its own state; then it delegates to the grpcio call.
    """

    _unary_response = False

    def __str__(self) -> str:
        """As grpcio's ``_MultiThreadedRendezvous`` once ended (the
        channel's status first: it may reword the attempt's, as
        ``unary_status``'s "Channel closed!" over the subchannel call's
        "Stream removed (...)"), the subchannel call's while it runs, else
        ``<pyxds FutureCall (pick pending)>`` (or ``StreamingCall``)."""
        if self._error is not None:
            return _ended_text("_MultiThreadedRendezvous", self._error._status)
        inner = self._inner
        if inner is not None:
            return str(inner)
        return f"<pyxds {self.__class__.__name__} (pick pending)>"

    def __init__(
        self,
        rpc: Rpc,
        method: GrpcMethod,
        request: Any,
        credentials: Any,
        compression: Any,
        verb: str | None = None,
        serialized: bool = False,
        *,
        channel: object = None,
    ) -> None:
        self._rpc = rpc
        #: the channel the call came from, held until the call ends (as a
        #: grpcio call holds its channel): a call may outlive the channel
        #: and multicallable the program dropped, which the lifecycle
        #: reaper would close (and so cancel the call) once they went.
        #: Keyword-only: an exception keeps its positional arguments
        #: (``args``), which would hold the channel as long as the call.
        self._channel = channel
        self._method = method
        self._request = request
        self._credentials = credentials
        self._compression = compression
        self._verb = verb
        self._serialized = serialized
        self._cond = threading.Condition()
        self._inner: Any = None
        self._error: ChannelRpcError | None = None
        self._terminated = False
        self._cancelled_inner = False
        self._done_callbacks: list[Callable[[grpc.Future[_Response]], None]] = []
        self._callbacks: list[Callable[[], None]] = []
        # the pending pick: its wake-up (registered with the channel) and timers
        self._waker: Callable[[], None] | None = None
        self._timer: Any = None  # at the deadline, while queued
        self._hold: Any = None  # a wait before the next pick
        self._grace: Any = None  # the end of a stale picker's grace, while queued
        self._picking = False  # rpc.pick() running (under the lock)
        self._additions: ResponseAdditions | bool | None = False  # False: not looked up
        self._pick()

    # -- picking ---------------------------------------------------------
    def _pick(self) -> None:
        """Pick for the next attempt; a queued pick waits for the channel's
        next publication (then this runs again), bounded by the deadline."""
        waker = self._waker = self._wake_once()
        self._repick(waker)

    def _wake_once(self) -> Callable[[], None]:
        def waker() -> None:
            self._repick(waker)

        return waker

    def _repick(self, waker: Callable[[], None]) -> None:
        rpc = self._rpc
        core = rpc.core
        with self._cond:
            if self._picking:
                # a publication made inside our own pick (this thread holds
                # the lock): the pick in progress sees the new generation
                # when it registers, and picks again then
                return
            while True:
                if waker is not self._waker or rpc.done:
                    return  # a stale wake-up, or over
                generation = core.generation
                self._picking = True
                try:
                    step = rpc.pick()
                finally:
                    self._picking = False
                if step is None:
                    remaining = rpc.remaining()
                    if remaining is not None and remaining <= 0:
                        step = rpc.finish(DEADLINE_EXCEEDED)
                        break
                    if not core.add_waiter(generation, waker):
                        continue  # published meanwhile: pick again now
                    if remaining is not None and self._timer is None:
                        self._timer = core.deadline_clock.call_later(remaining, self._expire)
                    left = rpc.stale_grace_left()
                    if (
                        self._grace is None
                        and left is not None
                        and (remaining is None or left < remaining)
                    ):
                        self._grace = core.deadline_clock.call_later(
                            left, lambda: self._grace_over(waker)
                        )
                    return
                if step.__class__ is float:
                    self._hold = core.deadline_clock.call_later(step, waker)  # type: ignore[arg-type]
                    return
                break
            self._waker = None
            timer, self._timer = self._timer, None
            grace, self._grace = self._grace, None
        for pending in (timer, grace):
            if pending is not None:
                pending.cancel()
        if step.__class__ is Status:
            self._fail(step)  # type: ignore[arg-type]
        else:
            self._start(step)  # type: ignore[arg-type]

    def _grace_over(self, waker: Callable[[], None]) -> None:
        """A stale picker's grace ended while the pick was queued
        (``Rpc.queue_wait``): pick again without waiting for a publication."""
        with self._cond:
            self._grace = None
            if waker is not self._waker or self._rpc.done:
                return
            self._rpc.stale_wait_over()
        self._rpc.core.remove_waiter(waker)
        self._repick(waker)

    def _expire(self) -> None:
        """The deadline came while the pick was queued."""
        with self._cond:
            waker, self._waker = self._waker, None
            self._timer = None
            grace, self._grace = self._grace, None
            if waker is None or self._rpc.done:
                return
            status = self._rpc.finish(DEADLINE_EXCEEDED)
        if grace is not None:
            grace.cancel()
        self._rpc.core.remove_waiter(waker)
        self._fail(status)

    def _stop_picking(self) -> None:
        with self._cond:
            waker, self._waker = self._waker, None
            timer, self._timer = self._timer, None
            hold, self._hold = self._hold, None
            grace, self._grace = self._grace, None
        for pending in (timer, hold, grace):
            if pending is not None:
                pending.cancel()
        if waker is not None:
            self._rpc.core.remove_waiter(waker)

    # -- attempts --------------------------------------------------------
    def _start(self, transport: Transport) -> None:
        """Start the attempt the RPC picked ``transport`` for."""
        rpc = self._rpc
        try:
            inner = self._method.start(
                transport,
                rpc,
                self._request,
                self._credentials,
                self._compression,
                self._verb,
                self._serialized,
            )
        except grpc.RpcError as err:  # e.g. grpcio's "Exception serializing request!"
            transport.call_finished()
            with self._cond:
                status = rpc.finish(status_of(err))
            self._fail(status)
            return
        except Exception as err:
            with self._cond:
                not_sent = rpc.start_failed(transport)
                if not not_sent:
                    status = rpc.finish(
                        Status(grpc.StatusCode.INTERNAL, f"failed to start call: {err}")
                    )
            if not_sent:
                self._pick()  # the grpcio channel closed under us: not sent
            else:
                self._fail(status)
            return
        with self._cond:
            self._inner = inner
            self._cond.notify_all()
        if rpc.cancelled:
            inner.cancel()
        if not inner.add_callback(lambda: self._inner_terminated(inner, transport)):
            self._inner_terminated(inner, transport)  # already over

    def _ended(self, inner: Any, status: Status) -> float | None:
        """The RPC's answer to the end of the subchannel call ``inner``
        (whichever of its terminal callback and a reader of its responses
        sees it first decides)."""
        with self._cond:
            method = None if self._serialized else self._method
            return self._rpc.ended(inner, status, call_metadata, self._request, method)

    def _next_attempt(self, delay: float) -> None:
        """Pick again for the next attempt, after ``delay`` seconds."""
        if delay <= 0:
            self._pick()
            return
        waker = self._waker = self._wake_once()
        self._hold = self._rpc.core.deadline_clock.call_later(delay, waker)

    def _inner_terminated(self, inner: Any, transport: Transport) -> None:
        transport.call_finished()
        status = status_of(inner)
        delay = self._ended(inner, status)
        if delay is not None:
            with self._cond:
                self._inner = None
            self._next_attempt(delay)
            return
        # the response headers, read without waiting: this is grpcio's
        # callback thread, which would deliver them (None: none came; a call
        # cancelled before them, e.g. by close(), waited here forever)
        headers = getattr(getattr(inner, "_state", None), "initial_metadata", None)
        if self._unary_response:
            worded = unary_status(status)
            if worded is not status:
                with self._cond:
                    self._error = ChannelRpcError(worded, headers or (), inner.trailing_metadata())
        else:
            worded = stream_status(status, self._rpc.committed, bool(headers))
            if worded is not status:
                with self._cond:
                    self._error = ChannelRpcError(worded, (), inner.trailing_metadata())
        self._terminate()

    def _fail(self, status: Status) -> None:
        """The RPC is over with ``status`` (already finished) before or
        instead of a subchannel call (OK: A33's OK abort, an ended call
        stands in for the attempt, :class:`OkEndCall`)."""
        with self._cond:
            if self._terminated or self._error is not None:
                return
            if status.code is grpc.StatusCode.OK:
                self._inner = OkEndCall()
            else:
                self._error = ChannelRpcError(status)
            self._cond.notify_all()
        self._terminate()

    def _terminate(self) -> None:
        with self._cond:
            self._terminated = True
            self._cond.notify_all()
            done_callbacks, self._done_callbacks = self._done_callbacks, []
            callbacks, self._callbacks = self._callbacks, []
            # over: a dropped channel may go now, even while this call is
            # kept (grpcio's closes once its last call ended), but not
            # under the lock, nor before the callbacks ran
            channel, self._channel = self._channel, None
        for cb in callbacks:
            try:
                cb()
            except Exception:
                pass
        for fn in done_callbacks:
            try:
                fn(self)
            except Exception:
                pass
        del channel

    def _wait_started(self, timeout: float | None = None, after: Any = None) -> Any:
        """Block until the subchannel call exists (returned; ``after``: one
        other than that retried one) or the channel failed the RPC (raises
        its error)."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: (
                    (self._inner is not None and self._inner is not after)
                    or self._error is not None
                    or self._terminated
                ),
                timeout,
            ):
                raise grpc.FutureTimeoutError()
            if self._error is not None:
                raise self._error
            return self._inner

    def _wait_terminated(self, timeout: float | None) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._terminated or self._cancelled_inner, timeout):
                raise grpc.FutureTimeoutError()

    # -- grpc.Future ---------------------------------------------------
    def cancel(self) -> bool:
        with self._cond:
            if self._terminated or self._cancelled_inner:
                return False
            self._rpc.cancel()
            inner = self._inner
        if inner is not None:
            # grpcio's call is over at cancel() (done() says so at once; its
            # callbacks run when the call's end arrives, as here; a
            # SingleThreadedUnaryStream call's only when it is read): the
            # readers waiting for the end read the cancelled call now
            cancelled: bool = inner.cancel()
            with self._cond:
                self._cancelled_inner = cancelled
                self._cond.notify_all()
            return cancelled
        # still queued: stop picking and fail it now
        self._stop_picking()
        with self._cond:
            status = self._rpc.finish(CANCELLED)
        self._fail(status)
        return True

    def cancelled(self) -> bool:
        with self._cond:
            if self._error is not None:
                return self._error.code() is grpc.StatusCode.CANCELLED and self._rpc.cancelled
            inner = self._inner
        return inner.cancelled() if inner is not None else False

    def running(self) -> bool:
        return not self.done()

    def done(self) -> bool:
        return self._terminated or self._cancelled_inner

    def _raise_if_cancelled(self) -> None:
        """grpcio: a future cancelled by the application has no outcome."""
        if self._error is not None and self.cancelled():
            raise grpc.FutureCancelledError()

    def _response_additions(self) -> ResponseAdditions | None:
        """The RPC's response metadata additions (A55 set-cookie), if any."""
        if self._additions is False:
            self._additions = additions_of(self._rpc)
        return self._additions  # type: ignore[return-value]  # False was replaced just above

    def result(self, timeout: float | None = None) -> _Response:
        # a failed call raises itself, as grpcio's future does (the
        # application may compare it with the future; its code, details
        # and metadata readers are this call's)
        self._wait_terminated(timeout)
        self._raise_if_cancelled()
        if self._error is not None:
            raise self
        try:
            response: _Response = self._inner.result()
        except grpc.RpcError:
            raise self from None
        return response

    def exception(self, timeout: float | None = None) -> Any:
        self._wait_terminated(timeout)
        self._raise_if_cancelled()
        if self._error is not None:
            return self
        return None if self._inner.exception() is None else self

    def traceback(self, timeout: float | None = None) -> Any:
        self._wait_terminated(timeout)
        self._raise_if_cancelled()
        if self._error is not None:
            return _traceback_of(self._error)
        return self._inner.traceback()

    def add_done_callback(self, fn: Callable[[grpc.Future[_Response]], None]) -> None:
        with self._cond:
            if not self.done():
                self._done_callbacks.append(fn)
                return
        fn(self)

    # -- grpc.Call -----------------------------------------------------
    def is_active(self) -> bool:
        return not self.done()

    def time_remaining(self) -> float | None:  # type: ignore[override]  # None: no deadline, as grpcio
        remaining = self._rpc.remaining()
        return None if remaining is None else max(remaining, 0)  # as grpcio

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._cond:
            if self._terminated:
                return False
            self._callbacks.append(callback)
            return True

    def initial_metadata(self) -> Any:
        try:
            inner = self._wait_started()
        except ChannelRpcError as err:
            return err.initial_metadata()
        metadata = inner.initial_metadata()
        additions = self._response_additions()
        if additions is not None:
            metadata = additions.initial(metadata, inner.code() if inner.done() else None)
        return metadata

    def trailing_metadata(self) -> Any:
        self._wait_terminated(None)
        if self._error is not None:
            return self._error.trailing_metadata()
        inner = self._inner
        additions = self._response_additions()
        if additions is None:
            return inner.trailing_metadata()
        return additions.trailing(inner.trailing_metadata(), inner.initial_metadata(), inner.code())

    def code(self) -> grpc.StatusCode:
        self._wait_terminated(None)
        if self._error is not None:
            return self._error.code()
        code: grpc.StatusCode = self._inner.code()
        return code

    def details(self) -> str:
        self._wait_terminated(None)
        if self._error is not None:
            return self._error.details()
        return str(self._inner.details())

    def debug_error_string(self) -> str:
        self._wait_terminated(None)
        if self._error is not None:
            return self._error.debug_error_string()
        return str(self._inner.debug_error_string())


class StreamingCall(DeferredCall[_Response], grpc_generic.CallIterator[_Response]):
    """A response-streaming call (unary_stream, stream_stream): an iterator
    of responses that is also a grpc.Call and grpc.Future."""

    def __iter__(self) -> StreamingCall[_Response]:
        return self

    def __next__(self) -> _Response:
        # a failed stream raises itself, as grpcio's response iterator does
        try:
            inner = self._wait_started()
        except ChannelRpcError:
            raise self from None
        while True:
            try:
                response = next(inner)
            except grpc.RpcError as err:
                if self._ended(inner, status_of(err)) is None:
                    raise self from None
                # retried: the next attempt's call takes over
                try:
                    inner = self._wait_started(after=inner)
                except ChannelRpcError:
                    raise self from None
                continue
            if not self._rpc.committed:
                self._rpc.commit()  # a response: never retried from now on
            typed: _Response = response
            return typed

    next = __next__


class FutureCall(DeferredCall[_Response]):
    """``multicallable.future()``: resolves to the response."""

    _unary_response = True


def blocking_unary(
    rpc: Rpc,
    method: GrpcMethod,
    request: Any,
    credentials: Any,
    compression: Any,
    with_call: bool,
) -> tuple[Any, Any]:
    """Run a unary-response RPC on the calling thread: the blocking adapter
    of its :class:`~pyxds.channel.rpc.Rpc` (a queued pick waits on this
    thread for the channel's next publication, bounded by the deadline; a
    wait is a sleep).  Returns (response, grpcio call); the call is None
    when neither the application (``with_call``) nor the LB policy (the
    attempt's trailers) wants it, so grpcio builds none.  Raises
    grpc.RpcError.  A client stream's ``request`` is its
    :class:`RequestReplay`."""
    core = rpc.core
    while True:
        generation = core.generation
        step = rpc.pick()
        if step is None:
            if not core.wait_for_publication(generation, rpc.queue_wait()):
                remaining = rpc.remaining()
                if remaining is not None and remaining <= 0:
                    raise ChannelRpcError(rpc.finish(DEADLINE_EXCEEDED))
                rpc.stale_wait_over()
            continue
        if step.__class__ is Status:
            if step.code is grpc.StatusCode.OK:  # type: ignore[union-attr]
                # A33's OK abort: over with OK before any attempt
                return None, OkEndCall() if with_call else None
            raise ChannelRpcError(step)  # type: ignore[arg-type]
        if step.__class__ is float:
            time.sleep(step)  # type: ignore[arg-type]
            continue
        transport: Transport = step  # type: ignore[assignment]
        verb = "with_call" if with_call or rpc.wants_call else None
        try:
            result = method.start(transport, rpc, request, credentials, compression, verb)
        except grpc.RpcError as err:
            transport.call_finished()
            status = status_of(err)
            delay = rpc.ended(err, status, call_metadata, request, method)
            if delay is not None:
                if delay > 0:
                    time.sleep(delay)
                continue
            worded = unary_status(status)
            if worded is not status:
                raise ChannelRpcError(worded, *call_metadata(err)) from None
            config = rpc.call_config
            if config is not None and config.call_state is not None:
                additions = additions_of(rpc)
                assert additions is not None
                raise CallWithMetadata(err, additions) from None
            raise
        except Exception as err:
            if rpc.start_failed(transport):
                continue  # "Cannot invoke RPC on closed channel!": not sent
            # the call's own arguments (grpcio raises the same error)
            rpc.finish(Status(grpc.StatusCode.UNKNOWN, f"{type(err).__name__}: {err}"))
            raise
        except BaseException as err:
            transport.call_finished()
            rpc.finish(Status(grpc.StatusCode.UNKNOWN, f"{type(err).__name__}: {err}"))
            raise
        transport.call_finished()
        if verb is None:
            rpc.finish(OK_STATUS)
            return result, None
        rpc.finish(OK_STATUS, result[1])
        config = rpc.call_config
        if config is not None and config.call_state is not None:
            additions = additions_of(rpc)
            assert additions is not None
            return result[0], CallWithMetadata(result[1], additions)
        return result[0], result[1]
