"""Start-up: what a short-lived program (a CLI, a batch job, a test) pays
every run, pyxds next to grpcio, each figure from fresh interpreters.

* import: ``import grpc`` against ``import pyxds``, the sync channel
  (``pyxds.insecure_channel`` named: it loads on first use, with grpc) and
  ``pyxds.aio``, timed inside the new interpreter around the import
  statement alone; the goal (issue 18) is pyxds at most 0.15 s over grpc.
* first RPC: from creating the channel to the end of its first
  ``wait_for_ready`` unary RPC, the library already imported: plain
  grpcio to the backend's address, C-core's ``xds:///`` channel
  (``GRPC_XDS_BOOTSTRAP_CONFIG``) and pyxds's, sync and asyncio, the same
  backend and control plane (``e2e.py --serve``, in a process of its own);
  the goal is pyxds within 1.5x C-core's.  pyxds loads the xDS client,
  its protos and the LB policies a config names on first use (not at
  ``import pyxds``): the rows "modules in" load them before the clock, to
  show the channel's own time apart from that loading.  Then ``close()``
  is timed too (a short-lived program pays it at its end).

Bytecode: an installed package has its ``.pyc`` files; a source tree run
with ``PYTHONDONTWRITEBYTECODE=1`` (as on the team's machines) compiles
every module of pyxds on every start, which costs more than the imports
themselves.  So the children run with bytecode cached under a temporary
``PYTHONPYCACHEPREFIX`` (one warm-up round, not counted), as installed;
``--compile`` measures the other way (no bytecode cache at all).

The kinds run in an order rotated every round; prints each round and the
medians (5 rounds unless ``--rounds``).  Usage: python bench/startup.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_world import world

HERE = os.path.dirname(os.path.abspath(__file__))
METHOD = "/bench.Bench/Ping"

_IMPORT = r"""
import sys, time
start = time.perf_counter()
{code}
print(time.perf_counter() - start)
"""

#: what each import row runs (``import pyxds`` alone loads no channel: the
#: channel loads when ``insecure_channel`` is first named, so that row is the
#: one to hold against ``import grpc``)
IMPORTS = {
    "import grpc": "import grpc",
    "import pyxds": "import pyxds",
    "pyxds.insecure_channel": "import pyxds; pyxds.insecure_channel",
    "pyxds.aio": "import pyxds.aio",
}

_FIRST_RPC = r"""
import json, sys, time
kind, target, bootstrap = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
import grpc
if kind.startswith("pyxds"):
    import pyxds
    pyxds.insecure_channel, pyxds.aio.insecure_channel  # loaded before the clock starts
if "+modules" in kind:  # what an xds: target loads on first use, loaded too
    import pyxds.resolver.xds_resolver, pyxds.xds.client, pyxds.security.providers
    import pyxds.lb.registry
    pyxds.lb.registry.names()
    kind = kind.replace("+modules", "")
if kind.endswith("aio"):
    import asyncio, grpc.aio

    async def first() -> float:
        start = time.perf_counter()
        if kind.startswith("pyxds"):
            channel = pyxds.aio.insecure_channel(target, bootstrap=bootstrap)
        else:
            channel = grpc.aio.insecure_channel(target)
        await channel.unary_unary(METHOD)(b"x", timeout=10, wait_for_ready=True)
        took = time.perf_counter() - start
        start = time.perf_counter()
        await channel.close()
        return took, time.perf_counter() - start

    print(*asyncio.run(first()))
else:
    start = time.perf_counter()
    if kind.startswith("pyxds"):
        channel = pyxds.insecure_channel(target, bootstrap=bootstrap)
    else:
        channel = grpc.insecure_channel(target)
    channel.unary_unary(METHOD)(b"x", timeout=10, wait_for_ready=True)
    took = time.perf_counter() - start
    start = time.perf_counter()
    channel.close()
    print(took, time.perf_counter() - start)
