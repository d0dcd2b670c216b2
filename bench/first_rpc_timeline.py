"""The first ``xds:///`` RPC seen from outside: when each client's bytes
reach the control plane and the backend, C-core and pyxds side by side.

The world is ``startup.py``'s (``e2e.py``'s backend answering
``/bench.Bench/Ping``, the control plane ``pyxds.server`` serving listener
``bench`` -> route -> cluster ``c`` -> that backend), run in a process of its
own (``--serve``), with a TCP relay in front of the control plane and one in
front of the backend: the bootstrap names the control plane's relay, EDS
names the backend's.  Each relay stamps every chunk it passes
(``time.monotonic``, after forwarding it) and reads the HTTP/2 frames in it:
the connection accepted, the client's preface, the ADS stream's HEADERS,
each DiscoveryRequest (first request or ACK, by its ``response_nonce``) and
DiscoveryResponse (by type) as it crosses the wire, the RPC's HEADERS at the
backend and its reply.  A relay costs both kinds of client the same hop (a
thread wake-up, tens of microseconds).  At each event the relay also reads
the client process's CPU clock (every thread, ended ones too), so each gap
shows how much of it the client spent computing: a gap far longer than its
CPU is a wait (the network, the other side, or a serial step).

The clients are fresh programs, ``startup.py``'s first-RPC child with
stamps: the library imported before the clock (as ``startup.py``'s plain
rows), then ``channel`` (before ``insecure_channel``), ``made`` (after it),
``sent`` (the RPC called) and ``reply``, each with ``time.process_time``.
``time.monotonic`` is CLOCK_MONOTONIC, one clock for every process of the
machine (``main`` checks it: a child's reading falls between two of the
parent's).  Printed per step: the median time in ms after the client's
``channel`` stamp, and the median of each run's gap from the step above,
wall (client CPU); then the whole RPC's wall, CPU and time off CPU.

``--before DIR`` adds the pyxds kinds again with pyxds from ``DIR/src``
(e.g. ``git archive main | tar -x -C DIR``); ``--server DIR`` runs the
control plane from ``DIR/src``; ``--json FILE`` keeps every run.

Measured (issue 18, stop 40, grpcio 1.85, 21 rounds at load ~1.7, medians,
ms, wall (client CPU)):

* the whole first RPC: C-core 15.6 (8.5), pyxds 35.1 (30.5); C-core aio
  13.3 (6.4), pyxds aio 32.6 (28.1).  pyxds's extra over C-core, +19.5 ms
  of wall, is all its own CPU (+21.9): no step waits on anything C-core
  does not wait on; pyxds is off CPU ~4.5 ms in all, C-core ~7.
* channel() to the control plane's accept: C-core 2.8 (2.7), pyxds 17.6
  (17.0): loading the xDS client, resources and protos (startup_floor.py).
* the stream's HEADERS to its first request: C-core 0 (one write), pyxds
  0.8-1.4 sync, 0.8-3.3 aio (grpc.aio writes a stream's first message only
  once its HEADERS are sent, a completion through its poller; the stream
  loop shares the GIL with the thread loading the LB policies ahead).
* the control plane (pyxds.server): the first response 0.6-1.0 after a
  C-core client's first request (HEADERS and request in one write: the
  stream's start is in it; ~0.15-0.3 less since the stream reads its first
  request itself), 0.3-0.5 after pyxds's (HEADERS came earlier); every
  later response 0.1-0.4.
* each response to its ACK and the next request: C-core 0.1-0.3, pyxds
  0.4-0.6 of CPU, the first (LDS) 1.3-4 (its first decode, beside the
  policies loading ahead).
* EDS response to the backend's accept: C-core 0.5, pyxds 1.5-2 (CPU: the
  LB tree and the subchannel's grpcio channel); the backend's handshake to
  the RPC's HEADERS: C-core 0.3-0.4, pyxds 0.7-0.9 (0.5 CPU).
* tried: a 0.5 ms switch interval while the policies load ahead (a woken
  ADS thread gets the GIL sooner): no gain (35.1 -> 37.8 sync, 32.6 -> 34.0
  aio, within the spread).

Usage: python bench/first_rpc_timeline.py [--rounds 11] [--before DIR] [--server DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import startup

HERE = os.path.dirname(os.path.abspath(__file__))
METHOD = "/bench.Bench/Ping"
TYPES = {
    "Listener": "LDS",
    "RouteConfiguration": "RDS",
    "Cluster": "CDS",
    "ClusterLoadAssignment": "EDS",
}

_CLIENT = r"""
import json, sys, time
kind, target, bootstrap = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
__LIBRARY__
if kind.endswith("aio"):
    import asyncio, grpc.aio
