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
  show the channel's own time apart from that loading.  Each child names
  only the API it uses before the clock (a sync program never loads
  ``pyxds.aio``, an asyncio one never the sync channel), so the plain
  rows count all the loading a fresh program pays.  Then ``close()``
  is timed too (a short-lived program pays it at its end).  Next to the
  wall time, the process's CPU time over the same span (every thread):
  it moves far less with the machine's load.
* a whole program: import + first RPC, summed per kind from the medians
  (``import grpc`` + C-core's first RPC against the pyxds row that names
  the channel + pyxds's first RPC), by wall time and by CPU time (the
  imports' CPU is measured as the first RPC's is: on a loaded machine it
  moves far less than the wall time).

Before/after a change: ``--before DIR`` (a source tree, e.g. ``git archive
main src | tar -x -C DIR``) adds the pyxds rows again with pyxds imported
from ``DIR/src``, interleaved with the others in every round.

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
start, cpu = time.perf_counter(), time.process_time()
{code}
print(time.perf_counter() - start, time.process_time() - cpu)
"""

#: what each import row runs (``import pyxds`` alone loads no channel: the
#: channel loads when ``insecure_channel`` is first named, so that row is the
#: one to hold against ``import grpc``)
IMPORTS = {
    "import grpc": "import grpc",
    "import pyxds": "import pyxds",
    "pyxds.insecure_channel": "import pyxds; pyxds.insecure_channel",
    "pyxds.aio": "import pyxds.aio",
    "import grpc.aio": "import grpc.aio",
}

#: a first-RPC child's imports before its clock (``kind``: ``core``,
#: ``pyxds``, ``plain``, ``-aio`` at the end for asyncio): grpc, and pyxds
#: with the API the program uses (first_rpc_timeline.py's child too)
LIBRARY = r"""
import grpc
if kind.startswith("pyxds"):
    import pyxds
    # the API the program uses, loaded before the clock starts
    if kind.endswith("aio"):
        pyxds.aio.insecure_channel
    else:
        pyxds.insecure_channel
"""

_FIRST_RPC = r"""
import json, sys, time
kind, target, bootstrap = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
PAUSE = sys.argv[4:] == ["--pause"]  # startup_instructions.py: wait at each step
DEADLINE = 120 if PAUSE else 10  # valgrind is ~50x slower


def pause(step):
    if PAUSE:
        print(step, flush=True)
        sys.stdin.readline()

__LIBRARY__
if "+modules" in kind:  # what an xds: target loads on first use, loaded too
    import pyxds.resolver.xds_resolver, pyxds.xds.client, pyxds.security.providers
    import pyxds.xds.bootstrap, pyxds.lb.registry
    pyxds.lb.registry.names()
    kind = kind.replace("+modules", "")
if kind.endswith("aio"):
    import asyncio, grpc.aio
pause("READY")
if kind.endswith("aio"):

    async def first() -> float:
        start, cpu = time.perf_counter(), time.process_time()
        if kind.startswith("pyxds"):
            channel = pyxds.aio.insecure_channel(target, bootstrap=bootstrap)
        else:
            channel = grpc.aio.insecure_channel(target)
        await channel.unary_unary(METHOD)(b"x", timeout=DEADLINE, wait_for_ready=True)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        pause("DONE")
        start = time.perf_counter()
        await channel.close()
        return took, time.perf_counter() - start, cpu

    print(*asyncio.run(first()))
else:
    start, cpu = time.perf_counter(), time.process_time()
    if kind.startswith("pyxds"):
        channel = pyxds.insecure_channel(target, bootstrap=bootstrap)
    else:
        channel = grpc.insecure_channel(target)
    channel.unary_unary(METHOD)(b"x", timeout=DEADLINE, wait_for_ready=True)
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    pause("DONE")
    start = time.perf_counter()
    channel.close()
    print(took, time.perf_counter() - start, cpu)
