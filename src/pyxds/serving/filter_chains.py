"""Which filter chain a connection gets (gRFC A36 "FilterChainMatch"), as
C-core's ``FindFilterChainDataFor*`` walks the Listener's lookup map.

Order: destination IP (the most specific prefix containing the connection's
local address; the entry without a prefix only when no prefix matches),
then source type (the ANY list is used only when the SAME_IP_OR_LOOPBACK and
EXTERNAL lists are both empty; otherwise a loopback peer -- exactly
``127.0.0.1`` or ``::1``, as C-core's ``IsLoopbackIp`` and Envoy's
``isLoopbackAddress`` say, not all of 127.0.0.0/8 -- or one whose address
equals the local address uses SAME_IP_OR_LOOPBACK, any other EXTERNAL),
then source IP (most specific prefix, as for the destination), then source
port (exact, else 0).  No match: the ``default_filter_chain``,
else None (the connection must not be served).  Server names, transport
and application protocols were settled when the Listener was validated
(:mod:`pyxds.xds.resources.server_listener`).

:func:`port_security` answers the question grpcio forces on us: grpcio
gives a listening port one set of credentials, so every chain a
connection to that port may get must want the same TLS (or all none).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from pyxds.xds.resources.rbac import CidrRange
from pyxds.xds.resources.server_types import (
    SOURCE_ANY,
    SOURCE_EXTERNAL,
    SOURCE_SAME_IP_OR_LOOPBACK,
    DestinationIpEntry,
    DownstreamTlsConfig,
    FilterChain,
    SourceIpEntry,
    TcpListener,
)

__all__ = [
    "IpAddress",
    "PortSecurity",
    "destination_matters",
    "parse_ip",
    "port_security",
    "select_chain",
]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_LOOPBACK = frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})


def parse_ip(text: str) -> IpAddress | None:
    """An IP literal (brackets, a zone or an IPv4-mapped form allowed), else None."""
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _best(entries: Sequence[DestinationIpEntry | SourceIpEntry], ip: IpAddress) -> int:
    """Index of the most specific entry whose prefix contains ``ip`` (the
    entry without a prefix if none does); -1 when nothing matches."""
    best = -1
    best_len = -1
    for i, entry in enumerate(entries):
        prefix: CidrRange | None = entry.prefix
        if prefix is None:
            if best < 0:
                best = i
            continue
        plen = prefix.network.prefixlen
        if best_len >= plen:
            continue
        if prefix.contains(ip):
            best, best_len = i, plen
    return best


def select_chain(
    listener: TcpListener,
    local_ip: IpAddress | None,
    peer_ip: IpAddress | None,
    peer_port: int,
) -> FilterChain | None:
    """The chain of a connection from ``peer_ip:peer_port`` to ``local_ip``.
    A peer that is not an IP gets the default chain (as C-core does for a
    peer it cannot parse).  ``local_ip`` None (unknown) is only right when
    :func:`destination_matters` is False: only the entry without a
    destination prefix is looked at."""
    chain = None
    if peer_ip is not None:
        chain = _from_map(listener, local_ip, peer_ip, peer_port)
    return chain if chain is not None else listener.default_filter_chain


def _from_map(
    listener: TcpListener, local_ip: IpAddress | None, peer_ip: IpAddress, peer_port: int
) -> FilterChain | None:
    dests = listener.chain_map
    if local_ip is None:
        d = next((i for i, e in enumerate(dests) if e.prefix is None), -1)
    else:
        d = _best(dests, local_ip)
    if d < 0:
        return None
    kinds = dests[d].source_types
    if not kinds[SOURCE_SAME_IP_OR_LOOPBACK] and not kinds[SOURCE_EXTERNAL]:
        sources = kinds[SOURCE_ANY]
    elif peer_ip in _LOOPBACK or peer_ip == local_ip:
        sources = kinds[SOURCE_SAME_IP_OR_LOOPBACK]
    else:
        sources = kinds[SOURCE_EXTERNAL]
    s = _best(sources, peer_ip)
    if s < 0:
        return None
    ports = dict(sources[s].ports)
    index = ports.get(peer_port)
    if index is None:
        index = ports.get(0)
    return None if index is None else listener.filter_chains[index]


def destination_matters(listener: TcpListener) -> bool:
    """Whether the local address of a connection can change its chain
    (destination prefixes, or SAME_IP_OR_LOOPBACK / EXTERNAL chains)."""
    for dest in listener.chain_map:
        if dest.prefix is not None:
            return True
        kinds = dest.source_types
        if kinds[SOURCE_SAME_IP_OR_LOOPBACK] or kinds[SOURCE_EXTERNAL]:
            return True
    return False


@dataclass(frozen=True, slots=True)
class PortSecurity:
    """The transport a listening port needs: ``tls`` (None: plaintext, i.e.
    the fallback credentials), or ``refusal``, why the port cannot serve
    this Listener (the chains need different TLS settings)."""

    tls: DownstreamTlsConfig | None = None
    refusal: str | None = None


def reachable_chains(listener: TcpListener, local_ip: IpAddress | None) -> tuple[FilterChain, ...]:
    """The chains a connection to ``local_ip`` (None: any local address, a
    wildcard listening address) can get."""
    if local_ip is None or not listener.chain_map:
        return listener.all_chains()
    d = _best(listener.chain_map, local_ip)
    indexes: set[int] = set()
    if d >= 0:
        for kind in listener.chain_map[d].source_types:
            for source in kind:
                indexes.update(i for _, i in source.ports)
    chains = tuple(listener.filter_chains[i] for i in sorted(indexes))
    if listener.default_filter_chain is not None:
        chains += (listener.default_filter_chain,)
    return chains


def port_security(listener: TcpListener, local_ip: IpAddress | None) -> PortSecurity:
    """One TLS setting for every chain reachable on the port, or a refusal
    (see module docstring)."""
    chains = reachable_chains(listener, local_ip)
    settings = {chain.tls for chain in chains}
    if len(settings) > 1:
        described = sorted(_describe(chain) for chain in chains)
        return PortSecurity(
            refusal="filter chains on one listening port need different transport security "
            f"({'; '.join(described)}); grpcio gives a port one set of credentials, so this "
            "Listener is not served"
        )
    return PortSecurity(tls=next(iter(settings)) if settings else None)


def _describe(chain: FilterChain) -> str:
    name = f"chain {chain.name!r}" if chain.name else f"chain {chain.match}"
    tls = chain.tls
    if tls is None:
        return f"{name}: plaintext"
    mode = "mTLS" if tls.require_client_certificate else "TLS"
    return f"{name}: {mode} identity {tls.identity.instance_name!r}" + (
        f", CA {tls.ca.instance_name!r}" if tls.ca is not None else ""
    )
