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
  and at least 2N sequential RPCs (wait_for_ready) succeeded;
* ``threads``: threads of the client process once all N serve (``/proc``:
  C-core's and Python's alike), and ``+threads``: those beyond the count
  before the channel was made;
* ``CPU/RPC us``: process CPU per sequential unary RPC (after the above);
* ``idle %``: process CPU, in % of one core, over ``--idle`` seconds with
  no RPC (every endpoint connected);
* ``RSS MiB`` once all N serve; ``KB/endpoint``: the slope of RSS between
  the two largest N (what one more endpoint costs);
* after ``close()``: threads and sockets beyond the count before the channel.

Prints the table and the pyxds / C-core ratios (sync and aio), and the load
average.  ``--shape`` measures other shapes of issue 18 item 4 instead:
``channels`` (10 channels x 100 endpoints), ``ring_hash`` (1000 endpoints,
connects lazily), ``pick_first`` (1000 addresses), with the same columns.

Usage: python bench/scale.py [--sizes 1,100,1000] [--rounds 1] [--idle 5]
       [--kinds core,pyxds,core-aio,pyxds-aio] [--shape channels]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import grpc

METHOD = "/bench.Scale/Port"
KINDS = ("core", "pyxds", "core-aio", "pyxds-aio")
SERVE_LIMIT = 120.0


# -- the backend and control plane (``--serve``) ------------------------------


def _port_handler(port_box: list[bytes]) -> grpc.GenericRpcHandler:
    """Answers every call with the port it was made to (``port_box[0]``)."""

    async def port(request: bytes, context: object) -> bytes:
        return port_box[0]

    return grpc.method_handlers_generic_handler(
        "bench.Scale", {"Port": grpc.unary_unary_rpc_method_handler(port)}
    )


async def _start_backends(n: int) -> tuple[list[int], list[object]]:
    servers, ports = [], []
    for _ in range(n):
        # no SO_REUSEPORT: port 0 must be a port nobody else listens on
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        port_box: list[bytes] = []
        server.add_generic_rpc_handlers((_port_handler(port_box),))
        port = server.add_insecure_port("127.0.0.1:0")
        port_box.append(str(port).encode())
        await server.start()
        servers.append(server)
        ports.append(port)
    return ports, servers


def serve(max_n: int, sizes: list[int]) -> None:
    """Backends on ``max_n`` ports and a control plane with one listener per
    shape; prints the bootstrap as one JSON line, runs until stdin closes."""
    from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2

    from pyxds.server import ManagementServer
    from pyxds.server import builders as b
    from pyxds.server.snapshot import Snapshot

    loop = asyncio.new_event_loop()
    ports, _servers = loop.run_until_complete(_start_backends(max_n))
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
    control = ManagementServer().start()
    control.set_snapshot(
        Snapshot(listeners=listeners, routes=routes, clusters=clusters, endpoints=endpoints)
    )
    print(json.dumps({"bootstrap": control.bootstrap(node_id="scale")}), flush=True)
    sys.stdin.read()
    control.stop()


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


