"""The asyncio channel: a real ``grpc.aio.Channel`` over the pyxds stack.

Same control side as the sync channel (:class:`pyxds.channel.core.ChannelCore`:
resolver, LB tree, pickers, idleness); the subchannels are ``grpc.aio``
channels bound to the event loop the channel is first used on
(:class:`pyxds.channel.subchannel.AioTransport`).

Per RPC a task picks (awaiting the next publication when queued: an
``asyncio.Event`` set thread-safely with ``loop.call_soon_threadsafe`` by the
publishing thread, bounded by the deadline), then runs the grpcio aio call on
the picked subchannel.  Failures the channel decides are
``grpc.aio.AioRpcError`` with the picker's status, as async grpcio users
expect.  The call objects are the asyncio adapters of the RPC
(:class:`pyxds.channel.rpc.Rpc`, which the sync calls share: its route,
picks, attempts, commit, retries and their backoff, each attempt reported
to the LB policy once and the CallConfig committed once, streams
included); each attempt starts the one way of its call kind
(:class:`pyxds.channel.grpc_calls.GrpcMethod`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union, cast

import grpc
import grpc.aio
from grpc import _common

from pyxds.channel import lifecycle, subchannel
from pyxds.channel.aio_loop_side import Dropped, LoopSide
from pyxds.channel.core import ChannelCore, subchannel_authority
from pyxds.channel.grpc_aio_unary import LeanAioUnaryUnary
from pyxds.channel.grpc_calls import (
    GrpcMethod,
    call_metadata,
    stream_status,
    unary_status,
)
from pyxds.channel.metadata_check import Refused, grpc_aio_error
from pyxds.channel.request_buffer import (
    PULL,
    RETIRED,
    RETRY_BUFFER_SIZE,
    BufferView,
    Replay,
    RequestBuffer,
)
from pyxds.channel.response_metadata import ResponseAdditions, additions_of, aio_error
from pyxds.channel.rpc import CANCELLED, CHANNEL_CLOSED, DEADLINE_EXCEEDED, DONE, Rpc
from pyxds.channel.subchannel import Transport, subchannel_options
from pyxds.lb.api import OK_STATUS, ConnectivityState, Status
from pyxds.resolver.service_config import ServiceConfigSource, from_channel_args

if TYPE_CHECKING:  # the bootstrap loads the xDS resource types: only an xds: target needs them
    from pyxds.channel.aio_interceptors import Interceptors
    from pyxds.xds.bootstrap import BootstrapSource

_CANCELLED = CANCELLED
#: C-core's words for a deadline met by the transport (retry filter off)
#: the Cython status code of OK (what a grpc.aio call's own status holds)
_CYGRPC_OK = next(
    k for k, v in _common.CYGRPC_STATUS_CODE_TO_STATUS_CODE.items() if v is grpc.StatusCode.OK
)
_OK = grpc.StatusCode.OK
#: what a grpc.aio client-streaming call's own status may say when grpcio's
#: request writer hit a stream that had already ended (e.g. refused): the
#: real reason is the status the call's receive side raises.
_WRITE_FAILED = Status(grpc.StatusCode.INTERNAL, "Internal error from Core")
#: grpc.aio's words for mixing ``async for`` with read() on one call
_API_STYLE_ERROR = "The iterator and read/write APIs may not be mixed on a single RPC."

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
#: call metadata as grpc.aio takes it
Metadata = Union[grpc.aio.Metadata, Sequence[tuple[str, str | bytes]]]
#: requests of a client-streaming call: sync or async
RequestIterator = Union[AsyncIterator[_Request], Iterator[_Request]]
#: what read() returns: a response, or grpc.aio.EOF (typed ``object`` in grpcio's stubs)
ReadResult = object


def _error(status: Status) -> grpc.aio.AioRpcError:
    """An error the channel makes itself, its ``debug_error_string`` as
    grpc.aio's for one its channel made (``CODE:details``, e.g.
    "DEADLINE_EXCEEDED:Deadline Exceeded"; the sync channel's alike)."""
    return grpc.aio.AioRpcError(
        status.code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        status.details,
        f"{status.code.name}:{status.details}",
    )


def _sync_status(call: Any) -> Status | None:
    """The final status of a finished grpc.aio call, read without awaiting
    (grpcio keeps it on the Cython call); None when not available."""
    try:
        raw = call._cython_call._status
        if raw is None:
            return None
        code = _common.CYGRPC_STATUS_CODE_TO_STATUS_CODE[raw.code()]
        details = raw.details()
        if code is _OK and not details:
            return OK_STATUS  # the common end: no Status to build
        return Status(code, details or "")
    except Exception:
        return None


