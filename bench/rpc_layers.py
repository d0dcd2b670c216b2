"""Where a pyxds RPC's own instructions go, layer by layer (issue 18 item 2).

A live sync ``xds:///bench`` channel (``e2e.py --serve``'s world: one route,
one cluster, round_robin over one endpoint) runs in a client process under
``valgrind --tool=callgrind``; the process zeroes and dumps callgrind's
counters around a loop of ``--count`` iterations of each step, so each row
is instructions per iteration on the calling thread:

* ``PickArgs``: building the pick's input; ``PickArgs, shared``: finding
  the one an RPC without metadata shares (where the code has it);
* ``select+release``: the ConfigSelector's route decision and the cluster
  reference it takes (released as the RPC ends);
* one row per picker of the channel's chain, each ``pick`` plus the pick's
  ``on_call_done``: a picker's own share is its row minus the next one's
  (``own``; for a picker that picks through its child's stream in C, as
  override_host over round_robin does, that includes the child's rotation);
* ``rpc cycle``: ``Rpc(...)``, its pick, its transport's count and its end,
  everything of an RPC but the grpcio call;
* ``unary RPC``: a whole blocking unary RPC; ``, 2 metadata pairs``: with
  two pairs of metadata, a new tuple each call; ``, same 2 pairs``: the
  same tuple each call;
* ``plain grpcio call``: a plain ``grpc`` channel's blocking call to the
  same backend (what issue 18 compares with).

An empty loop's count is subtracted.  Run a checkout's code with
``PYTHONPATH=path/to/src python bench/rpc_layers.py`` to compare two.

``--aio``: the same world through ``pyxds.aio`` on one event loop, each
step awaited ``--count`` times (an awaited no-op coroutine's count is
subtracted):

* ``grpcio call on the transport``: the grpcio call pyxds starts per
  attempt (the subchannel's own multicallable, the lean call where it
  applies), nothing of pyxds around it;
* ``plain grpc.aio call``: a plain ``grpc.aio`` channel's call to the same
  backend (what issue 18 compares with);
* ``pyxds.aio unary RPC``: a whole ``pyxds.aio`` unary RPC; its row minus
  the first is pyxds's own share (``own``).

Usage: python bench/rpc_layers.py [--count 2000] [--aio]
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

HERE = os.path.dirname(os.path.abspath(__file__))

_CLIENT = r"""
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from bench_world import world
from pyxds.channel.rpc import Rpc
from pyxds.lb.api import OK_STATUS, PickArgs

METHOD = "/bench.Bench/Ping"
count = int(sys.argv[2])
pid = str(os.getpid())
labels = []

def measure(label, step):
    step()
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
    for _ in range(count):
        step()
    subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
    labels.append(label)

with world() as info:
    import pyxds
    channel = pyxds.insecure_channel("xds:///bench", bootstrap=info["bootstrap"])
    call = channel.unary_unary(METHOD)
    for _ in range(50):
        call(b"x", timeout=60, wait_for_ready=True)
    core = channel._core
    config = core.selector.select(METHOD, ())
    config.on_committed()
    attributes = config.call_attributes
    args = PickArgs(METHOD, (), attributes)
    chain = [core.picker]
    while True:  # each picker's child: the cluster manager's by the route's cluster
        below = getattr(chain[-1], "_child", None) or getattr(chain[-1], "_pickers", None)
        if isinstance(below, dict):
            below = below[attributes["cluster"]]
        if below is None:
            break
        chain.append(below)

    def empty():
        pass

    def select():
        core.selector.select(METHOD, ()).on_committed()

    def picker_step(picker):
        def step():
            result = picker.pick(args)
            done = result.on_call_done
            if done is not None:
                done(OK_STATUS)
        return step

    def cycle():
        rpc = Rpc(core, METHOD, None, 60, None)
        transport = rpc.pick()
        transport.call_finished()
        rpc.finish(OK_STATUS)

    measure("empty loop", empty)
    measure("PickArgs", lambda: PickArgs(METHOD, (), attributes))
    shared = getattr(core, "shared_pick_args", None)
    if shared is not None:  # what Rpc.pick does for an RPC without metadata
        warm = Rpc(core, METHOD, None, 60, None)  # an RPC's pick fills it
        warm.pick().call_finished()
        warm.finish(OK_STATUS)

        def shared_args():
            args = shared.get((METHOD, id(attributes)))
            assert args is not None and args.call_attributes is attributes

        measure("PickArgs, shared", shared_args)
    measure("select+release", select)
    for picker in chain:
        measure(type(picker).__name__ + ".pick", picker_step(picker))
    measure("rpc cycle", cycle)
    measure("unary RPC", lambda: call(b"x", timeout=60))
    ids = iter(range(10**9))
    measure(
        "unary RPC, 2 metadata pairs",
        lambda: call(b"x", timeout=60, metadata=(("a-key", "v"), ("x-id", "%d" % next(ids)))),
    )
    pairs = (("a-key", "v"), ("x-id", "7"))
    measure("unary RPC, same 2 pairs", lambda: call(b"x", timeout=60, metadata=pairs))
    import grpc
    plain = grpc.insecure_channel(info["address"])
    plain_call = plain.unary_unary(METHOD)
    for _ in range(50):
        plain_call(b"x", timeout=60, wait_for_ready=True)
    measure("plain grpcio call", lambda: plain_call(b"x", timeout=60))
    plain.close()
    channel.close()
