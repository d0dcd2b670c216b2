"""The channel's subchannel pool: one :class:`SubchannelCore` per (address,
credentials), shared by every policy of the channel and refcounted by the
:class:`ChannelSubchannel` handles given out (ARCHITECTURE.md "pyxds.channel").

Runs on the channel's work serializer only.  A core whose last handle is
shut down leaves the pool and closes its grpcio channel once the RPCs on it
have finished; asking for the address again builds a new core.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import grpc

from pyxds.channel.subchannel import (
    ChannelSubchannel,
    SubchannelCore,
    Transport,
    TransportFactory,
    backoff_from_options,
)
from pyxds.clock import Clock
from pyxds.serializer import WorkSerializer


class SubchannelPool:
    def __init__(
        self,
        make_transport: TransportFactory,
        serializer: WorkSerializer,
        clock: Clock,
        rng: random.Random,
        credentials: grpc.ChannelCredentials | None = None,
        options: Any = None,
    ) -> None:
        self._make_transport = make_transport
        self._serializer = serializer
        self._clock = clock
        self._rng = rng
        self._credentials = credentials
        self._options = options
        self._cores: dict[Any, SubchannelCore] = {}
        self._released: list[SubchannelCore] = []  # may still carry RPCs

    def create(self, address: str, attributes: Mapping[str, Any]) -> ChannelSubchannel:
        """A new handle on the shared core for ``address``."""
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
                backoff_from_options(self._options, self._rng),
            )
            self._cores[key] = core
        core.refs += 1
        return ChannelSubchannel(core, attributes, self._release)

    def _release(self, core: SubchannelCore) -> None:
        core.refs -= 1
        if core.refs <= 0 and self._cores.get(core.key) is core:
            del self._cores[core.key]
            core.shutdown()
            self._released = [c for c in self._released if not c.drained()]
            if not core.drained():
                self._released.append(core)

    def cores(self) -> list[SubchannelCore]:
        return list(self._cores.values())

    def close(self) -> list[Transport]:
        """Channel close: every connection goes now, RPCs on them are
        cancelled.  Returns the transports being closed (``close_done``)."""
        cores, self._cores = list(self._cores.values()), {}
        cores += self._released
        self._released = []
        closing = []
        for core in cores:
            if core.transport is not None:
                closing.append(core.transport)
            core.shutdown(force=True)
        return closing
