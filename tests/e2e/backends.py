"""Real backends for end-to-end tests: Echo servers, a blackhole, and a C-core client.

* :class:`EchoBackend` is a grpcio server on 127.0.0.1 implementing
  ``pyxds.test.Echo``; every reply carries the backend's name. It can be
  stopped and started again on the same port, which stays held meanwhile
  (tests/e2e/ports.py: no other program can take it).
* :class:`Blackhole` accepts TCP connections and never speaks HTTP/2, so a
  client's connection attempt hangs until its own timeout.
* :class:`RawAdsClient` is a bare ADS stream for protocol tests of the server.
* :class:`CoreClient` runs grpcio's C-core xDS client in a subprocess (C-core
  reads its bootstrap from the environment once per process) and makes RPCs on
  ``xds:///<target>`` on command, reporting which backend answered each.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable
from concurrent import futures

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.rpc import status_pb2
from ports import EXCLUSIVE, HeldPort, HoldsItsPort
from protos import echo_pb2, echo_pb2_grpc

HERE = os.path.dirname(os.path.abspath(__file__))


class _EchoServicer(echo_pb2_grpc.EchoServicer):
    def __init__(self, backend: EchoBackend) -> None:
        self._backend = backend

    def Echo(self, request, context):
        self._backend._count()
        return echo_pb2.EchoReply(message=request.message, backend=self._backend.name)

    def EchoStream(self, request, context):
        self._backend._count()
        for _ in range(max(1, request.count)):
            yield echo_pb2.EchoReply(message=request.message, backend=self._backend.name)


class EchoBackend(HoldsItsPort):
    """An Echo server named ``name`` on ``host:port`` (port 0: pick one, then
    keep it; while stopped, the port is held for the next start)."""

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.calls = 0
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._held: HeldPort | None = None

    def hold(self) -> EchoBackend:
        """Pick the port now and hold it (refusing connections) until start()."""
        if self._server is None and self._held is None:
            self._held = HeldPort(self.port, host=self.host)
            self.port = self._held.port
        return self

    def _count(self) -> None:
        with self._lock:
            self.calls += 1

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> EchoBackend:
        if self._server is not None:
            return self
        executor = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=self.name)
        # No SO_REUSEPORT (grpcio's default): with it, the kernel may split
        # the port's connections with another program's server (ports.py).
        server = grpc.server(executor, options=[EXCLUSIVE])
        echo_pb2_grpc.add_EchoServicer_to_server(_EchoServicer(self), server)
        self._let_go()
        port = server.add_insecure_port(f"{self.host}:{self.port}")
        if not port:
            raise RuntimeError(f"backend {self.name}: cannot bind {self.host}:{self.port}")
        self.port = port
        server.start()
        self._server, self._executor = server, executor
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop serving; the port stays held (connections refused) until
        start() or release()."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(timeout=10)
            self._executor.shutdown(wait=False)
            self._held = HeldPort.again(self.port, host=self.host)

    def restart(self) -> EchoBackend:
        self.stop()
        return self.start()


def start_backends(n: int, prefix: str = "backend-") -> list[EchoBackend]:
    """Start ``n`` Echo backends named prefix+"0", prefix+"1", ..."""
    return [EchoBackend(f"{prefix}{i}").start() for i in range(n)]


class Blackhole:
    """Accepts TCP connections on 127.0.0.1 and never answers (no HTTP/2 preface)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.host, self.port = self._sock.getsockname()[:2]
        self._held: list[socket.socket] = []
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="blackhole", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self._held.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._sock.close()

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- grpcio's C-core as an xDS client, in a subprocess -------------------------------

_CORE_CLIENT = r"""
import collections, json, sys, time
import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.rpc import status_pb2
from protos import echo_pb2, echo_pb2_grpc

target = sys.argv[1]
DETAILS = sys.argv[2] == "1"
channel = grpc.insecure_channel(target)
stub = echo_pb2_grpc.EchoStub(channel)

def call(timeout):
    try:
        reply = stub.Echo(echo_pb2.EchoRequest(message="hi"), timeout=timeout,
                          wait_for_ready=True)
        return reply.backend
    except grpc.RpcError as e:
        if DETAILS:
            return "error:" + e.code().name + ":" + (e.details() or "")
        return "error:" + e.code().name

for line in sys.stdin:
    cmd = json.loads(line)
    counts = collections.Counter()
    if cmd["op"] == "call":
        for _ in range(cmd["n"]):
            counts[call(cmd.get("timeout", 5.0))] += 1
    elif cmd["op"] == "until":
        deadline = time.monotonic() + cmd["timeout"]
        while time.monotonic() < deadline:
            got = call(max(0.1, deadline - time.monotonic()))
            counts[got] += 1
            if got == cmd["backend"]:
                break
    elif cmd["op"] == "exit":
        break
    print(json.dumps(counts), flush=True)
channel.close()
"""


