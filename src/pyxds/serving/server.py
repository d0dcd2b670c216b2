"""``pyxds.xds_server(...)``: an xDS-enabled ``grpc.Server`` (gRFC A36, A29
server side, A41), the pyxds twin of ``grpc.server(..., xds=True)``.

    server = pyxds.xds_server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(Echo(), server)
    server.add_insecure_port("0.0.0.0:50051")   # plaintext unless the Listener says TLS
    server.start()

It is a ``grpc.Server``: handlers, interceptors and generated
``add_XServicer_to_server`` functions work as on ``grpc.server``.  Each
listening address is served by grpcio servers pyxds starts and stops as the
Listener says (:mod:`pyxds.serving.served_address`); they share the
executor, the handlers and the interceptors.  ``add_insecure_port`` and
``add_secure_port`` return the real port at once (also for port 0).

Credentials: the Listener's TLS (``DownstreamTlsContext``) wins whenever it
has one, on any port; a port's own credentials are the fallback for
Listeners without TLS (``add_insecure_port``: plaintext;
``add_secure_port(addr, grpc.xds_server_credentials(fallback))``: grpcio's
xDS credentials, which serve as their fallback; any other credentials: used
as given).  See docs/xds-server.md for why (grpcio's credentials objects do
not tell what they are).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import grpc

from pyxds.serving.core import ServingCallback, XdsServerCore
from pyxds.serving.gate import Gate
from pyxds.serving.handlers import GatedHandler, HandlerRegistry
from pyxds.serving.served_address import BindError

__all__ = ["XdsServer", "xds_server"]


def _server_options(options: Sequence[tuple[str, Any]] | None) -> list[tuple[str, Any]]:
    """The application's options, with SO_REUSEPORT on: a port's next
    grpcio server binds while the reservation (and a draining server) holds it."""
    out = [(k, v) for k, v in (options or ()) if k != "grpc.so_reuseport"]
    out.append(("grpc.so_reuseport", 1))
    return out


def bind(server: Any, address: str, credentials: grpc.ServerCredentials | None) -> None:
    """Add ``address`` to a grpcio server (sync or aio); BindError if it cannot listen."""
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as err:
        raise BindError(f"cannot listen on {address}: {err}") from None
    if not bound:
        raise BindError(f"cannot listen on {address}")


class _SyncBackend:
    """Starts and stops grpcio (thread) servers for the core."""

    def __init__(
        self,
        executor: futures.ThreadPoolExecutor,
        registry: HandlerRegistry,
        options: Sequence[tuple[str, Any]] | None,
        maximum_concurrent_rpcs: int | None,
        compression: grpc.Compression | None,
    ) -> None:
        self._executor = executor
        self._registry = registry
        self._options = _server_options(options)
        self._max = maximum_concurrent_rpcs
        self._compression = compression
        self._lock = threading.Lock()
        # grpcio servers told to stop and not yet terminated, with the grace
        # they were given (the drain grace time for a drained generation).
        self._stopping: list[tuple[grpc.Server, threading.Event, float | None]] = []

    def start_server(
        self, address: str, credentials: grpc.ServerCredentials | None, gate: Gate
    ) -> grpc.Server:
        server = grpc.server(
            self._executor,
            handlers=[GatedHandler(self._registry, gate)],
            options=self._options,
            maximum_concurrent_rpcs=self._max,
            compression=self._compression,
        )
        bind(server, address, credentials)
        server.start()
        return server

    def stop_server(self, handle: grpc.Server, grace: float | None) -> None:
        event = handle.stop(grace)
        with self._lock:
            self._stopping = [x for x in self._stopping if not x[1].is_set()]
            self._stopping.append((handle, event, grace))

    def stop_all(self, grace: float | None) -> list[threading.Event]:
        """Every grpcio server still stopping, told to end within ``grace``
        (grpcio's ``stop`` again: a shorter grace ends it sooner, a longer
        one changes nothing); their termination events."""
        with self._lock:
            stopping = [x for x in self._stopping if not x[1].is_set()]
        events = []
        for handle, event, given in stopping:
            if shorter(grace, given):
                event = handle.stop(grace)
            events.append(event)
        return events


def shorter(grace: float | None, given: float | None) -> bool:
    """Whether stopping with ``grace`` ends sooner than with ``given``
    (None: at once)."""
    return given is not None and (grace is None or grace < given)


class PortsAndHandlers:
    """What the sync and the aio xDS servers do alike: handlers, ports and
    the dumps (``_registry`` and ``_core`` are set by the subclass)."""

    _registry: HandlerRegistry
    _core: XdsServerCore

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[Any]) -> None:
        self._registry.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: Any) -> None:
        self._registry.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        """Listen on ``address``; plaintext unless the Listener says TLS."""
        return self._core.add_port(address, None)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        """Listen on ``address``; the Listener's TLS wins, ``server_credentials``
        serve Listeners without TLS (docs/xds-server.md, "Credentials")."""
        if server_credentials is None:
            raise ValueError("add_secure_port needs credentials (use add_insecure_port)")
        return self._core.add_port(address, server_credentials)

    def config_dump(self) -> dict[str, Any]:
        """The XdsClient's CSDS dump plus ``xds_server``: per listening
        address its Listener, serving state and the reason when not serving."""
        return self._core.config_dump()

    def serving_state(self) -> list[dict[str, Any]]:
        return self._core.serving_state()


class XdsServer(PortsAndHandlers, grpc.Server):  # type: ignore[misc]  # grpc is untyped
    """An xDS-enabled ``grpc.Server`` (module docstring)."""

    def __init__(
        self,
        thread_pool: futures.ThreadPoolExecutor,
        handlers: Sequence[grpc.GenericRpcHandler] | None = None,
        interceptors: Sequence[grpc.ServerInterceptor] | None = None,
        options: Sequence[tuple[str, Any]] | None = None,
        maximum_concurrent_rpcs: int | None = None,
        compression: grpc.Compression | None = None,
        bootstrap: Any = None,
        on_serving_changed: ServingCallback | None = None,
    ) -> None:
        self._registry = HandlerRegistry(interceptors)
        if handlers:
            self._registry.add_generic_rpc_handlers(handlers)
        self._backend = _SyncBackend(
            thread_pool, self._registry, options, maximum_concurrent_rpcs, compression
        )
        self._core = XdsServerCore(self._backend, bootstrap, options, on_serving_changed)
        self._terminated = threading.Event()

    # -- grpc.Server --------------------------------------------------------------
    def start(self) -> None:
        self._core.start()

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving every address; every RPC, those of servers still
        draining an old Listener too, ends within ``grace`` (None: now); the
        event is set when every grpcio server has terminated."""
        self._core.stop(grace)
        # Generations still draining an old Listener end within this grace
        # too (as every RPC of a grpcio server does on its stop).
        pending = self._backend.stop_all(grace)
        done = threading.Event()

        def wait() -> None:
            for event in pending:
                event.wait()
            done.set()
            self._terminated.set()

        threading.Thread(target=wait, name="pyxds-xds-server-stop", daemon=True).start()
        return done

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Block until the server stopped; True if ``timeout`` passed first."""
        return not self._terminated.wait(timeout)

    def __enter__(self) -> XdsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(None).wait(30)


def xds_server(
    executor: futures.ThreadPoolExecutor,
    handlers: Sequence[grpc.GenericRpcHandler] | None = None,
    interceptors: Sequence[grpc.ServerInterceptor] | None = None,
    options: Sequence[tuple[str, Any]] | None = None,
    maximum_concurrent_rpcs: int | None = None,
    bootstrap: Any = None,
    on_serving_changed: ServingCallback | None = None,
) -> XdsServer:
    """An xDS-enabled ``grpc.Server`` (gRFC A36): ``grpc.server``'s arguments
    plus ``bootstrap`` (path, dict or JSON text; None: the environment, as
    the channel) and ``on_serving_changed(address, serving, error)``.
    Raises ValueError for a bootstrap that cannot be loaded or lacks
    ``server_listener_resource_name_template``."""
    return XdsServer(
        executor,
        handlers,
        interceptors,
        options,
        maximum_concurrent_rpcs,
        None,
        bootstrap,
        on_serving_changed,
    )
