"""xDS-enabled servers for end-to-end tests: pyxds's (sync and aio, in this
process) and grpcio's C-core ``grpc.server(xds=True)`` (in a subprocess:
C-core reads its bootstrap from the environment once per process), all
serving ``pyxds.test.Echo`` on 127.0.0.1 with replies naming the server, plus
the PKI and the client calls the tests share.

Every wait here is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from typing import Any

import grpc
from backends import HERE
from ports import HeldPort
from protos import echo_pb2, echo_pb2_grpc

import pyxds
from pyxds.testing.certs import CertAuthority, write_files

TEMPLATE = "grpc/server?xds.resource.listening_address=%s"
SPIFFE_SERVER = "spiffe://mesh.example/ns/srv/sa/echo"
SPIFFE_A = "spiffe://mesh.example/ns/a/sa/alice"
SPIFFE_B = "spiffe://mesh.example/ns/b/sa/bob"
SERVER_NAME = "echo.mesh.example"
ECHO = "/pyxds.test.Echo/Echo"
ECHO_STREAM = "/pyxds.test.Echo/EchoStream"


def listener_name(address: str) -> str:
    return TEMPLATE.replace("%s", address)


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return value
        time.sleep(interval)


# ----------------------------------------------------------------------- PKI


class Pki:
    """A mesh CA with a server identity and two client identities, another
    CA with a client, and file_watcher file sets for each."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.ca = CertAuthority("mesh CA")
        self.other_ca = CertAuthority("other CA")
        self.server = self.ca.issue("echo", dns=(SERVER_NAME,), uris=(SPIFFE_SERVER,))
        self.server2 = self.ca.issue("echo-2", dns=(SERVER_NAME,), uris=(SPIFFE_SERVER,))
        self.alice = self.ca.issue("alice", dns=("alice.mesh.example",), uris=(SPIFFE_A,))
        self.bob = self.ca.issue("bob", uris=(SPIFFE_B,))
        self.subject_only = self.ca.issue("carol")
        self.stranger = self.other_ca.issue("mallory", uris=(SPIFFE_A,))
        self.server_files = write_files(os.path.join(folder, "server"), self.ca.pem, self.server)
        self.server2_files = write_files(os.path.join(folder, "server2"), self.ca.pem, self.server2)

    def providers(self, files: dict | None = None, refresh: str = "1s", **more: dict) -> dict:
        """A bootstrap ``certificate_providers``: ``default`` (what istiod names)."""
        config = dict(files or self.server_files)
        config["refresh_interval"] = refresh
        out = {"default": {"plugin_name": "file_watcher", "config": config}}
        for name, cfg in more.items():
            cfg = dict(cfg)
            cfg.setdefault("refresh_interval", refresh)
            out[name] = {"plugin_name": "file_watcher", "config": cfg}
        return out

    def client_credentials(self, who: str | None) -> grpc.ChannelCredentials:
        """TLS to the server (verified with the mesh CA) presenting ``who``'s
        certificate (None: no client certificate)."""
        if who is None:
            return grpc.ssl_channel_credentials(self.ca.pem)
        leaf = getattr(self, who)
        return grpc.ssl_channel_credentials(self.ca.pem, leaf.key, leaf.cert)


# ----------------------------------------------------------------------- servers


class Echo(echo_pb2_grpc.EchoServicer):
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def Echo(self, request, context):
        self.calls += 1
        return echo_pb2.EchoReply(message=request.message, backend=self.name)

    def EchoStream(self, request, context):
        self.calls += 1
        for _ in range(max(1, request.count)):
            yield echo_pb2.EchoReply(message=request.message, backend=self.name)


class AioEcho(echo_pb2_grpc.EchoServicer):
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    async def Echo(self, request, context):
        self.calls += 1
        return echo_pb2.EchoReply(message=request.message, backend=self.name)

    async def EchoStream(self, request, context):
        self.calls += 1
        for _ in range(max(1, request.count)):
            yield echo_pb2.EchoReply(message=request.message, backend=self.name)


