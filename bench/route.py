"""ns per ConfigSelector.select for 10, 1,000 and 10,000 routes.

Tables:

* ``path``: every route an exact path (``/svcN/Method``), RPCs spread over
  all routes;
* ``prefix``: every route a service prefix (``/svcN/``), RPCs spread over
  all routes;
* ``mixed``: a header-matched canary route in front of every fourth
  service's prefix route (``x-canary: 1``), RPCs with and without the
  header, and the worst case: a path matching nothing (falls through).

Each RPC takes and releases its cluster reference (``on_committed``), as
the channel does.  Plus, when the LB policies are installed, the whole
RPC-side path: select + xds_cluster_manager -> cds -> xds_cluster_impl ->
priority -> xds_wrr_locality -> weighted_target -> round_robin pick over a
100-locality cluster (``--full``, default on).

Usage: ``python bench/route.py [--rounds N] [--no-full]``
"""

from __future__ import annotations

import argparse
import random
import time
from types import MappingProxyType

from pyxds.resolver.config_selector import ClusterRef, XdsConfigSelector
from pyxds.xds.resources.types import (
    HeaderMatcher,
    PathMatch,
    PrefixMatch,
    Route,
    RouteAction,
    RouteMatch,
    VirtualHost,
)

SIZES = (10, 1_000, 10_000)


def _refs(names):
    return {n: ClusterRef(n, lambda: None) for n in names}


def table(kind: str, n: int) -> tuple[XdsConfigSelector, list[tuple[str, list]]]:
    routes = []
    calls: list[tuple[str, list]] = []
    clusters = [f"c{i % 50}" for i in range(n)]
    for i in range(n):
        cluster = clusters[i]
        if kind == "path":
            routes.append(Route(RouteMatch(PathMatch(f"/svc{i}/Method")), RouteAction(cluster)))
            calls.append((f"/svc{i}/Method", []))
        elif kind == "prefix":
            routes.append(Route(RouteMatch(PrefixMatch(f"/svc{i}/")), RouteAction(cluster)))
            calls.append((f"/svc{i}/Get", []))
        else:
            if i % 4 == 0:
                canary = HeaderMatcher("x-canary", "exact", "1")
                routes.append(
                    Route(
                        RouteMatch(PrefixMatch(f"/svc{i}/"), headers=(canary,)),
                        RouteAction("canary"),
                    )
                )
                calls.append((f"/svc{i}/Get", [("x-canary", "1"), ("x-user", "u")]))
                calls.append((f"/svc{i}/Get", [("x-user", "u")]))
            routes.append(Route(RouteMatch(PrefixMatch(f"/svc{i}/")), RouteAction(cluster)))
            calls.append((f"/svc{i}/Get", []))
    if kind == "mixed":
        routes.append(Route(RouteMatch(PrefixMatch("/")), RouteAction("default")))
        calls.append(("/nomatch/Get", [("x-user", "u")]))
    names = {r.action.cluster for r in routes}
    vhost = VirtualHost("bench", ("*",), tuple(routes))
    return XdsConfigSelector(vhost, _refs(names), None, random.Random(1)), calls


def measure(selector: XdsConfigSelector, calls, rounds: int) -> float:
    rng = random.Random(2)
    sample = [calls[rng.randrange(len(calls))] for _ in range(2000)]
    select = selector.select
    for path, md in sample:  # warm the per-path plans
        select(path, md).on_committed()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for path, md in sample:
            select(path, md).on_committed()
        best = min(best, (time.perf_counter_ns() - start) / len(sample))
    return best


def full_path(rounds: int) -> float | None:
    """select + the whole LB tree pick for a 100-locality EDS cluster."""
    try:
        from pyxds.lb import registry
        from pyxds.lb.api import (
            OK_STATUS,
            ConnectivityState,
            PickArgs,
            PickComplete,
            ResolverUpdate,
        )
        from pyxds.resolver.xds_config import ClusterConfig, EndpointConfig, XdsConfig
        from pyxds.resolver.xds_resolver import cluster_manager_config
        from pyxds.testing import FakeHelper
        from pyxds.xds.resources.types import (
            Cluster,
            ClusterLoadAssignment,
            EndpointAddress,
            Listener,
            Locality,
            LocalityName,
            RouteConfiguration,
        )
    except ImportError:
        return None
    localities = tuple(
        Locality(LocalityName("r", f"z{i}", ""), 1, (EndpointAddress((f"10.0.{i}.1:80",)),))
        for i in range(100)
    )
    cla = ClusterLoadAssignment("c", (localities,))
    routes = tuple(Route(RouteMatch(PrefixMatch(f"/svc{i}/")), RouteAction("c")) for i in range(10))
    vhost = VirtualHost("v", ("*",), routes)
    rc = RouteConfiguration("rc", (vhost,))
    xds_config = XdsConfig(
        Listener("l", route_config=rc),
        rc,
        vhost,
        {"c": ClusterConfig(Cluster("c", "EDS"), EndpointConfig(cla))},
    )
    helper = FakeHelper()
    selection = registry.select_policy([cluster_manager_config(["c"])])
    lb = selection.factory.build(helper)
    lb.update(ResolverUpdate((), selection.config, MappingProxyType({"xds_config": xds_config})))
    for subchannel in list(helper.subchannels):
        subchannel.set_state(ConnectivityState.READY)
    picker = helper.last.picker
    selector = XdsConfigSelector(vhost, _refs(["c"]), None, random.Random(1))
    args_cache = {}
    best = float("inf")
    paths = [f"/svc{i}/Get" for i in range(10)]
    result = None
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for i in range(2000):
            path = paths[i % 10]
            call = selector.select(path, ())
            args = args_cache.get(path)
            if args is None:
                args = args_cache[path] = PickArgs(path, (), call.call_attributes)
            result = picker.pick(args)
            if isinstance(result, PickComplete) and result.on_call_done is not None:
                result.on_call_done(OK_STATUS)
            call.on_committed()
        best = min(best, (time.perf_counter_ns() - start) / 2000)
    if not isinstance(result, PickComplete):
        print(f"  (full path did not complete a pick: {result})")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-full", action="store_true")
    args = parser.parse_args()
    print(f"{'table':8} {'routes':>7} {'ns/select':>10}")
    for kind in ("path", "prefix", "mixed"):
        for n in SIZES:
            selector, calls = table(kind, n)
            ns = measure(selector, calls, args.rounds)
            print(f"{kind:8} {selector.route_count:7d} {ns:10.0f}")
    if not args.no_full:
        ns = full_path(args.rounds)
        if ns is None:
            print("full RPC-side path: LB policies not available")
        else:
            print(f"full RPC-side path (10 routes, 100 localities): {ns:.0f} ns/RPC")


if __name__ == "__main__":
    main()
