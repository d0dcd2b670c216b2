"""xDS-enabled server RPC rate: pyxds (sync and aio) against grpcio's own
``grpc.server(xds=True)`` (issue 20), on the same Listener from the same
control plane, with the same client.

The Listener is istiod's STRICT shape (mTLS from the ``file_watcher``
provider ``default``) with an RBAC ALLOW filter of 20 rules: 19 policies
whose principal never matches the client (SPIFFE IDs of other namespaces,
paths, headers) and, last by name, the one that allows it, so every RPC
walks the whole policy.  Handlers echo bytes (generic handlers).

Two measures per round: the RPC rate, and the server process's CPU time
per RPC (from /proc), inverted so that higher is better (the rate a server
reaches with the CPU it gets); on a loaded machine the second is steadier.

A reference row, ``aio-plain``, is a plain ``grpc.aio.server`` with the same
mTLS (grpcio's ``ssl_server_credentials``) and no xDS, no RBAC: grpcio has
no xDS aio server, so ``pyxds-aio/aio-plain`` shows what pyxds adds to
grpc.aio, and ``pyxds-aio/core`` what grpc.aio costs against grpcio's
thread server.

Each server runs in its own process, and so does the client (a grpcio mTLS
channel, ``--threads`` threads of blocking unary RPCs), so no two share a
GIL.  Rounds are interleaved (the order swaps each round) and each round
prints its own ratios; the summary is the median.  Goal: >= 0.9x of C-core.

``--drain N``: instead, N Listener updates that change the port's TLS
(identity provider ``default`` <-> ``other``) while 4 clients make RPCs:
failed RPCs per update, pyxds sync vs C-core.  ``--in-place N``: updates
that only change RBAC (pyxds applies them in place, C-core drains).

Usage: python bench/xds_server.py [--rounds 3] [--seconds 3] [--threads 4]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ports import HeldPort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))

METHOD = "/bench.Bench/Ping"
TEMPLATE = "grpc/server?xds.resource.listening_address=%s"
CLIENT_ID = "spiffe://mesh.example/ns/bench/sa/client"

_SERVER = r"""
import asyncio, json, sys, grpc
from concurrent import futures
kind, address, boot = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
handler = grpc.method_handlers_generic_handler(
    "bench.Bench", {"Ping": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)})
creds = grpc.xds_server_credentials(grpc.insecure_server_credentials())
if kind == "core":
    import os
    server = grpc.server(futures.ThreadPoolExecutor(16), xds=True)
    server.add_generic_rpc_handlers((handler,))
    server.add_secure_port(address, creds)
    server.start()
    print(address.rsplit(":", 1)[1], flush=True)
    sys.stdin.read()
elif kind == "aio-plain":
    files = json.loads(sys.argv[4])
    read = lambda p: open(p, "rb").read()
    pair = (read(files["private_key_file"]), read(files["certificate_file"]))
    ca = read(files["ca_certificate_file"])
    tls = grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=True)
    async def ping(req, ctx):
        return req
    aio_handler = grpc.method_handlers_generic_handler(
        "bench.Bench", {"Ping": grpc.unary_unary_rpc_method_handler(ping)})
    async def main():
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # port 0: ours alone
        server.add_generic_rpc_handlers((aio_handler,))
        print(server.add_secure_port(address, tls), flush=True)
        await server.start()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(None)
    asyncio.run(main())
elif kind == "pyxds":
    import pyxds
    server = pyxds.xds_server(futures.ThreadPoolExecutor(16), bootstrap=boot)
    server.add_generic_rpc_handlers((handler,))
    print(server.add_secure_port(address, creds), flush=True)
    server.start()
    sys.stdin.read()
    server.stop(None).wait(5)
else:
    import pyxds
    async def ping(req, ctx):
        return req
    aio_handler = grpc.method_handlers_generic_handler(
        "bench.Bench", {"Ping": grpc.unary_unary_rpc_method_handler(ping)})
    async def main():
        server = pyxds.aio.xds_server(bootstrap=boot)
        server.add_generic_rpc_handlers((aio_handler,))
        print(server.add_secure_port(address, creds), flush=True)
        await server.start()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(None)
    asyncio.run(main())
"""

_CLIENT = r"""
import json, sys, threading, time, grpc
address, seconds, threads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
files = json.loads(sys.argv[4])
read = lambda p: open(p, "rb").read()
creds = grpc.ssl_channel_credentials(read(files["ca"]), read(files["key"]), read(files["cert"]))
opts = [("grpc.ssl_target_name_override", "echo.mesh.example")]
channel = grpc.secure_channel(address, creds, options=opts)
ping = channel.unary_unary("/bench.Bench/Ping")
deadline = time.monotonic() + 30
while True:
    try:
        ping(b"x", timeout=2)
        break
    except grpc.RpcError as e:
        if time.monotonic() > deadline:
            print(json.dumps({"error": str(e)})); sys.exit(1)
        time.sleep(0.2)
