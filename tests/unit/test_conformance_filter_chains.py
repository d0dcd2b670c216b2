"""Filter chain matching and server Listener validation conformance (gRFC
A36): cases taken from the other implementations' own suites, replayed
sans-IO through pyxds's Listener decoder
(:func:`pyxds.xds.resources.listener.decode_listener`) and chain lookup
(:func:`pyxds.serving.filter_chains.select_chain`).

Sources (each test names its case):

* grpc-go ``internal/xds/xdsclient/xdsresource/filter_chain_test.go``
  (TestUnmarshalListener_ServerSide_*),
* grpc-java ``xds/src/test/java/io/grpc/xds/
  FilterChainMatchingProtocolNegotiatorsTest.java`` (the successor of
  FilterChainMatchingHandlerTest),
* grpc-go ``internal/xds/server/listener_wrapper.go`` (addresses unmapped
  before the lookup) and C-core's ``grpc_sockaddr_to_uri`` (the same).

C-core (grpcio's own xDS server) decides where the sources disagree: its
lookup uses the ANY source-type list only when the SAME_IP_OR_LOOPBACK and
EXTERNAL lists are both empty, and keeps the destination entry of a chain
it leaves out (checked against grpcio in
tests/e2e/test_xds_server_differential.py).
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.serving.filter_chains import select_chain, unmapped
from pyxds.serving.gate import split_peer
from pyxds.serving.ports import ListeningAddress
from pyxds.xds.resources.listener import decode_listener

LOCAL = "10.1.2.3"  # grpc-java's destination
REMOTE = "10.4.2.3"  # grpc-java's source


def decode(*chains: Any, default: Any = None) -> tuple[Any, str | None]:
    lis = ib.server_listener("l", "0.0.0.0:80", chains, default)
    _, resource, error = decode_listener(lis.SerializeToString())
    return (None if resource is None else resource.tcp_listener), error


def tcp(*chains: Any, default: Any = None) -> Any:
    listener, error = decode(*chains, default=default)
    assert error is None, error
    return listener


def nack(*chains: Any, default: Any = None) -> str:
    listener, error = decode(*chains, default=default)
    assert listener is None and error, "expected a NACK"
    return error


def pick(listener: Any, local: str = LOCAL, peer: str = REMOTE, port: int = 15000) -> str | None:
    chain = select_chain(listener, ipaddress.ip_address(local), ipaddress.ip_address(peer), port)
    return None if chain is None else chain.name


def chain(name: str, **match: Any) -> Any:
    return ib.filter_chain(name=name, **match)


DEFAULT = chain("default")

# ---------------------------------------------------------------- grpc-go filter_chain_test.go


NEVER_MATCHING = {
    "destination_port": {"destination_port": 666},
    "server_names": {"server_names": ["example-server"]},
    "transport_protocol": {"transport_protocol": "tls"},
    "application_protocols": {"application_protocols": ["h2"]},
}


@pytest.mark.parametrize("match", NEVER_MATCHING.values(), ids=list(NEVER_MATCHING))
def test_a_lone_chain_that_can_never_match_is_accepted_and_serves_no_connection(match):
    """grpc-go TestUnmarshalListener_ServerSide_DroppedFilterChains: grpc-go
    NACKs a Listener whose only chain it drops; C-core checks the chains as
    sent ("must be set if filter_chains is unset" only without any chain),
    so it ACKs and no connection gets a chain (as pyxds;
    ``only-a-never-matching-chain-accepted`` in the NACK differential)."""
    listener = tcp(chain("test-filter-chain", **match))
    assert pick(listener) is None
    assert pick(tcp(chain("test-filter-chain", **match), default=DEFAULT)) == "default"


@pytest.mark.parametrize("field", ["prefix_ranges", "source_prefix_ranges"])
def test_a_cidr_that_is_not_an_address_is_nacked_naming_the_field(field):
    """grpc-go TestUnmarshalListener_ServerSide_FilterChains_FailureCases
    "bad dest address prefix" / "bad source address prefix"."""
    error = nack(chain("test-filter-chain", **{field: ["a.b.c.d"]}))
    assert f"filter_chains[0].filter_chain_match.{field}[0].address_prefix" in error
    assert "Failed to parse address:a.b.c.d:0" in error


@pytest.mark.parametrize("field", ["prefix_ranges", "source_prefix_ranges"])
def test_a_prefix_length_over_32_is_clamped_not_nacked(field):
    """grpc-go FailureCases "bad dest prefix length" / "bad source prefix
    length" NACK 10.1.1.0/50; C-core clamps the length to the address's bits
    (as pyxds; ``prefix-len-over-32-accepted`` in the NACK differential)."""
    listener = tcp(chain("clamped", **{field: ["10.1.1.0/50"]}), default=DEFAULT)
    local, peer = ("10.1.1.0", REMOTE) if field == "prefix_ranges" else (LOCAL, "10.1.1.0")
    assert pick(listener, local, peer) == "clamped"
    local, peer = ("10.1.1.1", REMOTE) if field == "prefix_ranges" else (LOCAL, "10.1.1.1")
    assert pick(listener, local, peer) == "default"


OVERLAPPING = {
    "matching destination prefixes with no other matchers": [
        chain("a", prefix_ranges=["192.168.1.1/16", "10.0.0.0/0"]),
        chain("b", prefix_ranges=["192.168.2.2/16"]),
    ],
    "matching source type": [
        chain("a"),
        chain("b", source_type="SAME_IP_OR_LOOPBACK"),
        chain("c", source_type="EXTERNAL"),
        chain("d", source_type="EXTERNAL"),
    ],
    "matching source prefixes": [
        chain("a", source_prefix_ranges=["192.168.1.1/16", "10.0.0.0/0"]),
        chain("b", source_prefix_ranges=["192.168.2.2/16"]),
    ],
    "matching source ports": [
        chain("a", source_ports=[1, 2, 3, 4, 5]),
        chain("b"),
        chain("c", source_ports=[5, 6, 7]),
    ],
}


@pytest.mark.parametrize("name", sorted(OVERLAPPING))
def test_overlapping_matching_rules_are_nacked(name):
    """grpc-go TestUnmarshalListener_ServerSide_OverlappingMatchingRules (in
    C-core's words)."""
    error = nack(*OVERLAPPING[name])
    assert "duplicate matching rules detected when adding filter chain" in error


def test_chains_whose_rules_only_touch_are_not_duplicates():
    """The other side of OverlappingMatchingRules: ANY next to the typed
    source types, a source port next to the chain without ports, and the
    same prefix with another length are distinct entries."""
    tcp(
        chain("a"),
        chain("b", source_type="SAME_IP_OR_LOOPBACK"),
        chain("c", source_type="EXTERNAL"),
        chain("d", source_ports=[5]),
        chain("e", prefix_ranges=["192.168.0.0/16"]),
        chain("f", prefix_ranges=["192.168.0.0/24"]),
    )


@pytest.mark.parametrize("match", NEVER_MATCHING.values(), ids=list(NEVER_MATCHING))
def test_a_chain_with_an_unsupported_field_is_never_chosen(match):
    """grpc-go TestUnmarshalListener_ServerSide_Success_UnsupportedMatchFields:
    the supported chain beside it serves every connection."""
    listener = tcp(chain("unsupported", **match), chain("supported"))
    assert pick(listener) == "supported"
    assert pick(listener, "127.0.0.1", "127.0.0.1", 1) == "supported"


def test_all_combinations_of_destination_and_source_fields():
    """grpc-go TestUnmarshalListener_ServerSide_Success_AllCombinations
    ("multiple destination prefixes", "multiple source types", "multiple
    source prefixes", "multiple source ports"), replayed as lookups."""
    listener = tcp(
        chain("dest-a", prefix_ranges=["192.168.1.1/16", "10.0.0.0/8"]),
        chain("dest-b", prefix_ranges=["192.168.2.2/24"], source_type="SAME_IP_OR_LOOPBACK"),
        chain(
            "dest-c",
            prefix_ranges=["192.168.2.2/24"],
            source_type="EXTERNAL",
            source_prefix_ranges=["1.1.1.0/24", "1.1.2.0/24"],
        ),
        chain(
            "dest-d",
            prefix_ranges=["192.168.2.2/24"],
            source_type="EXTERNAL",
            source_prefix_ranges=["1.1.1.0/24"],
            source_ports=[1, 2, 3],
        ),
    )
    assert pick(listener, "192.168.9.9", "8.8.8.8") == "dest-a"
    assert pick(listener, "10.9.9.9", "8.8.8.8") == "dest-a"
    assert pick(listener, "192.168.2.7", "127.0.0.1") == "dest-b"
    assert pick(listener, "192.168.2.7", "192.168.2.7") == "dest-b"  # same IP
    assert pick(listener, "192.168.2.7", "1.1.2.9", 2) == "dest-c"
    assert pick(listener, "192.168.2.7", "1.1.1.9", 2) == "dest-d"
    assert pick(listener, "192.168.2.7", "1.1.1.9", 4) == "dest-c"
    assert pick(listener, "192.168.2.7", "8.8.8.8") is None  # no external source prefix
    assert pick(listener, "172.16.0.1", "8.8.8.8") is None  # no destination prefix


def test_some_chains_with_unsupported_fields_keep_their_destination_entry():
    """grpc-go AllCombinations "some chains have unsupported fields", as
    C-core builds the map: the destination entry of a chain left out is
    kept, so the most specific prefix may have no chain (grpc-java
    filterChainMatch_unsupportedMatchers agrees; grpc-go drops the entry,
    docs/differences-from-c-core.md)."""
    listener = tcp(
        chain("unsupported", prefix_ranges=["10.1.0.0/16"], server_names=["server1"]),
        chain("supported", prefix_ranges=["10.0.0.0/8"]),
        default=DEFAULT,
    )
    assert pick(listener, "10.1.2.3") == "default"
    assert pick(listener, "10.2.2.3") == "supported"


def test_missing_and_unsupported_route_specifiers_are_nacked():
    """grpc-go TestUnmarshalListener_ServerSide_BadRouteUpdate
    "missing-route-specifier" / "unsupported-route-specifier"."""
    missing = hcm_pb2.HttpConnectionManager(http_filters=[b.router_filter()])
    error = nack(ib.filter_chain(missing), default=ib.filter_chain(missing))
    assert "route_config" in error or "rds" in error, error
    scoped = hcm_pb2.HttpConnectionManager(http_filters=[b.router_filter()])
    scoped.scoped_routes.name = "scoped"
    error = nack(ib.filter_chain(scoped))
    assert "filter_chains[0]" in error, error


def test_each_chain_keeps_its_own_route_configuration():
    """grpc-go TestUnmarshalListener_ServerSide_GoodRouteUpdate
    ("one_route_config_name", "inline_route_config", "two_route_config_names")."""
    listener = tcp(
        chain("rds-1", rds="route-1", prefix_ranges=["10.0.0.0/8"]),
        chain("rds-2", rds="route-2", prefix_ranges=["192.168.0.0/16"]),
        default=ib.filter_chain(name="inline"),
    )
    by_name = {c.name: c.hcm for c in listener.all_chains()}
    assert by_name["rds-1"].route_config_name == "route-1"
    assert by_name["rds-2"].route_config_name == "route-2"
    assert by_name["inline"].route_config_name is None
    assert by_name["inline"].route_config is not None


# ---------------------------------------------------------------- grpc-java


def test_only_a_default_chain_serves_every_connection():
    """grpc-java FilterChainMatchingProtocolNegotiatorsTest
    nofilterChainMatch_defaultSslContext / noFilterChainMatch_noDefaultSslContext."""
    assert pick(tcp(default=DEFAULT)) == "default"
    assert pick(tcp(chain("other", prefix_ranges=["192.168.0.0/16"]))) is None


@pytest.mark.parametrize(
    ("chains", "local", "expected"),
    [
        # destPortFails_returnDefaultFilterChain
        ([chain("port", destination_port=7000)], LOCAL, "default"),
        # destPrefixRangeMatch
        ([chain("match", prefix_ranges=["10.1.2.0/24"])], LOCAL, "match"),
        # destPrefixRangeMismatch_returnDefaultFilterChain
        ([chain("miss", prefix_ranges=["10.2.2.0/24"])], LOCAL, "default"),
        # dest0LengthPrefixRange: 10.2.2.0/0 holds every IPv4 address
        ([chain("zero", prefix_ranges=["10.2.2.0/0"])], LOCAL, "zero"),
        # destPrefixRange_moreSpecificWins
        (
            [
                chain("less", prefix_ranges=["10.1.2.0/24"]),
                chain("more", prefix_ranges=["10.1.2.2/31"]),
            ],
            LOCAL,
            "more",
        ),
        # destPrefixRange_emptyListLessSpecific
        (
            [chain("empty"), chain("five", prefix_ranges=["8.0.0.0/5"])],
            LOCAL,
            "five",
        ),
        # destPrefixRangeIpv6_moreSpecificWins
        (
            [
                chain("less", prefix_ranges=["fe80::/60"]),
                chain("more", prefix_ranges=["fe80:0:0:0:202::/80"]),
            ],
            "fe80::202:0:0:5",
            "more",
        ),
        # destPrefixRange_moreSpecificWith2Wins
        (
            [
                chain("with-2", prefix_ranges=["10.1.2.0/24", f"{LOCAL}/32"]),
                chain("less", prefix_ranges=["10.1.2.2/31"]),
            ],
            LOCAL,
            "with-2",
        ),
    ],
)
def test_destination_prefix_cases(chains, local, expected):
    """grpc-java FilterChainMatchingProtocolNegotiatorsTest destination cases."""
    peer = REMOTE if ":" not in local else "fe80::1"
    assert pick(tcp(*chains, default=DEFAULT), local, peer) == expected


def test_source_type_cases():
    """grpc-java sourceTypeMismatch_returnDefaultFilterChain and sourceTypeLocal."""
    listener = tcp(chain("local", source_type="SAME_IP_OR_LOOPBACK"), default=DEFAULT)
    assert pick(listener, LOCAL, REMOTE) == "default"
    assert pick(listener, LOCAL, LOCAL) == "local"
    assert pick(listener, LOCAL, "127.0.0.1") == "local"


def test_source_prefix_and_port_cases():
    """grpc-java sourcePrefixRange_moreSpecificWith2Wins,
    sourcePortMatch_exactMatchWinsOverEmptyList and
    sourcePrefixRange_2Matchers_expectException (pyxds, as C-core, refuses
    the duplicate when the Listener is decoded)."""
    listener = tcp(
        chain("with-2", source_prefix_ranges=["10.4.2.0/24", f"{REMOTE}/32"]),
        chain("less", source_prefix_ranges=["10.4.2.2/31"]),
        default=DEFAULT,
    )
    assert pick(listener) == "with-2"
    listener = tcp(
        chain("no-ports", source_prefix_ranges=["10.4.2.0/24", "10.4.2.2/31"]),
        chain("ports", source_prefix_ranges=["10.4.2.2/31"], source_ports=[7000, 15000]),
        default=DEFAULT,
    )
    assert pick(listener, port=15000) == "ports"
    assert pick(listener, port=15001) == "no-ports"
    nack(
        chain("a", source_prefix_ranges=["10.4.2.0/24", "192.168.10.2/32"]),
        chain("b", source_prefix_ranges=["10.4.2.0/24"]),
    )


FIVE_STEPS = [
    chain("1-destination-port", destination_port=7000, source_prefix_ranges=[f"{REMOTE}/32"]),
    chain("2-any", prefix_ranges=["10.1.2.0/30"], source_prefix_ranges=["10.4.0.0/16"]),
    chain(
        "3-local",
        prefix_ranges=["192.168.2.0/24", "10.1.2.0/30"],
        source_type="SAME_IP_OR_LOOPBACK",
    ),
    chain(
        "4-external",
        prefix_ranges=["10.1.0.0/16", "10.1.2.0/30"],
        source_type="EXTERNAL",
        source_prefix_ranges=["10.4.2.0/24"],
        source_ports=[16000, 9000],
    ),
    chain(
        "5-any-port",
        prefix_ranges=["10.1.0.0/16", "10.1.2.0/30"],
        source_prefix_ranges=["10.4.2.0/24", "192.168.2.0/24"],
        source_ports=[15000, 8000],
    ),
    chain("6-less-specific", prefix_ranges=["10.1.2.0/29"]),
]


def test_five_step_match_uses_c_core_source_type_rule():
    """grpc-java filterChain_5stepMatch expects chain 5 (an ANY chain) for an
    external peer although chain 4 is EXTERNAL; C-core uses the ANY list
    only when SAME_IP_OR_LOOPBACK and EXTERNAL are both empty, so the
    external peer looks only at chain 4, whose ports miss: the default
    chain (as pyxds; "ANY chains are unused for a loopback peer once an
    EXTERNAL chain exists" in the chain differential).  A peer on chain 4's
    port gets chain 4, a loopback peer chain 3."""
    listener = tcp(*FIVE_STEPS, default=chain("7-default"))
    assert pick(listener, port=15000) == "7-default"
    assert pick(listener, port=9000) == "4-external"
    assert pick(listener, peer="127.0.0.1") == "3-local"
    assert pick(listener, local="10.1.2.5") == "6-less-specific"


def test_unsupported_matchers_make_the_more_specific_entry_fall_to_the_default():
    """grpc-java filterChainMatch_unsupportedMatchers: the /16 chain with
    application protocols, server names and transport "tls" never matches,
    but its destination entry is the most specific, so the connection gets
    the default chain, not the /8 chain."""
    listener = tcp(
        chain(
            "unsupported",
            prefix_ranges=["10.1.0.0/16"],
            application_protocols=["managed-mtls", "h2"],
            server_names=["server1", "server2"],
            transport_protocol="tls",
        ),
        chain("eight", prefix_ranges=["10.0.0.0/8"]),
        default=chain("default-3"),
    )
    assert pick(listener) == "default-3"


# ---------------------------------------------------------------- C-core xds_end2end_test.cc

SERVER_PORT = 50051  # the backend's port: never a client's source port
CLIENT_PORT = 40000


def core_pick(*chains: Any, default: Any = None) -> str | None:
    """The chain a plaintext client on 127.0.0.1:CLIENT_PORT gets on a
    server at 127.0.0.1 (C-core's end2end set-up, IPv4)."""
    return pick(tcp(*chains, default=default), "127.0.0.1", "127.0.0.1", CLIENT_PORT)


def test_c_core_default_chain_cases():
    """C-core XdsServerFilterChainMatchTest
    DefaultFilterChainUsedWhenNoFilterChainMentioned and
    DefaultFilterChainUsedWhenOtherFilterChainsDontMatch."""
    assert core_pick(default=DEFAULT) == "default"
    assert core_pick(chain("never", destination_port=8080), default=DEFAULT) == "default"


def test_c_core_raw_buffer_chain_is_preferred():
    """C-core FilterChainsWithTransportProtocolRawBufferIsPreferred."""
    chains = (
        chain("raw", transport_protocol="raw_buffer"),
        chain("h2", application_protocols=["h2"]),
    )
    assert core_pick(*chains) == "raw"


def test_c_core_more_specific_destination_prefix_is_preferred():
    """C-core FilterChainsWithMoreSpecificDestinationPrefixRangesArePreferred:
    /4 and /16 (left out: server names), /8 and /24 (chosen), a /30 that
    does not hold the address and a chain without prefix (both left out)."""
    chains = (
        chain("4-16", prefix_ranges=["127.0.0.1/4", "127.0.0.1/16"], server_names=["server_name"]),
        chain("8-24", prefix_ranges=["127.0.0.1/8", "127.0.0.1/24"]),
        chain("30", prefix_ranges=["192.168.1.1/30"], server_names=["server_name"]),
        chain("none", server_names=["server_name"]),
    )
    assert core_pick(*chains) == "8-24"


def test_c_core_chains_that_mention_the_source_type_are_preferred():
    """C-core FilterChainsThatMentionSourceTypeArePreferred."""
    chains = (
        chain("local", source_type="SAME_IP_OR_LOOPBACK"),
        chain("external", source_type="EXTERNAL", source_ports=[SERVER_PORT]),
        chain("any", source_ports=[SERVER_PORT]),
    )
    assert core_pick(*chains) == "local"


def test_c_core_more_specific_source_prefix_is_preferred():
    """C-core FilterChainsWithMoreSpecificSourcePrefixRangesArePreferred."""
    chains = (
        chain(
            "4-16", source_prefix_ranges=["127.0.0.1/4", "127.0.0.1/16"], source_ports=[SERVER_PORT]
        ),
        chain("8-24", source_prefix_ranges=["127.0.0.1/8", "127.0.0.1/24"]),
        chain("30", source_prefix_ranges=["192.168.1.1/30"], source_ports=[SERVER_PORT]),
        chain("none", source_ports=[SERVER_PORT]),
    )
    assert core_pick(*chains) == "8-24"


def test_c_core_more_specific_source_port_is_preferred():
    """C-core FilterChainsWithMoreSpecificSourcePortArePreferred: a chain
    naming every port 1..65535 beats the chain without ports.  (C-core's
    test gives the chain without ports TLS; pyxds would refuse that
    Listener on one grpcio port, docs/xds-server.md, so the choice alone
    is checked.)"""
    listener = tcp(chain("every-port", source_ports=range(1, 65536)), chain("no-ports"))
    assert pick(listener, "127.0.0.1", "127.0.0.1", CLIENT_PORT) == "every-port"


# ---------------------------------------------------------------- IPv4-mapped IPv6


def test_ipv4_mapped_addresses_match_as_ipv4():
    """grpc-go listener_wrapper.go unmaps both addresses before the lookup;
    C-core's peer and local URIs are unmapped (grpc_sockaddr_to_uri).  A
    dual-stack listener's IPv4 connection matches IPv4 prefixes, loopback
    and same-IP rules whatever form its addresses take."""
    assert unmapped(ipaddress.ip_address("::ffff:10.1.2.3")) == ipaddress.ip_address(LOCAL)
    assert unmapped(ipaddress.ip_address("::1")) == ipaddress.ip_address("::1")
    assert split_peer("ipv6:%5B::ffff:127.0.0.1%5D:5000").ip == ipaddress.ip_address("127.0.0.1")
    assert split_peer("ipv6:[::ffff:10.4.2.3]:5000").ip == ipaddress.ip_address(REMOTE)
    mapped = ListeningAddress(ipaddress.ip_address("::ffff:10.1.2.3"), 80)
    assert mapped.local_ip == ipaddress.ip_address(LOCAL)
    assert mapped.text == f"[{mapped.ip}]:80"  # the Listener's name keeps the IPv6 form
