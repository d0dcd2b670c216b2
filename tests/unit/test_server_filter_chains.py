"""Filter chain choice per connection (A36 "FilterChainMatch"), C-core's
lookup order: destination IP, source type, source IP, source port, else
the default chain; and the one-TLS-per-port rule pyxds adds for grpcio."""

from __future__ import annotations

import ipaddress

import pytest

from pyxds.server import inbound as ib
from pyxds.serving.filter_chains import (
    destination_matters,
    port_security,
    select_chain,
)
from pyxds.xds.resources.listener import decode_listener


def tcp(*chains, default=None):
    lis = ib.server_listener("l", "0.0.0.0:80", chains, default)
    _, resource, error = decode_listener(lis.SerializeToString())
    assert error is None, error
    return resource.tcp_listener


def ip(text):
    return ipaddress.ip_address(text)


def pick(listener, local, peer, port=5000):
    chain = select_chain(listener, ip(local) if local else None, ip(peer) if peer else None, port)
    return chain.name if chain is not None else None


def test_most_specific_destination_prefix_wins_and_catch_all_is_the_fallback():
    listener = tcp(
        ib.filter_chain(name="any"),
        ib.filter_chain(name="ten", prefix_ranges=["10.0.0.0/8"]),
        ib.filter_chain(name="ten-one", prefix_ranges=["10.1.0.0/16"]),
    )
    assert pick(listener, "10.1.2.3", "1.2.3.4") == "ten-one"
    assert pick(listener, "10.2.2.3", "1.2.3.4") == "ten"
    assert pick(listener, "192.168.0.1", "1.2.3.4") == "any"
    assert destination_matters(listener)


def test_no_destination_match_and_no_default_means_no_chain():
    listener = tcp(ib.filter_chain(name="ten", prefix_ranges=["10.0.0.0/8"]))
    assert pick(listener, "192.168.0.1", "1.2.3.4") is None
    listener = tcp(
        ib.filter_chain(name="ten", prefix_ranges=["10.0.0.0/8"]),
        default=ib.filter_chain(name="default"),
    )
    assert pick(listener, "192.168.0.1", "1.2.3.4") == "default"


def test_ipv4_prefix_does_not_match_ipv6_addresses():
    listener = tcp(ib.filter_chain(name="v4-all", prefix_ranges=["0.0.0.0/0"]))
    assert pick(listener, "::1", "::1") is None
    assert pick(listener, "127.0.0.1", "127.0.0.1") == "v4-all"


def test_source_type_loopback_or_same_ip_versus_external():
    listener = tcp(
        ib.filter_chain(name="local", source_type="SAME_IP_OR_LOOPBACK"),
        ib.filter_chain(name="external", source_type="EXTERNAL"),
    )
    assert pick(listener, "10.0.0.1", "127.0.0.1") == "local"
    assert pick(listener, "10.0.0.1", "10.0.0.1") == "local"
    assert pick(listener, "10.0.0.1", "10.0.0.2") == "external"


def test_any_source_type_is_ignored_once_a_specific_type_exists():
    """C-core uses the ANY list only when SAME_IP_OR_LOOPBACK and EXTERNAL
    are both empty: an external peer gets no chain here."""
    listener = tcp(
        ib.filter_chain(name="any"),
        ib.filter_chain(name="local", source_type="SAME_IP_OR_LOOPBACK"),
    )
    assert pick(listener, "10.0.0.1", "127.0.0.1") == "local"
    assert pick(listener, "10.0.0.1", "10.9.9.9") is None


def test_most_specific_source_prefix_then_exact_port_then_any_port():
    listener = tcp(
        ib.filter_chain(name="all"),
        ib.filter_chain(name="net", source_prefix_ranges=["10.0.0.0/8"]),
        ib.filter_chain(name="net-port", source_prefix_ranges=["10.0.0.0/8"], source_ports=[7]),
        ib.filter_chain(name="host", source_prefix_ranges=["10.0.0.5/32"], source_ports=[9]),
    )
    assert pick(listener, "1.1.1.1", "10.0.0.4", 7) == "net-port"
    assert pick(listener, "1.1.1.1", "10.0.0.4", 8) == "net"
    assert pick(listener, "1.1.1.1", "10.0.0.5", 9) == "host"
    # The most specific source prefix wins even when its ports do not match.
    assert pick(listener, "1.1.1.1", "10.0.0.5", 8) is None
    assert pick(listener, "1.1.1.1", "11.0.0.5", 8) == "all"


def test_a_peer_that_is_not_an_ip_gets_the_default_chain():
    listener = tcp(ib.filter_chain(name="all"), default=ib.filter_chain(name="default"))
    assert pick(listener, "10.0.0.1", None) == "default"