class PyxdsServer:
    """``pyxds.xds_server`` (sync) on 127.0.0.1; ``secure``: the port uses
    grpcio's xDS credentials with an insecure fallback (else
    ``add_insecure_port``); ``resource_timeout``: a shorter does-not-exist
    timer for the XdsClient ``start()`` makes (test-only, as the channel's
    ``XdsClient(resource_timeout=)``; None: A57's 15 s)."""

    kind = "pyxds"

    def __init__(
        self,
        bootstrap: dict,
        port: int = 0,
        secure: bool = True,
        options: Sequence[tuple[str, Any]] = (),
        interceptors: Sequence[Any] = (),
        host: str = "127.0.0.1",
        resource_timeout: float | None = None,
    ) -> None:
        self.events: list[tuple[str, bool, str | None]] = []
        self.servicer = Echo("pyxds")
        self._executor = futures.ThreadPoolExecutor(8, thread_name_prefix="pyxds-xds-server")
        self.server = pyxds.xds_server(
            self._executor,
            interceptors=list(interceptors),
            options=list(options),
            bootstrap=bootstrap,
            on_serving_changed=lambda *event: self.events.append(event),
        )
        self.server._core.resource_timeout = resource_timeout
        echo_pb2_grpc.add_EchoServicer_to_server(self.servicer, self.server)
        address = f"{host}:{port}"
        if secure:
            creds = grpc.xds_server_credentials(grpc.insecure_server_credentials())
            self.port = self.server.add_secure_port(address, creds)
        else:
            self.port = self.server.add_insecure_port(address)
        self.address = f"{host}:{self.port}"

    def start(self) -> PyxdsServer:
        self.server.start()
        return self

    def serving(self) -> bool | None:
        return self.events[-1][1] if self.events else None

    def stop(self) -> None:
        self.server.stop(None).wait(10)
        self._executor.shutdown(wait=False)


class PyxdsAioServer:
    """``pyxds.aio.xds_server`` on 127.0.0.1, on an event loop thread of its
    own; ``resource_timeout`` as :class:`PyxdsServer`'s."""

    kind = "pyxds-aio"

    def __init__(
        self,
        bootstrap: dict,
        port: int = 0,
        secure: bool = True,
        host: str = "127.0.0.1",
        resource_timeout: float | None = None,
    ) -> None:
        self.events: list[tuple[str, bool, str | None]] = []
        self.servicer = AioEcho("pyxds-aio")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

        async def make() -> Any:
            server = pyxds.aio.xds_server(
                bootstrap=bootstrap, on_serving_changed=lambda *e: self.events.append(e)
            )
            echo_pb2_grpc.add_EchoServicer_to_server(self.servicer, server)
            address = f"{host}:{port}"
            if secure:
                creds = grpc.xds_server_credentials(grpc.insecure_server_credentials())
                bound = server.add_secure_port(address, creds)
            else:
                bound = server.add_insecure_port(address)
            return server, bound

        self.server, self.port = self._run(make())
        self.server._core.resource_timeout = resource_timeout
        self.address = f"{host}:{self.port}"

    def _run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> PyxdsAioServer:
        self._run(self.server.start())
        return self

    def serving(self) -> bool | None:
        return self.events[-1][1] if self.events else None

    def stop(self) -> None:
        try:
            self._run(self.server.stop(None))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


_CORE_SERVER = r"""
import sys, time, grpc
from concurrent import futures
from protos import echo_pb2, echo_pb2_grpc

class Echo(echo_pb2_grpc.EchoServicer):
    def Echo(self, request, context):
        return echo_pb2.EchoReply(message=request.message, backend="core")
    def EchoStream(self, request, context):
        for _ in range(max(1, request.count)):
            yield echo_pb2.EchoReply(message=request.message, backend="core")

server = grpc.server(futures.ThreadPoolExecutor(8), xds=True)
echo_pb2_grpc.add_EchoServicer_to_server(Echo(), server)
for address in sys.argv[1].split(","):
    if sys.argv[2] == "xds":
        creds = grpc.xds_server_credentials(grpc.insecure_server_credentials())
        server.add_secure_port(address, creds)
    else:
        server.add_insecure_port(address)
server.start()
print("started", flush=True)
sys.stdin.read()
server.stop(None)
"""


