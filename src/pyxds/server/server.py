"""The embedded xDS management server: ADS over grpcio, snapshots per node, records.

Threads: grpcio runs each ADS stream's response generator on a worker of the
server's pool; the generator reads the stream's first request itself, then a
small reader thread per stream drains the request iterator into the stream's
event queue, so requests, snapshot changes and the end of the RPC are handled
one at a time by the generator (see :mod:`pyxds.server.ads`
for the protocol rules). Snapshot changes are pushed by waking every stream;
each stream sends only the types whose served content changed for its node.

``stop()`` cancels every stream; ``start()`` after ``stop()`` binds the same
port again, so tests can kill and restart the control plane under a client.

The same port serves LRS (A27 "Load Reporting"): ``server.lrs`` is the
:class:`pyxds.server.lrs.LrsService` recording the load reports clients send
(``lrs_interval`` / ``lrs_clusters`` set what it asks for).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.load_stats.v3 import lrs_pb2_grpc

from pyxds.server.ads import AdsStreamState
from pyxds.server.lrs import LrsService
from pyxds.server.records import AckRecord, NackRecord, RequestRecord
from pyxds.server.snapshot import Snapshot, SnapshotStore
from pyxds.server.types import FIELD_OF_TYPE, resolve_type_url

_END = object()
_CHANGED = object()

_T = TypeVar("_T")
_Record = TypeVar("_Record", RequestRecord, AckRecord, NackRecord)

#: Server channel options: let clients keep the ADS stream alive with pings
#: (a client's keepalive must not earn a GOAWAY "too_many_pings").
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
    # grpcio turns SO_REUSEPORT on by default, so a second server on a taken
    # port would bind and silently share it: a taken port is an error here.
    ("grpc.so_reuseport", 0),
)


class PortInUseError(RuntimeError):
    """The server's address cannot be bound (most often: the port is taken)."""


def bind_error(host: str, port: int) -> OSError | None:
    """The error listening on ``host:port`` would meet, or None: a
    :class:`socket.gaierror` when ``host`` does not resolve, else the error of
    binding one of its addresses (port 0 binds a free port: that checks the
    host is an address of this machine)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except OSError as err:
        return err
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as err:
                return err
    return None


def _unbindable(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None.  Checked before
    grpcio tries, so a taken port is one clear error rather than C-core's
    log line plus an exception (a port taken between the two is still
    caught from grpcio)."""
    if port == 0:
        return None
    err = bind_error(host, port)
    if isinstance(err, socket.gaierror):
        return f"cannot resolve {host}: {err.strerror or err}"
    return None if err is None else err.strerror or str(err)


class _Close:
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        self.details = details


class _Stream:
    """Queue-driven wrapper of one AdsStreamState bound to a grpcio RPC."""

    def __init__(self, server: ManagementServer, context: grpc.ServicerContext) -> None:
        # a DiscoveryRequest, _Close, _CHANGED or _END
        self.events: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.context = context
        self.server = server
        self.state = AdsStreamState(
            server._store.get,
            server._next_nonce,
            server._record,
            ignore_resource_names=server.ignore_resource_names,
        )

    def notify(self, event: object) -> None:
        self.events.put(event)

    def _read(self, requests: Iterator[discovery_pb2.DiscoveryRequest]) -> None:
        try:
            for request in requests:
                self.events.put(request)
        except Exception:  # the RPC ended (cancelled, reset): nothing to report
            pass
        finally:
            self.events.put(_END)

    @staticmethod
    def _first(requests: Iterator[discovery_pb2.DiscoveryRequest]) -> object:
        """The stream's first request, or _END if the RPC ended before one."""
        try:
            return next(requests)
        except Exception:  # ended (StopIteration), cancelled or reset
            return _END

    def run(
        self, requests: Iterator[discovery_pb2.DiscoveryRequest]
    ) -> Iterator[discovery_pb2.DiscoveryResponse]:
        self.context.add_callback(lambda: self.events.put(_END))
        # The first request is read here and the reader thread starts once it
        # is answered: until then the stream is not attached, so nothing else
        # can be queued for it (pushes and close_streams() reach attached
        # streams; the RPC's end ends this read).  A client that sends its
        # HEADERS and first request together (C-core) had the thread's start
        # and a hand-off to it in its first response's time (~0.5 ms of ~0.8,
        # bench/first_rpc_timeline.py).
        event = self._first(requests)
        reading = False
        registered = False
        try:
            while True:
                if event is _END:
                    return
                if isinstance(event, _Close):
                    self.context.set_code(event.code)
                    self.context.set_details(event.details)
                    return
                if event is _CHANGED:
                    responses = self.state.on_snapshot_change()
                else:
                    problem = self.state.check(event)
                    if problem is not None:
                        self.context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
                        self.context.set_details(problem)
                        return
                    if not registered:
                        # Attach before the first lookup so no snapshot push can be missed.
                        self.state.identify(event)
                        registered = True
                        self.server._attach(self)
                    responses = self.state.on_request(event)
                yield from responses
                if not reading:
                    reading = True
                    threading.Thread(
                        target=self._read, args=(requests,), name="pyxds-ads-reader", daemon=True
                    ).start()
                event = self.events.get()
        finally:
            if registered:
                self.server._detach(self)


