"""The LRS transport: one grpcio channel per LRS server, one
``StreamLoadStats`` stream at a time on it (gRFC A27 "Load Reporting").

The only place of load reporting that touches sockets and threads; it knows
nothing of the protocol (:mod:`pyxds.xds.lrs_state`) and hands its events,
tagged with their stream id, to :class:`pyxds.xds.lrs_client.LrsChannel`
(through the XdsClient's serializer).  Its channel is its own (not the ADS
channel), with the ADS channel's options and credentials.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from envoy.service.load_stats.v3 import lrs_pb2

from pyxds.status import Status
from pyxds.xds.lrs_state import LRS_METHOD
from pyxds.xds.transport import xds_server_channel

_log = logging.getLogger(__name__)

__all__ = ["LrsTransport"]


class LrsTransport:
    """One grpcio channel to one LRS server and its current
    ``StreamLoadStats`` stream.  Events ``on_response(stream_id, response)``
    and ``on_closed(stream_id, Status)`` come from a reader thread; a stream
    that was replaced, finished or cancelled is silent."""

    def __init__(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None,
        *,
        on_response: Callable[[int, lrs_pb2.LoadStatsResponse], None],
        on_closed: Callable[[int, Status], None],
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._target = target
        self._on_response = on_response
        self._on_closed = on_closed
        self._channel = xds_server_channel(target, credentials, options)
        self._method = self._channel.stream_stream(
            LRS_METHOD,
            request_serializer=lrs_pb2.LoadStatsRequest.SerializeToString,
            response_deserializer=lrs_pb2.LoadStatsResponse.FromString,
        )
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stream_id = 0
        self._requests: queue.SimpleQueue[object] | None = None
        self._calls: dict[int, Any] = {}
        self._closed = False

    def start_stream(self) -> int:
        """Open a new stream (cancelling the current one, and any half-closed
        one the server has not ended yet); returns its id (0: closed)."""
        self.cancel_stream()
        with self._lock:
            lingering = list(self._calls.values())
            self._calls.clear()
        for call in lingering:
            call.cancel()
        requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        with self._lock:
            if self._closed:
                return 0
            stream_id = next(self._ids)
            self._stream_id = stream_id
            self._requests = requests
        call = self._method(_drain(requests))
        with self._lock:
            self._calls[stream_id] = call
        threading.Thread(
            target=self._read,
            args=(stream_id, call),
            name=f"pyxds-lrs-{self._target}",
            daemon=True,
        ).start()
        return stream_id

    def send(self, stream_id: int, request: lrs_pb2.LoadStatsRequest) -> bool:
        with self._lock:
            if stream_id != self._stream_id or self._requests is None:
                return False
            self._requests.put(request)
            return True

    def finish_stream(self) -> None:
        """Half-close the current stream: what was sent still goes out (the
        last report), then the server ends the RPC.  No more events."""
        with self._lock:
            requests, self._requests = self._requests, None
            self._stream_id = 0
        if requests is not None:
            requests.put(_END)

    def cancel_stream(self) -> None:
        """Cancel the current stream; no more events from it."""
        with self._lock:
            requests, self._requests = self._requests, None
            call = self._calls.pop(self._stream_id, None)
            self._stream_id = 0
        if requests is not None:
            requests.put(_END)
        if call is not None:
            call.cancel()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            calls = list(self._calls.values())
            self._calls.clear()
        self.cancel_stream()
        for call in calls:
            call.cancel()
        self._channel.close()

    def _read(self, stream_id: int, call: Any) -> None:
        try:
            for response in call:
                if not self._current(stream_id):
                    break
                self._on_response(stream_id, response)
            status = Status(call.code(), call.details() or "")
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            status = Status(code or grpc.StatusCode.UNKNOWN, getattr(exc, "details", str)() or "")
        except Exception as exc:  # never let the reader die silently
            _log.exception("LRS stream to %s failed", self._target)
            status = Status(grpc.StatusCode.INTERNAL, f"LRS stream reader failed: {exc!r}")
        with self._lock:
            self._calls.pop(stream_id, None)
            current = stream_id == self._stream_id and not self._closed
            if current:
                self._stream_id = 0
                requests, self._requests = self._requests, None
        if current:
            if requests is not None:
                requests.put(_END)
            self._on_closed(stream_id, status)

    def _current(self, stream_id: int) -> bool:
        with self._lock:
            return not self._closed and stream_id == self._stream_id


_END = object()


def _drain(requests: queue.SimpleQueue[object]) -> Iterator[lrs_pb2.LoadStatsRequest]:
    while True:
        item = requests.get()
        if item is _END:
            return
        yield item
