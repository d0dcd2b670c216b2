"""Conformance: the client's xDS HTTP filter chain (gRFC A39) from the wire
to the RPC, sans I/O: a Listener and a RouteConfiguration are built as a
control plane sends them, decoded by pyxds's LDS/RDS parsers, and the
ConfigSelector's per-route chain is run for one RPC (which filter instance
acts, with which config).

Sources: A39 "Filter Config Overrides" (most specific override by instance
name), grpc-go ``internal/xds/resolver/xds_http_filters_test.go``
(``TestXDSResolverHTTPFilters_DisabledInOverride`` /
``_EnabledInOverride`` / ``_MultiLevelOverride``), C-core
``xds_routing_end2end_test.cc`` (``LdsRdsInteractionTest``), and grpcio
1.85's C-core measured live with the same resources
(``tests/e2e/test_differential_http_filters.py``).

``HttpFilter.disabled`` and ``FilterConfig.disabled`` (A39 does not name
them; C-core 1.85 and grpc-go honour them, Envoy's meaning): a filter
disabled in the listener runs only on routes where an override (at any
level) configures it; a ``FilterConfig`` with ``disabled`` as the most
specific override turns the filter off there.

Cases covered elsewhere are not repeated: override validation and NACK
words (test_conformance_rds_resource.py, test_conformance_resources.py),
listener filter validation (test_conformance_lds_resource.py,
test_resources_listener.py), route > virtual host > listener and weighted
cluster > route precedence (tests/e2e/test_differential_fault.py),
filter order and the first abort ending the chain
(test_conformance_fault.py, test_rpc_filters.py).
"""

from __future__ import annotations

import random

from envoy.config.route.v3 import route_components_pb2

from pyxds.resolver.config_selector import ClusterRef, XdsConfigSelector
from pyxds.resolver.http_filters import run_chain
from pyxds.server import builders as b
from pyxds.xds.resources.listener import decode_listener
from pyxds.xds.resources.route_config import decode_route_configuration
from pyxds.xds.resources.types import HttpFilter

FAULT = "envoy.extensions.filters.http.fault.v3.HTTPFault"


def abort(code: int):
    return b.fault_config(abort_grpc_status=code, abort_percent=100)


def fault(name: str, code: int | None, disabled: bool = False):
    """A listener fault filter aborting every RPC with ``code`` (None: an
    empty config, nothing to do)."""
    flt = b.fault_filter(name=name, config=b.fault_config() if code is None else abort(code))
    flt.disabled = disabled
    return flt


def wrapped(code: int | None, disabled: bool):
    """A ``FilterConfig`` override around an aborting (or empty) fault config."""
    fc = route_components_pb2.FilterConfig(disabled=disabled)
    fc.config.Pack(b.fault_config() if code is None else abort(code))
    return fc


def outcome(filters, vh=None, route=None, cluster=None):
    """The status code name an RPC ends with before its pick ("pick": the
    chain lets it through) on a listener with ``filters`` (then the router)
    and one route to a weighted cluster, with these overrides (filter name
    -> config message) on the virtual host, the route and the cluster entry."""
    lis = b.listener("lds", http_filters=list(filters))
    _, listener, error = decode_listener(lis.SerializeToString())
    assert error is None, error
    r = b.route(prefix="", weighted_clusters={"c": 1}, typed_per_filter_config=route)
    for key, msg in (cluster or {}).items():
        r.route.weighted_clusters.clusters[0].typed_per_filter_config[key].CopyFrom(b.pack(msg))
    rc = b.route_config("rds", [b.virtual_host("vh", routes=[r], typed_per_filter_config=vh)])
    _, routes, error = decode_route_configuration(rc.SerializeToString())
    assert error is None, error
    refs = {"c": ClusterRef("c", lambda: None)}
    selector = XdsConfigSelector(routes.virtual_hosts[0], refs, http_filters=listener.http_filters)
    config = selector.select("/svc/M", ())
    config.on_committed()
    verdict = run_chain(config.filters, (), random.Random(1))
    if verdict is None or verdict.abort is None:
        return "pick"
    return verdict.abort.code.name


