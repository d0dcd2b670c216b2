"""A42 request hash: computed per RPC by the xDS ConfigSelector and handed to
the LB policies as ``call_attributes[REQUEST_HASH_KEY]`` (C-core's rules)."""

from __future__ import annotations

import random

import pytest
import re2
import xxhash

from pyxds.lb.api import REQUEST_HASH_KEY
from pyxds.resolver.api import ResolverArgs
from pyxds.resolver.config_selector import ClusterRef, XdsConfigSelector
from pyxds.resolver.dns import FakeDnsResolver
from pyxds.resolver.request_hash import GlobalReplace, RequestHasher, combine
from pyxds.resolver.xds_resolver import XdsResolver
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock
from pyxds.testing.fake_xds_client import (
    FakeXdsClient,
    eds_cluster,
    make_cla,
    make_listener,
    make_route_config,
)
from pyxds.xds.resources._common import Errors, compile_regex
from pyxds.xds.resources.types import (
    ClusterWeight,
    HashPolicy,
    PrefixMatch,
    Route,
    RouteAction,
    RouteMatch,
    VirtualHost,
)

MASK64 = (1 << 64) - 1


def header(name: str, terminal: bool = False, regex: str | None = None, subst: str = ""):
    compiled = None
    if regex is not None:
        compiled = compile_regex(regex, "test", Errors())
        assert compiled is not None
    return HashPolicy("header", terminal, name, regex, subst, compiled)


def channel_id(terminal: bool = False) -> HashPolicy:
    return HashPolicy("channel_id", terminal)


def rotl(value: int) -> int:
    return ((value << 1) | (value >> 63)) & MASK64


def selector(*policies: HashPolicy, cid: int = 0x1234, weighted=None) -> XdsConfigSelector:
    if weighted is not None:
        action = RouteAction(
            weighted_clusters=tuple(ClusterWeight(n, w) for n, w in weighted),
            hash_policies=policies,
        )
        names = [n for n, _ in weighted]
    else:
        action = RouteAction("a", hash_policies=policies)
        names = ["a"]
    routes = (
        Route(RouteMatch(PrefixMatch("/hashed/")), action),
        Route(RouteMatch(PrefixMatch("/plain/")), RouteAction("a", max_stream_duration=3.0)),
    )
    refs = {n: ClusterRef(n, lambda: None) for n in names}
    vhost = VirtualHost("vh", ("*",), routes)
    return XdsConfigSelector(vhost, refs, rng=random.Random(5), channel_id=cid)


def request_hash(sel: XdsConfigSelector, metadata=(), path: str = "/hashed/M"):
    call = sel.select(path, metadata)
    assert call.status is None
    call.on_committed()
    assert call.call_attributes["cluster"].startswith("cluster:")
    return call.call_attributes.get(REQUEST_HASH_KEY)


# ----------------------------------------------------------------- header


def test_header_hash_is_xxh64_seed_0_of_the_value():
    sel = selector(header("x-user"))
    assert request_hash(sel, [("x-user", "abc")]) == 0x44BC2CF5AD770999  # XXH64("abc", 0)
    assert request_hash(sel, [("x-user", "")]) == 0xEF46DB3751D8E999  # XXH64("", 0)
    assert request_hash(sel, [("x-user", b"alice")]) == xxhash.xxh64_intdigest(b"alice")
    value = request_hash(sel, [("x-user", "bob")])
    assert isinstance(value, int) and 0 <= value < 2**64


def test_several_values_of_the_header_are_joined_with_commas():
    sel = selector(header("x-user"))
    md = [("x-user", "a"), ("other", "z"), ("X-User", "b"), ("x-user", "c")]
    assert request_hash(sel, md) == xxhash.xxh64_intdigest(b"a,b,c")


def test_absent_header_and_bin_header_give_no_hash_attribute():
    sel = selector(header("x-user"), header("x-id-bin"))
    call = sel.select("/hashed/M", [("x-id-bin", b"\x00\x01"), ("other", "v")])
    assert REQUEST_HASH_KEY not in call.call_attributes
    call.on_committed()


def test_header_name_is_used_as_given_like_c_core():
    # Metadata keys are lower case; C-core looks the name up unchanged.
    assert request_hash(selector(header("X-User")), [("x-user", "abc")]) is None


