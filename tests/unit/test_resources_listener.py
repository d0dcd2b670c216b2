"""LDS validation (A27 "Listener Proto", A31 max_stream_duration, A39 HTTP filters)."""

from __future__ import annotations

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import any_pb2
from xds.type.v3 import typed_struct_pb2

from pyxds.xds.resources import LISTENER, Listener, PrefixMatch, RouteAction


def router_filter(name: str = "router") -> hcm_pb2.HttpFilter:
    f = hcm_pb2.HttpFilter(name=name)
    f.typed_config.Pack(router_pb2.Router())
    return f


def hcm_rds(name: str = "route-1", source: str = "ads") -> hcm_pb2.HttpConnectionManager:
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.rds.route_config_name = name
    if source == "ads":
        hcm.rds.config_source.ads.SetInParent()
    elif source == "self":
        hcm.rds.config_source.self.SetInParent()
    elif source == "path":
        hcm.rds.config_source.path_config_source.path = "/x"
    hcm.http_filters.append(router_filter())
    return hcm


HCM_PATH = (
    "api_listener.api_listener.value["
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager]"
)


def listener(hcm: hcm_pb2.HttpConnectionManager | None, name: str = "lis") -> bytes:
    lis = listener_pb2.Listener(name=name)
    if hcm is not None:
        lis.api_listener.api_listener.Pack(hcm)
    return lis.SerializeToString()


def decode_ok(data: bytes) -> Listener:
    result = LISTENER.decode(data)
    assert result.error is None, result.error
    return result.resource


def decode_err(data: bytes) -> str:
    result = LISTENER.decode(data)
    assert result.resource is None
    assert result.name == "lis"
    return result.error


def test_rds_listener_with_ads_config_source():
    lis = decode_ok(listener(hcm_rds()))
    assert lis.name == "lis" and lis.api_listener
    assert lis.route_config_name == "route-1" and lis.route_config is None
    assert [f.type_url for f in lis.http_filters] == [
        "envoy.extensions.filters.http.router.v3.Router"
    ]
    assert lis.max_stream_duration is None


def test_rds_config_source_self_is_accepted():
    assert decode_ok(listener(hcm_rds(source="self"))).route_config_name == "route-1"


def test_rds_config_source_other_than_ads_or_self_is_rejected():
    err = decode_err(listener(hcm_rds(source="path")))
    assert f"{HCM_PATH}.rds.config_source: ConfigSource does not specify ADS or SELF" in err


def test_rds_config_source_missing_is_rejected():
    err = decode_err(listener(hcm_rds(source="none")))
    assert "rds.config_source: field not present" in err


def test_inline_route_config():
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.http_filters.append(router_filter())
    vh = hcm.route_config.virtual_hosts.add(name="vh", domains=["*"])
    r = vh.routes.add()
    r.match.prefix = ""
    r.route.cluster = "c1"
    lis = decode_ok(listener(hcm))
    assert lis.route_config_name is None
    rc = lis.route_config
    assert rc.virtual_hosts[0].routes[0].match.path_specifier == PrefixMatch("")
    assert rc.virtual_hosts[0].routes[0].action == RouteAction(cluster="c1")


def test_inline_route_config_error_names_the_nested_field():
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.http_filters.append(router_filter())
    vh = hcm.route_config.virtual_hosts.add(name="vh", domains=["*"])
    r = vh.routes.add()
    r.match.prefix = "/"
    r.route.weighted_clusters.clusters.add(name="a").weight.value = 0
    err = decode_err(listener(hcm))
    assert (
        f"{HCM_PATH}.route_config.virtual_hosts[0].routes[0]"
        ".route.weighted_clusters: no valid clusters specified" in err
    )


def test_neither_rds_nor_route_config_is_rejected():
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.http_filters.append(router_filter())
    assert "neither route_config nor rds fields are present" in decode_err(listener(hcm))


