"""The per-RPC gate of one listening port (gRFC A36, A41): the connection's
filter chain, the route, then each RBAC filter, before the handler runs.

Theory of operation: grpcio chooses no filter chain per connection, so the
gate does, per RPC, from what the RPC shows: the peer address
(``context.peer()``), the local address (the listening IP; for a wildcard
listening address, looked up in channelz only when a chain or rule depends
on it), ``:authority`` (sync servers; unknown on ``grpc.aio``), the method
path, the metadata and, only when a rule needs it, the TLS peer
(``context.auth_context()``).  A connection's chain depends only on its
addresses, so choosing per RPC gives what C-core chooses per connection;
the credentials all chains of a port need are the port's
(:func:`pyxds.serving.filter_chains.port_security`).

Verdicts, in C-core's words: UNAVAILABLE "No matching filter chain found"
(C-core closes such a connection; grpcio cannot, so each of its RPCs
fails), the routing failures of :mod:`pyxds.serving.routing`, and
PERMISSION_DENIED "Unauthorized RPC rejected".

Caches: per peer address, the parsed addresses and chain, for the current
config only (a new config starts a new cache); nothing about TLS identity
is cached (a later connection from the same address may present another
certificate).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import grpc

from pyxds._values import dataclass
from pyxds.serving.filter_chains import (
    IpAddress,
    destination_matters,
    parse_ip,
    select_chain,
    unmapped,
)
from pyxds.serving.listener_watch import ServingConfig
from pyxds.serving.rbac import UNAUTHORIZED, RequestInfo
from pyxds.serving.routing import ChainRouter
from pyxds.status import Status
from pyxds.xds.resources.rbac import Rule

__all__ = ["Gate", "PeerAddress", "split_peer"]

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED
NO_CHAIN = Status(UNAVAILABLE, "No matching filter chain found")
NOT_SERVING = Status(UNAVAILABLE, "xDS server is not serving on this address")
DENIED = Status(PERMISSION_DENIED, UNAUTHORIZED)
_CACHE_SIZE = 4096
_SECURE = frozenset({b"ssl", b"tls"})


@dataclass(frozen=True, slots=True)
class PeerAddress:
    """A peer as grpcio names it (``ipv4:1.2.3.4:5``, ``ipv6:%5B::1%5D:5``)."""

    ip: IpAddress | None
    port: int


def split_peer(peer: str) -> PeerAddress:
    """Parse ``context.peer()``, a URI (grpcio percent-encodes an IPv6
    peer's brackets and zone: ``ipv6:%5B::1%5D:5``); a non-IP peer (unix
    socket) has ip None."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return PeerAddress(None, 0)
    host, _, port = unquote(rest).rpartition(":")
    ip = parse_ip(host)
    if ip is not None:
        ip = unmapped(ip)
    try:
        return PeerAddress(ip, int(port))
    except ValueError:
        return PeerAddress(ip, 0)


class _Conn:
    __slots__ = ("peer", "local_ip", "router")

    def __init__(self, peer: PeerAddress, local_ip: IpAddress | None, router: ChainRouter | None):
        self.peer = peer
        self.local_ip = local_ip
        self.router = router


def _uses(rule: Rule, kinds: frozenset[str]) -> bool:
    return rule.kind in kinds or any(_uses(r, kinds) for r in rule.rules)