""".replace("METHOD", repr(METHOD)).replace("__LIBRARY__\n", LIBRARY)


#: the children's bytecode cache (None: ``--compile``, none at all)
PYCACHE: str | None = None
#: ``--before DIR``: the source tree the "(before)" rows import pyxds from
BEFORE: str | None = None


def _env(before: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    if before:
        assert BEFORE is not None
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.join(BEFORE, "src"), env.get("PYTHONPATH")) if p
        )
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


def import_time(name: str, code: str, before: bool = False) -> float:
    took, cpu = _run_all(["-c", _IMPORT.format(code=code)], _env(before))
    IMPORT_CPUS.setdefault(name, []).append(cpu)
    return took


#: close() times and CPU times of the first-RPC runs, by row
CLOSES: dict[str, list[float]] = {}
CPUS: dict[str, list[float]] = {}
#: CPU times of the import rows, by row
IMPORT_CPUS: dict[str, list[float]] = {}


def first_rpc(name: str, kind: str, target: str, bootstrap: dict, before: bool = False) -> float:
    env = _env(before)
    if kind.startswith("core"):
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    took, closing, cpu = _run_all(["-c", _FIRST_RPC, kind, target, json.dumps(bootstrap)], env)
    CLOSES.setdefault(name, []).append(closing)
    CPUS.setdefault(name, []).append(cpu)
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
        print(f"  {name:<30} median {medians[name] * 1000:7.1f} ms   rounds: {rounds_text}")
    return medians


def _before(rows: dict, names: tuple[str, ...]) -> dict:
    """``rows`` plus, with ``--before``, a "(before)" twin of each of ``names``."""
    if BEFORE is None:
        return rows
    out = {}
    for name, value in rows.items():
        out[name] = value
        if name in names:
            out[f"{name} (before)"] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--compile", action="store_true", help="no bytecode cache: every start compiles"
    )
    parser.add_argument("--before", help="source tree of pyxds before a change (see above)")
    args = parser.parse_args()
    global PYCACHE, BEFORE
    if not args.compile:
        PYCACHE = tempfile.mkdtemp(prefix="pyxds-pycache-")
    BEFORE = args.before
    print("bytecode:", "none (every start compiles)" if args.compile else "cached, as installed")
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")

    print("import (fresh interpreter, the import statement alone):")
    pyxds_imports = ("import pyxds", "pyxds.insecure_channel", "pyxds.aio")
    import_rows = _before(dict(IMPORTS), pyxds_imports)
    imports = _print(
        _rounds(
            {
                n: (lambda n=n: import_time(n, import_rows[n], n.endswith("(before)")))
                for n in import_rows
            },
            args.rounds,
        )
    )
    for name in import_rows:
        if name.startswith(pyxds_imports):
            extra = (imports[name] - imports["import grpc"]) * 1000
            print(f"  {name} - import grpc = {extra:.0f} ms")
    print("the imports' CPU time (median, ms):")
    import_cpus = {name: statistics.median(IMPORT_CPUS[name]) for name in import_rows}
    for name in import_rows:
        print(f"  {name:<30} {import_cpus[name] * 1000:7.1f}")

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
        kinds = _before(kinds, tuple(n for n in kinds if n.startswith("pyxds")))
        jobs = {
            name: (
                lambda name=name, kind=kind, target=target: first_rpc(
                    name, kind, target, bootstrap, name.endswith("(before)")
                )
            )
            for name, (kind, target) in kinds.items()
        }
        print("channel creation to the end of the first wait_for_ready RPC (wall):")
        firsts = _print(_rounds(jobs, args.rounds))
        print("the same span's CPU time, every thread of the process (median, ms):")
        for name in kinds:
            print(f"  {name:<30} {statistics.median(CPUS[name]) * 1000:7.1f}")
        print("then close() (median, ms):")
        for name in kinds:
            print(f"  {name:<30} {statistics.median(CLOSES[name]) * 1000:7.1f}")
    for tag in ("", " (before)") if BEFORE else ("",):
        for suffix, loaded, api in (
            ("", "pyxds, xds modules in", "pyxds.insecure_channel"),
            (" aio", "pyxds aio, modules in", "pyxds.aio"),
        ):
            core = firsts[f"C-core{suffix} xds:///"]
            ours = firsts[f"pyxds{suffix} xds:///{tag}"]
            grpc_import = imports["import grpc.aio" if suffix else "import grpc"]
            program = (imports[api + tag] + ours) / (grpc_import + core)
            cpu = statistics.median(CPUS[f"pyxds{suffix} xds:///{tag}"])
            cpu_core = statistics.median(CPUS[f"C-core{suffix} xds:///"])
            grpc_cpu = import_cpus["import grpc.aio" if suffix else "import grpc"]
            program_cpu = (import_cpus[api + tag] + cpu) / (grpc_cpu + cpu_core)
            print(
                f"  pyxds{suffix}{tag} / C-core{suffix} first RPC = {ours / core:.2f}"
                f"   (modules already loaded: {firsts[loaded + tag] / core:.2f};"
                f" whole program, import + first RPC: {program:.2f};"
                f" by CPU time: {program_cpu:.2f})"
            )


if __name__ == "__main__":
    main()
