"""What the resource validators accept and reject, compared with C-core.

Scenarios from C-core's test/core/xds/xds_{route_config,endpoint,cluster,listener}
_resource_type_test.cc and grpc-go's xdsresource unmarshal_{rds,eds,cds,lds}_test.go.
A resource C-core accepts that pyxds NACKs (or the reverse) is a deviation the
differential tests would see, so each test pins the accept/reject decision (and
the field the error names).
"""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.type.v3 import percent_pb2

from pyxds.xds.resources import (
    CLUSTER,
    ENDPOINTS,
    LISTENER,
    ROUTE_CONFIG,
    ClusterWeight,
    NonForwardingAction,
    UnsupportedAction,
)

# ---------------------------------------------------------------- helpers


def _decode(rt, msg):
    result = rt.decode(msg.SerializeToString())
    return result.resource, result.error


def _ok(rt, msg):
    resource, error = _decode(rt, msg)
    assert error is None, error
    return resource


def _err(rt, msg) -> str:
    resource, error = _decode(rt, msg)
    assert resource is None and error, "expected a NACK"
    return error


def rc_with(*routes, domains=("*",)) -> route_pb2.RouteConfiguration:
    rc = route_pb2.RouteConfiguration(name="rc")
    vh = rc.virtual_hosts.add(name="vh", domains=list(domains))
    for r in routes:
        vh.routes.append(r)
    return rc


def route(prefix: str = "", cluster: str | None = "c1") -> rc_pb2.Route:
    r = rc_pb2.Route()
    r.match.prefix = prefix
    if cluster is not None:
        r.route.cluster = cluster
    return r


def weighted(*pairs, total=None) -> rc_pb2.Route:
    r = route(cluster=None)
    wc = r.route.weighted_clusters
    for name, w in pairs:
        wc.clusters.add(name=name).weight.value = w
    if total is not None:
        wc.total_weight.value = total
    return r


def routes_of(rc):
    return _ok(ROUTE_CONFIG, rc).virtual_hosts[0].routes


# ---------------------------------------------------------------- RDS


def test_weighted_clusters_total_weight_not_matching_sum_is_accepted():
    """C-core RouteConfig WeightedClusters (total_weight is not read); grpc-go
    unmarshal_rds; total_weight is deprecated in Envoy's API."""
    (r,) = routes_of(rc_with(weighted(("a", 30), ("b", 30), total=100)))
    assert r.action.weighted_clusters == (ClusterWeight("a", 30), ClusterWeight("b", 30))
    assert r.action.total_weight == 60


def test_weighted_clusters_with_only_zero_weights_is_nacked():
    """C-core: "no valid clusters specified"."""
    err = _err(ROUTE_CONFIG, rc_with(weighted(("a", 0), ("b", 0))))
    assert "routes[0].route.weighted_clusters: no valid clusters specified" in err


def test_weighted_clusters_sum_above_uint32_is_nacked():
    """C-core: "sum of cluster weights exceeds uint32 max"."""
    err = _err(ROUTE_CONFIG, rc_with(weighted(("a", 0xFFFFFFFF), ("b", 1))))
    assert "route.weighted_clusters: sum of cluster weights exceeds uint32 max" in err


def test_runtime_fraction_without_default_value_is_no_fraction_matcher():
    """C-core RouteRuntimeFractionParse: no default_value, no fraction (the
    route matches every request, not 0% of them)."""
    r = route("/")
    r.match.runtime_fraction.runtime_key = "some.key"
    (got,) = routes_of(rc_with(r))
    assert got.match.runtime_fraction is None


def test_runtime_fraction_default_value_is_used():
    r = route("/")
    r.match.runtime_fraction.default_value.numerator = 20
    r.match.runtime_fraction.default_value.denominator = percent_pb2.FractionalPercent.HUNDRED
    (got,) = routes_of(rc_with(r))
    assert got.match.runtime_fraction is not None
    assert got.match.runtime_fraction.numerator == 20


def test_route_with_query_parameters_is_ignored_not_nacked():
    """A28: a route with query_parameters is ignored."""
    r = route("/")
    r.match.query_parameters.add(name="q")
    assert routes_of(rc_with(r, route("/", "c2")))[0].action.cluster == "c2"


def test_route_without_match_is_nacked():
    r = rc_pb2.Route()
    r.route.cluster = "c1"
    assert "routes[0].match: field not present" in _err(ROUTE_CONFIG, rc_with(r))


def test_route_with_unsupported_path_specifier_is_nacked():
    """C-core: "invalid path specifier" (A28: must have prefix, path or safe_regex)."""
    r = rc_pb2.Route()
    r.match.path_separated_prefix = "/a"
    r.route.cluster = "c1"
    assert "routes[0].match: invalid path specifier" in _err(ROUTE_CONFIG, rc_with(r))


@pytest.mark.parametrize("prefix", ["a/", "/a/b/", "//a", "/a/b/c"])
def test_prefix_that_cannot_match_a_grpc_path_is_ignored(prefix):
    """C-core RoutePathMatchParse: ignored, not NACKed."""
    assert [r.action.cluster for r in routes_of(rc_with(route(prefix), route("/", "c2")))] == ["c2"]


@pytest.mark.parametrize("path", ["", "a/b", "/a", "/a/", "//b", "/a/b/c"])
def test_path_not_of_the_form_service_method_is_ignored(path):
    r = rc_pb2.Route()
    r.match.path = path
    r.route.cluster = "c1"
    assert [x.action.cluster for x in routes_of(rc_with(r, route("/", "c2")))] == ["c2"]


def test_virtual_host_without_domains_is_nacked():
    """C-core: virtual_hosts[0].domains: must be non-empty."""
    err = _err(ROUTE_CONFIG, rc_with(route(), domains=()))
    assert "virtual_hosts[0].domains: must be non-empty" in err


