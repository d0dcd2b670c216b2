"""grpc.aio client interceptors on the pyxds aio channel.

``pyxds.aio.insecure_channel(..., interceptors=[...])`` takes the same
interceptor objects as ``grpc.aio.insecure_channel``.  The channel sorts them
by kind once (:func:`sort_interceptors`); a multicallable whose kind has no
interceptor is the plain pyxds one, so an RPC without interceptors costs
exactly what it did before.

With interceptors, invoking the multicallable returns at once a call object
(:class:`InterceptedUnaryUnaryCall` and its siblings) and starts one task
that runs the chain::

    interceptor[0].intercept_*(continuation_1, details, request)
      -> await continuation_1(details', request')
         interceptor[1].intercept_*(continuation_2, details', request')
           -> await continuation_2(details'', request'')
              the pyxds call (its Rpc: ConfigSelector, then the pick)

The first interceptor given is the outermost.  ``details`` is a
``grpc.aio.ClientCallDetails`` with the method as bytes, the timeout as
given, the metadata as ``grpc.aio.Metadata``, the credentials and
wait_for_ready, as grpc.aio passes them.  The end of the chain makes the
real pyxds call with whatever the interceptors handed down: the method (a
changed one gets its own multicallable), the timeout (counted from there),
the metadata, which is what the ConfigSelector matches routes' headers
against, since the RPC is routed and picked only then.

What an interceptor returns becomes the task's result: a call of the right
kind is used as is; anything else is a response value (unary-response kinds)
or an async iterable of responses (stream-response kinds, with status and
metadata from the last call the chain made).  The returned call object
proxies to that result: awaiting it, iterating it, ``read()``, ``code()``,
metadata, ``cancel()`` (which cancels the chain while it still runs) and
``add_done_callback``.  An exception an interceptor raises is what awaiting
the call raises.

Stream-request kinds invoked without a request iterator get one fed by the
call's ``write()`` / ``done_writing()``, as grpc.aio does.

Where this differs from grpcio 1.85: an interceptor implementing several
kinds is used for each of them (grpcio keeps it for the first kind only,
grpc/grpc#40946); a stream_unary interceptor may return a plain response;
``time_remaining()`` answers instead of raising NotImplementedError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from typing import Any, NamedTuple

import grpc
import grpc.aio

_CANCELLED_DETAILS = "Locally cancelled by application!"
_FINISHED = "RPC already finished."
_HALF_CLOSED = 'RPC is half closed after calling "done_writing".'
_MIXED_API = "The iterator and read/write APIs may not be mixed on a single RPC."

_KINDS: tuple[tuple[str, type], ...] = (
    ("unary_unary", grpc.aio.UnaryUnaryClientInterceptor),
    ("unary_stream", grpc.aio.UnaryStreamClientInterceptor),
    ("stream_unary", grpc.aio.StreamUnaryClientInterceptor),
    ("stream_stream", grpc.aio.StreamStreamClientInterceptor),
)

#: the interceptor chains' tasks while they run (the loop keeps only weak
#: references; a call object nobody awaits must still complete)
_RUNNING: set[asyncio.Task[Any]] = set()


class Interceptors(NamedTuple):
    """A channel's interceptors, by the kind of RPC they apply to."""

    unary_unary: tuple[grpc.aio.UnaryUnaryClientInterceptor, ...]
    unary_stream: tuple[grpc.aio.UnaryStreamClientInterceptor, ...]
    stream_unary: tuple[grpc.aio.StreamUnaryClientInterceptor, ...]
    stream_stream: tuple[grpc.aio.StreamStreamClientInterceptor, ...]


def sort_interceptors(interceptors: Sequence[Any] | None) -> Interceptors | None:
    """``interceptors`` by kind, in the given order; None when there are none.
    Anything that is not a grpc.aio client interceptor is a ValueError."""
    if not interceptors:
        return None
    by_kind: dict[str, list[Any]] = {kind: [] for kind, _ in _KINDS}
    for interceptor in interceptors:
        kinds = [kind for kind, base in _KINDS if isinstance(interceptor, base)]
        if not kinds:
            names = ", ".join(f"grpc.aio.{base.__name__}" for _, base in _KINDS)
            raise ValueError(
                f"interceptor {interceptor!r} of type {type(interceptor).__qualname__} "
                f"is not a client interceptor: expected one of {names}"
            )
        for kind in kinds:
            by_kind[kind].append(interceptor)
    return Interceptors(**{kind: tuple(found) for kind, found in by_kind.items()})


# -- calls that are not RPCs (an interceptor answered by itself) --------------


class _Answered:
    """Stands for an RPC an interceptor answered without one: finished, OK."""

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        callback(self)

    def time_remaining(self) -> float | None:
        return None

    async def initial_metadata(self) -> Any:
        return None

    async def trailing_metadata(self) -> Any:
        return None

    async def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.OK

    async def details(self) -> str:
        return ""

    async def debug_error_string(self) -> str | None:
        return None

    async def wait_for_connection(self) -> None:
        return None


