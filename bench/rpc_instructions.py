"""Instructions per unary RPC under callgrind: a repeatable measure of the
client's cost per RPC on a shared, noisy machine (CPU time moves with the
load; instruction counts do not).

Each client (plain grpcio, C-core's ``xds:///`` channel, pyxds; sync and
asyncio) runs in its own process under ``valgrind --tool=callgrind``; the
backend and control plane (``e2e.py --serve``) run outside valgrind.  After
a warm-up the counters are zeroed (``callgrind_control -z``), the client
makes ``--count`` sequential RPCs, and the counters are dumped
(``callgrind_control -d``): the instructions of every thread of the client
process (grpcio's pollers and pyxds's threads included) over exactly those
RPCs, divided by their number, and those of the calling thread alone.
Background threads that wake on a timer count for the wall time of the
run, which valgrind stretches (and the load of the machine with it): the
calling thread's figure is the steadiest; compare clients with each other,
not with a native run.

``plain-2loops-aio`` (not in the default kinds) is plain grpc.aio with a
second event loop in another thread bound to grpcio's aio poller (one idle
channel on it), as pyxds's xDS stream loop is: grpcio wakes every bound loop
per completion and forwards what the wrong one read, a cost every pyxds.aio
RPC pays.

Usage: python bench/rpc_instructions.py [--count 300] [--kinds plain,core,pyxds]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench_world import world

KEEP = False
HERE = os.path.dirname(os.path.abspath(__file__))

_CLIENT = r"""
import asyncio, json, sys
kind, target, count, bootstrap = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
METHOD = "/bench.Bench/Ping"
import grpc

def sync_main():
    if kind.startswith("pyxds"):
        import pyxds
        channel = pyxds.insecure_channel(target, bootstrap=bootstrap)
    else:
        channel = grpc.insecure_channel(target)
    mc = channel.unary_unary(METHOD)
    for _ in range(50):
        mc(b"x", timeout=60, wait_for_ready=True)
    print("READY", flush=True)
    sys.stdin.readline()
    for _ in range(count):
        mc(b"x", timeout=60)
    print("DONE", flush=True)
    sys.stdin.readline()
    channel.close()

async def aio_main():
    import grpc.aio
    if kind.startswith("pyxds"):
        import pyxds.aio
        channel = pyxds.aio.insecure_channel(target, bootstrap=bootstrap)
    else:
        if kind == "plain-2loops-aio":
            # a second event loop bound to grpcio's aio poller, as pyxds's
            # xDS stream loop is: what grpcio's dispatch between loops costs
            import threading
            side_ready = threading.Event()
            def side():
                async def hold():
                    side_channel = grpc.aio.insecure_channel(target)
                    await side_channel.unary_unary(METHOD)(b"x", timeout=60, wait_for_ready=True)
                    side_ready.set()
                    await asyncio.sleep(3600)
                asyncio.new_event_loop().run_until_complete(hold())
            threading.Thread(target=side, daemon=True).start()
            side_ready.wait(60)
        channel = grpc.aio.insecure_channel(target)
    mc = channel.unary_unary(METHOD)
    for _ in range(50):
        await mc(b"x", timeout=60, wait_for_ready=True)
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for _ in range(count):
        await mc(b"x", timeout=60)
    print("DONE", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await channel.close()

asyncio.run(aio_main()) if kind.endswith("aio") else sync_main()
"""


def _tail(folder: str) -> str:
    """The end of the client's stderr (valgrind's and Python's)."""
    with open(os.path.join(folder, "stderr")) as f:
        return f.read()[-2000:]


def callgrind(out_file: str) -> list[str]:
    """valgrind's part of a callgrind run's command line, as the benches run
    it: one file per thread, no costs per instruction."""
    return [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        "--dump-instr=no",
        "--separate-threads=yes",
    ]


def control(args: list[str]) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def counted(label: str, args: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Instructions of ``python args...`` under callgrind between the
    ``READY`` and ``DONE`` lines it prints (after each it waits for a line
    on stdin): (every thread, the calling thread)."""
    folder = tempfile.mkdtemp(prefix="pyxds-cg-")
    out_file = os.path.join(folder, "cg.out")
    client = subprocess.Popen(
        [*callgrind(out_file), "--compress-strings=no", sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(os.path.join(folder, "stderr"), "w"),  # noqa: SIM115 - the child's
        env=env,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        if client.stdout.readline().strip() != "READY":
            raise RuntimeError(f"{label}: client did not start: {_tail(folder)}")
        control(["-z", str(client.pid)])
        client.stdin.write("go\n")
        client.stdin.flush()
        if client.stdout.readline().strip() != "DONE":
            raise RuntimeError(f"{label}: client failed: {_tail(folder)}")
        control(["-d", str(client.pid)])
        client.stdin.write("end\n")
        client.stdin.flush()
        client.wait(300)
    finally:
        if client.poll() is None:
            client.kill()
    # the dump callgrind_control -d asked for is "<out>.1" (the counters
    # zeroed at READY); "<out>" itself holds what ran after it
    total = calling = 0
    for path in glob.glob(out_file + ".1-*"):  # one file per thread; -01 is the main one
        with open(path) as f:
            for line in f:
                if line.startswith("summary:"):
                    total += int(line.split()[1])
                    if path.endswith("-01"):
                        calling = int(line.split()[1])
    if KEEP:
        print(f"  callgrind output kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return total, calling


def instructions(kind: str, target: str, bootstrap: dict, count: int) -> tuple[float, float]:
    """Instructions per RPC of one client: (every thread, the calling thread)."""
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    if kind.startswith("core"):
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    env["PYTHONMALLOC"] = "malloc"
    args = ["-c", _CLIENT, kind, target, str(count), json.dumps(bootstrap)]
    total, calling = counted(kind, args, env)
    return total / count, calling / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--kinds", default="plain,core,pyxds,plain-aio,core-aio,pyxds-aio")
    parser.add_argument(
        "--keep", action="store_true", help="keep callgrind's files (one per thread) to annotate"
    )
    args = parser.parse_args()
    if args.keep:
        global KEEP
        KEEP = True
    with world() as info:
        address, bootstrap = info["address"], info["bootstrap"]
        results: dict[str, float] = {}
        calling: dict[str, float] = {}
        print("instructions per RPC: every thread of the client / its calling thread")
        for kind in args.kinds.split(","):
            target = address if kind.startswith("plain") else "xds:///bench"
            start = time.monotonic()
            results[kind], calling[kind] = instructions(kind, target, bootstrap, args.count)
            print(
                f"{kind:<10} {results[kind]:10.0f} {calling[kind]:10.0f}"
                f"   ({time.monotonic() - start:.0f} s)",
                flush=True,
            )
    for by, label in ((results, "every thread"), (calling, "calling thread")):
        for suffix in ("", "-aio"):
            plain, core, ours = (by.get(k + suffix) for k in ("plain", "core", "pyxds"))
            if plain and ours:
                line = f"{label}, {suffix.strip('-') or 'sync'}: pyxds/plain = {ours / plain:.3f}"
                if core:
                    line += (
                        f"   C-core/plain = {core / plain:.3f}   pyxds/C-core = {ours / core:.3f}"
                    )
                print(line)


if __name__ == "__main__":
    main()
