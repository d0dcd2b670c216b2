"""Unary RPC rates of several clients in short alternating windows: the
rate goal of issue 18 item 2 (pyxds >= 1.0x C-core's ``xds:///``) on a
shared, noisy machine.

``e2e.py --vs-core`` makes a new channel per window of seconds, so a load
spike of the machine lands on one side of a ratio.  Here every client is a
process of its own, started once with its channel ready (warmed up), and
the clients take turns in windows of ``--window`` seconds (0.05 by default;
0.3 until round 15), the order changed every round: drift hits every client
alike, and a ratio is the median over many rounds (180 by default; 30 of
0.3 s until round 15, for the same time: a short window is more often one
no other program preempted, so the medians of short windows hold still
where long windows each catch a few preemptions: two identical trees'
intervals, over rounds alone, were 0.14 wide against 0.24 at sync x4 and
0.04 against 0.18 at aio x1, two runs each).  With two or three clients the windows
follow each other so that every client's window comes right after each
other client's once every two rounds, and never right after its own
(:func:`round_order`): whatever a window leaves to the next lands on every
side of a ratio alike.  Until round 15 the order was rotated, so with
three clients "after" came right after "before" 40 times in 60 rounds and
before it 20.  Each client runs in ``--procs`` processes (6 by default; 2
until round 15), all started together, and used in turns, one a round: a
process's own luck (where its memory landed, its place in the start order:
in round 13 the client started third was slower than the second in 8 of 11
runs, whichever tree it ran; round 15: six ``pyxds.aio`` processes of one
tree 0.93-1.09 of their rounds' means) is spread over both sides of a ratio
and averaged over six instead of deciding it.  Clients:
C-core's ``xds:///`` channel, and pyxds from each ``--src`` given
(``name=path/to/src``, e.g. ``main=...``, ``branch=...``; default: the
installed pyxds), sync (1 and 4 threads) and asyncio (1 and 4 tasks).

Beside the rate (RPCs over the window: the goal's figure), each window also
gives the median latency of its RPCs, their 99th percentile and the client
process's CPU per RPC (every thread), each printed as a median ratio to
C-core's the same way (``lat``, ``p99`` and ``cpu``: above 1.0, pyxds's RPC
is faster or cheaper; ``p99`` shows a client's own periodic stall, a timer
or the collector, that the median hides).  On a
loaded machine a window's rate is decided by its slowest RPCs (the client
preempted by other programs, in a window of one client and not the next'),
so the rate ratio of two identical trees spreads by 10 % or more; the median
latency and the CPU per RPC are decided more by the clients' own call paths
(at load 30 they still spread, 0.82-1.12 between identical trees: there
``aio_loop.py --latency``, the call paths in turns in one process, holds).
The rate's line gives, after the median of the per-round ratios, its 95 %
confidence interval (``ci LOW-HIGH``, :func:`median_interval`: over the
processes as well as the rounds) and the ratios' quartiles (``[p25-p75]``).
A run shows a client slower or faster than another only when the interval
leaves 1.0 out; two identical trees stray from 1.0 by up to its half-width,
either way.  One round before the counted ones is left out (each process's
first window).

``--core-aio`` (sync): a third client, C-core's channel in a process where
grpc.aio's engine runs (an idle event loop thread holding an unconnected
``grpc.aio`` channel).  A sync pyxds channel's process has that engine:
its xDS stream loop is a ``grpc.aio`` call, and grpcio's aio poller thread
then waits in C-core's completion queue for good.  That alone changes how
C-core wakes the sync calling threads (at sync x4, 2.4-2.6 wake-ups a call
become 1.5-1.8, C-core's channel or pyxds's) and costs C-core's own channel
its 99th percentile (round 15, branch tail4: pooled over a run, 0.50-0.97
of the plain process's in 13 runs of 13, more the busier the machine, the
median and 90th percentile unchanged; pyxds to a plain target, without the engine, 1.06x C-core's;
docs/architecture.md "Where sync x4's slow RPCs come from").
``pyxds/C-core+aio`` compares pyxds with C-core under the same engine.

``--counts``: each client process also samples, right before and after each
window (outside its timed part), every thread's time on a CPU and waiting
for one (``/proc/self/task/*/schedstat``), its wake-ups and preemptions
(voluntary and involuntary switches) and the collector's runs, printed per
RPC (means over the windows) under each line: what each process does per
RPC, its own threads included, where the rate is measured.  A sync window's
calling threads are made for it and end before the second sample, so they
are not among them (the ``cpu`` ratio has them; before round 15 they were
when one had not left ``/proc`` yet, as an unnamed ``python`` thread): sync
counts show the rest of the process; an asyncio window's caller is the main
thread, counted.

Usage: python bench/rate_pairs.py [--rounds 180] [--window 0.05] [--procs 6] [--src NAME=PATH ...]
       [--modes sync,aio] [--parallel 1,4] [--counts] [--core-aio]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from typing import Any

from bench_world import THREAD_SAMPLE, world

_CLIENT = r"""
import asyncio, gc, json, sys, threading, time
kind, mode, target, bootstrap = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
counting = sys.argv[5] == "1"
METHOD = "/bench.Bench/Ping"
import grpc
clock = time.monotonic

