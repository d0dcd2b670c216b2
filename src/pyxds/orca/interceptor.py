"""Per-call ORCA reports from a grpcio server (gRFC A51 "Per-Request Metrics
Reporting", server side; grpcio has no such API of its own).

:class:`OrcaServerInterceptor` (a ``grpc.ServerInterceptor``) and
:class:`OrcaAioServerInterceptor` (a ``grpc.aio.ServerInterceptor``) run
every handler with a fresh :class:`~pyxds.orca.recorder.CallMetricRecorder`
reachable through :func:`~pyxds.orca.recorder.call_metric_recorder`; when
the handler ends (returns, raises or aborts; for a response stream, when
the stream ends) the recorded metrics, over the optional per-server
recorder's, are sent as a binary ``OrcaLoadReport`` in the
``endpoint-load-metrics-bin`` trailer (read by C-core, grpc-java, grpc-go
clients), and again as ``x-endpoint-load-metrics-bin`` (read by pyxds
clients: grpcio hides the first from Python), after any trailing metadata
the handler set itself.  A call that recorded nothing (and no per-server data)
sends no trailer.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from pyxds.orca.recorder import CallMetricRecorder, ServerMetricRecorder, _current

__all__ = [
    "ORCA_TRAILER",
    "ORCA_TRAILER_MIRROR",
    "OrcaServerInterceptor",
    "OrcaAioServerInterceptor",
]

ORCA_TRAILER = "endpoint-load-metrics-bin"
#: The same report again under a key grpcio passes through: grpcio's C-core
#: parses ``endpoint-load-metrics-bin`` for its own LB policies and never
#: shows it to Python code, so a pyxds client reads this copy.
ORCA_TRAILER_MIRROR = "x-endpoint-load-metrics-bin"
_OURS = (ORCA_TRAILER, ORCA_TRAILER_MIRROR)
_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


def _attach(
    context: grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any],
    recorder: CallMetricRecorder,
    server: ServerMetricRecorder | None,
) -> None:
    """Add the call's report to the trailing metadata already set."""
    payload = recorder.report(server).SerializeToString()
    if not payload:
        return
    try:
        existing = tuple(context.trailing_metadata() or ())
    except Exception:
        existing = ()
    kept = tuple((k, v) for k, v in existing if k not in _OURS)
    context.set_trailing_metadata((*kept, (ORCA_TRAILER, payload), (ORCA_TRAILER_MIRROR, payload)))


def _rebuild(
    handler: grpc.RpcMethodHandler[_Request, _Response],
    wrap: Callable[[Callable[..., Any], bool], Callable[..., Any]],
) -> grpc.RpcMethodHandler[_Request, _Response]:
    """``handler`` with its behaviour wrapped (same kind, same serializers)."""
    for kind in _KINDS:
        behavior = getattr(handler, kind, None)
        if behavior is not None:
            factory = getattr(grpc, f"{kind}_rpc_method_handler")
            rebuilt: grpc.RpcMethodHandler[_Request, _Response] = factory(
                wrap(behavior, handler.response_streaming),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
            return rebuilt
    return handler


class OrcaServerInterceptor(grpc.ServerInterceptor):
    """Per-call ORCA for a sync ``grpc.server`` (module docstring).

    ``server_metric_recorder``: per-server data merged into every report."""

    def __init__(self, server_metric_recorder: ServerMetricRecorder | None = None) -> None:
        self._server = server_metric_recorder

    def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], grpc.RpcMethodHandler[_Request, _Response] | None
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Request, _Response] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return _rebuild(handler, self._wrap)

    def _wrap(self, behavior: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
        server = self._server
        if not streaming:

            def unary_response(request_or_iterator: Any, context: Any) -> Any:
                recorder = CallMetricRecorder()
                token = _current.set(recorder)
                try:
                    return behavior(request_or_iterator, context)
                finally:
                    _current.reset(token)
                    _attach(context, recorder, server)

            return unary_response

        def stream_response(request_or_iterator: Any, context: Any) -> Any:
            recorder = CallMetricRecorder()
            ctx = contextvars.copy_context()
            ctx.run(_current.set, recorder)
            try:
                responses = iter(ctx.run(behavior, request_or_iterator, context))
                while True:
                    try:
                        item = ctx.run(next, responses)
                    except StopIteration:
                        return
                    yield item
            finally:
                _attach(context, recorder, server)

        return stream_response


class OrcaAioServerInterceptor(grpc.aio.ServerInterceptor):
    """Per-call ORCA for a ``grpc.aio.server`` (module docstring)."""

    def __init__(self, server_metric_recorder: ServerMetricRecorder | None = None) -> None:
        self._server = server_metric_recorder

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Request, _Response] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Request, _Response] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return _rebuild(handler, self._wrap)

    def _wrap(self, behavior: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
        server = self._server
        if not streaming:

            async def unary_response(request_or_iterator: Any, context: Any) -> Any:
                recorder = CallMetricRecorder()
                token = _current.set(recorder)
                try:
                    result = behavior(request_or_iterator, context)
                    if inspect.isawaitable(result):
                        result = await result
                    return result
                finally:
                    _current.reset(token)
                    _attach(context, recorder, server)

            return unary_response

        async def stream_response(request_or_iterator: Any, context: Any) -> Any:
            recorder = CallMetricRecorder()
            token = _current.set(recorder)
            try:
                responses = behavior(request_or_iterator, context)
                if inspect.isawaitable(responses):  # a coroutine writing with context.write
                    await responses
                    return
                if hasattr(responses, "__aiter__"):
                    async for item in responses:
                        yield item
                else:
                    for item in responses:
                        yield item
            finally:
                _reset(token)
                _attach(context, recorder, server)

        return stream_response


def _reset(token: contextvars.Token[CallMetricRecorder | None]) -> None:
    try:
        _current.reset(token)
    except ValueError:  # an async generator closed from another context
        pass
