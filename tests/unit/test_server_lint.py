"""``pyxds serve``'s warnings (pyxds.server.lint): configs a gRPC client accepts
but that cannot serve, one line each with file:line and the resource, in file
order (issue 22).  Sans-IO: text in, lines out.

Each case is a resource file whose expected lines are marked ``#<`` on the line
the warning must name; the expected messages are listed in file order.
"""

from __future__ import annotations

import pytest
import yaml

from pyxds.server.files import ResourceFileError, parse_resources
from pyxds.server.lint import Entry, report

HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
T = "type.googleapis.com/envoy.config."


def listener(rds: str = "echo-route", name: str = "echo-service") -> str:
    return f"""\
- "@type": {T}listener.v3.Listener
  name: {name}
  apiListener:
    apiListener:
      "@type": {HCM}
      rds:
        routeConfigName: {rds}
        configSource: {{ads: {{}}, resourceApiVersion: V3}}
      httpFilters:
      - name: router
        typedConfig: {{"@type": {ROUTER}}}
"""


def routes(action: str, name: str = "echo-route") -> str:
    return f"""\
- "@type": {T}route.v3.RouteConfiguration
  name: {name}
  virtualHosts:
  - name: echo
    domains: ["*"]
    routes:
    - match: {{prefix: ""}}
      route:
{action}"""


def cluster(name: str, extra: str = "") -> str:
    return f"""\
- "@type": {T}cluster.v3.Cluster
  name: {name}
  type: EDS
  edsClusterConfig: {{edsConfig: {{ads: {{}}, resourceApiVersion: V3}}}}
{extra}"""


def aggregate(name: str, *children: str) -> str:
    return f"""\
- "@type": {T}cluster.v3.Cluster
  name: {name}
  clusterType:
    name: envoy.clusters.aggregate
    typedConfig:
      "@type": type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig
      clusters: [{", ".join(children)}]  #<
"""


def load(name: str, localities: str) -> str:
    return f"""\
- "@type": {T}endpoint.v3.ClusterLoadAssignment
  clusterName: {name}
  endpoints:
{localities}"""


def locality(
    port: int,
    weight: int | None = 1,
    health: str = "",
    priority: int | None = None,
    mark: str = "",
) -> str:
    """One locality with one endpoint; ``mark`` ("locality" or "weight") puts
    the ``#<`` mark on that line."""
    head = f"  - locality: {{region: r, zone: z{port}}}" + ("  #<" if mark == "locality" else "")
    lines = [head]
    if priority is not None:
        lines.append(f"    priority: {priority}")
    if weight is not None:
        lines.append(f"    loadBalancingWeight: {weight}" + ("  #<" if mark == "weight" else ""))
    lines.append("    lbEndpoints:")
    lines.append(
        f"    - endpoint: {{address: {{socketAddress: {{address: 127.0.0.1, portValue: {port}}}}}}}"
    )
    if health:
        lines.append(f"      healthStatus: {health}")
    return "\n".join(lines) + "\n"


def no_eds(name: str) -> str:
    """An EDS cluster, marked on its edsClusterConfig line."""
    return cluster(name).replace("V3}}\n", "V3}}  #<\n")


ONE = "        cluster: main\n"
GOOD = listener() + routes(ONE) + cluster("main") + load("main", locality(1))


def lines_of(text: str, source: str = "mesh.yaml", severity: str = "warning") -> list[str]:
    entries: list[Entry] = []
    parse_resources(yaml.safe_load("resources:\n" + text), source, True, entries)
    return report(entries, {source: "resources:\n" + text}, severity)


def marked(text: str, source: str = "mesh.yaml") -> list[str]:
    """``source:LINE`` of every ``#<`` mark (the file has a ``resources:`` line first)."""
    return [f"{source}:{i + 2}" for i, line in enumerate(text.splitlines()) if "#<" in line]


