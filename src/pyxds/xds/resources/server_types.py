"""Validated server-side Listener values (gRFC A36, A29 server side, A41).

A Listener without ``api_listener`` is a server ("TCP") listener: its
:class:`TcpListener` rides in ``Listener.tcp_listener``.  Every class is a
frozen dataclass with structural equality, so an unchanged Listener is a
no-op all the way down (the XdsClient drops identical updates).

The filter chains are kept twice: as parsed (``filter_chains``, in order,
for dumps and for the set of TLS settings a port may need) and as
C-core's lookup map (``chain_map``): destination IP entries, each with
three source-type lists (ANY, SAME_IP_OR_LOOPBACK, EXTERNAL) of source IP
entries, each mapping source ports (0 = any) to the index of a chain in
``filter_chains``.  :mod:`pyxds.serving.filter_chains` walks it per
connection.
"""

from __future__ import annotations

from pyxds._values import dataclass
from pyxds.security.tls_config import ProviderRef
from pyxds.xds.resources.rbac import CidrRange, RbacConfig
from pyxds.xds.resources.types import RouteConfiguration

__all__ = [
    "DestinationIpEntry",
    "DownstreamTlsConfig",
    "FilterChain",
    "FilterChainMatch",
    "ServerHcm",
    "ServerHttpFilter",
    "SourceIpEntry",
    "TcpListener",
    "SOURCE_ANY",
    "SOURCE_SAME_IP_OR_LOOPBACK",
    "SOURCE_EXTERNAL",
]

SOURCE_ANY = 0
SOURCE_SAME_IP_OR_LOOPBACK = 1
SOURCE_EXTERNAL = 2


@dataclass(frozen=True, slots=True)
class FilterChainMatch:
    """A ``FilterChainMatch`` as sent (CIDRs masked and clamped)."""

    destination_port: int = 0
    prefix_ranges: tuple[CidrRange, ...] = ()
    source_type: int = SOURCE_ANY
    source_prefix_ranges: tuple[CidrRange, ...] = ()
    source_ports: tuple[int, ...] = ()
    server_names: tuple[str, ...] = ()
    transport_protocol: str = ""
    application_protocols: tuple[str, ...] = ()

    def __str__(self) -> str:
        """C-core's text of a match (its duplicate-chain error names it)."""
        parts = []
        if self.destination_port:
            parts.append(f"destination_port={self.destination_port}")
        if self.prefix_ranges:
            parts.append("prefix_ranges={" + ", ".join(map(_cidr_text, self.prefix_ranges)) + "}")
        if self.source_type == SOURCE_SAME_IP_OR_LOOPBACK:
            parts.append("source_type=SAME_IP_OR_LOOPBACK")
        elif self.source_type == SOURCE_EXTERNAL:
            parts.append("source_type=EXTERNAL")
        if self.source_prefix_ranges:
            parts.append(
                "source_prefix_ranges={"
                + ", ".join(map(_cidr_text, self.source_prefix_ranges))
                + "}"
            )
        if self.source_ports:
            parts.append("source_ports={" + ", ".join(map(str, self.source_ports)) + "}")
        if self.server_names:
            parts.append("server_names={" + ", ".join(self.server_names) + "}")
        if self.transport_protocol:
            parts.append(f"transport_protocol={self.transport_protocol}")
        if self.application_protocols:
            parts.append("application_protocols={" + ", ".join(self.application_protocols) + "}")
        return "{" + ", ".join(parts) + "}"


def _cidr_text(cidr: CidrRange) -> str:
    address = cidr.network.network_address
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"{{address_prefix={host}:0, prefix_len={cidr.network.prefixlen}}}"


@dataclass(frozen=True, slots=True)
class ServerHttpFilter:
    """One HTTP filter of a server HttpConnectionManager: the router (config
    None) or an RBAC filter with its validated config (A41); ``disabled``:
    it applies only where a route override enables it
    (:func:`pyxds.xds.resources._common.effective_override`)."""

    name: str
    type_url: str
    rbac: RbacConfig | None = None
    disabled: bool = False


@dataclass(frozen=True, slots=True)
class ServerHcm:
    """A server chain's HttpConnectionManager: exactly one of
    ``route_config_name`` (RDS) and ``route_config`` (inline)."""

    route_config_name: str | None
    route_config: RouteConfiguration | None
    http_filters: tuple[ServerHttpFilter, ...]


@dataclass(frozen=True, slots=True)
class DownstreamTlsConfig:
    """A chain's validated ``DownstreamTlsContext`` (A29 server side):
    identity provider (always), CA provider (None: client certificates are
    not verified) and ``require_client_certificate``."""

    identity: ProviderRef
    ca: ProviderRef | None
    require_client_certificate: bool


@dataclass(frozen=True, slots=True)
class FilterChain:
    """One filter chain: its match, HttpConnectionManager and TLS (None: plaintext)."""

    name: str
    match: FilterChainMatch
    hcm: ServerHcm
    tls: DownstreamTlsConfig | None


@dataclass(frozen=True, slots=True)
class SourceIpEntry:
    """Source prefix (None: any) -> ((source port or 0, chain index), ...)."""

    prefix: CidrRange | None
    ports: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class DestinationIpEntry:
    """Destination prefix (None: any) -> source entries per source type
    (indexed by ``SOURCE_ANY``, ``SOURCE_SAME_IP_OR_LOOPBACK``, ``SOURCE_EXTERNAL``)."""

    prefix: CidrRange | None
    source_types: tuple[
        tuple[SourceIpEntry, ...], tuple[SourceIpEntry, ...], tuple[SourceIpEntry, ...]
    ]


@dataclass(frozen=True, slots=True)
class TcpListener:
    """A validated server Listener (A36).

    ``address`` is the Listener's socket address as ``ip:port`` (IPv6
    bracketed), compared as text with the listening address, as C-core does,
    except that port 0 matches any port of that IP (grpcio 1.85 serves it;
    :mod:`pyxds.serving.listener_watch`).
    """

    address: str
    filter_chains: tuple[FilterChain, ...]
    chain_map: tuple[DestinationIpEntry, ...]
    default_filter_chain: FilterChain | None

    def all_chains(self) -> tuple[FilterChain, ...]:
        """Every chain a connection can get (the map's and the default)."""
        used = sorted(
            {
                index
                for dest in self.chain_map
                for kind in dest.source_types
                for source in kind
                for _, index in source.ports
            }
        )
        chains = tuple(self.filter_chains[i] for i in used)
        if self.default_filter_chain is not None:
            chains += (self.default_filter_chain,)
        return chains