def test_unknown_local_address_is_enough_when_the_destination_does_not_matter():
    listener = tcp(ib.filter_chain(name="all", source_ports=[5000]))
    assert not destination_matters(listener)
    assert pick(listener, None, "10.0.0.4", 5000) == "all"


def test_one_tls_setting_for_every_chain_of_a_port():
    same = tcp(
        ib.filter_chain(name="a", tls=ib.downstream_tls(), source_ports=[1]),
        ib.filter_chain(name="b", tls=ib.downstream_tls(), source_ports=[2]),
    )
    security = port_security(same, None)
    assert security.refusal is None and security.tls.require_client_certificate
    mixed = tcp(
        ib.filter_chain(name="mtls", tls=ib.downstream_tls(), source_prefix_ranges=["10.0.0.0/8"]),
        ib.filter_chain(name="plain"),
    )
    refusal = port_security(mixed, None).refusal
    assert "chain 'mtls': mTLS identity 'default', CA 'default'" in refusal
    assert "chain 'plain': plaintext" in refusal


def test_a_default_chain_no_connection_can_reach_does_not_count_for_the_port():
    """A catch-all chain (no prefix, ANY, no source prefix, no port) takes
    every connection: C-core never uses the default chain then, so its TLS
    does not decide the port's (it was refused: "need different transport
    security")."""
    catch_all = tcp(
        ib.filter_chain(name="mesh", tls=ib.downstream_tls()),
        default=ib.filter_chain(name="plain-default"),
    )
    for local in (None, ip("127.0.0.1"), ip("::1")):
        security = port_security(catch_all, local)
        assert security.refusal is None and security.tls is not None, local
    # Every peer family covered by /0 prefixes, every source type covered.
    covered = tcp(
        ib.filter_chain(name="v4", tls=ib.downstream_tls(), source_prefix_ranges=["0.0.0.0/0"]),
        ib.filter_chain(name="v6", tls=ib.downstream_tls(), source_prefix_ranges=["::/0"]),
        default=ib.filter_chain(name="plain-default"),
    )
    assert port_security(covered, None).refusal is None


@pytest.mark.parametrize(
    "chain",
    [
        {"source_ports": [5000]},  # other ports miss
        {"source_prefix_ranges": ["10.0.0.0/8"]},  # other peers miss
        {"source_prefix_ranges": ["0.0.0.0/0"]},  # IPv6 peers miss
        {"source_type": "EXTERNAL"},  # loopback peers miss
        {"prefix_ranges": ["10.0.0.0/8"]},  # other local addresses miss
    ],
)
def test_a_default_chain_some_connection_reaches_counts_for_the_port(chain):
    listener = tcp(
        ib.filter_chain(name="mesh", tls=ib.downstream_tls(), **chain),
        default=ib.filter_chain(name="plain-default"),
    )
    assert "chain 'plain-default': plaintext" in port_security(listener, None).refusal


def test_a_catch_all_chain_shadowed_by_a_port_specific_prefix_still_lets_connections_miss():
    """The most specific source prefix wins before the port is looked at
    (C-core does not fall back to a less specific prefix), so a /0 entry
    that lists ports makes the catch-all's port 0 unreachable for IPv4."""
    listener = tcp(
        ib.filter_chain(name="all", tls=ib.downstream_tls()),
        ib.filter_chain(
            name="v4-5000",
            tls=ib.downstream_tls(),
            source_prefix_ranges=["0.0.0.0/0"],
            source_ports=[5000],
        ),
        default=ib.filter_chain(name="plain-default"),
    )
    assert pick(listener, "127.0.0.1", "10.1.1.1", 4000) == "plain-default"
    assert port_security(listener, None).refusal is not None


def test_chains_of_other_destination_addresses_do_not_count_for_a_specific_ip():
    listener = tcp(
        ib.filter_chain(name="mtls", tls=ib.downstream_tls(), prefix_ranges=["10.0.0.1/32"]),
        ib.filter_chain(name="plain", prefix_ranges=["10.0.0.2/32"]),
    )
    assert port_security(listener, ip("10.0.0.1")).tls is not None
    assert port_security(listener, ip("10.0.0.2")).tls is None
    assert port_security(listener, None).refusal is not None  # wildcard: both reachable


def test_loopback_is_exactly_127_0_0_1_or_1_as_c_core_and_envoy_say():
    """C-core's ``IsLoopbackIp`` (and Envoy's ``isLoopbackAddress``) take only
    the canonical loopback addresses: a peer 127.0.0.2 talking to 10.0.0.1 is
    EXTERNAL, not SAME_IP_OR_LOOPBACK."""
    listener = tcp(
        ib.filter_chain(name="local", source_type="SAME_IP_OR_LOOPBACK"),
        ib.filter_chain(name="external", source_type="EXTERNAL"),
    )
    assert pick(listener, "10.0.0.1", "127.0.0.1") == "local"
    assert pick(listener, "10.0.0.1", "127.0.0.2") == "external"
    assert pick(listener, "127.0.0.2", "127.0.0.2") == "local"  # the same IP
    assert pick(listener, "2001:db8::1", "::1") == "local"
    assert pick(listener, "2001:db8::1", "::ffff:127.0.0.1") == "external"