@pytest.mark.parametrize("domain", ["", "a*b", "a*b*c"])
def test_invalid_domain_pattern_is_nacked(domain):
    err = _err(ROUTE_CONFIG, rc_with(route(), domains=("ok", domain)))
    assert f'virtual_hosts[0].domains[1]: invalid domain pattern "{domain}"' in err


@pytest.mark.parametrize("domain", ["*", "*.foo.com", "foo.*", "*foo*", "*a*b", "foo.com"])
def test_valid_domain_patterns_are_accepted(domain):
    _ok(ROUTE_CONFIG, rc_with(route(), domains=(domain,)))


def test_cluster_header_route_is_ignored():
    """A28 latest: an unsupported cluster specifier makes the route ignored."""
    r = route("/", None)
    r.route.cluster_header = "x-cluster"
    assert [x.action.cluster for x in routes_of(rc_with(r, route("/", "c2")))] == ["c2"]


def test_route_action_without_cluster_specifier_is_ignored():
    r = route("/", None)
    r.route.timeout.seconds = 1
    assert [x.action.cluster for x in routes_of(rc_with(r, route("/", "c2")))] == ["c2"]


def test_non_forwarding_and_redirect_actions_are_kept_not_nacked():
    """C-core keeps them (client RPCs matching either fail, server RPCs
    matching the redirect fail); no NACK."""
    nf = rc_pb2.Route()
    nf.match.prefix = "/a"
    nf.non_forwarding_action.SetInParent()
    rd = rc_pb2.Route()
    rd.match.prefix = "/b"
    rd.redirect.host_redirect = "x"
    got = routes_of(rc_with(nf, rd, route("/")))
    assert [type(r.action) for r in got[:2]] == [NonForwardingAction, UnsupportedAction]


def test_invalid_path_regex_is_nacked():
    r = rc_pb2.Route()
    r.match.safe_regex.regex = "a("
    r.route.cluster = "c1"
    assert "routes[0].match: error creating path matcher: Invalid regex" in _err(
        ROUTE_CONFIG, rc_with(r)
    )


def test_header_range_with_end_before_start_is_nacked():
    r = route("/")
    h = r.match.headers.add(name="h")
    h.range_match.start = 10
    h.range_match.end = 5
    assert "routes[0].match.headers[0]: cannot create header matcher" in _err(
        ROUTE_CONFIG, rc_with(r)
    )


def test_header_matcher_without_specifier_is_nacked():
    r = route("/")
    r.match.headers.add(name="h")
    assert "invalid header matcher" in _err(ROUTE_CONFIG, rc_with(r))


def test_case_insensitive_match_is_accepted():
    """A28 latest: case_sensitive false is honoured, not NACKed."""
    r = route("/Svc/")
    r.match.case_sensitive.value = False
    (got,) = routes_of(rc_with(r))
    assert got.match.case_sensitive is False


def test_retry_policy_with_zero_retries_is_nacked():
    """C-core RetryPolicyParse: num_retries must be greater than 0."""
    r = route("/")
    r.route.retry_policy.num_retries.value = 0
    assert "retry_policy.num_retries: must be greater than 0" in _err(ROUTE_CONFIG, rc_with(r))


def test_unknown_cluster_specifier_plugin_name_is_nacked():
    r = route("/", None)
    r.route.cluster_specifier_plugin = "nope"
    err = _err(ROUTE_CONFIG, rc_with(r))
    assert 'unknown cluster specifier plugin name "nope"' in err


# A plugin type gRPC does not implement (RLS is implemented:
# tests/unit/test_resources_rls_plugin.py).
UNKNOWN_PLUGIN = "type.googleapis.com/example.UnknownClusterSpecifier"


def test_route_using_unsupported_optional_plugin_is_ignored():
    rc = rc_with()
    p = rc.cluster_specifier_plugins.add(is_optional=True)
    p.extension.name = "other"
    p.extension.typed_config.type_url = UNKNOWN_PLUGIN
    r = route("/", None)
    r.route.cluster_specifier_plugin = "other"
    rc.virtual_hosts[0].routes.append(r)
    rc.virtual_hosts[0].routes.append(route("/", "c2"))
    assert [x.action.cluster for x in routes_of(rc)] == ["c2"]


def test_unsupported_required_plugin_is_nacked():
    rc = rc_with(route())
    p = rc.cluster_specifier_plugins.add()
    p.extension.name = "rls"
    p.extension.typed_config.type_url = UNKNOWN_PLUGIN
    assert "unsupported ClusterSpecifierPlugin type" in _err(ROUTE_CONFIG, rc)


# ---------------------------------------------------------------- EDS

HEALTHY = health_check_pb2.HEALTHY
UNHEALTHY = health_check_pb2.UNHEALTHY
DRAINING = health_check_pb2.DRAINING
DEGRADED = health_check_pb2.DEGRADED
TIMEOUT = health_check_pb2.TIMEOUT


def locality(zone="z", weight=1, priority=0, eps=(("10.0.0.1", 80),)):
    loc = endpoint_components_pb2.LocalityLbEndpoints(priority=priority)
    loc.locality.region = "r"
    loc.locality.zone = zone
    if weight is not None:
        loc.load_balancing_weight.value = weight
    for ep in eps:
        host, port = ep[0], ep[1]
        lbe = loc.lb_endpoints.add()
        if len(ep) > 2:
            lbe.health_status = ep[2]
        sa = lbe.endpoint.address.socket_address
        sa.address = host
        sa.port_value = port
    return loc


def cla(*locs) -> endpoint_pb2.ClusterLoadAssignment:
    c = endpoint_pb2.ClusterLoadAssignment(cluster_name="eds")
    c.endpoints.extend(locs)
    return c


@pytest.mark.parametrize("weight", [None, 0])
def test_locality_with_unset_or_zero_weight_is_dropped(weight):
    """C-core LocalityParse; grpc-go TestEDSParseRespProto (zero-weight locality)."""
    got = _ok(ENDPOINTS, cla(locality("a", weight), locality("b", 2, eps=(("10.0.0.2", 80),))))
    assert [loc.name.zone for loc in got.priorities[0]] == ["b"]


