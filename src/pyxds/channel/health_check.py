"""Client-side health checking (gRFC A17), seen by LB policies through the
health watch of A61 ("Generic Health Reporting Mechanism").

Which channels check: one whose own service config (``service_config=`` or
the ``grpc.service_config`` option) has ``healthCheckConfig.serviceName``
(a string; the empty string asks for the server's overall health), unless
the ``grpc.inhibit_health_checking`` option is set (A17 "Client Behavior").
An ``xds:`` target's service config is the xds resolver's, so a
``grpc.service_config`` option's ``healthCheckConfig`` does not apply there
(as in grpcio 1.85's C-core, which uses the option only as the default of a
resolver that returns none).  :func:`service_name` decides.

Who checks: a channel that checks gives its LB policies
:class:`HealthCheckedSubchannel` handles instead of plain ones; the
handle's ``watch_health`` (``pyxds.lb.api.Subchannel.watch_health``)
subscribes to the subchannel's health.  pick_first under a petiole policy
(round_robin, weighted_round_robin, least_request, ring_hash: A61) starts it
on the subchannel it selected; a top-level pick_first never does (A17
"pick_first", A61).  Every other handle's ``watch_health`` returns None (no
health signal but connectivity): a channel that does not check pays
nothing, per subchannel or per RPC.

The health of one subchannel (:class:`HealthStream`, one per subchannel
core however many policies watch it, shared through the channel's
:class:`HealthChecks`), as C-core's ``HealthProducer`` reports it:

* not READY: the subchannel's own state and status;
* READY: CONNECTING while a ``grpc.health.v1.Health/Watch`` call for the
  service name starts, until its first response (A17 "Race Conditions and
  Subchannel Startup"); then READY for SERVING, TRANSIENT_FAILURE
  UNAVAILABLE "<address>: backend unhealthy" for any other status
  (NOT_SERVING, SERVICE_UNKNOWN, ...), as each response arrives;
* the call ending UNIMPLEMENTED: READY, health checking off for that
  connection, and an ERROR logged (C-core's words);
* the call ending otherwise: started again at once if it had received a
  response (CONNECTING again), else TRANSIENT_FAILURE "<address>: health
  check call failed; will retry after backoff" until a new call starts
  after the backoff.

``<address>`` is the address as C-core names it (``ipv4:127.0.0.1:50051``).
The call runs on the subchannel's own connection, with no thread of its
own, and stops when the subchannel leaves READY or the last watcher leaves
(:class:`~pyxds.channel.subchannel_stream.StreamClient`, shared with the
out-of-band ORCA stream).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from pyxds.channel.subchannel import (
    _CHANNELZ_OFF,
    ChannelSubchannel,
    Closing,
    SubchannelCore,
    grpcio_target,
)
from pyxds.channel.subchannel_stream import StreamClient
from pyxds.lb.api import OK_STATUS, ConnectivityState, Status

__all__ = [
    "INHIBIT_OPTION",
    "METHOD",
    "HealthCheckedSubchannel",
    "HealthChecks",
    "HealthStream",
    "service_name",
]

_log = logging.getLogger(__name__)

METHOD = "/grpc.health.v1.Health/Watch"
#: the channel option that turns client-side health checking off (A17)
INHIBIT_OPTION = "grpc.inhibit_health_checking"
#: ``grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING``
SERVING = 1
UNIMPLEMENTED_MESSAGE = (
    "health checking Watch method returned UNIMPLEMENTED; "
    "disabling health checks but assuming server is healthy"
)

_READY = ConnectivityState.READY
_CONNECTING = ConnectivityState.CONNECTING
_TF = ConnectivityState.TRANSIENT_FAILURE
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

HealthWatcher = Callable[[ConnectivityState, Status], None]


def service_name(
    raw_service_config: Mapping[str, Any] | None, options: Sequence[tuple[str, Any]]
) -> str | None:
    """The service name a channel's subchannels are health checked for, or
    None when they are not (module docstring).  ``raw_service_config`` is
    the channel's own, already validated (None for an ``xds:`` target)."""
    if raw_service_config is None or dict(options).get(INHIBIT_OPTION):
        return None
    config = raw_service_config.get("healthCheckConfig")
    if not isinstance(config, Mapping):
        return None
    name = config.get("serviceName")
    return name if isinstance(name, str) else None


class _WatchRequest:
    """``grpc.health.v1.HealthCheckRequest{service}`` (field 1, a string),
    encoded by hand: the channel needs no health proto module."""

    __slots__ = ("_raw",)

    def __init__(self, service: str) -> None:
        data = service.encode()
        self._raw = b"\x0a" + _varint(len(data)) + data if data else b""

    def SerializeToString(self) -> bytes:  # the protobuf message method
        return self._raw


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def parse_status(raw: bytes) -> int:
    """The ``status`` (field 1, an enum) of a serialized
    ``HealthCheckResponse``; 0 (UNKNOWN) when absent.  Other fields are
    skipped; ValueError when the bytes are not a protobuf message."""
    status = 0
    position, end = 0, len(raw)
    while position < end:
        key, position = _read_varint(raw, position)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError("cannot parse health check response")
        if wire == 0:
            value, position = _read_varint(raw, position)
            if field == 1:
                status = value
        elif wire == 1:
            position += 8
        elif wire == 2:
            length, position = _read_varint(raw, position)
            position += length
        elif wire == 5:
            position += 4
        else:
            raise ValueError("cannot parse health check response")
        if position > end:
            raise ValueError("cannot parse health check response")
    return status


