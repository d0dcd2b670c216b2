"""Fakes for the LRS unit tests: an LRS transport recording what is sent and
letting the test answer or end streams, and an XdsClient on a FakeClock
whose ADS side is never used."""

from __future__ import annotations

from typing import Any

import grpc
from envoy.service.load_stats.v3 import lrs_pb2

from pyxds.lb.api import Status
from pyxds.testing import FakeClock
from pyxds.xds.client import XdsClient

BOOTSTRAP = {
    "xds_servers": [{"server_uri": "xds.example:443", "channel_creds": [{"type": "insecure"}]}],
    "node": {"id": "lrs-node"},
}


class FakeLrsTransport:
    """Streams are numbered from 1; ``sent[id]`` lists the requests of each."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.sent: dict[int, list[lrs_pb2.LoadStatsRequest]] = {}
        self.current = 0
        self.cancelled: list[int] = []
        self.finished: list[int] = []
        self.closed = False

    def start_stream(self) -> int:
        self.current = len(self.sent) + 1
        self.sent[self.current] = []
        return self.current

    def send(self, stream_id: int, request: lrs_pb2.LoadStatsRequest) -> bool:
        if stream_id != self.current:
            return False
        self.sent[stream_id].append(request)
        return True

    def finish_stream(self) -> None:
        if self.current:
            self.finished.append(self.current)
        self.current = 0

    def cancel_stream(self) -> None:
        if self.current:
            self.cancelled.append(self.current)
        self.current = 0

    def close(self) -> None:
        self.closed = True

    # -- the test's side --------------------------------------------------------

    def respond(
        self, interval: float = 1.0, clusters: list[str] | None = None, stream_id: int = 0
    ) -> None:
        response = lrs_pb2.LoadStatsResponse()
        if clusters is None:
            response.send_all_clusters = True
        else:
            response.clusters.extend(clusters)
        seconds, nanos = divmod(round(interval * 1e9), 1_000_000_000)
        response.load_reporting_interval.seconds = seconds
        response.load_reporting_interval.nanos = nanos
        self.channel.stream_response(stream_id or self.current, response)

    def end(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        stream_id, self.current = self.current, 0
        self.channel.stream_closed(stream_id, Status(code, "stream ended"))

    def reports(self) -> list[lrs_pb2.LoadStatsRequest]:
        """Every request after the first of each stream."""
        return [r for reqs in self.sent.values() for r in reqs[1:]]


def lrs_client(
    clock: FakeClock | None = None, bootstrap: dict[str, Any] | None = None
) -> tuple[XdsClient, list[FakeLrsTransport]]:
    """An XdsClient on a FakeClock with fake LRS transports (one per server);
    ``bootstrap`` (default :data:`BOOTSTRAP`) may name more servers."""
    transports: list[FakeLrsTransport] = []

    def make(channel: Any) -> FakeLrsTransport:
        transports.append(FakeLrsTransport(channel))
        return transports[-1]

    def no_ads(channel: Any) -> Any:
        raise AssertionError("these tests open no ADS stream")

    client = XdsClient(
        bootstrap or BOOTSTRAP,
        clock=clock or FakeClock(),
        transport_factory=no_ads,
        lrs_transport_factory=make,
    )
    return client, transports
