"""The LRS stream to one xDS server (gRFC A27 "Load Reporting").

:class:`LrsChannel` drives :class:`pyxds.xds.lrs_state.LrsStreamState` over a
transport; every method runs on the XdsClient's work serializer and its
timers on the client's (injected) clock:

* The stream starts when the server gets its first stats object in the
  :class:`~pyxds.xds.load_store.LoadStore` (``ensure``) and stops after the
  report that flushed the last of them (a cluster that stops reporting is
  reported once more, then the stream ends while nothing reports).
* Reports start with the first response and follow its interval; each
  report is built from the store at send time, so counts made while no
  stream is up (reconnect, backoff) go into the first report of the next
  stream, measured over the whole time since the previous report: nothing is
  lost or counted twice across a reconnect.  A report the transport refuses
  (its stream ended a moment before) is added to the next one.
* A stream that ends is started again after :class:`StreamBackoff`'s delay
  (reset by a response, never a tight loop), as the ADS stream is, while the
  server still has stats.

:class:`~pyxds.xds.lrs_transport.LrsTransport` is the grpcio side.  When
nothing reports any more the stream is half-closed after the last report, so
that report still goes out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyxds.clock import Clock, Timer
from pyxds.status import Status
from pyxds.xds.backoff import StreamBackoff
from pyxds.xds.load_store import ClusterLoadReport, LoadStore, merge_reports
from pyxds.xds.lrs_state import MIN_LOAD_REPORTING_INTERVAL, LrsStreamState
from pyxds.xds.transport import channel_credentials, close_transport

if TYPE_CHECKING:  # the LRS stream and its protos load with the first LRS server
    from envoy.service.load_stats.v3 import lrs_pb2

    from pyxds.xds.lrs_transport import LrsTransport

_log = logging.getLogger(__name__)

__all__ = ["LrsChannel", "LrsManager"]


class LrsChannel:
    """One xDS server's LRS stream (see the module docstring).

    ``transport_factory(channel)`` returns an object with ``start_stream() ->
    id``, ``send(id, request)``, ``finish_stream()``, ``cancel_stream()`` and
    ``close()`` (as :class:`LrsTransport`); its
    events come back as :meth:`stream_response` / :meth:`stream_closed`.
    """

    def __init__(
        self,
        server: Any,
        store: LoadStore,
        node: Any,
        clock: Clock,
        backoff: StreamBackoff,
        transport_factory: Callable[[LrsChannel], Any],
        min_interval: float = MIN_LOAD_REPORTING_INTERVAL,
    ) -> None:
        self.server = server
        self._store = store
        self._node = node
        self._clock = clock
        self._backoff = backoff
        self._transport_factory = transport_factory
        self._min_interval = min_interval
        self._transport: Any = None
        self._stream_id = 0
        self._state: LrsStreamState | None = None
        self._timer: Timer | None = None
        self._retry: Timer | None = None
        self._closed = False
        # A report the transport refused (its stream had just ended): added
        # to the next one, so its counts are not lost.
        self._unsent: list[ClusterLoadReport] = []
        self.streams_started = 0
        self.reports_sent = 0
        #: The last report sent per (cluster, EDS service name) (config dumps).
        self.last_reports: dict[tuple[str, str], ClusterLoadReport] = {}

    @property
    def active(self) -> bool:
        """True while a stream is open or waiting to be retried."""
        return bool(self._stream_id) or self._retry is not None

    # -- driven by the client ----------------------------------------------------

    def ensure(self) -> None:
        """Start the stream if the server has stats and none is running."""
        if self._closed or self.active or not self._needed():
            return
        self._start_stream()

    def _needed(self) -> bool:
        """Something to report: stats in the store or a report not yet sent."""
        return bool(self._unsent) or self._store.has_stats(self.server)

    def close(self) -> threading.Event | None:
        """Stop reporting; never blocks.  Returns the transport's
        ``close_done`` (set once its connection is gone), if it has one."""
        self._closed = True
        self._stop_stream()
        if self._transport is None:
            return None
        transport, self._transport = self._transport, None
        return close_transport(transport)

    # -- stream lifecycle ----------------------------------------------------------

    def _start_stream(self) -> None:
        self._retry = None
        if self._closed or not self._needed():
            return
        if self._transport is None:
            try:
                self._transport = self._transport_factory(self)
            except Exception:
                _log.exception("cannot create the LRS channel to %s", self._uri())
                self._schedule_retry()
                return
        self._backoff.on_stream_started(self._clock.now())
        self._state = LrsStreamState(self._node, self._min_interval)
        self._stream_id = self._transport.start_stream()
        self.streams_started += 1
        if self._stream_id:
            self._transport.send(self._stream_id, self._state.initial_request())

    def _stop_stream(self, graceful: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._stream_id and self._transport is not None:
            if graceful:
                self._transport.finish_stream()
            else:
                self._transport.cancel_stream()
        self._stream_id = 0
        self._state = None

    def _schedule_retry(self) -> None:
        delay = self._backoff.on_stream_closed(self._clock.now())
        _log.debug("LRS server %s: next stream in %.2fs", self._uri(), delay)
        self._retry = self._clock.call_later(delay, self._start_stream)

    def _schedule_report(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        assert self._state is not None and self._state.interval is not None
        self._timer = self._clock.call_later(self._state.interval, self._report)

    def _report(self) -> None:
        self._timer = None
        state = self._state
        if self._closed or state is None or not self._stream_id:
            return
        reports = self._store.take_report(self.server, state.send_all_clusters, state.clusters)
        if self._unsent:
            wanted = [
                r for r in self._unsent if state.send_all_clusters or r.cluster in state.clusters
            ]
            reports = merge_reports(wanted, reports)
            self._unsent = []
        request = state.report_request(reports)
        if request is not None:
            if not self._transport.send(self._stream_id, request):
                self._unsent = reports
                return
            self.reports_sent += 1
            # Copy on write: config dumps read it from any thread.
            last = dict(self.last_reports)
            for report in reports:
                last[(report.cluster, report.eds_service_name)] = report
            self.last_reports = last
        if not self._needed():
            # Nothing reports to this server any more (the last counts were
            # just flushed): end the stream until a cluster reports again.
            self._stop_stream(graceful=True)
            return
        self._schedule_report()

    # -- transport events (already on the serializer) ---------------------------------

    def stream_response(self, stream_id: int, response: lrs_pb2.LoadStatsResponse) -> None:
        if stream_id != self._stream_id or self._closed or self._state is None:
            return
        self._backoff.on_response()
        if self._state.on_response(response):
            self._schedule_report()

    def stream_closed(self, stream_id: int, status: Status) -> None:
        if stream_id != self._stream_id or self._closed:
            return
        _log.debug("LRS stream to %s ended: %s", self._uri(), status)
        self._stream_id = 0
        self._state = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._needed():
            self._schedule_retry()

    def _uri(self) -> str:
        return str(getattr(self.server, "server_uri", self.server))


class LrsManager:
    """The XdsClient's load reporting: its :class:`LoadStore` and one
    :class:`LrsChannel` per LRS server (servers with equal configs share one,
    as their ADS streams do).  ``run(fn)`` runs ``fn`` on the client's
    serializer; ``clock`` fires timers there.  ``transport_factory(channel)``
    defaults to a grpcio :class:`LrsTransport` whose events are handed to
    ``run``."""

    def __init__(
        self,
        *,
        node: Any,
        clock: Clock,
        run: Callable[[Callable[[], None]], None],
        new_backoff: Callable[[], StreamBackoff],
        key_of: Callable[[Any], Any],
        channel_options: Any = (),
        transport_factory: Callable[[LrsChannel], Any] | None = None,
        min_interval: float = MIN_LOAD_REPORTING_INTERVAL,
    ) -> None:
        self._node = node
        self._clock = clock
        self._run = run
        self._new_backoff = new_backoff
        self._key_of = key_of
        self._channel_options = tuple(channel_options)
        self._transport_factory = transport_factory or self._grpc_transport
        self._min_interval = min_interval
        self._channels: dict[Any, LrsChannel] = {}
        self._closed = False
        self.store = LoadStore(clock, on_needed=self._needed, key_of=key_of)

    def _needed(self, server: Any) -> None:
        self._run(lambda: self._ensure(server))

    def _ensure(self, server: Any) -> None:
        if self._closed:
            return
        self.channel_for(server).ensure()

    def channel_for(self, server: Any) -> LrsChannel:
        """The server's channel (made on first use; serializer only)."""
        key = self._key_of(server)
        channel = self._channels.get(key)
        if channel is None:
            channel = LrsChannel(
                server,
                self.store,
                self._node,
                self._clock,
                self._new_backoff(),
                self._transport_factory,
                self._min_interval,
            )
            # Copy on write: read from any thread by last_reports().
            self._channels = {**self._channels, key: channel}
        return channel

    def channels(self) -> list[LrsChannel]:
        return list(self._channels.values())

    def last_reports(self) -> list[ClusterLoadReport]:
        """The last report sent per (cluster, EDS service name), every server
        (any thread)."""
        return [r for ch in self._channels.values() for r in ch.last_reports.values()]

    def close(self) -> list[threading.Event]:
        """Stop every stream; never blocks.  Returns what tells when each
        connection is gone (see :meth:`LrsChannel.close`)."""
        self._closed = True
        closing = [channel.close() for channel in self._channels.values()]
        return [done for done in closing if done is not None]

    def _grpc_transport(self, channel: LrsChannel) -> LrsTransport:
        from pyxds.xds.lrs_transport import LrsTransport

        server = channel.server
        creds = channel_credentials(
            getattr(server, "channel_creds_type", "insecure"),
            getattr(server, "channel_creds_config", None),
        )
        run = self._run
        return LrsTransport(
            server.server_uri,
            creds,
            on_response=lambda sid, resp: run(lambda: channel.stream_response(sid, resp)),
            on_closed=lambda sid, status: run(lambda: channel.stream_closed(sid, status)),
            options=self._channel_options,
        )