class CoreClient:
    """grpcio's C-core as the xDS client of ``target``, in a subprocess.

    ``call(n)`` makes n unary Echo RPCs (wait_for_ready) and returns a Counter of
    the backend names that answered (failures count as ``"error:<CODE>"``, or
    ``"error:<CODE>:<details>"`` with ``details=True``);
    ``call_until(backend, timeout)`` calls until ``backend`` answers.
    """

    def __init__(
        self, bootstrap: dict, target: str = "xds:///echo-service", details: bool = False
    ) -> None:
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CORE_CLIENT, target, "1" if details else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _command(self, cmd: dict, timeout: float) -> collections.Counter:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.close()
            raise TimeoutError(f"C-core client gave no answer to {cmd} in {timeout}s") from None
        if line is None:
            raise RuntimeError(f"C-core client exited: {self.stderr()}")
        return collections.Counter(json.loads(line))

    def call(self, n: int, rpc_timeout: float = 5.0, timeout: float = 30.0):
        return self._command({"op": "call", "n": n, "timeout": rpc_timeout}, timeout)

    def call_until(self, backend: str, timeout: float = 5.0):
        return self._command({"op": "until", "backend": backend, "timeout": timeout}, timeout + 10)

    def stderr(self) -> str:
        if self._proc.poll() is None:
            return ""
        assert self._proc.stderr is not None
        return self._proc.stderr.read()[-4000:]

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait(timeout=5)

    def __enter__(self) -> CoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def backend_names(counts: Iterable[str]) -> set[str]:
    """The names in a Counter that are backends (not ``error:...``)."""
    return {name for name in counts if not name.startswith("error:")}


# -- a bare ADS stream, for protocol tests -------------------------------------------


class RawAdsClient:
    """One ADS stream to ``address``; the test sends DiscoveryRequests and reads responses.

    Every read is bounded by a timeout. ``closed`` holds the stream's final
    grpc.RpcError (or True for OK) once the server ends it.
    """

    def __init__(self, address: str, node_id: str = "test-node") -> None:
        self.node_id = node_id
        self._channel = grpc.insecure_channel(address)
        self._requests: queue.Queue = queue.Queue()
        self._responses: queue.Queue = queue.Queue()
        self._sent_node = False
        self.closed: object = None
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self._channel)
        self._call = stub.StreamAggregatedResources(iter(self._requests.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self._call:
                self._responses.put(response)
            self.closed = True
        except grpc.RpcError as e:
            self.closed = e
        self._responses.put(None)

    def send(
        self,
        type_url: str,
        names: Iterable[str] = (),
        version: str = "",
        nonce: str = "",
        error: str | None = None,
    ) -> None:
        """Send a request; the node goes on the first request only (as gRPC clients do)."""
        request = discovery_pb2.DiscoveryRequest(
            type_url=type_url,
            resource_names=list(names),
            version_info=version,
            response_nonce=nonce,
        )
        if not self._sent_node:
            request.node.CopyFrom(base_pb2.Node(id=self.node_id))
            self._sent_node = True
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        self._requests.put(request)

    def send_request(self, request: discovery_pb2.DiscoveryRequest) -> None:
        """Send ``request`` exactly as given (no node added): for malformed-request tests."""
        self._sent_node = True
        self._requests.put(request)

    def ack(self, response: discovery_pb2.DiscoveryResponse, names: Iterable[str]) -> None:
        self.send(response.type_url, names, version=response.version_info, nonce=response.nonce)

    def recv(self, timeout: float = 5.0) -> discovery_pb2.DiscoveryResponse:
        """The next response; raises TimeoutError, or EOFError when the stream ended."""
        try:
            response = self._responses.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no DiscoveryResponse within {timeout}s") from None
        if response is None:
            self._responses.put(None)
            raise EOFError(f"ADS stream ended: {self.closed}")
        return response

    def finish(self) -> None:
        """End the request stream (a half-close): no request after this."""
        self._requests.put(None)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._channel.close()

    def __enter__(self) -> RawAdsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resource_names_of(response: discovery_pb2.DiscoveryResponse) -> list[str]:
    """Names of the resources in a response (Listener/Route/Cluster name, CLA cluster_name)."""
    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.config.endpoint.v3 import endpoint_pb2
    from envoy.config.listener.v3 import listener_pb2
    from envoy.config.route.v3 import route_pb2

    from pyxds.server.types import CLUSTER_LOAD_ASSIGNMENT, FIELD_OF_TYPE

    classes = dict(
        zip(
            FIELD_OF_TYPE,
            (
                listener_pb2.Listener,
                route_pb2.RouteConfiguration,
                cluster_pb2.Cluster,
                endpoint_pb2.ClusterLoadAssignment,
            ),
            strict=True,
        )
    )
    out = []
    for any_msg in response.resources:
        msg = classes[any_msg.type_url].FromString(any_msg.value)
        out.append(msg.cluster_name if any_msg.type_url == CLUSTER_LOAD_ASSIGNMENT else msg.name)
    return out
