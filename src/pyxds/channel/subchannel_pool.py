"""The channel's subchannel pool: one :class:`SubchannelCore` per (address,
credentials), shared by every policy of the channel and refcounted by the
:class:`ChannelSubchannel` handles given out (ARCHITECTURE.md "pyxds.channel").

xDS credentials (gRFC A29): when the channel was built with
``grpc.xds_channel_credentials(fallback)`` (or pyxds's spelling), a
subchannel whose attributes carry a cluster's
:data:`SECURITY_ATTRIBUTE` (the cds policy's ``UpstreamTlsConfig``) is
keyed by (address, that config, its A101 SNI) and its grpcio channel goes to a
:class:`pyxds.security.relay.TlsRelay` that does the TLS handshake, CA and
SAN checks; every other subchannel uses the fallback credentials.  Without
xDS credentials the security config is ignored (A29: opting in is the
application's choice).

A channel that health checks (gRFC A17, :mod:`pyxds.channel.health_check`)
gives out :class:`~pyxds.channel.health_check.HealthCheckedSubchannel`
handles on the same cores; any other gives plain ones.

Runs on the channel's work serializer only.  A core whose last handle is
shut down leaves the pool and closes its grpcio channel once the RPCs on it
have finished; asking for the address again builds a new core.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import grpc

from pyxds.channel.subchannel import (
    ChannelSubchannel,
    Closing,
    SubchannelCore,
    TransportFactory,
    backoff_maker,
)
from pyxds.clock import Clock
from pyxds.security.credentials import xds_info
from pyxds.security.tls_config import ADDRESS_NAME_ATTRIBUTE, SECURITY_ATTRIBUTE, server_name
from pyxds.serializer import WorkSerializer

if TYPE_CHECKING:  # loaded by a channel that health checks, when it is made
    from pyxds.channel.health_check import HealthChecks


class SubchannelPool:
    def __init__(
        self,
        make_transport: TransportFactory,
        serializer: WorkSerializer,
        clock: Clock,
        rng: random.Random,
        credentials: grpc.ChannelCredentials | None = None,
        options: Any = None,
        health_service: str | None = None,
    ) -> None:
        self._make_transport = make_transport
        self._serializer = serializer
        self._clock = clock
        self._rng = rng
        self._xds = xds_info(credentials)
        self._credentials = self._xds.fallback if self._xds is not None else credentials
        self._options = options
        self._new_backoff = backoff_maker(options, rng)
        # one bound method every handle shares (not one per endpoint, issue 18)
        self._release_core = self._release
        self._cores: dict[Any, SubchannelCore] = {}
        self._relays: dict[Any, Any] = {}
        self._released: list[SubchannelCore] = []  # may still carry RPCs
        #: the channel's health checking (A17), None when it does not check
        self.health: HealthChecks | None = None
        if health_service is not None:
            from pyxds.channel.health_check import HealthChecks

            self.health = HealthChecks(health_service)

    def _handle(self, core: SubchannelCore, attributes: Mapping[str, Any]) -> ChannelSubchannel:
        core.refs += 1
        if self.health is not None:
            return self.health.handle(core, attributes, self._release_core)
        return ChannelSubchannel(core, attributes, self._release_core)

    def create(self, address: str, attributes: Mapping[str, Any]) -> ChannelSubchannel:
        """A new handle on the shared core for ``address``."""
        security = attributes.get(SECURITY_ATTRIBUTE) if attributes else None
        if security is not None and self._xds is not None:
            return self._create_tls(address, attributes, security)
        credentials = attributes.get("credentials", self._credentials) if attributes else None
        if credentials is None:
            credentials = self._credentials
        key = (address, id(credentials) if credentials is not None else None)
        core = self._cores.get(key)
        if core is None:
            core = SubchannelCore(
                address,
                key,
                self._make_transport,
                credentials,
                self._serializer,
                self._clock,
                self._new_backoff(),
            )
            self._cores[key] = core
        return self._handle(core, attributes)

    def _create_tls(
        self, address: str, attributes: Mapping[str, Any], security: Any
    ) -> ChannelSubchannel:
        """A subchannel whose connections go through a TLS relay (A29)."""
        from pyxds.security.relay import TlsRelay

        sni = server_name(security, attributes.get(ADDRESS_NAME_ATTRIBUTE))  # A101
        key = (address, "xds-tls", security, sni)
        core = self._cores.get(key)
        if core is None:
            relay = TlsRelay(address, security, sni)
            make = self._make_transport

            def make_transport(_address: str, _creds: Any, on_state: Any) -> Any:
                return make(relay.address, None, on_state)

            core = SubchannelCore(
                address,
                key,
                make_transport,
                None,
                self._serializer,
                self._clock,
                self._new_backoff(),
            )
            core.failure_detail = lambda: relay.last_error
            core.security_info = relay.info
            self._cores[key] = core
            self._relays[key] = relay
        return self._handle(core, attributes)

    def _release(self, core: SubchannelCore) -> None:
        core.refs -= 1
        if core.refs <= 0 and self._cores.get(core.key) is core:
            del self._cores[core.key]
            relay = self._relays.pop(core.key, None)
            if relay is not None:
                relay.close()  # connections already relayed finish their RPCs
            core.shutdown()
            self._released = [c for c in self._released if not c.drained()]
            if not core.drained():
                self._released.append(core)

    def cores(self) -> list[SubchannelCore]:
        return list(self._cores.values())

    def close(self) -> list[Closing]:
        """Channel close: every connection goes now, RPCs on them are
        cancelled.  Returns the connections being closed (``close_done``):
        the transports, the ORCA OOB and health check side connections."""
        cores, self._cores = list(self._cores.values()), {}
        cores += self._released
        self._released = []
        relays, self._relays = list(self._relays.values()), {}
        for relay in relays:
            relay.close()
        closing: list[Closing] = self.health.close() if self.health is not None else []
        for core in cores:
            if core.transport is not None:
                closing.append(core.transport)
            core.shutdown(force=True)
            oob = core.orca_oob
            if oob is not None and oob.side is not None:
                closing.append(oob.side)  # closed by the shutdown (orca_oob)
        return closing
