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

Run:  python bench/eds_update.py [--endpoints 10000] [--localities 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from pyxds.lb import ConnectivityState, PickComplete, ResolverUpdate, registry
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


class Run:
    def __init__(self, endpoints: int, localities: int) -> None:
        self.per_locality = endpoints // localities
        self.localities = [locality(i, self.per_locality) for i in range(localities)]
        self.helper = FakeHelper()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=10_000)
    parser.add_argument("--localities", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results = measure(args.endpoints, args.localities, args.repeat)
    print(f"EDS update, {args.endpoints} endpoints in {args.localities} localities")
    for label, value in results.items():
        if label.startswith(("recreated", "created")):
            print(f"  {label:40s} {int(value):>8d} subchannels")
        else:
            print(f"  {label:40s} {value:>8.2f} ms")


if __name__ == "__main__":
    main()
