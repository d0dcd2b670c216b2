"""RDS validation (A27, A28 "Response validation" as today, A31, A42, A44)."""

from __future__ import annotations

import pytest
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2
from hypothesis import given
from hypothesis import strategies as st

from pyxds.xds.resources import (
    ROUTE_CONFIG,
    ClusterWeight,
    FractionalPercent,
    HeaderMatcher,
    NonForwardingAction,
    PathMatch,
    PrefixMatch,
    RegexMatch,
    RouteAction,
    RouteConfiguration,
    UnsupportedAction,
)
from pyxds.xds.resources import route_config as route_config_module


def rc_with(*routes: rc_pb2.Route, domains=("*",)) -> route_pb2.RouteConfiguration:
    rc = route_pb2.RouteConfiguration(name="rc")
    vh = rc.virtual_hosts.add(name="vh", domains=list(domains))
    for r in routes:
        vh.routes.append(r)
    return rc


def route(prefix: str | None = "", cluster: str | None = "c1") -> rc_pb2.Route:
    r = rc_pb2.Route()
    if prefix is not None:
        r.match.prefix = prefix
    if cluster is not None:
        r.route.cluster = cluster
    return r


def decode_ok(rc: route_pb2.RouteConfiguration) -> RouteConfiguration:
    result = ROUTE_CONFIG.decode(rc.SerializeToString())
    assert result.error is None, result.error
    assert result.name == "rc"
    return result.resource


def decode_err(rc: route_pb2.RouteConfiguration) -> str:
    result = ROUTE_CONFIG.decode(rc.SerializeToString())
    assert result.resource is None and result.name == "rc"
    return result.error


def routes_of(rc: route_pb2.RouteConfiguration):
    return decode_ok(rc).virtual_hosts[0].routes


# ---------------------------------------------------------------- virtual hosts


def test_virtual_hosts_and_domains_are_kept_in_order():
    rc = route_pb2.RouteConfiguration(name="rc")
    rc.virtual_hosts.add(name="a", domains=["a.com", "*.b.com"]).routes.append(route())
    rc.virtual_hosts.add(name="b", domains=["*"]).routes.append(route())
    got = decode_ok(rc)
    assert [v.name for v in got.virtual_hosts] == ["a", "b"]
    assert got.virtual_hosts[0].domains == ("a.com", "*.b.com")


def test_virtual_host_without_domains_is_rejected():
    rc = rc_with(route(), domains=())
    assert "virtual_hosts[0].domains: must be non-empty" in decode_err(rc)


@pytest.mark.parametrize("bad", ["", "a*b.com", "a.*.com"])
def test_invalid_domain_pattern_is_rejected(bad):
    rc = rc_with(route(), domains=("ok.com", bad))
    assert "virtual_hosts[0].domains[1]: invalid domain pattern" in decode_err(rc)


@pytest.mark.parametrize("good", ["*", "*.a.com", "a.*", "exact.com:8080", "*a*"])
def test_valid_domain_patterns(good):
    assert decode_ok(rc_with(route(), domains=(good,))).virtual_hosts[0].domains == (good,)


# ---------------------------------------------------------------- path specifiers


def test_prefix_path_and_regex_matches():
    r1 = route("/svc/")
    r2 = rc_pb2.Route()
    r2.match.path = "/svc/Method"
    r2.route.cluster = "c2"
    r3 = rc_pb2.Route()
    r3.match.safe_regex.regex = "/svc/.*"
    r3.route.cluster = "c3"
    got = routes_of(rc_with(r1, r2, r3))
    assert got[0].match.path_specifier == PrefixMatch("/svc/")
    assert got[1].match.path_specifier == PathMatch("/svc/Method")
    spec = got[2].match.path_specifier
    assert spec == RegexMatch("/svc/.*")
    assert spec.regex.fullmatch("/svc/Anything") is not None


def test_empty_prefix_matches_everything():
    assert routes_of(rc_with(route("")))[0].match.path_specifier == PrefixMatch("")


def test_missing_match_is_rejected():
    assert "routes[0].match: field not present" in decode_err(rc_with(route(None)))


def test_missing_path_specifier_is_rejected():
    r = route(None)
    r.match.case_sensitive.value = True
    assert "routes[0].match: invalid path specifier" in decode_err(rc_with(r))


