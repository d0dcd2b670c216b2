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
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc
from ports import EXCLUSIVE, HeldPort, HoldsItsPort

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

    def left(request: bytes, context: grpc.ServicerContext) -> bytes:
        """The seconds the call's deadline left when it arrived (an upper
        bound on its timeout that a starved machine cannot raise)."""
        served[name] += 1
        remaining = context.time_remaining()
        return b"none" if remaining is None else f"{remaining:.3f}".encode()

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
            "Left": grpc.unary_unary_rpc_method_handler(left),
        },
    )


class Backend(HoldsItsPort):
    """A grpcio server on 127.0.0.1 that can be stopped and restarted on
    the same port, which stays held meanwhile (tests/e2e/ports.py: no other
    program can take it; connections are refused)."""

    def __init__(
        self, name: str, port: int = 0, credentials: grpc.ServerCredentials | None = None
    ) -> None:
        self.name = name
        self.port = port
        self.credentials = credentials
        self.served: collections.Counter = collections.Counter()
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._held: HeldPort | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def hold(self) -> Backend:
        """Pick the port now and hold it (refusing connections) until start()."""
        if self._server is None and self._held is None:
            self._held = HeldPort(self.port)
            self.port = self._held.port
        return self

    def start(self) -> Backend:
        # named: a test counting its client's threads tells the backend's apart
        self._executor = futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="backend-")
        server = grpc.server(self._executor, options=[EXCLUSIVE])
        server.add_generic_rpc_handlers((_handlers(self.name, self.served),))
        self._let_go()
        if self.credentials is None:
            self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        else:
            self.port = server.add_secure_port(f"127.0.0.1:{self.port}", self.credentials)
        server.start()
        self._server = server
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop serving; the port stays held until start() or release()."""
        if self._server is not None:
            self._server.stop(grace).wait(5)
            self._server = None
            self._held = HeldPort.again(self.port)
        if self._executor is not None:
            # grpcio leaves the executor to its owner: its idle threads
            # would outlive the test (handlers still running end on their own)
            self._executor.shutdown(wait=False)
            self._executor = None

    @property
    def running(self) -> bool:
        return self._server is not None


def running_backends(*names: str) -> Iterator[dict[str, Backend]]:
    """A module fixture's body (``yield from running_backends("a0", "b0")``):
    a started :class:`Backend` per name, all stopped afterwards."""
    started = {name: Backend(name).start() for name in names}
    try:
        yield started
    finally:
        for backend in started.values():
            backend.stop()


def _stop_listening(sock: socket.socket, acceptor: threading.Thread) -> None:
    """Close a listening socket whose thread is blocked in ``accept()``.
    ``close()`` alone wakes no ``accept()`` on Linux: the call keeps the
    socket listening (a later connection is still accepted) and the thread
    blocked for the rest of the process; ``shutdown()`` makes it return."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    acceptor.join(5)


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
        _stop_listening(self._sock, self._thread)
        for conn in self._conns:
            conn.close()