def test_scoped_routes_is_rejected():
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.http_filters.append(router_filter())
    hcm.scoped_routes.name = "x"
    assert "neither route_config nor rds fields are present" in decode_err(listener(hcm))


def test_xff_trusted_hops_and_ip_detection_are_rejected():
    hcm = hcm_rds()
    hcm.xff_num_trusted_hops = 1
    hcm.original_ip_detection_extensions.add(name="x")
    err = decode_err(listener(hcm))
    assert f"{HCM_PATH}.xff_num_trusted_hops: must be zero" in err
    assert f"{HCM_PATH}.original_ip_detection_extensions: must be empty" in err


def test_listener_without_api_listener_decodes_as_not_api_listener():
    """A server listener decodes (validated as one, A36) and is not an API
    listener: the resolver reports it."""
    from pyxds.server import inbound

    tcp = inbound.server_listener("lis", "0.0.0.0:8080", [inbound.filter_chain()])
    lis = decode_ok(tcp.SerializeToString())
    assert not lis.api_listener and lis.tcp_listener.address == "0.0.0.0:8080"


def test_server_listener_with_only_an_address_is_rejected_as_c_core_does():
    tcp = listener_pb2.Listener(name="lis")
    tcp.address.socket_address.address = "0.0.0.0"
    tcp.address.socket_address.port_value = 8080
    result = LISTENER.decode(tcp.SerializeToString())
    assert result.error == "default_filter_chain: must be set if filter_chains is unset"


def test_listener_with_neither_address_nor_api_listener_is_rejected():
    """C-core XdsListenerTest.NeitherAddressNotApiListener."""
    assert decode_err(listener(None)) == "Listener has neither address nor ApiListener"


def test_api_listener_of_other_type_is_rejected():
    lis = listener_pb2.Listener(name="lis")
    lis.api_listener.api_listener.Pack(router_pb2.Router())
    err = decode_err(lis.SerializeToString())
    assert (
        "api_listener.api_listener.value[envoy.extensions.filters.http.router.v3.Router]: "
        "unsupported filter type"
    ) in err


def test_api_listener_with_garbage_hcm_bytes_is_rejected():
    lis = listener_pb2.Listener(name="lis")
    lis.api_listener.api_listener.type_url = (
        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
        "HttpConnectionManager"
    )
    lis.api_listener.api_listener.value = b"\xff\xff\xff"
    assert "could not parse" in decode_err(lis.SerializeToString())


def test_unparseable_bytes_have_no_name():
    result = LISTENER.decode(b"\xff\xff\xff\xff")
    assert result.name is None and result.resource is None and "could not parse" in result.error


# ---------------------------------------------------------------- http filters


def test_empty_filter_list_is_rejected():
    hcm = hcm_rds()
    del hcm.http_filters[:]
    assert "http_filters: expected at least one HTTP filter" in decode_err(listener(hcm))


def test_terminal_filter_before_the_last_is_rejected():
    hcm = hcm_rds()
    hcm.http_filters.append(router_filter("router2"))
    err = decode_err(listener(hcm))
    assert (
        "http_filters: terminal filter for config type "
        "envoy.extensions.filters.http.router.v3.Router must be the last filter in the chain"
    ) in err


def test_last_filter_not_terminal_is_rejected(monkeypatch):
    from pyxds.xds.resources import listener as listener_module

    monkeypatch.setitem(
        listener_module.HTTP_FILTER_TYPES, "envoy.extensions.filters.http.fault.v3.HTTPFault", False
    )
    hcm = hcm_rds()
    f = hcm.http_filters.add(name="fault")
    f.typed_config.Pack(fault_pb2.HTTPFault())
    err = decode_err(listener(hcm))
    assert (
        "non-terminal filter for config type envoy.extensions.filters.http.fault.v3.HTTPFault"
        " is the last filter in the chain"
    ) in err


