"""grpc.aio's unary-unary call without its task (issue 18 item 2: cost per
RPC of ``pyxds.aio``).

Theory of operation
-------------------

A ``grpc.aio`` unary-unary call (``grpc/aio/_call.py``, ``UnaryUnaryCall``)
runs its one coroutine, ``_invoke`` (serialize, the Cython call's one
batch, deserialize), in an ``asyncio.Task`` of its own, and the application
awaits that task: per RPC a task, its first step one loop iteration after
the call was made, and one more loop iteration when it ends to wake the
awaiter.

:class:`LeanAioUnaryUnary` stands in for one grpc.aio unary-unary
multicallable without interceptors (same call signature).  A call is a
:class:`LeanUnaryUnaryCall`: grpcio's own ``UnaryUnaryCall`` class (every
method the application or pyxds uses on it is grpcio's: ``cancel``,
``code``, ``details``, metadata, ``done``, done callbacks,
``wait_for_connection``, ``__del__``; ``__await__`` is grpcio's
``_UnaryResponseMixin.__await__`` with the wait of 3. below folded into
it, one generator less per call) built as grpcio builds it (the
metadata by grpcio's ``_init_metadata``, the Cython call, the census
context, the channel's registration of the call, which its ``close()``
cancels), except that ``_invoke`` is stepped the way a task steps it,
without a task:

1. its first step runs when the call is made (the batch is started then,
   not one loop iteration later);
2. each later step runs as a done callback of the future the coroutine
   waits on (the Cython batch's);
3. its result (or exception) is set on a plain future, held by a
   :class:`_Response` that stands where grpcio keeps its task
   (``_invocation_task``, ``_call_response``); awaiting it waits on the
   batch's own future, so the awaiter wakes in the loop iteration of the
   step that ends the call, not one later.

Measured (in-process, interleaved, client CPU per RPC against plain
grpc.aio on the same loop): sequential calls 1.00-1.02x plain with the lean
call against 1.09-1.26x without; 4 concurrent tasks 1.13-1.20x against
1.07-1.18x (the batch started at once rather than one iteration later
coalesces less with the other tasks' calls: starting it one iteration later
made 4 tasks 1.06-1.16x and sequential calls lose the gain).

:meth:`LeanAioUnaryUnary.call` (what pyxds's aio call starts its attempts
with) also does inline what grpcio's multicallable does through three more
Python calls, with the same effect: the deadline (``_timeout_to_deadline``);
no metadata as an empty tuple (``_init_metadata`` makes an empty
``Metadata`` of it, which ``Call.__init__`` turns into that tuple); the
channel's registration of the call (``_register_call``: the call in the
channel's weak set, its removal a done callback, through
``Call.add_done_callback``'s own steps); and the caller's done callback
added the way ``Call.add_done_callback`` adds it.

Cancelling (grpcio's ``cancel()``: the Cython call's cancel, then the
future's) ends the batch in C-core, and ``_invoke`` ends as it does when
its task is cancelled (the call ``done()``, ``code()`` CANCELLED, the
awaiter's ``CancelledError``).

Calls it does not take (grpcio's own multicallable makes them): call
credentials, compression, and multicallables with interceptors.

Enabled only on a grpcio whose functions it mirrors or relies on are,
line for line, the ones it was checked against (:data:`VERIFIED`, a
fingerprint of their source text), and checked by differential tests
against grpc.aio's own channel for every outcome
(tests/e2e/test_conformance_aio_unary_lean.py).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Callable, Coroutine, Generator, Sequence
from functools import partial
from typing import Any

import grpc

from pyxds.channel.grpc_unary import checked, source_fingerprint

__all__ = ["VERIFIED", "LeanAioUnaryUnary", "available", "fingerprint", "lean"]

_log = logging.getLogger(__name__)

#: fingerprints (:func:`fingerprint`) of the grpcio sources checked
VERIFIED = {
    "1a8ce67cf25715796cbd288b7518f22e1a307c9028bdc27301b8b7bc91bf64af": "grpcio 1.85.3",
}
#: whether grpc.aio unary calls go the lean way (tests compare both ways)
ENABLED = True

_AVAILABLE: bool | None = None
_LeanCall: Any = None


def _mirrored() -> list[Any]:
    """The grpcio functions whose behaviour the lean call repeats or relies on."""
    channel: Any = importlib.import_module("grpc.aio._channel")
    call: Any = importlib.import_module("grpc.aio._call")
    utils: Any = importlib.import_module("grpc.aio._utils")
    mc = channel.UnaryUnaryMultiCallable
    return [
        channel._BaseMultiCallable.__init__,
        channel._BaseMultiCallable._init_metadata,
        mc.__call__,
        channel.Channel._register_call,
        call.Call.__init__,
        call.Call.__del__,
        call.Call.cancel,
        call.Call._cancel,
        call.Call.done,
        call.Call.add_done_callback,
        call._UnaryResponseMixin._init_unary_response_mixin,
        call._UnaryResponseMixin.cancel,
        call._UnaryResponseMixin.__await__,
        call.UnaryUnaryCall.__init__,
        call.UnaryUnaryCall._invoke,
        call.UnaryUnaryCall.wait_for_connection,
        utils._timeout_to_deadline,
        call._create_rpc_error,
    ]


def fingerprint() -> str:
    """SHA-256 of the source lines of the mirrored grpcio functions."""
    return source_fingerprint(_mirrored())


def available() -> bool:
    """Whether this grpcio is one the lean call was checked against."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = checked(fingerprint, VERIFIED, _bind)
        if not _AVAILABLE:
            _log.debug("pyxds: grpcio %s: plain grpc.aio unary calls", grpc.__version__)
    return _AVAILABLE