def sample():
    # --counts: each thread's figures (bench_world.THREAD_SAMPLE) and the
    # collector's runs per generation
    if not counting:
        return None
    return thread_sample(), [g["collections"] for g in gc.get_stats()]

def report(latencies, seconds, cpu, before, callers=()):
    # rate, median and 99th percentile latency, process CPU per RPC (every
    # thread) of one window;
    # with --counts, a JSON of per-RPC counts (sampled outside the window),
    # without the window's calling threads (native ids): joined, a thread
    # may still be in /proc for a moment, and it was not in the first sample
    every = sorted(x for mine in latencies for x in mine)
    n = len(every)
    line = f"{n / seconds} {every[n // 2]} {every[n * 99 // 100]} {cpu / n}"
    if before is not None:
        (threads0, gc0), (threads1, gc1) = before, sample()
        per = {}
        for tid, (name, *now) in threads1.items():
            if int(tid) in callers:
                continue
            was = threads0.get(tid, (name, 0, 0, 0, 0))[1:]
            mine = per.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            for i, (a, b) in enumerate(zip(was, now)):
                mine[i] += (b - a) / n
        counts = {"threads": per, "gc": [(b - a) / n for a, b in zip(gc0, gc1)]}
        line += " " + json.dumps(counts, separators=(",", ":"))
    print(line, flush=True)

def aio_engine_alive():
    # core-aio: grpc.aio's engine alive in the process, as pyxds's xDS stream
    # loop keeps it (an idle event loop thread holding an unconnected
    # grpc.aio channel: grpcio's poller thread waits in C-core's completion
    # queue for good); its sync RPCs still go over C-core's channel
    import asyncio, grpc.aio
    up = threading.Event()
    async def hold():
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        up.set()
        await asyncio.Event().wait()
    threading.Thread(target=asyncio.run, args=(hold(),), daemon=True).start()
    up.wait(30)

def sync_main():
    if kind.startswith("core"):
        channel = grpc.insecure_channel(target)
        if kind == "core-aio":
            aio_engine_alive()
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
        before = sample()
        cpu, start = time.process_time(), time.monotonic()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seconds, cpu = time.monotonic() - start, time.process_time() - cpu
        report(latencies, seconds, cpu, before, {w.native_id for w in workers})
    channel.close()

async def aio_main():
    import grpc.aio
    if kind.startswith("core"):
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
        before = sample()
        cpu, start = time.process_time(), time.monotonic()
        latencies = await asyncio.gather(*(run() for _ in range(tasks)))
        report(latencies, time.monotonic() - start, time.process_time() - cpu, before)
    await channel.close()

