"""Client Listener (LDS) validation: the ApiListener, its HttpConnectionManager
and HTTP filters, case by case against C-core's own resource-type tests:
accept or NACK the same resource, with the same field path and, where pyxds
can say them, the same words.

Sources (each test names its case):
* grpc/grpc test/core/xds/xds_listener_resource_type_test.cc ("C-core
  <Suite>.<Test>", the ApiListener instantiation of the HCM tests);
* grpc/grpc test/core/xds/xds_http_filters_test.cc (router and fault filter
  configs, as a client Listener carries them).
Cases already pinned elsewhere are listed in /work/reports/conformlds.md with
the test that covers them; this file holds the rest.  Server-side Listener
filter chains are in test_server_listener_validation.py and
test_conformance_filter_chains.py.
"""

from __future__ import annotations

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import any_pb2

from pyxds.xds.resources import LISTENER, Listener

HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
HCM_FIELD = f"api_listener.api_listener.value[{HCM}]"
ROUTER = "envoy.extensions.filters.http.router.v3.Router"
FAULT = "envoy.extensions.filters.http.fault.v3.HTTPFault"


def hcm_with(*filters: tuple[str, any_pb2.Any | None]) -> hcm_pb2.HttpConnectionManager:
    """An HCM naming RDS resource "rds_name" (config source ``self``) with
    the given (name, typed_config) filters."""
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.rds.route_config_name = "rds_name"
    hcm.rds.config_source.self.SetInParent()
    for name, config in filters:
        f = hcm.http_filters.add(name=name)
        if config is not None:
            f.typed_config.CopyFrom(config)
    return hcm


def packed(message) -> any_pb2.Any:
    any_msg = any_pb2.Any()
    any_msg.Pack(message)
    return any_msg


def raw(type_name: str, value: bytes) -> any_pb2.Any:
    return any_pb2.Any(type_url=f"type.googleapis.com/{type_name}", value=value)


ROUTER_FILTER = ("router", packed(router_pb2.Router()))


def listener_of(hcm: hcm_pb2.HttpConnectionManager) -> listener_pb2.Listener:
    lis = listener_pb2.Listener(name="foo")
    lis.api_listener.api_listener.Pack(hcm)
    return lis


def accepted(lis: listener_pb2.Listener) -> Listener:
    result = LISTENER.decode(lis.SerializeToString())
    assert result.error is None, result.error
    resource: Listener = result.resource
    return resource


def problems(lis: listener_pb2.Listener) -> set[str]:
    result = LISTENER.decode(lis.SerializeToString())
    assert result.resource is None and result.error, "expected a NACK"
    return set(result.error.split("; "))


# ---------------------------------------------------------------- the Listener and its ApiListener


def test_bytes_that_do_not_parse_are_nacked_without_a_name():
    """C-core XdsListenerTest.UnparseableProto ("Can't parse Listener
    resource."; pyxds says it in its own words)."""
    result = LISTENER.decode(b"\0")
    assert result.resource is None and result.name is None
    assert "Listener" in result.error


def test_the_minimum_valid_client_listener():
    """C-core HttpConnectionManagerTest.MinimumValidConfig/ApiListener: the
    RDS name, the router, no max stream duration."""
    got = accepted(listener_of(hcm_with(ROUTER_FILTER)))
    assert got.name == "foo" and got.api_listener
    assert got.route_config_name == "rds_name" and got.route_config is None
    assert [(f.name, f.type_url) for f in got.http_filters] == [("router", ROUTER)]
    assert not got.max_stream_duration


def test_an_api_listener_without_its_any_is_nacked():
    """C-core ApiListenerTest.InnerApiListenerNotSet."""
    lis = listener_pb2.Listener(name="foo")
    lis.api_listener.SetInParent()
    assert problems(lis) == {"api_listener.api_listener: field not present"}


def test_an_api_listener_of_another_type_names_the_type_in_the_field():
    """C-core ApiListenerTest.DoesNotContainHttpConnectionManager (pyxds put
    the type in the words, not the field)."""
    lis = listener_pb2.Listener(name="foo")
    lis.api_listener.api_listener.Pack(listener_pb2.Listener())
    assert problems(lis) == {
        "api_listener.api_listener.value[envoy.config.listener.v3.Listener]: "
        "unsupported filter type"
    }


def test_an_hcm_that_does_not_parse_is_nacked_in_c_cores_words():
    """C-core ApiListenerTest.UnparseableHttpConnectionManagerConfig (pyxds
    named ``api_listener.api_listener`` with protobuf's words)."""
    lis = listener_pb2.Listener(name="foo")
    lis.api_listener.api_listener.CopyFrom(raw(HCM, b"\0"))
    assert problems(lis) == {f"{HCM_FIELD}: could not parse HttpConnectionManager config"}


def test_an_api_listener_any_without_a_type_names_its_type_url():
    """C-core ExtractXdsExtension (the Any's ``type_url``): an Any with bytes
    but no type."""
    lis = listener_pb2.Listener(name="foo")
    lis.api_listener.api_listener.value = b"\x08\x01"
    assert problems(lis) == {"api_listener.api_listener.type_url: field not present"}


