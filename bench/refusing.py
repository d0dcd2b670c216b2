"""Endpoints that never answer, side by side with grpcio's C-core ``xds:///`` channel.

Issue 18, "Bad input": one round_robin cluster of ``--good`` serving
endpoints, ``--refusing`` endpoints that refuse every connection (addresses
127.0.0.12, .13, ... on the good ports: nothing listens there, so each
attempt fails at once with ECONNREFUSED, the way a dead pod's address does)
and ``--flapping`` endpoints whose listener stops and starts again every
``--flap`` seconds.  The backends and the control plane (``pyxds.server``)
run in one process; each client in its own process, one at a time, the
order rotated each round (with three clients and three rounds, each runs
first, second and third once: reversing the order left the middle one in
the middle every round, after another client's close):

  core    grpc.insecure_channel("xds:///refuse")     (C-core, sync)
  pyxds   pyxds.insecure_channel("xds:///refuse")

Per client:

* ``first s``: channel creation to the first RPC served;
* ``RPCs in Ns``: sequential unary RPCs (``wait_for_ready``) served in the
  ``--secs`` seconds after that, failed ones, the slowest, and how many of
  the good endpoints they reached;
* ``CPU %``: the client process's CPU (of one core) over those seconds,
  and ``py %`` the share of it on Python's threads (the rest is C-core's;
  a Python thread that ended meanwhile is not counted); ``full GCs`` and
  ``GC %``: Python's garbage collections in those seconds and the share of
  the time they held the interpreter;
* ``idle %``: the process's CPU over ``--idle`` seconds without RPCs (the
  refusing endpoints still retrying, with backoff);
* ``threads`` during, and threads / sockets over the count before the
  channel after ``close()`` (given 30 s: C-core's event engine pool keeps an
  extra thread until it has been idle 20 s).

Prints the table and the pyxds / C-core ratios.  ``--profile FILE`` also
runs one more pyxds client under py-spy (``--py-spy PATH``), writes its
collapsed stacks to FILE and prints the functions that took the most samples
(inclusive) while RPCs ran.  ``--before DIR`` adds ``pyxds-before``
(pyxds imported from ``DIR/src``, e.g. ``git archive main src | tar -x -C DIR``).

Usage: python bench/refusing.py [--good 1000] [--refusing 9000] [--flapping 0]
       [--secs 10] [--idle 5] [--rounds 2] [--kinds core,pyxds] [--before DIR]
       [--profile FILE --py-spy PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scale import (
    METHOD,
    GcPauses,
    _port_handler,
    _settle_after_close,
    _sockets,
    _start_backends,
    _thread_names,
    _threads,
    run_json,
)

CLUSTER = "refuse"
#: first refusing alias: 127.0.0.12 (nothing listens on it)
REFUSED_ALIAS = 12


# -- backends and control plane (``--serve``) -----------------------------------


async def _flapper(period: float) -> tuple[int, asyncio.Task[None]]:
    """A backend whose listener is up ``period`` s, then down ``period`` s, again and again."""
    port_box: list[bytes] = []

    def start(port: int) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((_port_handler(port_box),))
        return server, server.add_insecure_port(f"127.0.0.1:{port}")

    server, port = start(0)
    port_box.append(str(port).encode())
    await server.start()

    async def flap() -> None:
        nonlocal server
        while True:
            await asyncio.sleep(period)
            await server.stop(None)
            await asyncio.sleep(period)
            for _ in range(50):  # the port may linger a moment
                try:
                    server, _ = start(port)
                    await server.start()
                    break
                except RuntimeError:
                    await asyncio.sleep(0.05)

    return port, asyncio.get_running_loop().create_task(flap())


def one_cluster(cluster: Any, localities: list[Any]) -> Any:
    """The snapshot of ``xds:///<cluster's name>``: a listener, its route to
    ``cluster`` (a Cluster proto) and the cluster's ``localities``."""
    from pyxds.server import builders as b
    from pyxds.server.snapshot import Snapshot

    name = cluster.name
    return Snapshot(
        listeners=[b.listener(name)],
        routes=[
            b.route_config(
                f"{name}-route", [b.virtual_host("vh", routes=[b.route(prefix="", cluster=name)])]
            )
        ],
        clusters=[cluster],
        endpoints=[b.endpoints(name, localities)],
    )


