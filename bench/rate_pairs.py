"""Unary RPC rates of several clients in short alternating windows: the
rate goal of issue 18 item 2 (pyxds >= 1.0x C-core's ``xds:///``) on a
shared, noisy machine.

``e2e.py --vs-core`` makes a new channel per window of seconds, so a load
spike of the machine lands on one side of a ratio.  Here every client is a
process of its own, started once with its channel ready (warmed up), and
the clients take turns in windows of ``--window`` seconds (0.3 by default),
the order rotated every round: drift hits every client alike, and a ratio
is the median over many rounds.  Each client runs in ``--procs`` processes
(2 by default), started in alternating orders (C-core first, then last)
and used in turns, one a round: a process's own luck (where its memory
landed, its place in the start order: in round 13 the client started third
was slower than the second in 8 of 11 runs, whichever tree it ran) is
spread over both sides of a ratio instead of deciding it.  Clients:
C-core's ``xds:///`` channel, and pyxds from each ``--src`` given
(``name=path/to/src``, e.g. ``main=...``, ``branch=...``; default: the
installed pyxds), sync (1 and 4 threads) and asyncio (1 and 4 tasks).

Beside the rate (RPCs over the window: the goal's figure), each window also
gives the median latency of its RPCs and the client process's CPU per RPC
(every thread), each printed as a median ratio to C-core's the same way
(``lat`` and ``cpu``: above 1.0, pyxds's RPC is faster or cheaper).  On a
loaded machine a window's rate is decided by its slowest RPCs (the client
preempted by other programs, in a window of one client and not the next'),
so the rate ratio of two identical trees spreads by 10 % or more; the median
latency and the CPU per RPC are decided more by the clients' own call paths
(at load 30 they still spread, 0.82-1.12 between identical trees: there
``aio_loop.py --latency``, the call paths in turns in one process, holds).

Usage: python bench/rate_pairs.py [--rounds 30] [--window 0.3] [--procs 2] [--src NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from bench_world import world

_CLIENT = r"""
import asyncio, json, sys, threading, time
kind, mode, target, bootstrap = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
METHOD = "/bench.Bench/Ping"
import grpc
clock = time.monotonic

def report(latencies, seconds, cpu):
    # rate, median latency, process CPU per RPC (every thread) of one window
    every = sorted(x for mine in latencies for x in mine)
    print(len(every) / seconds, every[len(every) // 2], cpu / len(every), flush=True)

def sync_main():
    if kind == "core":
        channel = grpc.insecure_channel(target)
    else:
        import pyxds
        channel = pyxds.insecure_channel(target, bootstrap=bootstrap)
    call = channel.unary_unary(METHOD)
    for _ in range(200):
        call(b"x", timeout=60, wait_for_ready=True)
    print("READY", flush=True)
    for line in sys.stdin:
        threads, seconds = int(line.split()[0]), float(line.split()[1])
        latencies = [[] for _ in range(threads)]
        end = time.monotonic() + seconds
        def run(i):
            mine = latencies[i]
            t = clock()
            while True:  # one RPC at least: a thread started late still counts one
                call(b"x", timeout=60)
                after = clock()
                mine.append(after - t)
                t = after
                if t >= end:
                    break
        workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        cpu, start = time.process_time(), time.monotonic()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        report(latencies, time.monotonic() - start, time.process_time() - cpu)
    channel.close()

async def aio_main():
    import grpc.aio
    if kind == "core":
        channel = grpc.aio.insecure_channel(target)
    else:
        import pyxds.aio
        channel = pyxds.aio.insecure_channel(target, bootstrap=bootstrap)
    call = channel.unary_unary(METHOD)
    for _ in range(200):
        await call(b"x", timeout=60, wait_for_ready=True)
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        tasks, seconds = int(line.split()[0]), float(line.split()[1])
        end = time.monotonic() + seconds
        async def run():
            mine = []
            t = clock()
            while True:  # one RPC at least (see sync_main)
                await call(b"x", timeout=60)
                after = clock()
                mine.append(after - t)
                t = after
                if t >= end:
                    return mine
        cpu, start = time.process_time(), time.monotonic()
        latencies = await asyncio.gather(*(run() for _ in range(tasks)))
        report(latencies, time.monotonic() - start, time.process_time() - cpu)
    await channel.close()

asyncio.run(aio_main()) if mode == "aio" else sync_main()
"""


class Client:
    """One client process: a ready channel that runs a window when asked."""

    def __init__(self, kind: str, mode: str, src: str | None, bootstrap: dict[str, Any]) -> None:
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env.pop("PYTHONPATH", None)
        if kind == "core":
            env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        elif src is not None:
            env["PYTHONPATH"] = src
        args = [kind, mode, "xds:///bench", json.dumps(bootstrap)]
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "READY":
            raise RuntimeError(f"{kind} {mode}: client did not start")

    def window(self, parallel: int, seconds: float) -> tuple[float, float, float]:
        """One window of ``parallel`` threads/tasks: RPCs per second, the
        median RPC's seconds, and the process's CPU seconds per RPC."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{parallel} {seconds}\n")
        self.process.stdin.flush()
        rate, median, cpu = map(float, self.process.stdout.readline().split())
        return rate, median, cpu

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)