class RefusingServer:
    """An HTTP/2 server that refuses every stream: SETTINGS exchange, PING
    answered, every HEADERS frame answered with RST_STREAM(REFUSED_STREAM).
    The connection is READY; no RPC ever reaches an application (what a
    server at its stream limit or going away does)."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self.refused = 0
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()

        def read(n: int) -> bytes:
            while len(buf) < n:
                chunk = conn.recv(65536)
                if not chunk:
                    raise EOFError
                buf.extend(chunk)
            out = bytes(buf[:n])
            del buf[:n]
            return out

        def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
            return (
                len(payload).to_bytes(3, "big")
                + bytes([ftype, flags])
                + stream.to_bytes(4, "big")
                + payload
            )

        try:
            read(24)  # client preface
            conn.sendall(frame(4, 0, 0))  # SETTINGS
            while True:
                head = read(9)
                length, ftype, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = read(length)
                if ftype == 4 and not flags & 1:  # SETTINGS -> ACK
                    conn.sendall(frame(4, 1, 0))
                elif ftype == 6 and not flags & 1:  # PING -> PING ACK
                    conn.sendall(frame(6, 1, 0, payload))
                elif ftype == 1:  # HEADERS -> RST_STREAM REFUSED_STREAM (0x7)
                    self.refused += 1
                    conn.sendall(frame(3, 0, stream, (7).to_bytes(4, "big")))
        except (EOFError, OSError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        _stop_listening(self._sock, self._thread)
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass


def who(channel: Any, timeout: float = 5.0, **kwargs: Any) -> str:
    return channel.unary_unary(f"/{SERVICE}/Who")(b"", timeout=timeout, **kwargs).decode()


def connections_to(address: str, closing: bool = False) -> int:
    """Established TCP connections of this machine to ``address``'s port
    (each counted once: on its client side); ``closing``: also those the
    server closed and the client has not closed yet (CLOSE_WAIT: the client
    has not read to the end, a GOAWAY before it included)."""
    port = int(address.rpartition(":")[2])
    states = ("01", "08") if closing else ("01",)
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] in states and int(fields[2].rpartition(":")[2], 16) == port:
                    count += 1
    return count


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


#: Seconds a client may take until every endpoint it balances over has
#: answered: round_robin (gRFC A61) and weighted_target pick READY ones
#: only, and on a loaded machine a connection can come up seconds after the
#: first RPCs went to the others
ANSWERED_WITHIN = 15.0


def until_answered(
    call: Callable[[], Iterable[Any]],
    everyone: Iterable[Any],
    name: Callable[[Any], Any] = lambda reply: reply,
    timeout: float = ANSWERED_WITHIN,
) -> list[Any]:
    """The replies of ``call()``, called again until ``name(reply)`` has
    covered ``everyone`` or ``timeout`` seconds passed (the caller asserts
    on them: a fixed number of calls assumes every endpoint READY at the
    first).  A Counter's replies are its keys."""
    wanted = set(everyone)
    deadline = time.monotonic() + timeout
    replies: list[Any] = []
    while True:
        replies += call()
        if wanted <= {name(reply) for reply in replies} or time.monotonic() >= deadline:
            return replies


def sleeping_on(channel: Any, backend: Backend, seconds: float = 1.0, timeout: float = 5.0) -> Any:
    """A ``Sleep`` RPC of ``seconds`` started on ``channel`` (its future),
    returned once ``backend`` runs it: on a loaded machine a fixed sleep
    after starting an RPC can end before the RPC was picked."""
    before = backend.served[backend.name]
    slow = channel.unary_unary(f"/{SERVICE}/Sleep").future(str(seconds).encode(), timeout=timeout)
    assert wait_until(lambda: backend.served[backend.name] > before, timeout), backend.name
    return slow


def at_once(*calls: Callable[[], Any], timeout: float = 120.0) -> list[Any]:
    """Run ``calls`` concurrently (a thread each: independent clients waiting
    on real timers wait together); their results in order, or the first
    one's exception; each waited for at most ``timeout`` seconds."""
    pool = futures.ThreadPoolExecutor(len(calls), thread_name_prefix="at-once")
    try:
        running = [pool.submit(call) for call in calls]
        return [f.result(timeout=timeout) for f in running]
    finally:
        pool.shutdown(wait=False)  # all done, or the test failed: not waited for


def ahead(request: Any, test: str, call: Callable[[], Any]) -> Iterator[futures.Future | None]:
    """For a module fixture (``yield from``): ``call`` on a thread of its own
    from the module's first test on, if the session runs ``test`` (a test of
    that module, by function name, placed last), which reads the yielded
    future; None otherwise.  A scenario waiting on a real timer (A57's 15 s)
    so waits while the module's other tests run.  Waited for at teardown."""
    if not any(
        getattr(item, "module", None) is request.module
        and getattr(item, "originalname", item.name) == test
        for item in request.session.items
    ):
        yield None
        return
    with futures.ThreadPoolExecutor(1, thread_name_prefix="ahead") as pool:
        yield pool.submit(call)


# -- xDS scenarios --------------------------------------------------------------

LISTENER = "echo-service"
TARGET = f"xds:///{LISTENER}"


def snapshot(
    routes: list[Any],
    clusters: dict[str, list[list[str]]],
    *,
    drops: dict[str, dict[str, int]] | None = None,
    max_requests: dict[str, int] | None = None,
    listener: str = LISTENER,
    version: str | None = None,
) -> Any:
    """A snapshot: ``listener`` -> RDS ``<listener>-route`` with one virtual
    host of ``routes``; each cluster an EDS cluster whose priorities are the
    given address lists (one locality per priority)."""
    from pyxds.server import builders as b
    from pyxds.server.snapshot import Snapshot

    drops = drops or {}
    max_requests = max_requests or {}
    return Snapshot(
        listeners=[b.listener(listener)],
        routes=[b.route_config(f"{listener}-route", [b.virtual_host("vh", routes=routes)])],
        clusters=[b.cluster(name, max_requests=max_requests.get(name)) for name in clusters],
        endpoints=[
            b.endpoints(
                name,
                [
                    b.locality(zone=f"{name}-p{p}", priority=p, endpoints=addresses)
                    for p, addresses in enumerate(priorities)
                ],
                drop_overloads=drops.get(name),
            )
            for name, priorities in clusters.items()
        ],
        version=version,
    )