def test_unsupported_path_specifier_is_rejected():
    r = rc_pb2.Route()
    r.match.path_separated_prefix = "/a"
    r.route.cluster = "c"
    err = decode_err(rc_with(r))
    assert "routes[0].match: invalid path specifier" in err


def test_invalid_regex_is_rejected_naming_the_field():
    r = rc_pb2.Route()
    r.match.safe_regex.regex = "(unclosed"
    r.route.cluster = "c"
    err = decode_err(rc_with(route(), r))
    assert "virtual_hosts[0].routes[1].match: error creating path matcher: Invalid regex" in err


def test_regex_re2_rejects_lookahead():
    r = rc_pb2.Route()
    r.match.safe_regex.regex = "(?=a)b"
    r.route.cluster = "c"
    assert "match: error creating path matcher: Invalid regex" in decode_err(rc_with(r))


@pytest.mark.parametrize("prefix", ["/a/b/", "/a/b/c", "//", "//a"])
def test_prefix_that_cannot_match_service_method_ignores_the_route(prefix):
    got = routes_of(rc_with(route(prefix, "never"), route("", "last")))
    assert [r.action.cluster for r in got] == ["last"]


@pytest.mark.parametrize("prefix", ["/", "/a", "/a/", "/a/b"])
def test_prefix_that_can_match_is_kept(prefix):
    assert routes_of(rc_with(route(prefix)))[0].match.path_specifier == PrefixMatch(prefix)


@pytest.mark.parametrize("path", ["/a", "/a/", "//m", "/a/b/c", "/"])
def test_path_not_service_slash_method_ignores_the_route(path):
    r = rc_pb2.Route()
    r.match.path = path
    r.route.cluster = "never"
    got = routes_of(rc_with(r, route("", "last")))
    assert [x.action.cluster for x in got] == ["last"]


def test_query_parameters_route_is_ignored_before_its_header_errors():
    r = route("/")
    r.match.headers.add(name="x")  # invalid, but the route is ignored anyway
    r.match.query_parameters.add(name="q")
    assert len(routes_of(rc_with(r, route("")))) == 1


def test_prefix_or_path_not_starting_with_slash_ignores_the_route():
    r1 = route("svc/")
    r2 = rc_pb2.Route()
    r2.match.path = "svc/Method"
    r2.route.cluster = "c"
    r3 = rc_pb2.Route()
    r3.match.path = ""
    r3.route.cluster = "c"
    got = routes_of(rc_with(r1, r2, r3, route("", "last")))
    assert [r.action.cluster for r in got] == ["last"]


def test_case_sensitive_default_true_and_explicit_false():
    r1 = route("/a")
    r2 = route("/b")
    r2.match.case_sensitive.value = False
    r3 = route("/c")
    r3.match.case_sensitive.value = True
    got = routes_of(rc_with(r1, r2, r3))
    assert [r.match.case_sensitive for r in got] == [True, False, True]


def test_case_insensitive_regex_is_compiled_case_insensitive():
    r = rc_pb2.Route()
    r.match.safe_regex.regex = "/svc/method"
    r.match.case_sensitive.value = False
    r.route.cluster = "c"
    spec = routes_of(rc_with(r))[0].match.path_specifier
    assert spec.regex.fullmatch("/SVC/Method") is not None


def test_query_parameters_ignore_the_route():
    r = route("/")
    r.match.query_parameters.add(name="q")
    got = routes_of(rc_with(r, route("", "fallback")))
    assert len(got) == 1 and got[0].action.cluster == "fallback"


def test_grpc_and_tls_context_matchers_are_ignored_but_route_kept():
    r = route("/")
    r.match.grpc.SetInParent()
    r.match.tls_context.presented.value = True
    assert len(routes_of(rc_with(r))) == 1


# ---------------------------------------------------------------- runtime fraction


@pytest.mark.parametrize(
    ("den", "num", "per_million"),
    [(0, 50, 500_000), (1, 50, 5_000), (2, 50, 50), (0, 200, 1_000_000)],
)
def test_runtime_fraction_default_value(den, num, per_million):
    r = route("/")
    r.match.runtime_fraction.default_value.numerator = num
    r.match.runtime_fraction.default_value.denominator = den
    r.match.runtime_fraction.runtime_key = "ignored"
    frac = routes_of(rc_with(r))[0].match.runtime_fraction
    assert frac == FractionalPercent(num, (100, 10_000, 1_000_000)[den])
    assert frac.per_million == per_million


