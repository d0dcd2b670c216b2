"""Differential: federation target names (gRFC A47) through pyxds and grpcio's
C-core (``xds:`` channels in a subprocess, CoreXdsClient) with the same
bootstrap and the same two pyxds.server control planes.

Source: grpc-node ``packages/grpc-js-xds/test/test-federation.ts``:
"Bootstrap Config Contains No New Fields" (an old-style name works, a
new-style name with an authority the bootstrap does not list fails),
"New-Style Names on gRPC Client" and "Multiple authorities" (no authority:
the default client template; an authority with a template but no servers:
its template, the top-level server; an authority with servers but no
template: ``xdstp://<authority>/envoy.config.listener.v3.Listener/%s`` on
its own server).  The listener name each target asks for is in
test_bootstrap.py (test_listener_name_*, test_authority_*); here the RPC
must reach the backend behind that name, on the right control plane.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from channel_fixtures import Backend, CoreXdsClient, pyxds_calls, route

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

DEFAULT, OTHER = "xds.authority.com", "xds.other.com"
DEFAULT_TEMPLATE = (
    f"xdstp://{DEFAULT}/envoy.config.listener.v3.Listener/grpc/client/%s?project_id=1234"
)
OTHER_LISTENER = f"xdstp://{OTHER}/envoy.config.listener.v3.Listener/server.other.com"


def xdstp(authority: str | None, kind: str, name: str) -> str:
    """An xdstp name of ``authority``, or the plain ``name`` without one."""
    return f"xdstp://{authority}/envoy.config.{kind}/{name}" if authority else name


def served_snapshot(*chains: tuple[list[str], str | None, Backend]) -> Snapshot:
    """Per chain: each of its listeners -> one RDS route config -> one EDS
    cluster holding its backend, every other name an xdstp name of its
    authority (plain names without one)."""
    parts: dict[str, list[Any]] = {"listeners": [], "routes": [], "clusters": [], "endpoints": []}
    for listeners, authority, backend in chains:
        tag = f"{authority or 'plain'}-{backend.name}"
        route_name = xdstp(authority, "route.v3.RouteConfiguration", f"route-{tag}")
        cluster_name = xdstp(authority, "cluster.v3.Cluster", f"cluster-{tag}")
        eds_name = xdstp(authority, "endpoint.v3.ClusterLoadAssignment", f"endpoints-{tag}")
        parts["listeners"] += [b.listener(n, route_config_name=route_name) for n in listeners]
        vhost = b.virtual_host("vh", routes=[route(prefix="", cluster=cluster_name)])
        parts["routes"].append(b.route_config(route_name, [vhost]))
        parts["clusters"].append(b.cluster(cluster_name, eds_service_name=eds_name))
        locality = b.locality(zone="z", endpoints=[backend.address])
        parts["endpoints"].append(b.endpoints(eds_name, [locality]))
    return Snapshot(**parts)


@pytest.fixture(scope="module")
def backends() -> Iterator[dict[str, Backend]]:
    started = {"default": Backend("default").start(), "other": Backend("other").start()}
    yield started
    for backend in started.values():
        backend.stop()


@pytest.fixture(scope="module")
def planes(backends) -> Iterator[tuple[ManagementServer, ManagementServer]]:
    default, other = ManagementServer().start(), ManagementServer().start()
    default.set_snapshot(
        served_snapshot(
            ([DEFAULT_TEMPLATE.replace("%s", "server.example.com")], DEFAULT, backends["default"]),
            (["server.example.com"], None, backends["default"]),
        )
    )
    other.set_snapshot(served_snapshot(([OTHER_LISTENER], OTHER, backends["other"])))
    yield default, other
    default.stop()
    other.stop()


def both(bootstrap: dict[str, Any], target: str) -> tuple[dict[str, int], dict[str, int]]:
    """One RPC through each client to ``target``: its outcome counters."""
    core = CoreXdsClient(bootstrap)
    try:
        channel = pyxds.insecure_channel(target, bootstrap=bootstrap)
    except Exception as err:  # an unusable target may fail at construction
        ours: dict[str, int] = {f"error:{type(err).__name__}": 1}
    else:
        try:
            ours = dict(pyxds_calls(channel, 1, wait_for_ready=False, timeout=5))
        finally:
            channel.close()
    try:
        theirs = dict(core.call(1, target=target, wait_for_ready=False, timeout=5))
    finally:
        core.close()
    return ours, theirs


def test_old_style_name_works_without_new_bootstrap_fields(planes):
    """test-federation.ts "Should accept an old-style name"."""
    default, _ = planes
    ours, theirs = both(default.bootstrap(node_id="fed-old"), "xds:server.example.com")
    assert ours == theirs == {"default": 1}


def test_unlisted_authority_fails_in_both(planes):
    """test-federation.ts "Should reject a new-style name" (A47: an
    authority not in the bootstrap's ``authorities`` is an error)."""
    default, _ = planes
    ours, theirs = both(
        default.bootstrap(node_id="fed-unlisted"), f"xds://{DEFAULT}/server.example.com"
    )
    # Both UNAVAILABLE naming the authority; the words differ (C-core:
    # "Invalid target URI -- authority not found for xds.authority.com").
    assert list(ours) == list(theirs) == ["error:UNAVAILABLE"], (ours, theirs)


@pytest.mark.parametrize(
    ("target", "served_by"),
    [
        ("xds:server.example.com", "default"),
        (f"xds://{DEFAULT}/server.example.com", "default"),
        (f"xds://{OTHER}/server.other.com", "other"),
    ],
    ids=["no-authority", "authority-without-servers", "authority-without-template"],
)
def test_multiple_authorities_reach_the_backend_behind_each_name_like_c_core(
    planes, target, served_by
):
    """test-federation.ts "Multiple authorities"."""
    default, other = planes
    other_servers = other.bootstrap()["xds_servers"]
    bootstrap = default.bootstrap(
        node_id="fed-multi",
        client_default_listener_resource_name_template=DEFAULT_TEMPLATE,
        authorities={
            DEFAULT: {"client_listener_resource_name_template": DEFAULT_TEMPLATE},
            OTHER: {"xds_servers": other_servers},
        },
    )
    ours, theirs = both(bootstrap, target)
    assert ours == theirs == {served_by: 1}
