"""Starting and reading grpcio calls: the one place pyxds touches grpcio's
call objects (sync and ``grpc.aio`` alike).

Starting (one way per call kind): a pyxds multicallable holds one
:class:`GrpcMethod` (the call kind, the method, its serializers).  An
attempt starts on the picked subchannel's transport with
:meth:`GrpcMethod.start`: the grpcio (or grpc.aio) multicallable of that
transport's channel, cached on the transport per (kind, method,
serializers), called with the attempt's metadata (``Rpc.send_metadata``),
the time left to the deadline, never waiting for ready (the pyxds channel
did the waiting).  A unary-unary one is called the lean way: sync
(:class:`pyxds.channel.grpc_unary.LeanUnaryUnary`: grpcio's own blocking
call without the bookkeeping its OK outcome does not use) and grpc.aio
(:class:`pyxds.channel.grpc_aio_unary.LeanAioUnaryUnary`: grpcio's own call
object, its coroutine stepped without a task).  While A66
metrics are on, an attempt gets a multicallable of its own whose
serializers count its message bytes
(:func:`pyxds.channel.call_metrics.counting`).

Reading: :func:`call_metadata` reads a finished call's (initial, trailing)
metadata without blocking or awaiting; :func:`unary_status` words a
unary-response call's deadline and close as grpcio's own channel does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from pyxds.channel.call_metrics import counting
from pyxds.channel.grpc_authority import with_host
from pyxds.channel.grpc_unary import lean, lean_on
from pyxds.channel.request_buffer import Replay
from pyxds.status import Status

if TYPE_CHECKING:
    from pyxds.channel.rpc import Rpc
    from pyxds.channel.subchannel import Transport

__all__ = [
    "NO_REQUEST",
    "SERIALIZE_FAILED",
    "GrpcMethod",
    "call_metadata",
    "trailing_metadata_of",
    "stream_status",
    "unary_status",
]

_log = logging.getLogger(__name__)

#: grpcio multicallables cached per transport (per kind, method and serializers)
_MAX_CACHED = 1024

#: grpcio's status for a request its serializer could not serialize
SERIALIZE_FAILED = Status(grpc.StatusCode.INTERNAL, "Exception serializing request!")

#: a grpc.aio client-streaming call started without a request iterator
#: (the application writes its requests with ``write()``)
NO_REQUEST: Any = object()

DEADLINE_EXCEEDED = Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
_STREAM_DEADLINE = "Stream removed (Deadline Exceeded)"
#: a unary call's end as C-core words it on a channel without its retry
#: filter (the subchannels' grpcio channels have retries off), and as
#: grpcio's own channel words it
_GRPCIO_WORDS = {
    (grpc.StatusCode.DEADLINE_EXCEEDED, _STREAM_DEADLINE): DEADLINE_EXCEEDED,
    (grpc.StatusCode.CANCELLED, "Stream removed (Channel closed!)"): Status(
        grpc.StatusCode.CANCELLED, "Channel closed!"
    ),
}


def unary_status(status: Status) -> Status:
    """``status`` of a unary-response call as grpcio's own channel words it:
    its deadline is DEADLINE_EXCEEDED "Deadline Exceeded", a call cut by the
    channel's ``close()`` CANCELLED "Channel closed!" (sync, future and aio
    calls share this one rule; streams keep C-core's words, as grpcio)."""
    if status.details.startswith("Stream removed ("):
        return _GRPCIO_WORDS.get((status.code, status.details), status)
    return status


def stream_status(status: Status, committed: bool, headers: bool) -> Status:
    """``status`` of a response-streaming call as grpcio's own channel words
    it: C-core's retry filter (on in a grpcio channel, off in the
    subchannels' channels) ends a call its deadline caught before any
    response header (``headers``) or message (``committed``)
    DEADLINE_EXCEEDED "Deadline Exceeded"; once they arrived the transport's
    "Stream removed (Deadline Exceeded)" stands (grpcio 1.85, live, sync and
    aio: tests/e2e/test_conformance_grpcio_sync_api.py and
    test_conformance_grpcio_aio_channel.py).  A failure path only."""
    if not committed and not headers and status.details == _STREAM_DEADLINE:
        return DEADLINE_EXCEEDED
    return status


