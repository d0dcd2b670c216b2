"""pyxds at mesh scale, side by side with grpcio's C-core ``xds:///`` channel.

One round_robin cluster of N loopback endpoints (issue 18), N = 1, 100,
1000 by default.  The backend is one process serving N ports (one
``grpc.aio`` server per port on one event loop, each answering with its own
port, so the client knows which endpoint it reached) beside the control
plane (``pyxds.server``).  Each client runs in its own process, one at a
time, in alternating order per round:

  core       grpc.insecure_channel("xds:///scale-N")        (C-core, sync)
  pyxds      pyxds.insecure_channel("xds:///scale-N")
  core-aio   grpc.aio.insecure_channel("xds:///scale-N")    (C-core, asyncio)
  pyxds-aio  pyxds.aio.insecure_channel("xds:///scale-N")

Per client and N:

* ``serve s``: seconds from channel creation until every endpoint answered
  and at least 2N sequential RPCs (wait_for_ready) succeeded; ``serve CPU
  s``: the process's CPU time over the same span (steadier than the wall
  time on a loaded machine);
* ``connect s``: seconds from channel creation until the process holds N
  more connections (descriptors), whatever RPCs do meanwhile;
* ``threads``: threads of the client process once all N serve (``/proc``:
  C-core's and Python's alike), and ``+threads``: those beyond the count
  before the channel was made.  Not counted: the bench's own connection
  watcher (joined first) and pyxds's lingering workers (``pyxds-xds-watchers_*``,
  ``pyxds-dns_*``: alive only within 1 s of their last work, so at N=1000
  counted or not by chance of how long serving took); each round's JSON
  names them (``lingering``) and every thread counted (``thread_names``:
  Python's names and ``/proc`` comm names).  Sync pyxds at N=1 and N=1000:
  C-core's 6 (4 "event_engine", "lifeguard", "grpc_global_tim") and
  Python's 5 (main, grpc.aio's poller ``_poll_wrapper``, ``pyxds-reaper``,
  ``pyxds-timer``, ``pyxds-xds-streams``);
* ``CPU/RPC us``: process CPU per sequential unary RPC (after the above);
* ``idle %``: process CPU, in % of one core, over ``--idle`` seconds with
  no RPC (every endpoint connected);
* ``RSS MiB`` once all N serve; ``KB/endpoint``: the slope of RSS between
  the two largest N (what one more endpoint costs);
* after ``close()``: threads and sockets beyond the count before the channel.

Prints the table and the pyxds / C-core ratios (sync and aio), and the load
average.  ``--shape`` measures other shapes of issue 18 item 4 instead:
``channels`` (10 channels x 100 endpoints), ``ring_hash`` (1000 endpoints,
connects lazily), ``pick_first`` (1000 addresses), with the same columns;
``wrr_oob`` (N = ``--sizes``): the same N endpoints under
weighted_round_robin with ``enable_oob_load_report`` (gRFC A51/A58): every
backend serves ``OpenRcaService`` (pyxds.orca) and each client keeps one
out-of-band report stream per endpoint, a report every ``--oob-period``
seconds (10 s, A58's default; the idle column includes taking them); its
kinds default to the sync pair ``core,pyxds``.

Before/after a change: ``--before DIR`` (a source tree, e.g. ``git archive
HEAD src | tar -x -C DIR``) adds the kinds ``pyxds-before`` and
``pyxds-aio-before`` (pyxds imported from ``DIR/src``), interleaved with the
others, and prints their ratios to C-core too.

Usage: python bench/scale.py [--sizes 1,100,1000] [--rounds 1] [--idle 5]
       [--kinds core,pyxds,core-aio,pyxds-aio] [--shape channels] [--before DIR]
       [--oob-period 10]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc

METHOD = "/bench.Scale/Port"
KINDS = ("core", "pyxds", "core-aio", "pyxds-aio")
SERVE_LIMIT = 120.0


# -- the backend and control plane (``--serve``) ------------------------------


#: the CPU utilization each backend reports out of band (``--shape wrr_oob``),
#: by port index: two loads, so weighted_round_robin's weights differ
OOB_LOADS = (0.2, 0.6)


def _port_handler(port_box: list[bytes]) -> grpc.GenericRpcHandler:
    """Answers every call with the port it was made to (``port_box[0]``)."""

    async def port(request: bytes, context: object) -> bytes:
        return port_box[0]

    return grpc.method_handlers_generic_handler(
        "bench.Scale", {"Port": grpc.unary_unary_rpc_method_handler(port)}
    )


async def _start_backends(
    n: int, aliases: int = 1, oob_interval: float | None = None
) -> tuple[list[int], list[object]]:
    """``n`` servers; each also listens on 127.0.0.2 .. 127.0.0.<aliases>
    (same port: more endpoint addresses than servers, loopback only);
    ``oob_interval``: each also serves ``OpenRcaService`` with that minimum
    report interval, reporting a CPU utilization of ``OOB_LOADS``."""
    servers, ports = [], []
    for i in range(n):
        # no SO_REUSEPORT: port 0 must be a port nobody else listens on
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        port_box: list[bytes] = []
        server.add_generic_rpc_handlers((_port_handler(port_box),))
        if oob_interval is not None:
            from pyxds.orca import ServerMetricRecorder, add_orca_service

            recorder = ServerMetricRecorder()
            recorder.set_cpu_utilization(OOB_LOADS[i % len(OOB_LOADS)])
            recorder.set_qps(100.0)
            add_orca_service(server, recorder, min_report_interval=oob_interval)
        port = server.add_insecure_port("127.0.0.1:0")
        for k in range(2, aliases + 1):
            server.add_insecure_port(f"127.0.0.{k}:{port}")
        port_box.append(str(port).encode())
        await server.start()
        servers.append(server)
        ports.append(port)
    return ports, servers


#: loopback aliases the servers also listen on for ``--shape eds`` (1-11);
#: 127.0.0.12-20 listen on nothing (refused: the bad-input variant)
EDS_ALIASES = 11


def eds_variant(name: str, ports: list[int]) -> list[list[str]]:
    """The "big" cluster's localities (100 of them) in each variant:
    v1 1000 endpoints; v2 10,000; v3 v2 with locality 0's 100 replaced;
    bad: 1000 good and 9000 that refuse connections."""
    if name == "v1":
        return [[f"127.0.0.1:{p}" for p in ports[i * 10 : i * 10 + 10]] for i in range(100)]
    out = []
    for i in range(100):
        alias = i // 10 + 1  # 127.0.0.1-10, each over the 1000 ports
        if name == "bad":
            alias = 1 if i < 10 else 11 + i // 10  # 127.0.0.12-20: refused
        chunk = ports[(i % 10) * 100 : (i % 10) * 100 + 100]
        out.append([f"127.0.0.{alias}:{p}" for p in chunk])
    if name == "v3":
        out[0] = [f"127.0.0.11:{p}" for p in ports[:100]]
    return out


def wrr_oob_policy(period: float) -> object:
    """WrrLocality over ClientSideWeightedRoundRobin with out-of-band
    reports every ``period`` seconds (A58's other fields at their defaults)."""
    from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
        client_side_weighted_round_robin_pb2 as cswrr_pb2,
    )
    from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2
    from google.protobuf import wrappers_pb2

    from pyxds.server import builders as b

    cswrr = cswrr_pb2.ClientSideWeightedRoundRobin(
        enable_oob_load_report=wrappers_pb2.BoolValue(value=True)
    )
    cswrr.oob_reporting_period.FromNanoseconds(int(period * 1e9))
    inner = b._load_balancing_policy([("wrr", cswrr)])
    return wrr_locality_pb2.WrrLocality(endpoint_picking_policy=inner)


