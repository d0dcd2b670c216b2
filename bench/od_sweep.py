"""CPU time of one outlier_detection ejection sweep (gRFC A50) over N
endpoints that all have call volume (both algorithms configured, nothing to
eject): the sweep runs on the channel's serializer every ``interval``, so
it must stay O(endpoints).  Each ``--src`` (``name=path/to/src``; default:
the installed pyxds) runs in its own fresh process, the sources taking
turns round by round; prints the median CPU seconds per sweep and the
ratio to the first source.

Usage: python bench/od_sweep.py [--n 1000 3000 10000] [--rounds 5] [--src NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_SWEEP = r"""
import json, sys, time
import grpc
from pyxds.lb import ResolverUpdate, Status, registry
from pyxds.lb.api import Endpoint
from pyxds.testing import FakeHelper

n = int(sys.argv[1])
body = {
    "childPolicy": [{"round_robin": {}}],
    "maxEjectionPercent": 100,
    "failurePercentageEjection": {"minimumHosts": 5, "requestVolume": 1, "threshold": 90},
    "successRateEjection": {"minimumHosts": 5, "requestVolume": 1},
}
helper = FakeHelper()
factory, config = registry.select([{"outlier_detection_experimental": body}])
policy = factory.build(helper)
endpoints = [Endpoint((f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:80",)) for i in range(n)]
policy.update(ResolverUpdate(endpoints, config))
ok = Status(grpc.StatusCode.OK)
for address in (e.addresses[0] for e in endpoints):
    policy.endpoint_state(address).record(ok)
start = time.process_time()
helper.clock.advance(config.interval)
print(json.dumps(time.process_time() - start))
"""


def run(src: str | None, n: int) -> float:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    out = subprocess.run(
        [sys.executable, "-c", _SWEEP, str(n)], env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--src", action="append", default=[], metavar="NAME=PATH")
    args = parser.parse_args()
    sources = [tuple(s.split("=", 1)) for s in args.src] or [("installed", "")]
    print(f"load: {os.getloadavg()}")
    for n in args.n:
        times: dict[str, list[float]] = {name: [] for name, _ in sources}
        for round_ in range(args.rounds):
            order = sources[round_ % len(sources) :] + sources[: round_ % len(sources)]
            for name, path in order:
                times[name].append(run(path or None, n))
        first = statistics.median(times[sources[0][0]])
        row = [f"N={n}"]
        for name, _ in sources:
            median = statistics.median(times[name])
            row.append(f"{name} {median * 1000:.1f} ms ({median / first:.3f}x)")
        print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