counts = [0] * threads
errors = [0] * threads
stop = time.monotonic() + seconds
def run(i):
    while time.monotonic() < stop:
        try:
            ping(b"x", timeout=5)
            counts[i] += 1
        except grpc.RpcError:
            errors[i] += 1
ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
start = time.monotonic()
[t.start() for t in ts]
[t.join() for t in ts]
elapsed = time.monotonic() - start
print(json.dumps({"rate": sum(counts) / elapsed, "count": sum(counts), "errors": sum(errors)}))
"""


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rbac_policies(ib):
    """20 rules: 19 that never match the client, then the one that does."""
    from pyxds.server import builders as b

    policies = {}
    for i in range(19):
        if i % 3 == 0:
            rule = ib.rbac_policy(
                principals=[ib.principal_name(exact=f"spiffe://mesh.example/ns/other{i}/sa/x")]
            )
        elif i % 3 == 1:
            rule = ib.rbac_policy(
                permissions=[ib.path_rule(exact=f"/other{i}.Svc/Method")],
                principals=[ib.authenticated()],
            )
        else:
            rule = ib.rbac_policy(
                permissions=[ib.header_rule(b.header_matcher(f"x-rule-{i}", exact="yes"))]
            )
        policies[f"p{i:02d}"] = rule
    policies["p19-client"] = ib.rbac_policy(principals=[ib.principal_name(exact=CLIENT_ID)])
    return policies


class Bench:
    def __init__(self) -> None:
        from pyxds.server import ManagementServer
        from pyxds.testing.certs import CertAuthority, write_files

        self.folder = tempfile.mkdtemp(prefix="pyxds-bench-")
        ca = CertAuthority("bench CA")
        self.server_files = write_files(
            os.path.join(self.folder, "server"),
            ca.pem,
            ca.issue("echo", dns=("echo.mesh.example",)),
        )
        self.other_files = write_files(
            os.path.join(self.folder, "other"),
            ca.pem,
            ca.issue("echo-2", dns=("echo.mesh.example",)),
        )
        client = write_files(
            os.path.join(self.folder, "client"), ca.pem, ca.issue("client", uris=(CLIENT_ID,))
        )
        self.client_files = {
            "ca": client["ca_certificate_file"],
            "cert": client["certificate_file"],
            "key": client["private_key_file"],
        }
        self.control = ManagementServer().start()
        self._held: dict[int, HeldPort] = {}  # server pid -> its port's hold

    def bootstrap(self, node: str) -> dict:
        providers = {
            name: {"plugin_name": "file_watcher", "config": dict(files, refresh_interval="60s")}
            for name, files in (("default", self.server_files), ("other", self.other_files))
        }
        return self.control.bootstrap(
            node,
            server_listener_resource_name_template=TEMPLATE,
            certificate_providers=providers,
        )

    def listener(self, address: str, identity: str = "default", policies=None):
        from pyxds.server import inbound as ib

        lis = ib.istio_inbound_listener(
            address, strict=True, allow=policies if policies is not None else _rbac_policies(ib)
        )
        lis.name = TEMPLATE.replace("%s", address)
        if identity != "default":
            from pyxds.server.builders import pack

            chain = lis.filter_chains[0]
            ctx = ib.downstream_tls(identity, "default", True, ca_cert="ROOTCA")
            chain.transport_socket.typed_config.CopyFrom(pack(ctx))
        return lis

    def start_server(self, kind: str) -> tuple[subprocess.Popen, str]:
        from ports import HeldPort

        from pyxds.server import Snapshot

        node = f"bench-{kind}-{time.monotonic_ns()}"
        # grpcio's xDS server binds (with SO_REUSEPORT) only once its Listener
        # arrives: a fixed port, held shared until the server stops, so that
        # no other program's server can share it (tests/e2e/ports.py).  The
        # others bind port 0 and print the port.
        held = HeldPort(shared=True) if kind == "core" else None
        port = held.port if held is not None else 0
        boot = self.bootstrap(node)
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(boot)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _SERVER,
                kind,
                f"127.0.0.1:{port}",
                json.dumps(boot),
                json.dumps(self.server_files),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        if held is not None:
            self._held[proc.pid] = held
        assert proc.stdout is not None
        address = f"127.0.0.1:{proc.stdout.readline().strip()}"
        self.node = node
        self.control.set_snapshot(Snapshot(listeners=[self.listener(address)]), node_id=node)
        return proc, address

    def publish(self, address: str, **kwargs) -> None:
        from pyxds.server import Snapshot

        self.control.set_snapshot(
            Snapshot(listeners=[self.listener(address, **kwargs)]), node_id=self.node
        )

    def stop_server(self, proc: subprocess.Popen) -> None:
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=5)
        held = self._held.pop(proc.pid, None)
        if held is not None:
            held.release()

    def rate(self, kind: str, seconds: float, threads: int) -> tuple[float, float]:
        """(RPCs/s, server CPU seconds per RPC)."""
        proc, address = self.start_server(kind)
        try:
            cpu_before = _cpu_seconds(proc.pid)
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _CLIENT,
                    address,
                    str(seconds),
                    str(threads),
                    json.dumps(self.client_files),
                ],
                capture_output=True,
                text=True,
                timeout=seconds + 60,
            )
            cpu = _cpu_seconds(proc.pid) - cpu_before
            result = json.loads(out.stdout.strip().splitlines()[-1])
            if "error" in result or result.get("errors"):
                raise RuntimeError(f"{kind}: {result}")
            return float(result["rate"]), cpu / max(1, int(result["count"]))
        finally:
            self.stop_server(proc)

    def churn(self, kind: str, updates: int, change_tls: bool) -> collections.Counter:
        """Failed RPCs while ``updates`` Listener updates are applied."""
        import grpc
        from xds_server_fixtures import Client

        from pyxds.server import inbound as ib

        proc, address = self.start_server(kind)
        pem = {}
        for what in ("ca", "key", "cert"):
            with open(self.client_files[what], "rb") as f:
                pem[what] = f.read()
        creds = grpc.ssl_channel_credentials(pem["ca"], pem["key"], pem["cert"])
        outcomes: collections.Counter = collections.Counter()
        try:
            deadline = time.monotonic() + 30
            with Client(address, creds) as probe:
                while not probe.call(METHOD).startswith("OK") and time.monotonic() < deadline:
                    time.sleep(0.2)
            stop = threading.Event()

            def run() -> None:
                with Client(address, creds) as client:
                    while not stop.is_set():
                        outcomes[client.call(METHOD, wait_for_ready=True).split(":")[0]] += 1

            workers = [threading.Thread(target=run) for _ in range(4)]
            for w in workers:
                w.start()
            for i in range(updates):
                time.sleep(0.7)
                if change_tls:
                    self.publish(address, identity="other" if i % 2 == 0 else "default")
                else:
                    policies = _rbac_policies(ib)
                    policies[f"extra-{i}"] = ib.rbac_policy(
                        principals=[ib.principal_name(exact=f"spiffe://x/{i}")]
                    )
                    self.publish(address, policies=policies)
            time.sleep(1.0)
            stop.set()
            for w in workers:
                w.join(10)
        finally:
            self.stop_server(proc)
        return outcomes

    def close(self) -> None:
        self.control.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--drain", type=int, default=0)
    parser.add_argument("--in-place", type=int, default=0)
    args = parser.parse_args()
    print(f"load: {os.getloadavg()}")
    bench = Bench()
    try:
        if args.drain or args.in_place:
            for kind in ("core", "pyxds"):
                n = args.drain or args.in_place
                got = bench.churn(kind, n, change_tls=bool(args.drain))
                ok = got.pop("OK", 0)
                what = "TLS-changing" if args.drain else "RBAC-only"
                print(
                    f"{kind:6s} {n} {what} Listener updates: {ok} RPCs OK, failed: {dict(got)} "
                    f"({sum(got.values()) / n:.2f} per update)"
                )
            return
        names = ("pyxds/core", "pyxds-aio/core", "pyxds-aio/aio-plain")
        ratios: dict[str, list[float]] = {n: [] for n in names}
        cpu_ratios: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            order = ["core", "pyxds", "pyxds-aio", "aio-plain"]
            if r % 2:
                order.reverse()
            got = {kind: bench.rate(kind, args.seconds, args.threads) for kind in order}
            for name in names:
                a, b = name.split("/")
                ratios[name].append(got[a][0] / got[b][0])
                # The rate a server reaches with the CPU it has is the inverse
                # of its CPU per RPC: b's CPU per RPC over a's.
                cpu_ratios[name].append(got[b][1] / got[a][1])
            print(
                f"round {r + 1}: "
                + ", ".join(f"{k} {v[0]:.0f}/s {v[1] * 1e6:.0f} us CPU/RPC" for k, v in got.items())
            )
            print(
                "  rate ratios: "
                + ", ".join(f"{k} {v[-1]:.2f}" for k, v in ratios.items())
                + "; CPU ratios: "
                + ", ".join(f"{k} {v[-1]:.2f}" for k, v in cpu_ratios.items())
            )
        print(
            "median rate ratios: "
            + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in ratios.items())
        )
        print(
            "median CPU ratios (server CPU per RPC, inverted): "
            + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in cpu_ratios.items())
            + f" (goal >= 0.90 vs core); load {os.getloadavg()}"
        )
    finally:
        bench.close()


if __name__ == "__main__":
    main()