def route(**kwargs: Any) -> Any:
    from pyxds.server import builders as b

    return b.route(**kwargs)


def header(name: str, **kwargs: Any) -> Any:
    from pyxds.server import builders as b

    return b.header_matcher(name, **kwargs)


_CORE = r"""
import collections, json, os, sys, time
import grpc
import grpc.experimental

channels = {}
XDS_CREDS = os.environ.get("PYXDS_TEST_CORE_XDS_CREDS") == "1"

def channel(target):
    if target not in channels:
        if XDS_CREDS:
            creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
            channels[target] = grpc.secure_channel(target, creds)
        else:
            channels[target] = grpc.insecure_channel(target)
    return channels[target]

def call(target, method, metadata, timeout, wfr, details=False, request=""):
    try:
        reply = channel(target).unary_unary(method)(
            request.encode(), timeout=timeout, metadata=metadata or None, wait_for_ready=wfr)
        return reply.decode()
    except grpc.RpcError as e:
        if details:
            return "error:" + e.code().name + ": " + (e.details() or "")
        return "error:" + e.code().name

def call_md(target, method, metadata, timeout, request=""):
    # [reply or error:CODE, initial metadata, trailing metadata] of one call
    mc = channel(target).unary_unary(method)
    try:
        reply, c = mc.with_call(request.encode(), timeout=timeout, metadata=metadata or None,
                                wait_for_ready=True)
        return [reply.decode(), [list(x) for x in c.initial_metadata() or ()],
                [list(x) for x in c.trailing_metadata() or ()]]
    except grpc.RpcError as e:
        return ["error:" + e.code().name, [list(x) for x in e.initial_metadata() or ()],
                [list(x) for x in e.trailing_metadata() or ()]]

for line in sys.stdin:
    cmd = json.loads(line)
    counts = collections.Counter()
    md = [tuple(x) for x in cmd.get("metadata", [])]
    if cmd["op"] == "call_md":
        print(json.dumps(call_md(cmd["target"], cmd["method"], md, cmd["timeout"],
                                 cmd.get("request", ""))), flush=True)
        continue
    if cmd["op"] == "call":
        for _ in range(cmd["n"]):
            got = call(cmd["target"], cmd["method"], md, cmd["timeout"], cmd["wfr"],
                       cmd.get("details", False), cmd.get("request", ""))
            counts[got] += 1
    elif cmd["op"] == "until":
        deadline = time.monotonic() + cmd["timeout"]
        start = time.monotonic()
        while time.monotonic() < deadline:
            left = max(0.05, min(1.0, deadline - time.monotonic()))
            got = call(cmd["target"], cmd["method"], md, left, False)
            counts[got] += 1
            if got == cmd["want"]:
                counts["__elapsed__"] = int((time.monotonic() - start) * 1000)
                break
    print(json.dumps(counts), flush=True)
"""


