"""The stateful session filter on the call path (gRFC A55
"StatefulSessionFilter Processing", A60 "StatefulSessionFilter Changes"):
the cookie table (C-core's GetCookieValue), RFC 6265 path matching, the
set-cookie text, and the xds ConfigSelector that applies it (the cookie's
cluster, references, the per-RPC session)."""

from __future__ import annotations

import base64
import random

import pytest

from pyxds.lb.xds_override_host import OVERRIDE_HOST_ATTRIBUTE
from pyxds.resolver.config_selector import ClusterRef, XdsConfigSelector
from pyxds.resolver.stateful_session import (
    SessionCall,
    SessionCookie,
    cookie_value,
    path_matches,
    set_cookie_value,
)
from pyxds.server import builders as b
from pyxds.xds.resources import LISTENER, ROUTE_CONFIG
from pyxds.xds.resources.stateful_session import CookieConfig

NAME = "global-session-cookie"


def enc(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- the cookie header (C-core's GetCookieValue) ---------------------------------------------


#: 400 addresses: a cookie value of more than 8000 characters.
LONG_LIST = ",".join(f"10.0.{i // 200}.{i % 200}:80" for i in range(400))


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"{NAME}={enc('10.0.0.1:80;c1')}", ("10.0.0.1:80", "c1")),
        (f"a=b; {NAME}={enc('10.0.0.1:80;c1')}; c=d", ("10.0.0.1:80", "c1")),
        (f"{NAME}={enc('10.0.0.1:80;c1')}; {NAME}={enc('10.0.0.2:80;c2')}", ("10.0.0.1:80", "c1")),
        (f"{NAME}={enc('10.0.0.1:80;c1').rstrip('=')}", ("10.0.0.1:80", "c1")),  # unpadded
        (f"{NAME}={enc('10.0.0.1:80')}", ("10.0.0.1:80", "")),  # A55 cookie: no cluster
        (f"{NAME}={enc('10.0.0.1:80,[::1]:80;c;x')}", ("10.0.0.1:80,[::1]:80", "c;x")),
        (f"{NAME}=", ("", "")),
        (f"{NAME}=!!!", ("", "")),
        (f"{NAME}=QUJDR", ("", "")),  # impossible length
        # no length cap (C-core has none): a long list is read to its end
        (f"{NAME}={enc(LONG_LIST + ';c1')}", (LONG_LIST, "c1")),
        (f"{NAME}x={enc('10.0.0.1:80;c1')}", ("", "")),  # another cookie
        (f"a=b;{NAME}={enc('10.0.0.1:80;c1')}", ("", "")),  # C-core splits on "; " only
        (NAME, ("", "")),  # no value
        ("", ("", "")),
    ],
)
def test_cookie_value_table(header, expected):
    assert cookie_value(header, NAME) == expected


def test_several_cookie_metadata_entries_are_joined_as_one_header():
    """C-core reads the ``cookie`` header as one value, its entries joined
    by ",": the session cookie's value then has ",a=b" appended and is not
    base64 any more (no session, as in C-core; the differential test sends
    the same to both clients)."""
    cookie = SessionCookie(CookieConfig(NAME))
    md = [("cookie", f"{NAME}={enc('10.0.0.1:80;c1')}"), ("cookie", "a=b")]
    assert cookie.read(md) == ("", "")
    assert cookie.read([("cookie", f"a=b; {NAME}={enc('1.2.3.4:5;c')}".encode())]) == (
        "1.2.3.4:5",
        "c",
    )
    assert cookie.read([("other", "x")]) == ("", "")


@pytest.mark.parametrize(
    ("cookie_path", "path", "matches"),
    [
        ("", "/pkg.Svc/M", True),
        ("/", "/pkg.Svc/M", True),
        ("/pkg.Svc", "/pkg.Svc/M", True),
        ("/pkg.Svc/", "/pkg.Svc/M", True),
        ("/pkg.Svc/M", "/pkg.Svc/M", True),
        ("/pkg.Sv", "/pkg.Svc/M", False),
        ("/pkg.Svc/M/", "/pkg.Svc/M", False),
        ("/other", "/pkg.Svc/M", False),
    ],
)
def test_path_match_is_rfc6265(cookie_path, path, matches):
    assert path_matches(cookie_path, path) is matches


def test_set_cookie_is_c_core_s_text():
    assert set_cookie_value(CookieConfig(NAME), "127.0.0.1:8080", "c1") == (
        f"{NAME}={enc('127.0.0.1:8080;c1')}; HttpOnly"
    )
    assert set_cookie_value(CookieConfig(NAME, "/pkg", 120.7), "a:1,b:2", "c") == (
        f"{NAME}={enc('a:1,b:2;c')}; HttpOnly; Path=/pkg; Max-Age=120"
    )