def serve(good: int, refusing: int, flapping: int, flap: float) -> None:
    """Prints the bootstrap as one JSON line, runs until stdin closes."""
    from pyxds.server import ManagementServer
    from pyxds.server import builders as b

    loop = asyncio.new_event_loop()
    ports, _servers = loop.run_until_complete(_start_backends(good))
    flappers = [loop.run_until_complete(_flapper(flap)) for _ in range(flapping)]
    threading.Thread(target=loop.run_forever, daemon=True).start()
    addresses = [f"127.0.0.1:{p}" for p in ports]
    addresses += [f"127.0.0.1:{p}" for p, _ in flappers]
    refused = [
        f"127.0.0.{REFUSED_ALIAS + i // len(ports)}:{ports[i % len(ports)]}"
        for i in range(refusing)
    ]
    # good and refusing endpoints mixed across 10 localities
    everything = addresses + refused
    localities = [
        b.locality(zone=f"z{i}", endpoints=everything[i::10])
        for i in range(10)
        if everything[i::10]
    ]
    control = ManagementServer().start()
    control.set_snapshot(one_cluster(b.cluster(CLUSTER), localities))
    print(json.dumps({"bootstrap": control.bootstrap(node_id="refuse")}), flush=True)
    sys.stdin.read()
    control.stop()


# -- one client (``--client KIND``) ----------------------------------------------