class CoreXdsClient:
    """grpcio's C-core xds:/// channel in a subprocess (C-core reads the
    bootstrap once per process); RPCs on command, answers as Counters of the
    backend names (``error:CODE`` for failures)."""

    def __init__(
        self,
        bootstrap: dict,
        xds_credentials: bool = False,
        env: dict | None = None,
        script: str = _CORE,
        args: tuple[str, ...] = (),
    ) -> None:
        """``xds_credentials``: the channel is
        ``grpc.secure_channel(target, grpc.xds_channel_credentials(insecure))`` (A29);
        ``env``: extra environment variables of the C-core process;
        ``script`` / ``args``: another program of JSON lines in, JSON lines out
        (tests/e2e/core_channel.py)."""
        import json
        import os
        import queue
        import subprocess
        import sys

        extra_env = env
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        if xds_credentials:
            env["PYXDS_TEST_CORE_XDS_CREDS"] = "1"
        env.update(extra_env or {})
        self._json = json
        self._proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self._lines: queue.Queue = queue.Queue()
        self._queue_mod = queue
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _command(self, cmd: dict, timeout: float) -> collections.Counter:
        return collections.Counter(self._ask(cmd, timeout))

    def _ask(self, cmd: dict, timeout: float) -> Any:
        """Send ``cmd``, return the decoded answer line."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(self._json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        try:
            line = self._lines.get(timeout=timeout)
        except self._queue_mod.Empty:
            self.close()
            raise TimeoutError(f"C-core client: no answer to {cmd} in {timeout}s") from None
        if line is None:
            raise RuntimeError("C-core client exited")
        return self._json.loads(line)

    def call(
        self,
        n: int,
        method: str = f"/{SERVICE}/Who",
        metadata: list[tuple[str, str]] | None = None,
        target: str = TARGET,
        timeout: float = 5.0,
        wait_for_ready: bool = True,
        details: bool = False,
        request: str = "",
    ) -> collections.Counter:
        """``details``: failures as ``error:CODE: details``; ``request``: the
        request bytes (text)."""
        cmd = {
            "details": details,
            "request": request,
            "op": "call",
            "n": n,
            "method": method,
            "metadata": metadata or [],
            "target": target,
            "timeout": timeout,
            "wfr": wait_for_ready,
        }
        return self._command(cmd, timeout * n + 30)

    def call_md(
        self,
        method: str = f"/{SERVICE}/Who",
        metadata: list[tuple[str, str]] | None = None,
        target: str = TARGET,
        timeout: float = 5.0,
        request: str = "",
    ) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
        """One unary call (wait_for_ready): (reply or ``error:CODE``, initial
        metadata, trailing metadata) as the application sees them."""
        cmd = {
            "op": "call_md",
            "method": method,
            "metadata": metadata or [],
            "target": target,
            "timeout": timeout,
            "request": request,
        }
        assert self._proc.stdin is not None
        self._proc.stdin.write(self._json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        line = self._lines.get(timeout=timeout + 30)
        if line is None:
            raise RuntimeError("C-core client exited")
        reply, initial, trailing = self._json.loads(line)
        return reply, [tuple(x) for x in initial], [tuple(x) for x in trailing]

    def until(
        self, want: str, timeout: float, method: str = f"/{SERVICE}/Who", target: str = TARGET
    ) -> collections.Counter:
        cmd = {"op": "until", "want": want, "timeout": timeout, "method": method, "target": target}
        return self._command(cmd, timeout + 30)

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except Exception:
                self._proc.kill()
                self._proc.wait(timeout=5)


def pyxds_calls(
    channel: Any,
    n: int,
    method: str = f"/{SERVICE}/Who",
    metadata: list[tuple[str, str]] | None = None,
    timeout: float = 5.0,
    wait_for_ready: bool = True,
    details: bool = False,
    request: str = "",
) -> collections.Counter:
    """The same as CoreXdsClient.call, on a pyxds (or any grpc) channel."""
    counts: collections.Counter = collections.Counter()
    mc = channel.unary_unary(method)
    body = request.encode()
    for _ in range(n):
        try:
            counts[
                mc(body, timeout=timeout, metadata=metadata, wait_for_ready=wait_for_ready).decode()
            ] += 1
        except grpc.RpcError as err:
            text = "error:" + err.code().name
            if details:
                text += ": " + (err.details() or "")
            counts[text] += 1
    return counts


def core_note(text: str) -> str:
    """C-core's resolution note inside its "no children in weighted_target policy
    (NOTE)" RPC error (``error:UNAVAILABLE: ...`` as the clients here count it)."""
    head = "error:UNAVAILABLE: no children in weighted_target policy ("
    assert text.startswith(head) and text.endswith(")"), text
    return text[len(head) : -1]


def call_until(channel: Any, want: str, timeout: float, method: str = f"/{SERVICE}/Who") -> float:
    """Call (fast-failing) until ``want`` answers; seconds it took (inf if never)."""
    mc = channel.unary_unary(method)
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        try:
            got = mc(b"", timeout=max(0.05, min(1.0, deadline - time.monotonic()))).decode()
        except grpc.RpcError:
            got = None
        if got == want:
            return time.monotonic() - start
        time.sleep(0.01)
    return float("inf")


def fails_with(channel: Any, text: str, method: str = f"/{SERVICE}/Who") -> bool:
    """True when a fast-failing RPC fails with details containing ``text``."""
    try:
        channel.unary_unary(method)(b"", timeout=5)
    except grpc.RpcError as err:
        return text in (err.details() or "")
    return False