def test_content_type_hashes_as_application_grpc_like_c_core():
    sel = selector(header("content-type"))
    assert request_hash(sel, []) == xxhash.xxh64_intdigest(b"application/grpc")
    assert request_hash(sel, [("content-type", "text/x")]) == xxhash.xxh64_intdigest(
        b"application/grpc"
    )


def test_regex_rewrite_is_applied_before_hashing():
    sel = selector(header("x-session", regex=r"^session-(\d+)-.*$", subst=r"\1"))
    assert request_hash(sel, [("x-session", "session-42-eu")]) == xxhash.xxh64_intdigest(b"42")
    assert request_hash(sel, [("x-session", "session-42-us")]) == xxhash.xxh64_intdigest(b"42")
    # No match: the value is hashed unchanged.
    assert request_hash(sel, [("x-session", "other")]) == xxhash.xxh64_intdigest(b"other")


def test_regex_rewrite_replaces_every_match():
    sel = selector(header("x-path", regex="[0-9]+", subst="N"))
    assert request_hash(sel, [("x-path", "/u/12/o/345")]) == xxhash.xxh64_intdigest(b"/u/N/o/N")


# ------------------------------------------------- RE2 GlobalReplace semantics


@pytest.mark.parametrize(
    ("pattern", "rewrite", "text", "expected"),
    [
        ("b*", "-", "abc", "-a-c-"),  # Python's re.sub gives "-a--c-"
        ("x*", "-", "abxd", "-a-b-d-"),
        ("", "-", "abc", "-a-b-c-"),
        ("", "-", "", "-"),
        ("", "-", "é", "-é-"),  # steps over whole UTF-8 characters
        ("(a)(b)?", r"[\2\1]", "ac", "[a]c"),  # a group that did not take part
        ("a", r"\\", "aXa", "\\X\\"),  # \\ is one backslash
        ("a", r"\0\0", "ba", "baa"),
        ("a", r"x\1", "ba", "ba"),  # no group 1: RE2 leaves the value alone
        ("a", r"x\ny", "ba", "bx"),  # invalid escape: RE2 stops that rewrite
        ("a", "x\\", "ba", "bx"),  # trailing backslash: same
        ("q", "-", "abc", "abc"),
    ],
)
def test_global_replace_follows_re2_not_python(pattern, rewrite, text, expected):
    replace = GlobalReplace(re2.compile(pattern), rewrite)
    assert replace(text.encode()) == expected.encode()


# ----------------------------------------------------------------- channel_id


def test_channel_id_hash_is_the_channel_id():
    assert request_hash(selector(channel_id(), cid=0xDEADBEEF)) == 0xDEADBEEF


def _resolver() -> tuple[XdsResolver, FakeXdsClient, list]:
    client = FakeXdsClient()
    results: list = []
    args = ResolverArgs(
        target="xds:///svc",
        authority="svc",
        serializer=WorkSerializer(),
        clock=FakeClock(),
        random=random.Random(7),  # the same seed for both channels
        on_result=results.append,
    )
    resolver = XdsResolver(
        args, xds_client=client, listener_name="lds", dns_resolver=FakeDnsResolver()
    )
    resolver.start()
    return resolver, client, results


def _push(client: FakeXdsClient, policies, cluster: str = "a") -> None:
    route = Route(RouteMatch(PrefixMatch("/")), RouteAction(cluster, hash_policies=policies))
    client.push(make_listener("lds", rds="rds"), make_route_config("rds", [route]))
    client.push(eds_cluster(cluster), make_cla(cluster, "10.0.0.1:80"))


def test_channel_id_is_stable_per_channel_and_differs_across_channels():
    first, client1, results1 = _resolver()
    second, client2, results2 = _resolver()
    _push(client1, (channel_id(),))
    _push(client2, (channel_id(),))
    hash1 = request_hash(results1[-1].config_selector, path="/s/M")
    hash2 = request_hash(results2[-1].config_selector, path="/s/M")
    assert hash1 == first.channel_id and hash2 == second.channel_id
    assert hash1 != hash2
    # A new route configuration builds a new selector: same channel id.
    _push(client1, (channel_id(), header("x-user")), cluster="b")
    assert request_hash(results1[-1].config_selector, path="/s/M") == hash1
    assert request_hash(results1[-1].config_selector, path="/s/M") == hash1
    first.shutdown()
    second.shutdown()