def test_priorities_with_a_gap_are_nacked():
    """C-core: "priority 1 empty" (grpc-go: sparse priorities rejected)."""
    err = _err(
        ENDPOINTS,
        cla(locality("a", priority=0), locality("b", priority=2, eps=(("10.0.0.2", 80),))),
    )
    assert "endpoints: priority 1 empty" in err


def test_priority_emptied_by_zero_weight_localities_is_a_gap():
    err = _err(
        ENDPOINTS,
        cla(locality("a", 0, priority=0), locality("b", priority=1, eps=(("10.0.0.2", 80),))),
    )
    assert "priority 0 empty" in err


def test_priorities_out_of_order_are_accepted():
    got = _ok(
        ENDPOINTS,
        cla(locality("b", priority=1, eps=(("10.0.0.2", 80),)), locality("a", priority=0)),
    )
    assert [p[0].name.zone for p in got.priorities] == ["a", "b"]


def test_duplicate_locality_in_one_priority_is_nacked():
    err = _err(ENDPOINTS, cla(locality("a"), locality("a", eps=(("10.0.0.2", 80),))))
    assert "duplicate locality" in err and "found in priority 0" in err


def test_same_locality_in_two_priorities_is_accepted():
    got = _ok(ENDPOINTS, cla(locality("a"), locality("a", priority=1, eps=(("10.0.0.2", 80),))))
    assert len(got.priorities) == 2


def test_duplicate_endpoint_address_across_localities_is_nacked():
    """C-core: duplicate endpoint address (checked across the whole resource)."""
    err = _err(ENDPOINTS, cla(locality("a"), locality("b", priority=1)))
    assert 'duplicate endpoint address "10.0.0.1:80"' in err


def test_same_ipv6_address_spelled_two_ways_is_a_duplicate():
    """C-core compares binary socket addresses."""
    err = _err(ENDPOINTS, cla(locality("a", eps=(("2001:db8::1", 80), ("2001:DB8:0::1", 80)))))
    assert 'duplicate endpoint address "[2001:db8::1]:80"' in err


def test_ipv6_address_is_written_in_canonical_form():
    got = _ok(ENDPOINTS, cla(locality("a", eps=(("2001:DB8:0:0::1", 443),))))
    assert got.priorities[0][0].endpoints[0].addresses == ("[2001:db8::1]:443",)


@pytest.mark.parametrize("health", [UNHEALTHY, TIMEOUT, DEGRADED])
def test_unused_health_status_endpoint_is_skipped_before_validation(health):
    """C-core EndpointAddressesParse returns before looking at the address
    when the health status is not UNKNOWN, HEALTHY or DRAINING: a duplicate
    or invalid address there is not an error."""
    got = _ok(
        ENDPOINTS,
        cla(
            locality(
                "a", eps=(("10.0.0.1", 80), ("10.0.0.1", 80, health), ("not-an-ip", 80, health))
            )
        ),
    )
    assert got.excluded_endpoints == 2 and got.endpoint_count == 1


def test_draining_endpoint_is_validated_deduplicated_and_kept():
    """C-core keeps DRAINING endpoints (for override host, A55); its address counts."""
    err = _err(ENDPOINTS, cla(locality("a", eps=(("10.0.0.1", 80), ("10.0.0.1", 80, DRAINING)))))
    assert "duplicate endpoint address" in err
    got = _ok(ENDPOINTS, cla(locality("a", eps=(("10.0.0.1", 80), ("10.0.0.2", 80, DRAINING)))))
    assert got.excluded_endpoints == 0 and got.endpoint_count == 1 and got.draining_count == 1


def test_endpoint_weight_zero_is_nacked():
    """C-core: load_balancing_weight: must be greater than 0."""
    loc = locality("a")
    loc.lb_endpoints[0].load_balancing_weight.value = 0
    assert "lb_endpoints[0].load_balancing_weight: must be greater than 0" in _err(
        ENDPOINTS, cla(loc)
    )


def test_sum_of_locality_weights_above_uint32_is_nacked():
    err = _err(ENDPOINTS, cla(locality("a", 0xFFFFFFFF), locality("b", 1, eps=(("10.0.0.2", 80),))))
    assert "endpoints: sum of locality weights for priority 0 exceeds uint32 max" in err


def test_locality_weight_sum_over_uint32_across_priorities_is_accepted():
    _ok(
        ENDPOINTS,
        cla(locality("a", 0xFFFFFFFF), locality("b", 5, priority=1, eps=(("10.0.0.2", 80),))),
    )


def test_port_above_65535_is_nacked():
    err = _err(ENDPOINTS, cla(locality("a", eps=(("10.0.0.1", 65536),))))
    assert "port_value: invalid port" in err


def test_locality_with_weight_but_no_locality_field_is_nacked():
    loc = locality("a")
    loc.ClearField("locality")
    assert "endpoints[0].locality: field not present" in _err(ENDPOINTS, cla(loc))


def test_empty_locality_is_accepted():
    got = _ok(ENDPOINTS, cla(locality("a", eps=())))
    assert got.endpoint_count == 0


def test_additional_addresses_become_extra_addresses_and_are_deduplicated():
    """A61; C-core xds_endpoint_resource_type_test additional addresses."""
    loc = locality("a")
    aa = loc.lb_endpoints[0].endpoint.additional_addresses.add()
    aa.address.socket_address.address = "::1"
    aa.address.socket_address.port_value = 81
    got = _ok(ENDPOINTS, cla(loc))
    assert got.priorities[0][0].endpoints[0].addresses == ("10.0.0.1:80", "[::1]:81")
    aa2 = loc.lb_endpoints[0].endpoint.additional_addresses.add()
    aa2.address.socket_address.address = "10.0.0.1"
    aa2.address.socket_address.port_value = 80
    assert 'duplicate endpoint address "10.0.0.1:80"' in _err(ENDPOINTS, cla(loc))