# xds-protos' generated servicer bases have no stubs (they are Any to mypy)
class _Servicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]  # no stubs
    def __init__(self, server: ManagementServer) -> None:
        self._server = server

    def StreamAggregatedResources(
        self,
        request_iterator: Iterator[discovery_pb2.DiscoveryRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[discovery_pb2.DiscoveryResponse]:
        return _Stream(self._server, context).run(request_iterator)


class ManagementServer:
    """An xDS v3 ADS management server on ``host:port`` (port 0: pick a free one).

    Example::

        with ManagementServer() as server:
            server.set_snapshot(Snapshot(listeners=[...], routes=[...], ...))
            bootstrap = server.bootstrap(node_id="test-node")
            server.wait_for_ack("LDS", "1", timeout=5)
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_workers: int = 1024,
        snapshot: Snapshot | None = None,
        ignore_resource_names: bool = False,
        lrs_interval: float = 1.0,
        lrs_clusters: Sequence[str] | None = None,
    ) -> None:
        self.host = host
        #: The LRS service: load reports received (``reports()``, ``totals()``);
        #: ``configure(interval, clusters)`` changes what clients are asked for.
        self.lrs = LrsService(lrs_interval, lrs_clusters)
        #: Answer every subscription with every resource of its type, as servers that
        #: ignore resource names do (A27 "LDS": clients must pick theirs out).
        self.ignore_resource_names = ignore_resource_names
        self._port = port
        self._max_workers = max_workers
        self._grpc_server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._store = SnapshotStore()
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._streams: list[_Stream] = []
        self._records: list[Any] = []
        self._nonces = itertools.count(1)
        self._total_streams = 0
        self.client_connected = threading.Event()
        if snapshot is not None:
            self._store.set(snapshot)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> ManagementServer:
        """Start serving; after a stop() this binds the same port again."""
        if self._grpc_server is not None:
            raise RuntimeError("ManagementServer already started")
        executor = futures.ThreadPoolExecutor(
            max_workers=self._max_workers, thread_name_prefix="pyxds-xds-server"
        )
        # Every open ADS or LRS stream holds a worker thread (made when
        # needed) for its whole life.  Past max_workers a new stream is
        # refused RESOURCE_EXHAUSTED, which clients see and retry with
        # backoff, instead of waiting unanswered for a free worker.
        server = grpc.server(
            executor, options=SERVER_OPTIONS, maximum_concurrent_rpcs=self._max_workers
        )
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(_Servicer(self), server)
        lrs_pb2_grpc.add_LoadReportingServiceServicer_to_server(self.lrs, server)
        address = f"{self._host_for_uri()}:{self._port}"
        problem = _unbindable(self.host, self._port)
        bound = 0
        if problem is None:
            try:
                bound = server.add_insecure_port(address)
            except RuntimeError:  # grpcio >= 1.6x raises where older ones returned 0
                problem = "the address is in use or not available"
        if not bound:
            executor.shutdown(wait=False)
            raise PortInUseError(
                f"cannot listen on {self.host}:{self._port}: {problem or 'cannot bind'} "
                "(choose another --port, or 0 for a free one)"
            )
        self._port = bound
        server.start()
        self._grpc_server = server
        self._executor = executor
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop serving (streams are cancelled after ``grace`` seconds; None: at once)."""
        server, self._grpc_server = self._grpc_server, None
        if server is None:
            return
        server.stop(grace).wait(timeout=(grace or 0) + 10)
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.notify(_END)
        self.lrs.close_streams()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    @property
    def running(self) -> bool:
        return self._grpc_server is not None

    def __enter__(self) -> ManagementServer:
        if self._grpc_server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _host_for_uri(self) -> str:
        return f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host

    @property
    def port(self) -> int:
        """The bound port (0 before the first start() when constructed with port=0)."""
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` as a gRPC target, e.g. ``"127.0.0.1:40123"``."""
        return f"{self._host_for_uri()}:{self._port}"

    def bootstrap(
        self,
        node_id: str = "test-node",
        features: Sequence[str] = ("xds_v3",),
        *,
        cluster: str = "",
        locality: dict[str, str] | None = None,
        metadata: dict[str, Any] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """A bootstrap dict pointing at this server (A27 "XdsClient and Bootstrap File").

        Usable by grpcio's C-core (``GRPC_XDS_BOOTSTRAP_CONFIG=json.dumps(...)``) and
        by pyxds. ``extra`` keys are added at the top level (e.g. ``authorities``).
        """
        if not self._port:
            raise RuntimeError("ManagementServer.bootstrap: start the server first")
        node: dict[str, Any] = {"id": node_id}
        if cluster:
            node["cluster"] = cluster
        if locality:
            node["locality"] = dict(locality)
        if metadata:
            node["metadata"] = dict(metadata)
        config = {
            "xds_servers": [
                {
                    "server_uri": self.address,
                    "channel_creds": [{"type": "insecure"}],
                    "server_features": list(features),
                }
            ],
            "node": node,
        }
        config.update(extra)
        return config

    # -- snapshots -----------------------------------------------------------

    def set_snapshot(self, snapshot: Snapshot, node_id: str | None = None) -> None:
        """Serve ``snapshot`` to ``node_id`` (None: every node without its own); push now."""
        self._store.set(snapshot, node_id)
        self._push()

    def clear_snapshot(self, node_id: str | None = None) -> None:
        """Drop a node's own snapshot (it gets the default again); None drops the default."""
        self._store.clear(node_id)
        self._push()

    def snapshot(self, node_id: str | None = None) -> Snapshot:
        """The snapshot ``node_id`` is served (an empty Snapshot when none is set)."""
        return self._store.snapshot(node_id) or Snapshot()

    def update(self, node_id: str | None = None, version: str | None = None, **types: Any) -> None:
        """Replace whole types, e.g. ``update(clusters=[...], endpoints=[...])``."""
        self.set_snapshot(self._own_snapshot(node_id).replace(version=version, **types), node_id)

    def remove(self, node_id: str | None = None, version: str | None = None, **names: Any) -> None:
        """Remove resources by name, e.g. ``remove(clusters=["c1"])``."""
        self.set_snapshot(self._own_snapshot(node_id).without(version=version, **names), node_id)

    def _own_snapshot(self, node_id: str | None) -> Snapshot:
        return self._store.snapshot(node_id) or Snapshot()

    def _push(self) -> None:
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.notify(_CHANGED)

    def close_streams(
        self,
        node_id: str | None = None,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        details: str = "stream closed by the management server",
    ) -> int:
        """End open streams (of ``node_id``, or all) with ``code``; returns how many."""
        with self._lock:
            streams = [s for s in self._streams if node_id is None or s.state.node_id == node_id]
        for stream in streams:
            stream.notify(_Close(code, details))
        return len(streams)

    # -- streams and records ---------------------------------------------------

    def _next_nonce(self) -> str:
        return str(next(self._nonces))

    def _record(self, record: Any) -> None:
        with self._cond:
            self._records.append(record)
            self._cond.notify_all()

    def _attach(self, stream: _Stream) -> None:
        with self._cond:
            self._streams.append(stream)
            self._total_streams += 1
            self._cond.notify_all()
        self.client_connected.set()

    def _detach(self, stream: _Stream) -> None:
        with self._cond:
            if stream in self._streams:
                self._streams.remove(stream)
            self._cond.notify_all()

    @property
    def stream_count(self) -> int:
        """Number of open ADS streams (counted from their first request)."""
        with self._lock:
            return len(self._streams)

    @property
    def total_streams(self) -> int:
        """Number of ADS streams opened since this object was created."""
        with self._lock:
            return self._total_streams

    def connected_nodes(self) -> list[str]:
        """Node ids of the open streams (sorted, without repeats)."""
        with self._lock:
            return sorted({s.state.node_id or "" for s in self._streams})

    def _select(
        self, kind: type[_Record], type_url: str | None, node_id: str | None
    ) -> list[_Record]:
        wanted = None if type_url is None else resolve_type_url(type_url)
        return [
            r
            for r in self._records
            if isinstance(r, kind)
            and (wanted is None or r.type_url == wanted)
            and (node_id is None or r.node_id == node_id)
        ]

    def requests(
        self, type_url: str | None = None, node_id: str | None = None
    ) -> list[RequestRecord]:
        """Every DiscoveryRequest received, as RequestRecord, oldest first."""
        with self._lock:
            return self._select(RequestRecord, type_url, node_id)

    def acks(self, type_url: str | None = None, node_id: str | None = None) -> list[AckRecord]:
        """ACKs received, oldest first (``type_url`` may be a short name like "CDS")."""
        with self._lock:
            return self._select(AckRecord, type_url, node_id)

    def nacks(self, type_url: str | None = None, node_id: str | None = None) -> list[NackRecord]:
        """NACKs received, oldest first, with the client's error message."""
        with self._lock:
            return self._select(NackRecord, type_url, node_id)

    def clear_records(self) -> None:
        with self._lock:
            self._records.clear()

    def wait_until(
        self, predicate: Callable[[], _T], timeout: float = 5.0, what: str = "a condition"
    ) -> _T:
        """Block until ``predicate()`` is truthy (re-checked on every stream or record
        event); return its value, or raise TimeoutError after ``timeout`` seconds."""
        return self._wait(what, predicate, timeout)

    def _wait(self, what: str, find: Callable[[], _T | None], timeout: float) -> _T:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = find()
                if found:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
                self._cond.wait(remaining)

    def wait_for_ack(
        self,
        type_url: str,
        version: str | None = None,
        timeout: float = 5.0,
        node_id: str | None = None,
    ) -> AckRecord:
        """Block until a client ACKs ``version`` (any version if None) of ``type_url``."""
        t = resolve_type_url(type_url)

        def find() -> AckRecord | None:
            for r in reversed(self._select(AckRecord, t, node_id)):
                if version is None or r.version_info == version:
                    return r
            return None

        try:
            return self._wait(f"an ACK of {FIELD_OF_TYPE[t]} version {version!r}", find, timeout)
        except TimeoutError as e:
            seen = [(r.node_id, r.version_info) for r in self.acks(t)]
            raise TimeoutError(f"{e}; ACKs seen (node, version): {seen}") from None

    def wait_for_nack(
        self,
        type_url: str | None = None,
        timeout: float = 5.0,
        node_id: str | None = None,
        after: int = 0,
    ) -> NackRecord:
        """Block until there are more than ``after`` NACKs (of a type/node); return the newest."""

        def find() -> NackRecord | None:
            nacks = self._select(NackRecord, type_url, node_id)
            return nacks[-1] if len(nacks) > after else None

        return self._wait(f"a NACK of {type_url or 'any type'}", find, timeout)

    def wait_for_request(
        self,
        predicate: Callable[[RequestRecord], bool],
        timeout: float = 5.0,
        what: str = "a matching request",
    ) -> RequestRecord:
        """Block until a received request satisfies ``predicate``; return it."""

        def find() -> RequestRecord | None:
            for r in self._select(RequestRecord, None, None):
                if predicate(r):
                    return r
            return None

        return self._wait(what, find, timeout)

    def wait_for_streams(self, count: int = 1, timeout: float = 5.0, total: bool = False) -> None:
        """Block until ``count`` streams are open (``total``: were ever opened)."""

        def find() -> bool:
            return (self._total_streams if total else len(self._streams)) >= count

        self._wait(f"{count} ADS stream(s)", find, timeout)

    def serve_forever(self, stop: threading.Event | None = None) -> None:
        """Block until ``stop`` is set (or forever), then stop()."""
        stop = stop or threading.Event()
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
        self.stop()
