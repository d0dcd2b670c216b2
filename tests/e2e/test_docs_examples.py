"""Every resource-file example in the docs serves what it routes to (issue 22).

The docs' YAML/JSON blocks that are resource files (a list of resources with
``"@type"``, or a mapping with ``resources``) and the files of docs/examples/
are what a new user copies first.  Each one is:

1. loaded as ``pyxds serve`` loads it (the client's validation) and linted:
   no warning (pyxds.server.lint: a locality without weight, a route to a
   cluster no file defines, ...);
2. served by a real ManagementServer with every endpoint rewritten to its own
   real backend on 127.0.0.1 (a fragment, an example without a Listener, is
   completed first: a listener routing to each of its clusters by header, and
   a ClusterLoadAssignment for each EDS cluster without one);
3. called through a pyxds channel and through grpcio's C-core ``xds:///``
   channel, route by route (an RPC built to match each route): every cluster a
   route can reach must receive RPCs, through both clients alike.

A docs example that breaks (the docs/serve.md canary whose only locality had
no ``loadBalancingWeight``: a quarter of the RPCs failed) fails here.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from concurrent import futures
from functools import partial
from typing import Any

import grpc
import pytest
import yaml
from channel_fixtures import CoreXdsClient, wait_until
from ports import EXCLUSIVE

import pyxds._api as pyxds
from pyxds.lb import registry as lb_registry
from pyxds.server import ManagementServer
from pyxds.server.files import parse_resources
from pyxds.server.lint import Entry, report
from pyxds.server.types import CLUSTER, CLUSTER_LOAD_ASSIGNMENT, FIELD_OF_TYPE, LISTENER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
EXAMPLES = os.path.join(DOCS, "examples")
HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
ROUTE_CONFIGURATION = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
#: The route a completed fragment uses to reach a cluster.
CLUSTER_HEADER = "docs-example-cluster"
#: An example's cluster that a route reaches with weight share ``w`` is missed
#: by N RPCs with probability (1 - w)^N; N is chosen to keep that below this.
MISS = 1e-6


# -- the examples -------------------------------------------------------------


def _is_resource_file(data: Any) -> bool:
    if isinstance(data, dict) and "resources" in data:
        data = data["resources"]
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(e, dict) and e.get("@type") in FIELD_OF_TYPE for e in data)
    )


def docs_examples() -> dict[str, str]:
    """``"page.md:LINE"`` (the block's first line, 0-based) or ``"examples/NAME"``
    -> text (a page's block preceded by blank lines: its lines are the page's)."""
    found = {}
    fence = re.compile(r"^```(ya?ml|json)\s*\n(.*?)^```", re.M | re.S)
    for name in sorted(os.listdir(DOCS)):
        if not name.endswith(".md"):
            continue
        with open(os.path.join(DOCS, name), encoding="utf-8") as f:
            page = f.read()
        for match in fence.finditer(page):
            text = match.group(2)
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                continue  # not YAML (shell output, a JSON fragment with comments, ...)
            if _is_resource_file(data):
                # Blank lines before the block: the lint's lines are the page's.
                first = page.count("\n", 0, match.start(2))
                found[f"{name}:{first}"] = "\n" * first + text
    for name in sorted(os.listdir(EXAMPLES)):
        if name.endswith((".yaml", ".yml", ".json")):
            with open(os.path.join(EXAMPLES, name), encoding="utf-8") as f:
                found[f"examples/{name}"] = f.read()
    return found


EXAMPLES_FOUND = docs_examples()


def test_the_known_examples_are_found():
    """The discovery cannot silently find nothing: these pages hold resource files."""
    pages = {key.split(":")[0] for key in EXAMPLES_FOUND}
    assert {"serve.md", "server.md", "custom-policy.md", "examples/mesh.yaml"} <= pages


def test_the_serve_page_shows_the_example_file_it_names():
    (serve,) = [text for key, text in EXAMPLES_FOUND.items() if key.startswith("serve.md:")]
    assert serve.lstrip("\n") == EXAMPLES_FOUND["examples/mesh.yaml"]


# -- backends that answer any method --------------------------------------------


class Backends:
    """One grpcio server per endpoint of the example, each answering any
    unary method with its own name; ``served[name]`` counts its RPCs."""

    def __init__(self) -> None:
        self.served: collections.Counter[str] = collections.Counter()
        self._servers: list[grpc.Server] = []

    def start(self, name: str) -> int:
        served = self.served

        class AnyMethod(grpc.GenericRpcHandler):
            def service(self, details: Any) -> Any:
                def answer(request: bytes, context: Any) -> bytes:
                    served[name] += 1
                    return name.encode()

                return grpc.unary_unary_rpc_method_handler(answer)

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[EXCLUSIVE])
        server.add_generic_rpc_handlers((AnyMethod(),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._servers.append(server)
        return port

    def stop(self) -> None:
        for server in self._servers:
            server.stop(None).wait(5)


# -- completing and rewriting an example ------------------------------------------


def _resources(text: str) -> list[dict[str, Any]]:
    data = yaml.safe_load(text)
    return copy.deepcopy(data["resources"] if isinstance(data, dict) else data)


def _name(resource: dict[str, Any]) -> str:
    return resource.get("name") or resource.get("clusterName") or resource.get("cluster_name")


def _complete(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A fragment (no Listener) made servable: a listener ``docs-example``
    routing header ``docs-example-cluster: NAME`` to each cluster, and a
    ClusterLoadAssignment for each EDS cluster without one."""
    if any(r["@type"] == LISTENER for r in resources):
        return resources
    clusters = [r for r in resources if r["@type"] == CLUSTER]
    loads = {_name(r) for r in resources if r["@type"] == CLUSTER_LOAD_ASSIGNMENT}
    out = [
        {
            "@type": LISTENER,
            "name": "docs-example",
            "apiListener": {
                "apiListener": {
                    "@type": HCM,
                    "rds": {
                        "routeConfigName": "docs-example-route",
                        "configSource": {"ads": {}, "resourceApiVersion": "V3"},
                    },
                    "httpFilters": [{"name": "router", "typedConfig": {"@type": ROUTER}}],
                }
            },
        },
        {
            "@type": ROUTE_CONFIGURATION,
            "name": "docs-example-route",
            "virtualHosts": [
                {
                    "name": "docs",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {
                                "prefix": "",
                                "headers": [{"name": CLUSTER_HEADER, "exactMatch": _name(c)}],
                            },
                            "route": {"cluster": _name(c)},
                        }
                        for c in clusters
                    ],
                }
            ],
        },
        *resources,
    ]
    for c in clusters:
        eds = (c.get("edsClusterConfig") or {}).get("serviceName") or _name(c)
        if c.get("type") == "EDS" and eds not in loads:
            out.append(
                {
                    "@type": CLUSTER_LOAD_ASSIGNMENT,
                    "clusterName": eds,
                    "endpoints": [
                        {
                            "locality": {"region": "docs"},
                            "loadBalancingWeight": 1,
                            "lbEndpoints": [
                                {
                                    "endpoint": {
                                        "address": {
                                            "socketAddress": {
                                                "address": "127.0.0.1",
                                                "portValue": 1,
                                            }
                                        }
                                    }
                                }
                            ],
                        }
                    ],
                }
            )
    return out


