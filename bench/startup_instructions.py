"""Instructions of a fresh program's first ``xds:///`` RPC under callgrind:
the repeatable twin of ``startup.py``'s first-RPC rows on a shared, noisy
machine (wall and CPU times move with the load; instruction counts do not).

Each child is ``startup.py``'s first-RPC child (``--pause``): it imports
what that child imports before its clock (grpc, and pyxds with the API it
names), is zeroed there (``callgrind_control -z``), then makes the channel
and its first ``wait_for_ready`` RPC, and is dumped where that child's
clock stops (``callgrind_control -d``): every thread of the process over
exactly that span (``rpc_instructions.counted``).  The backend and control
plane (``e2e.py --serve``) run outside valgrind.  Bytecode as installed:
compile both trees first (``python -m compileall -q src``).

``--before DIR`` adds the pyxds kinds again with pyxds imported from
``DIR/src``; ``--keep`` keeps callgrind's files (one per thread) to
annotate.

Usage: python bench/startup_instructions.py [--rounds 3] [--before DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import rpc_instructions
from bench_world import world
from rpc_instructions import counted
from startup import _FIRST_RPC

KINDS = ("core", "pyxds", "core-aio", "pyxds-aio")


def first_rpc(kind: str, bootstrap: dict, before: str | None) -> float:
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
    args = ["-c", _FIRST_RPC, kind, "xds:///bench", json.dumps(bootstrap), "--pause"]
    total, _ = counted(kind, args, env)
    return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--before", help="source tree of pyxds before a change")
    parser.add_argument(
        "--keep", action="store_true", help="keep callgrind's files (one per thread) to annotate"
    )
    args = parser.parse_args()
    rpc_instructions.KEEP = args.keep
    runs: list[tuple[str, str, str | None]] = []
    for kind in args.kinds.split(","):
        runs.append((kind, kind, None))
        if args.before and kind.startswith("pyxds"):
            runs.append((f"{kind} (before)", kind, args.before))
    seen: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    with world() as info:
        for _ in range(args.rounds):
            for name, kind, before in runs:
                seen[name].append(first_rpc(kind, info["bootstrap"], before))
                print(f"  {name:<20} {seen[name][-1]:8.1f} M", flush=True)
    print("first xds:/// RPC, instructions of every thread (M): median (rounds)")
    for name, values in seen.items():
        rounds_text = " ".join(f"{v:.1f}" for v in values)
        print(f"  {name:<20} {statistics.median(values):8.1f}   ({rounds_text})")


if __name__ == "__main__":
    main()