# An interceptor chain may change requests and responses to anything: the
# calls and multicallables here are generic in Any.
class _ResponseCall(
    _Answered, grpc.aio.UnaryUnaryCall[Any, Any], grpc.aio.StreamUnaryCall[Any, Any]
):
    """A plain response value returned by a unary-response interceptor."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def __await__(self) -> Generator[Any, None, Any]:
        return self._value().__await__()

    async def _value(self) -> Any:
        return self._response

    async def write(self, request: Any) -> None:
        raise asyncio.InvalidStateError(_FINISHED)

    async def done_writing(self) -> None:
        return None


class _ResponsesCall(grpc.aio.UnaryStreamCall[Any, Any], grpc.aio.StreamStreamCall[Any, Any]):
    """An async iterable of responses returned by a stream-response
    interceptor; status and metadata are those of ``call`` (the last call
    the chain made, or an answered stand-in when it made none)."""

    def __init__(self, call: Any, responses: Any) -> None:
        self._call = call if call is not None else _Answered()
        self._responses = responses
        self._iterator: AsyncIterator[Any] | None = None

    def cancel(self) -> bool:
        return self._call.cancel()

    def cancelled(self) -> bool:
        return self._call.cancelled()

    def done(self) -> bool:
        return self._call.done()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._call.add_done_callback(lambda _call: callback(self))

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    async def initial_metadata(self) -> Any:
        return await self._call.initial_metadata()

    async def trailing_metadata(self) -> Any:
        return await self._call.trailing_metadata()

    async def code(self) -> grpc.StatusCode:
        return await self._call.code()

    async def details(self) -> str:
        return await self._call.details()

    async def debug_error_string(self) -> str | None:
        return await self._call.debug_error_string()

    async def wait_for_connection(self) -> None:
        await self._call.wait_for_connection()

    def __aiter__(self) -> AsyncIterator[Any]:
        if self._iterator is None:
            self._iterator = aiter(self._responses)
        return self._iterator

    async def read(self) -> Any:
        try:
            return await anext(self.__aiter__())
        except StopAsyncIteration:
            return grpc.aio.EOF

    async def write(self, request: Any) -> None:
        raise grpc.aio.UsageError(_MIXED_API)

    async def done_writing(self) -> None:
        raise grpc.aio.UsageError(_MIXED_API)


# -- the intercepted calls -------------------------------------------------------


class _InterceptedCall:
    """The call an intercepted multicallable returns: runs the chain in a
    task and proxies to the call the chain ends with."""

    _hook = ""  # the interceptor method of this kind
    _result_type: type = object  # what a returned call must be to be used as is

    def __init__(
        self,
        interceptors: Sequence[Any],
        details: grpc.aio.ClientCallDetails,
        request: Any,
        make: Callable[[str], Any],
        compression: grpc.Compression | None,
    ) -> None:
        self._interceptors = interceptors
        self._make = make
        self._compression = compression
        self._last: Any = None
        self._pending_callbacks: list[Callable[[Any], None]] = []
        timeout = details.timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        request = self._prepare(request)
        self._task = asyncio.get_running_loop().create_task(self._chain(0, details, request))
        _RUNNING.add(self._task)
        self._task.add_done_callback(self._chain_done)

    def _prepare(self, request: Any) -> Any:
        return request

    # -- the chain -----------------------------------------------------------
    async def _chain(self, index: int, details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        if index == len(self._interceptors):
            self._last = self._invoke(details, request)
            return self._last

        async def continuation(new_details: grpc.aio.ClientCallDetails, new_request: Any) -> Any:
            return await self._chain(index + 1, new_details, new_request)

        result = await getattr(self._interceptors[index], self._hook)(
            continuation, details, request
        )
        if not isinstance(result, self._result_type):
            result = self._wrap(result)
        self._last = result
        return result

    def _wrap(self, result: Any) -> Any:
        raise NotImplementedError

    def _invoke(self, details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        """The pyxds call at the end of the chain."""
        method = details.method
        if isinstance(method, bytes):
            method = method.decode()
        try:
            return self._make(method)(
                request,
                timeout=details.timeout,
                metadata=details.metadata,
                credentials=details.credentials,
                wait_for_ready=details.wait_for_ready,
                compression=self._compression,
            )
        except grpc.aio.UsageError:
            # the channel closed after this call was made (_start refuses a
            # closed one): grpc.aio's close() cancels the call's chain
            raise asyncio.CancelledError from None

    def _chain_done(self, task: asyncio.Task[Any]) -> None:
        _RUNNING.discard(task)
        failed = task.cancelled() or task.exception() is not None  # (retrieves it)
        callbacks, self._pending_callbacks = self._pending_callbacks, []
        if not callbacks:
            return
        if failed or task.result().done():
            for callback in callbacks:
                callback(self)
            return
        for callback in callbacks:
            task.result().add_done_callback(lambda _call, cb=callback: cb(self))

    def _result(self) -> Any:
        """The chain's call when it has ended with one, else None."""
        task = self._task
        if not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    # -- grpc.aio.Call ---------------------------------------------------------
    def cancel(self) -> bool:
        task = self._task
        if not task.done():
            return task.cancel()
        call = self._result()
        return False if call is None else call.cancel()

    def cancelled(self) -> bool:
        task = self._task
        if task.cancelled():
            return True
        if not task.done():
            return False
        error = task.exception()
        if error is not None:
            return (
                isinstance(error, grpc.aio.AioRpcError)
                and error.code() is grpc.StatusCode.CANCELLED
            )
        call: grpc.aio.Call = task.result()
        return call.cancelled()

    def done(self) -> bool:
        task = self._task
        if not task.done():
            return False
        call = self._result()
        return True if call is None else call.done()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if not self._task.done():
            self._pending_callbacks.append(callback)
            return
        call = self._result()
        if call is None or call.done():
            callback(self)
        else:
            call.add_done_callback(lambda _call: callback(self))

    def time_remaining(self) -> float | None:
        call = self._result()
        if call is not None:
            remaining: float | None = call.time_remaining()
            return remaining
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    async def initial_metadata(self) -> Any:
        try:
            call = await self._task
        except grpc.aio.AioRpcError as err:
            return err.initial_metadata()
        except asyncio.CancelledError:
            return None
        return await call.initial_metadata()

    async def trailing_metadata(self) -> Any:
        try:
            call = await self._task
        except grpc.aio.AioRpcError as err:
            return err.trailing_metadata()
        except asyncio.CancelledError:
            return None
        return await call.trailing_metadata()

    async def code(self) -> grpc.StatusCode:
        try:
            call = await self._task
        except grpc.aio.AioRpcError as err:
            return err.code()
        except asyncio.CancelledError:
            return grpc.StatusCode.CANCELLED
        code: grpc.StatusCode = await call.code()
        return code

    async def details(self) -> str:
        try:
            call = await self._task
        except grpc.aio.AioRpcError as err:
            return err.details() or ""
        except asyncio.CancelledError:
            return _CANCELLED_DETAILS
        details: str = await call.details()
        return details

    async def debug_error_string(self) -> str | None:
        try:
            call = await self._task
        except grpc.aio.AioRpcError as err:
            return err.debug_error_string()
        except asyncio.CancelledError:
            return ""
        reader = getattr(call, "debug_error_string", None)
        return None if reader is None else await reader()

    async def wait_for_connection(self) -> None:
        call = await self._task
        await call.wait_for_connection()


