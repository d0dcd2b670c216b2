"""The stateful session filter's configs in LDS and RDS (gRFC A55 "Listener
and Route Configuration through xDS", A39 overrides): accepted, parsed into
a frozen CookieConfig, and NACKed with C-core's words and field paths (the
expected texts are what grpcio 1.85.3's C-core NACKed with, same configs)."""

from __future__ import annotations

import pytest
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2 as ss_pb2
from google.protobuf import any_pb2, duration_pb2
from xds.type.v3 import typed_struct_pb2

from pyxds.server import builders as b
from pyxds.xds.resources import LISTENER, ROUTE_CONFIG
from pyxds.xds.resources.stateful_session import (
    DISABLED,
    STATEFUL_SESSION_PER_ROUTE_TYPE,
    STATEFUL_SESSION_TYPE,
    CookieConfig,
    parse_stateful_session,
    parse_stateful_session_per_route,
)

HCM = (
    "api_listener.api_listener.value[envoy.extensions.filters.network"
    ".http_connection_manager.v3.HttpConnectionManager]"
)
SS = f"value[{STATEFUL_SESSION_TYPE}]"
COOKIE = "value[envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState]"


def decode_listener(http_filter):
    listener = b.listener("L", http_filters=[http_filter])
    result = LISTENER.decode(listener.SerializeToString())
    return result


def listener_error(http_filter) -> str:
    result = decode_listener(http_filter)
    assert result.resource is None and result.error, "expected a NACK"
    return result.error


def route_config_with(override):
    return b.route_config(
        "rc",
        [
            b.virtual_host(
                "vh",
                routes=[
                    b.route(prefix="", cluster="c1", typed_per_filter_config={"ssa": override})
                ],
            )
        ],
    )


def decode_routes(override):
    return ROUTE_CONFIG.decode(route_config_with(override).SerializeToString())


def test_a_listener_with_the_filter_is_accepted_and_keeps_it():
    result = decode_listener(b.stateful_session_filter(cookie_name="c", path="/pkg", ttl=120))
    assert result.error is None
    kept = [f for f in result.resource.http_filters if f.type_url == STATEFUL_SESSION_TYPE]
    assert len(kept) == 1


def test_the_config_parses_into_name_path_ttl():
    cfg = b.stateful_session_config("global-session-cookie", "/Package1.Service2/Method3", 120)
    got = parse_stateful_session(cfg.SerializeToString(), "p", errs := _Errors())
    assert not errs
    assert got == CookieConfig("global-session-cookie", "/Package1.Service2/Method3", 120.0)
    assert got == parse_stateful_session(cfg.SerializeToString(), "p", _Errors())  # a value


def test_no_session_state_is_a_filter_that_does_nothing():
    errs = _Errors()
    assert (
        parse_stateful_session(ss_pb2.StatefulSession().SerializeToString(), "p", errs) is DISABLED
    )
    assert not errs and not DISABLED.enabled


def test_an_empty_cookie_name_is_nacked_as_c_core():
    err = listener_error(b.stateful_session_filter(cookie_name=""))
    assert err == (
        f"{HCM}.http_filters[0].typed_config.{SS}.session_state.typed_config.{COOKIE}"
        ".cookie.name: field not present"
    )


def test_a_negative_ttl_is_nacked_as_c_core():
    cfg = b.stateful_session_config("c")
    cfg_state = ss_pb2.StatefulSession()
    cfg_state.CopyFrom(cfg)
    # rebuild the cookie with a negative ttl
    from envoy.extensions.http.stateful_session.cookie.v3 import cookie_pb2

    state = cookie_pb2.CookieBasedSessionState()
    cfg_state.session_state.typed_config.Unpack(state)
    state.cookie.ttl.CopyFrom(duration_pb2.Duration(seconds=-1))
    cfg_state.session_state.typed_config.Pack(state)
    err = listener_error(b.stateful_session_filter(config=cfg_state))
    assert err == (
        f"{HCM}.http_filters[0].typed_config.{SS}.session_state.typed_config.{COOKIE}"
        ".cookie.ttl.seconds: value must be in the range [0, 315576000000]"
    )


def test_an_unsupported_session_state_type_is_nacked_as_c_core():
    cfg = b.stateful_session_config("c")
    cfg.session_state.typed_config.Pack(router_pb2.Router())
    err = listener_error(b.stateful_session_filter(config=cfg))
    assert err == (
        f"{HCM}.http_filters[0].typed_config.{SS}.session_state.typed_config"
        ".value[envoy.extensions.filters.http.router.v3.Router]: unsupported session state type"
    )