@pytest.mark.parametrize(
    "numerator,denominator,ppm",
    [(5, 0, 50_000), (5, 1, 500), (5, 2, 5), (200, 0, 1_000_000)],
)
def test_drop_overload_is_normalised_to_per_million_and_capped(numerator, denominator, ppm):
    c = cla(locality("a"))
    d = c.policy.drop_overloads.add(category="lb")
    d.drop_percentage.numerator = numerator
    d.drop_percentage.denominator = denominator
    (drop,) = _ok(ENDPOINTS, c).drop_overloads
    assert (drop.category, drop.parts_per_million) == ("lb", ppm)


def test_drop_overload_without_category_or_percentage_is_nacked():
    c = cla(locality("a"))
    c.policy.drop_overloads.add(category="")
    err = _err(ENDPOINTS, c)
    assert "drop_overloads[0].category: empty drop category name" in err
    assert "drop_overloads[0].drop_percentage: field not present" in err


# ---------------------------------------------------------------- CDS


def eds_cluster(name="c1"):
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.ads.SetInParent()
    return c


@pytest.mark.parametrize(
    "field", ["max_ejection_percent", "enforcing_success_rate", "enforcing_failure_percentage"]
)
def test_outlier_detection_percentage_above_100_is_nacked(field):
    """C-core CdsResourceParse outlier_detection: "value must be <= 100"."""
    c = eds_cluster()
    getattr(c.outlier_detection, field).value = 101
    assert f"outlier_detection.{field}: value must be <= 100" in _err(CLUSTER, c)


def test_outlier_detection_with_invalid_duration_is_nacked():
    c = eds_cluster()
    c.outlier_detection.interval.seconds = -1
    assert "outlier_detection.interval.seconds" in _err(CLUSTER, c)


def test_valid_outlier_detection_is_accepted():
    c = eds_cluster()
    c.outlier_detection.interval.seconds = 10
    c.outlier_detection.max_ejection_percent.value = 100
    c.outlier_detection.enforcing_success_rate.value = 0
    _ok(CLUSTER, c)


@pytest.mark.parametrize("kind", [cluster_pb2.Cluster.STATIC, cluster_pb2.Cluster.STRICT_DNS])
def test_unsupported_discovery_type_is_nacked(kind):
    c = cluster_pb2.Cluster(name="c1", type=kind)
    assert "type: unknown discovery type" in _err(CLUSTER, c)


def test_aggregate_cluster_with_empty_list_is_nacked():
    c = cluster_pb2.Cluster(name="agg")
    c.cluster_type.name = "envoy.clusters.aggregate"
    c.cluster_type.typed_config.Pack(aggregate_pb2.ClusterConfig())
    assert "must be non-empty" in _err(CLUSTER, c)


