"""Virtual-host selection and route matching (A28 latest, A27)."""

from __future__ import annotations

import random

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from pyxds.resolver.route_matching import (
    RouteTable,
    domain_matches,
    header_value,
    select_virtual_host,
)
from pyxds.xds.resources.types import (
    FractionalPercent,
    HeaderMatcher,
    PathMatch,
    PrefixMatch,
    RegexMatch,
    RouteMatch,
    VirtualHost,
)


def vh(name: str, *domains: str) -> VirtualHost:
    return VirtualHost(name, domains, ())


VHOSTS = [
    vh("exact", "foo.example.com"),
    vh("suffix_long", "*.example.com"),
    vh("suffix_short", "*.com"),
    vh("prefix_long", "foo.example.*"),
    vh("prefix_short", "foo.*"),
    vh("any", "*"),
]


@pytest.mark.parametrize(
    ("authority", "expected"),
    [
        ("foo.example.com", "exact"),
        ("FOO.Example.COM", "exact"),  # case-insensitive
        ("bar.example.com", "suffix_long"),
        ("bar.other.com", "suffix_short"),
        ("foo.example.org", "prefix_long"),
        ("foo.bar", "prefix_short"),
        ("unrelated", "any"),
        (".com", "any"),  # "*.com" needs at least one character before ".com"
        ("foo.", "any"),  # "foo.*" needs at least one character after
    ],
)
def test_virtual_host_most_specific_domain_wins(authority, expected):
    assert select_virtual_host(VHOSTS, authority).name == expected


def test_virtual_host_none_when_nothing_matches_and_bad_patterns_never_match():
    assert select_virtual_host([vh("a", "x.com"), vh("bad", "a*b", "**")], "ab") is None
    assert not domain_matches("a*b", "axb")
    assert domain_matches("*", "anything")


def test_virtual_host_longer_suffix_beats_earlier_shorter_one():
    hosts = [vh("short", "*.com"), vh("long", "*.b.com")]
    assert select_virtual_host(hosts, "a.b.com").name == "long"


def hm(name: str, kind: str, value=None, invert=False, **kw) -> HeaderMatcher:
    regex = re2.compile(value) if kind == "safe_regex" else None
    return HeaderMatcher(name, kind, value, invert_match=invert, regex=regex, **kw)


MD = [("x-a", "alpha"), ("x-multi", "one"), ("x-multi", "two"), ("x-num", "42"),
      ("x-data-bin", b"\x00\x01"), ("Upper", "v")]  # fmt: skip


@pytest.mark.parametrize(
    ("matcher", "expected"),
    [
        (hm("x-a", "exact", "alpha"), True),
        (hm("x-a", "exact", "ALPHA"), False),
        (hm("x-a", "exact", "ALPHA", ignore_case=True), True),
        (hm("x-a", "exact", "alpha", invert=True), False),
        (hm("x-multi", "exact", "one,two"), True),  # several values joined with ","
        (hm("x-a", "prefix", "al"), True),
        (hm("x-a", "suffix", "pha"), True),
        (hm("x-a", "contains", "lph"), True),
        (hm("x-a", "safe_regex", "a.*a"), True),
        (hm("x-a", "safe_regex", "lph"), False),  # full match only
        (hm("x-num", "range", range_start=40, range_end=43), True),
        (hm("x-num", "range", range_start=43, range_end=50), False),
        (hm("x-a", "range", range_start=0, range_end=10), False),  # not a number
        (hm("x-a", "present", present_match=True), True),
        (hm("x-absent", "present", present_match=True), False),
        (hm("x-absent", "present", present_match=False), True),
        (hm("x-absent", "exact", "v"), False),
        # invert_match never turns an absent header into a match (grpc-go#4902).
        (hm("x-absent", "exact", "v", invert=True), False),
        (hm("x-absent", "prefix", "", invert=True), False),
        # "-bin" headers are invisible, even to present_match.
        (hm("x-data-bin", "present", present_match=True), False),
        (hm("x-data-bin", "present", present_match=False), True),
        # content-type reads as application/grpc.
        (hm("content-type", "exact", "application/grpc"), True),
        (hm("upper", "exact", "v"), True),  # metadata keys are case-insensitive
    ],
)
def test_header_matcher_table(matcher, expected):
    table = RouteTable([(RouteMatch(PrefixMatch(""), headers=(matcher,)), "hit")])
    assert (table.match("/s/m", MD) == "hit") is expected


def test_header_value_rules():
    assert header_value(MD, "x-multi") == "one,two"
    assert header_value(MD, "x-data-bin") is None
    assert header_value([], "content-type") == "application/grpc"
    assert header_value(MD, "missing") is None


def test_first_match_wins_even_when_a_later_route_is_exact():
    table = RouteTable(
        [
            (RouteMatch(PrefixMatch("/MyService")), "prefix"),
            (RouteMatch(PathMatch("/MyService/MyMethod")), "path"),
        ]
    )
    assert table.match("/MyService/MyMethod", ()) == "prefix"


