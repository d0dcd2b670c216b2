"""The floor under a fresh program's first ``xds:///`` RPC: what the same
work costs with no pyxds at all, beside C-core's and pyxds's first RPC
(issue 18: pyxds within 1.5x C-core's).

Each row is a fresh interpreter that has imported ``grpc`` (and, for the
asyncio rows, ``asyncio`` and ``grpc.aio``) before its clock, then, on the
clock, does the work a first ``xds:///bench`` RPC needs, against the same
backend and control plane (``e2e.py --serve``) as ``startup.py``:

* ``a: protos`` - import the generated ``_pb2`` modules of the four
  resource types (Listener with its HttpConnectionManager,
  RouteConfiguration, Cluster, ClusterLoadAssignment) and of the
  discovery messages, and parse one captured DiscoveryResponse of each
  type with protobuf (``ParseFromString``; each resource unpacked, the
  HttpConnectionManager out of its ``Any``; the Router filter is known by
  its type URL, as pyxds knows it).  The responses
  are the ones the control plane sends this very program: captured once
  (by row b's program) before the rounds.
* ``b: protos+ADS+RPC`` - (a) plus a grpcio ADS stream to the control
  plane (LDS, RDS, CDS, EDS requested one after the other as each answer
  names the next, each ACKed) and then a plain grpcio channel to the
  endpoint EDS gave, for the ``wait_for_ready`` RPC.  The least a protobuf
  xDS client can do.
* ``a2``, ``b2``: (a) and (b) with the classes made from serialized
  ``FileDescriptorProto``s added to upb's pool (pyxds's
  ``descriptors.bin``, read as data), as pyxds loads them: no generated
  module, no pure-Python protobuf runtime.
* ``c: wire+ADS+RPC`` - (b) with a hand-written wire-format reader and
  writer in place of protobuf (no generated module, no descriptor): only
  the fields the first RPC needs.  What a protobuf-free decoder could save
  at the most.

The b and c programs have asyncio twins (``grpc.aio`` stream and channel)
to hold against ``pyxds.aio``.  Wall (``startup.py``'s helpers: fresh
interpreters, bytecode cached as installed, kinds rotated each round) and
instructions of every thread under callgrind (``--instructions``, as
``startup_instructions.py``), medians.

``--account`` splits pyxds's own first RPC instead, under callgrind, in
steps dumped one by one: each module it imports (protobuf's, grpc's,
pyxds's, in the order the imports complete), the descriptor bundle, then
the channel and its first RPC with all of that loaded.

Measured (issue 18, grpcio 1.85, instructions of every thread, M): C-core
35.1 sync / 16.5 aio; pyxds 138.9 / 127.2; a 172.7, a2 33.5, b 190.5,
b2 52.2, c 25.6; aio b 178.0, b2 38.2, c 5.3.  The protobuf floor (b2)
is 1.49x C-core sync and 2.3x aio before any pyxds code runs.

Usage: python bench/startup_floor.py [--rounds 5] [--instructions [--ir-rounds 3]] [--account]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import startup
import startup_instructions
from bench_world import world
from rpc_instructions import callgrind, control, counted

#: a floor program: ``python -c FLOOR kind info.json [--pause]``
FLOOR = r"""
import json, sys, time
kind, info = sys.argv[1], json.load(open(sys.argv[2]))
PAUSE = sys.argv[3:] == ["--pause"]
DEADLINE = 120 if PAUSE else 10
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
TP = "type.googleapis.com/envoy."
LDS, RDS = TP + "config.listener.v3.Listener", TP + "config.route.v3.RouteConfiguration"
CDS, EDS = TP + "config.cluster.v3.Cluster", TP + "config.endpoint.v3.ClusterLoadAssignment"


def pause(step):
    if PAUSE:
        print(step, flush=True)
        sys.stdin.readline()


import grpc
if kind.endswith("aio"):
    import asyncio, grpc.aio
captured = []
if kind in ("a", "a2"):
    with open(info["responses"], "rb") as f:
        captured = [bytes.fromhex(line.decode()) for line in f.read().split()]