def _settle_after_close(base: dict[str, float]) -> dict[str, float]:
    """Threads and sockets after close, given up to 3 s to go back."""
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        if _threads() <= base["threads"] and _sockets() <= base["sockets"]:
            break
        time.sleep(0.05)
    return {"closed_threads": _threads(), "closed_sockets": _sockets()}


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
    base = {"threads": _threads(), "sockets": _sockets(), "rss": _rss_mib()}
    targets = [target] if channels == 1 else [f"{target}-{i}" for i in range(channels)]
    start = time.monotonic()
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
    out = {
        "serve_s": serve_s,
        "reached": len(seen),
        "threads": _threads(),
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
    out["idle_threads"] = _threads()
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
    base = {"threads": _threads(), "sockets": _sockets(), "rss": _rss_mib()}
    targets = [target] if channels == 1 else [f"{target}-{i}" for i in range(channels)]
    start = time.monotonic()
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
    out = {
        "serve_s": serve_s,
        "reached": len(seen),
        "threads": _threads(),
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
    out["idle_threads"] = _threads()
    for c in chans:
        await c.close()
    await asyncio.sleep(0.1)
    out.update(_settle_after_close(base))
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
    bootstrap: dict, kind: str, n: int, target: str, rpcs: int, idle: float, channels: int = 1
) -> dict:
    env = dict(os.environ)
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


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


COLUMNS = (
    ("serve s", "serve_s", "{:.2f}"),
    ("threads", "threads", "{:.0f}"),
    ("+threads", "plus_threads", "{:.0f}"),
    ("CPU/RPC us", "cpu_us", "{:.0f}"),
    ("idle %", "idle_pct", "{:.2f}"),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rpcs", type=int, default=2000)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--shape", choices=("channels", "ring_hash", "pick_first"))
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--client", nargs=3, metavar=("KIND", "N", "TARGET"), help=argparse.SUPPRESS
    )
    parser.add_argument("--channels", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.serve:
        serve(args.serve, sizes)
        return
    if args.client:
        kind, n, target = args.client
        client(kind, int(n), target, args.rpcs, args.idle, args.channels)
        return

    kinds = args.kinds.split(",")
    if args.shape == "channels":
        plan = [("10x100", 100, "xds:///part", 10)]
        max_n = 1000
    elif args.shape == "ring_hash":
        plan = [("ring_hash 1000", 1000, "xds:///ring", 1)]
        max_n = 1000
    elif args.shape == "pick_first":
        plan = [("pick_first 1000", 1, "xds:///pf", 1)]
        max_n = 1000
    else:
        plan = [(f"N={n}", n, f"xds:///scale-{n}", 1) for n in sizes]
        max_n = max(sizes)
    server = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve", str(max_n), "--sizes", args.sizes],
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
                    r = run_client(bootstrap, kind, n, target, args.rpcs, args.idle, channels)
                    results.setdefault((label, kind), []).append(r)
                    print(f"  round {rnd + 1} {label} {kind}: {json.dumps(r)}", flush=True)
    finally:
        server.stdin.close()
        server.wait(30)

    summary = {key: summarize(runs) for key, runs in results.items()}
    print()
    print(f"load average: {os.getloadavg()}")
    header = f"{'shape':<16} {'client':<10} " + " ".join(f"{c[0]:>12}" for c in COLUMNS)
    print(header)
    for (label, kind), s in summary.items():
        cells = " ".join(f"{fmt.format(s[key]):>12}" for _, key, fmt in COLUMNS)
        print(f"{label:<16} {kind:<10} {cells}")
    print()
    print("ratios pyxds / C-core (same shape, same run):")
    for label, _, _, _ in plan:
        for ours, ref in (("pyxds", "core"), ("pyxds-aio", "core-aio")):
            a, c = summary.get((label, ours)), summary.get((label, ref))
            if a is None or c is None:
                continue
            extra = a["threads"] - c["threads"]
            print(
                f"{label:<16} {ours:<10} serve {a['serve_s'] / c['serve_s']:.2f}x  "
                f"CPU/RPC {a['cpu_us'] / c['cpu_us']:.2f}x  threads {extra:+.0f} vs C-core  "
                f"idle {a['idle_pct']:.2f}% vs {c['idle_pct']:.2f}%  "
                f"RSS {a['rss'] / c['rss']:.2f}x"
            )
    if args.shape is None and len(sizes) >= 2:
        small, big = sorted(sizes)[-2:]
        print()
        print(f"memory per endpoint (RSS slope N={small} -> N={big}, KB):")
        for ours, ref in (("pyxds", "core"), ("pyxds-aio", "core-aio")):
            per = {}
            for kind in (ours, ref):
                lo, hi = summary.get((f"N={small}", kind)), summary.get((f"N={big}", kind))
                if lo is not None and hi is not None:
                    per[kind] = (hi["rss"] - lo["rss"]) * 1024 / (big - small)
            if len(per) == 2:
                print(
                    f"  {ours:<10} {per[ours]:.1f}   {ref:<9} {per[ref]:.1f}   "
                    f"ratio {per[ours] / per[ref]:.2f}x"
                )


if __name__ == "__main__":
    main()
