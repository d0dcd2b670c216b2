"""The Listener watch of one listening address (gRFC A36 "xDS Protocol",
"Serving and Not Serving"), sans-IO: driven by an XdsClient's watch API
(the real one, or :class:`pyxds.testing.FakeXdsClient` in tests), it turns
LDS and RDS updates into :class:`ServingConfig` values or a not-serving
:class:`~pyxds.status.Status`, reported to ``on_change`` (on the caller's
serializer, one at a time).  As C-core's ``XdsServerConfigFetcher``:

* A Listener that is not a server listener, or whose address is not the
  listening address (port 0 matches any port of the IP, as in C-core 1.85
  and grpc-java), ends serving ("LDS resource is not a TCP listener",
  "Address in LDS update does not match listening address",
  FAILED_PRECONDITION); so does a Listener that does not exist or failed
  before any good version (the XdsClient's status, as C-core 1.85 reports it).
* A new Listener is *pending* until every RDS resource its chains name has
  been attempted (a resource, or an error: RPCs routed to it then fail
  UNAVAILABLE); then it replaces the current one.  A Listener equal to the
  current one changes nothing but dropping a pending one.  RDS names
  neither the current nor the pending Listener uses are unwatched at once
  (as C-core drops a pending filter chain manager with its RDS watchers).
* RDS updates of the current Listener apply in place (a new ServingConfig
  with the same Listener).
* Ambient errors (a NACKed update, a lost control plane) keep what is
  served; they are logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.serving.filter_chains import IpAddress, PortSecurity, port_security
from pyxds.serving.routing import ChainRouter
from pyxds.status import Status
from pyxds.xds.resources import LISTENER_TYPE_URL, ROUTE_CONFIG_TYPE_URL
from pyxds.xds.resources.server_types import FilterChain, TcpListener
from pyxds.xds.resources.types import Listener, RouteConfiguration

__all__ = ["ListenerWatch", "ServingConfig", "listener_resource_name"]

_log = logging.getLogger(__name__)

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


def listener_resource_name(template: str, listening_address: str) -> str:
    """A36: ``%s`` in the template replaced by ``ip:port`` (percent-encoded
    for an ``xdstp:`` template, as C-core's ListenerResourceName)."""
    if template.startswith("xdstp:"):
        from urllib.parse import quote

        listening_address = quote(listening_address, safe="/:@!$&'()*+,;=")
    return template.replace("%s", listening_address)


@dataclass(frozen=True)
class ServingConfig:
    """A Listener being served, with the RDS resources its chains use.

    ``routers`` maps ``id(chain)`` of each chain of ``listener`` to its
    :class:`ChainRouter` (the Listener is kept alive here, so the ids hold).
    ``security`` is the transport the listening port needs (or why it
    cannot serve).  ``version`` counts configs of one watch.
    """

    resource_name: str
    listener: TcpListener
    routers: Mapping[int, ChainRouter]
    security: PortSecurity
    version: int
    rds: Mapping[str, RouteConfiguration | Status] = field(default_factory=dict)

    def router_for(self, chain: FilterChain) -> ChainRouter:
        return self.routers[id(chain)]

    def config_errors(self) -> list[str]:
        """A36 configuration error logging: what will fail RPCs."""
        seen = []
        for router in self.routers.values():
            err = router.config_error
            if err is not None and err not in seen:
                seen.append(err)
        return seen


def _address_matches(listener_address: str, listening_address: str) -> bool:
    """The Listener's ``ip:port`` is the listening one; port 0 stands for
    any port of that IP (as grpcio 1.85 and grpc-java serve it; grpc-go
    does not)."""
    if listener_address == listening_address:
        return True
    host, _, port = listener_address.rpartition(":")
    return port == "0" and host == listening_address.rpartition(":")[0]


class _RdsWatcher:
    """Forwards one RDS name's updates to the ListenerWatch."""

    def __init__(self, owner: ListenerWatch, name: str) -> None:
        self._owner = owner
        self._name = name

    def on_resource_changed(self, value: Any) -> None:
        self._owner._on_rds(self._name, value)

    def on_ambient_error(self, status: Status) -> None:
        if status.ok:
            return
        _log.warning(
            "xDS server %s: RDS resource %s: %s; keeping the last good version",
            self._owner.listening_address,
            self._name,
            status.details,
        )


class ListenerWatch:
    """Watches ``resource_name`` for the server listening on
    ``listening_address`` (``local_ip``: its IP, None for a wildcard
    address).  ``executor(fn)`` runs watcher callbacks (the server's
    serializer); ``on_change`` gets each ServingConfig or not-serving
    Status."""

    def __init__(
        self,
        client: Any,
        resource_name: str,
        listening_address: str,
        local_ip: IpAddress | None,
        on_change: Callable[[ServingConfig | Status], None],
        executor: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.client = client
        self.resource_name = resource_name
        self.listening_address = listening_address
        self.local_ip = local_ip
        self._on_change = on_change
        self._executor = executor
        self._cancel_lds: Callable[[], None] | None = None
        self._rds_cancel: dict[str, Callable[[], None]] = {}
        self._rds: dict[str, RouteConfiguration | Status] = {}
        self._current: ServingConfig | None = None
        self._pending: TcpListener | None = None
        self._version = 0
        self._stopped = False

    @property
    def current(self) -> ServingConfig | None:
        return self._current

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        self._cancel_lds = self.client.watch(
            LISTENER_TYPE_URL, self.resource_name, self, self._executor
        )

    def stop(self) -> None:
        self._stopped = True
        if self._cancel_lds is not None:
            self._cancel_lds()
            self._cancel_lds = None
        for cancel in self._rds_cancel.values():
            cancel()
        self._rds_cancel.clear()

    # -- LDS watcher --------------------------------------------------------
    def on_resource_changed(self, value: Any) -> None:
        if self._stopped:
            return
        if isinstance(value, Status):
            self._fatal(value)
            return
        assert isinstance(value, Listener)
        tcp = value.tcp_listener
        if tcp is None:
            self._fatal(Status(FAILED_PRECONDITION, "LDS resource is not a TCP listener"))
            return
        if not _address_matches(tcp.address, self.listening_address):
            self._fatal(
                Status(
                    FAILED_PRECONDITION,
                    "Address in LDS update does not match listening address "
                    f"(Listener {tcp.address}, listening on {self.listening_address})",
                )
            )
            return
        if self._current is not None and self._current.listener == tcp:
            self._pending = None
            self._drop_unused_rds()
            return
        self._pending = tcp
        names = self._rds_names(tcp)
        for name in names:
            if name not in self._rds_cancel:
                self._rds_cancel[name] = self.client.watch(
                    ROUTE_CONFIG_TYPE_URL, name, _RdsWatcher(self, name), self._executor
                )
        self._drop_unused_rds()  # a pending Listener this one replaces
        self._maybe_promote()

    def on_ambient_error(self, status: Status) -> None:
        if status.ok or self._stopped:
            return
        _log.warning(
            "xDS server %s: LDS resource %s: %s; keeping the last good version",
            self.listening_address,
            self.resource_name,
            status.details,
        )

    # -- RDS ----------------------------------------------------------------
    def _on_rds(self, name: str, value: Any) -> None:
        if self._stopped or name not in self._rds_cancel:
            return
        self._rds[name] = value
        if self._pending is not None:
            self._maybe_promote()
            if self._pending is None:
                return
        current = self._current
        if current is not None and name in self._rds_names(current.listener):
            self._publish(current.listener)

    # -- internals -------------------------------------------------------------
    @staticmethod
    def _rds_names(tcp: TcpListener) -> set[str]:
        return {
            chain.hcm.route_config_name
            for chain in tcp.all_chains()
            if chain.hcm.route_config_name is not None
        }

    def _maybe_promote(self) -> None:
        pending = self._pending
        assert pending is not None
        names = self._rds_names(pending)
        if any(name not in self._rds for name in names):
            return
        self._pending = None
        self._publish(pending)
        self._drop_unused_rds()

    def _drop_unused_rds(self) -> None:
        """Unwatch RDS names neither the current nor the pending Listener
        uses (an old Listener's, an abandoned pending one's)."""
        used: set[str] = set()
        for tcp in (self._current.listener if self._current else None, self._pending):
            if tcp is not None:
                used |= self._rds_names(tcp)
        for name in list(self._rds_cancel):
            if name not in used:
                self._rds_cancel.pop(name)()
                self._rds.pop(name, None)

    def _publish(self, tcp: TcpListener) -> None:
        routers: dict[int, ChainRouter] = {}
        rds: dict[str, RouteConfiguration | Status] = {}
        for chain in tcp.all_chains():
            hcm = chain.hcm
            if hcm.route_config is not None:
                route_config: RouteConfiguration | Status = hcm.route_config
            else:
                assert hcm.route_config_name is not None
                route_config = self._rds[hcm.route_config_name]
                rds[hcm.route_config_name] = route_config
            routers[id(chain)] = ChainRouter(hcm, route_config)
        self._version += 1
        self._current = ServingConfig(
            self.resource_name,
            tcp,
            routers,
            port_security(tcp, self.local_ip),
            self._version,
            rds,
        )
        self._on_change(self._current)

    def _fatal(self, status: Status) -> None:
        self._pending = None
        self._current = None
        for cancel in self._rds_cancel.values():
            cancel()
        self._rds_cancel.clear()
        self._rds.clear()
        self._on_change(status)