def generated_classes():
    # what the four resources and the stream need, as generated modules
    from envoy.service.discovery.v3 import discovery_pb2
    from envoy.config.listener.v3 import listener_pb2
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )
    from envoy.config.route.v3 import route_pb2
    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.config.endpoint.v3 import endpoint_pb2

    return (
        discovery_pb2.DiscoveryRequest,
        discovery_pb2.DiscoveryResponse,
        listener_pb2.Listener,
        hcm_pb2.HttpConnectionManager,
        route_pb2.RouteConfiguration,
        cluster_pb2.Cluster,
        endpoint_pb2.ClusterLoadAssignment,
    )


def bundle_classes():
    # the same classes from serialized FileDescriptorProtos (pyxds's
    # descriptors.bin, read here as data: no pyxds code) added to upb's pool,
    # with no generated module and no pure-Python runtime
    import importlib

    with open(info["bundle"], "rb") as f:
        data = f.read()
    start = data.index(b"\n") + 1
    end = data.index(b"\n", start)
    at = end + 1
    pool = importlib.import_module("google._upb._message").default_pool
    for entry in json.loads(data[start:end])["files"]:
        pool.AddSerializedFile(data[at : at + entry["length"]])
        at += entry["length"]
    from google.protobuf import message

    meta = importlib.import_module("google.protobuf.pyext.cpp_message").GeneratedProtocolMessageType

    def made(name):
        desc = pool.FindMessageTypeByName(name)
        return meta(desc.name, (message.Message,), {"DESCRIPTOR": desc})

    return tuple(
        made("envoy." + name)
        for name in (
            "service.discovery.v3.DiscoveryRequest",
            "service.discovery.v3.DiscoveryResponse",
            "config.listener.v3.Listener",
            "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "config.route.v3.RouteConfiguration",
            "config.cluster.v3.Cluster",
            "config.endpoint.v3.ClusterLoadAssignment",
        )
    )


def protobuf_codec(bundle):
    (
        DiscoveryRequest,
        DiscoveryResponse,
        Listener,
        HttpConnectionManager,
        RouteConfiguration,
        Cluster,
        ClusterLoadAssignment,
    ) = bundle_classes() if bundle else generated_classes()

    def request(type_url, names, version="", nonce="", node=None):
        message = DiscoveryRequest(
            type_url=type_url, resource_names=names, version_info=version, response_nonce=nonce
        )
        if node is not None:
            message.node.id = node
        return message.SerializeToString()

    def response(data):
        # (version, nonce, what the next step needs) of one DiscoveryResponse
        message = DiscoveryResponse.FromString(data)
        value = message.resources[0].value
        if message.type_url == LDS:
            listener = Listener.FromString(value)
            hcm = HttpConnectionManager.FromString(listener.api_listener.api_listener.value)
            found = hcm.rds.route_config_name
        elif message.type_url == RDS:
            route_config = RouteConfiguration.FromString(value)
            found = route_config.virtual_hosts[0].routes[0].route.cluster
        elif message.type_url == CDS:
            cluster = Cluster.FromString(value)
            found = cluster.eds_cluster_config.service_name or cluster.name
        else:
            assignment = ClusterLoadAssignment.FromString(value)
            socket = assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
            found = f"{socket.address}:{socket.port_value}"
        return message.version_info, message.nonce, found

    return request, response


