"""Tiny real gRPC backends for the demo: a unary method that answers with the
backend's name (raw bytes, no generated code), restartable on the same port."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc

DEMO_METHOD = "/pyxds.demo.Echo/Who"


class NamedBackend:
    """A grpcio server on 127.0.0.1 whose replies carry its name."""

    def __init__(self, name: str, port: int = 0, fail: bool = False) -> None:
        self.name = name
        self.port = port
        self.fail = fail  # answer every RPC with UNAVAILABLE (a broken backend)
        self.calls = 0  # RPCs this backend received (answered or failed)
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> NamedBackend:
        reply = self.name.encode()

        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self._lock:
                self.calls += 1
            if self.fail:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name} is broken")
            return reply

        handler = grpc.method_handlers_generic_handler(
            "pyxds.demo.Echo", {"Who": grpc.unary_unary_rpc_method_handler(who)}
        )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((handler,))
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