""".replace("METHOD", repr(METHOD))


#: the children's bytecode cache (None: ``--compile``, none at all)
PYCACHE: str | None = None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    if PYCACHE is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = PYCACHE
    return env


def _run_all(args: list[str], env: dict[str, str] | None = None) -> list[float]:
    out = subprocess.run(
        [sys.executable, *args],
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [float(v) for v in out.stdout.strip().splitlines()[-1].split()]


def _run(args: list[str], env: dict[str, str] | None = None) -> float:
    return _run_all(args, env)[0]


def import_time(code: str) -> float:
    return _run(["-c", _IMPORT.format(code=code)])


#: close() times of the first-RPC runs, by kind
CLOSES: dict[str, list[float]] = {}


def first_rpc(kind: str, target: str, bootstrap: dict) -> float:
    env = _env()
    if kind.startswith("core"):
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    took, closing = _run_all(["-c", _FIRST_RPC, kind, target, json.dumps(bootstrap)], env)
    CLOSES.setdefault(kind, []).append(closing)
    return took


def _rounds(jobs: dict, rounds: int) -> dict[str, list[float]]:
    names = list(jobs)
    seen: dict[str, list[float]] = {name: [] for name in names}
    if PYCACHE is not None:
        for name in names:
            jobs[name]()  # warm-up: writes the bytecode cache
    for i in range(rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            seen[name].append(jobs[name]())
    return seen


def _print(seen: dict[str, list[float]]) -> dict[str, float]:
    medians = {}
    for name, values in seen.items():
        medians[name] = statistics.median(values)
        rounds_text = " ".join(f"{v * 1000:.0f}" for v in values)
        print(f"  {name:<22} median {medians[name] * 1000:7.1f} ms   rounds: {rounds_text}")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--compile", action="store_true", help="no bytecode cache: every start compiles"
    )
    args = parser.parse_args()
    global PYCACHE
    if not args.compile:
        PYCACHE = tempfile.mkdtemp(prefix="pyxds-pycache-")
    print("bytecode:", "none (every start compiles)" if args.compile else "cached, as installed")
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")

    print("import (fresh interpreter, the import statement alone):")
    imports = _print(
        _rounds({n: (lambda c=c: import_time(c)) for n, c in IMPORTS.items()}, args.rounds)
    )
    for name in ("import pyxds", "pyxds.insecure_channel", "pyxds.aio"):
        extra = (imports[name] - imports["import grpc"]) * 1000
        print(f"  {name} - import grpc = {extra:.0f} ms")

    with world() as info:
        address, bootstrap = info["address"], info["bootstrap"]
        kinds = {
            "plain grpcio": ("plain", address),
            "C-core xds:///": ("core", "xds:///bench"),
            "pyxds xds:///": ("pyxds", "xds:///bench"),
            "pyxds, xds modules in": ("pyxds+modules", "xds:///bench"),
            "plain grpc.aio": ("plain-aio", address),
            "C-core aio xds:///": ("core-aio", "xds:///bench"),
            "pyxds aio xds:///": ("pyxds-aio", "xds:///bench"),
            "pyxds aio, modules in": ("pyxds+modules-aio", "xds:///bench"),
        }
        jobs = {
            name: (lambda kind=kind, target=target: first_rpc(kind, target, bootstrap))
            for name, (kind, target) in kinds.items()
        }
        print("channel creation to the end of the first wait_for_ready RPC:")
        firsts = _print(_rounds(jobs, args.rounds))
        print("then close() (median, ms):")
        for name, (kind, _) in kinds.items():
            print(f"  {name:<22} {statistics.median(CLOSES[kind]) * 1000:7.1f}")
    for suffix, loaded in (("", "pyxds, xds modules in"), (" aio", "pyxds aio, modules in")):
        core = firsts[f"C-core{suffix} xds:///"]
        ours = firsts[f"pyxds{suffix} xds:///"]
        print(
            f"  pyxds{suffix} / C-core{suffix} first RPC = {ours / core:.2f}"
            f"   (modules already loaded: {firsts[loaded] / core:.2f})"
        )


if __name__ == "__main__":
    main()
