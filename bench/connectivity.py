"""How long a connectivity change takes to reach pyxds's LB policies, next
to C-core's own view of the same connection (issue 18 item 1).

pyxds's subchannel transports are grpcio channels; C-core's LB policies hear
a change of their connection the moment C-core makes it.  Here one grpcio
channel (a pyxds ``SyncTransport``, or ``AioTransport`` with ``--aio``) is
watched two ways at once:

* **C-core**: a thread blocked in cygrpc's ``watch_connectivity_state`` on
  that channel (event-driven: it returns when C-core changes the state);
* **pyxds**: the transport's own report (the process's connectivity monitor
  for sync transports, ``wait_for_state_change`` for asyncio ones), as the
  subchannel receives it;

and each change is timed on both.  The monitor also watches ``--load``
other connected channels (cold, as at a 1000-endpoint cluster), so its
sweeps cost what they cost at scale.  The events, ``--trials`` times each:

* READY: ``connect()`` on a fresh transport to a live backend;
* IDLE after GOAWAY: the backend stops gracefully (no RPC running);
* IDLE after a lost connection: the backend process is killed (no RPC);
* IDLE after a lost connection while RPCs run (each failed RPC tells the
  monitor to look at once);

(for the three losses: the first state other than READY each side sees)
* TRANSIENT_FAILURE: ``connect()`` to a port nobody listens on.

Prints, per event, the median and 90th percentile of (pyxds - C-core) in
milliseconds, and the load average.  Usage:
python bench/connectivity.py [--trials 20] [--load 1000] [--aio]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import grpc

from pyxds.channel.subchannel import AioTransport, SyncTransport, subchannel_options

GC = grpc.ChannelConnectivity
_BY_CODE = {s.value[0]: s for s in GC}

_BACKEND = r"""
import sys, signal, threading
from concurrent import futures
import grpc
h = grpc.method_handlers_generic_handler(
    "bench.Scale", {"Port": grpc.unary_unary_rpc_method_handler(lambda r, c: b"ok")})