class Gate:
    """The decision for RPCs on one listening port.

    ``local_ip``: the listening IP (None: wildcard); ``local_lookup(peer)``
    finds the local IP of a wildcard port's connection (channelz), None when
    it cannot.  Swap configs with :meth:`set_config` (any thread).
    """

    def __init__(
        self,
        listening_port: int,
        local_ip: IpAddress | None,
        local_lookup: Callable[[str], IpAddress | None] | None = None,
        identity_unknown: bool = False,
    ) -> None:
        self.listening_port = listening_port
        self.local_ip = local_ip
        self._lookup = local_lookup
        #: True when the port's TLS verifies client certificates it does not
        #: ask for (grpcio cannot ask without requiring): who the peer is
        #: stays unknown to RBAC, which fails closed on it.
        self.identity_unknown = identity_unknown
        # (config, per-peer cache, chain depends on the local IP, rules use
        # the local IP, rules use the TLS peer)
        self._state: tuple[ServingConfig, dict[str, _Conn], bool, bool, bool] | None = None

    @property
    def config(self) -> ServingConfig | None:
        state = self._state
        return state[0] if state is not None else None

    def set_config(self, config: ServingConfig | None) -> None:
        if config is None:
            self._state = None
            return
        wildcard = self.local_ip is None
        chain_local = wildcard and destination_matters(config.listener)
        rule_local = wildcard and _any_rule(config, {"destination_ip"})
        needs_auth = _any_rule(config, {"authenticated"})
        self._state = (config, {}, chain_local, rule_local, needs_auth)

    def check(
        self,
        peer: str,
        authority: str | None,
        path: str,
        metadata: Sequence[tuple[str, Any]],
        auth_context: Callable[[], Mapping[str, Sequence[bytes]]],
    ) -> Status | None:
        """None to let the RPC through, else the Status to end it with."""
        state = self._state
        if state is None:
            return NOT_SERVING
        config, conns, chain_local, rule_local, needs_auth = state
        conn = conns.get(peer)
        if conn is None:
            conn = self._connection(config, peer, chain_local, rule_local)
            if len(conns) >= _CACHE_SIZE:
                conns.clear()
            conns[peer] = conn
        router = conn.router
        if router is None:
            return NO_CHAIN
        outcome = router.route(authority, path, metadata)
        if outcome.failure is not None:
            return outcome.failure
        if not outcome.engines:
            return None
        info = RequestInfo(
            path,
            metadata,
            authority,
            conn.peer.ip,
            conn.local_ip,
            self.listening_port,
        )
        if needs_auth:
            props = auth_context()
            if props.get("transport_security_type", (b"",))[0] in _SECURE:
                info.secure = True
                info.identity_unknown = self.identity_unknown
                info.uri_sans = _texts(props.get("peer_uri", ()))
                info.dns_sans = _texts(props.get("peer_dns", ()))
                info.subject = next(iter(_texts(props.get("x509_subject", ()))), "")
        for engine in outcome.engines:
            if not engine.allows(info):
                return DENIED
        return None

    def _connection(
        self, config: ServingConfig, peer: str, chain_local: bool, rule_local: bool
    ) -> _Conn:
        address = split_peer(peer)
        local_ip = self.local_ip
        if local_ip is None and (chain_local or rule_local) and self._lookup is not None:
            local_ip = self._lookup(peer)
        if local_ip is None and chain_local:
            # The chain depends on a local address nobody could tell: no
            # chain can be trusted (never serve under the wrong chain).
            return _Conn(address, None, None)
        chain = select_chain(config.listener, local_ip, address.ip, address.port)
        if chain is None or chain.tls != config.security.tls:
            # No chain, or one whose TLS is not the port's (port_security
            # left it out as unreachable): never serve under the wrong chain.
            return _Conn(address, local_ip, None)
        return _Conn(address, local_ip, config.router_for(chain))


def _texts(values: Sequence[bytes]) -> tuple[str, ...]:
    return tuple(v.decode("utf-8", "replace") for v in values)


def _any_rule(config: ServingConfig, kinds: set[str]) -> bool:
    frozen = frozenset(kinds)
    for chain in config.listener.all_chains():
        for flt in chain.hcm.http_filters:
            rbac = flt.rbac
            if rbac is None:
                continue
            for policy in rbac.policies:
                if any(_uses(r, frozen) for r in policy.permissions + policy.principals):
                    return True
    # Per-route overrides can name rules too: be conservative with RDS overrides.
    for router in config.routers.values():
        rc = router.route_config
        if isinstance(rc, Status):
            continue
        for vh in rc.virtual_hosts:
            if vh.filter_overrides or any(r.filter_overrides for r in vh.routes):
                return True
    return False