def wire_codec():
    # the wire format by hand: only the fields the first RPC needs

    def fields(data):
        # {field number: [values]}: varints as int, length-delimited as bytes
        out, i, end = {}, 0, len(data)
        while i < end:
            key, i = varint(data, i)
            kind = key & 7
            if kind == 0:
                value, i = varint(data, i)
            elif kind == 2:
                size, i = varint(data, i)
                value, i = data[i : i + size], i + size
            elif kind == 5:
                value, i = data[i : i + 4], i + 4
            elif kind == 1:
                value, i = data[i : i + 8], i + 8
            else:
                raise ValueError(f"wire type {kind}")
            out.setdefault(key >> 3, []).append(value)
        return out

    def varint(data, i):
        value = shift = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, i
            shift += 7

    def put_varint(value):
        out = bytearray()
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
        return bytes(out)

    def put(number, data):
        if isinstance(data, str):
            data = data.encode()
        return put_varint(number << 3 | 2) + put_varint(len(data)) + data

    def one(message, number, default=b""):
        return message.get(number, [default])[0]

    def request(type_url, names, version="", nonce="", node=None):
        out = put(1, version) if version else b""
        if node is not None:
            out += put(2, put(1, node))
        out += b"".join(put(3, name) for name in names) + put(4, type_url)
        return out + (put(5, nonce) if nonce else b"")

    def response(data):
        message = fields(data)
        type_url = one(message, 4).decode()
        value = fields(message[2][0])[2][0]  # Any.value of the first resource
        if type_url == LDS:
            api_listener = fields(fields(one(fields(value), 19))[1][0])[2][0]
            hcm = fields(api_listener)
            found = one(fields(one(hcm, 3)), 2).decode()  # rds.route_config_name
        elif type_url == RDS:
            virtual_host = fields(fields(value)[2][0])
            found = one(fields(one(fields(virtual_host[3][0]), 2)), 1).decode()
        elif type_url == CDS:
            cluster = fields(value)
            found = (one(fields(one(cluster, 3)), 2) or one(cluster, 1)).decode()
        else:
            locality = fields(fields(value)[2][0])
            endpoint = fields(one(fields(locality[2][0]), 1))
            socket = fields(one(fields(one(endpoint, 1)), 1))
            found = f"{one(socket, 2).decode()}:{one(socket, 3, 0)}"
        return one(message, 1).decode(), one(message, 5).decode(), found

    return request, response


def codec():
    if kind in ("c", "c-aio"):
        return wire_codec()
    return protobuf_codec(kind.startswith("b2"))


STEPS = (LDS, RDS, CDS, EDS)


def exchange(send, receive, request, response):
    # LDS, RDS, CDS, EDS one after the other, each ACKed: the endpoint
    name, node = info["listener"], info["node"]
    for type_url in STEPS:
        send(request(type_url, [name], node=node))
        node = None  # on the first request only
        data = receive()
        captured.append(data)
        version, nonce, found = response(data)
        send(request(type_url, [name], version, nonce))
        name = found
    return name


def sync_program():
    if kind in ("a", "a2"):
        _, response = protobuf_codec(kind == "a2")
        for data in captured:
            response(data)
        return None, None
    import queue

    request, response = codec()
    outbox = queue.SimpleQueue()
    ads = grpc.insecure_channel(info["server"])
    stream = ads.stream_stream(ADS)(iter(outbox.get, None))
    endpoint = exchange(outbox.put, lambda: next(stream), request, response)
    channel = grpc.insecure_channel(endpoint)
    channel.unary_unary("/bench.Bench/Ping")(b"x", timeout=DEADLINE, wait_for_ready=True)
    return ads, (outbox, stream, channel)


async def aio_program():
    request, response = codec()
    ads = grpc.aio.insecure_channel(info["server"])
    stream = ads.stream_stream(ADS)()
    name, node = info["listener"], info["node"]
    for type_url in STEPS:  # exchange(), awaited
        await stream.write(request(type_url, [name], node=node))
        node = None
        version, nonce, found = response(await stream.read())
        await stream.write(request(type_url, [name], version, nonce))
        name = found
    channel = grpc.aio.insecure_channel(name)
    await channel.unary_unary("/bench.Bench/Ping")(b"x", timeout=DEADLINE, wait_for_ready=True)
    return ads, channel, stream


pause("READY")
if kind.endswith("aio"):

    async def first():
        start, cpu = time.perf_counter(), time.process_time()
        ads, channel, stream = await aio_program()
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        pause("DONE")
        stream.cancel()
        await channel.close()
        await ads.close()
        return took, 0.0, cpu

    print(*asyncio.run(first()))
else:
    start, cpu = time.perf_counter(), time.process_time()
    ads, held = sync_program()
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    pause("DONE")
    if kind == "capture":
        with open(info["responses"], "wb") as f:
            f.write(b"\n".join(data.hex().encode() for data in captured))
    if held is not None:
        outbox, stream, channel = held
        outbox.put(None)
        stream.cancel()
        channel.close()
        ads.close()
    print(took, 0.0, cpu)