class _UnaryResponse(_InterceptedCall):
    def _wrap(self, result: Any) -> Any:
        return _ResponseCall(result)

    def __await__(self) -> Any:
        return self._response().__await__()

    async def _response(self) -> Any:
        call = await self._task
        return await call


class _StreamResponse(_InterceptedCall):
    _responses: AsyncIterator[Any] | None = None

    def _wrap(self, result: Any) -> Any:
        return _ResponsesCall(self._last, result)

    async def _iterate(self) -> AsyncIterator[Any]:
        call = await self._task
        async for response in call:
            yield response

    def __aiter__(self) -> AsyncIterator[Any]:
        if self._responses is None:
            self._responses = self._iterate()
        return self._responses

    async def read(self) -> Any:
        try:
            return await anext(self.__aiter__())
        except StopAsyncIteration:
            return grpc.aio.EOF


class _RequestWriter:
    """write() / done_writing() for a stream-request call invoked without a
    request iterator: the chain gets an iterator fed by them (one request
    in flight at a time)."""

    _END = object()
    _task: asyncio.Task[Any]
    _queue: asyncio.Queue[Any] | None = None
    _half_closed = False

    def _prepare(self, request_iterator: Any) -> Any:
        if request_iterator is not None:
            return request_iterator
        self._queue = asyncio.Queue(maxsize=1)
        return self._written()

    async def _written(self) -> AsyncIterator[Any]:
        assert self._queue is not None
        while True:
            request = await self._queue.get()
            if request is self._END:
                return
            yield request

    async def _put(self, item: Any, call: Any) -> None:
        """Queue ``item`` unless the call ends first."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        ended = loop.create_future()

        def on_done(_call: object) -> None:
            if not ended.done():
                ended.set_result(None)

        call.add_done_callback(on_done)
        put = loop.create_task(self._queue.put(item))
        try:
            await asyncio.wait((put, ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not put.done():
                put.cancel()

    async def _writable(self) -> Any:
        if self._queue is None:
            raise grpc.aio.UsageError(_MIXED_API)
        try:
            call = await self._task
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            raise asyncio.InvalidStateError(_FINISHED) from None
        if call.done():
            raise asyncio.InvalidStateError(_FINISHED)
        return call

    async def write(self, request: Any) -> None:
        call = await self._writable()
        if self._half_closed:
            raise asyncio.InvalidStateError(_HALF_CLOSED)
        await self._put(request, call)
        if call.done():
            raise asyncio.InvalidStateError(_FINISHED)

    async def done_writing(self) -> None:
        if self._queue is None:
            raise grpc.aio.UsageError(_MIXED_API)
        try:
            call = await self._task
        except asyncio.CancelledError:
            raise asyncio.InvalidStateError(_FINISHED) from None
        if not self._half_closed and not call.done():
            self._half_closed = True
            await self._put(self._END, call)


class InterceptedUnaryUnaryCall(_UnaryResponse, grpc.aio.UnaryUnaryCall[Any, Any]):
    _hook = "intercept_unary_unary"
    _result_type = grpc.aio.UnaryUnaryCall


class InterceptedUnaryStreamCall(_StreamResponse, grpc.aio.UnaryStreamCall[Any, Any]):
    _hook = "intercept_unary_stream"
    _result_type = grpc.aio.UnaryStreamCall


class InterceptedStreamUnaryCall(
    _RequestWriter, _UnaryResponse, grpc.aio.StreamUnaryCall[Any, Any]
):
    _hook = "intercept_stream_unary"
    _result_type = grpc.aio.StreamUnaryCall


class InterceptedStreamStreamCall(
    _RequestWriter, _StreamResponse, grpc.aio.StreamStreamCall[Any, Any]
):
    _hook = "intercept_stream_stream"
    _result_type = grpc.aio.StreamStreamCall


# -- the multicallables ------------------------------------------------------------


class _InterceptedMultiCallable:
    """Builds the call details and the intercepted call; ``plain`` is the
    pyxds multicallable of the same method, ``make`` builds one for another
    method (an interceptor may change it)."""

    _call_type: type[_InterceptedCall] = _InterceptedCall

    def __init__(
        self, plain: Any, method: str, make: Callable[[str], Any], interceptors: Sequence[Any]
    ) -> None:
        self._plain = plain
        self._method = method
        self._method_bytes = method.encode()
        self._make = make
        self._interceptors = tuple(interceptors)

    def _multicallable(self, method: str) -> Any:
        return self._plain if method == self._method else self._make(method)

    def _start(
        self,
        request: Any,
        timeout: float | None,
        metadata: Any,
        credentials: grpc.CallCredentials | None,
        wait_for_ready: bool | None,
        compression: grpc.Compression | None,
    ) -> Any:
        if self._plain._core.closed:  # as the plain multicallables (grpc.aio's words)
            raise grpc.aio.UsageError("Channel is closed.")
        if metadata is None:
            metadata = grpc.aio.Metadata()
        elif not isinstance(metadata, grpc.aio.Metadata):
            metadata = grpc.aio.Metadata.from_tuple(tuple(metadata))
        details = grpc.aio.ClientCallDetails(
            self._method_bytes,  # type: ignore[arg-type]  # bytes, as grpc.aio's own (stubs: str)
            timeout,
            metadata,
            credentials,
            wait_for_ready,
        )
        return self._call_type(
            self._interceptors, details, request, self._multicallable, compression
        )


class _UnaryRequest(_InterceptedMultiCallable):
    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        return self._start(request, timeout, metadata, credentials, wait_for_ready, compression)


class _StreamRequest(_InterceptedMultiCallable):
    def __call__(
        self,
        request_iterator: Any = None,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        return self._start(
            request_iterator, timeout, metadata, credentials, wait_for_ready, compression
        )


class InterceptedUnaryUnary(_UnaryRequest, grpc.aio.UnaryUnaryMultiCallable[Any, Any]):
    _call_type = InterceptedUnaryUnaryCall


class InterceptedUnaryStream(_UnaryRequest, grpc.aio.UnaryStreamMultiCallable[Any, Any]):
    _call_type = InterceptedUnaryStreamCall


class InterceptedStreamUnary(_StreamRequest, grpc.aio.StreamUnaryMultiCallable[Any, Any]):
    _call_type = InterceptedStreamUnaryCall


class InterceptedStreamStream(_StreamRequest, grpc.aio.StreamStreamMultiCallable[Any, Any]):
    _call_type = InterceptedStreamStreamCall


INTERCEPTED: dict[str, type[_InterceptedMultiCallable]] = {
    "unary_unary": InterceptedUnaryUnary,
    "unary_stream": InterceptedUnaryStream,
    "stream_unary": InterceptedStreamUnary,
    "stream_stream": InterceptedStreamStream,
}
