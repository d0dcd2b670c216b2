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
cancels), except that ``_invoke`` runs without a task and without a
coroutine of its own: what it does before its one ``await`` is done when
the call is made (the request serialized by grpcio's ``_common.serialize``,
as is without a serializer), the coroutine it awaits (the Cython call's
``unary_unary``) is stepped the way a task steps it, and what it does
after (the response deserialized by ``_common.deserialize`` when the
status is OK, else ``EOF``; a ``CancelledError`` cancels the call unless
it is already, and ends with ``EOF``) when that coroutine ends (one
coroutine less to make and to resume twice per call, and two Python
frames less each way without a serializer):

1. its first step runs when the call is made (the batch is started then,
   not one loop iteration later);
2. each later step runs when the future the coroutine waits on (the
   Cython batch's) is done: in the wake-up of the call's awaiter, which
   yields that very future (``__await__``: it takes the step's done
   callback off the future and runs the step itself when it wakes, so a
   completion costs one scheduled callback, not two); with no awaiter (a
   call not awaited yet, or only through ``wait_for_connection``), or
   once the awaiter leaves early (cancelled, closed: the callback is put
   back, or the step run at once when the future is done already, in
   the order a callback would have run it), as a done callback of that
   future;
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
with) also does inline what grpcio's multicallable does through more
Python calls, with the same effect: grpcio's ``UnaryUnaryCall.__init__``
(with ``Call.__init__`` and ``_init_unary_response_mixin``: the same
attributes, set in the same order, the object made without ``__init__``);
the loop's ``create_future`` where it is asyncio's own; the deadline
(``_timeout_to_deadline``);
no metadata as an empty tuple (``_init_metadata`` makes an empty
``Metadata`` of it, which ``Call.__init__`` turns into that tuple); the
channel's registration of the call as a subchannel's channel registers it
(:func:`pyxds.channel.aio_live_calls.keep_until_freed`: the call in the
channel's weak set, which its ``close()`` cancels, until the call is freed;
the weak set's ``add`` done on its members directly, one weak reference
in, where this Python's ``WeakSet`` is CPython's and no removal is
pending, else through its method); and the caller's done callback added
the way ``Call.add_done_callback`` adds it.