def _make(transport: Transport, kind: str, method: str, ser: Any, deser: Any) -> Any:
    """A grpcio (or grpc.aio) multicallable of ``kind`` on the transport's channel.

    Never registered with C-core (``_registered_method``): a registered
    grpcio call enters grpcio's observability context twice per call, and
    registering costs more than it saves (callgrind, per unary RPC on the
    calling thread: sync 258k instructions registered, 245.5k not; aio 321k
    and 308k; a fresh registered multicallable for one attempt adds ~18 us).
    A unary-unary one is called the lean way: sync (:mod:`grpc_unary`) and
    grpc.aio (:mod:`grpc_aio_unary`).
    """
    if kind == "unary_unary" and not transport.runs_on_event_loop:
        return lean_on(transport.channel, method, ser, deser)
    return _lean(getattr(transport.channel, kind)(method, ser, deser), kind, transport)


def _lean(mc: Any, kind: str, transport: Transport) -> Any:
    """``mc`` called the lean way when it is a unary-unary one."""
    if kind != "unary_unary":
        return mc
    if transport.runs_on_event_loop:
        return (_aio_lean or _load_aio_lean())(mc)
    return lean(mc)


def _make_with_authority(
    transport: Transport, kind: str, method: str, ser: Any, deser: Any, authority: str
) -> Any:
    """:func:`_make` for attempts whose ``:authority`` is ``authority`` (A81,
    :mod:`pyxds.channel.grpc_authority`)."""
    if transport.runs_on_event_loop:
        channel = transport.authority_channel(authority)
        return _lean(getattr(channel, kind)(method, ser, deser), kind, transport)
    mc = with_host(getattr(transport.channel, kind)(method, ser, deser), authority)
    return _lean(mc, kind, transport)


#: :func:`pyxds.channel.grpc_aio_unary.lean`, loaded with the first grpc.aio
#: unary multicallable (a sync program never loads it)
_aio_lean: Callable[[Any], Any] | None = None


def _load_aio_lean() -> Callable[[Any], Any]:
    global _aio_lean
    from pyxds.channel.grpc_aio_unary import lean as aio_lean

    _aio_lean = aio_lean
    return aio_lean