# ------------------------------------------------------- overrides by name


def test_an_override_applies_to_the_filter_instance_of_its_name_only():
    """A39: overrides are keyed by the filter instance name, and one filter
    type may have several instances.  f1 (PERMISSION_DENIED) emptied by the
    route's override; f2 (RESOURCE_EXHAUSTED) still aborts (C-core live)."""
    filters = [fault("f1", 7), fault("f2", 8)]
    assert outcome(filters) == "PERMISSION_DENIED"
    assert outcome(filters, route={"f1": b.fault_config()}) == "RESOURCE_EXHAUSTED"
    assert outcome(filters, route={"f1": b.fault_config(), "f2": b.fault_config()}) == "pick"


def test_overrides_merge_per_filter_name_across_levels():
    """A39 (most specific override per filter): the route's override of f2
    does not hide the virtual host's override of f1 (grpc-go
    TestXDSResolverHTTPFilters_MultiLevelOverride; C-core live:
    FAILED_PRECONDITION, the virtual host's code)."""
    filters = [fault("f1", 7), fault("f2", None)]
    got = outcome(filters, vh={"f1": abort(9)}, route={"f2": b.fault_config()})
    assert got == "FAILED_PRECONDITION"


def test_a_cluster_entry_without_an_override_takes_the_routes():
    """A39: the weighted cluster's override, else the route's: an entry with
    no override of its own runs the route's config (C-core live)."""
    assert outcome([fault("fault", 7)], route={"fault": abort(9)}) == "FAILED_PRECONDITION"
    got = outcome([fault("fault", 7)], route={"fault": abort(9)}, cluster={"fault": abort(8)})
    assert got == "RESOURCE_EXHAUSTED"


def test_an_override_of_another_filters_type_alone_leaves_the_listener_config():
    """A39: the filter checks an override is of its own (override) type.  A
    StatefulSessionPerRoute under the fault filter's name leaves the
    listener's fault config in force (C-core live: the listener's
    UNIMPLEMENTED abort)."""
    other = b.stateful_session_per_route(disabled=True)
    assert outcome([fault("fault", 12)], route={"fault": other}) == "UNIMPLEMENTED"


# ------------------------------------------------------ disabled filters


def test_a_filter_disabled_in_the_listener_does_nothing_without_an_override():
    """grpc-go DisabledInOverride "BaseDisabled"; C-core 1.85 live: a fault
    filter with ``disabled: true`` aborting every RPC lets every RPC through,
    and a disabled first filter does not stop the second (RESOURCE_EXHAUSTED,
    not f1's PERMISSION_DENIED)."""
    assert outcome([fault("fault", 12, disabled=True)]) == "pick"
    assert outcome([fault("f1", 7, disabled=True), fault("f2", 8)]) == "RESOURCE_EXHAUSTED"


def test_an_override_for_another_name_does_not_enable_a_disabled_filter():
    """C-core live: f1 disabled in the listener, the route overrides only f2
    (not in the listener): nothing runs."""
    assert outcome([fault("f1", 7, disabled=True)], route={"f2": abort(8)}) == "pick"


def test_an_override_at_any_level_enables_a_disabled_filter_with_its_config():
    """grpc-go EnabledInOverride (VHostEnables, RouteEnables, ClusterEnables);
    C-core live: a disabled listener filter runs with the most specific
    override's config, plain or in a FilterConfig with ``disabled: false``."""
    base = [fault("fault", 12, disabled=True)]
    assert outcome(base, route={"fault": abort(7)}) == "PERMISSION_DENIED"
    assert outcome(base, route={"fault": wrapped(7, False)}) == "PERMISSION_DENIED"
    assert outcome(base, vh={"fault": wrapped(9, False)}) == "FAILED_PRECONDITION"
    got = outcome(
        base,
        vh={"fault": wrapped(None, True)},
        route={"fault": wrapped(None, True)},
        cluster={"fault": wrapped(8, False)},
    )
    assert got == "RESOURCE_EXHAUSTED"