def test_case_insensitive_path_and_prefix_and_case_sensitive_regex():
    table = RouteTable(
        [
            (RouteMatch(PathMatch("/svc/Method"), case_sensitive=False), "path"),
            (RouteMatch(PrefixMatch("/Other/"), case_sensitive=False), "prefix"),
            (RouteMatch(RegexMatch("/re/[a-z]+", re2.compile("/re/[a-z]+"))), "regex"),
        ]
    )
    assert table.match("/SVC/method", ()) == "path"
    assert table.match("/other/x", ()) == "prefix"
    assert table.match("/re/abc", ()) == "regex"
    assert table.match("/re/ABC", ()) is None
    assert table.match("/re/abc/", ()) is None  # full match


def test_header_route_falls_through_to_later_route_when_headers_do_not_match():
    table = RouteTable(
        [
            (RouteMatch(PrefixMatch("/s/"), headers=(hm("x-canary", "exact", "1"),)), "canary"),
            (RouteMatch(PrefixMatch("/s/")), "stable"),
        ]
    )
    assert table.match("/s/m", [("x-canary", "1")]) == "canary"
    assert table.match("/s/m", [("x-canary", "0")]) == "stable"
    assert table.match("/s/m", []) == "stable"


def test_runtime_fraction_matches_when_draw_is_below_scaled_numerator():
    fraction = FractionalPercent(25, 100)  # 250_000 per million
    table = RouteTable(
        [
            (RouteMatch(PrefixMatch(""), runtime_fraction=fraction), "sampled"),
            (RouteMatch(PrefixMatch("")), "rest"),
        ]
    )
    assert table.match("/a/b", (), lambda n: 249_999) == "sampled"
    assert table.match("/a/b", (), lambda n: 250_000) == "rest"
    rng = random.Random(2024)
    hits = sum(table.match("/a/b", (), rng.randrange) == "sampled" for _ in range(20000))
    assert abs(hits / 20000 - 0.25) < 0.015


def test_runtime_fraction_above_denominator_is_capped_at_always():
    table = RouteTable(
        [(RouteMatch(PrefixMatch(""), runtime_fraction=FractionalPercent(200, 100)), "x")]
    )
    assert table.match("/a/b", (), lambda n: n - 1) == "x"


# ---------------------------------------------------------------- property test


def reference_match(routes, path, metadata, draw):
    """Linear scan, the obvious definition of first-match-wins."""
    for match, payload in routes:
        spec = match.path_specifier
        if isinstance(spec, PathMatch):
            ok = path == spec.path if match.case_sensitive else path.lower() == spec.path.lower()
        elif isinstance(spec, PrefixMatch):
            ok = (
                path.startswith(spec.prefix)
                if match.case_sensitive
                else path.lower().startswith(spec.prefix.lower())
            )
        else:
            ok = spec.regex.fullmatch(path) is not None
        if not ok:
            continue
        if any(not h.matches(header_value(metadata, h.name.lower())) for h in match.headers):
            continue
        if match.runtime_fraction is not None and draw >= match.runtime_fraction.per_million:
            continue
        return payload
    return None


segments = st.sampled_from(["", "/", "/a", "/a/", "/a/b", "/A/b", "/b/", "/b/c", "/ab"])


@st.composite
def route_matches(draw):
    kind = draw(st.sampled_from(["path", "prefix", "prefix", "regex"]))
    text = draw(segments)
    if kind == "path":
        spec = PathMatch(text)
    elif kind == "prefix":
        spec = PrefixMatch(text)
    else:
        pattern = re2.escape(text) + draw(st.sampled_from(["", ".*", "[a-z]"]))
        spec = RegexMatch(pattern, re2.compile(pattern))
    headers = ()
    if draw(st.booleans()) and draw(st.booleans()):
        headers = (hm("x-h", "exact", draw(st.sampled_from(["1", "2"]))),)
    fraction = None
    if draw(st.integers(0, 5)) == 0:
        fraction = FractionalPercent(draw(st.integers(0, 100)), 100)
    return RouteMatch(spec, draw(st.booleans()), headers, fraction)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(route_matches(), max_size=12),
    st.lists(st.sampled_from(["/a/b", "/A/B", "/b/c", "/ab", "/", "/a/", "/zz"]), min_size=1),
    st.sampled_from([[], [("x-h", "1")], [("x-h", "2")]]),
    st.integers(0, 999_999),
)
def test_indexed_table_agrees_with_a_linear_scan(matches, paths, metadata, draw):
    routes = [(m, i) for i, m in enumerate(matches)]
    table = RouteTable(routes)
    for path in paths + paths:  # twice: the memoised plan must agree too
        assert table.match(path, metadata, lambda n: draw) == reference_match(
            routes, path, metadata, draw
        )