def _rewrite_endpoints(resources: list[dict[str, Any]], backends: Backends) -> dict[str, set[str]]:
    """Point every lb_endpoint at its own new backend; ``{EDS name: {backend names}}``."""
    owners: dict[str, set[str]] = {}
    for r in resources:
        if r["@type"] != CLUSTER_LOAD_ASSIGNMENT:
            continue
        for li, locality in enumerate(r.get("endpoints") or []):
            for ei, lb_endpoint in enumerate(locality.get("lbEndpoints") or []):
                name = f"{_name(r)}/{li}/{ei}"
                socket = lb_endpoint["endpoint"]["address"]["socketAddress"]
                socket["address"] = "127.0.0.1"
                socket["portValue"] = backends.start(name)
                owners.setdefault(_name(r), set()).add(name)
    return owners


def _leaves(name: str, clusters: dict[str, dict[str, Any]], seen: set[str]) -> list[str]:
    """The EDS clusters an RPC routed to cluster ``name`` can end at."""
    if name in seen or name not in clusters:
        return []
    seen.add(name)
    typed = ((clusters[name].get("clusterType") or {}).get("typedConfig")) or {}
    if "clusters" in typed:
        return [leaf for child in typed["clusters"] for leaf in _leaves(child, clusters, seen)]
    return [name]


