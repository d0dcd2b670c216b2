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
connection to that port may get must want the same TLS (or all none).  The
default chain is one of them only when some connection can miss the map
(a catch-all chain takes every connection, and C-core then never uses the
default chain).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from pyxds._values import dataclass
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
    "unmapped",
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


def unmapped(ip: IpAddress) -> IpAddress:
    """An IPv4-mapped IPv6 address (``::ffff:10.0.0.1``, an IPv4 connection
    to a dual-stack socket) as its IPv4 address, any other unchanged: C-core
    matches the unmapped form (its peer and local URIs are unmapped,
    ``grpc_sockaddr_to_uri``), as grpc-go's lookup does."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


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
    wildcard listening address) can get.  The default chain counts only when
    some connection can find no chain in the map (:func:`_can_miss`)."""
    dests = listener.chain_map
    if local_ip is None:
        entries = dests
    else:
        d = _best(dests, local_ip)
        entries = dests[d : d + 1] if d >= 0 else ()
    indexes: set[int] = set()
    for dest in entries:
        for kind in dest.source_types:
            for source in kind:
                indexes.update(i for _, i in source.ports)
    chains = tuple(listener.filter_chains[i] for i in sorted(indexes))
    default = listener.default_filter_chain
    if default is not None and _can_miss(dests, local_ip):
        chains += (default,)
    return chains


def _can_miss(dests: Sequence[DestinationIpEntry], local_ip: IpAddress | None) -> bool:
    """Whether a TCP connection to ``local_ip`` (None: any local address) can
    find no chain in the map, and so get the default chain.  Sound, not
    exact: True whenever a miss is possible (the lookup takes the most
    specific prefix at each level and never falls back to a less specific
    one, so every entry it may land on must be total)."""
    if local_ip is None:
        return not _covers_every_ip(dests) or not all(_total(dest) for dest in dests)
    d = _best(dests, local_ip)
    return d < 0 or not _total(dests[d])


def _covers_every_ip(entries: Sequence[DestinationIpEntry | SourceIpEntry]) -> bool:
    families: set[int] = set()
    for entry in entries:
        if entry.prefix is None:
            return True
        if entry.prefix.network.prefixlen == 0:
            families.add(entry.prefix.network.version)
    return families == {4, 6}


def _total(dest: DestinationIpEntry) -> bool:
    """Every peer finds a chain under this destination entry."""
    kinds = dest.source_types
    lists: tuple[tuple[SourceIpEntry, ...], ...]
    if not kinds[SOURCE_SAME_IP_OR_LOOPBACK] and not kinds[SOURCE_EXTERNAL]:
        lists = (kinds[SOURCE_ANY],)
    else:
        lists = (kinds[SOURCE_SAME_IP_OR_LOOPBACK], kinds[SOURCE_EXTERNAL])
    return all(
        _covers_every_ip(sources) and all(0 in dict(s.ports) for s in sources) for sources in lists
    )


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
