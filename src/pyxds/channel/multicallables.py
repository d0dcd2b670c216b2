"""The sync channel's multicallables (what ``channel.unary_unary(...)`` and
generated stubs return).

Each invocation makes one :class:`~pyxds.channel.rpc.Rpc` (the story of
that RPC: route, picks, attempts, retries, end) and hands it to its thread
adapter: :func:`~pyxds.channel.calls.blocking_unary` for ``__call__`` and
``with_call``, :class:`~pyxds.channel.calls.FutureCall` for ``future()``,
:class:`~pyxds.channel.calls.StreamingCall` for response streams.  Every
attempt starts the one way of its call kind (:class:`GrpcMethod`), on the
picked subchannel's grpcio channel.  A client stream's requests go through
a :class:`~pyxds.channel.calls.RequestReplay` (kept for a retry); a
``future()`` or response-streaming call serializes its request up front, as
grpcio does, so that one it cannot serialize fails at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from pyxds.channel.calls import (
    ChannelRpcError,
    FutureCall,
    RequestReplay,
    StreamingCall,
    blocking_unary,
)
from pyxds.channel.core import ChannelCore
from pyxds.channel.grpc_calls import SERIALIZE_FAILED, GrpcMethod
from pyxds.channel.rpc import Rpc

_log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the stubs' generics; grpcio's classes are not generic at run time
    _UnaryUnary = grpc.UnaryUnaryMultiCallable[Any, Any]
    _StreamUnary = grpc.StreamUnaryMultiCallable[Any, Any]
    _UnaryStream = grpc.UnaryStreamMultiCallable[Any, Any]
    _StreamStream = grpc.StreamStreamMultiCallable[Any, Any]
else:
    _UnaryUnary = grpc.UnaryUnaryMultiCallable
    _StreamUnary = grpc.StreamUnaryMultiCallable
    _UnaryStream = grpc.UnaryStreamMultiCallable
    _StreamStream = grpc.StreamStreamMultiCallable


class _MultiCallable:
    """What every kind shares: the channel, the method, how one call begins."""

    __slots__ = ("_core", "_method")

    _kind = ""
    #: the requests are an iterator (stream_unary, stream_stream)
    _client_streaming = False

    def __init__(
        self,
        core: ChannelCore,
        method: str,
        request_serializer: Callable[[Any], bytes] | None,
        response_deserializer: Callable[[bytes], Any] | None,
    ) -> None:
        self._core = core
        self._method = GrpcMethod(self._kind, method, request_serializer, response_deserializer)

    def _begin(
        self, request: Any, timeout: Any, metadata: Any, wait_for_ready: Any, blocking: bool
    ) -> tuple[Rpc, Any, bool]:
        """One call's Rpc, the request its attempts send (a client stream's
        replay) and whether it is serialized already (non-blocking calls)."""
        serialized = False
        buffer = None
        if self._client_streaming:
            request = RequestReplay(request, self._core.retry_buffer_size)
            buffer = request.buffer
        elif not blocking and self._method.serializer is not None:
            try:
                request = self._method.serializer(request)
            except Exception:
                _log.exception("Exception serializing message!")
                raise ChannelRpcError(SERIALIZE_FAILED) from None
            serialized = True
        rpc = Rpc(
            self._core, self._method.method, metadata, timeout, wait_for_ready, buffer, blocking
        )
        return rpc, request, serialized


class _UnaryResponse(_MultiCallable):
    """unary_unary and stream_unary: ``__call__``, ``with_call``, ``future``."""

    __slots__ = ()

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        if self._client_streaming:
            rpc, request, _ = self._begin(request, timeout, metadata, wait_for_ready, True)
        else:
            rpc = Rpc(self._core, self._method.method, metadata, timeout, wait_for_ready)
        return blocking_unary(rpc, self._method, request, credentials, compression, False)[0]

    def with_call(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> tuple[Any, grpc.Call]:
        rpc, request, _ = self._begin(request, timeout, metadata, wait_for_ready, True)
        return blocking_unary(rpc, self._method, request, credentials, compression, True)

    def future(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> FutureCall:
        rpc, request, serialized = self._begin(request, timeout, metadata, wait_for_ready, False)
        return FutureCall(
            rpc, self._method, request, credentials, compression, "future", serialized
        )


class _StreamResponse(_MultiCallable):
    """unary_stream and stream_stream: the call is the response iterator."""

    __slots__ = ()

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> StreamingCall:
        rpc, request, serialized = self._begin(request, timeout, metadata, wait_for_ready, False)
        return StreamingCall(rpc, self._method, request, credentials, compression, None, serialized)


class UnaryUnaryMultiCallable(_UnaryResponse, _UnaryUnary):  # type: ignore[misc]  # our call objects, not the stubs' private _Call* types
    __slots__ = ()
    _kind = "unary_unary"


class StreamUnaryMultiCallable(_UnaryResponse, _StreamUnary):  # type: ignore[misc]  # our call objects, not the stubs' private _Call* types
    __slots__ = ()
    _kind = "stream_unary"
    _client_streaming = True


class UnaryStreamMultiCallable(_StreamResponse, _UnaryStream):  # type: ignore[misc]  # our call objects, not the stubs' private _Call* types
    __slots__ = ()
    _kind = "unary_stream"


class StreamStreamMultiCallable(_StreamResponse, _StreamStream):  # type: ignore[misc]  # our call objects, not the stubs' private _Call* types
    __slots__ = ()
    _kind = "stream_stream"
    _client_streaming = True