# port 0, no SO_REUSEPORT: a port no other program's server can share
server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.so_reuseport", 0)])
server.add_generic_rpc_handlers((h,))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
sys.stdin.readline()          # "stop": a graceful stop sends GOAWAY
server.stop(5).wait()
"""


class Backend:
    """A grpc server in its own process (so it can be killed), on a port it
    picks (:attr:`port`)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BACKEND],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def goaway(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    def wait(self) -> None:
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def dead_port() -> socket.socket:
    """A bound socket that never listens: connections to its port are
    refused, and no other program can bind the port while it is open (a
    port found free and closed again could be anyone's by the time we dial)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


class Timeline:
    """When each watcher saw each state (first time since ``reset``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[tuple[str, GC], float] = {}
        self.cond = threading.Condition(self.lock)

    def record(self, who: str, state: GC) -> None:
        now = time.perf_counter()
        with self.cond:
            self.seen.setdefault((who, state), now)
            if state is not GC.READY:
                # a lost connection: whichever state comes first (with RPCs
                # running, grpcio may reconnect before a check sees IDLE)
                self.seen.setdefault((who, "left READY"), now)  # type: ignore[arg-type]
            self.cond.notify_all()

    def reset(self) -> None:
        with self.lock:
            self.seen.clear()

    def wait(self, state: Any, timeout: float = 30.0) -> float | None:
        """pyxds's time minus C-core's for ``state`` (None: not both seen)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while ("core", state) not in self.seen or ("pyxds", state) not in self.seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return self.seen[("pyxds", state)] - self.seen[("core", state)]


def core_watcher(
    cygrpc_channel: Any, timeline: Timeline, stop: threading.Event
) -> threading.Thread:
    """C-core's own view: a thread blocked on the channel's state changes."""

    def run() -> None:
        last = cygrpc_channel.check_connectivity_state(False)
        while not stop.is_set():
            event = cygrpc_channel.watch_connectivity_state(last, time.time() + 0.5)
            if event.success:
                last = cygrpc_channel.check_connectivity_state(False)
                timeline.record("core", _BY_CODE[last])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def load_transports(n: int) -> list[SyncTransport]:
    """``n`` sync transports connected to the scale bench's backend."""
    if n <= 0:
        return []
    serve = subprocess.Popen(
        [
            sys.executable,
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale.py"),
            "--serve",
            str(n),
            "--sizes",
            str(n),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert serve.stdout is not None
    import json

    from envoy.config.endpoint.v3 import endpoint_pb2

    bootstrap = json.loads(serve.stdout.readline())["bootstrap"]
    ports = _eds_ports(bootstrap, f"scale-{n}", endpoint_pb2)
    options = subchannel_options(None)
    transports = [
        SyncTransport(f"127.0.0.1:{p}", None, options, None, lambda state: None) for p in ports
    ]
    for t in transports:
        t.connect()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(t.channel._channel.check_connectivity_state(False) == 2 for t in transports):
            break
        time.sleep(0.05)
    load_transports.server = serve  # type: ignore[attr-defined]
    return transports


def _eds_ports(bootstrap: dict, name: str, endpoint_pb2: Any) -> list[int]:
    from envoy.config.core.v3 import base_pb2
    from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

    channel = grpc.insecure_channel(bootstrap["xds_servers"][0]["server_uri"])
    stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    request = discovery_pb2.DiscoveryRequest(
        node=base_pb2.Node(id="scale"),
        type_url="type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        resource_names=[name],
    )
    calls = stub.StreamAggregatedResources(iter([request]))
    response = next(calls)
    calls.cancel()
    channel.close()
    cla = endpoint_pb2.ClusterLoadAssignment()
    response.resources[0].Unpack(cla)
    return [
        e.endpoint.address.socket_address.port_value
        for locality in cla.endpoints
        for e in locality.lb_endpoints
    ]


class Probe:
    """One transport watched by pyxds and by C-core's own view."""

    def __init__(self, port: int, timeline: Timeline, loop: asyncio.AbstractEventLoop | None):
        self.timeline = timeline
        address = f"127.0.0.1:{port}"
        options = subchannel_options(None)

        def on_state(state: GC) -> None:
            timeline.record("pyxds", state)

        if loop is None:
            self.transport: Any = SyncTransport(address, None, options, None, on_state)
        else:
            self.transport = AioTransport(loop, address, None, options, None, on_state)
            deadline = time.monotonic() + 5
            while self.transport.channel is None and time.monotonic() < deadline:
                time.sleep(0.001)
        # C-core's view: a sync channel sharing nothing is not the same
        # connection, so for asyncio the reference watches the aio channel's
        # own cygrpc channel through the loop (wait_for_state_change)
        self.stop = threading.Event()
        self.loop = loop
        if loop is None:
            core_watcher(self.transport.channel._channel, timeline, self.stop)
        else:
            asyncio.run_coroutine_threadsafe(self._aio_core_watch(), loop)

    async def _aio_core_watch(self) -> None:
        channel = self.transport.channel
        state = channel.get_state(False)
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(channel.wait_for_state_change(state), 0.5)
            except TimeoutError:
                continue
            except Exception:
                return
            state = channel.get_state(False)
            self.timeline.record("core", state)

    def connect(self) -> None:
        self.transport.connect()

    def rpc(self, timeout: float = 1.0) -> bool:
        channel = self.transport.channel
        try:
            if self.loop is None:
                channel.unary_unary("/bench.Scale/Port")(b"", timeout=timeout)
            else:
                fut = asyncio.run_coroutine_threadsafe(
                    channel.unary_unary("/bench.Scale/Port")(b"", timeout=timeout), self.loop
                )
                fut.result(timeout + 1)
            return True
        except Exception:
            self.transport.suspect()  # what the call engine does on UNAVAILABLE
            return False

    def close(self) -> None:
        self.stop.set()
        time.sleep(0.6)  # the reference watcher's wait ends (close() waits for it)
        self.transport.retire(force=True)


def trial(kind: str, timeline: Timeline, loop: asyncio.AbstractEventLoop | None) -> float | None:
    timeline.reset()
    if kind == "TRANSIENT_FAILURE":
        with dead_port() as dead:
            probe = Probe(dead.getsockname()[1], timeline, loop)
            probe.connect()
            diff = timeline.wait(GC.TRANSIENT_FAILURE)
            probe.close()
        return diff
    backend = Backend()
    probe = Probe(backend.port, timeline, loop)
    try:
        probe.connect()
        ready = timeline.wait(GC.READY)
        if kind == "READY":
            return ready
        time.sleep(0.3)  # settled: the pyxds side is cold again only after its warm span
        if kind != "IDLE (lost, RPCs running)":
            time.sleep(3.0)
        timeline.reset()
        running = threading.Event()
        if kind == "IDLE (lost, RPCs running)":
            running.set()

            def load() -> None:
                while running.is_set():
                    if not probe.rpc(0.5):
                        time.sleep(0.001)

            threading.Thread(target=load, daemon=True).start()
            time.sleep(0.05)
        if kind == "IDLE (GOAWAY)":
            backend.goaway()
        else:
            backend.kill()
        diff = timeline.wait("left READY")
        running.clear()
        return diff
    finally:
        backend.kill()
        backend.wait()
        probe.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--load", type=int, default=1000)
    parser.add_argument("--aio", action="store_true")
    args = parser.parse_args()
    load = load_transports(args.load)
    loop: asyncio.AbstractEventLoop | None = None
    if args.aio:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
    timeline = Timeline()
    kinds = (
        "READY",
        "IDLE (GOAWAY)",
        "IDLE (lost)",
        "IDLE (lost, RPCs running)",
        "TRANSIENT_FAILURE",
    )
    results: dict[str, list[float]] = {k: [] for k in kinds}
    missed: dict[str, int] = {k: 0 for k in kinds}
    for i in range(args.trials):
        for kind in kinds:
            diff = trial(kind, timeline, loop)
            if diff is None:
                missed[kind] += 1
            else:
                results[kind].append(diff * 1000)
        print(f"  trial {i + 1}/{args.trials} done", flush=True)
    print()
    print(f"load average: {os.getloadavg()}; {len(load)} other channels watched (cold)")
    side = "asyncio (AioTransport)" if args.aio else "sync (SyncTransport, polled)"
    print(f"{side}: pyxds sees the change this long after C-core does (ms)")
    print(f"{'event':<28} {'median':>8} {'p90':>8} {'max':>8} {'missed':>7}")
    for kind in kinds:
        values = sorted(results[kind])
        if not values:
            print(f"{kind:<28} {'-':>8} {'-':>8} {'-':>8} {missed[kind]:>7}")
            continue
        p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
        median = values[len(values) // 2]
        print(f"{kind:<28} {median:>8.1f} {p90:>8.1f} {values[-1]:>8.1f} {missed[kind]:>7}")
    for t in load:
        t.retire(force=True)
    server = getattr(load_transports, "server", None)
    if server is not None:
        server.stdin.close()
        server.wait(30)


if __name__ == "__main__":
    main()