def _cpu_by_thread() -> dict[str, float]:
    """CPU seconds of the process's threads by name (``python`` or C-core's)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = collections.defaultdict(float)
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] += (int(fields[11]) + int(fields[12])) / tick
    return out


def client(kind: str, secs: float, idle: float, good: int) -> dict[str, object]:
    if kind == "pyxds":
        import pyxds

        make = pyxds.insecure_channel
    else:
        make = grpc.insecure_channel
    warm = grpc.insecure_channel("127.0.0.1:1")  # C-core up before counting threads
    base = {"threads": _threads(), "sockets": _sockets(), "fds": len(os.listdir("/proc/self/fd"))}
    base_names = _thread_names()
    start = time.monotonic()
    channel = make(f"xds:///{CLUSTER}")
    call = channel.unary_unary(METHOD)
    call(b"", timeout=60, wait_for_ready=True)
    out: dict[str, object] = {"first_s": time.monotonic() - start}
    seen: set[bytes] = set()
    ok = failed = 0
    slowest = 0.0
    pauses = GcPauses()
    cpu, by_thread = time.process_time(), _cpu_by_thread()
    began = time.monotonic()
    while time.monotonic() - began < secs:
        t = time.monotonic()
        try:
            seen.add(call(b"", timeout=30, wait_for_ready=True))
            ok += 1
        except grpc.RpcError:
            failed += 1
        slowest = max(slowest, time.monotonic() - t)
    wall = time.monotonic() - began
    after = _cpu_by_thread()
    python = after.get("python", 0.0) - by_thread.get("python", 0.0)
    out.update(
        rpcs=ok,
        failed=failed,
        slowest_ms=slowest * 1000,
        reached=len(seen),
        cpu_pct=(time.process_time() - cpu) / wall * 100,
        py_pct=python / wall * 100,
        threads=_threads(),
    )
    gcs = pauses.window()
    out["full_gcs"] = gcs["full_gcs"]
    out["gc_pct"] = (gcs["full_gc_total_ms"] + gcs["young_gc_total_ms"]) / 1000 / wall * 100
    cpu = time.process_time()
    time.sleep(idle)
    out["idle_pct"] = (time.process_time() - cpu) / idle * 100
    channel.close()
    out.update(_settle_after_close(base, limit=30.0, base_names=base_names))
    out["closed_plus_threads"] = int(out["closed_threads"]) - base["threads"]  # type: ignore[call-overload]
    out["closed_plus_sockets"] = int(out["closed_sockets"]) - base["sockets"]  # type: ignore[call-overload]
    warm.close()
    return out


# -- the driver ------------------------------------------------------------------


def _client_cmd(kind: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if kind.endswith("-before"):
        kind = kind.removesuffix("-before")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.join(args.before, "src"), env.get("PYTHONPATH", "")) if p
        )
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--client", kind]
    cmd += ["--secs", str(args.secs), "--idle", str(args.idle), "--good", str(args.good)]
    return cmd, env


def _profile(args: argparse.Namespace, bootstrap: object) -> None:
    cmd, env = _client_cmd("pyxds", args)
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    spy = [args.py_spy, "record", "-r", "250", "-f", "raw", "-o", args.profile, "--"]
    proc = subprocess.run(spy + cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"py-spy failed:\n{proc.stderr[-3000:]}")
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    with open(args.profile) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            total += n
            for frame in set(stack.split(";")):
                inclusive[frame] += n
    print(f"\npy-spy: {total} samples (busy threads), top inclusive:")
    for frame, n in inclusive.most_common(45):
        print(f"  {n / total * 100:5.1f}%  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--good", type=int, default=1000)
    parser.add_argument("--refusing", type=int, default=9000)
    parser.add_argument("--flapping", type=int, default=0)
    parser.add_argument("--flap", type=float, default=1.0)
    parser.add_argument("--secs", type=float, default=10.0)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", default="core,pyxds")
    parser.add_argument("--before")
    parser.add_argument("--profile")
    parser.add_argument("--py-spy", default="py-spy")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.good, args.refusing, args.flapping, args.flap)
        return
    if args.client:
        print(json.dumps(client(args.client, args.secs, args.idle, args.good)), flush=True)
        return
    kinds = args.kinds.split(",") if args.kinds else []
    if args.before:
        kinds.append("pyxds-before")
    serve_cmd = [sys.executable, os.path.abspath(__file__), "--serve"]
    serve_cmd += ["--good", str(args.good), "--refusing", str(args.refusing)]
    serve_cmd += ["--flapping", str(args.flapping), "--flap", str(args.flap)]
    server = subprocess.Popen(serve_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdin is not None
    bootstrap = json.loads(server.stdout.readline())["bootstrap"]
    results: dict[str, list[dict[str, float]]] = {}
    try:
        for rnd in range(args.rounds):
            shift = rnd % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                cmd, env = _client_cmd(kind, args)
                env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
                r = run_json(cmd, env, kind)
                results.setdefault(kind, []).append(r)
                print(f"  round {rnd + 1} {kind}: {json.dumps(r)}", flush=True)
        if args.profile:
            _profile(args, bootstrap)
    finally:
        server.stdin.close()
        server.wait(60)
    if not results:
        return
    print()
    print(f"load average: {os.getloadavg()}")
    print(
        f"good {args.good}, refusing {args.refusing}, flapping {args.flapping} "
        f"(every {args.flap} s); medians of {args.rounds} rounds"
    )
    columns = (
        ("first s", "first_s", "{:.2f}"),
        (f"RPCs in {args.secs:g}s", "rpcs", "{:.0f}"),
        ("failed", "failed", "{:.0f}"),
        ("slowest ms", "slowest_ms", "{:.0f}"),
        ("reached", "reached", "{:.0f}"),
        ("CPU %", "cpu_pct", "{:.0f}"),
        ("py %", "py_pct", "{:.0f}"),
        ("full GCs", "full_gcs", "{:.0f}"),
        ("GC %", "gc_pct", "{:.0f}"),
        ("idle %", "idle_pct", "{:.1f}"),
        ("threads", "threads", "{:.0f}"),
        ("closed +thr", "closed_plus_threads", "{:.0f}"),
        ("closed +sock", "closed_plus_sockets", "{:.0f}"),
    )
    print(f"{'client':<14} " + " ".join(f"{c[0]:>12}" for c in columns))
    med: dict[str, dict[str, float]] = {}
    for kind, runs in results.items():
        med[kind] = {}
        for _, key, _ in columns:
            values = sorted(float(r[key]) for r in runs)
            mid = len(values) // 2
            med[kind][key] = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
        cells = " ".join(f"{fmt.format(med[kind][key]):>12}" for _, key, fmt in columns)
        print(f"{kind:<14} {cells}")
    if "core" in med:
        for kind in med:
            if kind.startswith("pyxds") and med["core"]["rpcs"]:
                print(
                    f"{kind}/core: RPCs served {med[kind]['rpcs'] / med['core']['rpcs']:.2f}x, "
                    f"CPU {med[kind]['cpu_pct'] / max(med['core']['cpu_pct'], 0.01):.2f}x, "
                    f"idle {med[kind]['idle_pct']:.1f}% vs {med['core']['idle_pct']:.1f}%"
                )
    for kind, runs in results.items():
        print(f"closed: threads left over, {kind}: {[r.get('closed_extra') for r in runs]}")


if __name__ == "__main__":
    main()