def test_a_disabled_filter_config_override_turns_the_filter_off_at_its_level():
    """grpc-go DisabledInOverride (VHostDisables, RouteDisables,
    ClusterDisables); C-core live: a ``FilterConfig`` with ``disabled: true``
    as the most specific override turns the filter off there, whatever
    config it wraps (here one that would abort), and whatever the levels
    above say."""
    base = [fault("fault", 12)]
    assert outcome(base, vh={"fault": wrapped(7, True)}) == "pick"
    assert outcome(base, vh={"fault": wrapped(9, False)}, route={"fault": wrapped(7, True)}) == (
        "pick"
    )
    got = outcome(base, route={"fault": abort(7)}, cluster={"fault": wrapped(8, True)})
    assert got == "pick"
    disabled_base = [fault("fault", 12, disabled=True)]
    got = outcome(disabled_base, vh={"fault": wrapped(9, False)}, route={"fault": wrapped(7, True)})
    assert got == "pick"


def test_a_more_specific_plain_override_enables_what_a_less_specific_one_disabled():
    """C-core live: the virtual host disables the filter, the route's plain
    override (the most specific) configures it: the route's abort."""
    got = outcome([fault("fault", 12)], vh={"fault": wrapped(9, True)}, route={"fault": abort(7)})
    assert got == "PERMISSION_DENIED"


def test_a_listener_that_only_changes_disabled_is_a_new_config():
    """Equality (TRAPS "configs and equality"): ``disabled`` is part of the
    parsed filter, so flipping it is an update and not a no-op."""
    on = decode_listener(b.listener("l", http_filters=[fault("f", 7)]).SerializeToString())[1]
    off = decode_listener(
        b.listener("l", http_filters=[fault("f", 7, disabled=True)]).SerializeToString()
    )[1]
    assert on != off


# ------------------------------------------------ listener updates (A74, A39)


def _dm():
    """A dependency manager over a fake XdsClient whose deliveries are kept."""
    from pyxds.resolver.dependency_manager import DependencyManager
    from pyxds.resolver.dns import FakeDnsResolver
    from pyxds.serializer import WorkSerializer
    from pyxds.testing import FakeClock
    from pyxds.testing.fake_xds_client import FakeXdsClient

    client = FakeXdsClient()
    updates: list = []
    DependencyManager(
        client,
        "lds",
        "svc",
        WorkSerializer().run,
        updates.append,
        dns_resolver=FakeDnsResolver(),
        clock=FakeClock(),
    )
    return client, updates


def _listener(rds=None, inline=None, filters=()):
    import dataclasses

    from pyxds.testing.fake_xds_client import make_listener

    return dataclasses.replace(make_listener("lds", rds=rds, inline=inline), http_filters=filters)


ABORTING = (HttpFilter("envoy.fault", FAULT, abort(10).SerializeToString()),)


def _routes(name: str, cluster: str):
    from pyxds.testing.fake_xds_client import make_route, make_route_config

    return make_route_config(name, [make_route("", cluster=cluster)])


def _serve(client, cluster: str) -> None:
    from pyxds.testing.fake_xds_client import eds_cluster, make_cla

    client.push(eds_cluster(cluster), make_cla(cluster, "10.0.0.1:80"))


def test_new_listener_filters_wait_for_the_new_route_config_they_come_with():
    """C-core LdsRdsInteractionTest.LdsUpdateChangesHcmConfigAndRdsResourceName:
    a listener update adds a filter that aborts every RPC and names a new
    RDS resource whose route turns it off; until that route configuration
    (and its cluster) arrived, the old listener and routes stay in force
    together, so no RPC sees the new filter with the old routes."""
    client, updates = _dm()
    client.push(_listener(rds="rds"), _routes("rds", "a"))
    _serve(client, "a")
    count = len(updates)
    client.push(_listener(rds="rds2", filters=ABORTING))
    client.push(_routes("rds2", "b"))
    assert len(updates) == count, "the new listener was used before its cluster arrived"
    _serve(client, "b")
    assert updates[-1].listener.http_filters == ABORTING
    assert updates[-1].route_config.name == "rds2"


