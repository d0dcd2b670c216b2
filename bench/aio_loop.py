"""Where a sequential ``pyxds.aio`` unary RPC's time goes outside its own
instructions, next to ``grpc.aio``'s (issue 18 item 2: the aio x1 rate).

Three clients of one backend (``e2e.py --serve``'s world): a plain
``grpc.aio`` channel to its address (``plain``), ``grpc.aio``'s C-core
``xds:///`` channel (``C-core``) and ``pyxds.aio``'s (``pyxds``).

``--counts``: each client in a process of its own runs ``--rpcs``
sequential RPCs; per RPC: the event loop's iterations, its selector waits
(blocking, or polls with a zero timeout), the callbacks it ran (by name),
each thread's voluntary context switches (its wake-ups; threads by name)
and CPU, and the process's GC collections.  The loop is counted from
Python (``asyncio``'s selector loop and ``Handle`` are Python code), so the
counts are exact and the CPU figures carry the counting's cost.

``--latency``: the three channels in one process on one loop, taking turns
in blocks of 8 sequential RPCs (the order reversed every other block), for
``--blocks`` blocks: the median and mean RPC latency of each, and C-core's
over each one's (above 1.0: faster than C-core).  Load on the machine hits
the three alike, so the medians hold still where ``rate_pairs.py``'s
rates (a process each) spread; the mean is what a rate would see.

Usage: python bench/aio_loop.py [--counts] [--latency] [--rpcs 3000] [--blocks 2000]
(neither: both)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench_world import THREAD_SAMPLE, world

_COUNTS = r"""
import asyncio, asyncio.events, collections, gc, json, os, sys, time
kind, rpcs, info = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
import grpc, grpc.aio
METHOD = "/bench.Bench/Ping"
counts = collections.Counter()
handle_run = asyncio.events.Handle._run

def counted_run(handle):
    callback = handle._callback
    func = getattr(callback, "func", callback)  # a partial: its function
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__qualname__", None) or type(func).__name__
    if owner is not None and "." not in name:  # a C method: its class
        name = type(owner).__name__ + "." + name
    counts["callback " + name] += 1
    return handle_run(handle)

async def main():
    if kind == "C-core":
        channel = grpc.aio.insecure_channel("xds:///bench")
    elif kind == "plain":
        channel = grpc.aio.insecure_channel(info["address"])
    else:
        import pyxds.aio
        channel = pyxds.aio.insecure_channel("xds:///bench", bootstrap=info["bootstrap"])
    call = channel.unary_unary(METHOD)
    for _ in range(200):
        await call(b"x", timeout=60, wait_for_ready=True)
    loop = asyncio.get_running_loop()
    selector = loop._selector
    run_once, select = loop._run_once, selector.select

    def counted_run_once():
        counts["loop iterations"] += 1
        return run_once()

    def counted_select(timeout=None):
        blocking = timeout is None or timeout > 0
        counts["selector waits, blocking" if blocking else "selector polls"] += 1
        return select(timeout)

    loop._run_once, selector.select = counted_run_once, counted_select
    asyncio.events.Handle._run = counted_run
    gc.collect()
    gc_before, before = gc.get_stats(), thread_sample()
    for _ in range(rpcs):
        await call(b"x", timeout=60)
    after, gc_after = thread_sample(), gc.get_stats()
    asyncio.events.Handle._run = handle_run
    del loop._run_once
    selector.select = select
    out = {k: round(v / rpcs, 3) for k, v in counts.most_common()}
    cpu, woken = collections.Counter(), collections.Counter()
    for tid, (name, ticks, _, switches, _) in after.items():
        _, ticks0, _, switches0, _ = before.get(tid, (name, 0, 0, 0, 0))
        cpu[name] += ticks - ticks0
        woken[name] += switches - switches0
    out["wake-ups (voluntary switches) by thread name"] = {
        k: round(v / rpcs, 2) for k, v in woken.most_common() if v
    }
    out["CPU us by thread name (with the counting)"] = {
        k: round(v / 1000 / rpcs, 1) for k, v in cpu.most_common() if v
    }
    out["threads"] = len(after)
    out["GC collections per 1000 RPCs, by generation"] = [
        round((b["collections"] - a["collections"]) * 1000 / rpcs, 2)
        for a, b in zip(gc_before, gc_after)
    ]
    await channel.close()
    print(json.dumps(out))

asyncio.run(main())
"""

_LATENCY = r"""
import asyncio, json, os, statistics, sys, time
blocks, info = int(sys.argv[1]), json.loads(sys.argv[2])
import grpc, grpc.aio
METHOD = "/bench.Bench/Ping"

async def main():
    import pyxds.aio
    channels = {
        "plain": grpc.aio.insecure_channel(info["address"]),
        "C-core": grpc.aio.insecure_channel("xds:///bench"),
        "pyxds": pyxds.aio.insecure_channel("xds:///bench", bootstrap=info["bootstrap"]),
    }
    calls = {name: channel.unary_unary(METHOD) for name, channel in channels.items()}
    for _ in range(300):
        for call in calls.values():
            await call(b"x", timeout=60, wait_for_ready=True)
    latencies = {name: [] for name in calls}
    names = list(calls)
    clock = time.perf_counter
    for i in range(blocks):
        for name in names if i % 2 else names[::-1]:
            call, mine = calls[name], latencies[name]
            for _ in range(8):
                t = clock()
                await call(b"x", timeout=60)
                mine.append(clock() - t)
    core = latencies["C-core"]
    for name in names:
        mine = sorted(latencies[name])
        at = [mine[int(len(mine) * q / 100)] * 1e6 for q in (90, 99, 99.9)]
        tail = f"p90 {at[0]:.0f}, p99 {at[1]:.0f}, p99.9 {at[2]:.0f}"
        print(
            f"{name:7} median {statistics.median(mine) * 1e6:6.1f} us"
            f"  mean {statistics.fmean(mine) * 1e6:6.1f} us  ({tail}, max {mine[-1] * 1e6:.0f})"
            f"  C-core/{name}: median {statistics.median(core) / statistics.median(mine):.3f}"
            f"  mean {statistics.fmean(core) / statistics.fmean(mine):.3f}"
        )
    for channel in channels.values():
        await channel.close()

asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", action="store_true")
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--rpcs", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=2000)
    args = parser.parse_args()
    both = not (args.counts or args.latency)
    with open("/proc/loadavg") as f:
        print("load before:", *f.read().split()[:3])
    with world() as info:
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        core_env = dict(env, GRPC_XDS_BOOTSTRAP_CONFIG=json.dumps(info["bootstrap"]))
        if args.counts or both:
            for kind in ("plain", "C-core", "pyxds"):
                done = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        THREAD_SAMPLE + _COUNTS,
                        kind,
                        str(args.rpcs),
                        json.dumps(info),
                    ],
                    env=core_env if kind == "C-core" else env,
                    check=True,
                    capture_output=True,
                    text=True,
                )
                print(f"{kind}, per RPC:")
                for key, value in json.loads(done.stdout).items():
                    print(f"  {key}: {value}")
        if args.latency or both:
            print(f"one process, blocks of 8 RPCs in turn ({args.blocks} blocks each):")
            subprocess.run(
                [sys.executable, "-c", _LATENCY, str(args.blocks), json.dumps(info)],
                env=core_env,
                check=True,
            )
    with open("/proc/loadavg") as f:
        print("load after:", *f.read().split()[:3])


if __name__ == "__main__":
    main()
