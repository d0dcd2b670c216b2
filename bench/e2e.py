"""End-to-end unary RPC rate: plain grpcio vs grpcio's C-core xds:/// vs pyxds.

Same backend (a generic-handler grpcio server on 127.0.0.1, bytes in/out),
same run, same control plane (pyxds.server):

  (a) grpc.insecure_channel("127.0.0.1:PORT")            plain grpcio
  (b) grpc.insecure_channel("xds:///bench")              C-core xDS (subprocess,
                                                         GRPC_XDS_BOOTSTRAP_CONFIG)
  (c) pyxds.insecure_channel("xds:///bench")             pyxds
  (d) pyxds.aio.insecure_channel / grpc.aio plain         asyncio, 1 task and 4 tasks
      / grpc.aio C-core xds:/// (subprocess)

Policy rows (issue 10): the same for listeners whose route carries a retry
policy (``retry_on: unavailable``, 3 retries; it never fires, the backend
always answers) and whose HCM has a fault filter at 0 % (abort and delay),
pyxds and C-core each on the same listener, sync and asyncio.

Each is measured on 1 thread and on 4 threads for ``--seconds`` (default 3).
The backend and the control plane run in their own process, C-core's client
in another (each has its own GIL, as (a) and (c) have theirs).
Prints RPCs/s and the ratios b/a and c/b, and for asyncio pyxds / C-core
xds (the goal's comparison) and pyxds / plain.  Usage: python bench/e2e.py
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
from concurrent import futures

import grpc

METHOD = "/bench.Bench/Ping"


def start_backend() -> tuple[grpc.Server, int]:
    handler = grpc.method_handlers_generic_handler(
        "bench.Bench", {"Ping": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def rate(channel: grpc.Channel, threads: int, seconds: float) -> float:
    mc = channel.unary_unary(METHOD)
    for _ in range(200):
        mc(b"x", timeout=10, wait_for_ready=True)
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            mc(b"x", timeout=10)
            n += 1
        counts[i] = n

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    start = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / (time.monotonic() - start)


async def aio_rate(channel, tasks: int, seconds: float) -> float:
    mc = channel.unary_unary(METHOD)
    for _ in range(200):
        await mc(b"x", timeout=10, wait_for_ready=True)
    counts = [0] * tasks
    stop = time.monotonic() + seconds

    async def run(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            await mc(b"x", timeout=10)
            n += 1
        counts[i] = n

    start = time.monotonic()
    await asyncio.gather(*(run(i) for i in range(tasks)))
    return sum(counts) / (time.monotonic() - start)


_CORE = r"""
import json, sys, time, threading
import grpc
sys.path.insert(0, sys.argv[2])
from e2e import rate
channel = grpc.insecure_channel(sys.argv[1])
seconds = float(sys.argv[3])
print(json.dumps({str(t): rate(channel, t, seconds) for t in (1, 4)}), flush=True)
"""

_CORE_AIO = r"""
import asyncio, json, sys
import grpc
sys.path.insert(0, sys.argv[2])
from e2e import aio_rate
async def main():
    channel = grpc.aio.insecure_channel(sys.argv[1])
    seconds = float(sys.argv[3])
    out = {str(t): await aio_rate(channel, t, seconds) for t in (1, 4)}
    await channel.close()
    return out