class GrpcMethod:
    """One call kind of one method (what a pyxds multicallable starts its
    attempts with).  ``serialized``: the request is already bytes (a
    ``future()`` or response-streaming call serializes it up front, as
    grpcio does, so that a request it cannot serialize fails at once)."""

    __slots__ = (
        "kind",
        "method",
        "serializer",
        "deserializer",
        "lean_key",
        "_key",
        "_key_serialized",
    )

    def __init__(
        self,
        kind: str,
        method: str,
        serializer: Callable[[Any], bytes] | None,
        deserializer: Callable[[bytes], Any] | None,
    ) -> None:
        self.kind = kind
        self.method = method
        self.serializer = serializer
        self.deserializer = deserializer
        self._key = (kind, method, serializer, deserializer)
        self._key_serialized = (kind, method, None, deserializer)
        #: a unary-unary method's key of its transport's cached multicallable
        #: (:attr:`Transport.callables`, filled by :meth:`multicallable`),
        #: which the aio call may call directly; None for other kinds
        self.lean_key = self._key if kind == "unary_unary" else None

    def multicallable(self, transport: Transport, rpc: Rpc, serialized: bool = False) -> Any:
        """The grpcio multicallable of ``rpc``'s attempt on ``transport``."""
        ser = None if serialized else self.serializer
        sizes = rpc.metrics.sizes if rpc.metrics is not None else None
        if sizes is not None:  # A66: the attempt's own, counting its bytes
            counted_ser, counted_deser = counting(sizes, ser, self.deserializer)
            return _make(transport, self.kind, self.method, counted_ser, counted_deser)
        key = self._key_serialized if serialized else self._key
        callables = transport.callables
        mc = callables.get(key)
        if mc is None:
            mc = _make(transport, self.kind, self.method, ser, self.deserializer)
            if len(callables) >= _MAX_CACHED:  # e.g. lambdas as serializers
                callables.clear()
            callables[key] = mc
        return mc

    def with_authority(
        self, transport: Transport, rpc: Rpc, serialized: bool, authority: str
    ) -> Any:
        """The grpcio multicallable of ``rpc``'s attempt on ``transport``
        with ``authority`` as its ``:authority`` (A81), cached on the
        transport per authority (but an A66 attempt's own, counting bytes)."""
        ser = None if serialized else self.serializer
        sizes = rpc.metrics.sizes if rpc.metrics is not None else None
        if sizes is not None:
            counted_ser, counted_deser = counting(sizes, ser, self.deserializer)
            return _make_with_authority(
                transport, self.kind, self.method, counted_ser, counted_deser, authority
            )
        key = (authority, self._key_serialized if serialized else self._key)
        callables = transport.callables
        mc = callables.get(key)
        if mc is None:
            mc = _make_with_authority(
                transport, self.kind, self.method, ser, self.deserializer, authority
            )
            if len(callables) >= _MAX_CACHED:
                callables.clear()
            callables[key] = mc
        return mc

    def start(
        self,
        transport: Transport,
        rpc: Rpc,
        request: Any,
        credentials: Any,
        compression: Any,
        verb: str | None = None,
        serialized: bool = False,
    ) -> Any:
        """Start ``rpc``'s attempt on ``transport``: the multicallable's
        ``verb`` (``with_call``, ``future``; None: the call itself) with the
        request (``request.attempt()`` for a client stream's replay; none at
        all for :data:`NO_REQUEST`)."""
        mc = None
        if rpc.pick_metadata is None:
            metadata = rpc.send_metadata
        else:
            metadata = rpc.attempt_metadata()
            authority = rpc.pick_authority()
            if authority is not None:
                mc = self.with_authority(transport, rpc, serialized, authority)
        if mc is None and rpc.metrics is None:  # the common case: the transport's cached one
            mc = transport.callables.get(self._key_serialized if serialized else self._key)
        if mc is None:
            mc = self.multicallable(transport, rpc, serialized)
        if verb is not None:
            mc = getattr(mc, verb)
        if isinstance(request, Replay):
            request = request.attempt()
        if request is NO_REQUEST:
            return mc(
                timeout=rpc.timeout,
                metadata=metadata,
                credentials=credentials,
                wait_for_ready=False,
                compression=compression,
            )
        return mc(
            request,
            timeout=rpc.timeout,
            metadata=metadata,
            credentials=credentials,
            wait_for_ready=False,
            compression=compression,
        )


def call_metadata(call: Any) -> tuple[Any, Any]:
    """(initial, trailing) metadata of a finished grpcio call (a sync call
    object or the ``grpc.RpcError`` it raised, or a ``grpc.aio`` call), read
    without blocking or awaiting; None for what cannot be read.  A sync
    rendezvous' ``initial_metadata()`` waits for its receive-initial-metadata
    batch, which can complete after the status (on the very thread running
    the terminal callback), and a grpc.aio call's readers are coroutines: both
    keep what arrived on their state (the rendezvous' ``_state``, the aio
    call's Cython call), which is read directly."""
    cython_call = getattr(call, "_cython_call", None)
    if cython_call is not None:
        raw = getattr(cython_call, "_status", None)
        trailing = raw.trailing_metadata() if raw is not None else None
        return getattr(cython_call, "_initial_metadata", None), trailing
    state = getattr(call, "_state", None)
    if state is not None and hasattr(state, "initial_metadata"):
        return state.initial_metadata, getattr(state, "trailing_metadata", None)
    return _read(call, "initial_metadata"), _read(call, "trailing_metadata")


def _read(call: Any, name: str) -> Any:
    reader = getattr(call, name, None)
    if reader is None:
        return None
    try:
        value = reader()
    except Exception:
        return None
    if hasattr(value, "close") and hasattr(value, "send"):  # a coroutine
        value.close()
        return None
    return value


def trailing_metadata_of(call: Any) -> tuple[tuple[str, Any], ...]:
    """The trailing metadata of a finished grpcio call as ``(key, value)``
    pairs (:func:`call_metadata`); empty when nothing can be read."""
    metadata = call_metadata(call)[1]
    if not metadata:
        return ()
    return tuple((item[0], item[1]) for item in metadata)