def _unary_error(err: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    """``err`` as grpcio's own channel words it for a unary-response call."""
    status = Status(err.code(), err.details() or "")
    worded = unary_status(status)
    if worded is status:
        return err
    return grpc.aio.AioRpcError(
        worded.code,
        err.initial_metadata(),
        err.trailing_metadata(),
        worded.details,
        err.debug_error_string(),
    )


async def _final_status(call: Any, err: grpc.aio.AioRpcError) -> Status:
    """The status a failed grpc.aio call ended with.  Not always the error
    an await raised: when a request could not be sent (the stream was
    refused) grpcio raises INTERNAL "Internal error from Core" from the write
    while the call's own status says why (e.g. RST_STREAM REFUSED_STREAM)."""
    try:
        code = await call.code()
        details = await call.details()
    except Exception:
        code = None
    if code is None or code is grpc.StatusCode.OK:
        return Status(err.code(), err.details() or "")
    return Status(code, details or "")


def _answer(waiter: asyncio.Future[bool], published: bool) -> None:
    """A queued pick's wait ends: a publication (True) or its bound (False)."""
    if not waiter.done():
        waiter.set_result(published)


def _wake(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[bool]) -> None:
    """The publication a queued pick waits for, from the publishing thread:
    on the pick's own loop (its subchannel's report ran the serializer
    there) answered at once, from any other thread in one hop."""
    if asyncio._get_running_loop() is loop:
        _answer(waiter, True)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(_answer, waiter, True)


async def pick(rpc: Rpc, first: Any = None) -> Transport | Status:
    """The RPC's next pick (``first``: a step it answered already): a queued
    pick awaits the channel's next publication, bounded by the deadline (a
    future answered by the publishing thread, or by a timer of the loop:
    no task and no ``asyncio.Event`` of its own, so the publication resumes
    the RPC's task in the loop iteration that hears it), a wait is slept."""
    core = rpc.core
    loop = asyncio.get_running_loop()
    step: Transport | Status | float | None = first
    while True:
        if step is None:
            generation = core.generation
            step = rpc.pick()
            if step is None:
                remaining = rpc.remaining()
                if remaining is not None and remaining <= 0:
                    return rpc.finish(DEADLINE_EXCEEDED)
                waiter: asyncio.Future[bool] = loop.create_future()
                wake = partial(_wake, loop, waiter)
                if not core.add_waiter(generation, wake):
                    continue
                bound = rpc.queue_wait()
                timer = None if bound is None else loop.call_later(bound, _answer, waiter, False)
                try:
                    published = await waiter
                except asyncio.CancelledError:
                    core.remove_waiter(wake)
                    raise
                finally:
                    if timer is not None:
                        timer.cancel()
                if not published:
                    core.remove_waiter(wake)
                    remaining = rpc.remaining()
                    if remaining is not None and remaining <= 0:
                        return rpc.finish(DEADLINE_EXCEEDED)
                    rpc.stale_wait_over()  # no newer picker within the grace: pick again
                continue
        if isinstance(step, float):
            await asyncio.sleep(step)
            step = None
            continue
        return step


class AioRpc(Rpc):
    """An RPC of a pyxds.aio channel.  Metadata grpcio would refuse
    (pyxds/channel/metadata_check.py) is refused as grpc.aio refuses it:
    what grpc.aio raises from making the call (a pair that does not unpack)
    raises from making it; what it raises from the C-core call's first
    batch, on the awaited call (a value of the wrong type), comes from the
    attempt's start, where iterating :class:`Refused` raises it before a
    C-core call is made (grpc.aio's own would never be released, keeping
    the channel's connection after ``close()``)."""

    def _refuse(self, metadata: Any, held: tuple[Any, ...]) -> None:
        error = grpc_aio_error(metadata, held)
        if error is not None:
            self.send_metadata = Refused(error)


class AsyncRequestReplay(Replay):
    """The asyncio face of a client-streaming aio RPC's
    :class:`~pyxds.channel.request_buffer.RequestBuffer` (its rules; the requests
    are a sync or async iterable): each attempt iterates :meth:`attempt`;
    one pull from the source at a time."""

    def __init__(self, requests: Any, limit: int = RETRY_BUFFER_SIZE) -> None:
        self._requests = requests
        self._source: Any = None
        self.buffer = RequestBuffer(limit)
        self._lock: asyncio.Lock | None = None

    def can_retry(self) -> bool:
        return self.buffer.recording

    def commit(self) -> None:
        self.buffer.commit()

    def attempt(self) -> Any:
        return self._view(self.buffer.view())

    async def _pull(self) -> Any:
        if self._source is None:
            requests = self._requests
            self._source = (
                requests.__aiter__() if hasattr(requests, "__aiter__") else iter(requests)
            )
        if hasattr(self._source, "__anext__"):
            return await self._source.__anext__()
        try:
            return next(self._source)
        except StopIteration:
            raise StopAsyncIteration from None

    async def _view(self, view: BufferView) -> Any:
        buffer = self.buffer
        if self._lock is None:
            self._lock = asyncio.Lock()
        while True:
            item = buffer.next_kept(view)
            if item is RETIRED:
                return
            if item is not PULL:
                yield item
                continue
            async with self._lock:
                if buffer.behind(view):
                    continue  # another attempt pulled meanwhile: replay it first
                try:
                    item = await self._pull()
                except StopAsyncIteration:
                    return
                delivered = buffer.taken(view, item)
            if not delivered:
                return  # the dead call would drop it: the next attempt sends it
            yield item


_FINISHED = "RPC already finished."
_HALF_CLOSED = 'RPC is half closed after calling "done_writing".'


class _Writes:
    """The requests of a client-streaming aio call invoked without a request
    iterator, as the application hands them to ``write()``: the request
    source of the call's :class:`AsyncRequestReplay`, so they are kept and
    replayed to a retry like an iterator's (A6 "Memory Management
    (Buffering)": "the outgoing message is the entire message stream"; C-core
    retries such a call, seen live).  One request in flight at a time: a
    write returns once the running attempt took the previous one, or the
    call ended."""

    _END = object()
    half_closed = False

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)

    async def requests(self) -> AsyncIterator[Any]:
        while True:
            request = await self._queue.get()
            if request is self._END:
                return
            yield request

    async def put(self, item: Any, call: _AioCall[Any]) -> bool:
        """Queue ``item`` unless ``call`` ends first; whether it was queued."""
        queue = self._queue
        if not queue.full():  # the attempt took the previous one already
            queue.put_nowait(item)
            return True
        put = asyncio.ensure_future(queue.put(item))
        ended = asyncio.ensure_future(call._wait_done())
        try:
            await asyncio.wait((put, ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (put, ended):
                if not task.done():
                    task.cancel()
        return put.done() and not put.cancelled()

    async def write(self, request: Any, call: _AioCall[Any]) -> None:
        """grpc.aio's ``write()`` rules: not after the call ended, nor after
        ``done_writing()``."""
        if call._finished or call._rpc.cancelled:
            raise asyncio.InvalidStateError(_FINISHED)
        if self.half_closed:
            raise asyncio.InvalidStateError(_HALF_CLOSED)
        if not await self.put(request, call):
            raise asyncio.InvalidStateError(_FINISHED)

    async def done_writing(self, call: _AioCall[Any]) -> None:
        if not self.half_closed and not call._finished and not call._rpc.cancelled:
            self.half_closed = True
            await self.put(self._END, call)

    def ended(self, _call: Any) -> None:
        """The call is over (its done callback): end the request stream, so
        grpc.aio's task reading it ends too (else it waits forever and the
        loop's close reports it destroyed while pending, which grpc.aio's
        own ``write()`` calls never leave behind)."""
        queue = self._queue
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(self._END)


class _AioCall(Generic[_Response]):
    """Shared by the aio call objects: the asyncio adapter of its
    :class:`~pyxds.channel.rpc.Rpc` (picks and backoffs are awaited in a
    task of the call; the inner grpcio aio call's end is read on the loop)
    and the grpc.aio.Call surface."""

    #: whether a task of the call (``_task``, when there is one) awaits its
    #: attempts and reads their end (else their done callbacks do)
    _task_awaits = False
    #: how the call's failure status is worded to the application (None: as is)
    _map_status: Callable[[Status], Status] | None = None

    # Every call's starting state, on the class: an instance stores only
    # what changes (fewer stores per call, and no list until a done callback)
    _task: asyncio.Task[Any] | None = None
    _inner: Any = None  # the running attempt's grpc.aio call
    #: what awaiting the failed call raises (a grpc.aio.AioRpcError, or the
    #: exception grpc.aio raises for metadata it refuses: AioRpc)
    _error: BaseException | None = None
    # whether the running attempt's inner call (or the call's error) is
    # there, and the Events made only when something waits (most calls are
    # awaited for their response: no Event per call)
    _is_started = False
    _started_event: asyncio.Event | None = None
    _done_callbacks: list[Callable[[Any], None]] | None = None
    _finished = False
    _done_event: asyncio.Event | None = None
    _status = OK_STATUS
    _additions: ResponseAdditions | bool | None = False  # False: not looked up
    _credentials: grpc.CallCredentials | None = None
    _compression: grpc.Compression | None = None
    #: a client-streaming call invoked without a request iterator: what
    #: ``write()`` / ``done_writing()`` feed (None otherwise)
    _writes: _Writes | None = None

    def __init__(
        self, rpc: Rpc, method: GrpcMethod, request: Any, credentials: Any, compression: Any
    ) -> None:
        self._rpc = rpc
        self._method = method
        self._request = request
        if credentials is not None:
            self._credentials = credentials
        if compression is not None:
            self._compression = compression
        self._loop = asyncio.get_running_loop()

    def _response_additions(self) -> ResponseAdditions | None:
        """The RPC's response metadata additions (A55 set-cookie), if any."""
        if self._additions is False:
            self._additions = additions_of(self._rpc)
        return self._additions  # type: ignore[return-value]

    def _raised(self, err: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
        """The error to raise to the application for a failed attempt's ``err``."""
        return aio_error(err, self._response_additions())  # type: ignore[no-any-return]

    def _try_start(self, step: Transport | Status) -> Any:
        """Carry out the RPC's pick: the started inner call, None (nothing
        started: pick again) or the Status the RPC failed with."""
        if isinstance(step, Status):
            if step.code is _OK:
                # A33's OK abort: over with OK before any attempt; an ended
                # call stands in for the attempt's (ok_end.py)
                from pyxds.channel.ok_end import AioOkEndCall

                ended = self._inner = AioOkEndCall()
                self._is_started = True
                if self._started_event is not None:
                    self._started_event.set()
                self._finish(step)
                return ended
            self._fail(step)
            return step
        transport = step
        rpc = self._rpc
        method = self._method
        on_done: Callable[[Any], None] | None = partial(self._inner_done, transport)
        try:
            inner = None
            key = method.lean_key
            if (
                key is not None
                and rpc.metrics is None
                and rpc.pick_metadata is None
                and self._credentials is None
                and self._compression is None
            ):  # GrpcMethod.start's common case, inline: the lean call, cached
                # (its done callback added by the call, as grpcio adds it; a
                # new grpcio call ends on a later loop iteration, never here)
                mc = transport.callables.get(key)
                if mc is None:  # the transport's first call: made and cached
                    mc = method.multicallable(transport, rpc)
                if type(mc) is LeanAioUnaryUnary:
                    inner = mc.call(self._request, rpc.timeout, rpc.send_metadata, False, on_done)
                    on_done = None
            if inner is None:
                inner = method.start(
                    transport, rpc, self._request, self._credentials, self._compression
                )
                if rpc.metrics is not None and self._task_awaits and self._task is None:
                    # A66: the attempt's received bytes are counted when its
                    # response is deserialized, which grpc.aio does after the
                    # call's done callbacks: a task awaits the response and
                    # reads the attempt's end (as for a first pick that waited)
                    run = self._run(None, 0.0, inner)  # type: ignore[attr-defined]  # _task_awaits: a unary-response call
                    self._task = self._loop.create_task(run)
        except Exception as err:
            if rpc.start_failed(transport):
                return None  # the grpcio channel closed under us: not sent
            # the call's own arguments: raised to the application, as
            # grpc.aio raises it (from the call, or from awaiting it)
            status = Status(grpc.StatusCode.INTERNAL, f"failed to start call: {err}")
            if rpc.send_metadata.__class__ is Refused:  # grpc.aio's is from the awaited call
                self._fail(status)
                self._error = err
                return status
            self._finish(status)
            raise
        self._inner = inner
        self._is_started = True
        if self._started_event is not None:
            self._started_event.set()
        if on_done is not None:
            inner.add_done_callback(on_done)
        return inner

    async def _open(self, delay: float = 0.0, first: Any = None) -> Any:
        """After ``delay`` (a backoff): pick (``first``: the RPC's answer
        already known) and start the inner call; returns it (or raises the
        channel's error)."""
        while True:
            try:
                if delay > 0:
                    await asyncio.sleep(delay)
                delay = 0.0
                step = await pick(self._rpc, first)
            except asyncio.CancelledError:
                self._finish(_CANCELLED)
                raise
            first = None
            started = self._try_start(step)
            if started.__class__ is Status:
                assert self._error is not None  # _try_start failed the call
                if self._rpc.cancelled:  # by the channel's close(): see _fail
                    raise asyncio.CancelledError
                raise self._error
            if started is not None:
                return started

    def _ended(self, call: Any, status: Status) -> float | None:
        """The engine's answer to the failed attempt ``call``: the wait
        before the next attempt (the adapter starts it), or None (the RPC
        ends with ``status``)."""
        delay = self._rpc.ended(call, status, call_metadata, self._request, self._method)
        if delay is not None:
            self._is_started = False
            if self._started_event is not None:
                self._started_event.clear()
            self._inner = None
        return delay

    def _retry(self, delay: float) -> None:
        """Start the next attempt after ``delay`` seconds (a task of the call)."""
        raise NotImplementedError

    def _inner_done(self, transport: Transport, call: Any) -> None:
        transport.call_finished()
        if self._task_awaits and self._task is not None:
            return  # the task reads the attempt's end
        try:  # _sync_status's common answer, inline (every call ends here)
            raw = call._cython_call._status
            ok = raw.code() == _CYGRPC_OK and not raw.details()
        except Exception:
            ok = False
        status = OK_STATUS if ok else _sync_status(call)
        if status is OK_STATUS or (status is not None and status.code is _OK):
            # _settle's OK end, inline (reported(): no attempt was retried,
            # so only the RPC's end counts)
            rpc = self._rpc
            if not self._finished and (
                rpc.phase is not DONE if rpc.retried is None else not rpc.reported(call)
            ):
                # _finish of an OK status, inline (no wording to apply)
                self._finished = True
                self._status = status
                if self._done_event is not None:
                    self._done_event.set()
                rpc.finish(status, call)
                if self._done_callbacks:
                    self._run_done_callbacks()
        else:
            # a failure is read the awaited way: the Cython call's status can
            # be the INTERNAL of a failed write where code() says why
            self._loop.create_task(self._settle_later(call))

    async def _settle_later(self, call: Any) -> None:
        try:
            status = Status(await call.code(), await call.details() or "")
            if status == _WRITE_FAILED and hasattr(call, "__await__"):
                try:  # the receive-status side knows why the write failed
                    await call
                except grpc.aio.AioRpcError as err:
                    status = Status(err.code(), err.details() or "")
        except asyncio.CancelledError:
            status = _CANCELLED
        except Exception:
            status = Status(grpc.StatusCode.UNKNOWN, "")
        self._settle(call, status)

    def _settle(self, call: Any, status: Status) -> None:
        """The end of the attempt ``call`` that no task of the call awaits,
        from whichever sees it first (its done callback, a reader): the
        next attempt starts, or the call is over (``done()``)."""
        if self._rpc.reported(call) or self._finished:
            return
        if status.code is not _OK:
            delay = self._ended(call, status)
            if delay is not None:
                self._retry(delay)
                return
        self._finish(status, call)

    def _fail(self, status: Status) -> None:
        if status == CHANNEL_CLOSED:
            # the channel closed before the call's first attempt: grpc.aio's
            # close() cancels every call of the channel (close_channel_test.py),
            # so the call is locally cancelled (cancelled() True, awaiting or
            # reading it raises CancelledError), not failed with sync
            # grpcio's "Channel closed!"
            self._rpc.cancelled = True
            status = _CANCELLED
        self._error = _error(status)
        self._is_started = True
        if self._started_event is not None:
            self._started_event.set()
        self._finish(status)

    def _finish(self, status: Status, call: Any = None) -> None:
        if self._finished:
            return
        if status.code is not _OK and self._map_status is not None:
            status = self._map_status(status)
        self._finished = True
        self._status = status
        if self._done_event is not None:
            self._done_event.set()
        self._rpc.finish(status, call)
        if self._done_callbacks:
            self._run_done_callbacks()

    def _run_done_callbacks(self) -> None:
        """The application's done callbacks, once, as the call ends."""
        callbacks = self._done_callbacks
        self._done_callbacks = None
        for cb in callbacks or ():
            try:
                cb(self)
            except Exception:
                pass

    # -- grpc.aio.Call surface -------------------------------------------
    def cancelled(self) -> bool:
        if self._inner is not None:
            cancelled: bool = self._inner.cancelled()
            return cancelled
        return self._rpc.cancelled

    def done(self) -> bool:
        return self._finished

    def time_remaining(self) -> float | None:
        remaining = self._rpc.remaining()
        return None if remaining is None else max(remaining, 0)  # as grpcio

    async def _wait_done(self) -> None:
        if not self._finished:
            if self._done_event is None:
                self._done_event = asyncio.Event()
            await self._done_event.wait()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._finished:
            callback(self)
        else:
            if self._done_callbacks is None:
                self._done_callbacks = []
            self._done_callbacks.append(callback)

    # Client-streaming writes: requests handed to write() are kept for a
    # retry (_Writes); with a request iterator, the running attempt's call
    # answers (grpc.aio's UsageError).
    async def write(self, request: Any) -> None:
        if self._writes is not None:
            await self._writes.write(request, self)
            return
        await (await self._writer()).write(request)

    async def done_writing(self) -> None:
        if self._writes is not None:
            await self._writes.done_writing(self)
            return
        await (await self._writer()).done_writing()

    async def _writer(self) -> Any:
        """The running attempt's grpc.aio call, for write()/done_writing()."""
        return await self._wait_started()

    async def _wait_started(self) -> Any:
        if not self._is_started:
            if self._started_event is None:
                self._started_event = asyncio.Event()
            await self._started_event.wait()
        if self._error is not None:
            raise self._error
        return self._inner

    async def initial_metadata(self) -> Any:
        try:
            inner = await self._wait_started()
        except grpc.aio.AioRpcError as err:
            return err.initial_metadata()
        metadata = await inner.initial_metadata()
        additions = self._response_additions()
        if additions is not None:
            code = await inner.code() if inner.done() else None
            metadata = additions.aio_initial(metadata, code)
        return metadata

    async def trailing_metadata(self) -> Any:
        try:
            inner = await self._wait_started()
        except grpc.aio.AioRpcError as err:
            return err.trailing_metadata()
        metadata = await inner.trailing_metadata()
        additions = self._response_additions()
        if additions is not None:
            initial = await inner.initial_metadata()
            metadata = additions.aio_trailing(metadata, initial, await inner.code())
        return metadata

    async def code(self) -> grpc.StatusCode:
        try:
            inner = await self._wait_started()
        except grpc.aio.AioRpcError as err:
            return err.code()
        code: grpc.StatusCode = await inner.code()
        return code

    async def details(self) -> str:
        try:
            inner = await self._wait_started()
        except grpc.aio.AioRpcError as err:
            return err.details() or ""
        details: str = await inner.details()
        return details

    async def wait_for_connection(self) -> None:
        try:
            inner = await self._wait_started()
        except grpc.aio.AioRpcError:
            if self._rpc.cancelled:  # cancelled before any attempt: as grpc.aio
                raise asyncio.CancelledError from None
            raise
        await inner.wait_for_connection()

    async def debug_error_string(self) -> str:
        """grpc.aio's call method (not in grpc.aio.Call's abstract API): the
        final status's debug string once the call is over, "" when none."""
        await self._wait_done()
        reader = getattr(self._inner, "debug_error_string", None)
        if reader is not None:
            text: str = await reader()
            return text
        if isinstance(self._error, grpc.aio.AioRpcError):
            return self._error.debug_error_string() or ""
        return ""


class AioUnaryResponseCall(
    _AioCall[_Response],
    grpc.aio.UnaryUnaryCall[_Request, _Response],
    grpc.aio.StreamUnaryCall[_Request, _Response],
    Generic[_Request, _Response],
):
    """unary_unary / stream_unary: awaitable for the response.

    Fast path: when the pick completes at once (the common case) the grpcio
    call starts right here and awaiting this object awaits it, with no task
    of our own; its end is read in the grpcio call's done callback (or by
    the awaiter, whichever comes first).  A queued or failed pick, and every
    next attempt, run in a task."""

    _task_awaits = True
    _map_status = staticmethod(unary_status)

    def __init__(
        self, rpc: Rpc, method: GrpcMethod, request: Any, credentials: Any, compression: Any
    ) -> None:
        # _AioCall.__init__, inline (one Python call less per RPC)
        self._rpc = rpc
        self._method = method
        self._request = request
        if credentials is not None:
            self._credentials = credentials
        if compression is not None:
            self._compression = compression
        self._loop = asyncio.get_running_loop()
        first = rpc.pick()
        if first is not None and not isinstance(first, float):
            if self._try_start(first) is not None:
                return  # started, or failed
            first = None
        self._task = self._loop.create_task(self._run(first))

    def _retry(self, delay: float) -> None:
        self._task = self._loop.create_task(self._run(None, delay))

    async def _run(self, first: Any, delay: float = 0.0, started: Any = None) -> _Response:
        """The attempts of a call whose first pick did not start one at once
        (``started``: or whose first attempt, started, is read here)."""
        while True:
            if started is not None:
                inner, started = started, None
            else:
                inner = await self._open(delay, first)
            first = None
            try:
                response: _Response = await inner
            except grpc.aio.AioRpcError as err:
                status = await _final_status(inner, err)
                retry_in = self._ended(inner, status)
                if retry_in is not None:
                    delay = retry_in
                    continue
                self._finish(status, inner)
                mapped = _unary_error(err)
                if mapped is err:
                    mapped = self._raised(err)
                if mapped is not err:
                    raise mapped from None
                raise
            except asyncio.CancelledError:
                self._finish(_CANCELLED)
                raise
            self._finish(OK_STATUS, inner)
            return response

    def __await__(self) -> Generator[Any, None, _Response]:
        # a generator rather than a coroutine the awaiter wraps: ``yield
        # from`` is ``await``'s own protocol, with one object less per call
        while True:
            task = self._task
            if task is not None:
                result: _Response = yield from task.__await__()
                return result
            inner = self._inner
            if inner is None:  # the channel failed it before any attempt
                assert self._error is not None
                raise self._error
            try:
                response: _Response = yield from inner.__await__()
                return response
            except grpc.aio.AioRpcError as err:
                self._settle(inner, (yield from _final_status(inner, err).__await__()))
                if self._task is None:
                    mapped = _unary_error(err)
                    if mapped is err:
                        mapped = self._raised(err)
                    if mapped is not err:
                        raise mapped from None
                    raise
            except asyncio.CancelledError:
                self._rpc.cancel()
                inner.cancel()
                self._settle(inner, _CANCELLED)
                raise

    def cancel(self) -> bool:
        if self._finished:
            return False
        self._rpc.cancel()
        inner = self._inner
        if inner is not None and inner.cancel():
            # over now, its done callbacks run: grpc.aio's cancel() ends
            # the call before it returns (done() True at once)
            self._finish(_CANCELLED, inner)
        if self._task is not None:
            cancelled = self._task.cancel()
            if self._inner is None:
                # still picking (the task may never run again): over now, as
                # grpc.aio's call is (code() CANCELLED, empty metadata)
                self._fail(_CANCELLED)
            return cancelled
        return True

    async def code(self) -> grpc.StatusCode:
        await self._wait_done()
        return self._status.code

    async def details(self) -> str:
        await self._wait_done()
        return self._status.details


class AioStreamResponseCall(
    _AioCall[_Response],
    grpc.aio.UnaryStreamCall[_Request, _Response],
    grpc.aio.StreamStreamCall[_Request, _Response],
    Generic[_Request, _Response],
):
    """unary_stream / stream_stream: async iterator of responses.

    Attempts start in a task of the call; whoever sees an attempt's failure
    first (a reader, or the call's done callback) hands it to the engine,
    and a retry starts (after its backoff) in a new task that readers await.
    A response commits; requests written with ``write()`` are kept for a
    retry like an iterator's (:class:`_Writes`)."""

    def __init__(
        self, rpc: Rpc, method: GrpcMethod, request: Any, credentials: Any, compression: Any
    ) -> None:
        super().__init__(rpc, method, request, credentials, compression)
        self._response_style: str | None = None
        self._aiter: AsyncIterator[_Response] | None = None
        self._task = self._open_task()

    def _open_task(self, delay: float = 0.0) -> asyncio.Task[Any]:
        task = self._loop.create_task(self._open(delay))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    def _retry(self, delay: float) -> None:
        self._task = self._open_task(delay)

    def _map_status(self, status: Status) -> Status:
        """A deadline before the response headers, worded as grpcio's own
        channel words it (:func:`~pyxds.channel.grpc_calls.stream_status`)."""
        cython_call = getattr(self._inner, "_cython_call", None)
        headers = bool(getattr(cython_call, "_initial_metadata", None))
        return stream_status(status, self._rpc.committed, headers)

    def _raised(self, err: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
        raised = _AioCall._raised(self, err)
        status = self._status
        if self._finished and status.code is raised.code() and status.details != raised.details():
            return grpc.aio.AioRpcError(
                status.code,
                raised.initial_metadata(),
                raised.trailing_metadata(),
                status.details,
                raised.debug_error_string(),
            )
        return raised

    async def _inner_call(self) -> Any:
        assert self._task is not None  # made in __init__
        return await asyncio.shield(self._task)

    def _response_api(self, style: str) -> None:
        """As grpc.aio: a call is read with ``async for`` or with read(), not both."""
        if self._response_style is None:
            self._response_style = style
        elif self._response_style != style:
            raise grpc.aio.UsageError(_API_STYLE_ERROR)

    def __aiter__(self) -> AsyncIterator[_Response]:
        self._response_api("iterator")
        if self._aiter is None:
            self._aiter = self._iterate()
        return self._aiter

    async def _iterate(self) -> AsyncIterator[_Response]:
        while True:
            response = await self._read()
            if response is grpc.aio.EOF:
                return
            yield cast(_Response, response)  # not EOF: a response

    async def read(self) -> ReadResult:
        if not self.done():
            self._response_api("reader")
        return await self._read()

    async def _read(self) -> ReadResult:
        inner = await self._inner_call()
        while True:
            try:
                response = await inner.read()
            except grpc.aio.AioRpcError as err:
                self._settle(inner, await _final_status(inner, err))
                if not self._finished:  # retried: the next attempt's call takes over
                    inner = await self._inner_call()
                    continue
                raised = self._raised(err)
                if raised is not err:
                    raise raised from None
                raise
            if response is not grpc.aio.EOF and not self._rpc.committed:
                self._rpc.commit()
            result: ReadResult = response
            return result

    async def _writer(self) -> Any:
        return await self._inner_call()

    def cancel(self) -> bool:
        if self._finished:
            return False
        self._rpc.cancel()
        inner = self._inner
        if inner is not None:
            cancelled: bool = inner.cancel()
            if cancelled:  # over now, as grpc.aio's call (done() True at once)
                self._finish(_CANCELLED, inner)
            return cancelled
        if self._task is not None:
            self._task.cancel()
        self._fail(_CANCELLED)
        return True

    async def code(self) -> grpc.StatusCode:
        await self._wait_done()
        return self._status.code

    async def details(self) -> str:
        await self._wait_done()
        return self._status.details


_Call = TypeVar("_Call", bound=_AioCall[Any])


class _ChannelMethod(GrpcMethod):
    """A :class:`GrpcMethod` that holds the channel it was made on.

    Every call object of an aio multicallable holds its method for its
    life, so through it the channel: a program may drop its channel while
    a call runs (``call = pyxds.aio.insecure_channel(t).unary_stream(m)(r)``)
    and the dropped channel's close (:mod:`pyxds.channel.aio_loop_side`)
    waits until the call object goes, as a ``grpc.aio`` call's connection
    lives as long as the call object does (its C-core call holds it, after
    ``Channel.__del__`` closed the channel): the whole answer, and the
    connection gone once the call is let go.  One attribute per
    multicallable, nothing per call."""

    __slots__ = ("channel",)

    channel: AioXdsChannel


class _AioMultiCallable(Generic[_Request, _Response, _Call]):
    """What every aio kind shares: each call makes one
    :class:`~pyxds.channel.rpc.Rpc` and hands it to its call object
    (``_call_class``, a ``_Call``); a client stream's requests go through an
    :class:`AsyncRequestReplay` (none: the application writes them).

    It holds the channel it came from, as grpc.aio's multicallables do
    (``stub = EchoStub(pyxds.aio.insecure_channel(...))`` keeps working);
    its calls hold it through their method (:class:`_ChannelMethod`)."""

    _kind = ""
    _client_streaming = False
    _call_class: type[_Call]

    def __init__(
        self,
        channel: AioXdsChannel,
        method: str,
        ser: Callable[[_Request], bytes] | None,
        deser: Callable[[bytes], _Response] | None,
    ) -> None:
        self._channel = channel
        self._core = channel._core
        self._method = _ChannelMethod(self._kind, method, ser, deser)
        self._method.channel = channel

    def _call(
        self,
        request: object,
        timeout: float | None,
        metadata: Metadata | None,
        credentials: grpc.CallCredentials | None,
        wait_for_ready: bool | None,
        compression: grpc.Compression | None,
    ) -> _Call:
        core = self._core
        if core.closed:  # grpc.aio's words for a call on a closed channel
            raise grpc.aio.UsageError("Channel is closed.")
        channel = self._channel
        if channel._loop is None:
            channel._bind_loop()
        buffer = None
        writes = None
        if self._client_streaming:
            if request is None:  # write() / done_writing() feed it
                writes = _Writes()
                request = writes.requests()
            replay = AsyncRequestReplay(request, core.retry_buffer_size)
            request, buffer = replay, replay.buffer
        rpc = AioRpc(core, self._method.method, metadata, timeout, wait_for_ready, buffer)
        call = self._call_class(rpc, self._method, request, credentials, compression)
        if writes is not None:
            call._writes = writes
            call.add_done_callback(writes.ended)
        return call


class _OneRequest(_AioMultiCallable[_Request, _Response, _Call]):
    """unary_unary and unary_stream: one request, grpc.aio's keyword-only options."""

    def __call__(
        self,
        request: _Request,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> _Call:
        # _call without its client stream (one Python call less per RPC)
        core = self._core
        if core.closed:  # grpc.aio's words for a call on a closed channel
            raise grpc.aio.UsageError("Channel is closed.")
        if self._channel._loop is None:
            self._channel._bind_loop()
        rpc = AioRpc(core, self._method.method, metadata, timeout, wait_for_ready)
        return self._call_class(rpc, self._method, request, credentials, compression)


class _RequestStream(_AioMultiCallable[_Request, _Response, _Call]):
    """stream_unary and stream_stream: a request iterator, or none at all
    (the application writes its requests)."""

    _client_streaming = True

    def __call__(
        self,
        request_iterator: RequestIterator[_Request] | None = None,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> _Call:
        return self._call(
            request_iterator, timeout, metadata, credentials, wait_for_ready, compression
        )


class AioUnaryUnary(
    _OneRequest[_Request, _Response, AioUnaryResponseCall[_Request, _Response]],
    grpc.aio.UnaryUnaryMultiCallable[_Request, _Response],
):
    _kind = "unary_unary"
    _call_class = AioUnaryResponseCall  # type: ignore[assignment]  # the class's own type variables


class AioStreamUnary(
    _RequestStream[_Request, _Response, AioUnaryResponseCall[_Request, _Response]],
    grpc.aio.StreamUnaryMultiCallable[_Request, _Response],
):
    _kind = "stream_unary"
    _call_class = AioUnaryResponseCall  # type: ignore[assignment]  # the class's own type variables


class AioUnaryStream(
    _OneRequest[_Request, _Response, AioStreamResponseCall[_Request, _Response]],
    grpc.aio.UnaryStreamMultiCallable[_Request, _Response],
):
    _kind = "unary_stream"
    _call_class = AioStreamResponseCall  # type: ignore[assignment]  # the class's own type variables


class AioStreamStream(
    _RequestStream[_Request, _Response, AioStreamResponseCall[_Request, _Response]],
    grpc.aio.StreamStreamMultiCallable[_Request, _Response],
):
    _kind = "stream_stream"
    _call_class = AioStreamResponseCall  # type: ignore[assignment]  # the class's own type variables


class AioXdsChannel(grpc.aio.Channel):
    """A grpc.aio.Channel over the pyxds stack (:func:`pyxds.aio.insecure_channel`)."""

    def __init__(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None = None,
        bootstrap: BootstrapSource = None,
        options: Sequence[tuple[str, Any]] | None = None,
        compression: grpc.Compression | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
        service_config: ServiceConfigSource = None,
    ) -> None:
        # first: may raise ValueError; the module loads with the first interceptors
        self._interceptors: Interceptors | None = None
        if interceptors:
            from pyxds.channel.aio_interceptors import sort_interceptors

            self._interceptors = sort_interceptors(interceptors)
        options, parsed, sub_extra = from_channel_args(options, service_config)
        sub_options = subchannel_options(options, subchannel_authority(target)) + sub_extra
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        #: what the core calls back into: never the channel itself, so that
        #: a channel the program dropped is collected and closed
        #: (pyxds.channel.aio_loop_side)
        self._side = side = LoopSide(self._loop, sub_options, compression)
        self._core = ChannelCore(
            target,
            side.make_transport,
            credentials,
            bootstrap,
            options,
            service_config=parsed,
            defer=side.defer,
        )

    def __del__(self) -> None:
        # dropped unclosed: closed as grpc.aio's Channel.__del__ closes its
        # channel, but never here (pyxds.channel.lifecycle, rule 2): by its
        # loop's next callback or by the reaper (pyxds.channel.aio_loop_side)
        core = getattr(self, "_core", None)
        if core is None or core.closed:
            return
        dropped = Dropped(core, self._side)
        loop = self._loop
        if loop is not None and asyncio._get_running_loop() is loop:
            # dropped on its running loop (a coroutine's channel): closed
            # there by the loop's next callback, as grpc.aio closes its own
            # at once: before the loop's end (asyncio.run cancels its tasks
            # then; the transports' watches are closed ones by then)
            loop.call_soon(dropped.close_on_loop)
        else:
            lifecycle.release(dropped)

    def _bind_loop(self) -> None:
        if self._loop is None:
            self._loop = self._side.loop = asyncio.get_running_loop()

    @property
    def target(self) -> str:
        return self._core.target

    async def __aenter__(self) -> AioXdsChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        if grace:
            deadline = asyncio.get_running_loop().time() + grace
            while self._core.active_calls > 0 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
        self._side.close(self._core)
        # no task of the channel left pending (pyxds.channel.aio_closing)
        await self._side.closing.ended(subchannel.SHUTDOWN_READ_WAIT, subchannel.CLOSE_GAVE_UP)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        # the state as it was when asked, the connection attempt started
        # after: C-core's check_connectivity_state answers before it starts
        # connecting, so a fresh grpc.aio channel says IDLE to
        # get_state(True) (grpcio's connectivity_test.py, timeout_test.py)
        state = self._core.grpc_state()
        if try_to_connect:
            self._bind_loop()
            self._core.exit_idle()
        return state

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        if self._core.closed:  # grpc.aio's words (channel_ready() too)
            raise grpc.aio.UsageError("Channel is closed.")
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def on_state(_state: ConnectivityState) -> None:
            loop.call_soon_threadsafe(event.set)

        self._core.add_state_watcher(on_state)
        try:
            while self._core.grpc_state() is last_observed_state:
                await event.wait()
                event.clear()
        finally:
            self._core.remove_state_watcher(on_state)

    async def channel_ready(self) -> None:
        state = self.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.READY:
            await self.wait_for_state_change(state)
            state = self.get_state(try_to_connect=True)

    def _multicallable(
        self,
        kind: str,
        cls: type[_AioMultiCallable[Any, Any, Any]],
        method: str,
        ser: Callable[[Any], bytes] | None,
        deser: Callable[[bytes], Any] | None,
    ) -> Any:
        """The pyxds multicallable; behind the interceptors of its kind if any."""
        plain = cls(self, method, ser, deser)
        chain = self._interceptors and getattr(self._interceptors, kind)
        if not chain:
            return plain
        from pyxds.channel.aio_interceptors import INTERCEPTED  # loaded with the chain

        return INTERCEPTED[kind](plain, method, lambda m: cls(self, m, ser, deser), chain)

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None = None,
        response_deserializer: Callable[[bytes], _Response] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.aio.UnaryUnaryMultiCallable[_Request, _Response]:
        if _registered_method:
            self._core.registered_methods.add(method)
        mc: grpc.aio.UnaryUnaryMultiCallable[_Request, _Response] = self._multicallable(
            "unary_unary", AioUnaryUnary, method, request_serializer, response_deserializer
        )
        return mc

    def unary_stream(
        self,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None = None,
        response_deserializer: Callable[[bytes], _Response] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.aio.UnaryStreamMultiCallable[_Request, _Response]:
        if _registered_method:
            self._core.registered_methods.add(method)
        mc: grpc.aio.UnaryStreamMultiCallable[_Request, _Response] = self._multicallable(
            "unary_stream", AioUnaryStream, method, request_serializer, response_deserializer
        )
        return mc

    def stream_unary(
        self,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None = None,
        response_deserializer: Callable[[bytes], _Response] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.aio.StreamUnaryMultiCallable[_Request, _Response]:
        if _registered_method:
            self._core.registered_methods.add(method)
        mc: grpc.aio.StreamUnaryMultiCallable[_Request, _Response] = self._multicallable(
            "stream_unary", AioStreamUnary, method, request_serializer, response_deserializer
        )
        return mc

    def stream_stream(
        self,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None = None,
        response_deserializer: Callable[[bytes], _Response] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.aio.StreamStreamMultiCallable[_Request, _Response]:
        if _registered_method:
            self._core.registered_methods.add(method)
        mc: grpc.aio.StreamStreamMultiCallable[_Request, _Response] = self._multicallable(
            "stream_stream", AioStreamStream, method, request_serializer, response_deserializer
        )
        return mc

    def config_dump(self) -> dict[str, Any]:
        from pyxds.channel.dump import config_dump  # loaded when asked for

        return config_dump(self._core)


def insecure_channel(
    target: str,
    bootstrap: BootstrapSource = None,
    options: Sequence[tuple[str, Any]] | None = None,
    compression: grpc.Compression | None = None,
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
    service_config: ServiceConfigSource = None,
) -> AioXdsChannel:
    """A plaintext grpc.aio.Channel to ``target`` over the pyxds stack;
    ``interceptors``: grpc.aio client interceptors, as grpc.aio's
    (:mod:`pyxds.channel.aio_interceptors`); ``service_config``: a gRPC
    service config (dict or JSON text; ValueError when invalid)."""
    return AioXdsChannel(
        target, None, bootstrap, options, compression, interceptors, service_config
    )


def secure_channel(
    target: str,
    credentials: grpc.ChannelCredentials,
    bootstrap: BootstrapSource = None,
    options: Sequence[tuple[str, Any]] | None = None,
    compression: grpc.Compression | None = None,
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
    service_config: ServiceConfigSource = None,
) -> AioXdsChannel:
    """A grpc.aio.Channel to ``target`` whose subchannels use ``credentials``;
    ``interceptors`` and ``service_config`` as for :func:`insecure_channel`."""
    if credentials is None:
        raise ValueError("secure_channel needs credentials (use insecure_channel)")
    return AioXdsChannel(
        target, credentials, bootstrap, options, compression, interceptors, service_config
    )
