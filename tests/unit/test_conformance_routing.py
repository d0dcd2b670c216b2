"""Conformance: virtual-host selection, route and header matching, runtime
fraction and weighted-cluster picks (gRFC A28 latest, A27; scenarios from
C-core xds_routing_end2end_test.cc / xds_routing_test.cc, grpc-go
internal/xds/matcher and resolver tests, grpc-java XdsNameResolverTest)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pyxds.resolver.config_selector import NO_ROUTE_MESSAGE, ClusterRef, XdsConfigSelector
from pyxds.resolver.route_matching import RouteTable, header_value, select_virtual_host
from pyxds.testing.fake_xds_client import make_route
from pyxds.xds.resources.types import FractionalPercent, HeaderMatcher, VirtualHost


def vhosts(*domain_lists):
    return [VirtualHost(f"vh{i}", tuple(d), ()) for i, d in enumerate(domain_lists)]


def chosen(hosts, authority):
    vh = select_virtual_host(hosts, authority)
    return None if vh is None else vh.name


# ----------------------------------------------------------------- domains


def test_exact_domain_beats_suffix_prefix_and_wildcard_whatever_the_order():
    """C-core xds_routing_test FindVirtualHostForDomain: exact wins."""
    hosts = vhosts(["*"], ["foo.*"], ["*.example.com"], ["foo.example.com"])
    assert chosen(hosts, "foo.example.com") == "vh3"


def test_longest_suffix_wins_over_shorter_suffix_and_any_prefix():
    """C-core xds_routing_test: suffix match is more specific than prefix."""
    hosts = vhosts(["foo.*"], ["*.com"], ["*.example.com"])
    assert chosen(hosts, "foo.example.com") == "vh2"


def test_longest_prefix_wins_when_no_suffix_matches():
    hosts = vhosts(["*"], ["foo.*"], ["foo.example.*"])
    assert chosen(hosts, "foo.example.org") == "vh2"


def test_universe_domain_is_the_last_resort():
    hosts = vhosts(["bar.example.com"], ["*"])
    assert chosen(hosts, "foo.example.com") == "vh1"


def test_domain_matching_is_case_insensitive_both_ways():
    """A27: domain matching ignores case (C-core lower-cases both sides)."""
    assert chosen(vhosts(["Foo.Example.COM"]), "foo.example.com") == "vh0"
    assert chosen(vhosts(["*.EXAMPLE.com"]), "Foo.example.COM") == "vh0"


def test_wildcard_must_match_at_least_one_character():
    """C-core DomainMatch: "Asterisk must match at least one char"."""
    assert chosen(vhosts(["*.example.com"]), ".example.com") is None
    assert chosen(vhosts(["foo.*"]), "foo.") is None
    assert chosen(vhosts(["*example.com"]), "example.com") is None
    assert chosen(vhosts(["*xample.com"]), "example.com") == "vh0"


def test_first_virtual_host_wins_a_tie_of_equal_specificity():
    hosts = vhosts(["*.example.com"], ["*.example.com"])
    assert chosen(hosts, "a.example.com") == "vh0"
    hosts = vhosts(["*.abc.com"], ["*.xyz.com", "*.abc.com"])
    assert chosen(hosts, "q.abc.com") == "vh0"


def test_authority_with_port_matches_only_patterns_with_the_port():
    hosts = vhosts(["svc"], ["svc:8080"])
    assert chosen(hosts, "svc:8080") == "vh1"
    assert chosen(vhosts(["svc"]), "svc:8080") is None


def test_no_matching_virtual_host_is_none():
    assert chosen(vhosts(["a.com"], ["*.b.com"]), "c.com") is None


# ----------------------------------------------------------------- paths


def table(*routes):
    return RouteTable((r.match, i) for i, r in enumerate(routes))


def test_first_matching_route_wins_even_over_a_later_exact_path():
    """A28 "Picking": prefix /MyService beats a later path /MyService/MyMethod."""
    t = table(make_route("/MyService/"), make_route(path="/MyService/MyMethod"))
    assert t.match("/MyService/MyMethod", ()) == 0


def test_empty_prefix_matches_every_path():
    assert table(make_route("")).match("/any.Service/Method", ()) == 0


def test_case_insensitive_prefix_and_path():
    """A28 latest: case_sensitive=false makes prefix and path matches ignore case."""
    t = table(
        make_route(path="/myservice/mymethod", case_sensitive=False),
        make_route("/OTHER/", case_sensitive=False),
    )
    assert t.match("/MyService/MyMethod", ()) == 0
    assert t.match("/other/Call", ()) == 1
    sensitive = table(make_route(path="/myservice/mymethod"))
    assert sensitive.match("/MyService/MyMethod", ()) is None


def test_case_insensitive_matching_folds_ascii_letters_only():
    """C-core compares domains and case-insensitive paths with absl's ASCII
    helpers (AsciiStrToLower): a pattern with U+212A KELVIN SIGN, which
    Python's str.lower() maps to "k", matches no ASCII authority or path.
    Servers (A36) choose their virtual host and route the same way."""
    assert chosen(vhosts(["\u212a.example"]), "k.example") is None
    assert chosen(vhosts(["*.\u212a"]), "a.k") is None
    assert chosen(vhosts(["K.EXAMPLE"]), "k.example") == "vh0"
    t = table(
        make_route(path="/\u212a/M", case_sensitive=False),
        make_route("/\u212a", case_sensitive=False),
        make_route("/SVC/", case_sensitive=False),
    )
    assert t.match("/k/M", ()) is None
    assert t.match("/svc/M", ()) == 2


def test_regex_path_must_match_the_whole_path():
    """Envoy safe_regex is a full match (C-core RE2::FullMatch)."""
    t = table(make_route(regex="/svc/M.*d"), make_route(regex="/svc"))
    assert t.match("/svc/Method", ()) == 0
    assert t.match("/svc/Methods", ()) is None


def test_no_route_matches_fails_with_c_core_text():
    ref = ClusterRef("a", lambda: None)
    vh = VirtualHost("vh", ("*",), (make_route("/only/", cluster="a"),))
    selector = XdsConfigSelector(vh, {"a": ref})
    call = selector.select("/other/Method", ())
    assert call.status is not None and call.status.details == NO_ROUTE_MESSAGE
    assert call.status.code.name == "UNAVAILABLE"


# ----------------------------------------------------------------- headers


def exact(name, value, invert=False):
    return HeaderMatcher(name, "exact", value, invert)


def matches(matcher, metadata):
    t = table(make_route("", headers=[matcher]))
    return t.match("/s/m", metadata) == 0


def test_bin_headers_are_invisible_to_header_matching():
    """A28 latest: headers ending in -bin behave as absent (C-core
    XdsRouting::GetHeaderValue; grpc-java XdsNameResolverTest)."""
    md = [("custom-bin", b"\x01\x02"), ("text-bin", "abc")]
    assert not matches(HeaderMatcher("custom-bin", "present", present_match=True), md)
    assert matches(HeaderMatcher("custom-bin", "present", present_match=False), md)
    assert not matches(exact("text-bin", "abc"), md)
    assert header_value(md, "text-bin") is None


def test_content_type_reads_as_application_grpc():
    """A28 latest: content-type matches as the hard-coded "application/grpc"."""
    assert matches(exact("content-type", "application/grpc"), ())
    assert matches(exact("content-type", "application/grpc"), [("content-type", "text/x")])
    assert matches(HeaderMatcher("content-type", "present", present_match=True), ())
    assert not matches(exact("content-type", "application/grpc+proto"), ())


def test_several_values_of_one_header_are_joined_with_commas():
    """grpc-go matcher tests / C-core GetStringValue: values joined with ","."""
    md = [("k", "a"), ("other", "x"), ("k", "b"), ("k", "c")]
    assert header_value(md, "k") == "a,b,c"
    assert matches(exact("k", "a,b,c"), md)
    assert not matches(exact("k", "a"), md)
    assert matches(HeaderMatcher("k", "contains", "b,c"), md)


def test_invert_match_on_an_absent_header_does_not_match():
    """TRAPS grpc-go#4902: Envoy semantics, absent header never matches an
    inverted string/regex/range matcher."""
    for matcher in (
        exact("h", "v", invert=True),
        HeaderMatcher("h", "prefix", "v", True),
        HeaderMatcher("h", "suffix", "v", True),
        HeaderMatcher("h", "contains", "v", True),
        HeaderMatcher("h", "range", None, True, range_start=0, range_end=10),
    ):
        assert not matches(matcher, ()), matcher
        # Present with a value the inner matcher rejects: the inversion matches.
        assert matches(matcher, [("h", "zzz")]), matcher


def test_invert_on_present_matcher_inverts_presence():
    assert matches(HeaderMatcher("h", "present", None, True, present_match=True), ())
    assert not matches(HeaderMatcher("h", "present", None, True, present_match=True), [("h", "")])
    assert matches(HeaderMatcher("h", "present", None, True, present_match=False), [("h", "1")])


def test_present_matches_an_empty_value():
    assert matches(HeaderMatcher("h", "present", present_match=True), [("h", "")])


def test_inverted_exact_on_a_present_different_value_matches():
    assert matches(exact("h", "v", invert=True), [("h", "w")])
    assert not matches(exact("h", "v", invert=True), [("h", "v")])


def test_range_matcher_start_inclusive_end_exclusive_and_integer_only():
    """C-core xds_routing_end2end HeaderRangeMatch: [start, end); non-integers fail."""
    m = HeaderMatcher("n", "range", range_start=-5, range_end=10)
    assert matches(m, [("n", "-5")])
    assert matches(m, [("n", "9")])
    assert not matches(m, [("n", "10")])
    assert not matches(m, [("n", "1.5")])
    assert not matches(m, [("n", "abc")])
    assert not matches(m, [("n", "")])


def test_header_matcher_name_is_used_as_given_like_c_core():
    """Differential with grpcio 1.85.1 C-core (and grpc-go's map lookup): a
    matcher named "X-Custom" does not see the (lower-case) "x-custom" key."""
    assert not matches(exact("X-Custom", "v"), [("x-custom", "v")])
    assert matches(HeaderMatcher("X-Custom", "present", present_match=False), [("x-custom", "v")])
    assert matches(exact("x-custom", "v"), [("x-custom", "v")])


def test_all_header_matchers_of_a_route_must_match():
    """C-core xds_routing_end2end HeaderMatchingRoutes: every matcher must pass."""
    route = make_route("", headers=[exact("a", "1"), HeaderMatcher("b", "prefix", "x")])
    t = table(route, make_route(""))
    assert t.match("/s/m", [("a", "1"), ("b", "xyz")]) == 0
    assert t.match("/s/m", [("a", "1"), ("b", "yz")]) == 1
    assert t.match("/s/m", [("b", "xyz")]) == 1


def test_ignore_case_string_matchers():
    md = [("h", "HeLLo")]
    assert matches(HeaderMatcher("h", "exact", "hello", ignore_case=True), md)
    assert matches(HeaderMatcher("h", "prefix", "HEL", ignore_case=True), md)
    assert matches(HeaderMatcher("h", "suffix", "LO", ignore_case=True), md)
    assert not matches(HeaderMatcher("h", "exact", "hello"), md)


def test_header_route_falls_through_to_the_next_route_when_headers_fail():
    t = table(make_route("/s/", headers=[exact("env", "canary")]), make_route("/s/"))
    assert t.match("/s/m", [("env", "canary")]) == 0
    assert t.match("/s/m", [("env", "prod")]) == 1
    assert t.match("/s/m", ()) == 1


# ----------------------------------------------------------------- runtime fraction


def test_runtime_fraction_draws_below_the_scaled_numerator():
    """C-core UnderFraction: rand % 1e6 < per-million numerator."""
    route = make_route("", fraction=FractionalPercent(25, 100))  # 250_000 ppm
    t = table(route, make_route(""))
    assert t.match("/s/m", (), lambda n: 249_999) == 0
    assert t.match("/s/m", (), lambda n: 250_000) == 1


def test_runtime_fraction_zero_never_matches_and_full_always_matches():
    zero = table(make_route("", fraction=FractionalPercent(0, 100)), make_route(""))
    full = table(make_route("", fraction=FractionalPercent(1_000_000, 1_000_000)), make_route(""))
    assert zero.match("/s/m", (), lambda n: 0) == 1
    assert full.match("/s/m", (), lambda n: n - 1) == 0


def test_runtime_fraction_numerator_above_denominator_is_capped_at_100_percent():
    t = table(make_route("", fraction=FractionalPercent(150, 100)), make_route(""))
    assert t.match("/s/m", (), lambda n: n - 1) == 0


def test_runtime_fraction_10000_denominator_is_scaled_to_per_million():
    t = table(make_route("", fraction=FractionalPercent(1, 10_000)), make_route(""))
    assert t.match("/s/m", (), lambda n: 99) == 0
    assert t.match("/s/m", (), lambda n: 100) == 1


def test_runtime_fraction_statistically_splits_traffic():
    """C-core xds_routing_end2end RuntimeFractionMatching: 25% of RPCs."""
    rng = random.Random(1)
    t = table(make_route("", fraction=FractionalPercent(25, 100)), make_route(""))
    hits = sum(t.match("/s/m", (), rng.randrange) == 0 for _ in range(20_000))
    assert 0.23 < hits / 20_000 < 0.27


# ----------------------------------------------------------------- weighted clusters


def weighted_selector(weights, seed=3):
    refs = {name: ClusterRef(name, lambda: None) for name, _ in weights}
    vh = VirtualHost("vh", ("*",), (make_route("", weighted=list(weights)),))
    return XdsConfigSelector(vh, refs, rng=random.Random(seed))


def test_weighted_clusters_split_by_weight():
    """C-core xds_routing_end2end WeightedCluster: 75/25 split."""
    selector = weighted_selector([("a", 75), ("b", 25)])
    counts = Counter()
    for _ in range(20_000):
        call = selector.select("/s/m", ())
        counts[call.call_attributes["cluster"]] += 1
        call.on_committed()
    assert 0.73 < counts["cluster:a"] / 20_000 < 0.77


def test_weighted_clusters_use_the_sum_of_weights_not_total_weight():
    """A28 latest: total_weight is ignored; weights 1:1:2 -> 25/25/50."""
    selector = weighted_selector([("a", 1), ("b", 1), ("c", 2)])
    counts = Counter()
    for _ in range(20_000):
        call = selector.select("/s/m", ())
        counts[call.call_attributes["cluster"]] += 1
        call.on_committed()
    assert 0.47 < counts["cluster:c"] / 20_000 < 0.53
    assert 0.22 < counts["cluster:a"] / 20_000 < 0.28


BOUNDARIES = [(0.0, "cluster:a"), (0.7499, "cluster:a"), (0.75, "cluster:b"), (0.9999, "cluster:b")]


@pytest.mark.parametrize("draw, expected", BOUNDARIES)
def test_weighted_cluster_boundaries_are_half_open(draw, expected):
    class Fixed(random.Random):
        def random(self):
            return draw

    refs = {n: ClusterRef(n, lambda: None) for n in ("a", "b")}
    vh = VirtualHost("vh", ("*",), (make_route("", weighted=[("a", 75), ("b", 25)]),))
    selector = XdsConfigSelector(vh, refs, rng=Fixed())
    assert selector.select("/s/m", ()).call_attributes["cluster"] == expected


def test_weighted_cluster_pick_takes_a_reference_on_the_chosen_cluster():
    """A31: each RPC holds a ref on the cluster the ConfigSelector chose."""
    refs = {n: ClusterRef(n, lambda: None) for n in ("a", "b")}
    vh = VirtualHost("vh", ("*",), (make_route("", weighted=[("a", 1), ("b", 1)]),))
    selector = XdsConfigSelector(vh, refs, rng=random.Random(3))
    call = selector.select("/s/m", ())
    name = call.call_attributes["cluster"].removeprefix("cluster:")
    other = "b" if name == "a" else "a"
    assert (refs[name].count, refs[other].count) == (1, 0)
    call.on_committed()
    assert refs[name].count == 0


# ----------------------------------------------------------------- A31 timeouts


def timeout_of(route_msd, listener_msd):
    refs = {"a": ClusterRef("a", lambda: None)}
    route = make_route("", cluster="a", max_stream_duration=route_msd)
    selector = XdsConfigSelector(VirtualHost("vh", ("*",), (route,)), refs, listener_msd)
    call = selector.select("/s/m", ())
    call.on_committed()
    return call.timeout


def test_route_max_stream_duration_overrides_the_listener_one():
    """A31: the route's max_stream_duration, else the HCM's."""
    assert timeout_of(2.5, 10.0) == 2.5
    assert timeout_of(None, 10.0) == 10.0
    assert timeout_of(None, None) is None


def test_zero_max_stream_duration_means_no_limit_even_with_a_listener_value():
    """A31 / C-core: an explicit 0 on the route disables the timeout."""
    assert timeout_of(0.0, 10.0) is None
    assert timeout_of(None, 0.0) is None


def test_non_forwarding_route_fails_with_c_core_text():
    """C-core XdsConfigSelector: "Matching route has inappropriate action"."""
    vh = VirtualHost("vh", ("*",), (make_route("", non_forwarding=True),))
    call = XdsConfigSelector(vh, {}).select("/s/m", ())
    assert call.status is not None
    assert (call.status.code.name, call.status.details) == (
        "UNAVAILABLE",
        "Matching route has inappropriate action",
    )


def test_domain_pattern_classification_follows_c_core():
    """C-core DomainPatternMatchType: a leading "*" makes a suffix match even
    when the pattern also ends in "*" (the parser accepts "*foo*")."""
    assert chosen(vhosts(["*foo*"]), "afoo*") == "vh0"
    assert chosen(vhosts(["*foo*"]), "afoob") is None
    assert chosen(vhosts(["a*b"]), "axb") is None