def test_runtime_fraction_unknown_denominator_is_rejected():
    r = route("/")
    r.match.runtime_fraction.default_value.numerator = 1
    r.match.runtime_fraction.default_value.denominator = 7
    err = decode_err(rc_with(r))
    assert "routes[0].match.runtime_fraction.default_value.denominator" in err


def test_no_runtime_fraction_is_none():
    assert routes_of(rc_with(route("/")))[0].match.runtime_fraction is None


# ---------------------------------------------------------------- header matchers


def header_route(**fields) -> rc_pb2.Route:
    r = route("/")
    h = r.match.headers.add(name="x-h")
    for key, value in fields.items():
        if key == "range_match":
            h.range_match.start, h.range_match.end = value
        elif key == "safe_regex_match":
            h.safe_regex_match.regex = value
        elif key == "string_match":
            kind, val, ic = value
            if kind == "safe_regex":
                h.string_match.safe_regex.regex = val
            else:
                setattr(h.string_match, kind, val)
            h.string_match.ignore_case = ic
        else:
            setattr(h, key, value)
    return r


def header_of(**fields) -> HeaderMatcher:
    return routes_of(rc_with(header_route(**fields)))[0].match.headers[0]


def test_header_exact():
    h = header_of(exact_match="v", invert_match=True)
    assert (h.name, h.kind, h.value, h.invert_match) == ("x-h", "exact", "v", True)
    assert h.matches("w") and not h.matches("v")


def test_header_safe_regex():
    h = header_of(safe_regex_match="a+b")
    assert h.kind == "safe_regex" and h.matches("aab") and not h.matches("aabc")


def test_header_safe_regex_invalid_is_rejected():
    err = decode_err(rc_with(header_route(safe_regex_match="a(")))
    assert "routes[0].match.headers[0]: cannot create header matcher: Invalid regex" in err


def test_header_range():
    h = header_of(range_match=(10, 20))
    assert (h.kind, h.range_start, h.range_end) == ("range", 10, 20)
    assert h.matches("10") and h.matches("19") and not h.matches("20") and not h.matches("x")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("15", True),
        (" 15 ", True),
        ("+15", True),
        ("-5", False),
        ("1_5", False),
        ("\u0661\u0665", False),
    ],
)
def test_header_range_parses_values_like_c_core(value, expected):
    assert header_of(range_match=(10, 20)).matches(value) is expected
    assert header_of(range_match=(-10, 0)).matches("-5") is True


def test_header_range_end_before_start_is_rejected():
    err = decode_err(rc_with(header_route(range_match=(20, 10))))
    assert "routes[0].match.headers[0]: cannot create header matcher: Invalid range" in err


def test_header_present():
    h = header_of(present_match=True)
    assert h.kind == "present" and h.matches("") and not h.matches(None)
    h = header_of(present_match=True, invert_match=True)
    assert h.matches(None) and not h.matches("x")


@pytest.mark.parametrize(
    ("field", "value", "kind", "yes", "no"),
    [
        ("prefix_match", "ab", "prefix", "abc", "cab"),
        ("suffix_match", "bc", "suffix", "abc", "bca"),
        ("contains_match", "b", "contains", "abc", "ac"),
    ],
)
def test_header_prefix_suffix_contains(field, value, kind, yes, no):
    h = header_of(**{field: value})
    assert h.kind == kind and h.value == value and h.matches(yes) and not h.matches(no)


@pytest.mark.parametrize(
    ("kind", "value", "yes", "no"),
    [
        ("exact", "AbC", "abc", "abd"),
        ("prefix", "AB", "abc", "cab"),
        ("suffix", "BC", "abc", "bca"),
        ("contains", "B", "abc", "ac"),
    ],
)
def test_header_string_match_ignore_case(kind, value, yes, no):
    h = header_of(string_match=(kind, value, True))
    assert h.kind == kind and h.ignore_case and h.matches(yes) and not h.matches(no)


def test_header_string_match_safe_regex():
    h = header_of(string_match=("safe_regex", "x.z", False))
    assert h.kind == "safe_regex" and h.matches("xyz") and not h.matches("XYZ")


def test_header_string_match_safe_regex_with_ignore_case_is_rejected_as_c_core_does():
    r = route("/")
    h = r.match.headers.add(name="x")
    h.string_match.safe_regex.regex = "x.z"
    h.string_match.ignore_case = True
    assert (
        "routes[0].match.headers[0].string_match.ignore_case: not supported for regex matcher"
        in decode_err(rc_with(r))
    )


