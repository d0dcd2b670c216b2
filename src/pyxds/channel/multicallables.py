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
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeAlias, TypeVar, Union

import grpc

from pyxds.channel import grpc_generic
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

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
#: call metadata as callers pass it (grpcio's stubs say a tuple of pairs)
Metadata = Sequence[tuple[str, str | bytes]]
#: what a call of either request shape takes: one request, or an iterator of
#: them (client streaming); each kind's grpcio twin names the shape it takes
Requests: TypeAlias = Union[_Request, Iterator[_Request]]


class _MultiCallable(Generic[_Request, _Response]):
    """What every kind shares: the channel, the method, how one call begins.

    It holds the channel it came from: a program may drop its channel once
    it has its stubs (``stub = EchoStub(pyxds.insecure_channel(...))``), as
    grpcio lets it (grpcio's ``Channel.__del__`` leaves the channel open for
    that reason), and a dropped channel is closed by
    :mod:`pyxds.channel.lifecycle`; so it goes only with its last
    multicallable, and the last non-blocking call made from them that is
    still running (:class:`~pyxds.channel.calls.DeferredCall` holds it
    until it ends, as a grpcio call holds its channel)."""

    __slots__ = ("_core", "_method", "_channel")

    _kind = ""
    #: the requests are an iterator (stream_unary, stream_stream)
    _client_streaming = False

    def __init__(
        self,
        core: ChannelCore,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None,
        response_deserializer: Callable[[bytes], _Response] | None,
        channel: object = None,
    ) -> None:
        self._core = core
        self._method = GrpcMethod(self._kind, method, request_serializer, response_deserializer)
        self._channel = channel  # kept alive while this multicallable is (class doc)

    def _begin(
        self,
        request: object,
        timeout: float | None,
        metadata: Metadata | None,
        wait_for_ready: bool | None,
        blocking: bool,
    ) -> tuple[Rpc, object, bool]:
        """One call's Rpc, the request its attempts send (a client stream's
        replay) and whether it is serialized already (non-blocking calls)."""
        serialized = False
        buffer = None
        if self._client_streaming:
            replay = RequestReplay(request, self._core.retry_buffer_size)  # type: ignore[arg-type]  # these kinds take an iterator
            request, buffer = replay, replay.buffer
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


class _UnaryResponse(_MultiCallable[_Request, _Response]):
    """unary_unary and stream_unary: ``__call__``, ``with_call``, ``future``."""

    __slots__ = ()

    def __call__(
        self,
        request: Requests[_Request],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> _Response:
        payload: object = request
        if self._client_streaming:
            rpc, payload, _ = self._begin(request, timeout, metadata, wait_for_ready, True)
        else:
            rpc = Rpc(self._core, self._method.method, metadata, timeout, wait_for_ready)
        response: _Response = blocking_unary(
            rpc, self._method, payload, credentials, compression, False
        )[0]
        return response

    def with_call(
        self,
        request: Requests[_Request],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> tuple[_Response, grpc.Call]:
        rpc, payload, _ = self._begin(request, timeout, metadata, wait_for_ready, True)
        response, call = blocking_unary(rpc, self._method, payload, credentials, compression, True)
        return response, call

    def future(
        self,
        request: Requests[_Request],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> FutureCall[_Response]:
        rpc, payload, serialized = self._begin(request, timeout, metadata, wait_for_ready, False)
        return FutureCall(
            rpc,
            self._method,
            payload,
            credentials,
            compression,
            "future",
            serialized,
            channel=self._channel,
        )


class _StreamResponse(_MultiCallable[_Request, _Response]):
    """unary_stream and stream_stream: the call is the response iterator."""

    __slots__ = ()

    def __call__(
        self,
        request: Requests[_Request],
        timeout: float | None = None,
        metadata: Metadata | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> StreamingCall[_Response]:
        rpc, payload, serialized = self._begin(request, timeout, metadata, wait_for_ready, False)
        return StreamingCall(
            rpc,
            self._method,
            payload,
            credentials,
            compression,
            None,
            serialized,
            channel=self._channel,
        )


class UnaryUnaryMultiCallable(
    _UnaryResponse[_Request, _Response], grpc_generic.UnaryUnaryMultiCallable[_Request, _Response]
):
    __slots__ = ()
    _kind = "unary_unary"


class StreamUnaryMultiCallable(
    _UnaryResponse[_Request, _Response], grpc_generic.StreamUnaryMultiCallable[_Request, _Response]
):
    __slots__ = ()
    _kind = "stream_unary"
    _client_streaming = True


class UnaryStreamMultiCallable(
    _StreamResponse[_Request, _Response], grpc_generic.UnaryStreamMultiCallable[_Request, _Response]
):
    __slots__ = ()
    _kind = "unary_stream"


class StreamStreamMultiCallable(
    _StreamResponse[_Request, _Response],
    grpc_generic.StreamStreamMultiCallable[_Request, _Response],
):
    __slots__ = ()
    _kind = "stream_stream"
    _client_streaming = True
