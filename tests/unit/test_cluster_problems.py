"""``cluster_problems``: the clusters of an XdsConfig that cannot serve, in the
words the RPC errors, ``config_dump()`` and ``pyxds serve`` share (issue 22)."""

from __future__ import annotations

import grpc

from pyxds.resolver.cluster_problems import cluster_problems, no_endpoints_words
from pyxds.resolver.xds_config import AggregateConfig, ClusterConfig, EndpointConfig, XdsConfig
from pyxds.status import Status
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

USED = Locality(LocalityName("r", "z", ""), 1, (EndpointAddress(("127.0.0.1:1",)),))


def config(**clusters: ClusterConfig | Status) -> XdsConfig:
    vhost = VirtualHost("vh", ("*",), ())
    return XdsConfig(
        Listener("l", route_config_name="rc"), RouteConfiguration("rc", (vhost,)), vhost, clusters
    )


def leaf(name: str, cla: ClusterLoadAssignment | None, note: str = "") -> ClusterConfig:
    return ClusterConfig(Cluster(name, "EDS"), EndpointConfig(cla, note))


def test_the_docs_example_canary_is_named_with_its_cause():
    canary = ClusterLoadAssignment("canary", (), ignored_localities=(LocalityName(),))
    problems = cluster_problems(
        config(
            main=leaf("main", ClusterLoadAssignment("main", ((USED,),))),
            canary=leaf("canary", canary),
        )
    )
    assert problems == ["cluster canary: no endpoints: locality without weight ignored"]
    assert no_endpoints_words("canary", canary) == problems[0]


def test_every_kind_of_unusable_cluster_is_listed_by_name():
    problems = cluster_problems(
        config(
            b_missing=Status(grpc.StatusCode.UNAVAILABLE, "CDS resource b_missing does not exist"),
            a_unhealthy=leaf(
                "a_unhealthy",
                ClusterLoadAssignment(
                    "a", ((Locality(LocalityName(), 1, ()),),), excluded_endpoints=2
                ),
            ),
            c_no_eds=leaf(
                "c_no_eds",
                None,
                "EDS resource c_no_eds: does not exist (cluster c_no_eds: no endpoints)",
            ),
            d_agg=ClusterConfig(Cluster("d_agg", "AGGREGATE"), AggregateConfig(("a_unhealthy",))),
            e_fine=leaf("e_fine", ClusterLoadAssignment("e", ((USED,),))),
        )
    )
    assert problems == [
        "cluster a_unhealthy: no endpoints: all endpoints unhealthy",
        "cluster b_missing: CDS resource b_missing does not exist",
        "cluster c_no_eds: no endpoints: EDS resource c_no_eds: does not exist",
    ]
