"""End-to-end unary RPC rate: plain grpcio vs grpcio's C-core xds:/// vs pyxds.

Same backend (a generic-handler grpcio server on 127.0.0.1, bytes in/out),
same run, same control plane (pyxds.server):

  (a) grpc.insecure_channel("127.0.0.1:PORT")            plain grpcio
  (b) grpc.insecure_channel("xds:///bench")              C-core xDS (subprocess,
                                                         GRPC_XDS_BOOTSTRAP_CONFIG)
  (c) pyxds.insecure_channel("xds:///bench")             pyxds
  (d) pyxds.aio.insecure_channel / grpc.aio plain         asyncio, 1 task and 4 tasks
      / grpc.aio C-core xds:/// (subprocess)
  (e) mTLS (A29) to a backend requiring client certificates:
      grpc.secure_channel(addr, grpc.ssl_channel_credentials(...))    grpcio's own TLS
      grpc.secure_channel("xds:///bench-tls", xds_channel_credentials) C-core (subprocess)
      pyxds.secure_channel("xds:///bench-tls", xds_channel_credentials) pyxds (TLS relay,
      SANs checked); certificates made with ``cryptography``, file_watcher provider

  (e) pyxds with load reporting: ``xds:///bench-lrs``, the same backend
      through a cluster with ``lrs_server: self`` (A27; the XdsClient reports
      every second), measured beside (c) in the same run; goal: at most 5 %
      slower.  ``--lrs-only`` measures just (c) and (e), interleaved.

Policy rows (issue 10): the same for listeners whose route carries a retry
policy (``retry_on: unavailable``, 3 retries; it never fires, the backend
always answers) and whose HCM has a fault filter at 0 % (abort and delay),
pyxds and C-core each on the same listener, sync and asyncio.

Each is measured on 1 thread and on 4 threads for ``--seconds`` (default 3).
The backend and the control plane run in their own process, C-core's client
in another (each has its own GIL, as (a) and (c) have theirs).
Prints RPCs/s and the ratios b/a and c/b, and for asyncio pyxds / C-core
xds (the goal's comparison) and pyxds / plain, and for mTLS pyxds / grpcio
TLS and pyxds / C-core xds mTLS.  ``--vs-core N`` measures only pyxds against
C-core's xds:/// channel, interleaved N times (the issue-10 goal, with less
noise than one pass).  ``--cpu N``: client CPU per sequential RPC (every thread
of the client process, each client in a fresh process of its own) of plain
grpcio, C-core xds and pyxds, sync and aio, N rounds, medians and ratios.
Usage: python bench/e2e.py [--tls-only | --vs-core N | --cpu N]
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
EXCLUSIVE = ("grpc.so_reuseport", 0)


def start_backend() -> tuple[grpc.Server, int]:
    handler = grpc.method_handlers_generic_handler(
        "bench.Bench", {"Ping": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}
    )
    # no SO_REUSEPORT (grpcio's default): no other program's server can
    # share the port (tests/e2e/ports.py)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[EXCLUSIVE])
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
import grpc.experimental
sys.path.insert(0, sys.argv[2])
from e2e import rate
if sys.argv[1].endswith("-tls"):
    creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    channel = grpc.secure_channel(sys.argv[1], creds)
else:
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


_CPU = r"""
import asyncio, json, resource, sys, time
sys.path.insert(0, sys.argv[2])
kind, target, count = sys.argv[1], sys.argv[3], int(sys.argv[4])
bootstrap = json.loads(sys.argv[5])
METHOD = "/bench.Bench/Ping"

def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return usage.ru_utime + usage.ru_stime

def sync_channel():
    import grpc
    if kind.startswith("pyxds"):
        import pyxds
        return pyxds.insecure_channel(target, bootstrap=bootstrap)
    return grpc.insecure_channel(target)

def run_sync() -> float:
    channel = sync_channel()
    mc = channel.unary_unary(METHOD)
    for _ in range(300):
        mc(b"x", timeout=10, wait_for_ready=True)
    start = cpu()
    for _ in range(count):
        mc(b"x", timeout=10)
    used = cpu() - start
    channel.close()
    return used

async def run_aio() -> float:
    import grpc.aio
    if kind.startswith("pyxds"):
        import pyxds.aio
        channel = pyxds.aio.insecure_channel(target, bootstrap=bootstrap)
    else:
        channel = grpc.aio.insecure_channel(target)
    mc = channel.unary_unary(METHOD)
    for _ in range(300):
        await mc(b"x", timeout=10, wait_for_ready=True)
    start = cpu()
    for _ in range(count):
        await mc(b"x", timeout=10)
    used = cpu() - start
    await channel.close()
    return used