def test_a_switch_from_inline_routes_to_rds_keeps_the_inline_config_until_rds_arrives():
    """C-core LdsRdsInteractionTest.SwitchFromInlineRouteConfigToRds: the
    inline listener stays in force (its filters with its routes) until the
    RDS resource the new listener names arrives."""
    client, updates = _dm()
    client.push(_listener(inline=_routes("inline", "a")))
    _serve(client, "a")
    count = len(updates)
    client.push(_listener(rds="rds", filters=ABORTING))
    assert len(updates) == count
    client.push(_routes("rds", "a"))
    assert updates[-1].listener.http_filters == ABORTING
    assert updates[-1].route_config.name == "rds"


def test_a_listener_update_that_only_adds_a_filter_applies_at_once():
    """C-core LdsRdsInteractionTest.HcmConfigUpdatedWithoutRdsChange: same
    RDS name, a fault filter added: the next config has it (and the
    selector built from it aborts)."""
    client, updates = _dm()
    client.push(_listener(rds="rds"), _routes("rds", "a"))
    _serve(client, "a")
    client.push(_listener(rds="rds", filters=ABORTING))
    config = updates[-1]
    assert config.listener.http_filters == ABORTING
    refs = {"a": ClusterRef("a", lambda: None)}
    selector = XdsConfigSelector(config.virtual_host, refs, http_filters=ABORTING)
    call = selector.select("/svc/M", ())
    call.on_committed()
    verdict = run_chain(call.filters, (), random.Random(1))
    assert verdict is not None and verdict.abort is not None
    assert verdict.abort.code.name == "ABORTED"


def test_a_disabled_filter_config_without_a_config_is_still_nacked():
    """C-core 1.85 live: ``disabled`` does not excuse the wrapper's missing
    ``config`` ("field not present", the words C-core NACKs with)."""
    r = b.route(prefix="", cluster="c")
    r.typed_per_filter_config["fault"].Pack(route_components_pb2.FilterConfig(disabled=True))
    rc = b.route_config("rds", [b.virtual_host("vh", routes=[r])])
    _, _, error = decode_route_configuration(rc.SerializeToString())
    assert error == (
        "virtual_hosts[0].routes[0].typed_per_filter_config[fault]"
        ".value[envoy.config.route.v3.FilterConfig].config: field not present"
    )


BAD_FAULT = b.fault_config(abort_grpc_status=17, abort_percent=100)
HCM = (
    "api_listener.api_listener.value"
    "[envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager]"
)


def test_optional_and_disabled_do_not_excuse_an_invalid_config_of_a_known_filter():
    """A39: ``is_optional`` lets an *unknown* filter type be skipped; a
    filter the client knows is validated either way, and so is a disabled
    one (C-core 1.85 live: the same field and words)."""
    for flag in ("is_optional", "disabled"):
        flt = b.fault_filter(config=BAD_FAULT)
        setattr(flt, flag, True)
        lis = b.listener("l", http_filters=[flt])
        _, _, error = decode_listener(lis.SerializeToString())
        assert error == (
            f"{HCM}.http_filters[0].typed_config.value[{FAULT}].abort.grpc_status: "
            "invalid gRPC status code: 17"
        ), flag


def test_an_optional_filter_config_wrapper_does_not_excuse_an_invalid_known_config():
    """A39: the wrapper's ``is_optional`` applies to unknown override types
    only (C-core 1.85 live: the same field and words)."""
    fc = route_components_pb2.FilterConfig(is_optional=True)
    fc.config.Pack(BAD_FAULT)
    r = b.route(prefix="", cluster="c")
    r.typed_per_filter_config["fault"].Pack(fc)
    rc = b.route_config("rds", [b.virtual_host("vh", routes=[r])])
    _, _, error = decode_route_configuration(rc.SerializeToString())
    assert error == (
        "virtual_hosts[0].routes[0].typed_per_filter_config[fault]"
        f".value[envoy.config.route.v3.FilterConfig].config.value[{FAULT}].abort.grpc_status: "
        "invalid gRPC status code: 17"
    )