@pytest.mark.parametrize(
    ("cookie", "actual", "changed", "sets"),
    [
        ("10.0.0.1:80", "10.0.0.1:80", False, False),
        ("10.0.0.1:80", "10.0.0.2:80", False, True),
        ("10.0.0.1:80", "10.0.0.1:80", True, True),
        ("", "10.0.0.1:80", False, True),
    ],
)
def test_the_response_gets_a_cookie_only_when_something_changed(cookie, actual, changed, sets):
    session = SessionCall(CookieConfig(NAME), cookie, "c1", changed)
    session.actual_address_list = actual
    got = session.response_metadata()
    if sets:
        assert got == (("set-cookie", set_cookie_value(CookieConfig(NAME), actual, "c1")),)
    else:
        assert got == ()


# -- the ConfigSelector (A60) ---------------------------------------------------------------------


def selector(routes, cookie_path="", seed=3, vh_overrides=None):
    listener = b.listener(
        "L", http_filters=[b.stateful_session_filter(cookie_name=NAME, path=cookie_path)]
    )
    lis = LISTENER.decode(listener.SerializeToString()).resource
    rc = b.route_config(
        "L-route", [b.virtual_host("vh", routes=routes, typed_per_filter_config=vh_overrides)]
    )
    vh = ROUTE_CONFIG.decode(rc.SerializeToString()).resource.virtual_hosts[0]
    names = {"c1", "c2", "c3"}
    refs = {name: ClusterRef(name, lambda: None) for name in names}
    sel = XdsConfigSelector(vh, refs, rng=random.Random(seed), http_filters=lis.http_filters)
    return sel, refs


def md(address: str, cluster: str) -> list[tuple[str, str]]:
    return [("cookie", f"{NAME}={enc(f'{address};{cluster}')}")]


def test_an_rpc_gets_its_session_as_call_attribute_and_call_state():
    sel, _ = selector([b.route(prefix="", cluster="c1")])
    config = sel.select("/s/m", md("10.0.0.1:80", "c1"))
    session = config.call_attributes[OVERRIDE_HOST_ATTRIBUTE]
    assert config.call_state is session
    assert session.cookie_addresses == ("10.0.0.1:80",)
    assert config.call_attributes["cluster"] == "cluster:c1"
    assert not session.cluster_changed
    config.on_committed()


def test_an_rpc_without_cookie_still_gets_a_session_that_will_set_one():
    sel, _ = selector([b.route(prefix="", cluster="c1")])
    config = sel.select("/s/m", ())
    session = config.call_state
    assert session.cookie_address_list == "" and session.cluster_changed
    session.actual_address_list = "10.0.0.9:80"
    assert session.response_metadata()[0][0] == "set-cookie"
    config.on_committed()


def test_the_cookie_s_cluster_wins_over_the_weighted_draw_and_holds_its_reference():
    sel, refs = selector([b.route(prefix="", weighted_clusters={"c1": 1, "c2": 99})])
    for _ in range(50):
        config = sel.select("/s/m", md("10.0.0.1:80", "c1"))
        assert config.call_attributes["cluster"] == "cluster:c1"
        assert refs["c1"].count == 1 and refs["c2"].count == 0
        assert not config.call_state.cluster_changed
        config.on_committed()
        assert refs["c1"].count == 0


def test_a_cookie_cluster_not_in_the_route_keeps_the_draw_and_sets_a_new_cookie():
    sel, refs = selector([b.route(prefix="", weighted_clusters={"c1": 1, "c2": 1})])
    config = sel.select("/s/m", md("10.0.0.1:80", "c3"))
    assert config.call_attributes["cluster"] in ("cluster:c1", "cluster:c2")
    assert config.call_state.cluster_changed
    assert refs["c3"].count == 0
    config.on_committed()


def test_an_rpc_outside_the_cookie_path_has_no_session():
    sel, _ = selector([b.route(prefix="", cluster="c1")], cookie_path="/other")
    config = sel.select("/s/m", md("10.0.0.1:80", "c1"))
    assert config.call_state is None and OVERRIDE_HOST_ATTRIBUTE not in config.call_attributes
    config.on_committed()


def test_a_route_that_disables_the_filter_routes_as_usual_at_no_cost():
    off = {"envoy.filters.http.stateful_session": b.stateful_session_per_route(disabled=True)}
    sel, _ = selector(
        [
            b.route(prefix="/s/off", cluster="c1", typed_per_filter_config=off),
            b.route(prefix="", cluster="c1"),
        ]
    )
    first = sel.select("/s/off", md("10.0.0.1:80", "c1"))
    second = sel.select("/s/off", md("10.0.0.1:80", "c1"))
    assert first is second and first.call_state is None  # the precomputed CallConfig
    first.on_committed()
    second.on_committed()
    assert sel.select("/s/m", ()).call_state is not None


def test_a_virtual_host_override_renames_the_cookie():
    other = {
        "envoy.filters.http.stateful_session": b.stateful_session_per_route(cookie_name="other")
    }
    sel, _ = selector([b.route(prefix="", cluster="c1")], vh_overrides=other)
    config = sel.select("/s/m", [("cookie", f"other={enc('10.0.0.7:80;c1')}")])
    assert config.call_state.cookie_address_list == "10.0.0.7:80"
    assert config.call_state.config.name == "other"