def test_skipped_optional_filter_after_router_does_not_count():
    hcm = hcm_rds()
    f = hcm.http_filters.add(name="fault", is_optional=True)
    f.typed_config.Pack(rbac_pb2.RBAC())
    assert [x.name for x in decode_ok(listener(hcm)).http_filters] == ["router"]


def test_only_optional_unknown_filters_is_rejected():
    hcm = hcm_rds()
    del hcm.http_filters[:]
    f = hcm.http_filters.add(name="fault", is_optional=True)
    f.typed_config.Pack(rbac_pb2.RBAC())
    assert "http_filters: expected at least one HTTP filter" in decode_err(listener(hcm))


def test_unknown_required_filter_is_rejected():
    hcm = hcm_rds()
    f = hcm_pb2.HttpFilter(name="fault")
    f.typed_config.Pack(rbac_pb2.RBAC())
    hcm.http_filters.insert(0, f)
    err = decode_err(listener(hcm))
    assert "http_filters[0].typed_config.value[" in err
    assert "filter is not supported on clients" in err
    assert "envoy.extensions.filters.http.rbac.v3.RBAC" in err


def test_unknown_optional_filter_is_skipped():
    hcm = hcm_rds()
    f = hcm_pb2.HttpFilter(name="fault", is_optional=True)
    f.typed_config.Pack(rbac_pb2.RBAC())
    hcm.http_filters.insert(0, f)
    lis = decode_ok(listener(hcm))
    assert [f.name for f in lis.http_filters] == ["router"]


def test_filter_without_typed_config_is_rejected():
    hcm = hcm_rds()
    hcm.http_filters.insert(0, hcm_pb2.HttpFilter(name="bare"))
    assert "http_filters[0].typed_config: field not present" in decode_err(listener(hcm))


def test_optional_filter_without_typed_config_is_still_rejected():
    hcm = hcm_rds()
    hcm.http_filters.insert(0, hcm_pb2.HttpFilter(name="bare", is_optional=True))
    assert "http_filters[0].typed_config: field not present" in decode_err(listener(hcm))


def test_duplicate_and_empty_filter_names_are_rejected():
    hcm = hcm_rds()
    hcm.http_filters.insert(0, router_filter(""))
    err = decode_err(listener(hcm))
    assert "http_filters[0].name: empty filter name" in err
    hcm = hcm_rds()
    f = hcm_pb2.HttpFilter(name="router", is_optional=True)
    f.typed_config.Pack(rbac_pb2.RBAC())
    hcm.http_filters.insert(0, f)
    assert "http_filters[1].name: duplicate HTTP filter name: router" in decode_err(listener(hcm))


HCM_VALUE = (
    "api_listener.api_listener.value["
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager]"
)


