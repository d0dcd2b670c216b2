"""Benchmark: decode + validate big EDS and RDS resources vs a bare protobuf parse.

Builds (in this process) a ClusterLoadAssignment of 10,000 endpoints in 100
localities and a RouteConfiguration of 10,000 routes, then times, on the same
bytes in the same run:

* floor: ``Message.ParseFromString`` alone (protobuf's upb parser);
* decode: ``ResourceType.decode(data, use_memo=False)`` (parse + validate +
  build frozen values), the number the 3x goal is about;
* memo hit: the same resource re-sent (a new but equal bytes object), which
  EDS/RDS answer from the decode memo;
* EDS 1-locality update: the EDS resource with one endpoint of one locality
  changed, after the previous version was decoded (the 99 unchanged
  localities come from the locality memo);
* EDS first decode with memo: a never-seen resource with the locality memo
  on (the memo's bookkeeping cost on a miss).

Prints the best-of-N time of each and the ratio decode / floor.  Run:
``PYTHONPATH=src python bench/xds_parse.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import time

from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.route.v3 import route_pb2

from pyxds.xds.resources import ENDPOINTS, ROUTE_CONFIG


def build_eds(localities: int = 100, per_locality: int = 100, variant: int = 0) -> bytes:
    """The bench EDS resource; ``variant`` > 0 changes one endpoint's port in
    locality ``variant % localities``."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name="bench-cluster")
    n = 0
    for li in range(localities):
        lep = cla.endpoints.add()
        lep.locality.region = "region"
        lep.locality.zone = f"zone-{li % 10}"
        lep.locality.sub_zone = f"sub-{li}"
        lep.load_balancing_weight.value = 1 + li % 7
        lep.priority = li % 2
        for _ in range(per_locality):
            lbe = lep.lb_endpoints.add()
            sa = lbe.endpoint.address.socket_address
            sa.address = f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
            sa.port_value = 8080
            lbe.health_status = 1 if n % 3 else 0
            n += 1
    if variant:
        lbe = cla.endpoints[variant % localities].lb_endpoints[0]
        lbe.endpoint.address.socket_address.port_value = 9000 + variant
    drop = cla.policy.drop_overloads.add()
    drop.category = "throttle"
    drop.drop_percentage.numerator = 5
    return cla.SerializeToString()


def build_rds(routes: int = 10_000) -> bytes:
    rc = route_pb2.RouteConfiguration(name="bench-routes")
    vh = rc.virtual_hosts.add(name="vh", domains=["*"])
    for i in range(routes):
        r = vh.routes.add()
        if i % 10 == 9:
            h = r.match.headers.add(name="x-user")
            h.exact_match = f"user-{i}"
            r.match.prefix = "/"
        else:
            r.match.path = f"/pkg.Service{i % 100}/Method{i}"
        if i % 4 == 3:
            wc = r.route.weighted_clusters
            wc.clusters.add(name=f"cluster-{i % 50}").weight.value = 30
            wc.clusters.add(name=f"cluster-{(i + 1) % 50}").weight.value = 70
        else:
            r.route.cluster = f"cluster-{i % 50}"
    return rc.SerializeToString()


def best_of(fn, data: bytes, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(data)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    cases = [
        (
            "EDS 10k endpoints / 100 localities",
            build_eds(),
            endpoint_pb2.ClusterLoadAssignment,
            ENDPOINTS,
        ),
        ("RDS 10k routes", build_rds(), route_pb2.RouteConfiguration, ROUTE_CONFIG),
    ]
    print(
        f"{'resource':36} {'bytes':>8} {'floor ms':>9} {'decode ms':>10} {'ratio':>7}"
        f" {'memo hit ms':>12}"
    )
    for label, data, cls, rtype in cases:
        result = rtype.decode(data, use_memo=False)
        assert result.error is None, result.error

        def floor(b: bytes, cls=cls) -> None:
            cls().ParseFromString(b)

        def cold(b: bytes, rtype=rtype) -> None:
            rtype.decode(b, use_memo=False)

        def warm(b: bytes, rtype=rtype) -> None:
            # a re-sent resource arrives as a new bytes object: copy so the
            # bytes hash is recomputed as it would be
            rtype.decode(bytes(bytearray(b)))

        t_floor = best_of(floor, data, args.repeat)
        t_decode = best_of(cold, data, args.repeat)
        rtype.decode(data)  # prime the memo
        t_warm = best_of(warm, data, args.repeat)
        print(
            f"{label:36} {len(data):8d} {t_floor * 1e3:9.2f} {t_decode * 1e3:10.2f}"
            f" {t_decode / t_floor:6.1f}x {t_warm * 1e3:12.3f}"
        )
    incremental_eds(args.repeat)


def incremental_eds(repeat: int) -> None:
    """EDS updates that change one locality, and a first decode with the memo on."""
    variants = [build_eds(variant=v) for v in range(1, repeat + 1)]
    ENDPOINTS.clear_memo()
    first = float("inf")
    for v in variants[: max(3, repeat // 4)]:
        ENDPOINTS.clear_memo()
        t0 = time.perf_counter()
        ENDPOINTS.decode(v)
        first = min(first, time.perf_counter() - t0)
    ENDPOINTS.clear_memo()
    ENDPOINTS.decode(build_eds())  # the version the updates follow
    best = float("inf")
    for v in variants:  # each differs from the last in one locality
        t0 = time.perf_counter()
        result = ENDPOINTS.decode(v)
        best = min(best, time.perf_counter() - t0)
        assert result.error is None, result.error
    print(f"EDS first decode with locality memo on: {first * 1e3:.2f} ms")
    print(f"EDS update, 1 of 100 localities changed: {best * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
