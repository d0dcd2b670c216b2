"""Client mTLS cost: pyxds's TLS relay beside grpcio's own xDS mTLS channel.

One backend process serves a plaintext port and an mTLS port (client
certificate required, the mesh CA) and runs the control plane
(pyxds.server): listener ``bench-plain`` routes to a cluster without TLS,
``bench-tls`` to a cluster with an ``UpstreamTlsContext`` (file_watcher
providers, an exact SPIFFE URI SAN matcher).  Each client runs in its own
process (own GIL), kept alive for the whole run:

  grpcio mTLS   grpc.secure_channel("xds:///bench-tls", grpc.xds_channel_credentials(insecure))
                (C-core's own xDS client and TLS: the reference)
  pyxds mTLS    pyxds.secure_channel("xds:///bench-tls", the same credentials)
                (the TLS relay of pyxds.security.relay, SANs checked)
  pyxds plain   pyxds.secure_channel("xds:///bench-plain", the same credentials)
                (the cluster has no TLS context: the insecure fallback)
  grpcio plain  grpc.secure_channel("xds:///bench-plain", the same credentials)
                (``--clients`` adds it: what TLS costs grpcio itself)

Rows (issue 21):

  small1   16-byte unary RPCs, 1 thread                      RPC/s
  small4   16-byte unary RPCs, 4 threads                     RPC/s
  bulk     1 MiB unary RPCs (echoed), 2 threads              MiB/s each way
  stream   one bidi stream of 64 KiB messages (echoed, 8     MiB/s each way
           in flight)

Every round runs every row on every client, one client at a time, the
clients' order rotated each round, so the drift of a shared machine hits
them alike.  Printed: per row the median rate of each client over the
rounds, the median per-round ratio pyxds mTLS / grpcio mTLS and pyxds mTLS
/ pyxds plain, and the CPU time of the client process (all its threads,
``time.process_time``) per RPC or per MiB: on a machine shared with other
work, CPU per unit of work is steadier than the rate.  ``uptime`` is
printed before and after.

Usage: python bench/tls.py [--rounds 5] [--seconds 2] [--rows small1,small4,bulk,stream]
       [--clients "grpcio mTLS,pyxds mTLS,pyxds plain,grpcio plain"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from typing import Any

import grpc

SERVICE = "bench.Tls"
SMALL = b"0123456789abcdef"  # 16 bytes
BULK = 1 << 20
STREAM_MESSAGE = 64 << 10
STREAM_WINDOW = 8
SPIFFE_BACKEND = "spiffe://bench.example/ns/default/sa/backend"
CLIENTS = ("grpcio mTLS", "pyxds mTLS", "pyxds plain")  # and "grpcio plain" on request
ROWS = ("small1", "small4", "bulk", "stream")
OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
]


# -- the backend process ---------------------------------------------------------


def _handler() -> grpc.GenericRpcHandler:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    def chat(requests: Any, context: grpc.ServicerContext) -> Any:
        yield from requests

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
        },
    )


def serve() -> None:
    """``--serve``: both backend ports and the control plane; prints the
    bootstrap and runs until stdin closes."""
    from pyxds.server import ManagementServer
    from pyxds.server import builders as b
    from pyxds.server.snapshot import Snapshot
    from pyxds.testing.certs import CertAuthority, write_files

    folder = tempfile.mkdtemp(prefix="pyxds-bench-tls-")
    ca = CertAuthority("bench mesh CA")
    leaf = ca.issue("backend", uris=(SPIFFE_BACKEND,))
    client = write_files(
        folder, ca.pem, ca.issue("client", uris=("spiffe://bench.example/ns/default/sa/client",))
    )
    # no SO_REUSEPORT: no other program's server can share the ports
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16), options=[*OPTIONS, ("grpc.so_reuseport", 0)]
    )
    server.add_generic_rpc_handlers((_handler(),))
    plain_port = server.add_insecure_port("127.0.0.1:0")
    creds = grpc.ssl_server_credentials(
        [(leaf.key, leaf.cert)], root_certificates=ca.pem, require_client_auth=True
    )
    tls_port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()

    tls = b.upstream_tls_context("mesh", "mesh", [{"exact": SPIFFE_BACKEND}])

    def route(name: str, cluster: str) -> Any:
        return b.route_config(
            f"{name}-route", [b.virtual_host("vh", routes=[b.route(prefix="", cluster=cluster)])]
        )

    control = ManagementServer().start()
    control.set_snapshot(
        Snapshot(
            listeners=[b.listener("bench-plain"), b.listener("bench-tls")],
            routes=[route("bench-plain", "plain"), route("bench-tls", "tls")],
            clusters=[b.cluster("plain"), b.cluster("tls", upstream_tls=tls)],
            endpoints=[
                b.endpoints("plain", [b.locality(zone="z", endpoints=[f"127.0.0.1:{plain_port}"])]),
                b.endpoints("tls", [b.locality(zone="z", endpoints=[f"127.0.0.1:{tls_port}"])]),
            ],
        )
    )
    providers = {"mesh": {"plugin_name": "file_watcher", "config": client}}
    bootstrap = control.bootstrap(node_id="bench-tls", certificate_providers=providers)
    print(json.dumps({"bootstrap": bootstrap}), flush=True)
    sys.stdin.read()
    control.stop()
    server.stop(None)


# -- a client process ------------------------------------------------------------


def _channel(kind: str, bootstrap: dict) -> grpc.Channel:
    import grpc.experimental

    creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    if kind == "grpcio mTLS":
        return grpc.secure_channel("xds:///bench-tls", creds, options=OPTIONS)
    if kind == "grpcio plain":
        return grpc.secure_channel("xds:///bench-plain", creds, options=OPTIONS)
    import pyxds

    target = "xds:///bench-tls" if kind == "pyxds mTLS" else "xds:///bench-plain"
    return pyxds.secure_channel(target, creds, bootstrap=bootstrap, options=OPTIONS)


def _unary(channel: grpc.Channel, payload: bytes, threads: int, seconds: float) -> int:
    echo = channel.unary_unary(f"/{SERVICE}/Echo")
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            echo(payload, timeout=30)
            n += 1
        counts[i] = n

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts)


def _stream(channel: grpc.Channel, seconds: float) -> int:
    """Messages echoed on one bidi stream, ``STREAM_WINDOW`` in flight."""
    chat = channel.stream_stream(f"/{SERVICE}/Chat")
    window = threading.Semaphore(STREAM_WINDOW)
    stop = time.monotonic() + seconds
    message = b"m" * STREAM_MESSAGE

    def requests() -> Any:
        while time.monotonic() < stop:
            window.acquire()
            yield message

    n = 0
    for reply in chat(requests(), timeout=seconds + 30):
        assert len(reply) == STREAM_MESSAGE
        n += 1
        window.release()
    return n


def run_row(channel: grpc.Channel, row: str, seconds: float) -> dict[str, float]:
    """One timed row: units done (RPCs or MiB), wall and process CPU seconds."""
    if row == "stream":
        _stream(channel, 0.3)  # warm-up
    else:
        _unary(channel, SMALL if row.startswith("small") else b"b" * BULK, 1, 0.2)
    cpu0, wall0 = time.process_time(), time.monotonic()
    if row == "small1":
        units = float(_unary(channel, SMALL, 1, seconds))
    elif row == "small4":
        units = float(_unary(channel, SMALL, 4, seconds))
    elif row == "bulk":
        units = float(_unary(channel, b"b" * BULK, 2, seconds))  # 1 MiB each
    else:
        units = _stream(channel, seconds) * STREAM_MESSAGE / float(1 << 20)
    return {
        "units": units,
        "wall": time.monotonic() - wall0,
        "cpu": time.process_time() - cpu0,
    }


def client(kind: str) -> None:
    """``--client KIND``: reads the bootstrap, then one JSON command a line
    (``{"row": ..., "seconds": ...}``), answers each with :func:`run_row`."""
    bootstrap = json.loads(sys.stdin.readline())
    if kind.startswith("grpcio"):
        os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    channel = _channel(kind, bootstrap)
    channel.unary_unary(f"/{SERVICE}/Echo")(SMALL, timeout=30, wait_for_ready=True)
    _unary(channel, SMALL, 1, 0.2)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        print(json.dumps(run_row(channel, cmd["row"], cmd["seconds"])), flush=True)
    channel.close()


# -- the driver --------------------------------------------------------------------


class Client:
    def __init__(self, kind: str, bootstrap: dict) -> None:
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env.pop("GRPC_XDS_BOOTSTRAP_CONFIG", None)
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--client", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(bootstrap) + "\n")
        self.proc.stdin.flush()
        json.loads(self.proc.stdout.readline())

    def run(self, row: str, seconds: float) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"row": row, "seconds": seconds}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"client {self.kind!r} exited")
        result: dict[str, float] = json.loads(line)
        return result

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime: n/a"


UNIT = {"small1": "RPC", "small4": "RPC", "bulk": "MiB", "stream": "MiB"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    if args.client:
        client(args.client)
        return
    rows = [r for r in args.rows.split(",") if r]
    kinds = [k for k in args.clients.split(",") if k]
    print("load before:", uptime(), flush=True)
    backend = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert backend.stdout is not None and backend.stdin is not None
    bootstrap = json.loads(backend.stdout.readline())["bootstrap"]
    clients = {kind: Client(kind, bootstrap) for kind in kinds}
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        row: {kind: [] for kind in kinds} for row in rows
    }
    try:
        for i in range(args.rounds):
            order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
            for row in rows:
                for kind in order:
                    results[row][kind].append(clients[kind].run(row, args.seconds))
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for c in clients.values():
            c.close()
        backend.stdin.close()
        backend.wait(30)
    print("load after: ", uptime())
    report(results, kinds)


def report(results: dict[str, dict[str, list[dict[str, float]]]], kinds: list[str]) -> None:
    def rate(r: dict[str, float]) -> float:
        return r["units"] / r["wall"]

    def cpu_per(r: dict[str, float]) -> float:
        return r["cpu"] / max(r["units"], 1e-9)

    head = "".join(f"{k:>14}" for k in kinds)
    print(f"\nrate (median of rounds){'':<6}{head}")
    for row, by in results.items():
        unit = "RPC/s" if UNIT[row] == "RPC" else "MiB/s"
        cells = "".join(f"{statistics.median(rate(r) for r in by[k]):>14.1f}" for k in kinds)
        print(f"{row:<8} {unit:<20}{cells}")
    print(f"\nCPU per unit (median){'':<8}{head}")
    for row, by in results.items():
        unit = "us/RPC" if UNIT[row] == "RPC" else "ms/MiB"
        scale = 1e6 if UNIT[row] == "RPC" else 1e3
        cells = "".join(
            f"{statistics.median(cpu_per(r) for r in by[k]) * scale:>14.1f}" for k in kinds
        )
        print(f"{row:<8} {unit:<20}{cells}")
    pairs = [
        ("pyxds mTLS", "grpcio mTLS"),
        ("pyxds mTLS", "pyxds plain"),
        ("grpcio mTLS", "grpcio plain"),
    ]
    pairs = [(a, b) for a, b in pairs if a in kinds and b in kinds]
    if not pairs:
        return
    print("\nratios, median of per-round ratios (rate: higher is better for pyxds;")
    print("CPU: the other's CPU per unit / pyxds mTLS's, higher is better for pyxds)")
    for a, b in pairs:
        for row, by in results.items():
            rates = [rate(x) / rate(y) for x, y in zip(by[a], by[b], strict=True)]
            cpus = [cpu_per(y) / cpu_per(x) for x, y in zip(by[a], by[b], strict=True)]
            per_round = " ".join(f"{v:.2f}" for v in rates)
            print(
                f"{a} / {b:<12} {row:<7} rate {statistics.median(rates):.2f}"
                f"  (rounds: {per_round})   CPU {statistics.median(cpus):.2f}"
            )


if __name__ == "__main__":
    main()