"""

#: pyxds's serialized FileDescriptorProtos, read as data by the "2" rows
BUNDLE = os.path.join(startup.HERE, os.pardir, "src", "pyxds", "xds", "descriptors.bin")
#: row name -> floor kind (``FLOOR``'s argv[1])
FLOORS = {
    "a: protos": "a",
    "a2: bundle protos": "a2",
    "b: protos+ADS+RPC": "b",
    "b2: bundle+ADS+RPC": "b2",
    "c: wire+ADS+RPC": "c",
    "b aio: protos+ADS+RPC": "b-aio",
    "b2 aio: bundle+ADS+RPC": "b2-aio",
    "c aio: wire+ADS+RPC": "c-aio",
}
#: ``startup.py``'s first-RPC rows held beside the floors
FIRSTS = {
    "C-core xds:///": "core",
    "pyxds xds:///": "pyxds",
    "C-core aio xds:///": "core-aio",
    "pyxds aio xds:///": "pyxds-aio",
}


def _info_file(info: dict, folder: str) -> str:
    """The floor programs' argument: control plane, node, listener, and the
    file of captured responses."""
    bootstrap = info["bootstrap"]
    path = os.path.join(folder, "info.json")
    with open(path, "w") as f:
        json.dump(
            {
                "server": bootstrap["xds_servers"][0]["server_uri"],
                "node": bootstrap["node"]["id"],
                "listener": "bench",
                "responses": os.path.join(folder, "responses"),
                "bundle": BUNDLE,
            },
            f,
        )
    return path


def floor_wall(name: str, kind: str, info_path: str) -> float:
    took, _, cpu = startup._run_all(["-c", FLOOR, kind, info_path])
    startup.CPUS.setdefault(name, []).append(cpu)
    return took


def floor_instructions(kind: str, info_path: str) -> float:
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONMALLOC"] = "malloc"
    total, _ = counted(kind, ["-c", FLOOR, kind, info_path, "--pause"], env)
    return total / 1e6


#: ``--account``: pyxds's first RPC in steps, callgrind dumping after each
#: (what each module's import costs, in the order a first RPC completes
#: them, so each step holds that module alone (a package's modules count in
#: the package's step: its ``__init__`` runs first): protobuf's and grpc's,
#: the descriptor bundle, pyxds's; then the channel and its first RPC with
#: all of that in)
ACCOUNT = r"""
import importlib, json, sys
bootstrap, order = json.loads(sys.argv[1]), json.loads(sys.argv[2])


def step(name):
    print(name, flush=True)
    sys.stdin.readline()


import grpc, pyxds
pyxds.insecure_channel
from pyxds import gc_hold
from pyxds.xds import descriptors
step("READY")
for name in [name for name in order if not name.startswith("pyxds.")] + ["bundle"] + [
    name for name in order if name.startswith("pyxds.")
]:
    with gc_hold.held():
        if name == "bundle":
            descriptors._loaded()
            name = "descriptor bundle (files into upb's pool)"
        else:
            parent = name.rpartition(".")[0]
            if parent and parent not in sys.modules:  # its __init__ (and what it loads) too
                name = f"{name}, with package {parent}"
            importlib.import_module(name.partition(",")[0])
    step(name)
channel = pyxds.insecure_channel("xds:///bench", bootstrap=bootstrap)
channel.unary_unary("/bench.Bench/Ping")(b"x", timeout=120, wait_for_ready=True)
step("channel + first RPC, all loaded")
channel.close()
step("END")
"""

#: the same span in a plain child, listing what it imports as each import
#: completes (a finder in front of the others wraps each loader; ``-X
#: importtime`` misses what ``importlib.import_module`` loads)
IMPORT_ORDER = r"""
import json, sys
bootstrap = json.loads(sys.argv[1])
import grpc, pyxds
pyxds.insecure_channel
done = []


class Recorder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        for finder in sys.meta_path[1:]:
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            class Wrapped:
                def __getattr__(self, attr):
                    return getattr(loader, attr)

                def create_module(self, spec):
                    return loader.create_module(spec)

                def exec_module(self, module):
                    run(module)
                    done.append(name)

            spec.loader = Wrapped()
        return spec


sys.meta_path.insert(0, Recorder)
channel = pyxds.insecure_channel("xds:///bench", bootstrap=bootstrap)
channel.unary_unary("/bench.Bench/Ping")(b"x", timeout=10, wait_for_ready=True)
sys.meta_path.remove(Recorder)
channel.close()
print(json.dumps(done))
"""


def import_order(bootstrap: dict) -> list[str]:
    """The modules pyxds's first RPC imports, as each import completes."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ORDER, json.dumps(bootstrap)],
        env=startup._env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # grpc._simple_stubs imports grpc.experimental, which imports it back:
    # it loads only from grpc.experimental (its cost is in that step)
    return [
        name for name in json.loads(out.strip().splitlines()[-1]) if name != "grpc._simple_stubs"
    ]