used = asyncio.run(run_aio()) if kind.endswith("aio") else run_sync()
print(json.dumps(used / count * 1e6), flush=True)
"""


def cpu_per_rpc(
    kind: str, target: str, bootstrap: dict, count: int, env_bootstrap: bool = False
) -> float:
    """Client CPU (user + system, every thread of the client's own process)
    per sequential unary RPC, in microseconds."""
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    if env_bootstrap:
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _CPU, kind, here, target, str(count), json.dumps(bootstrap)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def cpu_rounds(address: str, bootstrap: dict, rounds: int, count: int) -> None:
    """``--cpu ROUNDS``: plain grpcio, C-core's xds:/// and pyxds, each in a
    fresh process of its own, ``count`` sequential RPCs, in an order rotated
    every round; prints each one's median CPU per RPC and the ratios (the
    issue's goal: pyxds within 3 % of plain grpcio)."""
    import statistics

    clients = {
        "plain": ("plain", address, False),
        "C-core xds": ("core", "xds:///bench", True),
        "pyxds": ("pyxds", "xds:///bench", False),
        "plain aio": ("plain-aio", address, False),
        "C-core xds aio": ("core-aio", "xds:///bench", True),
        "pyxds aio": ("pyxds-aio", "xds:///bench", False),
    }
    names = list(clients)
    seen: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        order = names[i % 3 :] + names[: i % 3] if i % 2 == 0 else list(reversed(names))
        for name in order:
            kind, target, env_bootstrap = clients[name]
            seen[name].append(cpu_per_rpc(kind, target, bootstrap, count, env_bootstrap))
    print(f"client CPU per sequential unary RPC (us), median of {rounds} rounds, {count} RPCs")
    medians = {name: statistics.median(values) for name, values in seen.items()}
    for name in names:
        rounds_text = " ".join(f"{v:.0f}" for v in seen[name])
        print(f"{name:<16} {medians[name]:7.1f}   rounds: {rounds_text}")
    for suffix in ("", " aio"):
        plain, core, ours = (medians[f"{n}{suffix}"] for n in ("plain", "C-core xds", "pyxds"))
        print(
            f"{suffix.strip() or 'sync'}: C-core/plain = {core / plain:.3f}   "
            f"pyxds/plain = {ours / plain:.3f}   pyxds/C-core = {ours / core:.3f}"
        )


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


def start_tls_backend(folder: str) -> tuple[grpc.Server, int, dict]:
    """An mTLS backend (client certificates required) and the client's files."""
    from pyxds.testing.certs import CertAuthority, write_files

    ca = CertAuthority("bench CA")
    leaf = ca.issue("backend", ips=("127.0.0.1",), uris=("spiffe://bench/backend",))
    client = write_files(folder, ca.pem, ca.issue("client", uris=("spiffe://bench/client",)))
    handler = grpc.method_handlers_generic_handler(
        "bench.Bench", {"Ping": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[EXCLUSIVE])
    server.add_generic_rpc_handlers((handler,))
    creds = grpc.ssl_server_credentials(
        [(leaf.key, leaf.cert)], root_certificates=ca.pem, require_client_auth=True
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return server, port, client


def serve() -> None:
    """``--serve``: backends + control plane; prints the addresses and
    bootstrap, runs until stdin closes."""
    import tempfile

    from pyxds.server import ManagementServer
    from pyxds.server import builders as b
    from pyxds.server.snapshot import Snapshot

    backend, port = start_backend()
    address = f"127.0.0.1:{port}"
    folder = tempfile.mkdtemp(prefix="pyxds-bench-")
    tls_backend, tls_port, client_files = start_tls_backend(folder)
    tls_address = f"127.0.0.1:{tls_port}"
    tls = b.upstream_tls_context("mesh", "mesh", [{"exact": "spiffe://bench/backend"}])

    retry = b.retry_policy("unavailable", num_retries=3)
    fault = b.fault_filter(
        abort_grpc_status=14, abort_percent=(0, 100), delay=0.1, delay_percent=(0, 100)
    )

    def route(name: str, cluster: str, **route_args):
        return b.route_config(
            f"{name}-route",
            [b.virtual_host("vh", routes=[b.route(prefix="", cluster=cluster, **route_args)])],
        )

    control = ManagementServer().start()
    control.set_snapshot(
        Snapshot(
            listeners=[
                b.listener("bench"),
                b.listener("bench-lrs"),
                b.listener("bench-tls"),
                b.listener("bench-retry"),
                b.listener("bench-fault", http_filters=[fault]),
            ],
            routes=[
                route("bench", "c"),
                route("bench-lrs", "c-lrs"),
                route("bench-tls", "ctls"),
                route("bench-retry", "c", retry_policy=retry),
                route("bench-fault", "c"),
            ],
            clusters=[
                b.cluster("c"),
                b.cluster("c-lrs", lrs_server=True),
                b.cluster("ctls", upstream_tls=tls),
            ],
            endpoints=[
                b.endpoints("c", [b.locality(zone="z", endpoints=[address])]),
                b.endpoints("c-lrs", [b.locality(zone="z", endpoints=[address])]),
                b.endpoints("ctls", [b.locality(zone="z", endpoints=[tls_address])]),
            ],
        )
    )
    providers = {"mesh": {"plugin_name": "file_watcher", "config": client_files}}
    bootstrap = control.bootstrap(node_id="bench", certificate_providers=providers)
    info = {
        "address": address,
        "tls_address": tls_address,
        "client_files": client_files,
        "bootstrap": bootstrap,
    }
    print(json.dumps(info))
    sys.stdout.flush()
    sys.stdin.read()
    control.stop()
    backend.stop(None)
    tls_backend.stop(None)


def tls_rows(info: dict, seconds: float, results: dict) -> None:
    import pyxds._api as pyxds
    from pyxds.security.credentials import xds_channel_credentials

    files = info["client_files"]

    def read(key: str) -> bytes:
        with open(files[key], "rb") as f:
            return f.read()

    own = grpc.ssl_channel_credentials(
        read("ca_certificate_file"), read("private_key_file"), read("certificate_file")
    )
    plain_tls = grpc.secure_channel(info["tls_address"], own)
    results["e grpcio mTLS"] = {str(t): rate(plain_tls, t, seconds) for t in (1, 4)}
    plain_tls.close()
    results["e C-core xds mTLS"] = core_rates(info["bootstrap"], seconds, target="xds:///bench-tls")
    creds = xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    ours = pyxds.secure_channel("xds:///bench-tls", creds, bootstrap=info["bootstrap"])
    results["e pyxds mTLS"] = {str(t): rate(ours, t, seconds) for t in (1, 4)}
    ours.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--lrs-only", action="store_true", help="only pyxds without/with load reporting"
    )
    parser.add_argument("--tls-only", action="store_true", help="only the mTLS rows (e)")
    parser.add_argument(
        "--no-policies", action="store_true", help="skip the retry-policy / 0%% fault rows"
    )
    parser.add_argument(
        "--vs-core",
        type=int,
        metavar="ROUNDS",
        help="only pyxds vs C-core xds (sync and aio), interleaved ROUNDS times",
    )
    parser.add_argument(
        "--cpu",
        type=int,
        metavar="ROUNDS",
        help="only client CPU per RPC: plain grpcio, C-core xds, pyxds, each in its own"
        " process, ROUNDS rounds",
    )
    parser.add_argument("--count", type=int, default=3000, help="RPCs per --cpu client")
    args = parser.parse_args()
    if args.serve:
        serve()
        return

    import grpc.experimental

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
    if args.tls_only:
        tls_rows(info, args.seconds, results)
        server.stdin.close()
        server.wait(10)
        print_tls(results)
        return

    if args.cpu:
        cpu_rounds(address, bootstrap, args.cpu, args.count)
        server.stdin.close()
        server.wait(10)
        return

    if args.vs_core:
        core_pairs(bootstrap, args.seconds, args.vs_core)
        server.stdin.close()
        server.wait(10)
        return

    if args.lrs_only:
        lrs_pair(bootstrap, args.seconds)
        server.stdin.close()
        server.wait(10)
        return

    plain = grpc.insecure_channel(address)
    results["a plain grpcio"] = {str(t): rate(plain, t, args.seconds) for t in (1, 4)}
    plain.close()
    results["b C-core xds"] = core_rates(bootstrap, args.seconds)
    ours = pyxds.insecure_channel("xds:///bench", bootstrap=bootstrap)
    results["c pyxds"] = {str(t): rate(ours, t, args.seconds) for t in (1, 4)}
    ours.close()
    ours_lrs = pyxds.insecure_channel("xds:///bench-lrs", bootstrap=bootstrap)
    results["e pyxds + LRS"] = {str(t): rate(ours_lrs, t, args.seconds) for t in (1, 4)}
    ours_lrs.close()

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
    tls_rows(info, args.seconds, results)
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
            f"   e/c (LRS on/off) = {results['e pyxds + LRS'][t] / c[t]:.2f}"
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
    print_tls(results, results["c pyxds"])


def print_tls(results: dict, plaintext: dict | None = None) -> None:
    if plaintext is None:
        print(f"{'channel':<20} {'1 thread':>10} {'4 threads':>10}   (unary RPCs/s)")
        for name, by in results.items():
            print(f"{name:<20} {by['1']:>10.0f} {by['4']:>10.0f}")
    g, k, p = results["e grpcio mTLS"], results["e C-core xds mTLS"], results["e pyxds mTLS"]
    for t in ("1", "4"):
        line = (
            f"threads={t}: pyxds mTLS/grpcio mTLS = {p[t] / g[t]:.2f}   "
            f"pyxds mTLS/C-core xds mTLS = {p[t] / k[t]:.2f}"
        )
        if plaintext is not None:
            line += f"   pyxds mTLS/pyxds plaintext = {p[t] / plaintext[t]:.2f}"
        print(line)


def lrs_pair(bootstrap: dict, seconds: float, rounds: int = 4) -> None:
    """(c) and (e) interleaved ``rounds`` times, the order swapped every round
    (both channels open all along, sharing one XdsClient), so drift of a
    shared machine hits both alike; rates are the means over the rounds."""
    import pyxds._api as pyxds

    off = pyxds.insecure_channel("xds:///bench", bootstrap=bootstrap)
    on = pyxds.insecure_channel("xds:///bench-lrs", bootstrap=bootstrap)
    totals = {"off": {"1": 0.0, "4": 0.0}, "on": {"1": 0.0, "4": 0.0}}
    for i in range(rounds):
        pair = (("off", off), ("on", on))
        for name, channel in pair if i % 2 == 0 else pair[::-1]:
            for t in ("1", "4"):
                totals[name][t] += rate(channel, int(t), seconds) / rounds
    off.close()
    on.close()
    print(f"{'channel':<20} {'1 thread':>10} {'4 threads':>10}   (unary RPCs/s)")
    print(f"{'c pyxds':<20} {totals['off']['1']:>10.0f} {totals['off']['4']:>10.0f}")
    print(f"{'e pyxds + LRS':<20} {totals['on']['1']:>10.0f} {totals['on']['4']:>10.0f}")
    for t in ("1", "4"):
        print(f"threads={t}: e/c (LRS on/off) = {totals['on'][t] / totals['off'][t]:.3f}")


def core_pairs(bootstrap: dict, seconds: float, rounds: int) -> None:
    """pyxds and C-core's xds:/// channel on the same listener, sync and
    asyncio, interleaved ``rounds`` times with the order swapped every round,
    so that drift of a shared machine hits both alike.  Prints each round's
    pyxds/C-core ratio and their median (the issue's goal is >= 1.0)."""
    import statistics

    import pyxds._api as pyxds
    import pyxds.aio

    def ours_sync() -> dict[str, float]:
        channel = pyxds.insecure_channel("xds:///bench", bootstrap=bootstrap)
        try:
            return {str(t): rate(channel, t, seconds) for t in (1, 4)}
        finally:
            channel.close()

    async def ours_aio_rates() -> dict[str, float]:
        channel = pyxds.aio.insecure_channel("xds:///bench", bootstrap=bootstrap)
        try:
            return {str(t): await aio_rate(channel, t, seconds) for t in (1, 4)}
        finally:
            await channel.close()

    loop = asyncio.new_event_loop()  # grpc.aio keeps to one loop per process
    sides = {
        "sync": (ours_sync, lambda: core_rates(bootstrap, seconds)),
        "aio": (
            lambda: loop.run_until_complete(ours_aio_rates()),
            lambda: core_rates(bootstrap, seconds, _CORE_AIO),
        ),
    }
    ratios: dict[str, list[float]] = {f"{k} {t}": [] for k in sides for t in ("1", "4")}
    for i in range(rounds):
        for kind, (ours, core) in sides.items():
            if i % 2 == 0:
                mine, theirs = ours(), core()
            else:
                theirs, mine = core(), ours()
            for t in ("1", "4"):
                ratios[f"{kind} {t}"].append(mine[t] / theirs[t])
    loop.close()
    print("pyxds / C-core xds:///, unary RPCs/s, per round and median")
    for name, values in ratios.items():
        kind, t = name.split()
        rounds_text = " ".join(f"{v:.2f}" for v in values)
        print(f"{kind:<5} threads={t}: {rounds_text}   median {statistics.median(values):.2f}")


if __name__ == "__main__":
    main()