def test_eds_config_not_ads_or_self_is_nacked():
    c = cluster_pb2.Cluster(name="c1", type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.path_config_source.path = "/x"
    assert "eds_cluster_config.eds_config" in _err(CLUSTER, c)


def test_xdstp_eds_cluster_without_service_name_is_nacked():
    c = eds_cluster("xdstp://auth/envoy.config.cluster.v3.Cluster/c1")
    assert "eds_cluster_config.service_name" in _err(CLUSTER, c)


def test_lrs_server_not_self_is_nacked():
    c = eds_cluster()
    c.lrs_server.ads.SetInParent()
    assert "lrs_server: ConfigSource is not self" in _err(CLUSTER, c)


def test_circuit_breaker_uses_first_default_priority_threshold():
    c = eds_cluster()
    c.circuit_breakers.thresholds.add(priority=1).max_requests.value = 7
    c.circuit_breakers.thresholds.add(priority=0).max_requests.value = 9
    c.circuit_breakers.thresholds.add(priority=0).max_requests.value = 11
    assert _ok(CLUSTER, c).max_requests == 9


def logical_dns(n_localities=1, n_endpoints=1, resolver_name=""):
    c = cluster_pb2.Cluster(name="dns", type=cluster_pb2.Cluster.LOGICAL_DNS)
    for _ in range(n_localities):
        loc = c.load_assignment.endpoints.add()
        for _ in range(n_endpoints):
            sa = loc.lb_endpoints.add().endpoint.address.socket_address
            sa.address = "dns.example.com"
            sa.port_value = 443
            sa.resolver_name = resolver_name
    return c


def test_logical_dns_cluster_is_accepted():
    got = _ok(CLUSTER, logical_dns())
    assert (got.kind, got.dns_hostname, got.dns_port) == ("LOGICAL_DNS", "dns.example.com", 443)


@pytest.mark.parametrize(
    "kwargs,text",
    [
        ({"n_localities": 2}, "exactly one locality"),
        ({"n_localities": 0}, "load_assignment: field not present"),
        ({"n_endpoints": 2}, "exactly one endpoint"),
        ({"resolver_name": "r"}, "must NOT have a custom resolver name"),
    ],
)
def test_logical_dns_cluster_shape_errors_are_nacked(kwargs, text):
    """A37 validation, C-core's words."""
    assert text in _err(CLUSTER, logical_dns(**kwargs))


# ---------------------------------------------------------------- LDS


def api_listener(filters=("router",), rds="rc") -> listener_pb2.Listener:
    hcm = hcm_pb2.HttpConnectionManager()
    if rds is not None:
        hcm.rds.route_config_name = rds
        hcm.rds.config_source.ads.SetInParent()
    for f in filters:
        hf = hcm.http_filters.add(name=f)
        if f == "router":
            hf.typed_config.Pack(router_pb2.Router())
        elif f == "unknown-optional":
            hf.typed_config.type_url = "type.googleapis.com/some.Unknown"
            hf.is_optional = True
        elif f == "unknown":
            hf.typed_config.type_url = "type.googleapis.com/some.Unknown"
    lis = listener_pb2.Listener(name="lis")
    lis.api_listener.api_listener.Pack(hcm)
    return lis


def test_listener_with_router_is_accepted():
    got = _ok(LISTENER, api_listener())
    assert got.route_config_name == "rc"


def test_listener_without_http_filters_is_nacked():
    assert "http_filters" in _err(LISTENER, api_listener(filters=()))


def test_listener_with_router_not_last_is_nacked():
    """C-core: terminal filter must be the last filter in the chain."""
    lis = api_listener(filters=("router", "router2"))
    err = _err(LISTENER, lis)
    assert "http_filters" in err


def test_unknown_optional_filter_is_skipped_unknown_required_is_nacked():
    _ok(LISTENER, api_listener(filters=("unknown-optional", "router")))
    assert "unsupported filter type" in _err(LISTENER, api_listener(filters=("unknown", "router")))


def test_listener_without_rds_or_route_config_is_nacked():
    assert "neither route_config nor rds" in _err(LISTENER, api_listener(rds=None))


def test_rds_config_source_not_ads_is_nacked():
    lis = api_listener()
    hcm = hcm_pb2.HttpConnectionManager()
    lis.api_listener.api_listener.Unpack(hcm)
    hcm.rds.config_source.path_config_source.path = "/x"
    lis.api_listener.api_listener.Pack(hcm)
    assert "rds.config_source" in _err(LISTENER, lis)


# ---------------------------------------------------------------- HTTP filters (A39)


def test_listener_with_fault_filter_before_router_is_accepted():
    """C-core supports the fault filter on clients; Istio's proxyless config
    puts one on every client listener (xdsfilters.Fault, xdsfilters.Router)."""
    lis = api_listener(filters=())
    hcm = hcm_pb2.HttpConnectionManager()
    lis.api_listener.api_listener.Unpack(hcm)
    hcm.http_filters.add(name="envoy.filters.http.fault").typed_config.Pack(fault_pb2.HTTPFault())
    hcm.http_filters.add(name="router").typed_config.Pack(router_pb2.Router())
    lis.api_listener.api_listener.Pack(hcm)
    got = _ok(LISTENER, lis)
    assert [f.name for f in got.http_filters] == ["envoy.filters.http.fault", "router"]


def test_fault_filter_with_unknown_denominator_is_read_as_hundred_as_c_core():
    """grpcio 1.85's C-core accepts an unknown percentage denominator (the
    enum is open) and reads it as HUNDRED (its GetDenominator default);
    pyxds NACKed it.  Checked against grpcio in
    test_xds_server_differential.py (an override, the same parser)."""
    from pyxds.resolver.fault_filter import FaultConfig

    lis = api_listener(filters=())
    hcm = hcm_pb2.HttpConnectionManager()
    lis.api_listener.api_listener.Unpack(hcm)
    fault = fault_pb2.HTTPFault()
    fault.abort.http_status = 503
    fault.abort.percentage.numerator = 1
    fault.abort.percentage.denominator = 7
    hcm.http_filters.add(name="fault").typed_config.Pack(fault)
    hcm.http_filters.add(name="router").typed_config.Pack(router_pb2.Router())
    lis.api_listener.api_listener.Pack(hcm)
    assert LISTENER.decode(lis.SerializeToString()).error is None
    config = FaultConfig.parse(fault.SerializeToString())
    assert (config.abort_numerator, config.abort_denominator) == (1, 100)


def _override(target, key: str, type_url: str, optional: bool | None = None) -> None:
    any_msg = target.typed_per_filter_config[key]
    if optional is None:
        any_msg.type_url = type_url
        return
    fc = rc_pb2.FilterConfig(is_optional=optional)
    fc.config.type_url = type_url
    any_msg.Pack(fc)


UNKNOWN_FILTER = "type.googleapis.com/some.unknown.Filter"
FAULT_URL = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"


def test_unknown_filter_override_is_nacked_on_vhost_route_and_weighted_cluster():
    """C-core ParseTypedPerFilterConfig: "unsupported filter type"."""
    r = weighted(("a", 1))
    _override(r, "f1", UNKNOWN_FILTER)
    _override(r.route.weighted_clusters.clusters[0], "f2", UNKNOWN_FILTER)
    rc = rc_with(r)
    _override(rc.virtual_hosts[0], "f0", UNKNOWN_FILTER)
    err = _err(ROUTE_CONFIG, rc)
    unknown = ".value[some.unknown.Filter]: unsupported filter type"
    assert f"virtual_hosts[0].typed_per_filter_config[f0]{unknown}" in err
    assert f"routes[0].typed_per_filter_config[f1]{unknown}" in err
    assert (
        f"routes[0].route.weighted_clusters.clusters[0].typed_per_filter_config[f2]{unknown}"
    ) in err


def test_optional_unknown_filter_override_is_accepted():
    r = route("/")
    _override(r, "f", UNKNOWN_FILTER, optional=True)
    _ok(ROUTE_CONFIG, rc_with(r))


def test_filter_config_wrapper_without_optional_still_requires_a_known_type():
    r = route("/")
    _override(r, "f", UNKNOWN_FILTER, optional=False)
    assert (
        "typed_per_filter_config[f].value[envoy.config.route.v3.FilterConfig].config"
        ".value[some.unknown.Filter]: unsupported filter type"
    ) in _err(ROUTE_CONFIG, rc_with(r))


def test_fault_filter_override_is_accepted():
    r = route("/")
    r.typed_per_filter_config["envoy.filters.http.fault"].Pack(fault_pb2.HTTPFault())
    _ok(ROUTE_CONFIG, rc_with(r))
    r2 = route("/")
    _override(r2, "fault", FAULT_URL, optional=False)
    _ok(ROUTE_CONFIG, rc_with(r2))


def test_empty_filter_override_key_is_nacked():
    r = route("/")
    r.typed_per_filter_config[""].Pack(fault_pb2.HTTPFault())
    assert "typed_per_filter_config[]: filter name must be non-empty" in _err(
        ROUTE_CONFIG, rc_with(r)
    )


def test_router_filter_override_is_nacked():
    r = route("/")
    r.typed_per_filter_config["router"].Pack(router_pb2.Router())
    assert (
        "typed_per_filter_config[router].value[envoy.extensions.filters.http.router.v3.Router]: "
        "unsupported filter type"
    ) in _err(ROUTE_CONFIG, rc_with(r))


@pytest.mark.parametrize(
    "type_url",
    [
        "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession",
    ],
)
def test_an_optional_override_of_a_top_level_type_is_passed_over_as_c_core(type_url):
    """C-core 1.85 looks overrides up among override types only: a filter's
    top-level type (the router's, the stateful session filter's) there is an
    unknown type, so an optional one is passed over (pyxds NACKed it;
    tests/e2e/test_xds_server_differential.py checks it against grpcio)."""
    r = route("/")
    _override(r, "f", type_url, optional=True)
    _ok(ROUTE_CONFIG, rc_with(r))
    _override(r, "f", type_url, optional=False)
    assert "unsupported filter type" in _err(ROUTE_CONFIG, rc_with(r))


def test_a_fault_override_error_names_the_fault_type_as_c_core():
    """C-core's field for an error inside an override's config names its
    type (checked against grpcio in test_xds_server_differential.py)."""
    r = route("/")
    bad = fault_pb2.HTTPFault()
    bad.delay.fixed_delay.seconds = -1
    r.typed_per_filter_config["fault"].Pack(bad)
    assert (
        "typed_per_filter_config[fault].value[envoy.extensions.filters.http.fault.v3.HTTPFault]"
        ".delay.fixed_delay.seconds: value must be in the range"
    ) in _err(ROUTE_CONFIG, rc_with(r))
    from xds.type.v3 import typed_struct_pb2

    r = route("/")
    r.typed_per_filter_config["fault"].Pack(typed_struct_pb2.TypedStruct(type_url=FAULT_URL))
    assert (
        "typed_per_filter_config[fault].value[xds.type.v3.TypedStruct]"
        ".value[envoy.extensions.filters.http.fault.v3.HTTPFault]: "
        "could not parse fault injection filter config"
    ) in _err(ROUTE_CONFIG, rc_with(r))


@pytest.mark.parametrize(("status", "ok"), [(16, True), (17, False), (99, False)])
def test_a_fault_abort_with_an_invalid_grpc_status_is_nacked_as_c_core(status, ok):
    """C-core 1.85: "invalid gRPC status code: N" past UNAUTHENTICATED (16);
    pyxds took it as UNKNOWN.  Checked against grpcio in
    test_xds_server_differential.py."""
    r = route("/")
    fault = fault_pb2.HTTPFault()
    fault.abort.grpc_status = status
    r.typed_per_filter_config["fault"].Pack(fault)
    if ok:
        _ok(ROUTE_CONFIG, rc_with(r))
    else:
        assert (
            "typed_per_filter_config[fault].value[envoy.extensions.filters.http.fault.v3.HTTPFault]"
            f".abort.grpc_status: invalid gRPC status code: {status}"
        ) in _err(ROUTE_CONFIG, rc_with(r))
        lis = api_listener(filters=())
        hcm = hcm_pb2.HttpConnectionManager()
        lis.api_listener.api_listener.Unpack(hcm)
        hcm.http_filters.add(name="fault").typed_config.Pack(fault)
        hcm.http_filters.add(name="router").typed_config.Pack(router_pb2.Router())
        lis.api_listener.api_listener.Pack(hcm)
        assert (
            "http_filters[0].typed_config.value[envoy.extensions.filters.http.fault.v3.HTTPFault]"
            f".abort.grpc_status: invalid gRPC status code: {status}"
        ) in _err(LISTENER, lis)


def test_endpoint_without_port_is_accepted_as_port_zero():
    """C-core ParseXdsAddress (port_value read as 0), grpc-go parseAddress."""
    loc = locality("a")
    loc.lb_endpoints[0].endpoint.address.socket_address.ClearField("port_value")
    got = _ok(ENDPOINTS, cla(loc))
    assert got.priorities[0][0].endpoints[0].addresses == ("10.0.0.1:0",)


def test_invalid_endpoint_address_error_in_c_core_words():
    """C-core XdsEndpointTest.InvalidAddress."""
    err = _err(ENDPOINTS, cla(locality("a", eps=(("not_an_ip_address", 443),))))
    assert (
        "endpoints[0].lb_endpoints[0].endpoint.address.socket_address: "
        "Failed to parse address:not_an_ip_address:443"
    ) in err


@pytest.mark.parametrize(
    "strip,field",
    [
        ("endpoint", "endpoints[0].lb_endpoints[0].endpoint: field not present"),
        ("address", "endpoints[0].lb_endpoints[0].endpoint.address: field not present"),
        (
            "socket_address",
            "endpoints[0].lb_endpoints[0].endpoint.address.socket_address: field not present",
        ),
    ],
)
def test_missing_endpoint_parts_are_named(strip, field):
    """C-core XdsEndpointTest.MissingEndpoint / MissingAddress / MissingSocketAddress."""
    loc = locality("a")
    lbe = loc.lb_endpoints[0]
    if strip == "endpoint":
        lbe.ClearField("endpoint")
    elif strip == "address":
        lbe.endpoint.ClearField("address")
        lbe.endpoint.SetInParent()
    else:
        lbe.endpoint.address.ClearField("socket_address")
        lbe.endpoint.address.SetInParent()
    assert field in _err(ENDPOINTS, cla(loc))


def test_duplicate_locality_error_in_c_core_words():
    """C-core XdsEndpointTest.DuplicateLocalityName."""
    err = _err(ENDPOINTS, cla(locality("z"), locality("z", eps=(("10.0.0.2", 80),))))
    assert (
        'endpoints[1]: duplicate locality {region="r", zone="z", sub_zone=""} found in priority 0'
    ) in err


def test_sparse_priority_list_names_every_gap():
    """C-core XdsEndpointTest.SparsePriorityList."""
    err = _err(
        ENDPOINTS,
        cla(locality("a", priority=1), locality("b", priority=3, eps=(("10.0.0.2", 80),))),
    )
    assert "priority 0 empty" in err and "priority 2 empty" in err


def test_drop_percentage_invalid_denominator_in_c_core_words():
    """C-core XdsEndpointTest.DropPercentageInvalidDenominator."""
    c = cla(locality("a"))
    d = c.policy.drop_overloads.add(category="lb_drop")
    d.drop_percentage.numerator = 750000
    d.drop_percentage.denominator = 100
    assert "policy.drop_overloads[0].drop_percentage.denominator: unknown denominator type" in (
        _err(ENDPOINTS, c)
    )


# ---------------------------------------------------------------- CDS, C-core's words


def test_eds_cluster_without_eds_cluster_config_names_it():
    """C-core ClusterTypeTest.EdsClusterConfigMissing."""
    c = cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.EDS)
    assert "eds_cluster_config: field not present" in _err(CLUSTER, c)


