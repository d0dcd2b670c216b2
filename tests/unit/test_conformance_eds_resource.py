"""Conformance: ClusterLoadAssignment (EDS) validation, case by case against
other implementations' resource-type tests.

Sources (each test names its case):

* C-core ``test/core/xds/xds_endpoint_resource_type_test.cc`` (grpc/grpc,
  ``XdsEndpointTest.*``): accept/NACK and each NACK's field path and words.
* grpc-go ``xds/internal/xdsclient/xdsresource/unmarshal_eds.go`` /
  ``unmarshal_eds_test.go`` (``TestEDSParseRespProto``).
* gRFCs A27 (ClusterLoadAssignment), A61 (additional_addresses, health
  status), A86 (HTTP CONNECT metadata, off unless enabled).

Cases already pinned in tests/unit/test_conformance_resources.py and
test_resources_endpoints.py are not repeated (the report lists them).
C-core's errors read ``field:<path> error:<words>``; pyxds's read
``<path>: <words>``.
"""

from __future__ import annotations

import socket

import pytest
from envoy.config.core.v3 import address_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.type.v3 import percent_pb2

from pyxds.xds.resources import ENDPOINTS
from pyxds.xds.resources.types import ClusterLoadAssignment, LocalityName

CORE = "grpc/grpc test/core/xds/xds_endpoint_resource_type_test.cc"
EP0 = "endpoints[0].lb_endpoints[0].endpoint"
HTTP_PROXY_KEY = "envoy.http11_proxy_transport_socket.proxy_address"


def locality(
    region: str = "myregion", weight: int | None = 1, priority: int = 0
) -> endpoint_components_pb2.LocalityLbEndpoints:
    loc = endpoint_components_pb2.LocalityLbEndpoints(priority=priority)
    loc.locality.region = region
    loc.locality.zone = "myzone"
    loc.locality.sub_zone = "mysubzone"
    if weight is not None:
        loc.load_balancing_weight.value = weight
    return loc


def add_endpoint(
    loc: endpoint_components_pb2.LocalityLbEndpoints, address: str = "127.0.0.1", port: int = 443
) -> endpoint_components_pb2.LbEndpoint:
    lbe = loc.lb_endpoints.add()
    sa = lbe.endpoint.address.socket_address
    sa.address = address
    sa.port_value = port
    return lbe


def cla(*locs) -> endpoint_pb2.ClusterLoadAssignment:
    c = endpoint_pb2.ClusterLoadAssignment(cluster_name="foo")
    c.endpoints.extend(locs)
    return c


def ok(c: endpoint_pb2.ClusterLoadAssignment) -> ClusterLoadAssignment:
    result = ENDPOINTS.decode(c.SerializeToString())
    assert result.error is None, result.error
    assert result.name == "foo"
    resource: ClusterLoadAssignment = result.resource
    return resource


def nack(c: endpoint_pb2.ClusterLoadAssignment) -> list[str]:
    result = ENDPOINTS.decode(c.SerializeToString())
    assert result.resource is None and result.error, "expected a NACK"
    assert result.name == "foo"
    errors: list[str] = result.error.split("; ")
    return errors


def one_locality(loc: endpoint_components_pb2.LocalityLbEndpoints) -> ClusterLoadAssignment:
    return ok(cla(loc))


# ---------------------------------------------------------------- accepted shapes


def test_unparsable_cla_bytes_are_nacked():
    """C-core XdsEndpointTest.UnparsableProto."""
    result = ENDPOINTS.decode(b"\0")
    assert result.resource is None and result.error


def test_minimum_valid_config():
    """C-core XdsEndpointTest.MinimumValidConfig: one priority, one locality of
    weight 1, one endpoint of weight 1 and health UNKNOWN, no drops."""
    loc = locality()
    add_endpoint(loc)
    r = one_locality(loc)
    [[got]] = r.priorities
    assert got.name == LocalityName("myregion", "myzone", "mysubzone")
    assert got.weight == 1
    [ep] = got.endpoints
    assert (ep.addresses, ep.weight, ep.health_status) == (("127.0.0.1:443",), 1, "UNKNOWN")
    assert r.drop_overloads == ()


def test_endpoint_weight_is_kept():
    """C-core XdsEndpointTest.EndpointWeight."""
    loc = locality()
    add_endpoint(loc).load_balancing_weight.value = 3
    [[got]] = one_locality(loc).priorities
    assert got.endpoints[0].weight == 3


@pytest.mark.parametrize("weight", [None, 0])
def test_unweighted_locality_is_dropped_before_its_name_and_addresses_count(weight):
    """C-core XdsEndpointTest.IgnoresLocalityWithNoWeight / IgnoresLocalityWithZeroWeight:
    the same locality and address twice, the first without weight, is no
    duplicate."""
    first = locality(weight=weight)
    add_endpoint(first)
    second = locality()
    add_endpoint(second)
    [[got]] = ok(cla(first, second)).priorities
    assert got.weight == 1 and got.endpoints[0].addresses == ("127.0.0.1:443",)


