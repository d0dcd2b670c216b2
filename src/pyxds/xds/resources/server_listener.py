"""Server ("TCP") Listener validation (gRFC A36, A29 server side, A41), as
grpcio 1.85's C-core validates it (``LdsResourceParseServer``).

Rules (each violation NACKs the Listener, the field named in C-core's words):

* ``address.socket_address`` must be present, with protocol TCP and a port
  below 65536; the address is kept as ``ip:port`` text (IPv6 bracketed) and
  compared with the listening address by the server, not here (a Listener
  for another address is ACKed and not served, A36).
* ``use_original_dst: true``: "field not supported".
* ``listener_filters`` are not read and do not NACK (C-core ACKs them
  although A36 says NACK; docs/differences-from-c-core.md).
* Each filter chain (and ``default_filter_chain``): CIDRs of its
  ``filter_chain_match`` must parse, its ``source_type`` must be one of the
  three the enum names ("invalid value", as grpcio 1.85's C-core says it,
  also for the default chain, whose match is otherwise unused; grpc-go:
  "unsupported source type"); ``filters`` must hold exactly one
  filter, an HttpConnectionManager (validated by
  :func:`pyxds.xds.resources.listener.parse_server_hcm`); a
  ``transport_socket`` must be named ``envoy.transport_sockets.tls`` (A29;
  grpc-go and grpc-java check it, C-core 1.85 does not) and be a valid
  ``DownstreamTlsContext`` (:mod:`pyxds.security.downstream_tls`).
* Without ``filter_chains``, ``default_filter_chain`` must be set.
* The chains are put in C-core's lookup map: chains with a
  ``destination_port``, ``server_names``, ``application_protocols`` or a
  ``transport_protocol`` other than ``raw_buffer`` can never match and are
  left out (before duplicates are looked for, as C-core); once a chain of a
  destination entry names ``raw_buffer`` the entry's chains without it are
  dropped; two chains claiming the same (destination prefix, source type,
  source prefix, source port) after normalisation (the Cartesian product of
  their fields, CIDRs masked) are "duplicate matching rules detected when
  adding filter chain: {...}".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyxds.security.downstream_tls import parse_downstream_transport_socket
from pyxds.xds.resources._common import (
    TYPED_STRUCT_TYPES,
    Errors,
    type_name,
    typed_struct_type,
    unpack,
)
from pyxds.xds.resources.rbac import CidrRange, parse_cidr
from pyxds.xds.resources.server_types import (
    DestinationIpEntry,
    FilterChain,
    FilterChainMatch,
    SourceIpEntry,
    TcpListener,
)

__all__ = ["parse_tcp_listener", "join_host_port"]

HCM_TYPE = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
TLS_TRANSPORT_SOCKET = "envoy.transport_sockets.tls"
_ONE_FILTER = (
    "must have exactly one filter (HttpConnectionManager -- no other filter is supported "
    "at the moment)"
)


def join_host_port(host: str, port: int) -> str:
    """``host:port`` with an IPv6 host bracketed (C-core's JoinHostPort)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_tcp_listener(
    lis: Any, errs: Errors, providers: Mapping[str, Any] | None = None
) -> TcpListener | None:
    """Validate a Listener without ``api_listener`` (see module docstring)."""
    before = len(errs)
    address = _address(lis, errs)
    if lis.HasField("use_original_dst") and lis.use_original_dst.value:
        errs.add("use_original_dst", "field not supported")
    chains: list[FilterChain] = []
    for i, fc in enumerate(lis.filter_chains):
        chain = _filter_chain(fc, f"filter_chains[{i}]", providers, errs)
        if chain is not None:
            chains.append(chain)
    chain_map = _build_map(chains, errs)
    default = None
    if lis.HasField("default_filter_chain"):
        default = _filter_chain(lis.default_filter_chain, "default_filter_chain", providers, errs)
    elif not len(lis.filter_chains):
        errs.add("default_filter_chain", "must be set if filter_chains is unset")
    if len(errs) != before or address is None:
        return None
    return TcpListener(address, tuple(chains), chain_map, default)


def _address(lis: Any, errs: Errors) -> str | None:
    if not lis.HasField("address"):
        errs.add("address", "field not present")
        return None
    if not lis.address.HasField("socket_address"):
        errs.add("address.socket_address", "field not present")
        return None
    sa = lis.address.socket_address
    if sa.protocol != 0:  # TCP
        errs.add("address.socket_address.protocol", "value must be TCP")
    if sa.port_value > 65535:
        errs.add("address.socket_address.port_value", "invalid port")
        return None
    return join_host_port(sa.address, sa.port_value)