def test_discovery_type_not_present():
    """C-core ClusterTypeTest.DiscoveryTypeNotPresent."""
    assert "type: unknown discovery type" in _err(CLUSTER, cluster_pb2.Cluster(name="foo"))


@pytest.mark.parametrize("n", [0, 2])
def test_logical_dns_locality_count_in_c_core_words(n):
    """C-core ClusterTypeTest.LogicalDnsMissingLocalities / TooManyLocalities."""
    c = cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.LOGICAL_DNS)
    c.load_assignment.SetInParent()
    for _ in range(n):
        c.load_assignment.endpoints.add()
    assert (
        "load_assignment.endpoints: must contain exactly one locality for LOGICAL_DNS cluster, "
        f"found {n}"
    ) in _err(CLUSTER, c)


def test_logical_dns_endpoint_count_in_c_core_words():
    c = cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.LOGICAL_DNS)
    c.load_assignment.endpoints.add()
    assert (
        "load_assignment.endpoints[0].lb_endpoints: must contain exactly one endpoint for "
        "LOGICAL_DNS cluster, found 0"
    ) in _err(CLUSTER, c)


def test_logical_dns_reports_every_socket_address_problem():
    """C-core ClusterTypeTest.LogicalDnsSocketAddressInvalid."""
    c = logical_dns(resolver_name="dns")
    sa = c.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    sa.ClearField("address")
    sa.ClearField("port_value")
    err = _err(CLUSTER, c)
    p = "load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address"
    assert f"{p}.address: field not present" in err
    assert f"{p}.port_value: field not present" in err
    assert f"{p}.resolver_name: LOGICAL_DNS clusters must NOT have a custom resolver name" in err


