"""The sync channel's multicallables (what ``channel.unary_unary(...)`` and
generated stubs return).

Each RPC: the channel core picks (ConfigSelector, then picker; waiting if
queued, bounded by the deadline), then the RPC is sent on the picked
subchannel's grpcio channel through a grpcio multicallable cached on that
subchannel's transport per (kind, method, serializers).  ``timeout`` is the
remaining time to the deadline (the user's timeout capped by the route's
max_stream_duration, A31).  The subchannel call itself never waits for
ready: the channel did the waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import grpc

from pyxds.channel import grpc_generic
from pyxds.channel.attempts import counting
from pyxds.channel.calls import (
    SERIALIZE_FAILED,
    ChannelRpcError,
    FutureCall,
    RequestReplay,
    StreamingCall,
    blocking_unary,
)
from pyxds.channel.core import ChannelCore, Rpc
from pyxds.channel.subchannel import Transport

#: grpcio multicallables cached per subchannel (per method and serializers).
_MAX_CACHED = 1024

_log = logging.getLogger(__name__)

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
#: call metadata as callers pass it (grpcio's stubs say a tuple of pairs)
Metadata = Sequence[tuple[str, str | bytes]]


def grpc_multicallable(
    transport: Transport, kind: str, method: str, ser: Any, deser: Any, registered: bool = True
) -> Any:
    """A grpcio (or grpc.aio) multicallable of ``kind`` on the transport's channel.

    ``registered``: registered with C-core (a cheaper call each time, for the
    multicallables cached per transport); one made for a single attempt is
    not, since registering costs more than it saves on one call (measured:
    a fresh registered multicallable adds ~18 us to an RPC, a plain one ~5 us).
    """
    make = getattr(transport.channel, kind)
    if not registered:
        return make(method, ser, deser)
    try:
        return make(method, ser, deser, _registered_method=True)
    except TypeError:  # older grpcio
        return make(method, ser, deser)


class _Base(Generic[_Request, _Response]):
    __slots__ = ("_core", "_method", "_ser", "_deser", "_key", "_kind")

    _kind_name = ""

    def __init__(
        self,
        core: ChannelCore,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None,
        response_deserializer: Callable[[bytes], _Response] | None,
    ) -> None:
        self._core = core
        self._method = method
        self._ser = request_serializer
        self._deser = response_deserializer
        self._key = (self._kind_name, method, request_serializer, response_deserializer)

    def _inner(self, transport: Transport, rpc: Rpc, serialized: bool = False) -> Any:
        """The grpcio multicallable of ``rpc``'s attempt on ``transport``:
        cached per transport; while A66 metrics are on, the attempt's own,
        counting its message bytes (``serialized``: the request is bytes)."""
        if rpc.sizes is not None:
            ser, deser = counting(rpc.sizes, None if serialized else self._ser, self._deser)
            return grpc_multicallable(
                transport, self._kind_name, self._method, ser, deser, registered=False
            )
        key = (*self._key, "serialized") if serialized else self._key
        mc = transport.callables.get(key)
        if mc is None:
            mc = grpc_multicallable(
                transport,
                self._kind_name,
                self._method,
                None if serialized else self._ser,
                self._deser,
            )
            if len(transport.callables) >= _MAX_CACHED:  # e.g. lambdas as serializers
                transport.callables.clear()
            transport.callables[key] = mc
        return mc

    def _serialize(self, request: _Request) -> tuple[_Request | bytes, bool]:
        """(request, serialized?): a request serialized now, as grpcio's
        ``future()`` and unary-stream call do, so that one it cannot
        serialize is raised here (INTERNAL "Exception serializing request!")
        rather than from a call object."""
        if self._ser is None:
            return request, False
        try:
            return self._ser(request), True
        except Exception:
            _log.exception("Exception serializing message!")
            raise ChannelRpcError(SERIALIZE_FAILED) from None

    def _starter(
        self,
        rpc: Rpc,
        verb: str | None,
        request: _Request | bytes | RequestReplay,
        credentials: Any,
        compression: Any,
        serialized: bool = False,
    ) -> Callable[[Transport, float | None], Any]:
        """What starts one attempt of ``rpc`` on a picked transport: the
        grpcio multicallable's ``verb`` (``with_call``, ``future``, None: the
        call itself) with ``rpc.send_metadata``, the remaining time, never
        waiting for ready (the channel did); ``request`` is the request, or
        the :class:`RequestReplay` that gives each attempt its requests."""

        def start(transport: Transport, remaining: float | None) -> Any:
            inner = self._inner(transport, rpc, serialized)
            if verb is not None:
                inner = getattr(inner, verb)
            return inner(
                request.attempt() if isinstance(request, RequestReplay) else request,
                timeout=remaining,
                metadata=rpc.send_metadata if rpc.pick_metadata is None else rpc.attempt_metadata(),
                credentials=credentials,
                wait_for_ready=False,
                compression=compression,
            )

        return start


class UnaryUnaryMultiCallable(
    _Base[_Request, _Response], grpc_generic.UnaryUnaryMultiCallable[_Request, _Response]
):
    _kind_name = "unary_unary"

    def __call__(
        self,
        request: _Request,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> _Response:
        return self.with_call(request, timeout, metadata, credentials, wait_for_ready, compression)[
            0
        ]

    def with_call(
        self,
        request: _Request,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> tuple[_Response, grpc.Call]:
        rpc = self._core.new_rpc(self._method, metadata, timeout, wait_for_ready)
        start = self._starter(rpc, "with_call", request, credentials, compression)
        return blocking_unary(self._core, rpc, start)

    def future(
        self,
        request: _Request,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> FutureCall[_Response]:
        payload, serialized = self._serialize(request)
        rpc = self._core.new_rpc(self._method, metadata, timeout, wait_for_ready, blocking=False)
        start = self._starter(rpc, "future", payload, credentials, compression, serialized)
        return FutureCall(self._core, rpc, start)


class UnaryStreamMultiCallable(
    _Base[_Request, _Response], grpc_generic.UnaryStreamMultiCallable[_Request, _Response]
):
    _kind_name = "unary_stream"

    def __call__(
        self,
        request: _Request,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> StreamingCall[_Response]:
        payload, serialized = self._serialize(request)
        rpc = self._core.new_rpc(self._method, metadata, timeout, wait_for_ready, blocking=False)
        start = self._starter(rpc, None, payload, credentials, compression, serialized)
        return StreamingCall(self._core, rpc, start)


class StreamUnaryMultiCallable(
    _Base[_Request, _Response], grpc_generic.StreamUnaryMultiCallable[_Request, _Response]
):
    _kind_name = "stream_unary"

    def __call__(
        self,
        request_iterator: Iterator[_Request],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> _Response:
        return self.with_call(
            request_iterator, timeout, metadata, credentials, wait_for_ready, compression
        )[0]

    def with_call(
        self,
        request_iterator: Iterator[_Request],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> tuple[_Response, grpc.Call]:
        rpc = self._core.new_rpc(self._method, metadata, timeout, wait_for_ready)
        replay = RequestReplay(request_iterator, self._core.retry_buffer_size)
        start = self._starter(rpc, "with_call", replay, credentials, compression)
        return blocking_unary(self._core, rpc, start, replay=replay)

    def future(
        self,
        request_iterator: Iterator[_Request],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> FutureCall[_Response]:
        rpc = self._core.new_rpc(self._method, metadata, timeout, wait_for_ready, blocking=False)
        replay = RequestReplay(request_iterator, self._core.retry_buffer_size)
        start = self._starter(rpc, "future", replay, credentials, compression)
        return FutureCall(self._core, rpc, start, replay=replay)


class StreamStreamMultiCallable(
    _Base[_Request, _Response], grpc_generic.StreamStreamMultiCallable[_Request, _Response]
):
    _kind_name = "stream_stream"

    def __call__(
        self,
        request_iterator: Iterator[_Request],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> StreamingCall[_Response]:
        rpc = self._core.new_rpc(self._method, metadata, timeout, wait_for_ready, blocking=False)
        replay = RequestReplay(request_iterator, self._core.retry_buffer_size)
        start = self._starter(rpc, None, replay, credentials, compression)
        return StreamingCall(self._core, rpc, start, replay=replay)