print(json.dumps(labels))
"""

_AIO_CLIENT = r"""
import asyncio, json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from bench_world import world
import grpc.aio

METHOD = "/bench.Bench/Ping"
count = int(sys.argv[2])
pid = str(os.getpid())
labels = []

async def measure(label, step):
    await step()
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
    for _ in range(count):
        await step()
    subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
    labels.append(label)

async def main(info):
    import pyxds.aio
    channel = pyxds.aio.insecure_channel("xds:///bench", bootstrap=info["bootstrap"])
    call = channel.unary_unary(METHOD)
    plain = grpc.aio.insecure_channel(info["address"])
    plain_call = plain.unary_unary(METHOD)
    for _ in range(50):
        await call(b"x", timeout=60, wait_for_ready=True)
        await plain_call(b"x", timeout=60, wait_for_ready=True)
    core = channel._core
    rpc_method = call._method
    picked = core.picker.pick  # the transport every RPC picks (one endpoint)
    from pyxds.lb.api import OK_STATUS, PickArgs
    from pyxds.channel.subchannel import core_of
    config = core.selector.select(METHOD, ())
    result = picked(PickArgs(METHOD, (), config.call_attributes))
    if result.on_call_done is not None:
        result.on_call_done(OK_STATUS)
    config.on_committed()
    transport = core_of(result.subchannel).transport
    inner = transport.callables[rpc_method._key]

    async def empty():
        pass

    await measure("empty await", empty)
    await measure(
        "grpcio call on the transport", lambda: inner(b"x", timeout=60, wait_for_ready=False)
    )
    await measure("plain grpc.aio call", lambda: plain_call(b"x", timeout=60))
    await measure("pyxds.aio unary RPC", lambda: call(b"x", timeout=60))
    await channel.close()
    await plain.close()

with world() as info:
    asyncio.run(main(info))
print(json.dumps(labels))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--aio", action="store_true", help="pyxds.aio's steps (see above)")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="pyxds-layers-")
    out_file = os.path.join(folder, "cg.out")
    env = dict(os.environ, PYTHONMALLOC="malloc")
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    try:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out_file}",
                "--dump-instr=no",
                "--separate-threads=yes",
                sys.executable,
                "-c",
                _AIO_CLIENT if args.aio else _CLIENT,
                HERE,
                str(args.count),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"client failed: {done.stderr[-2000:]}")
        labels = json.loads(done.stdout.strip().splitlines()[-1])
        per_step: dict[str, float] = {}
        for number, label in enumerate(labels, 1):
            (path,) = glob.glob(f"{out_file}.{number}-01")  # the calling thread's dump
            with open(path) as f:
                total = next(int(line.split()[1]) for line in f if line.startswith("summary:"))
            per_step[label] = total / args.count
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    floor = per_step.pop("empty await" if args.aio else "empty loop")
    print("instructions per iteration, calling thread (an empty loop's subtracted)")
    names = list(per_step)
    for i, name in enumerate(names):
        value = per_step[name] - floor
        line = f"{name:<34} {value:9.0f}"
        if name.endswith(".pick") and i + 1 < len(names) and names[i + 1].endswith(".pick"):
            own = value - (per_step[names[i + 1]] - floor)
            line += f"   own {own:7.0f}"
        if name == "plain grpcio call" and "unary RPC" in per_step:
            line += f"   pyxds / plain {(per_step['unary RPC'] - floor) / value:.3f}"
        if name == "pyxds.aio unary RPC":
            own = per_step[name] - per_step["grpcio call on the transport"]
            plain = value / (per_step["plain grpc.aio call"] - floor)
            line += f"   own {own:7.0f}   / plain {plain:.3f}"
        print(line)


if __name__ == "__main__":
    main()