def test_unparseable_aggregate_config_is_nacked():
    """C-core ClusterTypeTest.AggregateClusterUnparseableProto."""
    c = cluster_pb2.Cluster(name="foo")
    c.cluster_type.name = "envoy.clusters.aggregate"
    c.cluster_type.typed_config.type_url = (
        "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig"
    )
    c.cluster_type.typed_config.value = b"\0"
    assert "can't parse aggregate cluster config" in _err(CLUSTER, c)


def test_unsupported_lb_policy_enum_in_c_core_words():
    """C-core LbPolicyTest.EnumUnsupportedPolicy."""
    c = eds_cluster()
    c.lb_policy = cluster_pb2.Cluster.MAGLEV
    assert "lb_policy: LB policy is not supported" in _err(CLUSTER, c)


def test_ring_hash_lb_policy_enum_is_accepted():
    """C-core accepts RING_HASH (e.g. Istio consistentHash): with its
    ring_hash_lb_config it becomes ring_hash_experimental (A42), which is
    registered, so the cluster is ACKed."""
    c = eds_cluster()
    c.lb_policy = cluster_pb2.Cluster.RING_HASH
    assert _ok(CLUSTER, c).lb_policy_json() == [
        {"ring_hash_experimental": {"minRingSize": 1024, "maxRingSize": 8388608}}
    ]
    c.ring_hash_lb_config.minimum_ring_size.value = 20
    c.ring_hash_lb_config.maximum_ring_size.value = 2000
    assert _ok(CLUSTER, c).lb_policy_json() == [
        {"ring_hash_experimental": {"minRingSize": 20, "maxRingSize": 2000}}
    ]


def test_least_request_lb_policy_enum_converts_to_wrr_locality_over_least_request():
    """A48: the legacy LEAST_REQUEST enum (with least_request_lb_config) maps to
    xds_wrr_locality over least_request_experimental.  C-core 1.85 NACKs it
    (no least_request there); grpc-go and grpc-java accept it, as pyxds does."""
    c = eds_cluster()
    c.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
    c.least_request_lb_config.choice_count.value = 4
    resource = _ok(CLUSTER, c)
    assert resource.lb_policy_json() == [
        {
            "xds_wrr_locality_experimental": {
                "childPolicy": [{"least_request_experimental": {"choiceCount": 4}}]
            }
        }
    ]


def test_least_request_lb_policy_enum_with_choice_count_below_two_is_nacked():
    c = eds_cluster()
    c.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
    c.least_request_lb_config.choice_count.value = 1
    assert "least_request_lb_config.choice_count" in _err(CLUSTER, c)


def _tls_cluster(ctx) -> cluster_pb2.Cluster:
    c = eds_cluster()
    c.transport_socket.name = "envoy.transport_sockets.tls"
    c.transport_socket.typed_config.Pack(ctx)
    return c


def test_upstream_tls_context_without_ca_is_nacked():
    """C-core TlsConfigTest.CaCertProviderUnset; grpcio 1.85.3's words (checked live)."""
    err = _err(CLUSTER, _tls_cluster(tls_pb2.UpstreamTlsContext()))
    assert "common_tls_context: no CA certs configured" in err