def test_typed_struct_filter_is_unwrapped_to_its_type():
    """The type a TypedStruct names decides (A39): an unknown optional one is
    skipped, an unknown required one is "unsupported"."""
    hcm = hcm_rds()
    third = hcm_pb2.HttpFilter(name="third", is_optional=True)
    third.typed_config.Pack(typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/x.Filter"))
    hcm.http_filters.insert(0, third)
    assert [x.name for x in decode_ok(listener(hcm)).http_filters] == ["router"]
    hcm.http_filters[0].is_optional = False
    assert "unsupported filter type" in decode_err(listener(hcm))


@pytest.mark.parametrize("optional", [False, True])
def test_a_filter_from_ecds_is_nacked_even_when_optional_as_c_core(optional):
    """``config_discovery`` (ECDS) is not supported: C-core 1.85 reads only
    ``typed_config`` and NACKs "field not present", ``is_optional`` or not
    (A39 speaks only of unknown config types; grpc-go skips an optional one)."""
    from envoy.config.core.v3 import config_source_pb2

    hcm = hcm_rds()
    ecds = hcm_pb2.HttpFilter(name="ecds", is_optional=optional)
    ecds.config_discovery.CopyFrom(
        config_source_pb2.ExtensionConfigSource(type_urls=["type.googleapis.com/x.Y"])
    )
    ecds.config_discovery.config_source.ads.SetInParent()
    hcm.http_filters.insert(0, ecds)
    err = decode_err(listener(hcm))
    assert f"{HCM_VALUE}.http_filters[0].typed_config: field not present" in err


@pytest.mark.parametrize(
    ("config_type", "error"),
    [
        ("envoy.extensions.filters.http.router.v3.Router", "could not parse router filter config"),
        (
            "envoy.extensions.filters.http.fault.v3.HTTPFault",
            "could not parse fault injection filter config",
        ),
    ],
)
def test_a_router_or_fault_config_in_a_typed_struct_is_nacked_as_c_core(config_type, error):
    """A TypedStruct holds JSON, not the config's protobuf bytes: C-core's
    router and fault filters cannot read it and NACK (pyxds took the router
    and ran the fault filter on the TypedStruct's bytes, i.e. no fault)."""
    hcm = hcm_rds()
    del hcm.http_filters[:]
    if "fault" in config_type:
        hcm.http_filters.add(name="f")
    hcm.http_filters.add(name="last")
    hcm.http_filters[0].typed_config.Pack(
        typed_struct_pb2.TypedStruct(type_url=f"type.googleapis.com/{config_type}")
    )
    if "fault" in config_type:
        hcm.http_filters[1].CopyFrom(router_filter())
    assert (
        f"{HCM_VALUE}.http_filters[0].typed_config.value[xds.type.v3.TypedStruct]"
        f".value[{config_type}]: {error}"
    ) in decode_err(listener(hcm))


# ---------------------------------------------------------------- max_stream_duration (A31)


def test_hcm_max_stream_duration():
    hcm = hcm_rds()
    hcm.common_http_protocol_options.max_stream_duration.seconds = 5
    hcm.common_http_protocol_options.max_stream_duration.nanos = 500_000_000
    assert decode_ok(listener(hcm)).max_stream_duration == 5.5


def test_hcm_max_stream_duration_zero_is_kept_as_zero():
    hcm = hcm_rds()
    hcm.common_http_protocol_options.max_stream_duration.SetInParent()
    assert decode_ok(listener(hcm)).max_stream_duration == 0.0


@pytest.mark.parametrize(
    ("seconds", "nanos", "field"),
    [(-1, 0, "seconds"), (315_576_000_001, 0, "seconds"), (1, 1_000_000_000, "nanos")],
)
def test_hcm_max_stream_duration_out_of_range(seconds, nanos, field):
    hcm = hcm_rds()
    hcm.common_http_protocol_options.max_stream_duration.seconds = seconds
    hcm.common_http_protocol_options.max_stream_duration.nanos = nanos
    err = decode_err(listener(hcm))
    assert f"common_http_protocol_options.max_stream_duration.{field}: value must be" in err


# ---------------------------------------------------------------- values / Any


def test_same_bytes_decode_to_equal_values():
    data = listener(hcm_rds())
    a, b = decode_ok(data), decode_ok(data)
    assert a == b and hash(a) == hash(b)


def test_decode_any_plain_and_wrapped_in_discovery_resource():
    from envoy.service.discovery.v3 import discovery_pb2

    data = listener(hcm_rds())
    plain = any_pb2.Any(type_url=LISTENER.type_url, value=data)
    assert LISTENER.decode_any(plain).resource == decode_ok(data)
    wrapper = discovery_pb2.Resource(name="lis")
    wrapper.resource.CopyFrom(plain)
    wrapped = any_pb2.Any()
    wrapped.Pack(wrapper)
    assert LISTENER.decode_any(wrapped).resource == decode_ok(data)


def test_decode_any_with_wrong_type_is_an_error():
    wrong = any_pb2.Any()
    wrong.Pack(route_pb2.RouteConfiguration(name="x"))
    result = LISTENER.decode_any(wrong)
    assert result.resource is None and "does not match" in result.error
