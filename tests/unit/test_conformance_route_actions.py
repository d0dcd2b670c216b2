"""Conformance: A28 route actions through the RDS parser and the
ConfigSelector (the forms ``test_conformance_routing.py`` does not replay):
weighted clusters at the uint32 limit and with a cluster named twice, a
``cluster_header`` route passed over, and actions a client cannot forward.

Sources: C-core ``xds_routing_end2end_test.cc``
(``XdsRoutingWeightedClusterNoIntegerOverflow``, ``ChooseLastRoute``,
``MatchingRouteHasNoRouteAction``), A28 "Route Action" (weighted clusters:
the sum of the weights; ``cluster_header``: the route is ignored), grpc-go
``xds_resolver_test.go`` ``TestConfigSelector_FailureCases``; the
differential twins are in ``tests/e2e/test_differential_route_actions.py``.
"""

from __future__ import annotations

import random
from collections import Counter

from pyxds.resolver.config_selector import (
    NON_FORWARDING_MESSAGE,
    ClusterRef,
    XdsConfigSelector,
)
from pyxds.server import builders as b
from pyxds.xds.resources.route_config import decode_route_configuration

UINT32_MAX = 2**32 - 1


def selector(*routes, rng=None, refs=None):
    """The ConfigSelector of a route configuration of these Route messages,
    decoded as an RDS resource (``refs``: the clusters' references, by name)."""
    rc = b.route_config("rds", [b.virtual_host("vh", routes=list(routes))])
    _, parsed, error = decode_route_configuration(rc.SerializeToString())
    assert error is None, error
    vh = parsed.virtual_hosts[0]
    if refs is None:
        refs = {n: ClusterRef(n, lambda: None) for n in ("a", "b")}
    return XdsConfigSelector(vh, refs, rng=rng or random.Random(5))


def weighted(*entries):
    """A catch-all route over weighted clusters given as (name, weight)
    pairs (a name may repeat)."""
    return b.route(prefix="", weighted_clusters=entries)


def shares(sel, n=20_000) -> dict[str, float]:
    counts: Counter = Counter()
    for _ in range(n):
        call = sel.select("/svc/M", ())
        counts[call.call_attributes["cluster"].removeprefix("cluster:")] += 1
        call.on_committed()
    return {k: v / n for k, v in counts.items()}


def test_weights_summing_to_uint32_max_split_without_overflow():
    """C-core XdsRoutingWeightedClusterNoIntegerOverflow: weights MAX/3 and
    MAX - MAX/3 (their sum exactly uint32 max) split one third / two thirds."""
    first = UINT32_MAX // 3
    got = shares(selector(weighted(("a", first), ("b", UINT32_MAX - first))))
    assert abs(got["a"] - 1 / 3) < 0.02
    assert abs(got["b"] - 2 / 3) < 0.02


def test_the_last_weight_unit_at_uint32_max_goes_to_the_last_cluster():
    """The draw is over [0, sum): a draw just below 1.0 lands in the last
    entry even when the sum is uint32 max (no rounding past the end)."""

    class Top(random.Random):
        def random(self) -> float:
            return 1.0 - 2**-53

    sel = selector(weighted(("a", UINT32_MAX - 1), ("b", 1)), rng=Top())
    call = sel.select("/svc/M", ())
    assert call.call_attributes["cluster"] == "cluster:b"


def test_a_cluster_named_twice_in_weighted_clusters_gets_both_weights():
    """A28: each entry is drawn by its weight; two entries naming cluster a
    (1 + 1) against b (2) send half the RPCs to a, every one holding a
    reference on a."""
    refs = {n: ClusterRef(n, lambda: None) for n in ("a", "b")}
    sel = selector(weighted(("a", 1), ("b", 2), ("a", 1)), refs=refs)
    got = shares(sel)
    assert abs(got["a"] - 0.5) < 0.02
    call = sel.select("/svc/M", ())
    name = call.call_attributes["cluster"].removeprefix("cluster:")
    assert refs[name].count == 1
    call.on_committed()
    assert refs[name].count == 0


def test_a_cluster_header_route_is_passed_over_for_the_next_route():
    """C-core ChooseLastRoute / A28: a route whose action names its cluster
    by header (``cluster_header``) is ignored, so an RPC it would match
    takes the next route."""
    first = b.route(prefix="", cluster="a")
    first.route.ClearField("cluster")
    first.route.cluster_header = "x-cluster"
    sel = selector(first, b.route(prefix="", cluster="b"))
    assert sel.route_count == 1
    call = sel.select("/svc/M", [("x-cluster", "a")])
    assert call.call_attributes["cluster"] == "cluster:b"


def test_a_matching_route_a_client_cannot_forward_fails_and_does_not_fall_through():
    """C-core MatchingRouteHasNoRouteAction (and grpc-go
    TestConfigSelector_FailureCases): the first matching route decides; a
    redirect, a direct response or a non-forwarding action fails the RPC
    UNAVAILABLE "Matching route has inappropriate action" although a later
    catch-all route would forward it."""
    for kind in ("redirect", "direct_response", "non_forwarding_action"):
        first = b.route(prefix="/svc/", cluster="a")
        first.ClearField("route")
        getattr(first, kind).SetInParent()
        sel = selector(first, b.route(prefix="", cluster="b"))
        call = sel.select("/svc/M", ())
        assert call.status is not None, kind
        assert (call.status.code.name, call.status.details) == (
            "UNAVAILABLE",
            NON_FORWARDING_MESSAGE,
        ), kind
        assert sel.select("/other/M", ()).call_attributes["cluster"] == "cluster:b"