@pytest.mark.parametrize("how", ["provider", "system_root", "combined"])
def test_upstream_tls_context_with_a_ca_is_accepted(how):
    """C-core TlsConfigTest.MinimumValidConfig (and A82 system root certs)."""
    ctx = tls_pb2.UpstreamTlsContext()
    common = ctx.common_tls_context
    if how == "provider":
        common.validation_context.ca_certificate_provider_instance.instance_name = "p"
    elif how == "system_root":
        common.validation_context.system_root_certs.SetInParent()
    else:
        vc = common.combined_validation_context.default_validation_context
        vc.ca_certificate_provider_instance.instance_name = "p"
    _ok(CLUSTER, _tls_cluster(ctx))


def test_unparseable_upstream_tls_context_is_nacked():
    """C-core TlsConfigTest.UnparseableUpstreamTlsContext."""
    c = _tls_cluster(tls_pb2.UpstreamTlsContext())
    c.transport_socket.typed_config.value = b"\0"
    assert "can't decode UpstreamTlsContext" in _err(CLUSTER, c)


def test_unknown_transport_socket_type_in_c_core_words():
    """C-core TlsConfigTest.UnknownTransportSocketType."""
    c = eds_cluster()
    c.transport_socket.typed_config.Pack(cluster_pb2.Cluster())
    assert (
        "transport_socket.typed_config.value[envoy.config.cluster.v3.Cluster].type_url: "
        "unsupported transport socket type"
    ) in _err(CLUSTER, c)


# ---------------------------------------------------------------- LDS, C-core's words

HCM_VALUE = (
    "api_listener.api_listener.value["
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager]"
)


def test_listener_with_neither_address_nor_api_listener_is_nacked():
    """C-core XdsListenerTest.NeitherAddressNotApiListener."""
    err = _err(LISTENER, listener_pb2.Listener(name="foo"))
    assert err == "Listener has neither address nor ApiListener"


def _hcm_listener(*filters) -> listener_pb2.Listener:
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.rds.route_config_name = "rds_name"
    hcm.rds.config_source.self.SetInParent()
    for name, msg, optional in filters:
        f = hcm.http_filters.add(name=name, is_optional=optional)
        f.typed_config.Pack(msg)
    lis = listener_pb2.Listener(name="foo")
    lis.api_listener.api_listener.Pack(hcm)
    return lis


def test_http_filter_type_not_supported_in_c_core_words():
    """C-core HttpConnectionManagerTest.HttpFilterTypeNotSupported."""
    err = _err(LISTENER, _hcm_listener(("router", listener_pb2.Listener(), False)))
    assert (
        f"{HCM_VALUE}.http_filters[0].typed_config.value[envoy.config.listener.v3.Listener]: "
        "unsupported filter type"
    ) in err


def test_server_only_filter_on_client_in_c_core_words():
    """C-core HttpConnectionManagerClientOrServerOnlyTest.HttpFilterNotSupportedOnClient
    (and ...ButOptional: skipped)."""
    err = _err(
        LISTENER,
        _hcm_listener(("rbac", rbac_pb2.RBAC(), False), ("router", router_pb2.Router(), False)),
    )
    assert (
        f"{HCM_VALUE}.http_filters[0].typed_config.value[envoy.extensions.filters.http.rbac.v3"
        ".RBAC]: filter is not supported on clients"
    ) in err
    got = _ok(
        LISTENER,
        _hcm_listener(("rbac", rbac_pb2.RBAC(), True), ("router", router_pb2.Router(), False)),
    )
    assert [f.name for f in got.http_filters] == ["router"]


def test_terminal_filter_not_last_reports_both_problems():
    """C-core HttpConnectionManagerTest.TerminalFilterNotLast (client)."""
    err = _err(
        LISTENER,
        _hcm_listener(
            ("router", router_pb2.Router(), False), ("fault", fault_pb2.HTTPFault(), False)
        ),
    )
    assert (
        "terminal filter for config type envoy.extensions.filters.http.router.v3.Router must be "
        "the last filter in the chain"
    ) in err
    assert (
        "non-terminal filter for config type envoy.extensions.filters.http.fault.v3.HTTPFault "
        "is the last filter in the chain"
    ) in err


def test_rds_config_source_errors_name_the_hcm_field():
    """C-core HttpConnectionManagerTest.RdsConfigSourceNotAdsOrSelf / NotSet."""
    lis = _hcm_listener(("router", router_pb2.Router(), False))
    hcm = hcm_pb2.HttpConnectionManager()
    lis.api_listener.api_listener.Unpack(hcm)
    hcm.rds.config_source.path_config_source.path = "/foo/bar"
    lis.api_listener.api_listener.Pack(hcm)
    assert f"{HCM_VALUE}.rds.config_source: ConfigSource does not specify ADS or SELF" in _err(
        LISTENER, lis
    )
    hcm.rds.ClearField("config_source")
    lis.api_listener.api_listener.Pack(hcm)
    assert f"{HCM_VALUE}.rds.config_source: field not present" in _err(LISTENER, lis)


def test_registering_a_filter_type_makes_its_overrides_valid_even_for_remembered_rds():
    """RDS results are memoized by bytes; a newly supported filter type must
    not leave a remembered NACK behind."""
    from pyxds.xds.resources import MEMO_MIN_BYTES, listener

    rc = rc_with(*[route(f"/svc{i}/", f"c{i}") for i in range(MEMO_MIN_BYTES // 20)])
    _override(rc.virtual_hosts[0].routes[0], "x", "type.googleapis.com/some.new.Filter")
    assert len(rc.SerializeToString()) >= MEMO_MIN_BYTES
    assert "unsupported filter type" in _err(ROUTE_CONFIG, rc)
    try:
        listener.register_http_filter("some.new.Filter")
        _ok(ROUTE_CONFIG, rc)
    finally:
        listener.HTTP_FILTER_TYPES.pop("some.new.Filter", None)
        ROUTE_CONFIG.clear_memo()