def test_the_per_rpc_call_config_sets_every_field():
    """The session's CallConfig is built through the slot descriptors (no
    frozen __init__ per RPC): every field of CallConfig must be set."""
    import dataclasses

    from pyxds.resolver.api import CallConfig

    sel, _ = selector([b.route(prefix="", cluster="c1")])
    config = sel.select("/s/m", md("10.0.0.1:80", "c1"))
    for f in dataclasses.fields(CallConfig):
        getattr(config, f.name)  # AttributeError if a field was left unset
    assert config == dataclasses.replace(config)
    config.on_committed()


# -- C-core's cookie decoding (absl::Base64Unescape), measured against grpcio 1.85 ----------


@pytest.mark.parametrize(
    ("value", "pins"),
    [
        (enc("10.0.0.1:80;c1xy"), True),  # complete padding ("==")
        (enc("10.0.0.1:80;c1xy").rstrip("="), True),  # no padding
        (enc("10.0.0.1:80;c1xy").rstrip("=") + "=", False),  # partial padding: C-core refuses
        (enc("10.0.0.1:80;c1") + "=", False),  # padding where none is due
        (enc("10.0.0.1:80;c1")[:5] + " " + enc("10.0.0.1:80;c1")[5:], True),  # space skipped
        (enc("10.0.0.1:80;c1") + " ", True),
        (enc("10.0.0.1:80;c1xy").rstrip("=") + "= =", True),  # space inside the padding
        (enc("10.0.0.1:80;c1") + enc("x"), False),  # data after padding
    ],
)
def test_the_cookie_is_decoded_as_c_core_s_base64(value, pins):
    """Each row's outcome was seen in grpcio 1.85's C-core (pinned: same
    endpoint and no new cookie; refused: normal pick and a new cookie)."""
    address, _cluster = cookie_value(f"{NAME}={value}", NAME)
    assert (address == "10.0.0.1:80") is pins


# -- a cluster specifier plugin's route (RLS) --------------------------------------------------


def plugin_selector():
    from pyxds.xds.resources.types import RouteAction

    listener = b.listener("L", http_filters=[b.stateful_session_filter(cookie_name=NAME)])
    lis = LISTENER.decode(listener.SerializeToString()).resource
    config = b.route_lookup_config("rls.example.com:443", [b.rls_key_builder("s")])
    rc = b.route_config(
        "L-route",
        [b.virtual_host("vh", routes=[b.route(prefix="", cluster_specifier_plugin="rls")])],
        [b.rls_plugin("rls", config)],
    )
    vh = ROUTE_CONFIG.decode(rc.SerializeToString()).resource.virtual_hosts[0]
    assert isinstance(vh.routes[0].action, RouteAction)
    plugin_refs = {"rls": ClusterRef("rls", lambda: None, child_policy="[]")}
    sel = XdsConfigSelector(vh, {}, http_filters=lis.http_filters, plugin_refs=plugin_refs)
    return sel, plugin_refs


def test_an_rls_route_s_cookie_has_no_cluster_and_its_address_still_pins():
    """C-core's StatefulSessionFilter (GetClusterToUse): a route whose
    cluster attribute is not a ``cluster:`` child (a cluster specifier
    plugin) gets the empty cluster, so its cookie is ``<address>;`` and a
    cookie naming any cluster there is re-set; the address pins either way.
    (grpcio 1.85: ``127.0.0.1:P;`` on the first RPC, no new cookie for a
    ``127.0.0.1:P;`` cookie, a new one for ``127.0.0.1:P;rls``.)"""
    sel, refs = plugin_selector()
    first = sel.select("/s/m", ())
    assert first.call_attributes["cluster"] == "cluster_specifier_plugin:rls"
    first.call_state.actual_address_list = "10.0.0.1:80"
    ((_key, value),) = first.call_state.response_metadata()
    assert value == set_cookie_value(CookieConfig(NAME), "10.0.0.1:80", "")
    first.on_committed()

    same = sel.select("/s/m", md("10.0.0.1:80", ""))
    assert same.call_state.cookie_addresses == ("10.0.0.1:80",)
    same.call_state.actual_address_list = "10.0.0.1:80"
    assert same.call_state.response_metadata() == ()
    same.on_committed()

    for cluster in ("rls", "c1"):
        named = sel.select("/s/m", md("10.0.0.1:80", cluster))
        assert named.call_attributes["cluster"] == "cluster_specifier_plugin:rls"
        assert named.call_state.cookie_addresses == ("10.0.0.1:80",)
        named.call_state.actual_address_list = "10.0.0.1:80"
        assert named.call_state.response_metadata()[0][1].startswith(
            set_cookie_value(CookieConfig(NAME), "10.0.0.1:80", "")
        )
        named.on_committed()
    assert refs["rls"].count == 0