def _ratio(windows: dict[str, list[tuple[float, float, float]]], a: str, b: str, i: int) -> str:
    """The median over the rounds of ``a``'s figure ``i`` over ``b``'s."""
    ratios = [x[i] / y[i] for x, y in zip(windows[a], windows[b], strict=True)]
    return f"{statistics.median(ratios):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--window", type=float, default=0.3)
    parser.add_argument("--procs", type=int, default=2, help="processes per client")
    parser.add_argument("--src", action="append", default=[], metavar="NAME=PATH")
    args = parser.parse_args()
    sources: dict[str, str | None] = dict(s.split("=", 1) for s in args.src) or {"pyxds": None}
    load = open("/proc/loadavg").read().split()[:3]  # noqa: SIM115 - one read
    print(f"load before: {' '.join(load)}")
    with world() as info:
        bootstrap = info["bootstrap"]
        for mode in ("sync", "aio"):
            kinds: dict[str, tuple[str, str | None]] = {"C-core": ("core", None)}
            kinds.update((name, ("pyxds", src)) for name, src in sources.items())
            names = list(kinds)
            clients: dict[str, list[Client]] = {n: [] for n in names}
            try:
                for k in range(args.procs):
                    for name in names if k % 2 == 0 else names[::-1]:
                        kind, src = kinds[name]
                        clients[name].append(Client(kind, mode, src, bootstrap))
                for parallel in (1, 4):
                    windows: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
                    for r in range(args.rounds):
                        order = names[r % len(names) :] + names[: r % len(names)]
                        for name in order:
                            client = clients[name][r % args.procs]
                            windows[name].append(client.window(parallel, args.window))
                    rates = {n: [w[0] for w in windows[n]] for n in names}
                    pairs = [(name, "C-core") for name in names[1:]]
                    if len(names) == 3:
                        pairs.append((names[2], names[1]))
                    line = [f"{mode} x{parallel}:"]
                    line += [f"{a}/{b} {_ratio(windows, a, b, 0)}" for a, b in pairs]
                    line.append(
                        "(RPCs/s medians: "
                        + ", ".join(f"{n} {statistics.median(rates[n]):.0f}" for n in names)
                        + ")"
                    )
                    print("  ".join(line), flush=True)
                    for label, index in (("lat", 1), ("cpu", 2)):
                        extra = [f"{a}/{b} {_ratio(windows, b, a, index)}" for a, b in pairs]
                        print(f"  {label}: " + "  ".join(extra), flush=True)
            finally:
                for processes in clients.values():
                    for client in processes:
                        client.close()
    load = open("/proc/loadavg").read().split()[:3]  # noqa: SIM115 - one read
    print(f"load after: {' '.join(load)}")


if __name__ == "__main__":
    main()