class CoreXdsServer:
    """grpcio's ``grpc.server(xds=True)`` in a subprocess on fixed ports
    (``extra_ports``: more ports of the same server, each its own Listener).

    C-core binds a port only once its Listener is accepted, and with
    SO_REUSEPORT: each port is held here, shared, from before the process
    starts until stop() (tests/e2e/ports.py), so C-core joins the hold and no
    other program can bind the port in between."""

    kind = "core"

    def __init__(self, bootstrap: dict, secure: bool = True, extra_ports: int = 0) -> None:
        self._held = [HeldPort(shared=True) for _ in range(1 + extra_ports)]
        self.ports = [held.port for held in self._held]
        self.port = self.ports[0]
        self.address = f"127.0.0.1:{self.port}"
        self.addresses = [held.address for held in self._held]
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        env["GRPC_VERBOSITY"] = "INFO"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CORE_SERVER,
                ",".join(self.addresses),
                "xds" if secure else "insecure",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._err: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_err(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self.log.append(line.rstrip())

    def start(self) -> CoreXdsServer:
        assert self._proc.stdout is not None
        got: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: got.put(self._proc.stdout.readline()), daemon=True).start()
        try:
            line = got.get(timeout=30)
        except queue.Empty:
            raise TimeoutError("C-core xDS server did not start") from None
        if "started" not in line:
            raise RuntimeError(f"C-core xDS server failed: {self.log[-20:]}")
        return self

    def stop(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait(timeout=5)
        for held in self._held:
            held.release()


# ----------------------------------------------------------------------- clients

CLIENT_OPTIONS = [
    ("grpc.ssl_target_name_override", SERVER_NAME),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 300),
    ("grpc.enable_retries", 0),
]


class Client:
    """A plain grpcio client of one server address."""

    def __init__(
        self,
        address: str,
        credentials: grpc.ChannelCredentials | None = None,
        authority: str | None = None,
    ) -> None:
        options = list(CLIENT_OPTIONS)
        if authority is not None:
            options.append(("grpc.default_authority", authority))
        if credentials is None:
            self.channel = grpc.insecure_channel(address, options=options)
        else:
            self.channel = grpc.secure_channel(address, credentials, options=options)
        self.stub = echo_pb2_grpc.EchoStub(self.channel)

    def call(
        self,
        method: str = ECHO,
        metadata: Iterable[tuple[str, str | bytes]] = (),
        timeout: float = 3.0,
        wait_for_ready: bool = False,
    ) -> str:
        """``"OK:<backend>"`` or ``"<CODE>:<details>"``."""
        request = echo_pb2.EchoRequest(message="hi", count=1)
        try:
            if method not in (ECHO, ECHO_STREAM):  # any path, raw bytes
                self.channel.unary_unary(method)(
                    request.SerializeToString(), timeout=timeout, metadata=list(metadata)
                )
                return "OK:"
            if method == ECHO_STREAM:
                replies = list(
                    self.stub.EchoStream(
                        request,
                        timeout=timeout,
                        metadata=list(metadata),
                        wait_for_ready=wait_for_ready,
                    )
                )
                return f"OK:{replies[0].backend}"
            reply = self.stub.Echo(
                request, timeout=timeout, metadata=list(metadata), wait_for_ready=wait_for_ready
            )
            return f"OK:{reply.backend}"
        except grpc.RpcError as err:
            return f"{err.code().name}:{err.details()}"

    def code(self, *args: Any, **kwargs: Any) -> str:
        return self.call(*args, **kwargs).split(":", 1)[0]

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def served_by(address: str, credentials: grpc.ChannelCredentials | None = None) -> str:
    """One RPC on a fresh channel: what answered it."""
    with Client(address, credentials) as client:
        return client.call(timeout=2.0)


def wait_served(
    address: str, credentials: grpc.ChannelCredentials | None = None, timeout: float = 20.0
) -> str:
    """Retry fresh RPCs until one is served (or ``timeout``); the last outcome."""
    outcome = ""

    def served() -> bool:
        nonlocal outcome
        outcome = served_by(address, credentials)
        return outcome.startswith("OK:")

    wait_until(served, timeout, interval=0.2)
    return outcome


def refused(port: int) -> bool:
    """True when a TCP connect to the port is refused (nothing listens)."""
    with socket.socket() as s:
        s.settimeout(1.0)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            return True
        return False
