"""Differential: client Listeners that must be NACKed, through pyxds and
through grpcio's C-core ``xds:///`` channel (a subprocess, CoreXdsClient)
against the same pyxds.server.  With nothing cached, an RPC fails UNAVAILABLE
naming the NACK; both clients must name the same field and say the same
words (C-core writes ``field:<path> error:<text>``, pyxds ``<path>: <text>``,
so the path and the text are compared apart).

Cases from C-core's xds_listener_resource_type_test.cc,
xds_route_config_resource_type_test.cc and xds_http_filters_test.cc, the
ones tests/unit/test_conformance_{lds,rds}_resource.py found pyxds saying
differently (or, for the router's config, accepting)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import pytest
from channel_fixtures import Backend, CoreXdsClient, pyxds_calls, route, snapshot
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import any_pb2

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server.snapshot import Snapshot

NODE = "differential-lds-rds-nacks"
_NAMES = itertools.count()
HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "envoy.extensions.filters.http.router.v3.Router"


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id=NODE))
    yield client
    client.close()


def _one_status_each(
    server, core, listener: listener_pb2.Listener, timeout: float
) -> tuple[str, str]:
    """Serve ``listener`` alone; one RPC to it through pyxds and one through
    C-core, nothing cached: (pyxds's status text, C-core's)."""
    server.set_snapshot(Snapshot(listeners=[listener]))
    target = f"xds:///{listener.name}"
    ch = pyxds.insecure_channel(target, bootstrap=server.bootstrap(node_id=NODE))
    try:
        ours = pyxds_calls(ch, 1, details=True, wait_for_ready=False, timeout=timeout)
        theirs = core.call(1, details=True, target=target, wait_for_ready=False, timeout=timeout)
    finally:
        ch.close()
    (ours_text,), (theirs_text,) = list(ours), list(theirs)
    return ours_text, theirs_text


def _raw(type_name: str, value: bytes) -> any_pb2.Any:
    return any_pb2.Any(type_url=f"type.googleapis.com/{type_name}", value=value)


def _listener(name: str, hcm: hcm_pb2.HttpConnectionManager | None = None) -> listener_pb2.Listener:
    lis = listener_pb2.Listener(name=name)
    if hcm is not None:
        lis.api_listener.api_listener.Pack(hcm)
    return lis


def _hcm(router: any_pb2.Any | None = None) -> hcm_pb2.HttpConnectionManager:
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.rds.route_config_name = "rds"
    hcm.rds.config_source.ads.SetInParent()
    f = hcm.http_filters.add(name="router")
    if router is None:
        f.typed_config.Pack(router_pb2.Router())
    else:
        f.typed_config.CopyFrom(router)
    return hcm


def _inline(edit: Callable[[route_pb2.RouteConfiguration], None]) -> hcm_pb2.HttpConnectionManager:
    hcm = _hcm()
    hcm.ClearField("rds")
    rc = hcm.route_config
    rc.name = "inline"
    r = rc.virtual_hosts.add(domains=["*"]).routes.add()
    r.match.prefix = ""
    r.route.cluster = "c"
    edit(rc)
    return hcm


def _router_garbage(name: str) -> listener_pb2.Listener:
    return _listener(name, _hcm(_raw(ROUTER, b"\0")))


def _not_an_hcm(name: str) -> listener_pb2.Listener:
    lis = _listener(name)
    lis.api_listener.api_listener.Pack(listener_pb2.Listener())
    return lis


def _hcm_garbage(name: str) -> listener_pb2.Listener:
    lis = _listener(name)
    lis.api_listener.api_listener.CopyFrom(_raw(HCM, b"\0"))
    return lis


def _path_separated_prefix(rc: route_pb2.RouteConfiguration) -> None:
    m = rc.virtual_hosts[0].routes[0].match
    m.path_separated_prefix = "/foo"


def _bad_range(rc: route_pb2.RouteConfiguration) -> None:
    h = rc.virtual_hosts[0].routes[0].match.headers.add(name="h")
    h.range_match.start, h.range_match.end = 2, 1


def _override_without_type(rc: route_pb2.RouteConfiguration) -> None:
    rc.virtual_hosts[0].routes[0].typed_per_filter_config["fault"].SetInParent()


def _slashless_optional_filter(name: str) -> listener_pb2.Listener:
    hcm = _hcm()
    router = hcm.http_filters.pop()
    hcm.http_filters.add(name="odd", is_optional=True).typed_config.type_url = "no-slash"
    hcm.http_filters.append(router)
    return _listener(name, hcm)


RLS = "grpc.lookup.v1.RouteLookupClusterSpecifier"


def _rls_plugin(typed_config: any_pb2.Any) -> Callable[[str], listener_pb2.Listener]:
    """A listener whose inline route config declares plugin "rls" with
    ``typed_config`` and routes everything to it."""

    def edit(rc: route_pb2.RouteConfiguration) -> None:
        plugin = rc.cluster_specifier_plugins.add()
        plugin.extension.name = "rls"
        plugin.extension.typed_config.CopyFrom(typed_config)
        rc.virtual_hosts[0].routes[0].route.cluster_specifier_plugin = "rls"

    return lambda name: _listener(name, _inline(edit))


def _typed_struct_naming(type_name: str) -> any_pb2.Any:
    from xds.type.v3 import typed_struct_pb2

    ts = typed_struct_pb2.TypedStruct(type_url=f"types.googleapis.com/{type_name}")
    return _packed(ts)


def _packed(message) -> any_pb2.Any:
    any_msg = any_pb2.Any()
    any_msg.Pack(message)
    return any_msg


INLINE = f"api_listener.api_listener.value[{HCM}].route_config.virtual_hosts[0].routes[0]"
PLUGIN = (
    f"api_listener.api_listener.value[{HCM}].route_config"
    ".cluster_specifier_plugins[0].extension.typed_config"
)

CASES = [
    pytest.param(
        _router_garbage,
        f".http_filters[0].typed_config.value[{ROUTER}]",
        "could not parse router filter config",
        id="router-config-does-not-parse",
    ),
    pytest.param(
        lambda name: _listener(name, _hcm(_raw(ROUTER, b"\x0a\x03\xff\xfe\xfd"))),
        f".http_filters[0].typed_config.value[{ROUTER}]",
        "could not parse router filter config",
        id="router-config-wire-format-but-no-router",
    ),
    pytest.param(
        _not_an_hcm,
        "api_listener.api_listener.value[envoy.config.listener.v3.Listener]",
        "unsupported filter type",
        id="api-listener-not-an-hcm",
    ),
    pytest.param(
        _hcm_garbage,
        f"api_listener.api_listener.value[{HCM}]",
        "could not parse HttpConnectionManager config",
        id="hcm-does-not-parse",
    ),
    pytest.param(
        _slashless_optional_filter,
        ".http_filters[0].typed_config.type_url",
        'invalid value "no-slash"',
        id="optional-filter-type-url-without-slash",
    ),
    pytest.param(
        lambda name: _listener(name, _inline(_path_separated_prefix)),
        f"{INLINE}.match",
        "invalid path specifier",
        id="inline-route-path-separated-prefix",
    ),
    pytest.param(
        lambda name: _listener(name, _inline(_bad_range)),
        f"{INLINE}.match.headers[0]",
        "cannot create header matcher: Invalid range specifier specified",
        id="inline-route-header-range",
    ),
    pytest.param(
        lambda name: _listener(name, _inline(_override_without_type)),
        f"{INLINE}.typed_per_filter_config[fault].type_url",
        "field not present",
        id="inline-route-override-without-type",
    ),
    pytest.param(
        _rls_plugin(_packed(route_pb2.RouteConfiguration())),
        f"{PLUGIN}.value[envoy.config.route.v3.RouteConfiguration]",
        "unsupported ClusterSpecifierPlugin type",
        id="rls-plugin-of-another-type",
    ),
    pytest.param(
        _rls_plugin(_typed_struct_naming(RLS)),
        f"{PLUGIN}.value[xds.type.v3.TypedStruct].value[{RLS}]",
        "could not parse plugin config",
        id="rls-plugin-in-a-typed-struct",
    ),
    pytest.param(
        _rls_plugin(_raw(RLS, b"\0")),
        f"{PLUGIN}.value[{RLS}]",
        "could not parse plugin config",
        id="rls-plugin-does-not-parse",
    ),
    pytest.param(
        _rls_plugin(_raw(RLS, b"")),
        f"{PLUGIN}.value[{RLS}].route_lookup_config",
        "field not present",
        id="rls-plugin-without-route-lookup-config",
    ),
]


@pytest.mark.parametrize("make, field, words", CASES)
def test_a_nacked_listener_names_the_same_field_and_words_as_c_core(
    server, core, make, field: str, words: str
):
    name = f"nack-{next(_NAMES)}"  # a new resource name: nothing cached
    ours_text, theirs_text = _one_status_each(server, core, make(name), timeout=3)
    assert theirs_text.startswith("error:UNAVAILABLE: "), theirs_text
    assert ours_text.startswith("error:UNAVAILABLE: "), ours_text
    for text in (f"LDS resource {name}", field, words):
        assert text in theirs_text, ("C-core", text, theirs_text)
        assert text in ours_text, ("pyxds", text, ours_text)


def test_a_route_with_a_negative_timeout_serves_in_both(server, core):
    """A31: ``RouteAction.timeout`` is not supported, and C-core does not read
    it: a negative one is no reason to NACK (pyxds NACKed it)."""
    backend = Backend("t0").start()
    try:
        r = route(prefix="", cluster="timeout-c")
        r.route.timeout.seconds = -1
        name = "negative-route-timeout"
        server.set_snapshot(snapshot([r], {"timeout-c": [[backend.address]]}, listener=name))
        target = f"xds:///{name}"
        ch = pyxds.insecure_channel(target, bootstrap=server.bootstrap(node_id=NODE))
        try:
            ours = pyxds_calls(ch, 3, timeout=5)
        finally:
            ch.close()
        theirs = core.call(3, target=target, timeout=5)
        assert ours == theirs == {"t0": 3}
    finally:
        backend.stop()


def _core_as_pyxds(text: str) -> str:
    """C-core's one-problem NACK status in pyxds's layout: ``empty address
    list (LDS resource N: invalid resource: errors validating ApiListener:
    [field:F error:E] (node ID:...))`` -> ``LDS resource N: invalid resource:
    F: E``; any other status as it is."""
    m = re.fullmatch(
        r"error:UNAVAILABLE: empty address list \((LDS resource \S+: invalid resource): "
        r"errors validating ApiListener: \[field:(\S+) error:(.*)\] \(node ID:[^)]*\)\)",
        text,
    )
    return f"error:UNAVAILABLE: {m[1]}: {m[2]}: {m[3]}" if m else text


def _route_edit(edit: Callable[[route_pb2.Route], None]) -> Callable[[str], listener_pb2.Listener]:
    return lambda name: _listener(name, _inline(lambda rc: edit(rc.virtual_hosts[0].routes[0])))


def _regex_ignore_case(r: route_pb2.Route) -> None:
    h = r.match.headers.add(name="h")
    h.string_match.safe_regex.regex = "a.*"
    h.string_match.ignore_case = True


def _unmatchable_prefix_with_bad_header(r: route_pb2.Route) -> None:
    r.match.prefix = "no-slash"
    h = r.match.headers.add(name="h")
    h.range_match.start, h.range_match.end = 2, 1


def _cluster_header_with_bad_header(r: route_pb2.Route) -> None:
    r.route.cluster_header = "x"
    h = r.match.headers.add(name="h")
    h.range_match.start, h.range_match.end = 2, 1


def _redirect_with_unknown_override(r: route_pb2.Route) -> None:
    r.redirect.host_redirect = "x"
    r.typed_per_filter_config["f"].type_url = "type.googleapis.com/unknown.T"


def _unmatchable_prefix_with_unknown_override(r: route_pb2.Route) -> None:
    r.match.prefix = "no-slash"
    r.typed_per_filter_config["f"].type_url = "type.googleapis.com/unknown.T"


def _zero_weight_cluster_without_name(r: route_pb2.Route) -> None:
    wc = r.route.weighted_clusters
    wc.clusters.add(name="").weight.value = 0
    wc.clusters.add(name="c").weight.value = 1


def _empty_header_prefix(r: route_pb2.Route) -> None:
    r.match.headers.add(name="h", prefix_match="")


def _bad_denominator(r: route_pb2.Route) -> None:
    r.match.runtime_fraction.default_value.numerator = 10
    r.match.runtime_fraction.default_value.denominator = 7  # type: ignore[assignment]


OUTCOMES = [
    pytest.param(_regex_ignore_case, id="string-match-regex-ignore-case"),
    pytest.param(lambda r: setattr(r.route, "cluster", ""), id="empty-cluster-name"),
    pytest.param(_unmatchable_prefix_with_bad_header, id="ignored-route-bad-header"),
    pytest.param(_cluster_header_with_bad_header, id="cluster-header-route-bad-header"),
    pytest.param(_redirect_with_unknown_override, id="redirect-route-unknown-override"),
    pytest.param(_unmatchable_prefix_with_unknown_override, id="ignored-route-unknown-override"),
    pytest.param(_zero_weight_cluster_without_name, id="zero-weight-cluster-without-name"),
    pytest.param(_empty_header_prefix, id="empty-header-prefix"),
    pytest.param(_bad_denominator, id="runtime-fraction-denominator-7"),
    pytest.param(lambda r: r.match.grpc.SetInParent(), id="grpc-route-match-options"),
]


@pytest.mark.parametrize("edit", OUTCOMES)
def test_an_inline_route_config_has_the_same_outcome_as_in_c_core(server, core, edit):
    """Inline route configs (cluster "c" never exists): C-core and pyxds
    both NACK, with the same field and words, or both accept (the RPC then
    runs out its deadline, or finds no route, alike).  Cases probed against
    grpcio 1.85 from C-core's RDS parser rules: a route whose prefix cannot
    match is dropped before its headers and overrides are looked at, but one
    with a cluster_header action still reports its header problems; some
    fields are not checked at all."""
    name = f"outcome-{next(_NAMES)}"
    ours_text, theirs_text = _one_status_each(server, core, _route_edit(edit)(name), timeout=0.5)
    assert ours_text.strip() == _core_as_pyxds(theirs_text)