def _read_varint(raw: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while position < len(raw) and shift < 64:
        byte = raw[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    raise ValueError("cannot parse health check response")


class HealthStream(StreamClient):
    """The health of one subchannel core and its watchers (module
    docstring).  Every method runs on the channel's serializer."""

    __slots__ = (
        "_checks",
        "_watchers",
        "_request_message",
        "state",
        "status",
        "_label",
        "_changes",
    )

    METHOD = METHOD

    def __init__(self, core: SubchannelCore, checks: HealthChecks) -> None:
        super().__init__(core)
        self._checks = checks
        self._watchers: list[HealthWatcher] = []
        self._request_message = checks.request
        self.state = core.state
        self.status = core.status
        self._changes = 0  # health changes reported (add's first report)
        #: the address as C-core's statuses name it
        self._label = grpcio_target(core.address, (_CHANNELZ_OFF,))

    def add(self, fn: HealthWatcher) -> Callable[[], None]:
        """Watch the health: ``fn(state, status)`` now, then on every change."""
        first = not self._watchers
        self._watchers.append(fn)
        changes = self._changes
        if first:
            self._watch_core()  # follows the core now (a call starts if READY)
        if self._changes == changes:  # nothing told fn the health yet
            fn(self.state, self.status)
        return _Subscription(self, fn)

    def _remove(self, fn: HealthWatcher) -> None:
        if fn not in self._watchers:
            return
        self._watchers.remove(fn)
        if not self._watchers:
            self.close()

    def close(self) -> None:
        """The last watcher left, or the channel closes: cancel the call."""
        self._watchers.clear()
        self._unwatch()
        self._checks.forget(self)

    def _set(self, state: ConnectivityState, status: Status) -> None:
        if state is self.state and status == self.status:
            return
        self.state, self.status = state, status
        self._changes += 1
        for fn in tuple(self._watchers):
            try:
                fn(state, status)
            except Exception:
                _log.exception("pyxds: health watcher raised")

    def _unhealthy(self, why: str) -> None:
        self._set(_TF, Status(_UNAVAILABLE, f"{self._label}: {why}"))

    # -- StreamClient ---------------------------------------------------------
    def _wanted(self) -> bool:
        return bool(self._watchers)

    def _request(self) -> _WatchRequest:
        return self._request_message

    def parse(self, raw: bytes) -> int:
        return parse_status(raw)

    def _on_state(self, state: ConnectivityState, status: Status) -> None:
        if state is _READY:
            # CONNECTING until the first response (A17), unless this
            # connection already said UNIMPLEMENTED
            if not self._unimplemented:
                self._set(_CONNECTING, OK_STATUS)
        else:
            self._set(state, status)
        super()._on_state(state, status)

    def _on_call_start(self) -> None:
        self._set(_CONNECTING, OK_STATUS)

    def _on_message(self, message: int) -> None:
        if message == SERVING:
            self._set(_READY, OK_STATUS)
        else:
            self._unhealthy("backend unhealthy")

    def _on_backoff(self) -> None:
        self._unhealthy("health check call failed; will retry after backoff")

    def _on_unimplemented(self, details: str) -> None:
        _log.error("pyxds: %s: %s", self._core.address, UNIMPLEMENTED_MESSAGE)
        self._set(_READY, OK_STATUS)


class _Subscription:
    """One watcher of a :class:`HealthStream`; calling it (on the
    serializer) unwatches, once."""

    __slots__ = ("_stream", "_fn")

    def __init__(self, stream: HealthStream, fn: HealthWatcher) -> None:
        self._stream = stream
        self._fn: HealthWatcher | None = fn

    def __call__(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            self._stream._remove(fn)


class HealthChecks:
    """A checking channel's health service name and the health stream of
    every subchannel core being watched (serializer only)."""

    __slots__ = ("service_name", "request", "_streams")

    def __init__(self, service_name: str) -> None:
        self.service_name = service_name
        self.request = _WatchRequest(service_name)
        self._streams: dict[SubchannelCore, HealthStream] = {}

    def watch(self, core: SubchannelCore, fn: HealthWatcher) -> Callable[[], None]:
        stream = self._streams.get(core)
        if stream is None:
            stream = self._streams[core] = HealthStream(core, self)
        return stream.add(fn)

    def handle(
        self,
        core: SubchannelCore,
        attributes: Mapping[str, Any],
        release: Callable[[SubchannelCore], None],
    ) -> HealthCheckedSubchannel:
        """A policy's handle on ``core`` (the subchannel pool's)."""
        return HealthCheckedSubchannel(core, attributes, release, self)

    def stream_of(self, core: SubchannelCore) -> HealthStream | None:
        """The health stream of ``core`` while it is watched (introspection)."""
        return self._streams.get(core)

    def forget(self, stream: HealthStream) -> None:
        if self._streams.get(stream._core) is stream:
            del self._streams[stream._core]

    def close(self) -> list[Closing]:
        """Channel close: every call cancelled; returns the side connections
        closing (the channel's ``close()`` waits for them)."""
        closing: list[Closing] = []
        for stream in list(self._streams.values()):
            stream.close()
            if stream.side is not None:
                closing.append(stream.side)
        return closing


class HealthCheckedSubchannel(ChannelSubchannel):
    """The handle a checking channel gives its LB policies: a
    :class:`ChannelSubchannel` whose ``watch_health`` reports A17 health."""

    __slots__ = ("_checks",)

    def __init__(
        self,
        core: SubchannelCore,
        attributes: Mapping[str, Any],
        release: Callable[[SubchannelCore], None],
        checks: HealthChecks,
    ) -> None:
        super().__init__(core, attributes, release)
        self._checks = checks

    def watch_health(self, fn: HealthWatcher) -> Callable[[], None] | None:
        if self._shut:
            return None
        unwatch = self._checks.watch(self.core, fn)
        self._keep(unwatch)
        return unwatch
