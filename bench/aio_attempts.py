"""Failed connection attempts of an asyncio channel to a plain target that
refuses every connection, ``grpc.aio`` beside ``pyxds.aio`` (issue 18: CPU
per failed attempt; :mod:`pyxds.channel.aio_engine`).

Each client runs in a fresh process (grpcio's asyncio engine is per
process): one channel to a closed port of 127.0.0.1 with a 20 ms
reconnect backoff, unary calls with ``wait_for_ready`` and a 0.1 s
deadline for ``--seconds``, then ``close()``.  Per client:

* ``attempts``: connection attempts (pyxds: the subchannel's grpc.aio
  channels made; grpc.aio: its C-core subchannel's, not counted here);
* ``engines``: grpcio asyncio engines built meanwhile (its poller threads
  started; each a ``grpc_init``, a completion queue and a thread, joined
  at its shutdown);
* ``CPU ms`` and, for pyxds, ``us/attempt``: the process's CPU over the
  window.

Rows alternate over ``--rounds``.  ``--before DIR`` adds ``pyxds-before``
(pyxds imported from ``DIR/src``, e.g. ``git archive main src | tar -x -C
DIR``).

Usage: python bench/aio_attempts.py [--seconds 2] [--rounds 3] [--before DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

#: this tree's pyxds.testing.aio_counts (loaded by path in each client)
_COUNTS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "src", "pyxds", "testing", "aio_counts.py"
)

_CLIENT = r"""
import asyncio, importlib.util, json, resource, socket, sys
import grpc

kind, seconds = sys.argv[1], float(sys.argv[2])
# this tree's counters (a --before tree may not have them), on its pyxds
spec = importlib.util.spec_from_file_location("aio_counts", sys.argv[3])
counts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counts)
engines = counts.count_engines()
attempts = counts.count_attempts()
if kind != "grpc.aio":
    import pyxds.aio

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

async def main():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    target = f"ipv4:127.0.0.1:{s.getsockname()[1]}"
    s.close()
    options = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.max_reconnect_backoff_ms", 20),
               ("grpc.min_reconnect_backoff_ms", 20)]
    make = grpc.aio.insecure_channel if kind == "grpc.aio" else pyxds.aio.insecure_channel
    channel = make(target, options=options)
    call = channel.unary_unary("/bench.S/M")
    loop = asyncio.get_running_loop()
    try:  # warm: the first attempt builds what the rest reuse
        await call(b"", timeout=0.2, wait_for_ready=True)
    except grpc.RpcError:
        pass
    engines.clear()
    attempts[0] = 0
    before, end = cpu(), loop.time() + seconds
    while loop.time() < end:
        try:
            await call(b"", timeout=0.1, wait_for_ready=True)
        except grpc.RpcError:
            pass
    spent = cpu() - before
    await channel.close()
    print(json.dumps({"attempts": attempts[0], "engines": len(engines), "cpu": spent}))

asyncio.run(main())
"""


def _run(kind: str, seconds: float, src: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", _CLIENT, kind, str(seconds), _COUNTS],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", help="a tree whose src/ is the pyxds to compare with")
    args = parser.parse_args()
    kinds: list[tuple[str, str | None]] = [("grpc.aio", None), ("pyxds.aio", None)]
    if args.before:
        kinds.append(("pyxds-before", os.path.join(args.before, "src")))
    print(f"{'client':<14}{'attempts':>9}{'engines':>9}{'CPU ms':>9}{'us/attempt':>12}")
    for round_ in range(args.rounds):
        order = kinds if round_ % 2 == 0 else kinds[::-1]
        for kind, src in order:
            got = _run("grpc.aio" if kind == "grpc.aio" else "pyxds", args.seconds, src)
            per = f"{got['cpu'] * 1e6 / got['attempts']:.0f}" if got["attempts"] else "-"
            print(
                f"{kind:<14}{got['attempts']:>9}{got['engines']:>9}"
                f"{got['cpu'] * 1e3:>9.0f}{per:>12}"
            )


if __name__ == "__main__":
    main()