def serve(max_n: int, sizes: list[int], aliases: int = 1, oob_period: float = 10.0) -> None:
    """Backends on ``max_n`` ports and a control plane with one listener per
    shape; prints the bootstrap as one JSON line, runs until stdin closes.
    ``/bench.Control/Set`` (on the control port) switches the "big"
    cluster's endpoints to the variant named in the request."""
    from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2

    from pyxds.server import ManagementServer
    from pyxds.server import builders as b
    from pyxds.server.snapshot import Snapshot

    loop = asyncio.new_event_loop()
    helper = None
    if aliases > 1:
        # 10,000 listeners and 10,000 connections: more descriptors than one
        # process may open here; half the backends live in a helper process
        helper = subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                *("--backends", str(max_n // 2), "--aliases", str(aliases)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert helper.stdout is not None
        helper_ports = json.loads(helper.stdout.readline())
        ports, _servers = loop.run_until_complete(_start_backends(max_n - max_n // 2, aliases))
        ports = ports + helper_ports
    else:
        ports, _servers = loop.run_until_complete(
            _start_backends(max_n, aliases, oob_interval=oob_period)
        )
    threading.Thread(target=loop.run_forever, daemon=True).start()
    addresses = [f"127.0.0.1:{p}" for p in ports]

    listeners, routes, clusters, endpoints = [], [], [], []

    def add(name: str, n: int, offset: int = 0, **cluster_args: object) -> None:
        route_args = cluster_args.pop("route_args", {})
        listeners.append(b.listener(name))
        routes.append(
            b.route_config(
                f"{name}-route",
                [b.virtual_host("vh", routes=[b.route(prefix="", cluster=name, **route_args)])],
            )
        )
        clusters.append(b.cluster(name, **cluster_args))  # type: ignore[arg-type]
        chosen = addresses[offset : offset + n]
        endpoints.append(b.endpoints(name, [b.locality(zone="z", endpoints=chosen)]))

    for n in sizes:
        add(f"scale-{n}", n)
        add(f"wrr-{n}", n, load_balancing_policy=wrr_oob_policy(oob_period))
    big = min(1000, max_n)
    for i in range(10):  # 10 channels x 100 endpoints, each its own
        add(f"part-{i}", min(100, max_n), offset=(i * 100) % max(1, max_n - 99))
    add(
        "ring",
        big,
        lb_policy="RING_HASH",
        route_args={"hash_policies": [b.hash_policy(header="user")]},
    )
    add("pf", big, load_balancing_policy=pick_first_pb2.PickFirst())
    add("big", 0)
    control = ManagementServer().start()

    def big(variant: str) -> None:
        localities = [
            b.locality(zone=f"z{i}", endpoints=chunk)
            for i, chunk in enumerate(eds_variant(variant, ports) if len(ports) >= 1000 else [])
        ]
        endpoints[-1] = b.endpoints("big", localities)
        control.set_snapshot(
            Snapshot(listeners=listeners, routes=routes, clusters=clusters, endpoints=endpoints)
        )

    big("v1")

    def set_variant(request: bytes, context: object) -> bytes:
        big(request.decode())
        return b"ok"

    switch = grpc.server(
        futures.ThreadPoolExecutor(max_workers=1), options=[("grpc.so_reuseport", 0)]
    )
    switch.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Control", {"Set": grpc.unary_unary_rpc_method_handler(set_variant)}
            ),
        )
    )
    switch_port = switch.add_insecure_port("127.0.0.1:0")
    switch.start()
    info = {"bootstrap": control.bootstrap(node_id="scale"), "control": switch_port}
    print(json.dumps(info), flush=True)
    sys.stdin.read()
    switch.stop(None)
    control.stop()
    if helper is not None:
        assert helper.stdin is not None
        helper.stdin.close()
        helper.wait(60)


def backends_only(n: int, aliases: int) -> None:
    """``--backends N``: only backends; prints their ports, runs until stdin closes."""
    loop = asyncio.new_event_loop()
    ports, _servers = loop.run_until_complete(_start_backends(n, aliases))
    threading.Thread(target=loop.run_forever, daemon=True).start()
    print(json.dumps(ports), flush=True)
    sys.stdin.read()


# -- one client (``--client KIND N``) -------------------------------------------


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _fds() -> int:
    """Open descriptors (cheap: no readlink, a connection is one each)."""
    return len(os.listdir("/proc/self/fd"))


#: seconds ``--shape eds`` waits after close() for threads to go back
CLOSE_SETTLE_EDS = 30.0


def _thread_names() -> dict[str, int]:
    """Threads of the process by name (``/proc``'s comm: C-core's own are
    "event_engine" (its work-stealing pool), "lifeguard" (the pool's
    grower), "grpc_global_tim"; Python's are "python" or their own name)."""
    names: dict[str, int] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return names


#: pyxds's worker pools (pyxds/_lingering.py) whose threads exit 1 s after
#: their last work: alive at a count only by chance, so not counted
LINGERING = ("pyxds-xds-watchers_", "pyxds-dns_")


def _steady_threads() -> tuple[int, list[str]]:
    """Threads of the process but pyxds's lingering workers, and the names
    of those left out (alive in the same ``/proc`` look)."""
    tasks = set(os.listdir("/proc/self/task"))
    lingering = sorted(
        t.name
        for t in threading.enumerate()
        if t.name.startswith(LINGERING) and str(t.native_id) in tasks
    )
    return len(tasks) - len(lingering), lingering


def _counted_threads() -> dict[str, object]:
    """Every thread of the process by name: Python's (``threading``, the
    lingering workers included) and ``/proc``'s comm names."""
    return {
        "python": sorted(t.name for t in threading.enumerate()),
        "comm": dict(sorted(_thread_names().items())),
    }


def _settle_after_close(
    base: dict[str, float], limit: float = 3.0, base_names: dict[str, int] | None = None
) -> dict[str, object]:
    """Threads and sockets after close, given up to ``limit`` s to go back;
    ``closed_s``: how long that took; ``closed_extra``: the names of the
    threads still over ``base_names`` then."""
    start = time.monotonic()
    deadline = start + limit
    while time.monotonic() < deadline:
        if _threads() <= base["threads"] and _fds() <= base["fds"]:
            break
        time.sleep(0.2)
    out: dict[str, object] = {
        "closed_threads": _threads(),
        "closed_sockets": _sockets(),
        "closed_s": time.monotonic() - start,
    }
    if base_names is not None:
        now = _thread_names()
        out["closed_extra"] = {
            k: now[k] - base_names.get(k, 0) for k in now if now[k] > base_names.get(k, 0)
        }
    return out


class ConnectWatch:
    """Seconds from channel creation until the process holds ``n`` more
    descriptors (one per connection): every endpoint connected, however the
    client notices it (looked at every 20 ms; at N=1000 ~1 ms a look)."""

    def __init__(self, n: int) -> None:
        self.target = _fds() + n
        self.start = time.monotonic()
        self.seconds: float | None = None
        self.stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.stop and time.monotonic() - self.start < SERVE_LIMIT:
            if _fds() >= self.target:
                self.seconds = time.monotonic() - self.start
                return
            time.sleep(0.02)

    def finish(self) -> float:
        """Stop watching (its thread gone before threads are counted); the
        seconds measured, 0.0 when the count was not reached."""
        self.stop = True
        self._thread.join(5)
        return self.seconds or 0.0


def _more(seen: set[bytes], ok: int, want: int, target: str) -> bool:
    """Until every endpoint answered and 2N RPCs succeeded; ring_hash
    (lazy: one new hash key per RPC) just 2N RPCs."""
    if target.endswith("ring"):
        return ok < 2 * want
    return len(seen) < want or ok < 2 * want


def _metadata(i: int) -> tuple[tuple[str, str], ...]:
    return (("user", f"u{i}"),)


def client_sync(kind: str, n: int, target: str, rpcs: int, idle: float, channels: int) -> dict:
    if kind == "pyxds":
        import pyxds

        make = pyxds.insecure_channel
    else:
        make = grpc.insecure_channel
    base = {"threads": _threads(), "sockets": _sockets(), "fds": _fds(), "rss": _rss_mib()}
    targets = [target] if channels == 1 else [f"{target}-{i}" for i in range(channels)]
    connect = ConnectWatch(n * channels) if not target.endswith(("ring", "pf")) else None
    start, start_cpu = time.monotonic(), time.process_time()
    chans = [make(t) for t in targets]
    callables = [c.unary_unary(METHOD) for c in chans]
    seen: set[bytes] = set()
    ok = 0
    i = 0
    want = n * channels
    while _more(seen, ok, want, target) and time.monotonic() - start < SERVE_LIMIT:
        mc = callables[i % len(callables)]
        port = mc(b"", timeout=60, wait_for_ready=True, metadata=_metadata(i))
        seen.add(port if channels == 1 else port + b"@" + str(i % channels).encode())
        ok += 1
        i += 1
    serve_s = time.monotonic() - start
    serve_cpu_s = time.process_time() - start_cpu
    connect_s = connect.finish() if connect is not None else 0.0  # its thread gone
    threads, lingering = _steady_threads()
    out = {
        "serve_s": serve_s,
        "serve_cpu_s": serve_cpu_s,
        "connect_s": connect_s,
        "reached": len(seen),
        "threads": threads,
        "lingering": lingering,
        "thread_names": _counted_threads(),
        "rss": _rss_mib(),
    }
    mc = callables[0]
    for _ in range(200):
        mc(b"", timeout=60)
    cpu, wall = time.process_time(), time.monotonic()
    for _ in range(rpcs):
        mc(b"", timeout=60)
    out["cpu_us"] = (time.process_time() - cpu) / rpcs * 1e6
    out["wall_us"] = (time.monotonic() - wall) / rpcs * 1e6
    time.sleep(1.0)
    cpu = time.process_time()
    time.sleep(idle)
    out["idle_pct"] = (time.process_time() - cpu) / idle * 100.0
    out["idle_threads"] = _steady_threads()[0]
    for c in chans:
        c.close()
    out.update(_settle_after_close(base))
    out["base"] = base
    return out


async def client_aio(kind: str, n: int, target: str, rpcs: int, idle: float, channels: int) -> dict:
    if kind == "pyxds-aio":
        import pyxds.aio

        make = pyxds.aio.insecure_channel
    else:
        make = grpc.aio.insecure_channel
    await asyncio.sleep(0)
    base = {"threads": _threads(), "sockets": _sockets(), "fds": _fds(), "rss": _rss_mib()}
    targets = [target] if channels == 1 else [f"{target}-{i}" for i in range(channels)]
    connect = ConnectWatch(n * channels) if not target.endswith(("ring", "pf")) else None
    start, start_cpu = time.monotonic(), time.process_time()
    chans = [make(t) for t in targets]
    callables = [c.unary_unary(METHOD) for c in chans]
    seen: set[bytes] = set()
    ok = 0
    i = 0
    want = n * channels
    while _more(seen, ok, want, target) and time.monotonic() - start < SERVE_LIMIT:
        mc = callables[i % len(callables)]
        port = await mc(b"", timeout=60, wait_for_ready=True, metadata=_metadata(i))
        seen.add(port if channels == 1 else port + b"@" + str(i % channels).encode())
        ok += 1
        i += 1
    serve_s = time.monotonic() - start
    serve_cpu_s = time.process_time() - start_cpu
    connect_s = connect.finish() if connect is not None else 0.0  # its thread gone
    threads, lingering = _steady_threads()
    out = {
        "serve_s": serve_s,
        "serve_cpu_s": serve_cpu_s,
        "connect_s": connect_s,
        "reached": len(seen),
        "threads": threads,
        "lingering": lingering,
        "thread_names": _counted_threads(),
        "rss": _rss_mib(),
    }
    mc = callables[0]
    for _ in range(200):
        await mc(b"", timeout=60)
    cpu, wall = time.process_time(), time.monotonic()
    for _ in range(rpcs):
        await mc(b"", timeout=60)
    out["cpu_us"] = (time.process_time() - cpu) / rpcs * 1e6
    out["wall_us"] = (time.monotonic() - wall) / rpcs * 1e6
    await asyncio.sleep(1.0)
    cpu = time.process_time()
    await asyncio.sleep(idle)
    out["idle_pct"] = (time.process_time() - cpu) / idle * 100.0
    out["idle_threads"] = _steady_threads()[0]
    for c in chans:
        await c.close()
    await asyncio.sleep(0.1)
    out.update(_settle_after_close(base))
    out["base"] = base
    return out


class RpcLoad:
    """Sequential RPCs on a thread (sync) while the test changes the cluster:
    count, failures and the slowest RPC of each window (an RPC counts in the
    window it ends in), with when it ran (``slowest_span``, monotonic)."""

    def __init__(self, call: object) -> None:
        self.call = call
        self.stop = threading.Event()
        self.count = 0
        self.failed = 0
        self.slowest = 0.0
        self.slowest_span = (0.0, 0.0)
        self.took: list[float] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def window(self) -> dict[str, float]:
        out = {"rpcs": self.count, "failed": self.failed, "slowest_ms": self.slowest * 1000}
        took = sorted(self.took)
        # the 99th percentile: one noisy-neighbour stall moves the slowest
        # RPC of a window, not this
        out["p99_ms"] = took[int(len(took) * 0.99)] * 1000 if took else 0.0
        self.took = []
        self.last_slowest_span = self.slowest_span
        self.count = self.failed = 0
        self.slowest = 0.0
        self.slowest_span = (0.0, 0.0)
        return out

    def _run(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                self.call(b"", timeout=30, wait_for_ready=True)  # type: ignore[operator]
            except grpc.RpcError:
                self.failed += 1
            end = time.monotonic()
            self.took.append(end - start)
            if end - start > self.slowest:
                self.slowest = end - start
                self.slowest_span = (start, end)
            self.count += 1


_CONTROL: dict[int, grpc.Channel] = {}


class GcPauses:
    """Python's garbage-collector pauses (``gc.callbacks``) per window: how
    many collections of each generation, the longest and the total."""

    def __init__(self) -> None:
        self._began = 0.0
        self._reset()
        gc.callbacks.append(self._on_gc)

    def _reset(self) -> None:
        self.counts = [0, 0, 0]
        self.total = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self.promoted = 0
        #: collections of at least 1 ms: (generation, start, end, thread name)
        self.spans: list[tuple[int, float, float, str]] = []

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            if info["generation"] == 1:
                # at most these move to the oldest generation now: a full
                # collection runs once they add up to a quarter of it
                self.promoted += len(gc.get_objects(0)) + len(gc.get_objects(1))
            self._began = time.monotonic()
            return
        if not self._began:
            # registered while another thread's collection was under way
            # (a Python gc callback can be preempted): its start was not seen
            return
        end = time.monotonic()
        took = end - self._began
        self._began = 0.0
        generation = info["generation"]
        self.counts[generation] += 1
        self.total[generation] += took
        self.longest[generation] = max(self.longest[generation], took)
        if took >= 0.001:
            name = threading.current_thread().name
            self.spans.append((generation, self._began, end, name))

    def during(self, span: tuple[float, float]) -> dict[str, object]:
        """The collections (this window's) that overlap ``span``: their ms
        in it, and which generation ran on which thread."""
        start, end = span
        ms = 0.0
        where: list[str] = []
        for generation, began, ended, name in self.spans:
            overlap = min(end, ended) - max(start, began)
            if overlap > 0:
                ms += overlap * 1000
                where.append(f"gen{generation}@{name} {overlap * 1000:.0f}ms")
        return {"slowest_gc_ms": ms, "slowest_gcs": where}

    def window(self) -> dict[str, float]:
        out = {
            "full_gcs": self.counts[2],
            "full_gc_max_ms": self.longest[2] * 1000,
            "full_gc_total_ms": self.total[2] * 1000,
            "young_gc_total_ms": (self.total[0] + self.total[1]) * 1000,
            "promoted": self.promoted,
        }
        self._reset()
        return out


def _switch(control_port: int, variant: str) -> None:
    """Switch the "big" cluster (one connection kept open: the backend
    process is busy with 10,000 connections)."""
    channel = _CONTROL.get(control_port)
    if channel is None:
        channel = _CONTROL[control_port] = grpc.insecure_channel(f"127.0.0.1:{control_port}")
    channel.unary_unary("/bench.Control/Set")(variant.encode(), timeout=120, wait_for_ready=True)


def _until_fds(at_least: int, limit: float) -> float:
    """Seconds until the process has ``at_least`` descriptors open (looked
    at 4 times a second: a scan of 10,000 holds the GIL ~50 ms)."""
    start = time.monotonic()
    while _fds() < at_least and time.monotonic() - start < limit:
        time.sleep(0.25)
    return time.monotonic() - start


def _census() -> dict[str, int]:
    """GC-tracked objects alive now, by type."""
    gc.collect()
    counts: dict[str, int] = {}
    for obj in gc.get_objects():
        cls = type(obj)
        name = f"{cls.__module__}.{cls.__qualname__}"
        counts[name] = counts.get(name, 0) + 1
    return counts


def _per_endpoint(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    """The types that grew by at least 0.5 per endpoint from ``before`` to
    ``after`` (``n`` endpoints more), largest first."""
    grown = {k: (v - before.get(k, 0)) / n for k, v in after.items()}
    return dict(sorted(((k, round(v, 2)) for k, v in grown.items() if v >= 0.5), key=_second))


def _second(item: tuple[str, float]) -> float:
    return -item[1]


#: one-locality updates ``--shape eds`` makes (each replaces locality 0's 100
#: endpoints: v3, back to v2, v3 again...), a window of LOCALITY_SETTLE s each
LOCALITY_UPDATES = 4
LOCALITY_SETTLE = 3.0
#: seconds ``--shape eds`` waits after growing to 10,000 before those updates
EDS_SETTLE = 5.0
#: seconds between the bench's own full collection and the first window
WINDOW_GAP = 0.5


def client_eds(
    kind: str, control_port: int, idle: float, phases: str = "grow,locality,bad"
) -> dict:
    """``--shape eds``: 1000 endpoints serving; then, while RPCs run, the EDS
    grows to 10,000 (seconds until 10,000 connections are open), one
    locality of 100 is replaced (LOCALITY_UPDATES times, back and forth),
    and 9000 of them turn into refused ones (``bad``: left out unless named
    in ``phases``)."""
    if kind in ("pyxds", "pyxds-gcfreeze"):
        import pyxds

        make = pyxds.insecure_channel
    elif kind == "core":
        make = grpc.insecure_channel
    else:
        raise SystemExit("--shape eds measures the sync clients (core, pyxds, pyxds-gcfreeze)")
    pauses = GcPauses()
    _switch(control_port, "v1")  # and the control connection is open before counting
    base = {"threads": _threads(), "sockets": _sockets(), "fds": _fds(), "rss": _rss_mib()}
    base_names = _thread_names()
    channel = make("xds:///big")
    call = channel.unary_unary(METHOD)
    seen: set[bytes] = set()
    start = time.monotonic()
    while len(seen) < 1000 and time.monotonic() - start < SERVE_LIMIT:
        seen.add(call(b"", timeout=60, wait_for_ready=True))
    out: dict = {"serve_s": time.monotonic() - start, "reached": len(seen)}
    load = RpcLoad(call)
    load.thread.start()
    time.sleep(1.0)
    load.window()

    def phase(name: str, variant: str, settle: float, more: int = 0) -> None:
        fds = _fds()
        cpu = time.process_time()
        began = time.monotonic()
        _switch(control_port, variant)
        if more:
            out[f"{name}_connect_s"] = _until_fds(fds + more, 120.0)
        time.sleep(settle)
        out[f"{name}_cpu_pct"] = (time.process_time() - cpu) / (time.monotonic() - began) * 100
        out[f"{name}_threads"] = _threads()
        out[name] = load.window()
        out[name].update(pauses.during(load.last_slowest_span))
        out[name].update(pauses.window())

    census_1k = _census()
    out["gc_objects_1k"] = sum(census_1k.values())
    pauses.window()
    phase("grow", "v2", 2.0, more=9_000)
    out["rss_10k"] = _rss_mib()
    census_10k = _census()
    out["gc_objects_10k"] = sum(census_10k.values())
    out["gc_objects_by_type"] = _per_endpoint(census_1k, census_10k, 9000)
    # Let the 9000 new connections' reports die down, and start the
    # one-locality windows from a full collection (the grow phase's objects
    # would otherwise be what triggers the next full collections): what the
    # windows see is what the updates (and the RPCs) cause.
    time.sleep(EDS_SETTLE)
    gc.collect()
    if kind == "pyxds-gcfreeze":
        # what an application with such a mesh can do once it is built: move
        # every object alive now out of the collector's sight
        gc.freeze()
    # The RPC in flight waited for that collection (0.15-0.4 s at 10,000
    # endpoints, pyxds only: C-core's objects are not Python's) and ends
    # after it: let it end before the first window opens, or the bench's own
    # collection is the first window's slowest RPC.
    time.sleep(WINDOW_GAP)
    pauses.window()
    load.window()
    if "locality" in phases:
        windows = []
        for i in range(LOCALITY_UPDATES):
            phase("one_locality", "v3" if i % 2 == 0 else "v2", LOCALITY_SETTLE)
            windows.append(out.pop("one_locality") | {"cpu_pct": out.pop("one_locality_cpu_pct")})
        out["one_locality_windows"] = windows
        out["one_locality"] = {
            "slowest_ms": max(w["slowest_ms"] for w in windows),
            "failed": sum(w["failed"] for w in windows),
            "rpcs": sum(w["rpcs"] for w in windows) / len(windows),
            "full_gcs": sum(w["full_gcs"] for w in windows) / len(windows),
            "full_gc_max_ms": max(w["full_gc_max_ms"] for w in windows),
            "full_gc_total_ms": sum(w["full_gc_total_ms"] for w in windows) / len(windows),
            "young_gc_total_ms": sum(w["young_gc_total_ms"] for w in windows) / len(windows),
            "promoted": sum(w["promoted"] for w in windows) / len(windows),
        }
        out["one_locality_cpu_pct"] = sum(w["cpu_pct"] for w in windows) / len(windows)
    load.stop.set()
    load.thread.join(60)
    time.sleep(1.0)
    cpu = time.process_time()
    time.sleep(idle)
    out["idle_10k_pct"] = (time.process_time() - cpu) / idle * 100
    if "bad" in phases:
        load = RpcLoad(call)
        load.thread.start()
        phase("bad", "bad", 10.0)
        load.stop.set()
        load.thread.join(60)
        cpu = time.process_time()
        time.sleep(idle)
        out["idle_bad_pct"] = (time.process_time() - cpu) / idle * 100
    out["threads"] = _threads()
    out["rss"] = _rss_mib()
    channel.close()
    # C-core's event engine pool grows under load (one thread a second while
    # all are busy) and an extra thread ends only after 20 s with no work
    # (grpc's work_stealing_thread_pool kIdleThreadLimit): wait past that
    out.update(_settle_after_close(base, limit=CLOSE_SETTLE_EDS, base_names=base_names))
    out["base"] = base
    return out


def client(kind: str, n: int, target: str, rpcs: int, idle: float, channels: int) -> None:
    if kind.endswith("aio"):
        out = asyncio.run(client_aio(kind, n, target, rpcs, idle, channels))
    else:
        out = client_sync(kind, n, target, rpcs, idle, channels)
    print(json.dumps(out), flush=True)


# -- the driver -----------------------------------------------------------------


def run_client(
    bootstrap: dict,
    kind: str,
    n: int,
    target: str,
    rpcs: int,
    idle: float,
    channels: int = 1,
    before: str | None = None,
) -> dict:
    env = dict(os.environ)
    if kind.endswith("-before"):
        if before is None:
            raise SystemExit(f"{kind} needs --before DIR")
        kind = kind.removesuffix("-before")
        paths = [os.path.join(before, "src"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    # As installed (pip writes bytecode): with PYTHONDONTWRITEBYTECODE every
    # pyxds client would compile pyxds from source (~0.1-0.2 s), grpcio not.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    args = [sys.executable, os.path.abspath(__file__), "--client", kind, str(n), target]
    args += ["--rpcs", str(rpcs), "--idle", str(idle), "--channels", str(channels)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} N={n} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_json(cmd: list[str], env: dict[str, str], label: str) -> dict:
    """Run a client process; what it printed last, as JSON."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


COLUMNS = (
    ("serve s", "serve_s", "{:.2f}"),
    ("serve CPU s", "serve_cpu_s", "{:.2f}"),
    ("connect s", "connect_s", "{:.2f}"),
    ("threads", "threads", "{:.0f}"),
    ("+threads", "plus_threads", "{:.0f}"),
    ("CPU/RPC us", "cpu_us", "{:.0f}"),
    ("idle %", "idle_pct", "{:.2f}"),
    ("idle thr", "idle_threads", "{:.0f}"),
    ("RSS MiB", "rss", "{:.1f}"),
    ("closed +thr", "closed_plus_threads", "{:.0f}"),
    ("closed +sock", "closed_plus_sockets", "{:.0f}"),
)


def summarize(runs: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in runs:
        r["plus_threads"] = r["threads"] - r["base"]["threads"]
        r["closed_plus_threads"] = r["closed_threads"] - r["base"]["threads"]
        r["closed_plus_sockets"] = r["closed_sockets"] - r["base"]["sockets"]
    for _, key, _ in COLUMNS:
        out[key] = _median([r[key] for r in runs])
    out["reached"] = min(r["reached"] for r in runs)
    out["rss_base"] = _median([r["base"]["rss"] for r in runs])
    return out


def eds_main(args: argparse.Namespace) -> None:
    kinds = [k for k in (args.kinds or ",".join(KINDS)).split(",") if not k.endswith("aio")]
    if args.before:
        kinds += [k + "-before" for k in kinds if k.startswith("pyxds")]
    server = subprocess.Popen(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--serve",
            "1000",
            "--sizes",
            "1",
            "--aliases",
            str(EDS_ALIASES),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    info = json.loads(server.stdout.readline())
    results: dict[str, list[dict]] = {}
    try:
        for rnd in range(args.rounds):
            for kind in kinds if rnd % 2 == 0 else list(reversed(kinds)):
                env = dict(os.environ)
                env.pop("GRPC_XDS_BOOTSTRAP", None)
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(info["bootstrap"])
                client_kind = kind
                if kind.endswith("-before"):
                    client_kind = kind.removesuffix("-before")
                    paths = [os.path.join(args.before, "src"), env.get("PYTHONPATH", "")]
                    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
                cmd = [sys.executable, os.path.abspath(__file__), "--client", client_kind]
                cmd += ["0", "x", "--control", str(info["control"]), "--idle", str(args.idle)]
                cmd += ["--eds-phases", args.eds_phases]
                r = run_json(cmd, env, f"{kind} eds")
                results.setdefault(kind, []).append(r)
                print(f"  round {rnd + 1} {kind}: {json.dumps(r)}", flush=True)
                _switch(info["control"], "v1")
    finally:
        server.stdin.close()
        server.wait(60)
    print()
    print(f"load average: {os.getloadavg()}")
    rows = [
        ("1000 serve s", lambda r: r["serve_s"]),
        ("grow 1k->10k: connect s", lambda r: r["grow_connect_s"]),
        ("  CPU % during", lambda r: r["grow_cpu_pct"]),
        ("  slowest RPC ms", lambda r: r["grow"]["slowest_ms"]),
        ("  failed RPCs", lambda r: r["grow"]["failed"]),
        ("  full GCs", lambda r: r["grow"]["full_gcs"]),
        ("  longest full GC ms", lambda r: r["grow"]["full_gc_max_ms"]),
        (
            "  GC ms in all",
            lambda r: r["grow"]["full_gc_total_ms"] + r["grow"]["young_gc_total_ms"],
        ),
        (
            "GC-tracked objects per endpoint 1k->10k",
            lambda r: (r["gc_objects_10k"] - r["gc_objects_1k"]) / 9000,
        ),
        ("  threads", lambda r: r["grow_threads"]),
        ("RSS MiB at 10k", lambda r: r["rss_10k"]),
        ("1 locality of 100 replaced: slowest RPC ms", lambda r: r["one_locality"]["slowest_ms"]),
        ("  CPU % during", lambda r: r["one_locality_cpu_pct"]),
        ("  failed RPCs", lambda r: r["one_locality"]["failed"]),
        ("  full GCs", lambda r: r["one_locality"]["full_gcs"]),
        ("  longest full GC ms", lambda r: r["one_locality"]["full_gc_max_ms"]),
        (
            "  GC ms in all",
            lambda r: (
                r["one_locality"]["full_gc_total_ms"] + r["one_locality"]["young_gc_total_ms"]
            ),
        ),
        ("  objects to the old generation (at most)", lambda r: r["one_locality"]["promoted"]),
        ("idle % with 10k connected", lambda r: r["idle_10k_pct"]),
    ]
    bad_rows = [
        ("9000 of 10k refuse: failed RPCs", lambda r: r["bad"]["failed"]),
        ("  RPCs served in 10 s", lambda r: r["bad"]["rpcs"]),
        ("  slowest RPC ms", lambda r: r["bad"]["slowest_ms"]),
        ("  p99 RPC ms", lambda r: r["bad"]["p99_ms"]),
        ("  full GCs", lambda r: r["bad"]["full_gcs"]),
        ("  longest full GC ms", lambda r: r["bad"]["full_gc_max_ms"]),
        ("  CPU % (RPCs running)", lambda r: r["bad_cpu_pct"]),
        ("  idle % after", lambda r: r["idle_bad_pct"]),
    ]
    rows += bad_rows if "bad" in args.eds_phases else []
    rows += [
        ("threads at the end", lambda r: r["threads"]),
        ("closed: threads over before", lambda r: r["closed_threads"] - r["base"]["threads"]),
        ("closed: sockets over before", lambda r: r["closed_sockets"] - r["base"]["sockets"]),
        ("closed: s until back (or the wait)", lambda r: r["closed_s"]),
    ]
    print(f"{'eds shape (median of rounds)':<44} " + " ".join(f"{k:>10}" for k in kinds))
    for label, get in rows:
        try:
            cells = " ".join(f"{_median([get(r) for r in results[k]]):>10.2f}" for k in kinds)
        except KeyError:
            continue  # a phase left out (--eds-phases)
        print(f"{label:<44} {cells}")
    for k in kinds:
        left = [r.get("closed_extra") for r in results[k]]
        print(f"closed: threads left over after {CLOSE_SETTLE_EDS:.0f} s, {k}: {left}")
    for k in kinds:
        print(f"GC-tracked objects per endpoint by type (1k->10k, first round), {k}:")
        for name, count in results[k][0]["gc_objects_by_type"].items():
            print(f"  {count:8.2f} {name}")
    for k in kinds:
        slowest = [
            [round(w["slowest_ms"]) for w in r.get("one_locality_windows", [])] for r in results[k]
        ]
        gcs = [
            [round(w["full_gc_max_ms"]) for w in r.get("one_locality_windows", [])]
            for r in results[k]
        ]
        print(f"one-locality updates, {k}: slowest RPC ms {slowest}, longest full GC ms {gcs}")
        during = [
            [w.get("slowest_gcs", []) for w in r.get("one_locality_windows", [])]
            for r in results[k]
        ]
        print(f"  collections during each window's slowest RPC, {k}: {during}")
        p99 = [[round(w["p99_ms"]) for w in r.get("one_locality_windows", [])] for r in results[k]]
        print(f"  99th percentile RPC ms per window, {k}: {p99}")
        grow = [r["grow"].get("slowest_gcs", []) for r in results[k] if "grow" in r]
        print(f"  collections during the grow phase's slowest RPC, {k}: {grow}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--kinds", help="default: " + ",".join(KINDS) + " (wrr_oob: core,pyxds)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rpcs", type=int, default=2000)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument(
        "--shape", choices=("channels", "ring_hash", "pick_first", "eds", "wrr_oob")
    )
    parser.add_argument(
        "--oob-period", type=float, default=10.0, help="--shape wrr_oob: seconds between reports"
    )
    parser.add_argument("--before", help="source tree of pyxds before a change (see above)")
    parser.add_argument(
        "--eds-phases",
        default="grow,locality,bad",
        help="--shape eds: the phases after growing to 10k (locality, bad)",
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--client", nargs=3, metavar=("KIND", "N", "TARGET"), help=argparse.SUPPRESS
    )
    parser.add_argument("--channels", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--aliases", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--control", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--backends", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.serve:
        serve(args.serve, sizes, args.aliases, args.oob_period)
        return
    if args.backends:
        backends_only(args.backends, args.aliases)
        return
    if args.client:
        kind, n, target = args.client
        if args.control:
            out = client_eds(kind, args.control, args.idle, args.eds_phases)
            print(json.dumps(out), flush=True)
            return
        client(kind, int(n), target, args.rpcs, args.idle, args.channels)
        return
    if args.shape == "eds":
        eds_main(args)
        return

    kinds = (args.kinds or ("core,pyxds" if args.shape == "wrr_oob" else ",".join(KINDS))).split(
        ","
    )
    if args.before:
        kinds += [k + "-before" for k in kinds if k.startswith("pyxds")]
    if args.shape == "channels":
        plan = [("10x100", 100, "xds:///part", 10)]
        max_n = 1000
    elif args.shape == "ring_hash":
        plan = [("ring_hash 1000", 1000, "xds:///ring", 1)]
        max_n = 1000
    elif args.shape == "pick_first":
        plan = [("pick_first 1000", 1, "xds:///pf", 1)]
        max_n = 1000
    elif args.shape == "wrr_oob":
        plan = [(f"wrr_oob N={n}", n, f"xds:///wrr-{n}", 1) for n in sizes]
        max_n = max(sizes)
    else:
        plan = [(f"N={n}", n, f"xds:///scale-{n}", 1) for n in sizes]
        max_n = max(sizes)
    server = subprocess.Popen(
        [
            *(sys.executable, os.path.abspath(__file__), "--serve", str(max_n)),
            *("--sizes", args.sizes, "--oob-period", str(args.oob_period)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    bootstrap = json.loads(server.stdout.readline())["bootstrap"]
    results: dict[tuple[str, str], list[dict]] = {}
    try:
        for rnd in range(args.rounds):
            for label, n, target, channels in plan:
                order = kinds if rnd % 2 == 0 else list(reversed(kinds))
                for kind in order:
                    r = run_client(
                        bootstrap, kind, n, target, args.rpcs, args.idle, channels, args.before
                    )
                    results.setdefault((label, kind), []).append(r)
                    print(f"  round {rnd + 1} {label} {kind}: {json.dumps(r)}", flush=True)
    finally:
        server.stdin.close()
        server.wait(30)

    summary = {key: summarize(runs) for key, runs in results.items()}
    print()
    print(f"load average: {os.getloadavg()}")
    header = f"{'shape':<16} {'client':<16} " + " ".join(f"{c[0]:>12}" for c in COLUMNS)
    print(header)
    for (label, kind), s in summary.items():
        cells = " ".join(f"{fmt.format(s[key]):>12}" for _, key, fmt in COLUMNS)
        print(f"{label:<16} {kind:<16} {cells}")
    print()
    print("threads counted once all N serve (last round; /proc comm names, Python's names):")
    for (label, kind), runs in results.items():
        r = runs[-1]
        if "thread_names" in r:
            names = r["thread_names"]
            print(
                f"  {label:<16} {kind:<16} {r['threads']}: {names['comm']} {names['python']}"
                f"  not counted: {r['lingering']}"
            )
    print()
    print("ratios pyxds / C-core (same shape, same run):")
    for label, _, _, _ in plan:
        for ours, ref in (
            ("pyxds", "core"),
            ("pyxds-before", "core"),
            ("pyxds-aio", "core-aio"),
            ("pyxds-aio-before", "core-aio"),
        ):
            a, c = summary.get((label, ours)), summary.get((label, ref))
            if a is None or c is None:
                continue
            extra = a["threads"] - c["threads"]
            conn = a["connect_s"] / c["connect_s"] if c["connect_s"] else 0.0
            print(
                f"{label:<16} {ours:<16} serve {a['serve_s'] / c['serve_s']:.2f}x  "
                f"connect {conn:.2f}x  "
                f"CPU/RPC {a['cpu_us'] / c['cpu_us']:.2f}x  threads {extra:+.0f} vs C-core  "
                f"idle {a['idle_pct']:.2f}% vs {c['idle_pct']:.2f}%  "
                f"RSS {a['rss'] / c['rss']:.2f}x"
            )
    if args.shape in (None, "wrr_oob") and len(sizes) >= 2:
        small, big = sorted(sizes)[-2:]
        prefix = "" if args.shape is None else f"{args.shape} "
        print()
        print(f"memory per endpoint (RSS slope N={small} -> N={big}, KB):")
        for ours, ref in (
            ("pyxds", "core"),
            ("pyxds-before", "core"),
            ("pyxds-aio", "core-aio"),
            ("pyxds-aio-before", "core-aio"),
        ):
            per = {}
            for kind in (ours, ref):
                lo = summary.get((f"{prefix}N={small}", kind))
                hi = summary.get((f"{prefix}N={big}", kind))
                if lo is not None and hi is not None:
                    per[kind] = (hi["rss"] - lo["rss"]) * 1024 / (big - small)
            if len(per) == 2:
                print(
                    f"  {ours:<16} {per[ours]:.1f}   {ref:<9} {per[ref]:.1f}   "
                    f"ratio {per[ours] / per[ref]:.2f}x"
                )


if __name__ == "__main__":
    main()