def test_header_string_match_without_pattern_is_rejected():
    r = route("/")
    h = r.match.headers.add(name="x")
    h.string_match.ignore_case = True
    assert "routes[0].match.headers[0].string_match" in decode_err(rc_with(r))


def test_header_without_specifier_is_rejected():
    r = route("/")
    r.match.headers.add(name="x")
    assert "routes[0].match.headers[0]: invalid header matcher" in decode_err(rc_with(r))


def test_virtual_host_retry_policy_applies_to_routes_without_one():
    rc = rc_with(route("/a", "c"), route("/b", "d"))
    rc.virtual_hosts[0].retry_policy.retry_on = "unavailable"
    own = rc.virtual_hosts[0].routes[1].route.retry_policy
    own.retry_on = "cancelled"
    got = decode_ok(rc).virtual_hosts[0]
    assert got.retry_policy.retry_on == ("unavailable",)
    assert got.routes[0].action.retry_policy.retry_on == ("unavailable",)
    assert got.routes[1].action.retry_policy.retry_on == ("cancelled",)


def test_plugin_name_empty_and_duplicate_are_rejected():
    rc = with_plugin(True, with_plugin(True, rc_with(plugin_route(""))))
    err = decode_err(rc)
    assert 'cluster_specifier_plugins[1].extension.name: duplicate name "rls"' in err
    assert "routes[0].route.cluster_specifier_plugin: must be non-empty" in err


def test_hash_policy_regex_rewrite_without_pattern_is_rejected():
    r = route("/")
    hp = r.route.hash_policy.add()
    hp.header.header_name = "x"
    hp.header.regex_rewrite.substitution = "y"
    assert "route.hash_policy[0].header.regex_rewrite.pattern: field not present" in decode_err(
        rc_with(r)
    )


def test_invert_match_on_absent_header_does_not_match():
    # grpc-go#4902: Envoy semantics, an absent header never matches a value matcher
    h = header_of(exact_match="v", invert_match=True)
    assert not h.matches(None)


# ---------------------------------------------------------------- actions


def test_cluster_action():
    assert routes_of(rc_with(route("/", "c1")))[0].action == RouteAction(cluster="c1")


def test_empty_cluster_name_is_rejected():
    r = route("/", None)
    r.route.cluster = ""
    assert "routes[0].route.cluster: must be non-empty" in decode_err(rc_with(r))


def weighted(*pairs, total=None) -> rc_pb2.Route:
    r = route("/", None)
    wc = r.route.weighted_clusters
    for name, w in pairs:
        c = wc.clusters.add(name=name)
        if w is not None:
            c.weight.value = w
    if total is not None:
        wc.total_weight.value = total
    return r


def test_weighted_clusters():
    action = routes_of(rc_with(weighted(("a", 30), ("b", 70))))[0].action
    assert action.weighted_clusters == (ClusterWeight("a", 30), ClusterWeight("b", 70))
    assert action.cluster is None and action.total_weight == 100


def test_weighted_clusters_zero_weight_entries_dropped():
    action = routes_of(rc_with(weighted(("a", 0), ("b", 5))))[0].action
    assert action.weighted_clusters == (ClusterWeight("b", 5),)


def test_weighted_cluster_without_weight_is_rejected():
    err = decode_err(rc_with(weighted(("a", 5), ("b", None))))
    assert "route.weighted_clusters.clusters[1].weight: field not present" in err


def test_weighted_clusters_sum_zero_is_rejected():
    err = decode_err(rc_with(route(), weighted(("a", 0), ("b", 0))))
    assert "virtual_hosts[0].routes[1].route.weighted_clusters: no valid clusters specified" in err


def test_weighted_clusters_total_weight_is_ignored():
    """total_weight is deprecated; C-core, grpc-go and grpc-java use the sum."""
    assert routes_of(rc_with(weighted(("a", 1), ("b", 2), total=3)))[0].action.total_weight == 3
    action = routes_of(rc_with(weighted(("a", 1), ("b", 2), total=100)))[0].action
    assert action.weighted_clusters == (ClusterWeight("a", 1), ClusterWeight("b", 2))
    assert action.total_weight == 3


def test_weighted_clusters_sum_over_uint32_is_rejected():
    err = decode_err(rc_with(weighted(("a", 0xFFFFFFFF), ("b", 1))))
    assert "route.weighted_clusters: sum of cluster weights exceeds uint32 max" in err


