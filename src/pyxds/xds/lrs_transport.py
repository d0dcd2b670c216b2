"""The LRS transport: one grpcio channel per LRS server, one
``StreamLoadStats`` stream at a time on it (gRFC A27 "Load Reporting").

The only place of load reporting that touches sockets and threads; it knows
nothing of the protocol (:mod:`pyxds.xds.lrs_state`) and hands its events,
tagged with their stream id, to :class:`pyxds.xds.lrs_client.LrsChannel`
(through the XdsClient's serializer).  Its channel is its own (not the ADS
channel), with the ADS channel's options and credentials; as the ADS
transport's, a ``grpc.aio`` channel whose streams are tasks on the process's
one xDS stream loop (no thread per stream).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import grpc.aio
from envoy.service.load_stats.v3 import lrs_pb2

from pyxds.status import Status
from pyxds.xds import stream_loop
from pyxds.xds.lrs_state import LRS_METHOD
from pyxds.xds.transport import xds_server_aio_channel

_log = logging.getLogger(__name__)

__all__ = ["LrsTransport"]


class LrsTransport:
    """One ``grpc.aio`` channel to one LRS server and its current
    ``StreamLoadStats`` stream, on the process's xDS stream loop
    (:mod:`pyxds.xds.stream_loop`).  Every method may be called from any
    thread and never blocks (:meth:`close` included: :attr:`close_done`).  Events
    ``on_response(stream_id, response)`` and ``on_closed(stream_id, Status)``
    come from the loop's thread; a stream that was replaced, finished or
    cancelled is silent."""

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
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stream_id = 0
        self._closed = False
        # the loop's: each stream's call and request queue (a finished
        # stream lingers, half-closed, until the server ends it)
        self._calls: dict[int, Any] = {}
        self._queues: dict[int, asyncio.Queue[Any]] = {}
        self._loop_channel = stream_loop.LoopChannel(
            lambda: xds_server_aio_channel(target, credentials, options)
        )
        self._loop = self._loop_channel.loop

    def _post(self, fn: Callable[[], None]) -> bool:
        return self._loop_channel.post(fn)

    def start_stream(self) -> int:
        """Open a new stream (cancelling the current one, and any half-closed
        one the server has not ended yet); returns its id (0: closed)."""
        with self._lock:
            if self._closed:
                return 0
            stream_id = next(self._ids)
            self._stream_id = stream_id
        self._post(lambda: self._open(stream_id))
        return stream_id

    def send(self, stream_id: int, request: lrs_pb2.LoadStatsRequest) -> bool:
        with self._lock:
            if stream_id != self._stream_id:
                return False

        def put() -> None:
            requests = self._queues.get(stream_id)
            if requests is not None:
                requests.put_nowait(request)

        self._post(put)
        return True

    def finish_stream(self) -> None:
        """Half-close the current stream: what was sent still goes out (the
        last report), then the server ends the RPC.  No more events."""
        with self._lock:
            stream_id, self._stream_id = self._stream_id, 0

        def half_close() -> None:
            requests = self._queues.pop(stream_id, None)
            if requests is not None:
                requests.put_nowait(_END)

        self._post(half_close)

    def cancel_stream(self) -> None:
        """Cancel the current stream; no more events from it."""
        with self._lock:
            stream_id, self._stream_id = self._stream_id, 0
        self._post(lambda: self._end(stream_id))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stream_id = 0

        def end_streams() -> None:
            for stream_id in list(self._calls):
                self._end(stream_id)

        # never blocks (the XdsClient's serializer runs this): close_done
        # tells when the connection is gone
        self._loop_channel.close(before=end_streams, wait=False)

    @property
    def close_done(self) -> threading.Event:
        """Set once the channel is closed (its connection gone)."""
        return self._loop_channel.close_done

    # -- the loop -----------------------------------------------------------------

    def _end(self, stream_id: int) -> None:
        requests = self._queues.pop(stream_id, None)
        if requests is not None:
            requests.put_nowait(_END)
        call = self._calls.pop(stream_id, None)
        if call is not None:
            call.cancel()

    def _open(self, stream_id: int) -> None:
        for lingering in [i for i in self._calls if i != stream_id]:
            self._end(lingering)
        channel = self._loop_channel.channel
        if not self._current(stream_id) or channel is None:
            return
        requests: asyncio.Queue[Any] = asyncio.Queue()
        call = channel.stream_stream(
            LRS_METHOD,
            request_serializer=lrs_pb2.LoadStatsRequest.SerializeToString,
            response_deserializer=lrs_pb2.LoadStatsResponse.FromString,
        )(_drain(requests))
        self._queues[stream_id] = requests
        self._calls[stream_id] = call
        self._loop_channel.spawn(self._read(stream_id, call))

    async def _read(self, stream_id: int, call: Any) -> None:
        status: Status
        try:
            # call.read(), not ``async for``: grpc.aio's response iterator
            # and its call refer to each other, so a reader ended mid-stream
            # leaves the pair (and the C-core call, which keeps the
            # connection open after the channel's close) to the cyclic GC.
            while (response := await call.read()) is not grpc.aio.EOF:
                if not self._current(stream_id):
                    break
                self._on_response(stream_id, response)
            code = await call.code()
            status = Status(code, await call.details() or "")
        except asyncio.CancelledError:
            status = Status(grpc.StatusCode.CANCELLED, "")
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            status = Status(code or grpc.StatusCode.UNKNOWN, getattr(exc, "details", str)() or "")
        except Exception as exc:  # never let the reader die silently
            _log.exception("LRS stream to %s failed", self._target)
            status = Status(grpc.StatusCode.INTERNAL, f"LRS stream reader failed: {exc!r}")
        if self._calls.get(stream_id) is call:
            del self._calls[stream_id]
            requests = self._queues.pop(stream_id, None)
            if requests is not None:
                requests.put_nowait(_END)
        with self._lock:
            current = stream_id == self._stream_id and not self._closed
            if current:
                self._stream_id = 0
        if current:
            self._on_closed(stream_id, status)

    def _current(self, stream_id: int) -> bool:
        with self._lock:
            return not self._closed and stream_id == self._stream_id


_END = object()


async def _drain(requests: asyncio.Queue[Any]) -> AsyncIterator[lrs_pb2.LoadStatsRequest]:
    while True:
        item = await requests.get()
        if item is _END:
            return
        yield item
