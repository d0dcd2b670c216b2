"""The XdsClient: watches over xDS resources, one ADS stream per xDS server
(gRFC A27 "XdsClient and Bootstrap File", A28 "Multiple watches for the same
resource", A57, A88).

    client = XdsClient(bootstrap)
    cancel = client.watch(LISTENER_TYPE_URL, "greeter", watcher, executor=serializer.run)
    ...
    cancel()
    client.dump()      # CSDS ClientConfig as a dict
    client.close()

Threads: the transport (a ``grpc.aio`` stream on the process's xDS stream
loop, :mod:`pyxds.xds.stream_loop`) only hands events to the client's own
:class:`WorkSerializer`; the protocol core (:class:`AdsState`) and all
timers run there.  Watcher calls leave the serializer through the notifier
(one thread for every client of the process, each client's calls in
order), which calls each watcher's ``executor(fn)`` (default: run on the
notifier thread itself), so no watcher ever runs on the transport's loop or
inside the client's serializer, and the calls of one watcher arrive in
order.

Closing never blocks where it starts: the last ``release()`` of a shared
client runs on a channel's serializer, which the process's timer thread may
be draining.  :meth:`XdsClient.close_soon` stops streams and timers on the
client's serializer and starts closing the channels on the stream loop; what
it returns (:class:`ClientClosing`) waits, on the caller's thread, for each
connection to close and the watcher callbacks queued until then
(:meth:`XdsClient.close` waits for it; a channel's close() too).

Fallback (gRFC A71): each authority (A47) has its bootstrap servers in
priority order and a chain of the ones in use, the first server alone at
start.  When the last server of the chain fails before any response and a
watched resource of that authority is not cached (neither a resource nor
does-not-exist) on any server of the chain, the next server is appended and
every watch of the authority subscribed on it too; a new watch of a
resource not cached on the chain while its last server is in that failure
does the same at once.  Watchers only hear
errors of the last server of the chain (all servers tried).  Servers higher
in the chain keep retrying; the first response from one of them closes every
lower one (its cached resources keep serving until the higher one replaces
them, as C-core's per-authority cache).  :meth:`XdsClient.dump` names the
server each entry came from (``xds_server``).

Streams: a server's stream starts with its first watch.  When it ends the
next one starts after :class:`StreamBackoff`'s delay (exponential while no
response arrives, reset by a response, and never a tight loop).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from pyxds._lingering import LingeringPool
from pyxds._uri import urlsplit
from pyxds.clock import Clock, RealClock, Timer, on_timer_thread
from pyxds.serializer import WorkSerializer
from pyxds.status import Status
from pyxds.xds import client_metrics, descriptors
from pyxds.xds.ads_state import (
    RESOURCE_TIMEOUT,
    TRANSIENT_RESOURCE_TIMEOUT,
    AdsState,
    Executor,
    ResourceWatcher,
    canonical_resource_name,
    immediate,
)
from pyxds.xds.backoff import ExponentialBackoff, StreamBackoff
from pyxds.xds.resources import CLUSTER_TYPE_URL
from pyxds.xds.transport import AdsTransport, channel_credentials, close_transport

if TYPE_CHECKING:
    from envoy.config.core.v3 import base_pb2
    from envoy.service.discovery.v3 import discovery_pb2
else:  # loaded on first use without the generated modules (pyxds.xds.descriptors)
    base_pb2 = descriptors.module("envoy.config.core.v3.base_pb2")
    discovery_pb2 = descriptors.module("envoy.service.discovery.v3.discovery_pb2")

if TYPE_CHECKING:  # load reporting loads with the first cluster that reports
    from pyxds.xds.load_store import ClusterLoadReport, LoadStore
    from pyxds.xds.lrs_client import LrsManager

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

__all__ = [
    "ClientClosing",
    "RESOURCE_TIMEOUT",
    "SERVER_SCOPE",
    "TRANSIENT_RESOURCE_TIMEOUT",
    "ResourceWatcher",
    "XdsClient",
]

CLIENT_FEATURES = ("envoy.lb.does_not_support_overprovisioning", "xds.config.resource-in-sotw")
"""Node.client_features gRPC clients send (A27)."""

_CLOSE_WAIT = 5.0


class _SerializedClock(Clock):
    """The injected clock, with every timer callback run on the serializer."""

    def __init__(self, clock: Clock, serializer: WorkSerializer) -> None:
        self._clock = clock
        self._serializer = serializer

    def now(self) -> float:
        return self._clock.now()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        return self._clock.call_later(delay, lambda: self._serializer.run(fn))


class _Notifier:
    """One XdsClient's watcher callbacks, run serially.  Every client's run
    on the process's one notifier worker (issue 18: with a client per
    channel target, A71, a thread per client grew with targets), each
    client's in the order submitted.  The worker starts with the first
    callback and exits once idle for ``_NOTIFIER_LINGER``
    (:class:`pyxds._lingering.LingeringPool` with one worker)."""

    def __init__(self) -> None:
        self._closed = False

    def submit(self, fn: Callable[[], None]) -> None:
        if not self._closed:
            _NOTIFIER_POOL.submit(fn)

    def close_soon(self) -> None:
        """No more callbacks (never blocks; :meth:`ClientClosing.wait` waits
        for those already submitted)."""
        self._closed = True


#: Seconds the notifier thread waits for a callback before it exits.
_NOTIFIER_LINGER = 1.0

_NOTIFIER_POOL = LingeringPool(1, "pyxds-xds-watchers", _NOTIFIER_LINGER, "xDS watcher callback")


class ClientClosing:
    """What an XdsClient's close left to wait for (:meth:`XdsClient.
    close_soon`): its serializer stopping everything, each ADS and LRS
    connection closing on the stream loop, the watcher callbacks queued
    until then.  Nothing waits for them unless someone calls :meth:`wait`,
    on its own thread (no thread is started for a close: C-core's orphaned
    XdsClient waits for nothing either).  The interface of a
    ``threading.Event`` that is only read."""

    __slots__ = ("_shut", "_connections")

    def __init__(self) -> None:
        self._shut = threading.Event()
        #: the connections' ``close_done``, filled before ``_shut`` is set
        self._connections: list[threading.Event] = []

    def is_set(self) -> bool:
        """Whether the connections are closed (the watcher callbacks queued
        before may still run: only :meth:`wait` waits for them)."""
        return self._shut.is_set() and all(done.is_set() for done in self._connections)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds; never on the process's timer
        thread or a serializer) until the connections are closed and the
        watcher callbacks queued until then have run; True once they have."""
        deadline = time.monotonic() + (_CLOSE_WAIT * 3 if timeout is None else timeout)
        if not self._shut.wait(max(0.0, deadline - time.monotonic())):
            return False
        for done in self._connections:
            if not done.wait(max(0.0, deadline - time.monotonic())):
                return False
        # with no thread to flush with (Python 3.12 at interpreter exit), the
        # callbacks run here
        return _NOTIFIER_POOL.flush(max(0.0, deadline - time.monotonic()))


def _server_key(server: Any) -> Any:
    """Servers with equal configs share one channel and stream."""
    try:
        hash(server)
        return server
    except TypeError:
        config = getattr(server, "channel_creds_config", None)
        return (
            server.server_uri,
            getattr(server, "channel_creds_type", "insecure"),
            json.dumps(config, sort_keys=True, default=str),
            tuple(getattr(server, "server_features", ()) or ()),
        )


def _bound_resource_types(bootstrap: Any) -> Mapping[str, Any]:
    """The resource types, CDS and LDS (a server listener's TLS) checking
    provider instance names against the bootstrap's ``certificate_providers``
    (A29: an unknown name is a NACK)."""
    import functools

    from pyxds.xds.resources import CLUSTER, LISTENER, RESOURCE_TYPES
    from pyxds.xds.resources.cluster import decode_cluster
    from pyxds.xds.resources.listener import decode_listener

    providers = getattr(bootstrap, "certificate_providers", None)
    if providers is None:
        return RESOURCE_TYPES
    cds = dataclasses.replace(
        CLUSTER, _decoder=functools.partial(decode_cluster, providers=providers)
    )
    lds = dataclasses.replace(
        LISTENER, _decoder=functools.partial(decode_listener, providers=providers)
    )
    return {**RESOURCE_TYPES, cds.type_url: cds, lds.type_url: lds}


def trusted_resource_types(types: Mapping[str, Any]) -> Mapping[str, Any]:
    """``types`` as a server with the bootstrap feature ``trusted_xds_server``
    decodes them: LDS and RDS read ``RouteAction.auto_host_rewrite`` (A81
    "xDS Resource Validation"), each with a memo of its own (the same bytes
    decode differently from an untrusted server)."""
    import functools
    import threading

    from pyxds.xds.resources import LISTENER_TYPE_URL, ROUTE_CONFIG_TYPE_URL

    out = dict(types)
    for url in (LISTENER_TYPE_URL, ROUTE_CONFIG_TYPE_URL):
        rt = types.get(url)
        if rt is not None:
            out[url] = dataclasses.replace(
                rt,
                _decoder=functools.partial(rt._decoder, trusted=True),
                _memo={},
                _memo_lock=threading.Lock(),
            )
    return out


def _node_proto(bootstrap: Any) -> base_pb2.Node | None:
    node = getattr(bootstrap, "node", None)
    if node is None:
        return None
    proto = node.to_proto() if hasattr(node, "to_proto") else node
    proto = base_pb2.Node.FromString(proto.SerializeToString())
    if not proto.user_agent_name:
        from pyxds._version import __version__

        proto.user_agent_name = "pyxds"
        proto.user_agent_version = __version__
    for feature in CLIENT_FEATURES:
        if feature not in proto.client_features:
            proto.client_features.append(feature)
    return proto


SERVER_SCOPE = "#server"
"""The scope of xDS-enabled servers' XdsClient (C-core's ``#server`` key)."""


class _SharedSlot:
    """A shared client with the references each scope holds on it."""

    __slots__ = ("client", "base", "refs")

    def __init__(self, client: XdsClient, base: Any) -> None:
        self.client = client
        self.base = base
        self.refs: dict[str | None, int] = {}


class _ServerChannel:
    """One xDS server: its ADS state, transport and stream backoff.  Every
    method runs on the client's serializer."""

    def __init__(self, client: XdsClient, server: Any) -> None:
        self._client = client
        self.server = server
        types = client._resource_types
        if getattr(server, "trusted_xds_server", False):
            types = client.trusted_resource_types()
        self.state = AdsState(
            server,
            client._node,
            resource_types=types,
            clock=client._sclock,
            post=client._post,
            default_executor=immediate,
            resource_timeout=client._resource_timeout,
            transient_resource_timeout=client._transient_resource_timeout,
        )
        self._backoff = StreamBackoff(ExponentialBackoff(client._rng))
        self._transport: AdsTransport | None = None
        self._stream_id = 0
        self._retry: Timer | None = None
        self._closed = False
        #: A78 grpc.xds_client.connected: 1 from the first stream on, 0 after a
        #: stream failed without a response, 1 again at the next response.
        self.connected = False
        self._streams_started = 0
        self._failing = False  # see ``failing``
        self.state.on_resource_counts = lambda t, v, i: client_metrics.resource_counts(
            self, t, v, i
        )

    @property
    def failing(self) -> bool:
        """Whether the last stream ended (or could not start) before any
        response and none has come since (A57's connectivity failure)."""
        return self._failing

    # -- driven by the client --------------------------------------------------

    def ensure_stream(self) -> None:
        if self._closed or self._stream_id or self._retry is not None:
            return
        self._start_stream()

    def flush(self) -> None:
        if not self._stream_id or self._transport is None:
            return
        for request in self.state.take_requests():
            self._transport.send(self._stream_id, request)

    def close(self) -> threading.Event | None:
        """Stop the stream and start closing the connection; never blocks.
        Returns the transport's ``close_done`` (set once its connection is
        gone), if it has one."""
        self._closed = True
        self.state.shutdown()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._stream_id = 0
        if self._transport is None:
            return None
        transport, self._transport = self._transport, None
        return close_transport(transport)

    # -- stream lifecycle --------------------------------------------------------

    def _start_stream(self) -> None:
        self._retry = None
        if self._closed:
            return
        if self._transport is None:
            try:
                self._transport = self._client._transport_factory(self)
            except Exception as exc:
                _log.exception("cannot create the xDS channel to %s", self.server.server_uri)
                self._failing = True
                self.state.on_stream_started()
                self._client._on_channel_failed(self)
                self.state.on_stream_closed(Status(grpc.StatusCode.UNAVAILABLE, str(exc)))
                self._schedule_retry()
                return
        self._backoff.on_stream_started(self._client._sclock.now())
        self._streams_started += 1
        if self._streams_started == 1:
            self.connected = True
        self.state.on_stream_started()
        # Transport events triggered meanwhile queue behind this callback.
        self._stream_id = self._transport.start_stream()
        self.flush()

    def _schedule_retry(self) -> None:
        delay = self._backoff.on_stream_closed(self._client._sclock.now())
        _log.debug("xDS server %s: next ADS stream in %.2fs", self.server.server_uri, delay)
        self._retry = self._client._sclock.call_later(delay, self._start_stream)

    # -- transport events (already on the serializer) ------------------------------

    def stream_connected(self, stream_id: int) -> None:
        if stream_id == self._stream_id and not self._closed:
            self.state.on_stream_connected()
            self.flush()

    def stream_response(self, stream_id: int, response: discovery_pb2.DiscoveryResponse) -> None:
        if stream_id != self._stream_id or self._closed:
            return
        first = not self.state.had_response
        self._backoff.on_response()
        self.connected = True
        self._failing = False
        self.state.on_response(response)
        self.flush()
        if first:
            self._client._on_channel_healthy(self)

    def stream_closed(self, stream_id: int, status: Status) -> None:
        if stream_id != self._stream_id or self._closed:
            return
        self._stream_id = 0
        if not self.state.had_response:
            if self.connected:
                client_metrics.server_failure(self)
            self.connected = False
            self._failing = True
            self._client._on_channel_failed(self)
        self.state.on_stream_closed(status)
        self._schedule_retry()


class _AuthorityWatch:
    """One watch of an authority: subscribed on every server of its chain."""

    __slots__ = ("type_url", "name", "watcher", "executor", "handles")

    def __init__(
        self, type_url: str, name: str, watcher: ResourceWatcher, executor: Executor
    ) -> None:
        self.type_url = type_url
        self.name = name
        self.watcher = watcher
        self.executor = executor
        self.handles: dict[_ServerChannel, Any] = {}


class _Forward:
    """The watcher registered on one server of the chain: forwards what that
    server says to the real watcher; errors only from the last server of the
    chain (A71: watchers hear connectivity failures once every server has
    been tried).  Runs on the notifier thread."""

    __slots__ = ("_authority", "_channel", "_watch")

    def __init__(
        self, authority: _Authority, channel: _ServerChannel, watch: _AuthorityWatch
    ) -> None:
        self._authority = authority
        self._channel = channel
        self._watch = watch

    def _speaks(self, is_error: bool) -> bool:
        chain = self._authority.chain
        if self._channel not in chain:
            return False
        return not is_error or chain[-1] is self._channel

    def on_resource_changed(self, value: Any) -> None:
        if self._speaks(isinstance(value, Status)):
            watcher = self._watch.watcher
            self._watch.executor(lambda: watcher.on_resource_changed(value))

    def on_ambient_error(self, status: Status) -> None:
        if self._speaks(True):
            watcher = self._watch.watcher
            self._watch.executor(lambda: watcher.on_ambient_error(status))


class _Authority:
    """The fallback chain of one authority (A71).  Serializer only, except
    ``chain`` which the notifier thread reads (replaced, never mutated)."""

    def __init__(self, name: str | None, servers: tuple[Any, ...]) -> None:
        self.name = name
        self.servers = servers
        self.chain: tuple[_ServerChannel, ...] = ()
        self.watches: dict[int, _AuthorityWatch] = {}

    def subscribe(self, channel: _ServerChannel, watch: _AuthorityWatch) -> None:
        watch.handles[channel] = channel.state.add_watcher(
            watch.type_url, watch.name, _Forward(self, channel, watch), immediate
        )

    def uncached(self) -> bool:
        """Whether some watched resource is cached on no server of the chain."""
        return any(
            not any(ch.state.is_cached(w.type_url, w.name) for ch in self.chain)
            for w in self.watches.values()
        )


class XdsClient:
    """Watches on xDS resources served by the bootstrap's xDS servers.

    ``bootstrap`` is a :class:`pyxds.xds.bootstrap.Bootstrap` or anything
    ``load_bootstrap`` accepts (path, dict, JSON text, None for the
    environment).  ``clock`` drives the resource timers and stream backoff
    (tests pass :class:`pyxds.testing.FakeClock`); ``resource_timeout``
    overrides the 15 s does-not-exist timer (30 s variant:
    ``transient_resource_timeout``).
    """

    def __init__(
        self,
        bootstrap: Any = None,
        clock: Clock | None = None,
        *,
        resource_types: Mapping[str, Any] | None = None,
        resource_timeout: float = RESOURCE_TIMEOUT,
        transient_resource_timeout: float = TRANSIENT_RESOURCE_TIMEOUT,
        channel_options: Sequence[tuple[str, Any]] = (),
        rng: random.Random | None = None,
        transport_factory: Callable[[_ServerChannel], Any] | None = None,
        lrs_transport_factory: Callable[[Any], Any] | None = None,
        min_load_reporting_interval: float | None = None,
    ) -> None:
        if bootstrap is None or not hasattr(bootstrap, "xds_servers"):
            from pyxds.xds.bootstrap import load_bootstrap

            bootstrap = load_bootstrap(bootstrap)
        if resource_types is None:
            resource_types = _bound_resource_types(bootstrap)
        self._bootstrap = bootstrap
        self._resource_types = resource_types
        self._trusted_types: Mapping[str, Any] | None = None
        self._resource_timeout = resource_timeout
        self._transient_resource_timeout = transient_resource_timeout
        self._channel_options = tuple(channel_options)
        self._rng = rng or random.Random()
        self._serializer = WorkSerializer()
        self._own_clock = clock is None
        self._clock = clock or RealClock()
        self._sclock = _SerializedClock(self._clock, self._serializer)
        self._notifier = _Notifier()
        self._node = _node_proto(bootstrap)
        self._servers: dict[Any, _ServerChannel] = {}  # by _server_key
        self._authorities: dict[str | None, _Authority] = {}
        self._watch_ids = 0
        self._transport_factory = transport_factory or self._grpc_transport
        self._closed = False
        #: what the close left to wait for (:meth:`close_soon`)
        self._closing: ClientClosing | None = None
        self._close_lock = threading.Lock()
        with XdsClient._live_lock:
            XdsClient._live.add(self)
        # Load reporting (A27): one LRS stream per server while a cluster
        # reports.  The manager (its load store, streams and modules) is made
        # by the first cluster that reports (``load_store``), so a config
        # without LRS never loads them (issue 18, start-up).
        lrs_options: dict[str, Any] = {}
        if min_load_reporting_interval is not None:
            lrs_options["min_interval"] = min_load_reporting_interval

        def new_lrs() -> LrsManager:
            from pyxds.xds.lrs_client import LrsManager

            return LrsManager(
                node=self._node,
                clock=self._sclock,
                run=self._serializer.run,
                new_backoff=lambda: StreamBackoff(ExponentialBackoff(self._rng)),
                key_of=_server_key,
                channel_options=self._channel_options,
                transport_factory=lrs_transport_factory,
                **lrs_options,
            )

        self._new_lrs = new_lrs
        self._lrs: LrsManager | None = None
        self._lrs_lock = threading.Lock()
        self._lrs_closed = False
        #: A71/A40: the data-plane target this client serves (CSDS ``client_scope``).
        self.scope: str | None = None
        self._slot: _SharedSlot | None = None
        self._notes: dict[tuple[str, str], dict[str, Any]] = {}
        self._notes_lock = threading.Lock()

    def trusted_resource_types(self) -> Mapping[str, Any]:
        """The resource types of a ``trusted_xds_server`` (A81), made once."""
        if self._trusted_types is None:
            self._trusted_types = trusted_resource_types(self._resource_types)
        return self._trusted_types

    @property
    def bootstrap(self) -> Any:
        return self._bootstrap

    @property
    def node_id(self) -> str:
        """The bootstrap node id (A88: the resolution note when nothing is wrong)."""
        return self._node.id if self._node is not None else ""

    # ------------------------------------------------------------------ watches

    def watch(
        self,
        type_url: str,
        name: str,
        watcher: ResourceWatcher,
        executor: Executor | None = None,
    ) -> Callable[[], None]:
        """Watch one resource; returns the cancel function (idempotent).

        ``watcher.on_resource_changed(resource | Status)`` and
        ``watcher.on_ambient_error(Status)`` are called through
        ``executor(fn)`` (default: the client's notifier thread), never on a
        transport thread.  A watcher of a resource already cached is told at
        once (A28).
        """
        executor = executor or immediate
        handle_box: list[Any] = []
        cancelled = threading.Event()

        def start() -> None:
            if self._closed or cancelled.is_set():
                return
            try:
                if type_url not in self._resource_types:
                    raise LookupError(f"unknown xDS resource type {type_url}")
                canonical = canonical_resource_name(name, type_url)
                authority = self._authority_for(canonical)
            except ValueError:  # A47: as C-core's WatchResource
                status = Status(
                    grpc.StatusCode.INVALID_ARGUMENT, f"Unable to parse resource name {name}"
                )
                self._post(executor, lambda: watcher.on_resource_changed(status))
                return
            except LookupError as exc:
                status = Status(grpc.StatusCode.UNAVAILABLE, str(exc))
                self._post(executor, lambda: watcher.on_resource_changed(status))
                return
            if not authority.chain:
                authority.chain = (self._channel_for(authority.servers[0]),)
            self._watch_ids += 1
            watch = _AuthorityWatch(type_url, canonical, watcher, executor)
            authority.watches[self._watch_ids] = watch
            handle_box.append((authority, self._watch_ids))
            last = authority.chain[-1]
            if last.failing:
                # A71: the server is unreachable and this watch may be for a
                # resource nobody has: fall back now (as C-core), not at the
                # next failed attempt, one backoff later.  Before subscribing
                # here, so the failing server's error never reaches it.
                self._on_channel_failed(last)
            for channel in authority.chain:
                if channel not in watch.handles:
                    authority.subscribe(channel, watch)
                channel.ensure_stream()
                channel.flush()

        def stop() -> None:
            if not handle_box:
                return
            authority, watch_id = handle_box.pop()
            watch = authority.watches.pop(watch_id, None)
            if watch is None:
                return
            for channel, handle in watch.handles.items():
                channel.state.remove_watcher(handle)
                channel.flush()

        def cancel() -> None:
            if cancelled.is_set():
                return
            cancelled.set()
            self._serializer.run(stop)

        self._serializer.run(start)
        return cancel

    # ------------------------------------------------------------------ LRS

    @property
    def load_store(self) -> LoadStore:
        """Where xds_cluster_impl counts the load of clusters that report
        (see :mod:`pyxds.xds.load_store`); shared by every channel using this
        client.  Made (with the LRS manager) on first use, by any thread."""
        lrs = self._lrs
        if lrs is None:
            with self._lrs_lock:
                lrs = self._lrs
                if lrs is None:
                    lrs = self._new_lrs()
                    if self._lrs_closed:
                        lrs.close()  # made after close(): it never reports
                    self._lrs = lrs
        return lrs.store

    def lrs_server_for(self, cluster_name: str) -> Any:
        """The server a cluster with ``lrs_server: self`` reports to: the
        xDS server its CDS resource comes from (A27) - with A71 fallback,
        the first server of the authority's chain that has it cached - else
        the authority's first server.  Any thread (the chain is replaced,
        never mutated)."""
        authority = urlsplit(cluster_name).netloc if cluster_name.startswith("xdstp:") else None
        state = self._authorities.get(authority)
        for channel in state.chain if state is not None else ():
            if channel.state.is_cached(CLUSTER_TYPE_URL, cluster_name):
                return channel.server
        return self._servers_for(authority)[0]

    def load_reports(self) -> list[ClusterLoadReport]:
        """The last load report sent per (cluster, EDS service name) (any thread)."""
        lrs = self._lrs
        return [] if lrs is None else lrs.last_reports()

    # ------------------------------------------------------------------ CSDS

    def dump(self) -> dict[str, Any]:
        """The client's cache as a CSDS ``ClientConfig`` dict (see :mod:`pyxds.xds.csds`)."""

        from pyxds.xds import csds  # loaded by the first dump

        def collect() -> dict[str, Any]:
            entries = [
                dataclasses.replace(e, server=ch.server.server_uri)
                for ch in self._servers.values()
                for e in ch.state.snapshot()
            ]
            config = csds.client_config(self._node, entries)
            if self.scope is not None:
                config["client_scope"] = self.scope
            with self._notes_lock:
                notes = dict(self._notes)
            if notes:
                csds.add_serving_notes(config, notes)
            return config

        return self._run_and_wait(collect)

    def set_serving_note(self, type_url: str, name: str, note: Mapping[str, Any] | None) -> None:
        """What an xDS-enabled server does with a resource it watches (A36):
        ``{"address", "serving", "error"}``, shown in :meth:`dump` (None:
        forget it).  Any thread."""
        with self._notes_lock:
            if note is None:
                self._notes.pop((type_url, name), None)
            else:
                self._notes[type_url, name] = dict(note)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop every stream and timer; watchers hear nothing more.  Returns
        once the connections to the xDS servers are closed (a control plane
        stopped right after must not see them open), at most
        ``3 * _CLOSE_WAIT``; at once when called from the client's own
        serializer or the process's timer thread.  See :meth:`close_soon`."""
        closing = self.close_soon()
        if not self._serializer.in_serializer and not on_timer_thread():
            closing.wait(_CLOSE_WAIT * 3)

    def close_soon(self) -> ClientClosing:
        """Start closing, and never block (the last channel's release runs
        here, on its serializer, which the process's timer thread may be
        draining: C-core orphans its XdsClient the same way).  Streams and
        timers stop on the client's serializer (now if it is free) and the
        ADS and LRS channels start closing on the stream loop.  Returns what
        tells when that is done (the same on every call): whoever must know
        waits on it, on its own thread."""
        with self._close_lock:
            closing = self._closing
            if closing is not None:
                return closing
            closing = self._closing = ClientClosing()
        with XdsClient._live_lock:
            XdsClient._live.discard(self)

        def shutdown() -> None:
            try:
                self._closed = True
                for channel in self._servers.values():
                    done = channel.close()
                    if done is not None:
                        closing._connections.append(done)
                with self._lrs_lock:
                    self._lrs_closed = True
                    lrs = self._lrs
                if lrs is not None:
                    closing._connections.extend(lrs.close())
                self._notifier.close_soon()
                if self._own_clock and isinstance(self._clock, RealClock):
                    self._clock.close()
            finally:
                closing._shut.set()

        self._serializer.run(shutdown)
        return closing

    def __enter__(self) -> XdsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    _shared_lock = threading.Lock()
    _shared: dict[Any, _SharedSlot] = {}
    _live: weakref.WeakSet[XdsClient] = weakref.WeakSet()
    _live_lock = threading.Lock()  # never held with _shared_lock taken inside it

    @property
    def scopes(self) -> tuple[str, ...]:
        """Every scope this client serves: channel targets and, for
        xDS-enabled servers, :data:`SERVER_SCOPE` (CSDS ``client_scope``)."""
        slot = self._slot
        if slot is not None:
            return tuple(s for s in slot.refs if s)
        return (self.scope,) if self.scope else ()

    @classmethod
    def instances(cls) -> list[tuple[XdsClient, tuple[str, ...]]]:
        """Every open client of the process with the scopes it serves
        (A71 channel targets, :data:`SERVER_SCOPE`; empty for a client made
        directly), for CSDS (A40) and metrics."""
        with cls._live_lock:
            clients = [c for c in list(cls._live) if not c._closed]
        with cls._shared_lock:
            return [(c, c.scopes) for c in clients]

    @classmethod
    def get_or_create(
        cls,
        bootstrap: Any = None,
        scope: str | None = None,
        *,
        resource_timeout: float = RESOURCE_TIMEOUT,
    ) -> tuple[XdsClient, Callable[[], ClientClosing | threading.Event]]:
        """The process-wide client for this bootstrap content and ``scope``,
        refcounted.  Returns ``(client, release)``; the last ``release()``
        closes the client (:meth:`close_soon`: it never blocks, as it runs
        on a channel's serializer) and returns what tells when it is closed,
        connections included; any other returns an event already set.

        Channels (``scope``: their target) get one client per data-plane
        target (A71: one target's fallback never moves another target's
        channels).  xDS-enabled servers (``scope``: :data:`SERVER_SCOPE`)
        share the process's ADS stream instead of opening their own (a
        second stream is what istio-agent drops, istio/istio#53532): a
        server joins the oldest open client with the same bootstrap, and a
        client serving only servers is taken over by the next channel target
        that needs one.  So one target and any number of servers share one
        client; further targets get their own, as A71 asks.

        ``resource_timeout`` is the constructor's: the does-not-exist timer
        of a client this call makes (tests shorten it; A57's 15 s otherwise).
        Only callers asking for the same timer share a client.
        """
        if bootstrap is None or not hasattr(bootstrap, "xds_servers"):
            from pyxds.xds.bootstrap import load_bootstrap

            bootstrap = load_bootstrap(bootstrap)
        try:
            hash(bootstrap)
            base: Any = ("bootstrap", bootstrap)
        except TypeError:
            base = ("repr", repr(bootstrap))
        if resource_timeout != RESOURCE_TIMEOUT:
            base = (*base, resource_timeout)
        key = (*base, scope)
        with cls._shared_lock:
            slot = cls._shared.get(key)
            if slot is None:
                slot = cls._adoptable(base, scope)
                if slot is None:
                    client = cls(bootstrap, resource_timeout=resource_timeout)
                    client.scope = scope
                    slot = _SharedSlot(client, base)
                    client._slot = slot
                cls._shared[key] = slot
            slot.refs[scope] = slot.refs.get(scope, 0) + 1
            if slot.client.scope is None or slot.client.scope == SERVER_SCOPE:
                slot.client.scope = next((s for s in slot.refs if s != SERVER_SCOPE), scope)
            client = slot.client
        released = threading.Event()

        def release() -> ClientClosing | threading.Event:
            if released.is_set():
                return released
            released.set()
            with cls._shared_lock:
                slot.refs[scope] -= 1
                if slot.refs[scope] == 0:
                    del slot.refs[scope]
                    if cls._shared.get(key) is slot:
                        del cls._shared[key]
                last = not slot.refs
                if last:
                    for k in [k for k, s in cls._shared.items() if s is slot]:
                        del cls._shared[k]
                else:
                    slot.client.scope = next(
                        (s for s in slot.refs if s != SERVER_SCOPE), next(iter(slot.refs))
                    )
            return client.close_soon() if last else released

        return client, release

    @classmethod
    def _adoptable(cls, base: Any, scope: str | None) -> _SharedSlot | None:
        """A live shared client ``scope`` may join (see :meth:`get_or_create`)."""
        if scope is None:
            return None
        for slot in cls._shared.values():
            if slot.base != base or not slot.refs:
                continue
            if scope == SERVER_SCOPE or set(slot.refs) == {SERVER_SCOPE}:
                return slot
        return None

    # ------------------------------------------------------------------ internals

    def _post(self, executor: Executor, fn: Callable[[], None]) -> None:
        self._notifier.submit(lambda: executor(fn))

    def _run_and_wait(self, fn: Callable[[], _T]) -> _T:
        if self._serializer.in_serializer:
            return fn()
        done = threading.Event()
        box: list[tuple[bool, Any]] = []

        def run() -> None:
            try:
                box.append((True, fn()))
            except BaseException as exc:
                box.append((False, exc))
            finally:
                done.set()

        self._serializer.run(run)
        if not done.wait(_CLOSE_WAIT * 6):
            raise TimeoutError("xDS client serializer did not run the request")
        ok, value = box[0]
        if not ok:
            raise value
        result: _T = value
        return result

    def _servers_for(self, authority: str | None) -> tuple[Any, ...]:
        """An authority's servers in priority order (A47, A71); the
        top-level ones for old-style names."""
        servers_for = getattr(self._bootstrap, "servers_for", None)
        if servers_for is not None:
            servers = tuple(servers_for(authority))
        else:
            servers = tuple(getattr(self._bootstrap, "xds_servers", ()) or ())
            if authority is not None:
                entry = (getattr(self._bootstrap, "authorities", None) or {}).get(authority)
                if entry is None:
                    raise LookupError(f'authority "{authority}" not present in bootstrap config')
                servers = tuple(getattr(entry, "xds_servers", ()) or ()) or servers
        if not servers:
            raise LookupError("no xDS server in bootstrap config")
        return servers

    def _authority_for(self, name: str) -> _Authority:
        """The fallback chain of a resource name's authority (A47, A71)."""
        authority = urlsplit(name).netloc if name.startswith("xdstp:") else None
        state = self._authorities.get(authority)
        if state is None:
            state = self._authorities[authority] = _Authority(
                authority, self._servers_for(authority)
            )
        return state

    def _on_channel_failed(self, channel: _ServerChannel) -> None:
        """A71: ``channel`` failed before any response; every authority whose
        chain ends with it and misses a resource falls back to its next
        server."""
        for authority in list(self._authorities.values()):
            chain = authority.chain
            if not chain or chain[-1] is not channel or len(chain) >= len(authority.servers):
                continue
            if not authority.uncached():
                continue
            server = authority.servers[len(chain)]
            nxt = self._channel_for(server)
            if nxt in chain:
                continue
            _log.warning(
                "xDS server %s unreachable with resources missing: falling back to %s",
                channel.server.server_uri,
                server.server_uri,
            )
            authority.chain = (*chain, nxt)
            for watch in authority.watches.values():
                authority.subscribe(nxt, watch)
            nxt.ensure_stream()
            nxt.flush()

    def _on_channel_healthy(self, channel: _ServerChannel) -> None:
        """A71: the first response of ``channel``: the servers after it in
        each chain are no longer needed; their subscriptions go and a server
        no chain uses any more is closed."""
        changed = False
        for authority in self._authorities.values():
            chain = authority.chain
            if channel not in chain or chain[-1] is channel:
                continue
            keep = chain.index(channel) + 1
            authority.chain, dropped = chain[:keep], chain[keep:]
            changed = True
            for lower in dropped:
                _log.info(
                    "xDS server %s is back: leaving %s",
                    channel.server.server_uri,
                    lower.server.server_uri,
                )
                for watch in authority.watches.values():
                    handle = watch.handles.pop(lower, None)
                    if handle is not None:
                        lower.state.remove_watcher(handle)
        if not changed:
            return
        used = {ch for a in self._authorities.values() for ch in a.chain}
        for key, ch in list(self._servers.items()):
            if ch not in used:
                del self._servers[key]
                ch.close()

    def _channel_for(self, server: Any) -> _ServerChannel:
        key: Any = _server_key(server)
        channel = self._servers.get(key)
        if channel is None:
            channel = self._servers[key] = _ServerChannel(self, server)
        return channel

    def _grpc_transport(self, channel: _ServerChannel) -> AdsTransport:
        server = channel.server
        creds = channel_credentials(
            getattr(server, "channel_creds_type", "insecure"),
            getattr(server, "channel_creds_config", None),
        )
        run = self._serializer.run
        return AdsTransport(
            server.server_uri,
            creds,
            on_connected=lambda sid: run(lambda: channel.stream_connected(sid)),
            on_response=lambda sid, resp: run(lambda: channel.stream_response(sid, resp)),
            on_closed=lambda sid, status: run(lambda: channel.stream_closed(sid, status)),
            options=self._channel_options,
        )