def test_endpoint_hostname_is_kept():
    """C-core XdsEndpointTest.EndpointHostname (the address's name, A81)."""
    loc = locality()
    add_endpoint(loc).endpoint.hostname = "server.example.com"
    [[got]] = one_locality(loc).priorities
    assert got.endpoints[0].hostname == "server.example.com"


def test_additional_address_becomes_the_endpoints_second_address():
    """C-core XdsEndpointTest.MultipleAddressesPerEndpoint (A61)."""
    loc = locality()
    lbe = add_endpoint(loc)
    sa = lbe.endpoint.additional_addresses.add().address.socket_address
    sa.address = "127.0.0.1"
    sa.port_value = 444
    [[got]] = one_locality(loc).priorities
    assert got.endpoints[0].addresses == ("127.0.0.1:443", "127.0.0.1:444")


def test_endpoint_health_status_draining_kept_unhealthy_excluded():
    """C-core XdsEndpointTest.EndpointHealthStatus (A55, A61)."""
    loc = locality()
    add_endpoint(loc)
    add_endpoint(loc, "127.0.0.2").health_status = health_check_pb2.DRAINING
    add_endpoint(loc, "127.0.0.3").health_status = health_check_pb2.UNHEALTHY
    [[got]] = one_locality(loc).priorities
    assert [(e.addresses[0], e.health_status) for e in got.endpoints] == [
        ("127.0.0.1:443", "UNKNOWN"),
        ("127.0.0.2:443", "DRAINING"),
    ]


def test_http_proxy_metadata_is_ignored_without_a86():
    """C-core XdsEndpointTest.HttpProxyIgnoredIfNotEnabled: A86's proxy address
    in locality and endpoint typed metadata changes nothing when HTTP CONNECT
    is off (it is in grpcio 1.85 and pyxds)."""
    proxy = address_pb2.Address()
    proxy.socket_address.address = "1.2.3.4"
    proxy.socket_address.port_value = 123
    loc = locality()
    loc.metadata.typed_filter_metadata[HTTP_PROXY_KEY].Pack(proxy)
    lbe = add_endpoint(loc)
    lbe.metadata.typed_filter_metadata[HTTP_PROXY_KEY].Pack(proxy)
    [[got]] = one_locality(loc).priorities
    assert got.endpoints[0].addresses == ("127.0.0.1:443",)


def test_drop_config_converted_to_parts_per_million():
    """C-core XdsEndpointTest.DropConfig / CapsDropPercentageAt100."""
    loc = locality()
    add_endpoint(loc)
    c = cla(loc)
    for category, numerator, denominator in (
        ("lb_drop", 50, percent_pb2.FractionalPercent.HUNDRED),
        ("lb_overload", 2500, percent_pb2.FractionalPercent.TEN_THOUSAND),
        ("why_not", 750000, percent_pb2.FractionalPercent.MILLION),
        ("capped", 10000001, percent_pb2.FractionalPercent.HUNDRED),
    ):
        d = c.policy.drop_overloads.add(category=category)
        d.drop_percentage.numerator = numerator
        d.drop_percentage.denominator = denominator
    assert [(d.category, d.parts_per_million) for d in ok(c).drop_overloads] == [
        ("lb_drop", 500000),
        ("lb_overload", 250000),
        ("why_not", 750000),
        ("capped", 1000000),
    ]


# ---------------------------------------------------------------- NACKs: C-core's fields, words


def test_locality_without_locality_field_in_c_core_words():
    """C-core XdsEndpointTest.NoLocality; grpc-go TestEDSParseRespProto
    (locality without ID)."""
    loc = locality()
    loc.ClearField("locality")
    add_endpoint(loc)
    assert nack(cla(loc)) == ["endpoints[0].locality: field not present"]


def test_invalid_port_in_c_core_words():
    """C-core XdsEndpointTest.InvalidPort."""
    loc = locality()
    add_endpoint(loc, port=65537)
    assert nack(cla(loc)) == [f"{EP0}.address.socket_address.port_value: invalid port"]


def test_missing_address_in_c_core_words():
    """C-core XdsEndpointTest.MissingAddress."""
    loc = locality()
    loc.lb_endpoints.add().endpoint.SetInParent()
    assert nack(cla(loc)) == [f"{EP0}.address: field not present"]


def _with_additional(fill) -> endpoint_pb2.ClusterLoadAssignment:
    loc = locality()
    lbe = add_endpoint(loc)
    fill(lbe.endpoint.additional_addresses.add())
    return cla(loc)


def test_additional_address_without_address_in_c_core_words():
    """C-core XdsEndpointTest.AdditionalAddressesMissingAddress."""
    assert nack(_with_additional(lambda aa: None)) == [
        f"{EP0}.additional_addresses[0].address: field not present"
    ]


