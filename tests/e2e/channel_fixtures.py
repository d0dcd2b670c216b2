"""Fixtures of the channel's e2e tests: tiny generic-handler backends on
127.0.0.1 (bytes in, bytes out; the response names the backend), a
blackhole listener (accepts TCP, never speaks HTTP/2), helpers to count
which backend served each RPC.

Methods (all bytes, no protobuf):
  /pyxds.test.Echo/Who        unary: returns the backend's name
  /pyxds.test.Echo/Sleep      unary: sleeps float(request) seconds, returns name
  /pyxds.test.Echo/Fail       unary: aborts with the code named in the request
  /pyxds.test.Echo/Stream     unary-stream: returns name int(request) times
  /pyxds.test.Echo/Collect    stream-unary: returns name + number of requests
  /pyxds.test.Echo/Chat       stream-stream: echoes each request prefixed by name
  /pyxds.test.Echo/Meta       unary: returns the request metadata as "k=v;..."
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from concurrent import futures
from typing import Any

import grpc

SERVICE = "pyxds.test.Echo"


def _handlers(name: str, served: collections.Counter) -> grpc.GenericRpcHandler:
    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        served[name] += 1
        return name.encode()

    def sleep(request: bytes, context: grpc.ServicerContext) -> bytes:
        served[name] += 1
        time.sleep(float(request or b"0"))
        return name.encode()

    def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
        served[name] += 1
        context.abort(getattr(grpc.StatusCode, request.decode()), f"{name} says no")

    def stream(request: bytes, context: grpc.ServicerContext):
        served[name] += 1
        for _ in range(int(request or b"1")):
            yield name.encode()

    def collect(requests, context: grpc.ServicerContext) -> bytes:
        served[name] += 1
        count = sum(1 for _ in requests)
        return f"{name}:{count}".encode()

    def chat(requests, context: grpc.ServicerContext):
        served[name] += 1
        for request in requests:
            yield name.encode() + b":" + request

    def meta(request: bytes, context: grpc.ServicerContext) -> bytes:
        served[name] += 1
        md = ";".join(f"{k}={v}" for k, v in context.invocation_metadata())
        return md.encode()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Who": grpc.unary_unary_rpc_method_handler(who),
            "Sleep": grpc.unary_unary_rpc_method_handler(sleep),
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Collect": grpc.stream_unary_rpc_method_handler(collect),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
            "Meta": grpc.unary_unary_rpc_method_handler(meta),
        },
    )


class Backend:
    """A grpcio server on 127.0.0.1 that can be stopped and restarted on
    the same port."""

    def __init__(self, name: str, port: int = 0) -> None:
        self.name = name
        self.port = port
        self.served: collections.Counter = collections.Counter()
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Backend:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        server.add_generic_rpc_handlers((_handlers(self.name, self.served),))
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        server.start()
        self._server = server
        return self

    def stop(self, grace: float | None = None) -> None:
        if self._server is not None:
            self._server.stop(grace).wait(5)
            self._server = None

    @property
    def running(self) -> bool:
        return self._server is not None


class Blackhole:
    """Accepts TCP connections and never answers (HTTP/2 never starts)."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(conn)

    def close(self) -> None:
        self._stop = True
        self._sock.close()
        for conn in self._conns:
            conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def who(channel: Any, timeout: float = 5.0, **kwargs: Any) -> str:
    return channel.unary_unary(f"/{SERVICE}/Who")(b"", timeout=timeout, **kwargs).decode()


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
