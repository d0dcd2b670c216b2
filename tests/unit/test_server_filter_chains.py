"""Filter chain choice per connection (A36 "FilterChainMatch"), C-core's
lookup order: destination IP, source type, source IP, source port, else
the default chain; and the one-TLS-per-port rule pyxds adds for grpcio."""

from __future__ import annotations

import ipaddress

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


def test_chains_of_other_destination_addresses_do_not_count_for_a_specific_ip():
    listener = tcp(
        ib.filter_chain(name="mtls", tls=ib.downstream_tls(), prefix_ranges=["10.0.0.1/32"]),
        ib.filter_chain(name="plain", prefix_ranges=["10.0.0.2/32"]),
    )
    assert port_security(listener, ip("10.0.0.1")).tls is not None
    assert port_security(listener, ip("10.0.0.2")).tls is None
    assert port_security(listener, None).refusal is not None  # wildcard: both reachable