asyncio.run(aio_main()) if mode == "aio" else sync_main()
"""


class Client:
    """One client process: a ready channel that runs a window when asked."""

    def __init__(
        self, kind: str, mode: str, src: str | None, bootstrap: dict[str, Any], counts: bool
    ) -> None:
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env.pop("PYTHONPATH", None)
        if kind.startswith("core"):
            env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        elif src is not None:
            env["PYTHONPATH"] = src
        args = [kind, mode, "xds:///bench", json.dumps(bootstrap), "1" if counts else "0"]
        self.process = subprocess.Popen(
            [sys.executable, "-c", THREAD_SAMPLE + _CLIENT, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        self.label = f"{kind} {mode}"

    def ready(self) -> None:
        """Wait until its channel is warmed up (processes start together)."""
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "READY":
            raise RuntimeError(f"{self.label}: client did not start")

    def window(self, parallel: int, seconds: float) -> tuple[Figures, dict[str, Any] | None]:
        """One window of ``parallel`` threads/tasks: (RPCs per second, the
        median RPC's seconds, the 99th percentile's, the process's CPU
        seconds per RPC), and with
        ``--counts`` the window's counts per RPC (:func:`_print_counts`)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{parallel} {seconds}\n")
        self.process.stdin.flush()
        rate, median, p99, cpu, *counts = self.process.stdout.readline().split(" ", 4)
        figures = float(rate), float(median), float(p99), float(cpu)
        return figures, json.loads(counts[0]) if counts else None

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)


#: one window's rate, median and 99th percentile latency, and CPU per RPC
Figures = tuple[float, float, float, float]


def median_interval(
    values: list[float], groups: list[int], level: float = 0.95, draws: int = 2000
) -> tuple[float, float] | None:
    """A confidence interval of the median of per-round ``values`` whose
    rounds ran on the processes ``groups`` names (one number per round):
    a two-stage bootstrap, the groups drawn with replacement, then each
    drawn group's rounds, ``draws`` times; the interval holds the middle
    ``level`` of the drawn medians.  A process keeps its own speed for its
    life (with ``pyxds.aio`` at one task, six processes of one tree were
    0.93-1.09 of their rounds' means, 1.5 times the spread their rounds
    alone give): rounds of one process are not independent, and an interval over
    rounds alone left 1.0 out for two identical trees in 4 of 18 runs.
    Seeded: one run's figures print the same interval.  None for fewer than
    two groups or six rounds."""
    by: dict[int, list[float]] = {}
    for value, group in zip(values, groups, strict=True):
        by.setdefault(group, []).append(value)
    clusters = list(by.values())
    if len(clusters) < 2 or len(values) < 6:
        return None
    rng = random.Random(15)
    medians = []
    for _ in range(draws):
        drawn: list[float] = []
        for _ in clusters:
            cluster = rng.choice(clusters)
            drawn += rng.choices(cluster, k=len(cluster))
        medians.append(statistics.median(drawn))
    medians.sort()
    tail = int(draws * (1 - level) / 2)
    return medians[tail], medians[draws - 1 - tail]


