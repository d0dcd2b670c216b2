"""The ADS transport: one grpcio channel per xDS server, one
``StreamAggregatedResources`` stream at a time on it (gRFC A27 "XdsClient
and Bootstrap File", A57).

This is the only place of the xDS client that touches sockets.  Its
channel is a ``grpc.aio`` one and its stream a task on the process's one
xDS stream loop (:mod:`pyxds.xds.stream_loop`): A71 gives every data-plane
target its own XdsClient, and a sync grpcio stream held three threads, so
threads grew with targets (issue 18); READY is seen with
``wait_for_state_change``, event-driven.
It knows nothing of the protocol: :class:`pyxds.xds.ads_state.AdsState`
decides what to send; the XdsClient starts streams (and their backoff) and
forwards the events below to its work serializer.

Events, each tagged with the stream id they belong to (a stream that was
replaced or cancelled is silent):

* ``on_connected(stream_id)`` - the channel is READY while the stream is
  open (A57: the resource timer starts only then).
* ``on_response(stream_id, DiscoveryResponse)``.
* ``on_closed(stream_id, Status)`` - the stream ended (OK when the server
  finished it, the RPC status otherwise; a failed connection is UNAVAILABLE).

Every callback runs on the stream loop's thread; the receiver must hand it
to its serializer and never call watchers from there (nor block).

The channel has keepalive on (TRAPS: grpc-rust#2744), so a control plane that
vanished without closing its TCP connection is noticed within
``KEEPALIVE_TIME + KEEPALIVE_TIMEOUT`` even while the stream is quiet.  The
keepalive time (5 min) is what servers accept by default
(``grpc.http2.min_ping_interval_without_data_ms``), as in grpc-go and
grpc-java.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from pyxds.status import Status
from pyxds.xds import descriptors, stream_loop

if TYPE_CHECKING:
    from envoy.service.discovery.v3 import discovery_pb2
else:  # loaded on first use without the generated modules (pyxds.xds.descriptors)
    discovery_pb2 = descriptors.module("envoy.service.discovery.v3.discovery_pb2")

_log = logging.getLogger(__name__)

KEEPALIVE_TIME = 300.0
"""Seconds between HTTP/2 keepalive pings on the ADS channel."""
KEEPALIVE_TIMEOUT = 20.0
"""Seconds to wait for a ping ack before the connection is declared dead."""

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

_END = object()


def channel_options(
    extra: Sequence[tuple[str, Any]] = (),
    keepalive_time: float = KEEPALIVE_TIME,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT,
) -> list[tuple[str, Any]]:
    """grpcio options of the ADS channel; ``extra`` wins on conflicts."""
    options: dict[str, Any] = {
        "grpc.keepalive_time_ms": int(keepalive_time * 1000),
        "grpc.keepalive_timeout_ms": int(keepalive_timeout * 1000),
        "grpc.http2.max_pings_without_data": 0,
        # xDS responses (10,000-endpoint EDS, big RDS) exceed the 4 MB default.
        "grpc.max_receive_message_length": -1,
        # Our own channel: never share a subchannel with the application's.
        "grpc.use_local_subchannel_pool": 1,
    }
    options.update(dict(extra))
    # grpcio's C-core waits for a ping ack for ``grpc.http2.ping_timeout_ms``
    # (default 60 s), not ``keepalive_timeout_ms``: keep the two in step.
    options.setdefault("grpc.http2.ping_timeout_ms", options["grpc.keepalive_timeout_ms"])
    return list(options.items())


def xds_server_aio_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to an xDS server (ADS and LRS alike), with
    :func:`channel_options`; insecure when ``credentials`` is None.  Made
    on the xDS stream loop."""
    opts = channel_options(options)
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=opts)
    return grpc.aio.secure_channel(target, credentials, options=opts)