print(json.dumps(asyncio.run(main())), flush=True)
"""


def core_rates(
    bootstrap: dict, seconds: float, script: str = _CORE, target: str = "xds:///bench"
) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", script, target, here, str(seconds)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {k: float(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def serve() -> None:
    """``--serve``: backend + control plane; prints the address and bootstrap,
    runs until stdin closes."""
    from pyxds.server import ManagementServer
    from pyxds.server import builders as b
    from pyxds.server.snapshot import Snapshot

    backend, port = start_backend()
    address = f"127.0.0.1:{port}"
    control = ManagementServer().start()
    retry = b.retry_policy("unavailable", num_retries=3)
    fault = b.fault_filter(
        abort_grpc_status=14, abort_percent=(0, 100), delay=0.1, delay_percent=(0, 100)
    )
    control.set_snapshot(
        Snapshot(
            listeners=[
                b.listener("bench"),
                b.listener("bench-retry"),
                b.listener("bench-fault", http_filters=[fault]),
            ],
            routes=[
                b.route_config(
                    "bench-route", [b.virtual_host("vh", routes=[b.route(prefix="", cluster="c")])]
                ),
                b.route_config(
                    "bench-retry-route",
                    [
                        b.virtual_host(
                            "vh", routes=[b.route(prefix="", cluster="c", retry_policy=retry)]
                        )
                    ],
                ),
                b.route_config(
                    "bench-fault-route",
                    [b.virtual_host("vh", routes=[b.route(prefix="", cluster="c")])],
                ),
            ],
            clusters=[b.cluster("c")],
            endpoints=[b.endpoints("c", [b.locality(zone="z", endpoints=[address])])],
        )
    )
    print(json.dumps({"address": address, "bootstrap": control.bootstrap(node_id="bench")}))
    sys.stdout.flush()
    sys.stdin.read()
    control.stop()
    backend.stop(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-policies", action="store_true", help="skip the retry-policy / 0%% fault rows"
    )
    args = parser.parse_args()
    if args.serve:
        serve()
        return

    import pyxds._api as pyxds
    import pyxds.aio

    server = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    info = json.loads(server.stdout.readline())
    address, bootstrap = info["address"], info["bootstrap"]
    results: dict[str, dict[str, float]] = {}

    plain = grpc.insecure_channel(address)
    results["a plain grpcio"] = {str(t): rate(plain, t, args.seconds) for t in (1, 4)}
    plain.close()
    results["b C-core xds"] = core_rates(bootstrap, args.seconds)
    ours = pyxds.insecure_channel("xds:///bench", bootstrap=bootstrap)
    results["c pyxds"] = {str(t): rate(ours, t, args.seconds) for t in (1, 4)}
    ours.close()

    async def aio_all() -> None:
        plain_aio = grpc.aio.insecure_channel(address)
        results["aio plain grpcio"] = {
            str(t): await aio_rate(plain_aio, t, args.seconds) for t in (1, 4)
        }
        await plain_aio.close()
        ours_aio = pyxds.aio.insecure_channel("xds:///bench", bootstrap=bootstrap)
        results["aio pyxds"] = {str(t): await aio_rate(ours_aio, t, args.seconds) for t in (1, 4)}
        await ours_aio.close()
        for kind in policies:  # one event loop for every grpc.aio channel
            ch = pyxds.aio.insecure_channel(f"xds:///bench-{kind}", bootstrap=bootstrap)
            results[f"aio pyxds {kind}"] = {
                str(t): await aio_rate(ch, t, args.seconds) for t in (1, 4)
            }
            await ch.close()

    policies = () if args.no_policies else ("retry", "fault")
    for kind in policies:
        target = f"xds:///bench-{kind}"
        results[f"C-core {kind}"] = core_rates(bootstrap, args.seconds, target=target)
        ours = pyxds.insecure_channel(target, bootstrap=bootstrap)
        results[f"pyxds {kind}"] = {str(t): rate(ours, t, args.seconds) for t in (1, 4)}
        ours.close()
        results[f"aio C-core {kind}"] = core_rates(bootstrap, args.seconds, _CORE_AIO, target)
    asyncio.run(aio_all())
    results["aio C-core xds"] = core_rates(bootstrap, args.seconds, _CORE_AIO)
    server.stdin.close()
    server.wait(10)

    print(f"{'channel':<20} {'1 thread':>10} {'4 threads':>10}   (unary RPCs/s)")
    for name, by in results.items():
        print(f"{name:<20} {by['1']:>10.0f} {by['4']:>10.0f}")
    a, b_, c = results["a plain grpcio"], results["b C-core xds"], results["c pyxds"]
    for t in ("1", "4"):
        print(
            f"threads={t}: b/a = {b_[t] / a[t]:.2f}   c/b = {c[t] / b_[t]:.2f}   "
            f"aio pyxds/plain = {results['aio pyxds'][t] / results['aio plain grpcio'][t]:.2f}   "
            f"aio pyxds/C-core xds = {results['aio pyxds'][t] / results['aio C-core xds'][t]:.2f}"
        )
    for kind in policies:
        for t in ("1", "4"):
            sync = results[f"pyxds {kind}"][t]
            aio = results[f"aio pyxds {kind}"][t]
            print(
                f"{kind} threads={t}: pyxds/C-core same config = "
                f"{sync / results[f'C-core {kind}'][t]:.2f}   "
                f"pyxds/C-core plain xds = {sync / b_[t]:.2f}   "
                f"aio pyxds/aio C-core same config = "
                f"{aio / results[f'aio C-core {kind}'][t]:.2f}   "
                f"aio pyxds/aio C-core plain xds = {aio / results['aio C-core xds'][t]:.2f}"
            )


if __name__ == "__main__":
    main()