Cancelling (grpcio's ``cancel()``: the Cython call's cancel, then the
future's) ends the batch in C-core, and the call ends as ``_invoke`` ends
when its task is cancelled (the call ``done()``, ``code()`` CANCELLED, the
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
import time
import weakref
from collections.abc import Callable, Coroutine, Generator, Sequence
from functools import partial
from typing import Any

import grpc

from pyxds.channel.grpc_unary import GrpcioCheck, checked, code_fingerprint, source_fingerprint

__all__ = ["VERIFIED", "LeanAioUnaryUnary", "available", "fingerprint", "lean", "sources"]

#: fingerprints of the grpcio functions checked: of their code
#: (:func:`fingerprint`, one per CPython minor version), and of their source
#: text (:func:`sources`, any Python); written by scripts/fingerprint_grpcio.py
VERIFIED = {
    # their code (:func:`fingerprint`) on CPython 3.11, 3.12, 3.13
    "e351d45179539f9f895987de12306970fdd0cd2c6a0954630bbc0e6ccc1e98e6": "grpcio 1.85.3",
    "eab228cadaf4b0ee6102f65b3e2cc14298d5c7f419d7e72dbe4ecbfbfe6bae6f": "grpcio 1.85.3",
    "78cffa164d7ad3a43b451b1feb8a9634435befe838a21c5b974247bac61f7082": "grpcio 1.85.3",
    # their source text (:func:`sources`), any Python
    "ed08d65ce1d36767600cdb77029d4489c1ac44603b3891dbe0141fbb37fafde5": "grpcio 1.85.3",
}
#: whether grpc.aio unary calls go the lean way (tests compare both ways)
ENABLED = True

_LeanCall: Any = None
#: asyncio's own create_future (a loop whose class keeps it makes plain Futures)
_BASE_CREATE_FUTURE = asyncio.BaseEventLoop.create_future
_new_object = object.__new__
_WeakSet: Any = weakref.WeakSet  # (Any: its private members are read below)
_weakref = weakref.ref


def _weakset_inline() -> bool:
    """Whether this Python's ``WeakSet`` keeps its members as CPython's does
    (weak references with its ``_remove`` callback in a set ``data``,
    removals deferred while iterating in ``_pending_removals``), which the
    lean call adds to and discards from directly."""
    probe: Any = weakref.WeakSet()
    return (
        isinstance(getattr(probe, "data", None), set)
        and callable(getattr(probe, "_remove", None))
        and isinstance(getattr(probe, "_pending_removals", None), list)
    )


_WEAKSET_INLINE = _weakset_inline()


def _mirrored() -> list[Any]:
    """The grpcio functions whose behaviour the lean call repeats or relies on."""
    channel: Any = importlib.import_module("grpc.aio._channel")
    call: Any = importlib.import_module("grpc.aio._call")
    utils: Any = importlib.import_module("grpc.aio._utils")
    common: Any = importlib.import_module("grpc._common")
    mc = channel.UnaryUnaryMultiCallable
    return [
        common._transform,
        common.serialize,
        common.deserialize,
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
    """The digest of the mirrored grpcio functions' code (``code_fingerprint``)."""
    return code_fingerprint(_mirrored())


def sources() -> str:
    """SHA-256 of the mirrored grpcio functions' source lines."""
    return source_fingerprint(_mirrored())


#: whether this grpcio is one the lean call was checked against
available = GrpcioCheck(
    lambda: checked((fingerprint, sources), VERIFIED, _bind), __name__, "plain grpc.aio unary calls"
)


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

    __slots__ = ("_mc", "_new_future")

    def __init__(self, mc: Any) -> None:
        self._mc = mc
        loop = mc._loop
        # loop.create_future() without its Python frame where it is
        # asyncio's own (BaseEventLoop's: a Future of this loop)
        self._new_future: Callable[[], asyncio.Future[Any]] = (
            partial(asyncio.Future, loop=loop)
            if getattr(type(loop), "create_future", None) is _BASE_CREATE_FUTURE
            else loop.create_future
        )

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
        deadline = None if timeout is None else time.time() + timeout  # _timeout_to_deadline
        # grpcio's _init_metadata makes an empty Metadata of no metadata,
        # which Call.__init__ makes an empty tuple: () at once
        metadata = mc._init_metadata(metadata, None) if metadata else ()
        # grpcio's UnaryUnaryCall.__init__ (with Call.__init__ and
        # _init_unary_response_mixin), inline and without the task: the
        # same attributes, set in the same order
        call = _new_object(_LeanCall)
        loop = mc._loop
        call._loop = loop
        call._cython_call = mc._channel.call(
            mc._method, deadline, None, wait_for_ready, mc._registered_call_handle
        )
        call._metadata = tuple(metadata)
        call._request_serializer = mc._request_serializer
        call._response_deserializer = mc._response_deserializer
        call._request = request
        call._context = _build_census_context()
        response = _new_object(_Response)
        response.future = self._new_future()
        response.waiting = None
        call._invocation_task = response
        call._call_response = response
        # grpcio's _invoke up to its await, inline: the request serialized
        # (_common.serialize: as is without a serializer), then the Cython
        # call's coroutine, stepped by _step (which ends it as _invoke does)
        serializer = call._request_serializer
        call._coro = call._cython_call.unary_unary(
            request if serializer is None else _serialize(request, serializer),
            call._metadata,
            call._context,
        )
        call._step()
        # the call in the channel's weak set (which its close() cancels)
        # until it is freed (pyxds.channel.aio_live_calls: a subchannel's
        # channel keeps its calls so); WeakSet.add inline
        active: Any = mc._python_channel._active_calls
        if _WEAKSET_INLINE and type(active) is _WeakSet and not active._pending_removals:
            active.data.add(_weakref(call, active._remove))
        else:
            active.add(call)
        if on_done is not None:  # Call.add_done_callback, inline
            call._cython_call.add_done_callback(partial(on_done, call))
        return call


def _make_call_class(unary_unary_call: Any, eof: Any, rpc_error: Any) -> Any:
    """grpcio's ``UnaryUnaryCall`` with its coroutine stepped without a task
    (built by :meth:`LeanAioUnaryUnary.call`, not by ``__init__``)."""

    class LeanUnaryUnaryCall(unary_unary_call):  # type: ignore[misc]  # grpcio's class (Any)
        """grpcio's unary-unary call whose ``_invoke`` runs without a task."""

        _coro: Coroutine[Any, Any, Any]
        _invocation_task: _Response

        def _step(self, _waited: Any = None, error: BaseException | None = None) -> None:
            """One step of ``_invoke``, as a task steps its coroutine (its
            Cython call's coroutine, ended here as ``_invoke`` ends it)."""
            response = self._invocation_task.future
            self._invocation_task.waiting = None
            try:
                try:
                    waited = self._coro.send(None) if error is None else self._coro.throw(error)
                except StopIteration as end:
                    # the end of _invoke: the response, or EOF for a status
                    # that is not OK (_common.deserialize: as is without one)
                    if self._cython_call.is_ok():
                        deserializer = self._response_deserializer
                        value = end.value
                        if deserializer is not None:
                            value = _deserialize(value, deserializer)
                    else:
                        value = eof
                    if not response.done():
                        response.set_result(value)
                    return
                except asyncio.CancelledError:
                    # _invoke's own handler: the call cancelled, EOF
                    if not self.cancelled():
                        self.cancel()
                    if not response.done():
                        response.set_result(eof)
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
            resume, twice per call), whose awaiter takes the call's next
            step itself (see the module docstring)."""
            held = self._invocation_task
            future = held.future
            try:
                while not future.done():
                    waiting = held.waiting
                    if waiting is None or waiting.done():
                        break
                    waiting._asyncio_future_blocking = True
                    # the step's own callback off: this awaiter's wake-up
                    # takes the step (another awaiter finds none: it waits)
                    if not waiting.remove_done_callback(self._step):
                        yield waiting
                        continue
                    try:
                        yield waiting
                    except BaseException:  # cancelled or closed: the step goes back
                        if held.waiting is waiting:
                            if waiting.done():
                                self._step()
                            else:
                                waiting.add_done_callback(self._step)
                        raise
                    if held.waiting is waiting:
                        if waiting.done():
                            self._step()
                        else:  # woken early (not by a task): the step waits again
                            waiting.add_done_callback(self._step)
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
_build_census_context: Callable[[], Any]
_serialize: Callable[[Any, Callable[[Any], bytes]], bytes]
_deserialize: Callable[[bytes, Callable[[bytes], Any]], Any]


def _bind() -> None:
    """Bind grpcio's private names this module uses (raises on a grpcio
    that lacks one)."""
    global _UnaryUnaryMultiCallable, _LeanCall, _build_census_context, _serialize, _deserialize
    channel: Any = importlib.import_module("grpc.aio._channel")
    common: Any = importlib.import_module("grpc._common")
    call: Any = importlib.import_module("grpc.aio._call")
    cygrpc: Any = importlib.import_module("grpc._cython.cygrpc")
    _UnaryUnaryMultiCallable = channel.UnaryUnaryMultiCallable
    _LeanCall = _make_call_class(call.UnaryUnaryCall, cygrpc.EOF, call._create_rpc_error)
    _build_census_context = cygrpc.build_census_context
    _serialize, _deserialize = common.serialize, common.deserialize