def _read_file(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def channel_credentials(creds_type: str, config: Any) -> grpc.ChannelCredentials | None:
    """Credentials for a bootstrap ``channel_creds`` entry; None is insecure.

    ``tls`` takes the A65 config: ``ca_certificate_file``, ``certificate_file``,
    ``private_key_file`` (all optional; the system roots when no CA is given).
    """
    if creds_type == "insecure":
        return None
    if creds_type == "tls":
        config = config or {}
        return grpc.ssl_channel_credentials(
            root_certificates=_read_file(config.get("ca_certificate_file")),
            private_key=_read_file(config.get("private_key_file")),
            certificate_chain=_read_file(config.get("certificate_file")),
        )
    if creds_type == "google_default":
        return grpc.ssl_channel_credentials()
    raise ValueError(f"unsupported xDS channel_creds type {creds_type!r}")


def close_transport(transport: Any) -> threading.Event | None:
    """Start closing ``transport`` (an ADS or LRS transport, or a test's
    fake), never blocking; its ``close_done`` (set once the connection is
    gone) when it has one."""
    transport.close()
    done: threading.Event | None = getattr(transport, "close_done", None)
    return done


class AdsTransport:
    """One ``grpc.aio`` channel to one xDS server and its current ADS stream,
    on the process's xDS stream loop (:mod:`pyxds.xds.stream_loop`: no
    thread per stream).  Every method may be called from any thread, the
    loop's own included, and never blocks (:meth:`close` included:
    :attr:`close_done` tells when the connection is gone);
    events come from the loop's thread."""

    def __init__(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None,
        *,
        on_connected: Callable[[int], None],
        on_response: Callable[[int, discovery_pb2.DiscoveryResponse], None],
        on_closed: Callable[[int, Status], None],
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._target = target
        self._on_connected = on_connected
        self._on_response = on_response
        self._on_closed = on_closed
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stream_id = 0
        self._requests: asyncio.Queue[Any] | None = None  # the loop's
        self._call: Any = None  # the loop's
        self._ready = False
        self._closed = False
        self._watcher: asyncio.Task[None] | None = None

        def watch(channel: Any) -> None:  # on the loop (maybe before __init__ returns)
            self._watcher = asyncio.get_running_loop().create_task(self._watch(channel))

        self._loop_channel = stream_loop.LoopChannel(
            lambda: xds_server_aio_channel(target, credentials, options), watch
        )
        self._loop = self._loop_channel.loop

    @property
    def target(self) -> str:
        return self._target

    def _post(self, fn: Callable[[], None]) -> None:
        self._loop_channel.post(fn)

    def start_stream(self) -> int:
        """Open a new ADS stream (cancelling the current one); returns its id."""
        self.cancel_stream()
        with self._lock:
            if self._closed:
                return 0
            stream_id = next(self._ids)
            self._stream_id = stream_id
            ready = self._ready
        self._post(lambda: self._open(stream_id))
        if ready:
            self._on_connected(stream_id)
        return stream_id

    def send(self, stream_id: int, request: discovery_pb2.DiscoveryRequest) -> bool:
        """Queue ``request`` on stream ``stream_id``; False if that stream is gone."""
        with self._lock:
            if stream_id != self._stream_id:
                return False

        def put() -> None:
            if self._current(stream_id) and self._requests is not None:
                self._requests.put_nowait(request)

        self._post(put)
        return True

    def cancel_stream(self) -> None:
        """End the current stream without an ``on_closed`` event."""
        with self._lock:
            self._stream_id = 0
        self._post(self._cancel_call)

    def close(self) -> None:
        """Cancel the stream and start closing the channel; no more events.
        Never blocks (it runs on the XdsClient's serializer, which a timer
        thread may be draining): :attr:`close_done` is set once the
        connection is closed, for whoever must wait (a user's close())."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.cancel_stream()

        def stop_watching() -> None:
            if self._watcher is not None:
                self._watcher.cancel()

        self._loop_channel.close(before=stop_watching, wait=False)

    @property
    def close_done(self) -> threading.Event:
        """Set once the channel is closed (its connection gone)."""
        return self._loop_channel.close_done

    # -- the loop ---------------------------------------------------------------

    def _current(self, stream_id: int) -> bool:
        with self._lock:
            return not self._closed and stream_id == self._stream_id

    def _cancel_call(self) -> None:
        call, self._call = self._call, None
        requests, self._requests = self._requests, None
        if requests is not None:
            requests.put_nowait(_END)
        if call is not None:
            call.cancel()

    def _open(self, stream_id: int) -> None:
        channel = self._loop_channel.channel
        if not self._current(stream_id) or channel is None:
            return
        self._cancel_call()
        requests: asyncio.Queue[Any] = asyncio.Queue()
        self._requests = requests
        # Deliberately not wait_for_ready: a stream on a channel that cannot
        # connect fails, which is how its status reaches the watchers (A57
        # "Connectivity Status Information via ADS Stream Failure").
        call = channel.stream_stream(
            ADS_METHOD,
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
        )(_drain(requests))
        self._call = call
        self._loop_channel.spawn(self._read(stream_id, call))

    async def _watch(self, channel: Any) -> None:
        """A57: the channel is READY while a stream is open (event-driven)."""
        try:
            state = channel.get_state(try_to_connect=False)
            while True:
                with self._lock:
                    self._ready = state is grpc.ChannelConnectivity.READY
                    stream_id = self._stream_id if not self._closed else 0
                    ready = self._ready
                if ready and stream_id:
                    self._on_connected(stream_id)
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=False)
        except (asyncio.CancelledError, Exception):
            return

    async def _read(self, stream_id: int, call: Any) -> None:
        status: Status
        try:
            # call.read(), not ``async for``: grpc.aio's response iterator
            # and its call refer to each other, so a reader ended mid-stream
            # leaves the pair (and the C-core call, which keeps the
            # connection open after the channel's close) to the cyclic GC.
            while (response := await call.read()) is not grpc.aio.EOF:
                if not self._current(stream_id):
                    return
                self._on_response(stream_id, response)
            code = await call.code()
            status = Status(code, await call.details() or "")
        except asyncio.CancelledError:
            return  # cancelled here: that stream is silent
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            status = Status(code or grpc.StatusCode.UNKNOWN, details or "")
        except Exception as exc:  # never let the reader die silently
            _log.exception("ADS stream to %s failed", self._target)
            status = Status(grpc.StatusCode.INTERNAL, f"ADS stream reader failed: {exc!r}")
        if self._call is call:
            self._call = None
            requests, self._requests = self._requests, None
            if requests is not None:
                requests.put_nowait(_END)
        if self._current(stream_id):
            with self._lock:
                if self._stream_id == stream_id:
                    self._stream_id = 0
            self._on_closed(stream_id, status)


async def _drain(requests: asyncio.Queue[Any]) -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
    while True:
        item = await requests.get()
        if item is _END:
            return
        yield item
