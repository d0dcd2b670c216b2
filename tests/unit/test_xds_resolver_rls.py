"""The xds resolver with a cluster specifier plugin (RLS): the route's
cluster_manager child ``cluster_specifier_plugin:NAME`` runs the plugin's
config, held by RPC refs as clusters are (A31), with no CDS watch of its own."""

from __future__ import annotations

import json

from test_xds_resolver import Harness, stand_in_policies  # noqa: F401 - fixture

from pyxds.resolver.config_selector import CLUSTER_ATTRIBUTE
from pyxds.server import builders as b
from pyxds.testing.fake_xds_client import (
    CLUSTER_TYPE_URL,
    eds_cluster,
    make_cla,
    make_listener,
)
from pyxds.xds.resources import ROUTE_CONFIG

PLUGIN_CHILD = "cluster_specifier_plugin:rls"


def plugin_route_config(*, lookup_service: str = "rls.example:443", plugin: bool = True):
    routes = [b.route(prefix="/pkg.Svc/", cluster_specifier_plugin="rls")] if plugin else []
    routes.append(b.route(prefix="", cluster="plain"))
    config = b.route_lookup_config(
        lookup_service, [b.rls_key_builder("pkg.Svc", headers={"user": "x-user"})]
    )
    plugins = [b.rls_plugin("rls", config)] if plugin else []
    rc = b.route_config("rds", [b.virtual_host("vh", ["*"], routes)], plugins)
    result = ROUTE_CONFIG.decode(rc.SerializeToString())
    assert result.error is None, result.error
    return result.resource


def setup(h: Harness, **kwargs) -> None:
    h.push(make_listener("lds", rds="rds"))
    h.push(plugin_route_config(**kwargs))
    h.push(eds_cluster("plain"), make_cla("plain", "10.0.0.1:80"))


def lb_children(h: Harness) -> dict:
    return json.loads(h.last.lb_policy.config.text)["children"]


def test_a_plugin_route_goes_to_the_plugins_child_running_its_rls_config():
    h = Harness()
    setup(h)
    children = lb_children(h)
    assert set(children) == {"cluster:plain", PLUGIN_CHILD}
    (policy,) = children[PLUGIN_CHILD]["childPolicy"]
    rls = policy["rls_experimental"]
    assert rls["routeLookupConfig"]["lookupService"] == "rls.example:443"
    assert rls["childPolicy"] == [{"cds_experimental": {"isDynamic": True}}]
    assert rls["childPolicyConfigTargetFieldName"] == "cluster"
    call = h.select("/pkg.Svc/Get")
    assert call.status is None
    assert call.call_attributes[CLUSTER_ATTRIBUTE] == PLUGIN_CHILD
    assert h.select("/other/Get").call_attributes[CLUSTER_ATTRIBUTE] == "cluster:plain"
    call.on_committed()


def test_a_plugin_has_no_cds_watch_of_its_own():
    h = Harness()
    setup(h)
    assert set(h.client.watched(CLUSTER_TYPE_URL)) == {"plain"}
    assert h.resolver.config_dump()["cluster_specifier_plugins"] == {"rls": 0}


def test_a_plugin_the_routes_drop_stays_while_an_rpc_holds_it():
    h = Harness()
    setup(h)
    call = h.select("/pkg.Svc/Get")
    h.push(plugin_route_config(plugin=False))
    assert PLUGIN_CHILD in lb_children(h)  # the RPC still needs its pick
    call.on_committed()
    h.serializer.run(lambda: None)
    assert PLUGIN_CHILD not in lb_children(h)
    assert "cluster_specifier_plugins" not in h.resolver.config_dump()


def test_a_changed_plugin_config_reaches_the_lb_config():
    h = Harness()
    setup(h)
    h.push(plugin_route_config(lookup_service="other.example:443"))
    (policy,) = lb_children(h)[PLUGIN_CHILD]["childPolicy"]
    assert policy["rls_experimental"]["routeLookupConfig"]["lookupService"] == ("other.example:443")


def test_a_dynamic_subscription_brings_the_rls_target_cluster_into_the_xds_config():
    # what the RLS policy's cds child (isDynamic) does for a target
    h = Harness()
    setup(h)
    manager = h.resolver.dependency_manager
    assert manager is not None
    subscription = manager.subscribe_cluster("cluster-a")
    h.serializer.run(lambda: None)
    assert "cluster-a" in h.client.watched(CLUSTER_TYPE_URL)
    h.push(eds_cluster("cluster-a"), make_cla("cluster-a", "10.0.0.2:80"))
    assert "cluster-a" in h.last.attributes["xds_config"].clusters
    subscription.release()
    h.serializer.run(lambda: None)
    assert "cluster-a" not in h.client.watched(CLUSTER_TYPE_URL)