def _filter_chain(
    fc: Any, path: str, providers: Mapping[str, Any] | None, errs: Errors
) -> FilterChain | None:
    from pyxds.xds.resources.listener import parse_server_hcm

    before = len(errs)
    match = FilterChainMatch()
    if fc.HasField("filter_chain_match"):
        match = _match(fc.filter_chain_match, f"{path}.filter_chain_match", errs)
    hcm = None
    fp = f"{path}.filters"
    if len(fc.filters) != 1:
        errs.add(fp, _ONE_FILTER)
    for i, f in enumerate(fc.filters):
        p = f"{fp}[{i}].typed_config"
        if f.WhichOneof("config_type") != "typed_config":
            errs.add(p, "field not present")
            continue
        any_msg = f.typed_config
        tname = type_name(any_msg.type_url)
        if tname in TYPED_STRUCT_TYPES:  # named inside; JSON, not the HCM's bytes
            p = f"{p}.value[{tname}]"
            inner = typed_struct_type(any_msg.value)
            if inner is None:
                errs.add(p, "could not parse")
                continue
            errs.add(
                f"{p}.value[{inner}]",
                "could not parse HttpConnectionManager config"
                if inner == HCM_TYPE
                else "unsupported filter type",
            )
            continue
        if tname != HCM_TYPE:
            errs.add(f"{p}.value[{tname}]", "unsupported filter type")
            continue
        from envoy.extensions.filters.network.http_connection_manager.v3 import (
            http_connection_manager_pb2,
        )

        p = f"{p}.value[{HCM_TYPE}]"
        msg = unpack(any_msg, http_connection_manager_pb2.HttpConnectionManager, p, errs)
        if msg is not None:
            hcm = parse_server_hcm(msg, errs, p)
    tls = None
    if fc.HasField("transport_socket"):
        ts = fc.transport_socket
        if ts.name != TLS_TRANSPORT_SOCKET:
            errs.add(
                f"{path}.transport_socket.name",
                f"unsupported transport socket name {ts.name!r} (gRFC A29: only "
                f"{TLS_TRANSPORT_SOCKET})",
            )
        tls = parse_downstream_transport_socket(ts, f"{path}.transport_socket", providers, errs)
    if len(errs) != before or hcm is None:
        return None
    return FilterChain(fc.name, match, hcm, tls)


def _match(m: Any, path: str, errs: Errors) -> FilterChainMatch:
    def cidrs(field: str) -> tuple[CidrRange, ...]:
        out = []
        for i, c in enumerate(getattr(m, field)):
            cidr = parse_cidr(c, f"{path}.{field}[{i}]", errs)
            if cidr is not None:
                out.append(cidr)
        return tuple(out)

    source_type = int(m.source_type)
    if not 0 <= source_type < 3:
        errs.add(f"{path}.source_type", "invalid value")
    return FilterChainMatch(
        destination_port=m.destination_port.value if m.HasField("destination_port") else 0,
        prefix_ranges=cidrs("prefix_ranges"),
        source_type=source_type,
        source_prefix_ranges=cidrs("source_prefix_ranges"),
        source_ports=tuple(m.source_ports),
        server_names=tuple(m.server_names),
        transport_protocol=m.transport_protocol,
        application_protocols=tuple(m.application_protocols),
    )


# ----------------------------------------------------------------- the lookup map


class _Dest:
    __slots__ = ("prefix", "raw_buffer", "types")

    def __init__(self, prefix: CidrRange | None) -> None:
        self.prefix = prefix
        self.raw_buffer = False
        self.types: list[dict[str, tuple[CidrRange | None, dict[int, int]]]] = [{}, {}, {}]


def _build_map(chains: list[FilterChain], errs: Errors) -> tuple[DestinationIpEntry, ...]:
    """C-core's BuildFilterChainMap over the valid chains (module docstring)."""
    dests: dict[str, _Dest] = {}
    for index, chain in enumerate(chains):
        m = chain.match
        if m.destination_port:
            continue
        for dprefix in m.prefix_ranges or (None,):
            key = "" if dprefix is None else str(dprefix)
            dest = dests.get(key)
            if dest is None:
                dest = dests[key] = _Dest(dprefix)
            if m.server_names:
                continue
            tp = m.transport_protocol
            if tp and tp != "raw_buffer":
                continue
            if dest.raw_buffer and not tp:
                continue
            if tp and not dest.raw_buffer:
                dest.raw_buffer = True
                dest.types = [{}, {}, {}]  # earlier chains did not say raw_buffer
            if m.application_protocols:
                continue
            sources = dest.types[m.source_type]
            for sprefix in m.source_prefix_ranges or (None,):
                skey = "" if sprefix is None else str(sprefix)
                entry = sources.get(skey)
                if entry is None:
                    entry = sources[skey] = (sprefix, {})
                for port in m.source_ports or (0,):
                    if port in entry[1]:
                        errs.add(
                            "filter_chains",
                            f"duplicate matching rules detected when adding filter chain: {m}",
                        )
                    else:
                        entry[1][port] = index
    out = []
    for key in sorted(dests):
        dest = dests[key]
        kinds = tuple(
            tuple(
                SourceIpEntry(prefix, tuple(sorted(ports.items())))
                for _, (prefix, ports) in sorted(dest.types[k].items())
            )
            for k in range(3)
        )
        out.append(DestinationIpEntry(dest.prefix, kinds))  # type: ignore[arg-type]
    return tuple(out)