def test_a_session_state_without_cookie_is_nacked_as_c_core():
    from envoy.extensions.http.stateful_session.cookie.v3 import cookie_pb2

    cfg = b.stateful_session_config("c")
    cfg.session_state.typed_config.Pack(cookie_pb2.CookieBasedSessionState())
    err = listener_error(b.stateful_session_filter(config=cfg))
    assert err == (
        f"{HCM}.http_filters[0].typed_config.{SS}.session_state.typed_config.{COOKIE}"
        ".cookie: field not present"
    )


def test_bytes_that_do_not_parse_are_nacked_as_c_core():
    bad = any_pb2.Any(type_url=f"type.googleapis.com/{STATEFUL_SESSION_TYPE}", value=b"\xff\xff")
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    err = listener_error(hcm_pb2.HttpFilter(name="ssa", typed_config=bad))
    assert err == (
        f"{HCM}.http_filters[0].typed_config.{SS}: could not parse stateful session filter config"
    )


def test_a_typed_struct_config_is_nacked():
    """C-core: a TypedStruct carries JSON, not the config's bytes."""
    ts = typed_struct_pb2.TypedStruct(type_url=f"type.googleapis.com/{STATEFUL_SESSION_TYPE}")
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    err = listener_error(hcm_pb2.HttpFilter(name="ssa", typed_config=b.pack(ts)))
    assert "could not parse stateful session filter config" in err


# -- per-route overrides (StatefulSessionPerRoute) ------------------------------------------


def test_a_disabling_override_is_accepted_and_kept():
    result = decode_routes(b.stateful_session_per_route(disabled=True))
    assert result.error is None
    route = result.resource.virtual_hosts[0].routes[0]
    assert [(name, t) for name, t, _ in route.filter_overrides] == [
        ("ssa", STATEFUL_SESSION_PER_ROUTE_TYPE)
    ]


def test_per_route_configs_parse():
    on = b.stateful_session_per_route(cookie_name="other", path="/p", ttl=5)
    assert parse_stateful_session_per_route(on.SerializeToString(), "p", _Errors()) == (
        CookieConfig("other", "/p", 5.0)
    )
    off = b.stateful_session_per_route(disabled=True)
    assert parse_stateful_session_per_route(off.SerializeToString(), "p", _Errors()) is DISABLED
    empty = ss_pb2.StatefulSessionPerRoute()
    assert parse_stateful_session_per_route(empty.SerializeToString(), "p", _Errors()) is DISABLED


def test_a_bad_per_route_cookie_is_nacked_as_c_core():
    result = decode_routes(b.stateful_session_per_route(cookie_name=""))
    assert result.error == (
        "virtual_hosts[0].routes[0].typed_per_filter_config[ssa]"
        f".value[{STATEFUL_SESSION_PER_ROUTE_TYPE}].stateful_session.session_state"
        f".typed_config.{COOKIE}.cookie.name: field not present"
    )


def test_a_per_route_unsupported_session_state_is_nacked_as_c_core():
    per_route = b.stateful_session_per_route(cookie_name="c")
    per_route.stateful_session.session_state.typed_config.Pack(router_pb2.Router())
    result = decode_routes(per_route)
    assert result.error == (
        "virtual_hosts[0].routes[0].typed_per_filter_config[ssa]"
        f".value[{STATEFUL_SESSION_PER_ROUTE_TYPE}].stateful_session.session_state"
        ".typed_config.value[envoy.extensions.filters.http.router.v3.Router]:"
        " unsupported session state type"
    )


def test_the_top_level_type_as_an_override_is_nacked_as_c_core():
    result = decode_routes(b.stateful_session_config("c"))
    assert result.error == (
        "virtual_hosts[0].routes[0].typed_per_filter_config[ssa]"
        f".value[{STATEFUL_SESSION_TYPE}]: unsupported filter type"
    )


@pytest.mark.parametrize("disabled", [True, False])
def test_the_same_route_config_twice_is_equal(disabled):
    per_route = b.stateful_session_per_route(disabled=disabled, cookie_name="c")
    assert decode_routes(per_route).resource == decode_routes(per_route).resource


class _Errors(list):
    def add(self, path, problem):
        self.append(f"{path}: {problem}")