def lean(mc: Any) -> Any:
    """``mc`` (a grpc.aio multicallable) as a :class:`LeanAioUnaryUnary`
    when it is a unary-unary one without interceptors and this grpcio was
    checked; else ``mc``."""
    if not ENABLED or type(mc).__module__ != "grpc.aio._channel" or not available():
        return mc
    if type(mc) is not _UnaryUnaryMultiCallable or mc._interceptors:
        return mc
    return LeanAioUnaryUnary(mc)


class LeanAioUnaryUnary:
    """One grpc.aio unary-unary multicallable, called the lean way (see the
    module docstring)."""

    __slots__ = ("_mc",)

    def __init__(self, mc: Any) -> None:
        self._mc = mc

    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str | bytes]] | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        if credentials is not None or compression is not None:
            return self._mc(
                request,
                timeout=timeout,
                metadata=metadata,
                credentials=credentials,
                wait_for_ready=wait_for_ready,
                compression=compression,
            )
        return self.call(request, timeout, metadata, wait_for_ready)

    def call(
        self,
        request: Any,
        timeout: float | None,
        metadata: Sequence[tuple[str, str | bytes]] | None,
        wait_for_ready: bool | None,
        on_done: Callable[[Any], None] | None = None,
    ) -> Any:
        """A call without call credentials or compression, its arguments in
        order (what pyxds's aio call starts each attempt with).
        ``on_done(call)`` is added as the call's done callback, as grpcio's
        ``add_done_callback`` adds it (one Python frame less per call)."""
        mc = self._mc
        call = _LeanCall(
            request,
            None if timeout is None else time.time() + timeout,  # _timeout_to_deadline
            # grpcio's _init_metadata makes an empty Metadata of no metadata,
            # which Call.__init__ makes an empty tuple: () at once
            mc._init_metadata(metadata, None) if metadata else (),
            None,
            wait_for_ready,
            mc._channel,
            mc._method,
            mc._request_serializer,
            mc._response_deserializer,
            mc._loop,
            mc._registered_call_handle,
        )
        # grpcio's Channel._register_call (which its close() cancels) and
        # Call.add_done_callback, inline: two Python frames less per call
        active = mc._python_channel._active_calls
        active.add(call)
        add_done_callback = call._cython_call.add_done_callback
        add_done_callback(partial(active.discard, call))
        if on_done is not None:
            add_done_callback(partial(on_done, call))
        return call