def account(bootstrap: dict) -> list[tuple[str, float]]:
    """Instructions (every thread, M) of each step of ``ACCOUNT``."""
    order = import_order(bootstrap)
    return stepped(["-c", ACCOUNT, json.dumps(bootstrap), json.dumps(order)])


def stepped(args: list[str]) -> list[tuple[str, float]]:
    """Instructions (every thread, M) of each step of ``python args...``
    under callgrind: it prints ``READY`` (the counters are zeroed), then a
    step's name after each step, then ``END``, waiting for a line on stdin
    after each line it prints."""
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONMALLOC"] = "malloc"
    folder = tempfile.mkdtemp(prefix="pyxds-cg-")
    out_file = os.path.join(folder, "cg.out")
    child = subprocess.Popen(
        [*callgrind(out_file), sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    steps = []
    try:
        while (name := child.stdout.readline().strip()) != "END":
            if not name:
                raise RuntimeError("the accounting child ended early")
            control(["-z" if name == "READY" else "-d", str(child.pid)])
            if name != "READY":
                steps.append(name)
            child.stdin.write("go\n")
            child.stdin.flush()
        child.stdin.close()
        child.wait(300)
    finally:
        if child.poll() is None:
            child.kill()
    costs = []
    for number, name in enumerate(steps, 1):
        total = 0
        for path in glob.glob(f"{out_file}.{number}-*"):
            with open(path) as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("summary:"))
        costs.append((name, total / 1e6))
    if os.environ.get("STEPPED_KEEP"):
        print(f"  callgrind output kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--instructions", action="store_true", help="callgrind rows too")
    parser.add_argument("--ir-rounds", type=int, default=3)
    parser.add_argument(
        "--account", action="store_true", help="only pyxds's first RPC in steps, under callgrind"
    )
    args = parser.parse_args()
    if args.account:
        with world() as info:
            costs = account(info["bootstrap"])
        print("pyxds's first RPC in steps: instructions of every thread (M)")
        for name, cost in costs:
            print(f"  {cost:7.2f}  {name}")
        print(f"  {sum(c for _, c in costs):7.2f}  in all")
        return
    startup.PYCACHE = tempfile.mkdtemp(prefix="pyxds-pycache-")
    folder = tempfile.mkdtemp(prefix="pyxds-floor-")
    print(f"load: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    with world() as info:
        info_path = _info_file(info, folder)
        subprocess.run(
            [sys.executable, "-c", FLOOR, "capture", info_path], env=startup._env(), check=True
        )
        jobs = {
            name: (lambda name=name, kind=kind: floor_wall(name, kind, info_path))
            for name, kind in FLOORS.items()
        }
        for name, kind in FIRSTS.items():
            jobs[name] = lambda name=name, kind=kind: startup.first_rpc(
                name, kind, "xds:///bench", info["bootstrap"]
            )
        print("fresh interpreter, from the clock to the end of the first RPC (wall):")
        walls = startup._print(startup._rounds(jobs, args.rounds))
        print("the same span's CPU time, every thread (median, ms):")
        for name in jobs:
            print(f"  {name:<30} {statistics.median(startup.CPUS[name]) * 1000:7.1f}")
        irs: dict[str, list[float]] = {name: [] for name in jobs}
        if args.instructions:
            for _ in range(args.ir_rounds):
                for name, kind in FLOORS.items():
                    irs[name].append(floor_instructions(kind, info_path))
                for name, kind in FIRSTS.items():
                    irs[name].append(startup_instructions.first_rpc(kind, info["bootstrap"], None))
    print("floor table (medians): wall ms, CPU ms, instructions M (every thread)")
    for name in jobs:
        cpu = statistics.median(startup.CPUS[name]) * 1000
        ir = f"{statistics.median(irs[name]):8.1f}" if irs[name] else "       -"
        rounds_text = " ".join(f"{v:.1f}" for v in irs[name])
        print(f"  {name:<24} {walls[name] * 1000:7.1f} {cpu:7.1f} {ir}   ({rounds_text})")


if __name__ == "__main__":
    main()
