"""Out-of-band ORCA streams on the channel's subchannels (gRFC A51 "Out of
Band Metrics Reporting", "The LB Policy API").

One :class:`OobStream` per :class:`~pyxds.channel.subchannel.SubchannelCore`
(created on the first subscription, :func:`oob_stream_of`), shared by every
LB policy that subscribed through ``ChannelSubchannel.watch_orca_oob``
(reached by :func:`pyxds.lb.orca.watch_oob`).

Rules:

* While there is at least one subscriber and the subchannel is READY, one
  ``xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`` call runs to the
  subchannel's address, asking for the smallest period any subscriber
  wants.  A subscription that changes that minimum restarts the call with
  the new period (the period is fixed when the call starts).
* Every report is delivered to every subscriber, on the channel's work
  serializer, as an ``OrcaLoadReport`` (parsed once).
* The call is cancelled when the subchannel leaves READY (connection lost,
  GOAWAY, shutdown) or the last subscriber leaves.
* A call that ends UNIMPLEMENTED is not retried on that connection: every
  subscriber that gave an ``on_unimplemented`` callback is told why (as is
  one that subscribes later, at once); when a subscriber gave none, it is
  logged at ERROR.  Any other end is retried, after an exponential backoff
  that is reset whenever a report arrives (the next attempt after a call
  that got a report starts at once).  A message that is not an
  ``OrcaLoadReport`` ends its call, so the same rule restarts it (C-core's
  ``SubchannelStreamClient`` cancels the call).
* The call's life cycle (its side connection on the stream loop, no thread
  per stream, backoff, UNIMPLEMENTED) is :class:`~pyxds.channel.subchannel_stream.StreamClient`'s,
  shared with the A17 health watch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf import duration_pb2
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3.orca_pb2 import OrcaLoadReportRequest

if TYPE_CHECKING:  # subchannel.py imports this module: no runtime import back
    from pyxds.channel.subchannel import SubchannelCore

from pyxds.channel.subchannel_stream import StreamClient
from pyxds.lb.unwatch import slot_add, slot_items, slot_remove

__all__ = ["METHOD", "OobStream", "UnparsedReport", "oob_stream_of"]

_log = logging.getLogger(__name__)

METHOD = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics"
Watcher = Callable[[OrcaLoadReport], None]
Unimplemented = Callable[[str], None]


def oob_stream_of(core: SubchannelCore) -> OobStream:
    """The OOB stream manager of ``core`` (created on first use)."""
    stream = getattr(core, "orca_oob", None)
    if stream is None:
        stream = OobStream(core)
        core.orca_oob = stream
    return stream


def _request(period: float) -> OrcaLoadReportRequest:
    """The StreamCoreMetrics request for ``period`` seconds, in whole
    milliseconds (rounded down), as grpcio 1.85's C-core asks (its durations
    are milliseconds): 0.0129 s asks 12 ms, 0.0004 s asks zero (the
    service's minimum, A51)."""
    millis = round(period * 1e9) // 1_000_000
    seconds, millis = divmod(millis, 1000)
    return OrcaLoadReportRequest(
        report_interval=duration_pb2.Duration(seconds=seconds, nanos=millis * 1_000_000)
    )


class OobStream(StreamClient):
    """The subscribers of one subchannel and the call serving them (module
    docstring).  Every method runs on the channel's serializer."""

    __slots__ = ("_watchers", "_unimplemented_details", "_period")

    METHOD = METHOD

    def __init__(self, core: SubchannelCore) -> None:
        super().__init__(core)
        #: the subscriptions, in the order made: None, one (nearly always:
        #: the endpoint's one policy), or a tuple of two or more (replaced,
        #: never changed in place; no dict per endpoint, issue 18)
        self._watchers: _Subscription | tuple[_Subscription, ...] | None = None
        self._unimplemented_details = ""
        self._period: float | None = None

    # -- subscribers --------------------------------------------------------
    def add(
        self, period: float, fn: Watcher, on_unimplemented: Unimplemented | None = None
    ) -> Callable[[], None]:
        subscription = _Subscription(self, max(0.0, float(period)), fn, on_unimplemented)
        self._watchers = slot_add(self._watchers, subscription)
        if on_unimplemented is not None and self._unimplemented:
            on_unimplemented(self._unimplemented_details)
        self._watch_core()  # reports the state now
        return subscription

    def _remove(self, subscription: _Subscription) -> None:
        if subscription not in self._subscriptions():
            return
        self._watchers = slot_remove(self._watchers, subscription)
        if self._watchers is not None:
            self._refresh()
            return
        self._unwatch()

    def close(self) -> None:
        """The subchannel shut down: cancel the call, forget every subscriber
        (A51: no need to wait for the call's status)."""
        self._watchers = None
        self._unwatch()

    @property
    def period(self) -> float | None:
        """The period of the running call (None: no call)."""
        return self._period if self._cancel_call is not None else None

    def _wanted_period(self) -> float:
        return min(watch.period for watch in self._subscriptions())

    def _subscriptions(self) -> tuple[_Subscription, ...]:
        return slot_items(self._watchers)

    # -- StreamClient ---------------------------------------------------------
    def _wanted(self) -> bool:
        return self._watchers is not None

    def _same_call(self) -> bool:
        return self._period == self._wanted_period()

    def _request(self) -> OrcaLoadReportRequest:
        self._period = self._wanted_period()
        return _request(self._period)

    def parse(self, raw: bytes) -> OrcaLoadReport:
        try:
            return OrcaLoadReport.FromString(raw)
        except Exception as err:
            # C-core's rule: the call is cancelled and the stream restarts
            # (at once after a report on this call, else after the backoff)
            _log.warning("pyxds: an out-of-band ORCA report did not parse (%s)", err)
            raise UnparsedReport(err) from err

    def _on_message(self, message: OrcaLoadReport) -> None:
        for watch in self._subscriptions():
            try:
                watch.fn(message)
            except Exception:
                _log.exception("pyxds: ORCA OOB watcher raised")

    def _on_unimplemented(self, details: str) -> None:
        self._unimplemented_details = details
        subscriptions = self._subscriptions()
        told = [s.on_unimplemented for s in subscriptions if s.on_unimplemented is not None]
        if len(told) < len(subscriptions):
            _log.error(
                "pyxds: %s does not implement OpenRcaService (%s); no out-of-band "
                "load reports on this connection",
                self._core.address,
                details,
            )
        for fn in told:
            try:
                fn(details)
            except Exception:
                _log.exception("pyxds: ORCA OOB on_unimplemented raised")


class _Subscription:
    """One subscriber of an :class:`OobStream`: its period, watcher and
    ``on_unimplemented``; calling it unsubscribes (any thread).  A slotted
    object, not a closure, a token and a tuple in a dict (issue 18: memory
    per endpoint)."""

    __slots__ = ("_stream", "period", "fn", "on_unimplemented")

    def __init__(
        self,
        stream: OobStream,
        period: float,
        fn: Watcher,
        on_unimplemented: Unimplemented | None,
    ) -> None:
        self._stream = stream
        self.period = period
        self.fn = fn
        self.on_unimplemented = on_unimplemented

    def __call__(self) -> None:
        stream = self._stream
        stream._serializer.run(lambda: stream._remove(self))


class UnparsedReport(ValueError):
    """A stream message that is not an ``OrcaLoadReport``: as in C-core
    (``SubchannelStreamClient``), the call is cancelled and the stream
    restarts, at once when the call had delivered a report, else after the
    backoff."""

    def __init__(self, cause: object) -> None:
        super().__init__(f"an out-of-band ORCA report did not parse: {cause}")