def _make_call_class(
    unary_unary_call: Any, call_init: Any, build_census_context: Any, eof: Any, rpc_error: Any
) -> Any:
    """grpcio's ``UnaryUnaryCall`` with its coroutine stepped without a task."""

    class LeanUnaryUnaryCall(unary_unary_call):  # type: ignore[misc]  # grpcio's class (Any)
        """grpcio's unary-unary call whose ``_invoke`` runs without a task."""

        _coro: Coroutine[Any, Any, Any]

        def __init__(
            self,
            request: Any,
            deadline: float | None,
            metadata: Any,
            credentials: Any,
            wait_for_ready: bool | None,
            channel: Any,
            method: bytes,
            request_serializer: Callable[[Any], bytes] | None,
            response_deserializer: Callable[[bytes], Any] | None,
            loop: asyncio.AbstractEventLoop,
            registered_call_handle: int = 0,
        ) -> None:
            # grpcio's UnaryUnaryCall.__init__, the task aside
            call_init(
                self,
                channel.call(method, deadline, credentials, wait_for_ready, registered_call_handle),
                metadata,
                request_serializer,
                response_deserializer,
                loop,
            )
            self._request = request
            self._context = build_census_context()
            response = _Response(loop.create_future())
            self._invocation_task = response
            self._init_unary_response_mixin(response)
            self._coro = self._invoke()
            self._step()

        def _step(self, _waited: Any = None, error: BaseException | None = None) -> None:
            """One step of ``_invoke``, as a task steps its coroutine."""
            response = self._invocation_task.future
            self._invocation_task.waiting = None
            try:
                waited = self._coro.send(None) if error is None else self._coro.throw(error)
            except StopIteration as end:
                if not response.done():
                    response.set_result(end.value)
                return
            except asyncio.CancelledError:
                response.cancel()
                return
            except (KeyboardInterrupt, SystemExit) as err:
                if not response.done():
                    response.set_exception(err)
                raise
            except BaseException as err:
                if not response.done():
                    response.set_exception(err)
                return
            if getattr(waited, "_asyncio_future_blocking", None):
                waited._asyncio_future_blocking = False
                waited.add_done_callback(self._step)
                self._invocation_task.waiting = waited
            elif waited is None:  # a bare yield: the next iteration
                self._loop.call_soon(self._step)
            else:  # what a task refuses, thrown in as a task throws it
                self._loop.call_soon(self._step, None, RuntimeError(f"bad yield: {waited!r}"))

        def __await__(self) -> Generator[Any, None, Any]:
            """grpcio's ``_UnaryResponseMixin.__await__`` with
            :meth:`_Response.__await__` folded in (one generator less to
            resume, twice per call)."""
            held = self._invocation_task
            future = held.future
            try:
                while not future.done():
                    waiting = held.waiting
                    if waiting is None or waiting.done():
                        break
                    waiting._asyncio_future_blocking = True
                    yield waiting
                response = yield from future
            except asyncio.CancelledError:
                if not self.cancelled():
                    self.cancel()
                raise
            if response is eof:
                if self._cython_call.is_locally_cancelled():
                    raise asyncio.CancelledError()
                raise rpc_error(self._cython_call._initial_metadata, self._cython_call._status)
            return response

    return LeanUnaryUnaryCall


class _Response:
    """Where grpcio keeps its call's task: ``future`` gets ``_invoke``'s
    result; awaiting this waits on the future ``_invoke`` waits on
    (``waiting``) while there is one, so the awaiter wakes in the loop
    iteration that runs the step which ends the call (the step's callback
    was added first, and runs first), and then returns ``future``'s result.
    Cancelling it cancels ``future`` (grpcio's ``cancel()`` cancels the
    Cython call first, which ends ``_invoke``)."""

    __slots__ = ("future", "waiting")

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future
        self.waiting: asyncio.Future[Any] | None = None

    def cancel(self) -> bool:
        return self.future.cancel()

    def __await__(self) -> Generator[Any, None, Any]:
        future = self.future
        while not future.done():
            waiting = self.waiting
            if waiting is None or waiting.done():
                break
            waiting._asyncio_future_blocking = True
            yield waiting
        return (yield from future)

    __iter__ = __await__


# grpcio's private names, bound by _bind() once this grpcio is known good
_UnaryUnaryMultiCallable: Any


def _bind() -> None:
    """Bind grpcio's private names this module uses (raises on a grpcio
    that lacks one)."""
    global _UnaryUnaryMultiCallable, _LeanCall
    channel: Any = importlib.import_module("grpc.aio._channel")
    call: Any = importlib.import_module("grpc.aio._call")
    cygrpc: Any = importlib.import_module("grpc._cython.cygrpc")
    _UnaryUnaryMultiCallable = channel.UnaryUnaryMultiCallable
    _LeanCall = _make_call_class(
        call.UnaryUnaryCall,
        call.Call.__init__,
        cygrpc.build_census_context,
        cygrpc.EOF,
        call._create_rpc_error,
    )