def test_weighted_cluster_empty_name_is_rejected():
    err = decode_err(rc_with(weighted(("", 5))))
    assert "route.weighted_clusters.clusters[0].name: must be non-empty" in err


def test_cluster_header_route_is_ignored():
    r = route("/", None)
    r.route.cluster_header = "x-cluster"
    got = routes_of(rc_with(r, route("", "fallback")))
    assert [x.action.cluster for x in got] == ["fallback"]


def test_route_action_without_cluster_specifier_is_ignored():
    r = route("/", None)
    r.route.SetInParent()
    got = routes_of(rc_with(r, route("", "fallback")))
    assert [x.action.cluster for x in got] == ["fallback"]


def test_non_forwarding_action_is_kept_and_other_actions_are_unsupported():
    """A36: servers serve non_forwarding_action routes and fail RPCs matching
    any other non-route action (redirect here) with UNAVAILABLE; the two
    must stay distinguishable."""
    r1 = route("/a", None)
    r1.non_forwarding_action.SetInParent()
    r2 = route("/b", None)
    r2.redirect.host_redirect = "x"
    got = routes_of(rc_with(r1, r2))
    assert [x.action for x in got] == [NonForwardingAction(), UnsupportedAction("redirect")]
    assert got[0].max_stream_duration is None


# ---------------------------------------------------------------- cluster specifier plugins


def with_plugin(optional: bool, rc=None) -> route_pb2.RouteConfiguration:
    from envoy.extensions.filters.http.router.v3 import router_pb2

    rc = rc or route_pb2.RouteConfiguration(name="rc")
    p = rc.cluster_specifier_plugins.add(is_optional=optional)
    p.extension.name = "rls"
    p.extension.typed_config.Pack(router_pb2.Router())
    return rc


def plugin_route(name="rls") -> rc_pb2.Route:
    r = route("/", None)
    r.route.cluster_specifier_plugin = name
    return r


def test_unsupported_required_plugin_is_rejected():
    rc = with_plugin(False, rc_with(plugin_route()))
    err = decode_err(rc)
    assert "cluster_specifier_plugins[0].extension.typed_config.value[" in err
    assert "]: unsupported ClusterSpecifierPlugin type" in err


def test_unsupported_optional_plugin_ignores_routes_using_it():
    rc = with_plugin(True, rc_with(plugin_route(), route("", "fallback")))
    got = decode_ok(rc)
    assert [r.action.cluster for r in got.virtual_hosts[0].routes] == ["fallback"]
    assert got.cluster_specifier_plugins == ()


def test_route_naming_an_undeclared_plugin_is_rejected():
    err = decode_err(rc_with(plugin_route("nope")))
    assert "routes[0].route.cluster_specifier_plugin: unknown cluster specifier plugin" in err


# ---------------------------------------------------------------- A31 timeouts


def test_max_stream_duration_uses_grpc_timeout_header_max_first():
    r = route("/")
    r.route.max_stream_duration.max_stream_duration.seconds = 10
    r.route.max_stream_duration.grpc_timeout_header_max.seconds = 3
    got = routes_of(rc_with(r))[0]
    assert got.action.max_stream_duration == 3.0 and got.max_stream_duration == 3.0


def test_max_stream_duration_falls_back_to_max_stream_duration():
    r = route("/")
    r.route.max_stream_duration.max_stream_duration.seconds = 10
    assert routes_of(rc_with(r))[0].max_stream_duration == 10.0


def test_grpc_timeout_header_max_zero_is_kept_as_zero():
    r = route("/")
    r.route.max_stream_duration.grpc_timeout_header_max.SetInParent()
    r.route.max_stream_duration.max_stream_duration.seconds = 10
    assert routes_of(rc_with(r))[0].max_stream_duration == 0.0


def test_max_stream_duration_unset_is_none():
    r = route("/")
    r.route.max_stream_duration.SetInParent()
    assert routes_of(rc_with(r))[0].max_stream_duration is None


def test_invalid_duration_is_rejected_naming_the_field():
    r = route("/")
    r.route.max_stream_duration.grpc_timeout_header_max.nanos = -1
    err = decode_err(rc_with(r))
    assert "route.max_stream_duration.grpc_timeout_header_max.nanos: value must be" in err


# ---------------------------------------------------------------- hash and retry policies


