"""How long an EDS update takes to reach new pickers, and what it recreates.

The tree is the real one on a FakeHelper (no sockets):
cds -> xds_cluster_impl -> priority -> xds_wrr_locality -> weighted_target
-> round_robin, for one EDS cluster of ``--endpoints`` endpoints spread over
``--localities`` localities (one priority).  Subchannels are driven READY.

Measured (best of ``--repeat`` runs, milliseconds, each from ``cds.update()``
to the new picker published on the helper, which is synchronous here):

* ``initial``: the first update (builds every policy and subchannel);
* ``one locality changed``: every endpoint of one locality replaced;
* ``weights only``: one locality's weight changed (no address changes);
* ``same config``: an equal XdsConfig again (must be a no-op);

and, for the one-locality change, how many subchannels were created or shut
down outside that locality (goal: 0; issue 5 "Benchmark").

``--census`` (issue 18 item 4, Python's cyclic GC) prints instead, for the
same tree: the GC-tracked objects per endpoint by type (the tree at
``--endpoints`` minus the tree at a tenth of it), the objects a
one-locality update leaves alive for the collector (new objects still
there after it, by type), and the collections of each generation that
update triggered (``gc.callbacks``).  The FakeHelper keeps only its last
state (a channel keeps only its last picker).

``--compare DIR`` runs this tree and the one under ``DIR/src`` (e.g. ``git
archive main src | tar -x -C DIR``) in alternating subprocesses, ``--rounds``
times, and prints the medians side by side with their ratio.

Run:  python bench/eds_update.py [--endpoints 10000] [--localities 100]
      [--census] [--compare DIR [--rounds 5]]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if "--src" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--src") + 1])
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from scale import _census  # GC-tracked objects by type

from pyxds.lb import ConnectivityState, PickComplete, Picker, ResolverUpdate, Status, registry
from pyxds.resolver.xds_config import (
    XDS_CONFIG_ATTRIBUTE,
    ClusterConfig,
    EndpointConfig,
    XdsConfig,
)
from pyxds.testing import FakeHelper
from pyxds.xds.resources.types import (
    Cluster,
    ClusterLoadAssignment,
    EndpointAddress,
    Listener,
    Locality,
    LocalityName,
    RouteConfiguration,
    VirtualHost,
)

CLUSTER = "bench"
_VHOST = VirtualHost("vh", ("*",), ())
_ROUTES = RouteConfiguration("routes", (_VHOST,))
_LISTENER = Listener("listener", route_config_name="routes")


def locality(index: int, per_locality: int, generation: int = 0, weight: int = 1) -> Locality:
    endpoints = tuple(
        EndpointAddress((f"10.{generation}.{index}.{j // 250}:{8000 + j % 250}",))
        for j in range(per_locality)
    )
    return Locality(LocalityName("region", f"zone-{index:03d}", ""), weight, endpoints)


def xds_config(localities: list[Locality]) -> XdsConfig:
    load = ClusterLoadAssignment(CLUSTER, (tuple(localities),))
    entry = ClusterConfig(Cluster(CLUSTER, "EDS"), EndpointConfig(load))
    return XdsConfig(_LISTENER, _ROUTES, _VHOST, {CLUSTER: entry})


def ready_all(helper: FakeHelper) -> None:
    for subchannel in helper.live_subchannels():
        if subchannel.state is not ConnectivityState.READY:
            subchannel.set_state(ConnectivityState.CONNECTING)
            subchannel.set_state(ConnectivityState.READY)


class LastStateHelper(FakeHelper):
    """Keeps only the last state, as a channel keeps only its last picker."""

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        super().update_state(state, status, picker)
        del self.states[:-1]

    def forget_shut_down(self) -> None:
        """Drop the subchannels shut down (a channel holds only live ones)."""
        self.subchannels = self.live_subchannels()


class Run:
    def __init__(self, endpoints: int, localities: int, last_state_only: bool = False) -> None:
        self.per_locality = endpoints // localities
        self.localities = [locality(i, self.per_locality) for i in range(localities)]
        self.helper = LastStateHelper() if last_state_only else FakeHelper()
        factory, self.config = registry.select([{"cds_experimental": {"cluster": CLUSTER}}])
        self.policy = factory.build(self.helper)

    def update(self, localities: list[Locality]) -> float:
        update = ResolverUpdate((), self.config, {XDS_CONFIG_ATTRIBUTE: xds_config(localities)})
        start = time.perf_counter()
        self.policy.update(update)
        return (time.perf_counter() - start) * 1000.0

    def close(self) -> None:
        self.policy.shutdown()


def measure(endpoints: int, localities: int, repeat: int) -> dict[str, float]:
    best: dict[str, float] = {}
    churn = {"created": 0, "shut_down": 0, "expected": 0}

    def keep(label: str, value: float) -> None:
        best[label] = min(best.get(label, float("inf")), value)

    for _ in range(repeat):
        run = Run(endpoints, localities)
        keep("initial", run.update(run.localities))
        ready_all(run.helper)
        assert isinstance(run.helper.pick(), PickComplete)

        # One locality's endpoints all replaced.
        changed = list(run.localities)
        changed[0] = locality(0, run.per_locality, generation=1)
        before = {id(s) for s in run.helper.subchannels}
        old_addresses = {e.addresses[0] for e in run.localities[0].endpoints}
        states = len(run.helper.states)
        keep("one locality changed", run.update(changed))
        assert len(run.helper.states) > states, "no new picker"
        created = [s for s in run.helper.subchannels if id(s) not in before]
        new_addresses = {e.addresses[0] for e in changed[0].endpoints}
        churn["created"] = sum(1 for s in created if s.address not in new_addresses)
        churn["shut_down"] = sum(
            1
            for s in run.helper.subchannels
            if s.shut_down and id(s) in before and s.address not in old_addresses
        )
        churn["expected"] = len(new_addresses)
        ready_all(run.helper)

        # One locality's weight changed.
        reweighted = list(changed)
        reweighted[1] = locality(1, run.per_locality, weight=5)
        keep("weights only", run.update(reweighted))

        # The same config again (equal value, new objects).
        keep("same config", run.update([*reweighted]))
        run.close()
    best["recreated outside the changed locality"] = churn["created"] + churn["shut_down"]
    best["created for the changed locality"] = churn["expected"]
    return best


def _built(endpoints: int, localities: int) -> Run:
    run = Run(endpoints, localities, last_state_only=True)
    run.update(run.localities)
    ready_all(run.helper)
    return run


def census(endpoints: int, localities: int) -> dict[str, object]:
    """GC-tracked objects per endpoint, and what one-locality updates leave
    for the collector (module docstring)."""
    small = endpoints // 10
    before = _census()
    first = _built(small, localities)
    at_small = _census()
    first.close()
    del first
    gc.collect()
    run = _built(endpoints, localities)
    at_full = _census()
    grown = {k: (v - at_small.get(k, 0)) / (endpoints - small) for k, v in at_full.items()}
    per_type = {k: round(v, 2) for k, v in sorted(grown.items(), key=lambda kv: -kv[1])}
    out: dict[str, object] = {
        "tracked_per_endpoint": round(sum(grown.values()), 1),
        "by_type": {k: v for k, v in per_type.items() if v >= 0.5},
        "tree_objects": sum(at_full.values()) - sum(before.values()),
    }
    collections = [0, 0, 0]
    full_ms: list[float] = []
    began = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
            return
        collections[info["generation"]] += 1
        if info["generation"] == 2:
            full_ms.append(round((time.perf_counter() - began[0]) * 1000, 1))

    # Survivors: objects made by one-locality updates and still alive after.
    changed = list(run.localities)
    seen = {id(obj) for obj in gc.get_objects()}
    gc.callbacks.append(on_gc)
    took = []
    try:
        for generation in range(1, 5):
            changed[generation % 2] = locality(generation % 2, run.per_locality, generation)
            took.append(run.update(list(changed)))
            ready_all(run.helper)
            assert isinstance(run.helper, LastStateHelper)
            run.helper.forget_shut_down()
    finally:
        gc.callbacks.remove(on_gc)
    gc.collect()
    new: dict[str, int] = {}
    for obj in gc.get_objects():
        if id(obj) not in seen:
            name = f"{type(obj).__module__}.{type(obj).__qualname__}"
            new[name] = new.get(name, 0) + 1
    out["update_ms"] = [round(t, 1) for t in took]
    out["left_alive_per_update"] = round(sum(new.values()) / 4)
    out["left_alive_by_type"] = {
        k: v // 4 for k, v in sorted(new.items(), key=lambda kv: -kv[1]) if v >= 40
    }
    out["collections_per_update"] = [round(c / 4, 1) for c in collections]
    out["full_collections_ms"] = full_ms
    run.close()
    return out


def compare(args: argparse.Namespace) -> None:
    trees = {"this": str(Path(__file__).resolve().parent.parent / "src"), "before": ""}
    trees["before"] = os.path.join(args.compare, "src")
    runs: dict[str, list[dict[str, float]]] = {"this": [], "before": []}
    for rnd in range(args.rounds):
        order = ["this", "before"] if rnd % 2 == 0 else ["before", "this"]
        for name in order:
            cmd = [sys.executable, __file__, "--json", "--src", trees[name]]
            cmd += ["--endpoints", str(args.endpoints), "--localities", str(args.localities)]
            cmd += ["--repeat", str(args.repeat)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
            runs[name].append(json.loads(proc.stdout))
    print(f"EDS update, {args.endpoints} endpoints, medians of {args.rounds} alternating rounds")
    print(f"  load average {os.getloadavg()}")
    print(f"  {'':40s} {'before':>10s} {'this':>10s} {'ratio':>7s}")
    for label in runs["this"][0]:
        this = statistics.median(r[label] for r in runs["this"])
        before = statistics.median(r[label] for r in runs["before"])
        ratio = this / before if before else float("nan")
        print(f"  {label:40s} {before:>10.2f} {this:>10.2f} {ratio:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=10_000)
    parser.add_argument("--localities", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--census", action="store_true")
    parser.add_argument("--compare", metavar="DIR")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.census:
        print(json.dumps(census(args.endpoints, args.localities), indent=1))
        return
    if args.compare:
        compare(args)
        return
    results = measure(args.endpoints, args.localities, args.repeat)
    if args.json:
        print(json.dumps(results))
        return
    print(f"EDS update, {args.endpoints} endpoints in {args.localities} localities")
    for label, value in results.items():
        if label.startswith(("recreated", "created")):
            print(f"  {label:40s} {int(value):>8d} subchannels")
        else:
            print(f"  {label:40s} {value:>8.2f} ms")


if __name__ == "__main__":
    main()