stamps = {}


def now():
    return time.monotonic(), time.process_time()


if kind.endswith("aio"):

    async def first():
        stamps["channel"] = now()
        if kind.startswith("pyxds"):
            channel = pyxds.aio.insecure_channel(target, bootstrap=bootstrap)
        else:
            channel = grpc.aio.insecure_channel(target)
        stamps["made"] = now()
        call = channel.unary_unary(METHOD)
        stamps["sent"] = now()
        await call(b"x", timeout=10, wait_for_ready=True)
        stamps["reply"] = now()
        await channel.close()

    asyncio.run(first())
else:
    stamps["channel"] = now()
    if kind.startswith("pyxds"):
        channel = pyxds.insecure_channel(target, bootstrap=bootstrap)
    else:
        channel = grpc.insecure_channel(target)
    stamps["made"] = now()
    call = channel.unary_unary(METHOD)
    stamps["sent"] = now()
    call(b"x", timeout=10, wait_for_ready=True)
    stamps["reply"] = now()
    channel.close()
print(json.dumps(stamps))
""".replace("METHOD", repr(METHOD)).replace("__LIBRARY__\n", startup.LIBRARY)


# -- the world (``--serve``) ---------------------------------------------------


#: the client process watched: its CPU clock (``clock_getcpuclockid``: every
#: thread of the process, exited ones too), read at each event
_CLIENT_CPU: list[int] = []


def _client_cpu() -> float:
    try:
        return time.clock_gettime(_CLIENT_CPU[0]) if _CLIENT_CPU else 0.0
    except OSError:  # the client exited
        return 0.0


class _Log(list):  # type: ignore[type-arg]
    """Events as (time, what, the client's CPU time then)."""

    def add(self, now: float, what: str) -> None:
        self.append((now, what, _client_cpu()))


class _Frames:
    """One direction of one HTTP/2 connection, read frame by frame; every
    event it sees goes to ``log``."""

    def __init__(self, log: _Log, side: str, client: bool) -> None:
        self.log = log
        self.side = side
        self.client = client  # the client's direction: starts with the preface
        self.buffer = b""
        self.preface = client
        self.messages: dict[int, bytes] = {}  # gRPC bytes per stream, not yet whole

    def feed(self, now: float, data: bytes) -> None:
        self.buffer += data
        if self.preface:
            if len(self.buffer) < 24:
                return
            self.buffer = self.buffer[24:]
            self.preface = False
            self.log.add(now, f"{self.side} preface")
        while len(self.buffer) >= 9:
            length = int.from_bytes(self.buffer[:3], "big")
            if len(self.buffer) < 9 + length:
                return
            kind, flags = self.buffer[3], self.buffer[4]
            stream = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
            payload = self.buffer[9 : 9 + length]
            self.buffer = self.buffer[9 + length :]
            self._frame(now, kind, flags, stream, payload)

    def _frame(self, now: float, kind: int, flags: int, stream: int, payload: bytes) -> None:
        who = "client" if self.client else "server"
        if kind == 4 and not flags & 1:  # SETTINGS, not an ACK
            self.log.add(now, f"{self.side} {who} SETTINGS")
        elif kind == 1 and self.client:  # HEADERS: a stream opened
            self.log.add(now, f"{self.side} stream {stream} HEADERS")
        elif kind == 0 and payload:  # DATA
            if flags & 8:  # PADDED
                payload = payload[1 : len(payload) - payload[0]]
            whole = self.messages.pop(stream, b"") + payload
            while len(whole) >= 5 and len(whole) >= 5 + int.from_bytes(whole[1:5], "big"):
                size = int.from_bytes(whole[1:5], "big")
                self.log.add(now, self._message(stream, whole[5 : 5 + size]))
                whole = whole[5 + size :]
            if whole:
                self.messages[stream] = whole

    def _message(self, stream: int, body: bytes) -> str:
        if self.side != "cp":
            return f"{self.side} {'request' if self.client else 'reply'} message"
        from envoy.service.discovery.v3 import discovery_pb2

        if self.client:
            request = discovery_pb2.DiscoveryRequest.FromString(body)
            xds = TYPES.get(request.type_url.rsplit(".", 1)[-1], request.type_url)
            if request.error_detail.message:
                return f"cp {xds} NACK"
            return f"cp {xds} {'ACK' if request.response_nonce else 'request'}"
        response = discovery_pb2.DiscoveryResponse.FromString(body)
        xds = TYPES.get(response.type_url.rsplit(".", 1)[-1], response.type_url)
        return f"cp {xds} response"


class _Relay:
    """A TCP relay to ``upstream`` on a port of its own, logging what it passes."""

    def __init__(self, side: str, upstream: tuple[str, int]) -> None:
        self.side = side
        self.upstream = upstream
        self.log = _Log()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            self.log.add(time.monotonic(), f"{self.side} accepted")
            server = socket.create_connection(self.upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for source, sink, from_client in ((client, server, True), (server, client, False)):
                frames = _Frames(self.log, self.side, from_client)
                threading.Thread(
                    target=self._pump, args=(source, sink, frames), daemon=True
                ).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, frames: _Frames) -> None:
        try:
            while data := source.recv(65536):
                now = time.monotonic()
                sink.sendall(data)
                frames.feed(now, data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def serve() -> None:
    """``--serve``: backend, control plane and their relays; prints the
    bootstrap, then reads lines on stdin: ``pid N`` watches process N's CPU
    time from then on, an empty line prints the events logged since the
    last (JSON) and forgets them."""
    from e2e import start_backend

    from pyxds.server import ManagementServer
    from pyxds.server import builders as b
    from pyxds.server.snapshot import Snapshot

    backend, port = start_backend()
    control = ManagementServer().start()
    cp_relay = _Relay("cp", ("127.0.0.1", control.port))
    backend_relay = _Relay("backend", ("127.0.0.1", port))
    address = f"127.0.0.1:{backend_relay.port}"
    control.set_snapshot(
        Snapshot(
            listeners=[b.listener("bench")],
            routes=[
                b.route_config(
                    "bench-route",
                    [b.virtual_host("vh", routes=[b.route(prefix="", cluster="c")])],
                )
            ],
            clusters=[b.cluster("c")],
            endpoints=[b.endpoints("c", [b.locality(zone="z", endpoints=[address])])],
        )
    )
    bootstrap = control.bootstrap(node_id="bench")
    bootstrap["xds_servers"][0]["server_uri"] = f"127.0.0.1:{cp_relay.port}"
    print(json.dumps({"bootstrap": bootstrap, "address": address}), flush=True)
    for line in sys.stdin:
        if line.startswith("pid "):
            # CLOCK_PROCESS_CPUTIME_ID of another process (Linux's
            # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED))
            _CLIENT_CPU[:] = [(~int(line.split()[1]) << 3) | 2]
            continue
        events = cp_relay.log + backend_relay.log
        cp_relay.log.clear()
        backend_relay.log.clear()
        print(json.dumps(sorted(events)), flush=True)
    control.stop()
    backend.stop(None)


# -- the rounds ----------------------------------------------------------------

#: the steps printed, in the order of a first RPC ("made": the channel
#: object returned; "sent": the RPC called)
STEPS = (
    "client: made",
    "cp accepted",
    "cp preface",
    "cp stream 1 HEADERS",
    "cp LDS request",
    "cp LDS response",
    "cp LDS ACK",
    "cp RDS request",
    "cp RDS response",
    "cp RDS ACK",
    "cp CDS request",
    "cp CDS response",
    "cp CDS ACK",
    "cp EDS request",
    "cp EDS response",
    "cp EDS ACK",
    "backend accepted",
    "backend preface",
    "backend stream 1 HEADERS",
    "backend reply message",
    "client: reply",
)


class World:
    """The ``--serve`` process (with pyxds from ``tree``/src if given)."""

    def __init__(self, tree: str | None = None) -> None:
        path = [HERE, *([os.path.join(tree, "src")] if tree else []), *sys.path]
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        )
        self.info = json.loads(self._out.readline())

    @property
    def _out(self) -> Any:
        assert self.process.stdout is not None
        return self.process.stdout

    def tell(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def events(self) -> list[tuple[float, str, float]]:
        """What the relays saw since the last call."""
        self.tell("")
        return [tuple(e) for e in json.loads(self._out.readline())]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(10)


#: one run: step -> (ms after the client's channel() call, the client's CPU
#: ms over the same span, every thread)
Run = dict[str, tuple[float, float]]


def run_client(world: World, kind: str, before: bool) -> Run:
    """One fresh client's steps."""
    env = startup._env(before)
    bootstrap = world.info["bootstrap"]
    if kind.startswith("core"):
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    world.events()  # forget anything earlier
    child = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, kind, "xds:///bench", json.dumps(bootstrap)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    world.tell(f"pid {child.pid}")
    out, err = child.communicate(timeout=60)
    if child.returncode:
        raise RuntimeError(f"{kind} client failed:\n{err}")
    stamps = json.loads(out.strip().splitlines()[-1])
    zero, zero_cpu = stamps["channel"]
    steps: Run = {}
    for name in ("made", "sent"):
        steps[f"client: {name}"] = tuple(stamps[name])
    for at, what, cpu in world.events():
        steps.setdefault(what, (at, cpu))  # the first of each
    steps["client: reply"] = tuple(stamps["reply"])
    return {
        name: ((at - zero) * 1000, (cpu - zero_cpu) * 1000) for name, (at, cpu) in steps.items()
    }


def check_clock() -> None:
    """time.monotonic is one clock across processes (CLOCK_MONOTONIC)."""
    for _ in range(3):
        before = time.monotonic()
        child = subprocess.run(
            [sys.executable, "-c", "import time; print(time.monotonic())"],
            capture_output=True,
            text=True,
            check=True,
        )
        after = time.monotonic()
        assert before <= float(child.stdout) <= after, "time.monotonic differs across processes"


KINDS = {
    "C-core": "core",
    "pyxds": "pyxds",
    "C-core aio": "core-aio",
    "pyxds aio": "pyxds-aio",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--before", help="source tree of pyxds before a change")
    parser.add_argument("--json", help="write every run's steps to this file")
    parser.add_argument("--server", help="source tree of the control plane's pyxds (default: this)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    check_clock()
    startup.PYCACHE = tempfile.mkdtemp(prefix="pyxds-pycache-")
    startup.BEFORE = args.before
    kinds = {}
    for name, kind in KINDS.items():
        kinds[name] = kind
        if args.before and kind.startswith("pyxds"):
            kinds[f"{name} (before)"] = kind
    print(f"load: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    world = World(args.server)
    seen: dict[str, list[Run]] = {name: [] for name in kinds}
    try:
        names = list(kinds)
        for name in names:  # warm-up: the bytecode cache
            run_client(world, kinds[name], name.endswith("(before)"))
        for i in range(args.rounds):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                seen[name].append(run_client(world, kinds[name], name.endswith("(before)")))
    finally:
        world.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(seen, f)
    print_table(seen)


def print_table(seen: dict[str, list[Run]]) -> None:
    """Per step and kind: the median time, and the median of each run's
    gap from the step before, wall (CPU)."""
    names = list(seen)
    print(
        f"ms after the client's channel() call, medians of {len(seen[names[0]])} runs;"
        " +gap from the step above, wall (client CPU over it, every thread):"
    )
    print(f"  {'step':<26}" + "".join(f"{n:>26}" for n in names))
    for i, step in enumerate(STEPS):
        cells = []
        for name in names:
            runs = [run for run in seen[name] if step in run]
            if not runs:
                cells.append(f"{'-':>26}")
                continue
            at = statistics.median(run[step][0] for run in runs)
            cell = f"{at:.1f}"
            if i:
                before = STEPS[i - 1]
                pairs = [(run[step], run[before]) for run in runs if before in run]
                if pairs:
                    wall = statistics.median(a[0] - b[0] for a, b in pairs)
                    cpu = statistics.median(a[1] - b[1] for a, b in pairs)
                    cell += f" +{wall:.1f} ({cpu:.1f})"
            cells.append(f"{cell:>26}")
        print(f"  {step:<26}" + "".join(cells))
    print("the whole first RPC (channel() to reply), medians, ms:")
    core = {"": "C-core", " aio": "C-core aio"}
    for name in names:
        runs = seen[name]
        wall = statistics.median(run["client: reply"][0] for run in runs)
        cpu = statistics.median(run["client: reply"][1] for run in runs)
        off = statistics.median(run["client: reply"][0] - run["client: reply"][1] for run in runs)
        line = f"  {name:<22} wall {wall:6.1f}  CPU {cpu:6.1f}  off CPU {off:5.1f}"
        base = core[" aio" if " aio" in name else ""]
        if name != base and base in seen:
            core_wall = statistics.median(run["client: reply"][0] for run in seen[base])
            core_cpu = statistics.median(run["client: reply"][1] for run in seen[base])
            line += (
                f"   vs {base}: wall {wall / core_wall:.2f}x (+{wall - core_wall:.1f}),"
                f" CPU +{cpu - core_cpu:.1f}"
            )
        print(line)


if __name__ == "__main__":
    main()
