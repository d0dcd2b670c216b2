"""Instructions of a fresh program's first ``xds:///`` RPC under callgrind:
the repeatable twin of ``startup.py``'s first-RPC rows on a shared, noisy
machine (wall and CPU times move with the load; instruction counts do not).

Each child is ``startup.py``'s first-RPC child (``--pause``): it imports
what that child imports before its clock (grpc, and pyxds with the API it
names), is zeroed there (``callgrind_control -z``), then makes the channel
and its first ``wait_for_ready`` RPC, and is dumped where that child's
clock stops (``callgrind_control -d``): every thread of the process over
exactly that span.  The backend and control
plane (``e2e.py --serve``) run outside valgrind.  Bytecode as installed:
compile both trees first (``python -m compileall -q src``).

``--before DIR`` adds the pyxds kinds again with pyxds imported from
``DIR/src``; ``--top N`` prints each kind's N dearest functions
(inclusive, calling thread) to see where the instructions go.

Usage: python bench/startup_instructions.py [--rounds 3] [--before DIR]
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

from bench_world import world
from rpc_instructions import control
from startup import _FIRST_RPC

KINDS = ("core", "pyxds", "core-aio", "pyxds-aio")
KEEP = False


def first_rpc(kind: str, bootstrap: dict, before: str | None, top: int) -> float:
    """Instructions (every thread) from channel creation to the end of the
    first RPC, in millions."""
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONMALLOC"] = "malloc"
    if before:
        env["PYTHONPATH"] = os.path.join(before, "src")
    if kind.startswith("core"):
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
    folder = tempfile.mkdtemp(prefix="pyxds-cg-")
    out_file = os.path.join(folder, "cg.out")
    child = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out_file}",
            "--dump-instr=no",
            "--compress-strings=no",
            "--separate-threads=yes",
            sys.executable,
            "-c",
            _FIRST_RPC,
            kind,
            "xds:///bench",
            json.dumps(bootstrap),
            "--pause",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(os.path.join(folder, "stderr"), "w"),  # noqa: SIM115 - the child's
        env=env,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        for step in ("READY", "DONE"):
            line = child.stdout.readline().strip()
            if line != step:
                with open(os.path.join(folder, "stderr")) as f:
                    raise RuntimeError(f"{kind}: expected {step}, got {line!r}: {f.read()[-2000:]}")
            control(["-z" if step == "READY" else "-d", str(child.pid)])
            child.stdin.write("go\n")
            child.stdin.flush()
        child.wait(300)
    finally:
        if child.poll() is None:
            child.kill()
    total = 0
    for path in glob.glob(out_file + ".1-*"):  # one file per thread
        with open(path) as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("summary:"))
    if top:
        main_thread = glob.glob(out_file + ".1-01")[0]
        report = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", main_thread],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = [line for line in report.splitlines() if "*" in line and ":" in line]
        print("\n".join(rows[:top]))
    if KEEP:
        print(f"  callgrind output kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--before", help="source tree of pyxds before a change")
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument(
        "--keep", action="store_true", help="keep callgrind's files (one per thread) to annotate"
    )
    args = parser.parse_args()
    if args.keep:
        global KEEP
        KEEP = True
    runs: list[tuple[str, str, str | None]] = []
    for kind in args.kinds.split(","):
        runs.append((kind, kind, None))
        if args.before and kind.startswith("pyxds"):
            runs.append((f"{kind} (before)", kind, args.before))
    seen: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    with world() as info:
        for _ in range(args.rounds):
            for name, kind, before in runs:
                seen[name].append(first_rpc(kind, info["bootstrap"], before, args.top))
                print(f"  {name:<20} {seen[name][-1]:8.1f} M", flush=True)
    print("first xds:/// RPC, instructions of every thread (M): median (rounds)")
    for name, values in seen.items():
        rounds_text = " ".join(f"{v:.1f}" for v in values)
        print(f"  {name:<20} {statistics.median(values):8.1f}   ({rounds_text})")


if __name__ == "__main__":
    main()