def test_an_override_only_type_in_the_listener_is_no_filter_type():
    """A39: a filter is registered by its top-level config type; its
    per-route type (StatefulSessionPerRoute, RBACPerRoute) in the listener's
    ``http_filters`` is an unsupported filter type, skipped when optional
    (C-core 1.85 live: the same field and words, and the same skip)."""
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    from pyxds.server import inbound as ib

    for config in (b.stateful_session_per_route(disabled=True), ib.rbac_per_route()):
        type_name = config.DESCRIPTOR.full_name
        flt = hcm_pb2.HttpFilter(name="x", typed_config=b.pack(config))
        lis = b.listener("l", http_filters=[flt])
        _, _, error = decode_listener(lis.SerializeToString())
        assert error == (
            f"{HCM}.http_filters[0].typed_config.value[{type_name}]: unsupported filter type"
        )
        flt.is_optional = True
        lis = b.listener("l", http_filters=[flt])
        _, listener, error = decode_listener(lis.SerializeToString())
        assert error is None and [f.name for f in listener.http_filters] == ["router"]


def test_an_override_of_another_type_enables_a_disabled_filter_with_the_listener_config():
    """C-core 1.85 live: any override under the filter's name enables a
    filter disabled in the listener; one of another filter's type is not
    used, so the listener's config runs (UNIMPLEMENTED).  A disabled
    ``FilterConfig`` turns the filter off whatever type it wraps."""
    other = b.stateful_session_per_route()
    assert outcome([fault("fault", 12, disabled=True)], route={"fault": other}) == "UNIMPLEMENTED"
    wrapped_other = route_components_pb2.FilterConfig(disabled=True)
    wrapped_other.config.Pack(other)
    assert outcome([fault("fault", 12)], route={"fault": wrapped_other}) == "pick"


SESSION = b.stateful_session_per_route()


def test_an_entry_of_another_type_is_passed_over_for_the_config_below_it():
    """C-core 1.85 live (A39 is silent on it): an entry under the filter's
    name of another filter's type is passed over for the config, which comes
    from the next less specific level of the filter's own type (the virtual
    host's FAILED_PRECONDITION, not the listener's UNIMPLEMENTED), whether
    that entry is plain or a FilterConfig, and whether the listener's filter
    is disabled (the other-type entry, the most specific, turns it on)."""
    base = [fault("fault", 12)]
    assert outcome(base, vh={"fault": abort(9)}, route={"fault": SESSION}) == "FAILED_PRECONDITION"
    got = outcome(base, vh={"fault": wrapped(9, False)}, route={"fault": SESSION})
    assert got == "FAILED_PRECONDITION"
    disabled_base = [fault("fault", 12, disabled=True)]
    got = outcome(disabled_base, vh={"fault": abort(9)}, route={"fault": SESSION})
    assert got == "FAILED_PRECONDITION"
    assert outcome(base, route={"fault": abort(9)}, cluster={"fault": SESSION}) == (
        "FAILED_PRECONDITION"
    )


def test_a_disabled_entry_passed_over_to_still_gives_its_config():
    """C-core 1.85 live: ``disabled`` is read from the most specific entry
    only; when that is another filter's type (so the filter runs), a less
    specific disabled FilterConfig of the filter's type supplies the config
    (its abort), even for a filter disabled in the listener."""
    got = outcome([fault("fault", 12)], vh={"fault": wrapped(9, True)}, route={"fault": SESSION})
    assert got == "FAILED_PRECONDITION"
    for base in ([fault("fault", 12)], [fault("fault", 12, disabled=True)]):
        got = outcome(base, route={"fault": wrapped(7, True)}, cluster={"fault": SESSION})
        assert got == "PERMISSION_DENIED"