def test_additional_address_without_socket_address_in_c_core_words():
    """C-core XdsEndpointTest.AdditionalAddressesMissingSocketAddress."""
    assert nack(_with_additional(lambda aa: aa.address.SetInParent())) == [
        f"{EP0}.additional_addresses[0].address.socket_address: field not present"
    ]


@pytest.mark.parametrize(
    ("host", "port", "error"),
    [
        ("127.0.0.1", 65537, ".port_value: invalid port"),  # AdditionalAddressesInvalidPort
        (  # AdditionalAddressesInvalidAddress
            "not_an_ip_address",
            444,
            ": Failed to parse address:not_an_ip_address:444",
        ),
    ],
)
def test_additional_address_bad_port_or_address_in_c_core_words(host, port, error):
    """C-core XdsEndpointTest.AdditionalAddressesInvalidPort /
    AdditionalAddressesInvalidAddress."""

    def fill(aa):
        aa.address.socket_address.address = host
        aa.address.socket_address.port_value = port

    assert nack(_with_additional(fill)) == [
        f"{EP0}.additional_addresses[0].address.socket_address{error}"
    ]


def test_endpoint_weight_zero_in_c_core_words():
    """C-core XdsEndpointTest.EndpointWeightZero; grpc-go (zero endpoint weight)."""
    loc = locality()
    add_endpoint(loc).load_balancing_weight.value = 0
    assert nack(cla(loc)) == [
        "endpoints[0].lb_endpoints[0].load_balancing_weight: must be greater than 0"
    ]


def test_duplicate_address_names_the_second_endpoint():
    """C-core XdsEndpointTest.DuplicateAddresses (C-core prints the address
    as ipv4:127.0.0.1:443; the field is the same)."""
    first = locality()
    add_endpoint(first)
    second = locality("myregion2")
    add_endpoint(second)
    [error] = nack(cla(first, second))
    assert error.startswith("endpoints[1].lb_endpoints[0]: duplicate endpoint address ")
    assert "127.0.0.1:443" in error


def test_locality_weights_of_one_priority_above_uint32_in_c_core_words():
    """C-core XdsEndpointTest.LocalityWeightsWithinPriorityExceedUint32Max."""
    first = locality()
    add_endpoint(first)
    second = locality("myregion2", weight=0xFFFFFFFF)
    add_endpoint(second, "127.0.0.2")
    assert nack(cla(first, second)) == [
        "endpoints: sum of locality weights for priority 0 exceeds uint32 max"
    ]


def test_drop_overload_without_category_or_percentage_in_c_core_words():
    """C-core XdsEndpointTest.MissingDropCategoryName / MissingDropPercentage."""
    loc = locality()
    add_endpoint(loc)
    c = cla(loc)
    c.policy.drop_overloads.add().drop_percentage.numerator = 50
    assert nack(c) == ["policy.drop_overloads[0].category: empty drop category name"]
    c = cla(loc)
    c.policy.drop_overloads.add(category="lb_drop")
    assert nack(c) == ["policy.drop_overloads[0].drop_percentage: field not present"]


# ---------------------------------------------------------------- IPv6 zones (C-core, checked live)


LO = socket.if_nametoindex("lo")


@pytest.mark.parametrize("zone", [str(LO), "lo"])
def test_ipv6_address_with_a_zone_is_accepted_as_c_core(zone):
    """grpcio 1.85.3's C-core ACKs an endpoint ``fe80::1%<zone>`` (its
    grpc_parse_ipv6_hostport reads RFC 6874 zones: an interface index or
    name); pyxds NACKed the whole resource.  The zone is kept as the
    interface index, which grpcio's resolver reads back."""
    loc = locality()
    add_endpoint(loc, f"fe80:0::1%{zone}", 7)
    [[got]] = one_locality(loc).priorities
    assert got.endpoints[0].addresses == (f"[fe80::1%{LO}]:7",)


def test_same_scoped_address_by_name_and_index_is_a_duplicate():
    """C-core compares socket addresses, scope id included."""
    loc = locality()
    add_endpoint(loc, "fe80::1%lo", 7)
    add_endpoint(loc, f"fe80::1%{LO}", 7)
    [error] = nack(cla(loc))
    assert error == f'endpoints[0].lb_endpoints[1]: duplicate endpoint address "[fe80::1%{LO}]:7"'


@pytest.mark.parametrize("address", ["fe80::1%no-such-interface", "127.0.0.1%1", "fe80::1%"])
def test_bad_zone_fails_to_parse_as_c_core(address):
    """C-core: a zone that is neither a number nor an interface name (or an
    IPv4 address with a zone) does not parse."""
    loc = locality()
    add_endpoint(loc, address, 7)
    assert nack(cla(loc)) == [f"{EP0}.address.socket_address: Failed to parse address:{address}:7"]