# ---------------------------------------------------------------- HttpConnectionManager


def test_scoped_routes_is_neither_route_config_nor_rds():
    """C-core HttpConnectionManagerTest.NeitherRouteConfigNorRdsName/ApiListener."""
    hcm = hcm_with(ROUTER_FILTER)
    hcm.ClearField("rds")
    hcm.scoped_routes.SetInParent()
    assert problems(listener_of(hcm)) == {
        f"{HCM_FIELD}: neither route_config nor rds fields are present"
    }


def test_hcm_max_stream_duration_is_kept_with_its_nanos():
    """C-core HttpConnectionManagerTest.SetsMaxStreamDuration/ApiListener (5.005 s)."""
    hcm = hcm_with(ROUTER_FILTER)
    msd = hcm.common_http_protocol_options.max_stream_duration
    msd.seconds, msd.nanos = 5, 5_000_000
    assert accepted(listener_of(hcm)).max_stream_duration == pytest.approx(5.005)


def test_unsupported_hcm_fields_are_each_named():
    """C-core HttpConnectionManagerTest.UnsupportedFieldsSet/ApiListener."""
    hcm = hcm_with(ROUTER_FILTER)
    hcm.xff_num_trusted_hops = 1
    hcm.original_ip_detection_extensions.add()
    assert problems(listener_of(hcm)) == {
        f"{HCM_FIELD}.original_ip_detection_extensions: must be empty",
        f"{HCM_FIELD}.xff_num_trusted_hops: must be zero",
    }


# ---------------------------------------------------------------- HTTP filters


def test_a_router_config_that_does_not_parse_is_nacked():
    """grpc/grpc xds_http_filters_test.cc XdsRouterFilterTest
    .GenerateFilterConfigUnparsable: "could not parse router filter config"
    (pyxds never read the router's bytes and accepted them)."""
    lis = listener_of(hcm_with(("router", raw(ROUTER, b"\0"))))
    assert problems(lis) == {
        f"{HCM_FIELD}.http_filters[0].typed_config.value[{ROUTER}]: "
        "could not parse router filter config"
    }


def test_a_router_config_with_fields_gRPC_ignores_is_accepted():
    """The router's config has nothing gRPC uses: fields in it, known or
    not, are no reason to NACK (C-core XdsRouterFilterTest.GenerateFilterConfig
    reads none of them)."""
    router = router_pb2.Router(suppress_envoy_headers=True)
    router.start_child_span = True
    extra = router.SerializeToString() + b"\xf8\x3f\x01"  # unknown field 1023
    accepted(listener_of(hcm_with(("router", raw(ROUTER, extra)))))


def test_a_fault_config_that_does_not_parse_is_nacked_in_c_cores_words():
    """grpc/grpc xds_http_filters_test.cc XdsFaultInjectionFilterConfigTest
    .ParseUnparsable (top-level side)."""
    lis = listener_of(hcm_with(("fault", raw(FAULT, b"\0")), ROUTER_FILTER))
    assert problems(lis) == {
        f"{HCM_FIELD}.http_filters[0].typed_config.value[{FAULT}]: "
        "could not parse fault injection filter config"
    }


@pytest.mark.parametrize("optional", [False, True])
def test_a_filter_any_without_a_type_is_nacked_even_when_optional(optional: bool):
    """C-core ExtractXdsExtension runs before the optional check: an Any
    without ``type_url`` is "field not present" on ``.type_url`` (pyxds
    called it an unsupported filter type, and skipped it when optional)."""
    hcm = hcm_with(("nameless", any_pb2.Any(value=b"\x08\x01")), ROUTER_FILTER)
    hcm.http_filters[0].is_optional = optional
    assert problems(listener_of(hcm)) == {
        f"{HCM_FIELD}.http_filters[0].typed_config.type_url: field not present"
    }


def test_a_typed_struct_that_does_not_parse_is_nacked():
    """C-core ExtractXdsExtension: "could not parse" on the TypedStruct's
    value (pyxds named ``.typed_config`` with protobuf's words)."""
    lis = listener_of(hcm_with(("ts", raw("xds.type.v3.TypedStruct", b"\0")), ROUTER_FILTER))
    assert problems(lis) == {
        f"{HCM_FIELD}.http_filters[0].typed_config.value[xds.type.v3.TypedStruct]: could not parse"
    }


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda f: None, id="ParseEmptyConfig"),
        pytest.param(
            lambda f: (
                setattr(f.abort, "grpc_status", 14),
                setattr(f.abort.percentage, "numerator", 75),
                setattr(f.delay.fixed_delay, "seconds", 1),
                setattr(f.delay.fixed_delay, "nanos", 500_000_000),
                setattr(f.delay.percentage, "numerator", 25),
                setattr(f.max_active_faults, "value", 10),
            ),
            id="ParseBasicConfig",
        ),
        pytest.param(lambda f: setattr(f.abort, "http_status", 404), id="ParseHttpAbortCode"),
        pytest.param(
            lambda f: (f.abort.header_abort.SetInParent(), f.delay.header_delay.SetInParent()),
            id="ParseHeaderAbortAndDelay",
        ),
    ],
)
def test_valid_fault_configs_are_accepted(build):
    """grpc/grpc xds_http_filters_test.cc XdsFaultInjectionFilterConfigTest
    .ParseEmptyConfig, .ParseBasicConfig, .ParseHttpAbortCode,
    .ParseHeaderAbortAndDelay."""
    fault = fault_pb2.HTTPFault()
    build(fault)
    got = accepted(listener_of(hcm_with(("fault", packed(fault)), ROUTER_FILTER)))
    assert [f.type_url for f in got.http_filters] == [FAULT, ROUTER]