# ----------------------------------------------------------------- combining


def test_policies_combine_by_rotating_the_running_hash_then_xor():
    md = [("x-a", "one"), ("x-b", "two")]
    a, b = xxhash.xxh64_intdigest(b"one"), xxhash.xxh64_intdigest(b"two")
    assert request_hash(selector(header("x-a"), header("x-b")), md) == rotl(a) ^ b
    assert request_hash(selector(header("x-b"), header("x-a")), md) == rotl(b) ^ a
    # Identical policies do not cancel out.
    assert request_hash(selector(header("x-a"), header("x-a")), md) == rotl(a) ^ a != 0
    three = request_hash(selector(header("x-a"), channel_id(), header("x-b"), cid=7), md)
    assert three == rotl(rotl(a) ^ 7) ^ b
    # A policy without a value is skipped, not folded in as zero.
    assert request_hash(selector(header("x-none"), header("x-a"), header("x-b")), md) == (
        rotl(a) ^ b
    )
    assert combine(None, 5) == 5
    assert combine(1 << 63, 0) == 1


def test_terminal_policy_with_a_value_stops_the_walk():
    md = [("x-a", "one"), ("x-b", "two")]
    a = xxhash.xxh64_intdigest(b"one")
    assert request_hash(selector(header("x-a", terminal=True), header("x-b")), md) == a


def test_terminal_policy_without_a_value_stops_only_once_a_hash_exists():
    md = [("x-a", "one"), ("x-b", "two")]
    a, b = xxhash.xxh64_intdigest(b"one"), xxhash.xxh64_intdigest(b"two")
    # Nothing yet: the walk goes on.
    assert request_hash(selector(header("x-none", terminal=True), header("x-b")), md) == b
    # C-core tests the running hash: an earlier value makes it stop here.
    policies = (header("x-a"), header("x-none", terminal=True), header("x-b"))
    assert request_hash(selector(*policies), md) == a


def test_hash_on_weighted_clusters_route():
    sel = selector(header("x-a"), weighted=[("a", 1), ("b", 1)])
    seen = set()
    for _ in range(40):
        call = sel.select("/hashed/M", [("x-a", "one")])
        assert call.call_attributes[REQUEST_HASH_KEY] == xxhash.xxh64_intdigest(b"one")
        seen.add(call.call_attributes["cluster"])
        call.on_committed()
    assert seen == {"cluster:a", "cluster:b"}


def test_hashed_call_keeps_timeout_and_releases_its_cluster():
    sel = selector(header("x-a"))
    ref = sel._table.payloads()[0].choices[0].ref
    call = sel.select("/hashed/M", [("x-a", "one")])
    assert ref.count == 1
    assert call.call_attributes == {
        "cluster": "cluster:a",
        REQUEST_HASH_KEY: xxhash.xxh64_intdigest(b"one"),
    }
    call.on_committed()
    assert ref.count == 0
    # No hash: the precomputed config, without the attribute.
    first = sel.select("/hashed/M", ())
    second = sel.select("/hashed/M", ())
    assert first is second and REQUEST_HASH_KEY not in first.call_attributes
    first.on_committed()
    second.on_committed()


# ----------------------------------------------------------------- no policies


def test_routes_without_hash_policies_return_the_precomputed_config_object():
    sel = selector(header("x-a"))
    ref = sel._table.payloads()[1].single.ref
    calls = [sel.select("/plain/M", [("x-a", "one")]) for _ in range(3)]
    assert calls[0] is calls[1] is calls[2]
    assert calls[0].call_attributes is ref.attributes
    assert REQUEST_HASH_KEY not in calls[0].call_attributes
    assert calls[0].timeout == 3.0
    for call in calls:
        call.on_committed()


def test_hasher_with_no_policies_is_false_and_returns_none():
    hasher = RequestHasher((), 1)
    assert not hasher
    assert hasher([("x", "y")]) is None