def round_order(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order of ``names``: as given in even rounds, the first
    then the others backwards in odd ones.  With two or three names the
    rounds chain into a walk over every ordered pair of different names
    (A B C A C B A B C ...): each window comes right after each other
    name's once every two rounds, and never right after its own name's."""
    return names if r % 2 == 0 else names[:1] + names[:0:-1]


def _ratio(
    windows: dict[str, list[Figures]], a: str, b: str, i: int, groups: list[int] | None = None
) -> str:
    """The median over the rounds of ``a``'s figure ``i`` over ``b``'s; with
    the rounds' ``groups`` (processes), its 95 % confidence interval and the
    ratios' quartiles."""
    ratios = [x[i] / y[i] for x, y in zip(windows[a], windows[b], strict=True)]
    out = f"{statistics.median(ratios):.3f}"
    interval = median_interval(ratios, groups) if groups is not None else None
    if interval is not None:
        low, _, high = statistics.quantiles(ratios, n=4)
        out += f" ci {interval[0]:.3f}-{interval[1]:.3f} [{low:.3f}-{high:.3f}]"
    return out


def _print_counts(name: str, counts: list[dict[str, Any]]) -> None:
    """``--counts``: per RPC, each thread's microseconds on a CPU and
    waiting for one (runnable), its wake-ups (voluntary switches) and
    preemptions, and the collector's runs per 1000 RPCs by generation:
    means over the windows (a thread waking once a second shows), sampled
    outside the timed part of each window."""
    totals: dict[str, list[float]] = {}
    for c in counts:
        for thread, values in c["threads"].items():
            mine = totals.setdefault(thread, [0.0, 0.0, 0.0, 0.0])
            for i, v in enumerate(values):
                mine[i] += v / len(counts)
    gc_runs = [1000 * sum(c["gc"][g] for c in counts) / len(counts) for g in range(3)]
    print(f"  {name} per RPC (cpu us / runnable us / wake-ups / preemptions):")
    for thread, (cpu, waiting, woken, preempted) in sorted(totals.items(), key=lambda t: -t[1][0]):
        if cpu >= 0.0005 or woken >= 0.0005:
            figures = f"{cpu / 1000:.2f} / {waiting / 1000:.2f} / {woken:.4f} / {preempted:.4f}"
            print(f"    {thread}: {figures}")
    print(f"    GC runs per 1000 RPCs by generation: {', '.join(f'{g:.2f}' for g in gc_runs)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=180)
    parser.add_argument("--window", type=float, default=0.05)
    parser.add_argument(
        "--procs", type=int, default=6, help="processes per client, started together"
    )
    parser.add_argument("--src", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--modes", default="sync,aio", help="of sync,aio")
    parser.add_argument("--parallel", default="1,4", help="threads/tasks per window, of 1,4")
    parser.add_argument(
        "--counts", action="store_true", help="each client's counts per RPC, by thread (see below)"
    )
    parser.add_argument(
        "--core-aio",
        action="store_true",
        help="sync: also C-core's channel in a process where grpc.aio's engine runs (see below)",
    )
    args = parser.parse_args()
    sources: dict[str, str | None] = dict(s.split("=", 1) for s in args.src) or {"pyxds": None}
    load = open("/proc/loadavg").read().split()[:3]  # noqa: SIM115 - one read
    print(f"load before: {' '.join(load)}")
    with world() as info:
        bootstrap = info["bootstrap"]
        for mode in args.modes.split(","):
            kinds: dict[str, tuple[str, str | None]] = {"C-core": ("core", None)}
            if args.core_aio and mode == "sync":
                kinds["C-core+aio"] = ("core-aio", None)
            kinds.update((name, ("pyxds", src)) for name, src in sources.items())
            names = list(kinds)
            clients: dict[str, list[Client]] = {n: [] for n in names}
            procs = args.procs
            try:
                for k in range(procs):
                    for name in names[k % len(names) :] + names[: k % len(names)]:
                        kind, src = kinds[name]
                        clients[name].append(Client(kind, mode, src, bootstrap, args.counts))
                for started in clients.values():
                    for client in started:
                        client.ready()
                for parallel in map(int, args.parallel.split(",")):
                    windows: dict[str, list[Figures]] = {n: [] for n in names}
                    counted: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
                    for r in range(-1, args.rounds):  # round -1 is left out
                        for name in round_order(names, r):
                            figures, counts = clients[name][r % procs].window(parallel, args.window)
                            if r < 0:
                                continue
                            windows[name].append(figures)
                            if counts is not None:
                                counted[name].append(counts)
                    rates = {n: [w[0] for w in windows[n]] for n in names}
                    pairs = [(name, "C-core") for name in names[1:]]
                    if len(names) == 3:
                        pairs.append((names[2], names[1]))
                    line = [f"{mode} x{parallel}:"]
                    groups = [r % procs for r in range(args.rounds)]
                    line += [f"{a}/{b} {_ratio(windows, a, b, 0, groups)}" for a, b in pairs]
                    line.append(
                        "(RPCs/s medians: "
                        + ", ".join(f"{n} {statistics.median(rates[n]):.0f}" for n in names)
                        + ")"
                    )
                    print("  ".join(line), flush=True)
                    for label, index in (("lat", 1), ("p99", 2), ("cpu", 3)):
                        extra = [f"{a}/{b} {_ratio(windows, b, a, index)}" for a, b in pairs]
                        print(f"  {label}: " + "  ".join(extra), flush=True)
                    for name in names:
                        if counted[name]:
                            _print_counts(name, counted[name])
            finally:
                for processes in clients.values():
                    for client in processes:
                        client.close()
    load = open("/proc/loadavg").read().split()[:3]  # noqa: SIM115 - one read
    print(f"load after: {' '.join(load)}")


if __name__ == "__main__":
    main()