@pytest.mark.parametrize(
    "build, field, text",
    [
        pytest.param(
            lambda f: setattr(f.abort, "grpc_status", 17),
            "abort.grpc_status",
            "invalid gRPC status code: 17",
            id="ParseInvalidGrpcStatusCode",
        ),
        pytest.param(
            lambda f: setattr(f.delay.fixed_delay, "seconds", 315576000001),
            "delay.fixed_delay.seconds",
            "value must be in the range [0, 315576000000]",
            id="ParseInvalidDuration",
        ),
    ],
)
def test_invalid_fault_configs_name_the_field(build, field: str, text: str):
    """grpc/grpc xds_http_filters_test.cc XdsFaultInjectionFilterConfigTest
    .ParseInvalidGrpcStatusCode, .ParseInvalidDuration."""
    fault = fault_pb2.HTTPFault()
    build(fault)
    lis = listener_of(hcm_with(("fault", packed(fault)), ROUTER_FILTER))
    assert problems(lis) == {
        f"{HCM_FIELD}.http_filters[0].typed_config.value[{FAULT}].{field}: {text}"
    }


# ---------------------------------------------------------------- grpc-go's cases


def test_a_listener_whose_hcm_does_not_parse_keeps_its_name():
    """grpc-go internal/xds/xdsclient/xdsresource/unmarshal_lds_test.go
    TestUnmarshalListener_ClientSide "badly_marshaled_listener_resource": the
    NACK still names the resource (so the watcher of that name is told)."""
    lis = listener_pb2.Listener(name="foo")
    lis.api_listener.api_listener.CopyFrom(raw(HCM, bytes([1, 2, 3, 4])))
    result = LISTENER.decode(lis.SerializeToString())
    assert result.resource is None and result.name == "foo"
    assert result.error == f"{HCM_FIELD}: could not parse HttpConnectionManager config"


def test_two_filters_of_one_type_under_different_names_are_both_kept():
    """grpc-go unmarshal_lds_test.go
    "v3_with_two_filters_same_type_different_name" (C-core checks names,
    not types, for duplicates)."""
    fault = packed(fault_pb2.HTTPFault())
    got = accepted(listener_of(hcm_with(("fault1", fault), ("fault2", fault), ROUTER_FILTER)))
    assert [f.name for f in got.http_filters] == ["fault1", "fault2", "router"]


def test_an_empty_rds_is_nacked_for_its_missing_config_source():
    """grpc-go unmarshal_lds_test.go "empty_httpConnMgr_in_apiListener" (an
    ``rds`` with nothing in it; C-core RdsConfigSourceNotSet's field)."""
    hcm = hcm_pb2.HttpConnectionManager()
    hcm.rds.SetInParent()
    hcm.http_filters.add(name="router").typed_config.CopyFrom(ROUTER_FILTER[1])
    assert problems(listener_of(hcm)) == {f"{HCM_FIELD}.rds.config_source: field not present"}


@pytest.mark.parametrize("type_url", ["no-slash", "type.googleapis.com/"])
def test_a_filter_type_url_without_a_type_after_its_slash_is_nacked_even_when_optional(
    type_url: str,
):
    """C-core ExtractXdsExtension (StripTypePrefix): a ``type_url`` with no
    ``/``, or nothing after the last one, is ``invalid value "..."`` whether
    or not the filter is optional (pyxds skipped the optional filter)."""
    hcm = hcm_with(("odd", any_pb2.Any(type_url=type_url)), ROUTER_FILTER)
    hcm.http_filters[0].is_optional = True
    assert problems(listener_of(hcm)) == {
        f'{HCM_FIELD}.http_filters[0].typed_config.type_url: invalid value "{type_url}"'
    }


def test_a_router_config_that_is_wire_format_but_no_router_is_nacked():
    """grpcio 1.85's C-core parses the router's config as ``Router``: field 1
    (``dynamic_stats``, a BoolValue) holding bytes that are no message is
    "could not parse router filter config" (tests/e2e/
    test_differential_lds_rds_nacks.py); pyxds checked wire format only."""
    lis = listener_of(hcm_with(("router", raw(ROUTER, b"\x0a\x03\xff\xfe\xfd"))))
    assert problems(lis) == {
        f"{HCM_FIELD}.http_filters[0].typed_config.value[{ROUTER}]: "
        "could not parse router filter config"
    }
