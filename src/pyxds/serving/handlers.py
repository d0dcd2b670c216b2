"""The application's handlers on an xDS-enabled server, behind the gate.

Every grpcio server pyxds starts for a port gets one generic handler
(:class:`GatedHandler`): it finds the application's handler for the RPC
(registered methods first, then generic handlers, through the application's
interceptors, as grpcio would) and returns it with each behavior wrapped so
that the port's :class:`~pyxds.serving.gate.Gate` decides first.  A refused
RPC ends with the gate's status (``context.abort``) before the handler's
code runs.

grpcio gives no servicer context to ``intercept_service``, and the gate
needs one (peer address, TLS peer), so the gate runs when grpcio calls the
behavior: the application's interceptors see the RPC's method and metadata
first (as they would before C-core's RBAC filter, which runs before any
Python code, could not), but none of their wrapped behaviors, nor the
handler, runs for a refused RPC.

``:authority``: sync servers read it from grpcio's request details (the
RPC's ``call_details.host``, present because pyxds registers only a generic
handler with grpcio); ``grpc.aio`` shows it to no Python code
(grpc/grpc#38906), so aio gates get None (unknown).

Behaviors keep their kind, so grpcio runs them as it would the
application's: on aio servers a coroutine stays a coroutine, an async
generator an async generator, and a plain function stays plain (grpcio runs
it on the migration thread pool with a synchronous context).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import grpc

from pyxds.serving.gate import Gate

__all__ = ["GatedHandler", "HandlerRegistry"]

_log = logging.getLogger(__name__)

_BEHAVIORS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class _Handler(NamedTuple):
    request_streaming: bool
    response_streaming: bool
    request_deserializer: Any
    response_serializer: Any
    unary_unary: Any
    unary_stream: Any
    stream_unary: Any
    stream_stream: Any


grpc.RpcMethodHandler.register(_Handler)


class HandlerRegistry:
    """The application's handlers and interceptors, shared by every grpcio
    server of one xDS server (added before ``start()``, as grpcio requires)."""

    def __init__(self, interceptors: Sequence[Any] | None = None) -> None:
        self.interceptors = tuple(interceptors or ())
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        for handler in handlers:
            if not hasattr(handler, "service"):
                raise AttributeError(
                    f'"{handler}" must conform to grpc.GenericRpcHandler type but does '
                    'not have "service" method!'
                )
        self._generic.extend(handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        for method, handler in method_handlers.items():
            self._registered[f"/{service_name}/{method}"] = handler

    def _lookup(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = self._registered.get(details.method)
        if handler is not None:
            return handler
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    def lookup(self, details: grpc.HandlerCallDetails) -> Any:
        """The handler for the RPC, through the application's interceptors."""
        interceptors = self.interceptors
        if not interceptors:
            return self._lookup(details)

        def call(index: int, d: grpc.HandlerCallDetails) -> Any:
            if index == len(interceptors):
                return self._lookup(d)
            return interceptors[index].intercept_service(lambda dd: call(index + 1, dd), d)

        return call(0, details)


def _sync_authority(context: Any) -> str | None:
    event = getattr(context, "_rpc_event", None)
    details = getattr(event, "call_details", None)
    host = getattr(details, "host", None)
    if not host:
        return None
    return host.decode("utf-8", "replace") if isinstance(host, bytes) else str(host)


def _wrap_sync(behavior: Callable[..., Any], check: Callable[[Any], Any], stream: bool) -> Any:
    if stream:

        def gated_stream(request: Any, context: Any) -> Any:
            status = check(context)
            if status is not None:
                context.abort(status.code, status.details)
            yield from behavior(request, context)

        return gated_stream

    def gated(request: Any, context: Any) -> Any:
        status = check(context)
        if status is not None:
            context.abort(status.code, status.details)
        return behavior(request, context)

    return gated


def _wrap_aio(behavior: Callable[..., Any], check: Callable[[Any], Any], stream: bool) -> Any:
    if inspect.isasyncgenfunction(behavior):

        async def gated_agen(request: Any, context: Any) -> Any:
            status = check(context)
            if status is not None:
                await context.abort(status.code, status.details)
            async for item in behavior(request, context):
                yield item

        return gated_agen
    if inspect.iscoroutinefunction(behavior):

        async def gated_coro(request: Any, context: Any) -> Any:
            status = check(context)
            if status is not None:
                await context.abort(status.code, status.details)
            return await behavior(request, context)

        return gated_coro
    # A plain function: grpcio runs it on the migration thread pool with a
    # synchronous context, whose abort raises.
    return _wrap_sync(behavior, check, stream and inspect.isgeneratorfunction(behavior))


def _method_not_found(request_iterator: Any, context: Any) -> Any:
    context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")


async def _method_not_found_aio(request_iterator: Any, context: Any) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")


_UNKNOWN = _Handler(True, True, None, None, None, None, None, _method_not_found)
_CACHE_SIZE = 1024
_UNKNOWN_AIO = _Handler(True, True, None, None, None, None, None, _method_not_found_aio)


class GatedHandler(grpc.GenericRpcHandler):
    """The one generic handler of a grpcio server pyxds runs for a port."""

    def __init__(self, registry: HandlerRegistry, gate: Gate, aio: bool = False) -> None:
        self._registry = registry
        self._gate = gate
        self._aio = aio
        # Without application interceptors the gated handler of each
        # (application handler, method) is made once: grpcio calls service()
        # for every RPC (on the sync server's one polling thread, on the aio
        # event loop); the gate reads the metadata from the RPC's context.
        self._cached: dict[tuple[int, str], tuple[Any, Any]] = {}
        self._cacheable = not registry.interceptors

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self._registry.lookup(handler_call_details)
        if handler is None:
            # Routing and RBAC come before the method lookup (as C-core's
            # filters run before its handler lookup): an unknown method is
            # UNIMPLEMENTED only for an RPC the gate lets through.
            handler = _UNKNOWN_AIO if self._aio else _UNKNOWN
        path = handler_call_details.method
        if self._cacheable:
            key = (id(handler), path)
            hit = self._cached.get(key)
            if hit is not None and hit[0] is handler:
                return hit[1]
            gated = self._wrap(handler, self._checker(path, None))
            if len(self._cached) < _CACHE_SIZE:
                self._cached[key] = (handler, gated)
            return gated
        metadata = handler_call_details.invocation_metadata or ()
        return self._wrap(handler, self._checker(path, metadata))

    def _checker(self, path: str, metadata: Sequence[Any] | None) -> Callable[[Any], Any]:
        """The gate for RPCs of ``path`` (``metadata`` None: read it from the
        RPC's context)."""
        gate = self._gate
        aio = self._aio

        def check(context: Any) -> Any:
            authority = None if aio else _sync_authority(context)
            md = context.invocation_metadata() or () if metadata is None else metadata
            return gate.check(context.peer(), authority, path, md, context.auth_context)

        return check

    def _wrap(self, handler: Any, check: Callable[[Any], Any]) -> Any:
        wrap = _wrap_aio if self._aio else _wrap_sync
        behaviors = {}
        for name in _BEHAVIORS:
            behavior = getattr(handler, name, None)
            if behavior is not None:
                behaviors[name] = wrap(behavior, check, name.endswith("_stream"))
        return _Handler(
            handler.request_streaming,
            handler.response_streaming,
            handler.request_deserializer,
            handler.response_serializer,
            behaviors.get("unary_unary"),
            behaviors.get("unary_stream"),
            behaviors.get("stream_unary"),
            behaviors.get("stream_stream"),
        )
