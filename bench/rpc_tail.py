"""Where sync x4's slow RPCs come from: every RPC's latency, pooled over a
run, for clients that differ by one thing each (round 15, branch tail4;
docs/architecture.md "Where sync x4's slow RPCs come from").

``rate_pairs.py`` prints the median over windows of each window's 99th
percentile, which is about a window's second slowest RPC; here every RPC
of every window of a client is kept, so a rare stall (a mode of 4-20 ms RPCs
at a few per mille) shows in the pooled percentiles.  Clients (each one
process, its channel warmed up, windows of ``--threads`` threads for
``--window`` seconds, taken in turns as in ``rate_pairs.py``):

* ``C-core``: grpcio's ``xds:///`` channel;
* ``C-core+aio``: the same with grpc.aio's engine alive in the process (an
  idle event loop thread holding an unconnected ``grpc.aio`` channel: the
  engine's poller thread then waits in C-core's completion queue for good),
  as a sync pyxds channel's xDS stream loop keeps it;
* ``plain``: pyxds to the backend's address (no xDS, no ``grpc.aio``);
* ``plain+aio``: the same with the engine alive;
* ``pyxds``: pyxds's ``xds:///`` channel.

Printed per client: C-core's 50th, 90th and 99th percentile over its own
(above 1: faster), the RPCs of 4 ms or more per mille, and the calling
threads' wake-ups (voluntary switches, ``getrusage(RUSAGE_THREAD)``) and
CPU per RPC.

Usage: python bench/rpc_tail.py [--rounds 200] [--window 0.05] [--threads 4] [--src PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench_world import world

_CLIENT = r"""
import json, resource, sys, threading, time
kind, target, bootstrap, address = sys.argv[1:5]
import grpc
if kind in ("core", "core-aio"):
    channel = grpc.insecure_channel(target)
else:
    import pyxds
    if kind == "pyxds":
        channel = pyxds.insecure_channel(target, bootstrap=json.loads(bootstrap))
    else:
        channel = pyxds.insecure_channel(address)
if kind.endswith("-aio"):
    import asyncio, grpc.aio
    up = threading.Event()
    async def hold():
        idle = grpc.aio.insecure_channel("127.0.0.1:1")
        up.set()
        await asyncio.Event().wait()
    threading.Thread(target=asyncio.run, args=(hold(),), daemon=True).start()
    up.wait(30)
call = channel.unary_unary("/bench.Bench/Ping")
for _ in range(200):
    call(b"x", timeout=60, wait_for_ready=True)
print("READY", flush=True)
clock, usage, THREAD = time.perf_counter_ns, resource.getrusage, resource.RUSAGE_THREAD
latencies, wakeups, cpu = [], 0, 0
for line in sys.stdin:
    threads, seconds = int(line.split()[0]), float(line.split()[1])
    end = clock() + int(seconds * 1e9)
    mine = [[] for _ in range(threads)]
    def run(i):
        out, t = mine[i], clock()
        while True:
            call(b"x", timeout=60)
            now = clock()
            out.append(now - t)
            t = now
            if t >= end:
                break
        ru = usage(THREAD)
        out.append((ru.ru_nvcsw, time.thread_time_ns()))
    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for out in mine:
        switches, spent = out.pop()
        wakeups, cpu = wakeups + switches, cpu + spent
        latencies += out
    print("OK", flush=True)
print(json.dumps([latencies, wakeups, cpu]), flush=True)
channel.close()
"""

CLIENTS = {
    "C-core": "core",
    "C-core+aio": "core-aio",
    "plain": "plain",
    "plain+aio": "plain-aio",
    "pyxds": "pyxds",
}


def percentile(ordered: list[int], p: float) -> int:
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--window", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--src", help="pyxds's source tree (default: the installed pyxds)")
    args = parser.parse_args()
    print("load before:", " ".join(open("/proc/loadavg").read().split()[:3]))  # noqa: SIM115
    with world() as info:
        processes = {}
        for name, kind in CLIENTS.items():
            env = dict(os.environ)
            env.pop("GRPC_XDS_BOOTSTRAP", None)
            env.pop("PYTHONPATH", None)
            if kind.startswith("core"):
                env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(info["bootstrap"])
            elif args.src:
                env["PYTHONPATH"] = args.src
            argv = [kind, "xds:///bench", json.dumps(info["bootstrap"]), info["address"]]
            processes[name] = subprocess.Popen(
                [sys.executable, "-c", _CLIENT, *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
            )
        for name, p in processes.items():
            assert p.stdout is not None
            if p.stdout.readline().strip() != "READY":
                raise RuntimeError(f"{name}: client did not start")
        names = list(processes)
        for r in range(args.rounds):  # the order of rate_pairs.round_order
            for name in names if r % 2 == 0 else names[:1] + names[:0:-1]:
                p = processes[name]
                assert p.stdin is not None and p.stdout is not None
                p.stdin.write(f"{args.threads} {args.window}\n")
                p.stdin.flush()
                p.stdout.readline()
        results = {}
        for name, p in processes.items():
            assert p.stdin is not None and p.stdout is not None
            p.stdin.close()
            results[name] = json.loads(p.stdout.readline())
            p.wait(30)
    base = sorted(results["C-core"][0])
    figures = ", ".join(f"{percentile(base, q) / 1e3:.0f}" for q in (0.5, 0.9, 0.99))
    print(f"C-core's 50th, 90th, 99th percentiles: {figures} us")
    for name, (latencies, wakeups, cpu) in results.items():
        ordered = sorted(latencies)
        ratios = " ".join(
            f"p{q * 100:g} {percentile(base, q) / percentile(ordered, q):.3f}"
            for q in (0.5, 0.9, 0.99)
        )
        stalls = 1000 * sum(1 for x in ordered if x >= 4_000_000) / len(ordered)
        print(
            f"{name:11s} C-core/it: {ratios}  >=4 ms: {stalls:.1f} per mille  caller per RPC: "
            f"{wakeups / len(ordered):.2f} wake-ups, {cpu / len(ordered) / 1e3:.0f} us CPU"
        )
    print("load after:", " ".join(open("/proc/loadavg").read().split()[:3]))  # noqa: SIM115


if __name__ == "__main__":
    main()