def test_hash_policies_header_and_channel_id():
    r = route("/")
    hp = r.route.hash_policy.add(terminal=True)
    hp.header.header_name = "x-user"
    hp.header.regex_rewrite.pattern.regex = "a"
    hp.header.regex_rewrite.substitution = "b"
    r.route.hash_policy.add().filter_state.key = "io.grpc.channel_id"
    r.route.hash_policy.add().cookie.name = "ignored"
    policies = routes_of(rc_with(r))[0].action.hash_policies
    assert [(p.kind, p.header_name, p.terminal) for p in policies] == [
        ("header", "x-user", True),
        ("channel_id", "", False),
    ]
    assert (policies[0].regex_str, policies[0].substitution) == ("a", "b")
    assert policies[0].regex is not None


def test_hash_policy_bad_regex_is_rejected():
    r = route("/")
    hp = r.route.hash_policy.add()
    hp.header.header_name = "x"
    hp.header.regex_rewrite.pattern.regex = "("
    assert (
        "route.hash_policy[0].header.regex_rewrite.pattern.regex: errors compiling"
        in decode_err(rc_with(r))
    )


def test_retry_policy():
    r = route("/")
    rp = r.route.retry_policy
    rp.retry_on = "unavailable, cancelled,5xx"
    rp.num_retries.value = 3
    rp.retry_back_off.base_interval.nanos = 100_000_000
    policy = routes_of(rc_with(r))[0].action.retry_policy
    # words compared exactly, as C-core: " cancelled" is not "cancelled"
    assert policy.retry_on == ("unavailable",)
    assert policy.num_retries == 3
    assert policy.base_interval == pytest.approx(0.1) and policy.max_interval == pytest.approx(1.0)


def test_retry_policy_invalid_fields_are_rejected():
    r = route("/")
    rp = r.route.retry_policy
    rp.num_retries.value = 0
    rp.retry_back_off.max_interval.seconds = 1
    err = decode_err(rc_with(r))
    assert "route.retry_policy.num_retries: must be greater than 0" in err
    assert "route.retry_policy.retry_back_off.base_interval: field not present" in err


# ---------------------------------------------------------------- values


def test_same_bytes_decode_to_equal_values():
    r = header_route(safe_regex_match="a.*")
    r.match.runtime_fraction.default_value.numerator = 3
    rc = rc_with(r, weighted(("a", 1), ("b", 2)), route("/x"))
    data = rc.SerializeToString()
    a = ROUTE_CONFIG.decode(data).resource
    b = ROUTE_CONFIG.decode(data).resource
    assert a == b and hash(a) == hash(b)
    assert a is not b


def test_different_routes_decode_to_different_values():
    a = decode_ok(rc_with(route("/a")))
    b = decode_ok(rc_with(route("/b")))
    assert a != b


def test_all_errors_are_reported():
    bad1 = route("/", None)
    bad1.route.cluster = ""
    bad2 = weighted(("a", 0))
    err = decode_err(rc_with(bad1, bad2))
    assert "routes[0].route.cluster" in err and "routes[1].route.weighted_clusters" in err


def test_cluster_names_do_not_collide_with_shared_values():
    # identical actions/matches are shared inside one decode; a cluster whose
    # name looks like an internal cache key must still get its own action
    got = routes_of(rc_with(route("", "match_all"), route("", "p"), route("/x", "c")))
    assert [r.action.cluster for r in got] == ["match_all", "p", "c"]
    assert got[0].match.path_specifier == PrefixMatch("")


def test_identical_actions_in_one_resource_are_shared():
    got = routes_of(
        rc_with(route("/a", "c"), route("/b", "c"), weighted(("x", 1)), weighted(("x", 1)))
    )
    assert got[0].action is got[1].action
    assert got[2].action is got[3].action


def _reference_prefix_ok(prefix: str) -> bool:
    if prefix[0] != "/":
        return False
    parts = prefix[1:].split("/", 2)
    return len(parts) <= 2 and not (len(parts) == 2 and not parts[0])


def _reference_path_ok(path: str) -> bool:
    if not path or path[0] != "/":
        return False
    parts = path[1:].split("/", 2)
    return len(parts) == 2 and bool(parts[0]) and bool(parts[1])


@given(st.text(alphabet="/ab", min_size=1, max_size=8))
def test_prefix_and_path_shape_rules_match_their_definition(text):
    assert route_config_module._prefix_can_match(text) == _reference_prefix_ok(text)
    assert route_config_module._path_can_match(text) == _reference_path_ok(text)
