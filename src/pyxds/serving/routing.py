"""Per-RPC routing on an xDS-enabled server (gRFC A36, A39, A41), as C-core's
``XdsServerConfigSelector``: the chain's RouteConfiguration picks a virtual
host by ``:authority`` and a route by path and headers (the client's
matching rules, :mod:`pyxds.resolver.route_matching`); the route's action
must be ``non_forwarding_action``; the route decides which RBAC config each
RBAC filter of the chain applies (A39 overrides: the route's
``typed_per_filter_config`` ``RBACPerRoute`` entry of the filter's name,
else its virtual host's, else the filter's own; an entry of another type is
passed over, as C-core does), and whether it applies at all (a filter or a
most specific ``FilterConfig`` with ``disabled``: C-core 1.85 measured,
:func:`~pyxds.xds.resources._common.effective_override`).

Failures, all UNAVAILABLE in C-core's words: the RDS resource is missing,
NACKed without a good version or does not exist ("RDS resource NAME:
..."), "could not find VirtualHost for AUTHORITY in RouteConfiguration",
"no route matched", "matching route has unsupported action".  C-core 1.85
puts the status's text in the RPC's details, so they read
``UNAVAILABLE:no route matched``; pyxds writes the same.

Unknown authority (``grpc.aio`` servicers cannot see ``:authority``,
grpc/grpc#38906): the virtual host for every domain (``*``) is used; a route
configuration without one fails the RPC, naming the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.resolver.route_matching import RouteTable, select_virtual_host
from pyxds.serving.rbac import RbacEngine
from pyxds.status import Status
from pyxds.xds.resources._common import effective_override
from pyxds.xds.resources.rbac import RBAC_PER_ROUTE_TYPE, rbac_override_of
from pyxds.xds.resources.server_types import ServerHcm
from pyxds.xds.resources.types import (
    NonForwardingAction,
    Route,
    RouteConfiguration,
    VirtualHost,
)

__all__ = ["ChainRouter", "RouteOutcome", "UNKNOWN_AUTHORITY"]

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
UNKNOWN_AUTHORITY = "(not visible to grpc.aio servers)"
_MEMO = 1024


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    """The result of routing one RPC: a ``failure`` status, or the RBAC
    engines to run in filter order (those that would allow everything left
    out)."""

    failure: Status | None
    engines: tuple[RbacEngine, ...] = ()


class ChainRouter:
    """The routes of one filter chain's HttpConnectionManager."""

    __slots__ = ("hcm", "route_config", "_fixed", "_vhosts", "_by_authority", "_warning")

    def __init__(self, hcm: ServerHcm, route_config: RouteConfiguration | Status) -> None:
        self.hcm = hcm
        self.route_config = route_config
        self._fixed: RouteOutcome | None = None
        self._vhosts: dict[int, tuple[RouteTable[RouteOutcome], VirtualHost]] = {}
        self._by_authority: dict[str | None, RouteOutcome | RouteTable[RouteOutcome]] = {}
        #: A36 "configuration error logging": why RPCs will fail, or None.
        self._warning: str | None = None
        if isinstance(route_config, Status):
            name = hcm.route_config_name or ""
            self._fixed = RouteOutcome(_unavailable(f"RDS resource {name}: {route_config.details}"))
            self._warning = f"RDS resource {name}: {route_config.details}"
            return
        unsupported = [
            r
            for vh in route_config.virtual_hosts
            for r in vh.routes
            if not isinstance(r.action, NonForwardingAction)
        ]
        if unsupported:
            self._warning = (
                f"RouteConfiguration {route_config.name!r}: {len(unsupported)} route(s) with an "
                "action other than non_forwarding_action; RPCs matching them fail UNAVAILABLE"
            )

    @property
    def config_error(self) -> str | None:
        """What A36 "configuration error logging" warns about (None: nothing)."""
        return self._warning

    def route(
        self, authority: str | None, path: str, metadata: Sequence[tuple[str, Any]]
    ) -> RouteOutcome:
        """Route one RPC (``authority`` None: unknown, see module docstring)."""
        if self._fixed is not None:
            return self._fixed
        found = self._by_authority.get(authority)
        if found is None:
            found = self._select(authority)
            if len(self._by_authority) < _MEMO:
                self._by_authority[authority] = found
        if isinstance(found, RouteOutcome):
            return found
        outcome = found.match(path, metadata)
        if outcome is None:
            return _NO_ROUTE
        return outcome

    def _select(self, authority: str | None) -> RouteOutcome | RouteTable[RouteOutcome]:
        rc = self.route_config
        assert isinstance(rc, RouteConfiguration)
        vhost = select_virtual_host(rc.virtual_hosts, authority if authority is not None else "")
        if vhost is None:
            if authority is None:
                return RouteOutcome(
                    _unavailable(
                        'no virtual host for every domain ("*") in RouteConfiguration, and '
                        ":authority is not visible to grpc.aio servers (grpc/grpc#38906)"
                    )
                )
            return RouteOutcome(
                _unavailable(f"could not find VirtualHost for {authority} in RouteConfiguration")
            )
        key = id(vhost)
        entry = self._vhosts.get(key)
        if entry is None:
            table = RouteTable((r.match, self._outcome(vhost, r)) for r in vhost.routes)
            entry = self._vhosts[key] = (table, vhost)
        return entry[0]

    def _outcome(self, vhost: VirtualHost, route: Route) -> RouteOutcome:
        if not isinstance(route.action, NonForwardingAction):
            return _UNSUPPORTED
        # Only RBACPerRoute entries configure an RBAC filter: an entry of
        # another filter's type under its name is passed over for the config
        # but, the most specific, turns a disabled filter on; a disabled
        # FilterConfig turns it off (as C-core 1.85 does; effective_override).
        levels = (vhost.filter_overrides, route.filter_overrides)
        engines = []
        for flt in self.hcm.http_filters:
            if flt.rbac is None:
                continue
            runs, found = effective_override(flt.name, levels, _RBAC_OVERRIDES, flt.disabled)
            if not runs:
                continue
            config = flt.rbac
            if found is not None:
                override = found[1]
                parsed = rbac_override_of(override)
                if parsed is None:  # validated when the RDS resource was accepted
                    return RouteOutcome(
                        _unavailable(f"invalid RBAC override for filter {flt.name}")
                    )
                config = parsed
            engine = RbacEngine(config)
            if not engine.noop:
                engines.append(engine)
        return RouteOutcome(None, tuple(engines))


_RBAC_OVERRIDES = (RBAC_PER_ROUTE_TYPE,)


def _unavailable(message: str) -> Status:
    """An UNAVAILABLE routing failure, details as C-core 1.85 sends them."""
    return Status(UNAVAILABLE, f"UNAVAILABLE:{message}")


_NO_ROUTE = RouteOutcome(_unavailable("no route matched"))
_UNSUPPORTED = RouteOutcome(_unavailable("matching route has unsupported action"))