# -- routes: an RPC that matches each ------------------------------------------------


def _rpc_for(match: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """(method path, metadata) that ``match`` (a RouteMatch in JSON form) matches."""
    if "path" in match:
        method = match["path"]
    elif "prefix" in match:
        prefix = match["prefix"]
        method = prefix + ("x" if prefix.endswith("/") else "/docs.Example/Call")
        method = method if method.startswith("/") else "/docs.Example/Call"
    else:
        raise AssertionError(f"the docs test cannot build an RPC for route match {match}")
    metadata = []
    for header in match.get("headers") or []:
        name = header["name"]
        if "exactMatch" in header:
            metadata.append((name, header["exactMatch"]))
        elif "prefixMatch" in header:
            metadata.append((name, header["prefixMatch"] + "x"))
        elif header.get("presentMatch"):
            metadata.append((name, "1"))
        else:
            raise AssertionError(f"the docs test cannot build a header for {header}")
    return method, metadata


def _route_targets(route: dict[str, Any]) -> list[tuple[str, float]]:
    """(cluster, share of the route's RPCs) for each cluster the route sends to."""
    action = route.get("route") or {}
    if "cluster" in action:
        return [(action["cluster"], 1.0)]
    weighted = (action.get("weightedClusters") or {}).get("clusters") or []
    total = sum(int(w.get("weight", 0)) for w in weighted)
    return [(w["name"], int(w["weight"]) / total) for w in weighted if int(w.get("weight", 0))]


def _plan(resources: list[dict[str, Any]]) -> list[tuple[str, str, list, list]]:
    """(target, method, metadata, [(cluster, share)]) for every route of every
    API listener's route configuration."""
    configs = {_name(r): r for r in resources if r["@type"] == ROUTE_CONFIGURATION}
    plan = []
    for listener in (r for r in resources if r["@type"] == LISTENER):
        hcm = listener["apiListener"]["apiListener"]
        config = hcm.get("routeConfig") or configs[hcm["rds"]["routeConfigName"]]
        for vhost in config["virtualHosts"]:
            for route in vhost["routes"]:
                method, metadata = _rpc_for(route["match"])
                plan.append((f"xds:///{_name(listener)}", method, metadata, _route_targets(route)))
    return plan


# -- the test -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@contextlib.contextmanager
def docs_policies() -> Iterator[None]:
    """The custom policy docs/custom-policy.md registers (docs/examples/), for
    the pyxds client; ``pyxds serve`` runs without it."""
    sys.path.insert(0, EXAMPLES)
    try:
        from least_recent_policy import LeastRecentFactory

        lb_registry.register(LeastRecentFactory())
        try:
            yield
        finally:
            lb_registry.unregister("least_recent")
    finally:
        sys.path.remove(EXAMPLES)


def _pyxds_counts(channel: Any, method: str, metadata: list, n: int) -> collections.Counter:
    call = channel.unary_unary(method)
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(n):
        try:
            counts[call(b"", timeout=5, metadata=metadata or None).decode()] += 1
        except grpc.RpcError as err:
            counts[f"error:{err.code().name}: {err.details()}"] += 1
    return counts


@pytest.mark.parametrize("key", sorted(EXAMPLES_FOUND))
def test_docs_example_lints_clean_and_every_routed_cluster_gets_rpcs_alike(key, server):
    text = EXAMPLES_FOUND[key]
    # 1. As `pyxds serve` loads it (without the docs' custom policies): valid
    # for a client, and (a complete example) no warning.
    assert lb_registry.get("least_recent") is None
    entries: list[Entry] = []
    page = "docs/" + key.split(":")[0]
    parse_resources(yaml.safe_load(text), page, True, entries)
    if any(e.type_url == LISTENER for e in entries):
        assert report(entries, {page: text}) == [], f"{key}: pyxds serve warns about it"
    # 2. Served, completed if a fragment, every endpoint its own backend.
    with docs_policies():
        _serve_and_call(key, text, server)


def _serve_and_call(key: str, text: str, server: ManagementServer) -> None:
    resources = _complete(_resources(text))
    backends = Backends()
    owners = _rewrite_endpoints(resources, backends)
    clusters = {_name(r): r for r in resources if r["@type"] == CLUSTER}
    node = "docs-" + re.sub(r"[^a-z0-9]+", "-", key.lower())
    entries = []
    snapshot = parse_resources({"resources": resources}, key, True, entries)
    assert report(entries, {}) == [], f"{key}: the completed example has warnings"
    server.set_snapshot(snapshot, node_id=node)
    bootstrap = server.bootstrap(node_id=node)
    core = CoreXdsClient(bootstrap)
    channels: dict[str, Any] = {}
    try:
        for target, method, metadata, targets in _plan(resources):
            channel = channels.get(target)
            if channel is None:
                channel = channels[target] = pyxds.insecure_channel(target, bootstrap=bootstrap)
                ready = channel.unary_unary(method)
                assert wait_until(partial(_try, ready, metadata), timeout=20), (
                    f"{key}: {target} never answered"
                )
            share = min(s for _, s in targets)
            n = max(20, math.ceil(math.log(MISS) / math.log(1 - share))) if share < 1 else 20
            assert n <= 2000, f"{key}: a route weight too small to check ({share})"
            assert wait_until(partial(_core_answers, core, method, metadata, target), 20), (
                f"{key}: C-core never answered {target} {method} {metadata}"
            )
            ours = _pyxds_counts(channel, method, metadata, n)
            theirs = core.call(
                n,
                method=method,
                metadata=metadata,
                target=target,
                wait_for_ready=False,
                details=True,
            )
            for cluster, _share in targets:
                leaves = _leaves(cluster, clusters, set())
                names = {b for leaf in leaves for b in owners.get(_eds(clusters[leaf]), ())}
                got_ours = sum(v for k, v in ours.items() if k in names)
                got_theirs = sum(v for k, v in theirs.items() if k in names)
                assert got_ours > 0 and got_theirs > 0, (
                    f"{key}: cluster {cluster} (route to {target} {method} {metadata}) got "
                    f"{got_ours} of {n} pyxds RPCs and {got_theirs} of {n} C-core RPCs; "
                    f"pyxds saw {dict(ours)}, C-core saw {dict(theirs)}"
                )
            failures = [k for k in list(ours) + list(theirs) if k.startswith("error:")]
            assert not failures, f"{key}: RPCs failed: {failures}"
    finally:
        for channel in channels.values():
            channel.close()
        core.close()
        backends.stop()


def _eds(cluster: dict[str, Any]) -> str:
    return (cluster.get("edsClusterConfig") or {}).get("serviceName") or _name(cluster)


def _core_answers(core: CoreXdsClient, method: str, metadata: list, target: str) -> bool:
    got = core.call(1, method=method, metadata=metadata, target=target, wait_for_ready=False)
    return not any(k.startswith("error:") for k in got)


def _try(call: Any, metadata: list) -> bool:
    try:
        call(b"", timeout=2, metadata=metadata or None)
        return True
    except grpc.RpcError:
        return False


if __name__ == "__main__":  # list what the test finds
    print(json.dumps(sorted(EXAMPLES_FOUND), indent=1))
