"""The ADS transport: one grpcio channel per xDS server, one
``StreamAggregatedResources`` stream at a time on it (gRFC A27 "XdsClient
and Bootstrap File", A57).

This is the only place of the xDS client that touches sockets and threads.
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

Every callback runs on a grpcio or reader thread; the receiver must hand it
to its serializer and never call watchers from there.

The channel has keepalive on (TRAPS: grpc-rust#2744), so a control plane that
vanished without closing its TCP connection is noticed within
``KEEPALIVE_TIME + KEEPALIVE_TIMEOUT`` even while the stream is quiet.  The
keepalive time (5 min) is what servers accept by default
(``grpc.http2.min_ping_interval_without_data_ms``), as in grpc-go and
grpc-java.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from pyxds.status import Status

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


def xds_server_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A grpcio channel to an xDS server (ADS and LRS alike), with
    :func:`channel_options`; insecure when ``credentials`` is None."""
    opts = channel_options(options)
    if credentials is None:
        return grpc.insecure_channel(target, options=opts)
    return grpc.secure_channel(target, credentials, options=opts)


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


class AdsTransport:
    """One grpcio channel to one xDS server and its current ADS stream."""

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
        self._channel = xds_server_channel(target, credentials, options)
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self._channel)
        self._call_factory = stub.StreamAggregatedResources
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stream_id = 0
        self._requests: queue.SimpleQueue[object] | None = None
        self._call: Any = None
        self._ready = False
        self._closed = False
        self._channel.subscribe(self._on_connectivity, try_to_connect=False)

    @property
    def target(self) -> str:
        return self._target

    def start_stream(self) -> int:
        """Open a new ADS stream (cancelling the current one); returns its id."""
        self.cancel_stream()
        requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        with self._lock:
            if self._closed:
                return 0
            stream_id = next(self._ids)
            self._stream_id = stream_id
            self._requests = requests
            ready = self._ready
        # Deliberately not wait_for_ready: a stream on a channel that cannot
        # connect fails, which is how its status reaches the watchers (A57
        # "Connectivity Status Information via ADS Stream Failure").
        call = self._call_factory(_drain(requests))
        with self._lock:
            if self._stream_id == stream_id:
                self._call = call
        threading.Thread(
            target=self._read,
            args=(stream_id, call, requests),
            name=f"pyxds-ads-{self._target}",
            daemon=True,
        ).start()
        if ready:
            self._on_connected(stream_id)
        return stream_id

    def send(self, stream_id: int, request: discovery_pb2.DiscoveryRequest) -> bool:
        """Queue ``request`` on stream ``stream_id``; False if that stream is gone."""
        with self._lock:
            if stream_id != self._stream_id or self._requests is None:
                return False
            self._requests.put(request)
            return True

    def cancel_stream(self) -> None:
        """End the current stream without an ``on_closed`` event."""
        with self._lock:
            call, requests = self._call, self._requests
            self._call = None
            self._requests = None
            self._stream_id = 0
        if requests is not None:
            requests.put(_END)
        if call is not None:
            call.cancel()

    def close(self) -> None:
        """Cancel the stream and close the channel; no more events."""
        with self._lock:
            self._closed = True
        self.cancel_stream()
        # Closed at once, not after grpcio's poller stops (as subchannels
        # are, pyxds.grpc_channels): the user's close() and interpreter exit
        # would wait up to a poll period for it, and a server stopped right
        # after close() would see this connection still open.
        try:
            self._channel.unsubscribe(self._on_connectivity)
        except Exception:
            pass
        self._channel.close()

    # -- grpcio threads ------------------------------------------------------

    def _current(self, stream_id: int) -> bool:
        with self._lock:
            return not self._closed and stream_id == self._stream_id

    def _on_connectivity(self, state: grpc.ChannelConnectivity) -> None:
        with self._lock:
            self._ready = state is grpc.ChannelConnectivity.READY
            stream_id = self._stream_id if not self._closed else 0
        if self._ready and stream_id:
            self._on_connected(stream_id)

    def _read(self, stream_id: int, call: Any, requests: queue.SimpleQueue[object]) -> None:
        status: Status
        try:
            for response in call:
                if not self._current(stream_id):
                    return
                self._on_response(stream_id, response)
            status = Status(call.code(), call.details() or "")
        except grpc.RpcError as exc:
            # grpcio's errors are Calls; code() and details() may still say None.
            code: grpc.StatusCode | None = (
                exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            )
            details = exc.details() if hasattr(exc, "details") else str(exc)
            status = Status(code or grpc.StatusCode.UNKNOWN, details or "")
        except Exception as exc:  # never let the reader die silently
            _log.exception("ADS stream to %s failed", self._target)
            status = Status(grpc.StatusCode.INTERNAL, f"ADS stream reader failed: {exc!r}")
        finally:
            requests.put(_END)
        if self._current(stream_id):
            with self._lock:
                if self._stream_id == stream_id:
                    self._stream_id = 0
                    self._call = None
                    self._requests = None
            self._on_closed(stream_id, status)


def _drain(requests: queue.SimpleQueue[object]) -> Iterator[discovery_pb2.DiscoveryRequest]:
    while True:
        item = requests.get()
        if item is _END:
            return
        yield item
