"""``pyxds.aio.xds_server(...)``: an xDS-enabled ``grpc.aio.Server`` (gRFC
A36, A29 server side, A41); grpcio has none (grpc/grpc#32513).

    server = pyxds.aio.xds_server()
    echo_pb2_grpc.add_EchoServicer_to_server(Echo(), server)
    server.add_insecure_port("0.0.0.0:50051")
    await server.start()
    await server.wait_for_termination()

The same machinery as :mod:`pyxds.serving.server`: the per-port grpcio
servers are ``grpc.aio`` servers on the event loop that called ``start()``.
xDS callbacks run off the loop (the server's serializer); they start and
stop ``grpc.aio`` servers by scheduling onto the loop, and nothing on the
loop ever waits for the serializer.

One difference from the sync server: ``grpc.aio`` shows no Python code the
RPC's ``:authority`` (grpc/grpc#38906), so virtual hosts are chosen as for
an unknown authority (the ``*`` one) and RBAC rules on ``:authority`` /
``host`` fail closed (:mod:`pyxds.serving.rbac`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import grpc

from pyxds.serving.core import ServingCallback, XdsServerCore
from pyxds.serving.gate import Gate
from pyxds.serving.handlers import GatedHandler, HandlerRegistry
from pyxds.serving.served_address import BindError
from pyxds.serving.server import PortsAndHandlers, _server_options, bind, shorter

__all__ = ["AioXdsServer", "xds_server"]

_START_TIMEOUT = 30.0


class _AioBackend:
    """Starts and stops ``grpc.aio`` servers on the application's loop."""

    def __init__(
        self,
        registry: HandlerRegistry,
        migration_thread_pool: futures.Executor | None,
        options: Sequence[tuple[str, Any]] | None,
        maximum_concurrent_rpcs: int | None,
        compression: grpc.Compression | None,
    ) -> None:
        self._registry = registry
        self._pool = migration_thread_pool
        self._options = _server_options(options)
        self._max = maximum_concurrent_rpcs
        self._compression = compression
        self.loop: asyncio.AbstractEventLoop | None = None
        # grpc.aio servers told to stop: (server, its stop's future, grace).
        self._stopping: list[tuple[grpc.aio.Server, futures.Future[Any], float | None]] = []

    async def _start(
        self, address: str, credentials: grpc.ServerCredentials | None, gate: Gate
    ) -> grpc.aio.Server:
        server = grpc.aio.server(
            self._pool,
            handlers=[GatedHandler(self._registry, gate, aio=True)],
            options=self._options,
            maximum_concurrent_rpcs=self._max,
            compression=self._compression,
        )
        bind(server, address, credentials)
        await server.start()
        return server

    def start_server(
        self, address: str, credentials: grpc.ServerCredentials | None, gate: Gate
    ) -> grpc.aio.Server:
        loop = self.loop
        if loop is None or loop.is_closed():
            raise BindError(f"cannot listen on {address}: the event loop is closed")
        future = asyncio.run_coroutine_threadsafe(self._start(address, credentials, gate), loop)
        try:
            return future.result(_START_TIMEOUT)
        except futures.TimeoutError:
            future.cancel()
            raise BindError(f"cannot listen on {address}: the event loop did not answer") from None

    def stop_server(self, handle: grpc.aio.Server, grace: float | None) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(handle.stop(grace), loop)
        self._stopping = [x for x in self._stopping if not x[1].done()]
        self._stopping.append((handle, future, grace))

    def stop_all(self, grace: float | None) -> list[futures.Future[Any]]:
        """Every grpc.aio server still stopping, told to end within ``grace``
        (a shorter grace than it was given ends it sooner); their stops."""
        loop = self.loop
        out = []
        for handle, future, given in self._stopping:
            if future.done():
                continue
            if shorter(grace, given) and loop is not None and not loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(handle.stop(grace), loop)
            out.append(future)
        return out


class AioXdsServer(PortsAndHandlers, grpc.aio.Server):  # type: ignore[misc]  # grpc is untyped
    """An xDS-enabled ``grpc.aio.Server`` (module docstring)."""

    def __init__(
        self,
        migration_thread_pool: futures.Executor | None = None,
        handlers: Sequence[grpc.GenericRpcHandler] | None = None,
        interceptors: Sequence[Any] | None = None,
        options: Sequence[tuple[str, Any]] | None = None,
        maximum_concurrent_rpcs: int | None = None,
        compression: grpc.Compression | None = None,
        bootstrap: Any = None,
        on_serving_changed: ServingCallback | None = None,
    ) -> None:
        self._registry = HandlerRegistry(interceptors)
        if handlers:
            self._registry.add_generic_rpc_handlers(handlers)
        self._backend = _AioBackend(
            self._registry, migration_thread_pool, options, maximum_concurrent_rpcs, compression
        )
        self._core = XdsServerCore(self._backend, bootstrap, options, on_serving_changed)
        self._terminated: asyncio.Event | None = None

    async def start(self) -> None:
        self._backend.loop = asyncio.get_running_loop()
        self._terminated = asyncio.Event()
        await asyncio.to_thread(self._core.start)

    async def stop(self, grace: float | None) -> None:
        """Stop serving every address (every RPC, those of servers still
        draining an old Listener too, ends within ``grace``) and wait for
        every ``grpc.aio`` server."""
        await asyncio.to_thread(self._core.stop, grace)
        # Servers still draining an old Listener end within this grace too.
        pending = [asyncio.wrap_future(f) for f in self._backend.stop_all(grace)]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._terminated is not None:
            self._terminated.set()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Wait until the server stopped; True if ``timeout`` passed first."""
        if self._terminated is None:
            self._terminated = asyncio.Event()
        try:
            await asyncio.wait_for(self._terminated.wait(), timeout)
        except TimeoutError:
            return True
        return False


def xds_server(
    migration_thread_pool: futures.Executor | None = None,
    handlers: Sequence[grpc.GenericRpcHandler] | None = None,
    interceptors: Sequence[Any] | None = None,
    options: Sequence[tuple[str, Any]] | None = None,
    maximum_concurrent_rpcs: int | None = None,
    compression: grpc.Compression | None = None,
    bootstrap: Any = None,
    on_serving_changed: ServingCallback | None = None,
) -> AioXdsServer:
    """An xDS-enabled ``grpc.aio.Server``: ``grpc.aio.server``'s arguments
    plus ``bootstrap`` and ``on_serving_changed(address, serving, error)``
    (called from a pyxds thread, not the event loop).  Raises ValueError
    for a bootstrap that cannot be loaded or lacks
    ``server_listener_resource_name_template``."""
    return AioXdsServer(
        migration_thread_pool,
        handlers,
        interceptors,
        options,
        maximum_concurrent_rpcs,
        compression,
        bootstrap,
        on_serving_changed,
    )