CASES = {
    "locality without weight (the docs example's canary)": (
        listener()
        + routes(
            "        weightedClusters:\n"
            "          clusters: [{name: main, weight: 75}, {name: canary, weight: 25}]\n"
        )
        + cluster("main")
        + cluster("canary")
        + load("main", locality(1))
        + load("canary", locality(2, weight=None, mark="locality")),
        [
            "ClusterLoadAssignment canary: endpoints[0].loadBalancingWeight: locality "
            "{region=r, zone=z2} has no loadBalancingWeight: gRPC ignores the locality (A27); "
            "cluster canary: no endpoints: locality without weight ignored",
        ],
    ),
    "locality with weight 0 beside a good one": (
        listener()
        + routes(ONE)
        + cluster("main")
        + load("main", locality(1) + locality(2, weight=0, mark="weight")),
        [
            "ClusterLoadAssignment main: endpoints[1].loadBalancingWeight: locality "
            "{region=r, zone=z2} has loadBalancingWeight 0: gRPC ignores the locality (A27); "
            "its 1 endpoint gets no RPCs",
        ],
    ),
    "every endpoint UNHEALTHY or DRAINING": (
        listener()
        + routes(ONE)
        + cluster("main")
        + load("main", locality(1, health="UNHEALTHY") + locality(2, health="DRAINING")).replace(
            "  endpoints:\n", "  endpoints:  #<\n"
        ),
        [
            "ClusterLoadAssignment main: endpoints: every endpoint is "
            "DRAINING/UNHEALTHY: gRPC uses only UNKNOWN and HEALTHY endpoints (A27); "
            "cluster main: no endpoints: all endpoints unhealthy",
        ],
    ),
    "a ClusterLoadAssignment without endpoints": (
        listener()
        + routes(ONE)
        + cluster("main")
        + f'- "@type": {T}endpoint.v3.ClusterLoadAssignment\n'
        "  clusterName: main\n"
        "  endpoints: []  #<\n",
        [
            "ClusterLoadAssignment main: endpoints: lists no endpoint; "
            "cluster main: no endpoints: no localities"
        ],
    ),
    "an EDS cluster whose ClusterLoadAssignment no file defines": (
        listener() + routes(ONE) + no_eds("main"),
        [
            "Cluster main: edsClusterConfig: ClusterLoadAssignment main is not defined in any "
            "file served with it: clients wait 15 s for it (the does-not-exist timer), then "
            "cluster main: no endpoints: EDS resource main does not exist"
        ],
    ),
    "a route to a cluster no file defines": (
        listener()
        + routes("        cluster: nowhere  #<\n")
        + cluster("main")
        + load("main", locality(1)),
        [
            "RouteConfiguration echo-route: virtualHosts[0].routes[0].route.cluster: cluster "
            "nowhere is not defined in any file served with it: clients wait 15 s for it (the "
            "does-not-exist timer), then the RPCs this route matches fail"
        ],
    ),
    "a listener naming a route configuration no file defines": (
        listener(rds="nowhere").replace("routeConfigName: nowhere", "routeConfigName: nowhere  #<")
        + cluster("main")
        + load("main", locality(1)),
        [
            "Listener echo-service: apiListener.apiListener.rds.routeConfigName: "
            "RouteConfiguration nowhere is not defined in any file served with it: clients "
            "wait 15 s for it (the does-not-exist timer), then every RPC to this listener fails"
        ],
    ),
    "an aggregate cluster whose children are all missing": (
        listener() + routes("        cluster: agg\n") + aggregate("agg", "gone1", "gone2"),
        [
            "Cluster agg: clusterType.typedConfig.clusters: none of its clusters (gone1, gone2) "
            "leads to a leaf cluster defined in any file served with it: clients wait 15 s for "
            "the missing ones (the does-not-exist timer), then its RPCs fail (no leaf cluster, "
            "A74, A75)"
        ],
    ),
    "a weighted cluster entry of weight 0 beside others": (
        listener()
        + routes(
            "        weightedClusters:\n"
            "          clusters:\n"
            "          - {name: main, weight: 1}\n"
            "          - name: canary\n"
            "            weight: 0  #<\n"
        )
        + cluster("main")
        + cluster("canary")
        + load("main", locality(1))
        + load("canary", locality(2)),
        [
            "RouteConfiguration echo-route: virtualHosts[0].routes[0].route.weightedClusters."
            "clusters[1].weight: weight 0: gRPC drops the entry (A28), cluster canary gets no "
            "RPCs from this route"
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_unusable_config_is_one_warning_naming_file_line_and_resource(case):
    text, messages = CASES[case]
    where = marked(text)
    assert lines_of(text) == [f"warning: {w}: {m}" for w, m in zip(where, messages, strict=True)]


def test_a_config_that_serves_has_no_warning():
    assert lines_of(GOOD) == []


def test_an_aggregate_with_one_defined_leaf_has_no_warning():
    text = GOOD.replace("cluster: main", "cluster: agg") + aggregate("agg", "gone", "main")
    assert lines_of(text.replace("  #<", "")) == []


def test_an_aggregate_of_aggregates_without_a_leaf_is_warned_once_per_aggregate():
    text = (
        listener()
        + routes("        cluster: top\n")
        + aggregate("top", "mid", "gone")
        + aggregate("mid", "top")
    )
    found = lines_of(text)
    assert [line.split(": Cluster ")[1].split(":")[0] for line in found] == ["top", "mid"]


def test_a_priority_gap_is_refused_as_a_client_nacks_it_never_warned():
    # C-core and pyxds NACK "priority 1 empty", also when priority 1 holds only
    # localities without weight: refused before any warning.
    gap = load("main", locality(1) + locality(2, weight=None, priority=1) + locality(3, priority=2))
    with pytest.raises(ResourceFileError, match="priority 1 empty"):
        lines_of(listener() + routes(ONE) + cluster("main") + gap)


def test_weights_summing_to_zero_are_refused_not_warned():
    text = (
        listener()
        + routes("        weightedClusters:\n          clusters: [{name: main, weight: 0}]\n")
        + cluster("main")
        + load("main", locality(1))
    )
    with pytest.raises(ResourceFileError, match="a gRPC client would NACK it"):
        lines_of(text)


def test_every_kind_at_once_gives_every_warning_in_file_order():
    # Bad input: all the unusable-but-valid configs in one file.
    text = "".join(
        [
            listener(),
            listener(rds="nowhere", name="second").replace(
                "routeConfigName: nowhere", "routeConfigName: nowhere  #<"
            ),
            routes(
                "        weightedClusters:\n"
                "          clusters:\n"
                "          - {name: main, weight: 3}\n"
                "          - {name: canary, weight: 1}\n"
                "          - {name: ghost, weight: 1}  #<\n"
                "          - {name: agg, weight: 0}  #<\n"
            ),
            cluster("main"),
            cluster("canary"),
            cluster("sick"),
            aggregate("agg", "gone"),
            no_eds("noeds"),
            load("main", locality(1) + locality(2, weight=0, mark="weight")),
            load("canary", locality(3, weight=None, mark="locality")),
            load("sick", locality(4, health="DRAINING")).replace(
                "  endpoints:\n", "  endpoints:  #<\n"
            ),
        ]
    )
    found = lines_of(text)
    assert [line.split(": ", 2)[1] for line in found] == marked(text)
    assert all(line.startswith("warning: mesh.yaml:") for line in found)
    assert "cluster canary: no endpoints: locality without weight ignored" in found[-2]
    assert "cluster sick: no endpoints: all endpoints unhealthy" in found[-1]


def test_files_served_together_count_as_one_and_keep_their_order():
    first = listener() + routes("        cluster: main  \n")
    second = cluster("main") + load("main", locality(1, weight=None, mark="locality"))
    entries: list[Entry] = []
    parse_resources(yaml.safe_load("resources:\n" + first), "a.yaml", True, entries)
    parse_resources(yaml.safe_load("resources:\n" + second), "b.yaml", True, entries)
    found = report(entries, {"a.yaml": "resources:\n" + first, "b.yaml": "resources:\n" + second})
    assert [line.split(": ", 2)[1] for line in found] == marked(second, "b.yaml")


def test_strict_severity_is_an_error_line():
    text, _ = CASES["a route to a cluster no file defines"]
    (line,) = lines_of(text, severity="error")
    assert line.startswith(f"error: {marked(text)[0]}: RouteConfiguration echo-route: ")
