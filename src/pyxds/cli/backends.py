"""Tiny real gRPC backends for the demo: a unary method that answers with the
backend's name (raw bytes, no generated code), restartable on the same port.

The port is this backend's alone, also while it is stopped: grpcio binds with
SO_REUSEPORT by default, and Linux then lets another program's server (same
user) bind the same port and splits the connections between the two.  So the
server binds without it (``grpc.so_reuseport`` 0), and between stop() and the
next start() a bound, never listening socket holds the port: connections are
refused exactly as with nothing there, and no other program can take it
before the restart.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent import futures

import grpc

DEMO_METHOD = "/pyxds.demo.Echo/Who"

#: How long stop() retries holding the port while the old listener closes.
HOLD_TIMEOUT = 5.0


def _hold(port: int) -> socket.socket:
    """A bound, never listening socket on 127.0.0.1:``port`` (SO_REUSEADDR:
    past the stopped server's connections in TIME_WAIT)."""
    deadline = time.monotonic() + HOLD_TIMEOUT
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            return sock
        except OSError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class NamedBackend:
    """A grpcio server on 127.0.0.1 whose replies carry its name."""

    def __init__(self, name: str, port: int = 0, fail: bool = False) -> None:
        self.name = name
        self.port = port
        self.fail = fail  # answer every RPC with UNAVAILABLE (a broken backend)
        self.calls = 0  # RPCs this backend received (answered or failed)
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._held: socket.socket | None = None

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
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)]
        )
        server.add_generic_rpc_handlers((handler,))
        self._let_go()
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving; the port stays held until start() or close()."""
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
            self._held = _hold(self.port)

    def close(self) -> None:
        """Stop, and let the port go."""
        self.stop()
        self._let_go()

    def _let_go(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()