# grpc-go internal/xds/server/filter_chain_manager_test.go, TestLookup_Successes
# and TestLookup_Failures, replayed with C-core's lookup (the cases where
# grpc-go ignores destination prefixes on a specific listening IP are left
# out: C-core always matches them).


def _go_lookup_listener():
    return tcp(
        ib.filter_chain(name="unspecified-dest-and-source-prefix"),
        ib.filter_chain(
            name="wildcard-prefixes-v4",
            prefix_ranges=["0.0.0.0/0"],
            source_prefix_ranges=["0.0.0.0/0"],
        ),
        ib.filter_chain(name="wildcard-source-prefix-v6", source_prefix_ranges=["::/0"]),
        ib.filter_chain(
            name="specific-destination-prefix-unspecified-source-type",
            prefix_ranges=["192.168.1.1/16"],
        ),
        ib.filter_chain(
            name="specific-destination-prefix-specific-source-type",
            prefix_ranges=["192.168.1.1/24"],
            source_type="EXTERNAL",
        ),
        ib.filter_chain(
            name="specific-destination-prefix-specific-source-type-specific-source-prefix",
            prefix_ranges=["192.168.1.1/24"],
            source_prefix_ranges=["192.168.92.1/24"],
            source_type="EXTERNAL",
        ),
        ib.filter_chain(
            name="specific-destination-prefix-specific-source-type-specific-source-prefix-"
            "specific-source-port",
            prefix_ranges=["192.168.1.1/24"],
            source_prefix_ranges=["192.168.92.1/24"],
            source_type="EXTERNAL",
            source_ports=[80],
        ),
    )


@pytest.mark.parametrize(
    ("local", "peer", "port", "expected"),
    [
        ("2001:68::db8", "10.1.1.1", 1, "unspecified-dest-and-source-prefix"),
        ("10.1.1.1", "10.1.1.1", 1, "wildcard-prefixes-v4"),
        ("2001:68::1", "2001:68::2", 1, "wildcard-source-prefix-v6"),
        (
            "192.168.100.1",
            "192.168.100.1",
            80,
            "specific-destination-prefix-unspecified-source-type",
        ),
        ("192.168.1.1", "10.1.1.1", 80, "specific-destination-prefix-specific-source-type"),
        (
            "192.168.1.1",
            "192.168.92.100",
            70,
            "specific-destination-prefix-specific-source-type-specific-source-prefix",
        ),
        (
            "192.168.1.1",
            "192.168.92.100",
            80,
            "specific-destination-prefix-specific-source-type-specific-source-prefix-"
            "specific-source-port",
        ),
    ],
)
def test_grpc_go_lookup_successes(local, peer, port, expected):
    assert pick(_go_lookup_listener(), local, peer, port) == expected


def test_grpc_go_lookup_failures_and_the_default_chain():
    no_dest = tcp(ib.filter_chain(name="x", prefix_ranges=["192.168.1.1/16"]))
    assert pick(no_dest, "10.1.1.1", "10.1.1.1") is None
    with_default = tcp(
        ib.filter_chain(name="x", prefix_ranges=["192.168.1.1/16"]),
        default=ib.filter_chain(name="default"),
    )
    assert pick(with_default, "10.1.1.1", "10.1.1.1") == "default"
    no_type = tcp(
        ib.filter_chain(
            name="x", prefix_ranges=["192.168.1.1/16"], source_type="SAME_IP_OR_LOOPBACK"
        )
    )
    assert pick(no_type, "192.168.100.1", "192.168.100.2") is None
    no_source = tcp(
        ib.filter_chain(
            name="x", source_prefix_ranges=["192.168.1.1/24"], source_type="SAME_IP_OR_LOOPBACK"
        )
    )
    assert pick(no_source, "192.168.100.1", "192.168.100.1") is None
    no_port = tcp(ib.filter_chain(name="x", source_ports=[1, 2, 3]))
    assert pick(no_port, "192.168.100.1", "192.168.100.1", 80) is None


def test_c_core_source_port_chain_beats_the_chain_without_ports():
    """C-core xds_enabled_server_end2end_test
    FilterChainsWithMoreSpecificSourcePortArePreferred: every port but 0
    listed in one chain; the other chain (no ports) is never used."""
    listener = tcp(
        ib.filter_chain(name="ports", source_ports=range(1, 65536)),
        ib.filter_chain(name="no-ports"),
    )
    assert pick(listener, "127.0.0.1", "127.0.0.1", 40000) == "ports"
    assert pick(listener, "127.0.0.1", "127.0.0.1", 1) == "ports"
