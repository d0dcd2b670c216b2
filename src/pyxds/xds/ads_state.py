"""The sans-IO ADS protocol state machine of one xDS server (SotW, v3).

gRFC A27 (ADS, node on the first request), A28 "Multiple watches for the
same resource", A57 (stream failures, resource timer), A88 (watcher API,
data errors, cache entry states).  No sockets, no threads: the transport
feeds events in and sends what :meth:`AdsState.take_requests` returns; every
method runs on the XdsClient's work serializer.

Theory of operation
-------------------

Inputs (events)::

    add_watcher / remove_watcher      subscriptions change
    on_stream_started()               a new ADS stream exists (generation += 1)
    on_stream_connected()             the channel under it is connected
    on_response(DiscoveryResponse)    a response arrived on the current stream
    on_stream_closed(status)          the current stream ended
    timer expiry                      the resource timer of one cache entry

Outputs: ``take_requests()`` (DiscoveryRequests to send, in order) and watcher
calls, each handed to ``post(executor, fn)``; the XdsClient's ``post`` never
runs them on the transport thread.

Rules:

* Per type URL the state keeps the subscribed names (in subscription order),
  the last ACKed ``version_info`` and the last ``response_nonce``.  A change
  of subscriptions or a response marks the type dirty; ``take_requests``
  emits one request per dirty type.  The node goes on the first request of
  each stream only.
* A response is ACKed with its version; if any resource in it is invalid it
  is NACKed with the previous version and an ``error_detail``
  (INVALID_ARGUMENT) that lists every invalid resource and why.  The valid
  resources of that same response are applied anyway.  Resources nobody
  subscribed to are ignored.  A response for a type never requested on this
  stream is ignored (answering it would be a wildcard subscription).
* A88 is guarded, as its "Temporary environment variable protection"
  says and as grpcio 1.85's C-core does, by
  ``GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING`` (off unless set true): the
  ``fail_on_data_errors`` and ``resource_timer_is_transient_error`` server
  features, the xRFC TP3 ``resource_errors`` and the ambient default for
  deletions are used only when it is on.  Off, those features are read from
  the bootstrap and not acted on, and ``resource_errors`` are not looked at.
* LDS and CDS responses are complete: a cached resource absent from the
  response is deleted.  A88 on: it is kept and the deletion is an ambient
  error, unless the server has ``fail_on_data_errors`` (then it is dropped).
  A88 off: it is dropped unless the server has ``ignore_resource_deletion``
  (A53: then it is kept and the deletion is an ambient error).
  RDS and EDS absences mean nothing.  A NACKed resource is present, not
  absent.  Versions are never compared: a stale version after a
  reconnect is just a version (TRAPS, grpc-java#12663).
* xRFC TP3 ``resource_errors`` (A88 on): the entry goes to ``RECEIVED_ERROR``;
  NOT_FOUND and PERMISSION_DENIED are data errors, any other code is
  transient.  The resource counts as present (not deleted).  An entry
  without a resource name or with an OK ``error_detail`` is malformed: the
  response is NACKed (as C-core).
* A resource inside a discovery ``Resource`` wrapper is named by the
  wrapper's ``name`` when set (as C-core), else by its own name.
* An unchanged resource (structural equality) notifies nobody.
* Data errors (NACK, deletion) on a cached resource are ambient, unless the
  server has ``fail_on_data_errors`` (A88 on): then the resource is dropped and
  watchers get ``on_resource_changed(error)`` (A88 "Handling Data Errors").
* Resource timer (A57, A88): started for a name without a cached resource
  when its request has been sent on the current stream *and* the stream is
  connected; bound to the stream generation and cancelled when the stream
  ends or the resource (valid or not) arrives.  Expiry: ``DOES_NOT_EXIST``
  with NOT_FOUND, or with ``resource_timer_is_transient_error`` (A88 on; 30 s)
  ``TIMEOUT`` with UNAVAILABLE.  Not started for a name that has a cached
  resource, is ``DOES_NOT_EXIST``, or was named by a response of the current
  stream; a NACKed name without a resource gets a timer again on the next
  stream (A57: "only if the resource is not already cached"; C-core).
* A stream that closes after a response is routine: nobody is told.  One
  that closes (or never connects) before any response is a connectivity
  error: ``on_ambient_error`` for watchers of cached resources,
  ``on_resource_changed(error)`` for the others (A88 "Handling Transient
  Errors").  Until a response arrives, a watch of a name not yet in the
  cache is told that error at once (as C-core).  The next stream re-sends
  every subscription with the last ACKed versions and no nonce.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from pyxds._values import dataclass
from pyxds.clock import Clock, Timer
from pyxds.status import OK_STATUS, Status
from pyxds.xds import descriptors

if TYPE_CHECKING:
    from envoy.config.core.v3 import base_pb2
    from envoy.service.discovery.v3 import discovery_pb2
    from google.protobuf import any_pb2
else:  # loaded on first use without the generated modules (pyxds.xds.descriptors)
    base_pb2 = descriptors.module("envoy.config.core.v3.base_pb2")
    discovery_pb2 = descriptors.module("envoy.service.discovery.v3.discovery_pb2")

_log = logging.getLogger(__name__)

RESOURCE_TIMEOUT = 15.0
"""Does-not-exist timer (A57; the xDS protocol's 15 s)."""
TRANSIENT_RESOURCE_TIMEOUT = 30.0
"""Resource timer with the ``resource_timer_is_transient_error`` feature (A88)."""

#: CSDS ``error_state.details`` of a DOES_NOT_EXIST entry (C-core's words).
DOES_NOT_EXIST_DETAILS = "does not exist"

RESOURCE_WRAPPER_TYPE_URL = "type.googleapis.com/envoy.service.discovery.v3.Resource"

_CODES = {code.value[0]: code for code in grpc.StatusCode}

Executor = Callable[[Callable[[], None]], None]
Post = Callable[[Executor, Callable[[], None]], None]


class ResourceWatcher(Protocol):
    """What a watcher implements (A88 "Changes to XdsClient Watcher APIs")."""

    def on_resource_changed(self, resource_or_status: Any) -> None:
        """A new resource value, or a :class:`Status` saying why there is none."""

    def on_ambient_error(self, status: Status) -> None:
        """An error that does not invalidate the resource already delivered
        (OK status: the condition cleared)."""


class ServerFeatures(Protocol):
    """The parts of a bootstrap ``XdsServerConfig`` this module reads."""

    server_uri: str

    @property
    def ignore_resource_deletion(self) -> bool: ...

    @property
    def fail_on_data_errors(self) -> bool: ...

    @property
    def resource_timer_is_transient_error(self) -> bool: ...


class CacheState(enum.Enum):
    """Cache entry states (A88 "Cache Entry States"), named as CSDS's
    ``ClientResourceStatus``."""

    REQUESTED = "REQUESTED"
    DOES_NOT_EXIST = "DOES_NOT_EXIST"
    ACKED = "ACKED"
    NACKED = "NACKED"
    RECEIVED_ERROR = "RECEIVED_ERROR"
    TIMEOUT = "TIMEOUT"


@dataclass(frozen=True)
class NackInfo:
    """The error of a cache entry (CSDS ``error_state``, A88 "Cache Entry
    States": NACKED, RECEIVED_ERROR, DOES_NOT_EXIST and TIMEOUT entries
    carry one): the rejected or deleting response's version and when it
    came; a timer's has neither (version "", time None), as C-core's."""

    details: str
    version_info: str
    last_update_attempt: float | None  # wall-clock seconds


@dataclass(frozen=True)
class EntrySnapshot:
    """One cache entry as CSDS shows it."""

    type_url: str
    name: str
    state: CacheState
    version_info: str
    raw: any_pb2.Any | None
    last_updated: float | None  # wall-clock seconds
    error_state: NackInfo | None
    server: str | None = None  # the xDS server it came from (A71), set by the client


@dataclass(frozen=True)
class WatchHandle:
    """Returned by :meth:`AdsState.add_watcher`; pass to ``remove_watcher``."""

    type_url: str
    name: str
    token: int


DATA_ERROR_HANDLING_ENV = "GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING"


def data_error_handling_enabled() -> bool:
    """Whether A88's default for LDS/CDS deletions is on: C-core's
    ``GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING`` (off unless set true)."""
    value = os.environ.get(DATA_ERROR_HANDLING_ENV, "").strip().lower()
    return value in ("1", "true", "yes")


_UNRESERVED = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
#: RFC 3986 path characters (pchar and "/"), as C-core's URI::ToString keeps them
_PATH_CHARS = frozenset(_UNRESERVED + b"!$&'()*+,;=:@/")
#: query key and value characters: pchar, "/" and "?", less "&" and "="
_QUERY_CHARS = frozenset(_UNRESERVED + b"!$'()*+,;:@/?")
_HEX = frozenset(b"0123456789abcdefABCDEF")


def _percent_decoded(text: str) -> bytes:
    """``%XX`` escapes decoded; a ``%`` not followed by two hex digits stays."""
    raw = text.encode()
    if b"%" not in raw:
        return raw
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == 0x25 and i + 2 < len(raw) and raw[i + 1] in _HEX and raw[i + 2] in _HEX:
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def _percent_encoded(data: bytes, allowed: frozenset[int]) -> str:
    return "".join(chr(c) if c in allowed else f"%{c:02X}" for c in data)


def canonical_resource_name(name: str, type_url: str) -> str:
    """The name a resource is subscribed and cached under (gRFC A47), as
    C-core's ``ParseXdsResourceName`` and ``ConstructFullXdsResourceName``
    make it (seen on the wire from grpcio 1.85): an old-style name as it
    is; an ``xdstp:`` name with its path and query parameters
    percent-decoded and encoded again (``%3A`` -> ``:``, ``%2F`` -> ``/``,
    non-ASCII as UTF-8 escapes, a stray ``%`` as ``%25``), its query
    parameters sorted by key (the last of a repeated key wins; ``k`` is
    ``k=``) and its fragment dropped, so names differing only there are one
    resource.  Raises ValueError when an ``xdstp:`` name's path does not
    start with the resource type (``type_url`` without its
    ``type.googleapis.com/`` prefix), as C-core ("xdstp URI path must
    indicate valid xDS resource type").  An empty authority stays
    ``xdstp:///`` (C-core writes ``xdstp:/``, another name)."""
    if not name.startswith("xdstp:"):
        return name
    rest = name[6:].partition("#")[0]
    rest, has_query, query = rest.partition("?")
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        path = slash + path
    else:
        authority, path = "", rest
    decoded = _percent_decoded(path)
    kind, _, ident = decoded.removeprefix(b"/").partition(b"/")
    if kind != type_url.rpartition("/")[2].encode():
        raise ValueError("xdstp URI path must indicate valid xDS resource type")
    out = f"xdstp://{authority}/{_percent_encoded(kind + b'/' + ident, _PATH_CHARS)}"
    if not has_query:
        return out
    params: dict[bytes, bytes] = {}
    for pair in query.split("&"):
        if pair:
            key, _, value = pair.partition("=")
            params[_percent_decoded(key)] = _percent_decoded(value)
    if not params:
        return out
    return (
        out
        + "?"
        + "&".join(
            f"{_percent_encoded(key, _QUERY_CHARS)}={_percent_encoded(params[key], _QUERY_CHARS)}"
            for key in sorted(params)
        )
    )


def _canonical_or_same(name: str, type_url: str) -> str:
    try:
        return canonical_resource_name(name, type_url)
    except ValueError:
        return name


def immediate(fn: Callable[[], None]) -> None:
    """An executor that runs the callback at once (tests)."""
    fn()


def _post_now(executor: Executor, fn: Callable[[], None]) -> None:
    executor(fn)


class _Watch:
    __slots__ = ("watcher", "executor", "active")

    def __init__(self, watcher: ResourceWatcher, executor: Executor) -> None:
        self.watcher = watcher
        self.executor = executor
        self.active = True  # cleared on cancel: queued calls are then dropped


class _Entry:
    """One cache entry: the resource, its state and its watchers."""

    __slots__ = (
        "type_url",
        "name",
        "watches",
        "state",
        "resource",
        "raw",
        "version",
        "last_updated",
        "error",
        "ambient",
        "nack",
        "timer",
        "sent_generation",
        "seen_generation",
    )

    def __init__(self, type_url: str, name: str) -> None:
        self.type_url = type_url
        self.name = name
        self.watches: dict[int, _Watch] = {}
        self.state = CacheState.REQUESTED
        self.resource: Any = None
        self.raw: any_pb2.Any | None = None
        self.version = ""
        self.last_updated: float | None = None
        # Status given by on_resource_changed while there is no resource.
        self.error: Status | None = None
        # Last ambient error given while there is a resource.
        self.ambient: Status | None = None
        self.nack: NackInfo | None = None
        self.timer: Timer | None = None
        self.sent_generation = -1
        # Generation of the stream whose response last named this entry.
        self.seen_generation = -1

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _TypeState:
    __slots__ = ("type_url", "entries", "version", "nonce", "nack_detail", "sent_generation")

    def __init__(self, type_url: str) -> None:
        self.type_url = type_url
        self.entries: dict[str, _Entry] = {}
        self.version = ""
        self.nonce = ""
        self.nack_detail: str | None = None
        # Generation of the stream this type was last requested on.
        self.sent_generation = -1


def _short_name(resource_type: Any, type_url: str) -> str:
    short = getattr(resource_type, "short_name", None)
    return short or type_url.rsplit("/", 1)[-1]


class AdsState:
    """The ADS state of one xDS server; see the module docstring."""

    def __init__(
        self,
        server: ServerFeatures,
        node: base_pb2.Node | None,
        *,
        resource_types: Mapping[str, Any],
        clock: Clock,
        post: Post = _post_now,
        default_executor: Executor = immediate,
        wall_clock: Callable[[], float] = time.time,
        resource_timeout: float = RESOURCE_TIMEOUT,
        transient_resource_timeout: float = TRANSIENT_RESOURCE_TIMEOUT,
        data_error_handling: bool | None = None,
    ) -> None:
        self._server = server
        if data_error_handling is None:
            data_error_handling = data_error_handling_enabled()
        # A88 "Temporary environment variable protection": the new server
        # features and TP3 errors count only with the env var on (C-core).
        self._a88 = data_error_handling
        self._fail_on_data_errors = data_error_handling and server.fail_on_data_errors
        self._node = node
        self._types = resource_types
        self._clock = clock
        self._post = post
        self._default_executor = default_executor
        self._wall = wall_clock
        self._timer_is_transient = data_error_handling and server.resource_timer_is_transient_error
        if self._timer_is_transient:
            self._timeout = transient_resource_timeout
        else:
            self._timeout = resource_timeout
        self._state: dict[str, _TypeState] = {}
        self._dirty: dict[str, None] = {}
        self._tokens = 0
        self._generation = 0
        self._stream_up = False
        self._connected = False
        self._had_response = False
        self._send_node = False
        self._shut_down = False
        self._last_error: Status | None = None
        #: Optional ``(type_url, valid, invalid)`` per response (A78 metrics hook).
        self.on_resource_counts: Callable[[str, int, int], None] | None = None

    # ------------------------------------------------------------------ watches

    def add_watcher(
        self,
        type_url: str,
        name: str,
        watcher: ResourceWatcher,
        executor: Executor | None = None,
    ) -> WatchHandle:
        """Subscribe ``watcher`` to one resource (A28 "Start a new watch");
        an ``xdstp:`` name is subscribed under its canonical form
        (:func:`canonical_resource_name`)."""
        name = _canonical_or_same(name, type_url)
        ts = self._type_state(type_url)
        entry = ts.entries.get(name)
        if entry is None:
            entry = ts.entries[name] = _Entry(type_url, name)
            self._dirty[type_url] = None
            # A new name while the channel is failing (the last stream ended
            # before any response): its watchers hear that error now, not at
            # the next failure (C-core keeps the channel status for new
            # watches; A88 "Handling Transient Errors").
            entry.error = self._last_error
        self._tokens += 1
        watch = _Watch(watcher, executor or self._default_executor)
        entry.watches[self._tokens] = watch
        # A new watcher of a known resource is told at once: the resource,
        # then the ambient error if any (A88 "New Watchers Started After
        # Ambient Errors"), or the error that stands in for the resource.
        if entry.resource is not None:
            self._notify_one(watch, "changed", entry.resource)
            if entry.ambient is not None:
                self._notify_one(watch, "ambient", entry.ambient)
        elif entry.error is not None:
            self._notify_one(watch, "changed", entry.error)
        return WatchHandle(type_url, name, self._tokens)

    def remove_watcher(self, handle: WatchHandle) -> None:
        """Cancel one watch; the last one unsubscribes and drops the cache
        entry (A28 "Cancel a watch")."""
        ts = self._state.get(handle.type_url)
        if not ts:
            return
        entry = ts.entries.get(handle.name)
        if entry is None:
            return
        watch = entry.watches.pop(handle.token, None)
        if watch is None:
            return
        watch.active = False
        if not entry.watches:
            entry.cancel_timer()
            del ts.entries[handle.name]
            self._dirty[handle.type_url] = None

    @property
    def has_watchers(self) -> bool:
        return any(ts.entries for ts in self._state.values())

    # ------------------------------------------------------------------ stream events

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def had_response(self) -> bool:
        return self._had_response

    def on_stream_started(self) -> int:
        """A new ADS stream: every subscription is re-sent (last ACKed
        version, no nonce), the node with the first request."""
        self._cancel_all_timers()
        self._generation += 1
        self._stream_up = True
        self._connected = False
        self._had_response = False
        self._send_node = True
        self._dirty.clear()
        for type_url, ts in self._state.items():
            ts.nonce = ""
            ts.nack_detail = None
            if ts.entries:
                self._dirty[type_url] = None
        return self._generation

    def on_stream_connected(self) -> None:
        """The channel under the stream is connected: requests already sent
        start their resource timers (A57)."""
        if not self._stream_up or self._connected:
            return
        self._connected = True
        for ts in self._state.values():
            for entry in ts.entries.values():
                self._maybe_start_timer(entry)

    def on_stream_closed(self, status: Status, had_response: bool | None = None) -> None:
        """The current stream ended.  Before any response it is a
        connectivity error for every watcher (A57, A88); after one, routine."""
        if had_response is None:
            had_response = self._had_response
        self._stream_up = False
        self._connected = False
        self._cancel_all_timers()
        self._dirty.clear()
        if had_response:
            _log.debug("xDS server %s closed the ADS stream: %s", self._server.server_uri, status)
            return
        error = Status(
            grpc.StatusCode.UNAVAILABLE,
            f"xDS channel for server {self._server.server_uri}: xDS call failed with no "
            f"responses received; status: {status}",
        )
        if error != self._last_error:
            self._last_error = error
            _log.warning("%s", error.details)
        for ts in self._state.values():
            for entry in ts.entries.values():
                self._transient_error(entry, error)

    def take_requests(self) -> list[discovery_pb2.DiscoveryRequest]:
        """The DiscoveryRequests to send now, in order (none while no stream
        is up).  Sending them starts the resource timers of their names when
        the stream is connected."""
        if not self._stream_up or not self._dirty:
            return []
        requests = []
        dirty, self._dirty = self._dirty, {}
        for type_url in dirty:
            ts = self._state[type_url]
            if not ts.entries and ts.sent_generation != self._generation:
                continue  # never requested on this stream: nothing to withdraw
            request = discovery_pb2.DiscoveryRequest(
                type_url=type_url,
                version_info=ts.version,
                response_nonce=ts.nonce,
                resource_names=list(ts.entries),
            )
            if self._send_node and self._node is not None:
                request.node.CopyFrom(self._node)
            self._send_node = False
            if ts.nack_detail is not None:
                request.error_detail.code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
                request.error_detail.message = ts.nack_detail
                ts.nack_detail = None
            ts.sent_generation = self._generation
            requests.append(request)
            for entry in ts.entries.values():
                entry.sent_generation = self._generation
                self._maybe_start_timer(entry)
        return requests

    def on_response(self, response: discovery_pb2.DiscoveryResponse) -> None:
        """Apply one DiscoveryResponse: cache changes, watcher calls, and an
        ACK or NACK queued for :meth:`take_requests`."""
        if not self._stream_up:
            return
        self._had_response = True
        self._last_error = None
        self.on_stream_connected()
        type_url = response.type_url
        ts = self._state.get(type_url)
        if ts is None or ts.sent_generation != self._generation:
            _log.warning(
                "xDS server %s sent a response for type %s that was not requested; ignoring",
                self._server.server_uri,
                type_url,
            )
            return
        resource_type = self._types.get(type_url)
        ts.nonce = response.nonce
        ts.nack_detail = None  # this response supersedes an unsent NACK
        self._dirty[type_url] = None
        if resource_type is None:
            ts.nack_detail = f"unknown resource type {type_url}"
            return
        short = _short_name(resource_type, type_url)
        now = self._wall()
        errors: list[str] = []
        seen: set[str] = set()
        # A78 resource_updates_valid/invalid as C-core counts them: a
        # resource nobody subscribed to is not counted, valid or not
        valid = invalid = 0
        for index, wrapped in enumerate(response.resources):
            any_msg, name_hint = self._unwrap(wrapped)
            if any_msg is None:
                errors.append(f"resource index {index}: Can't decode Resource proto wrapper")
                invalid += 1
                continue
            if any_msg.type_url != type_url:
                errors.append(
                    f'resource index {index}: incorrect resource type "{any_msg.type_url}" '
                    f'(should be "{type_url}")'
                )
                invalid += 1
                continue
            try:
                result = resource_type.decode(any_msg.value)
            except Exception as exc:  # a decoder bug must not kill the stream
                _log.exception("decoding %s resource failed", short)
                result = _Failed(name_hint, f"internal error decoding resource: {exc!r}")
            # The Resource wrapper's name, when there is one, names the
            # resource (as C-core); else the decoded resource's own name.
            name = name_hint if name_hint is not None else result.name
            if name is None:
                errors.append(f"resource index {index}: {result.error or 'cannot decode'}")
                invalid += 1
                continue
            # A name sent twice is applied twice, in order (as C-core does):
            # no NACK for the repetition itself.
            if result.error is not None:
                errors.append(f"resource index {index}: {name}: {result.error}")
            try:
                name = canonical_resource_name(name, type_url)
            except ValueError:
                errors.append(f"resource index {index}: {name}: Cannot parse xDS resource name")
                invalid += 1
                continue
            seen.add(name)
            entry = ts.entries.get(name)
            if entry is None:
                continue  # not subscribed: ignore
            entry.cancel_timer()
            entry.seen_generation = self._generation
            if result.error is not None:
                invalid += 1
                self._nacked(entry, short, result.error, response.version_info, now)
            else:
                valid += 1
                self._accepted(entry, result.resource, any_msg, response.version_info, now)
        if self.on_resource_counts is not None:  # A78 resource_updates_valid/invalid
            self.on_resource_counts(type_url, valid, invalid)
        # xRFC TP3 errors only with A88 on (C-core: not even parsed when off).
        resource_errors = response.resource_errors if self._a88 else ()
        for index, resource_error in enumerate(resource_errors):
            name = resource_error.resource_name.name
            if not name:
                errors.append(f"resource_errors index {index}: resource_name unset")
                continue
            if not resource_error.error_detail.code:
                errors.append(f"resource_errors index {index}: {name}: error_detail must be non-OK")
                continue
            try:
                name = canonical_resource_name(name, type_url)
            except ValueError:
                errors.append(
                    f"resource_errors index {index}: {name}: Cannot parse xDS resource name"
                )
                continue
            seen.add(name)
            entry = ts.entries.get(name)
            if entry is not None:
                entry.cancel_timer()
                entry.seen_generation = self._generation
                self._received_error(entry, short, resource_error.error_detail, response, now)
        if getattr(resource_type, "all_resources_required_in_sotw", False):
            for entry in list(ts.entries.values()):
                if entry.name not in seen and entry.resource is not None:
                    self._deleted(entry, short, response.version_info, now)
        if errors:
            ts.nack_detail = "xDS response validation errors: [" + "; ".join(errors) + "]"
            _log.warning(
                "xDS server %s: NACKing %s version %r: %s",
                self._server.server_uri,
                short,
                response.version_info,
                ts.nack_detail,
            )
        else:
            ts.version = response.version_info

    def shutdown(self) -> None:
        """Cancel every timer; no more watcher calls."""
        self._shut_down = True
        self._stream_up = False
        self._cancel_all_timers()
        for ts in self._state.values():
            for entry in ts.entries.values():
                for watch in entry.watches.values():
                    watch.active = False  # calls already queued are dropped

    # ------------------------------------------------------------------ CSDS

    def snapshot(self) -> Iterator[EntrySnapshot]:
        """Every cache entry as CSDS shows it (A40, A88)."""
        for type_url, ts in self._state.items():
            for entry in ts.entries.values():
                yield EntrySnapshot(
                    type_url=type_url,
                    name=entry.name,
                    state=entry.state,
                    version_info=entry.version,
                    raw=entry.raw,
                    last_updated=entry.last_updated,
                    error_state=entry.nack,
                )

    def subscribed_names(self, type_url: str) -> list[str]:
        ts = self._state.get(type_url)
        return list(ts.entries) if ts else []

    def is_cached(self, type_url: str, name: str) -> bool:
        """A71's "cached": a resource, or known not to exist."""
        ts = self._state.get(type_url)
        entry = ts.entries.get(_canonical_or_same(name, type_url)) if ts else None
        return entry is not None and (
            entry.resource is not None or entry.state is CacheState.DOES_NOT_EXIST
        )

    def timer_pending(self, type_url: str, name: str) -> bool:
        ts = self._state.get(type_url)
        entry = ts.entries.get(name) if ts else None
        return entry is not None and entry.timer is not None

    # ------------------------------------------------------------------ internals

    def _type_state(self, type_url: str) -> _TypeState:
        ts = self._state.get(type_url)
        if ts is None:
            ts = self._state[type_url] = _TypeState(type_url)
        return ts

    @staticmethod
    def _unwrap(wrapped: any_pb2.Any) -> tuple[any_pb2.Any | None, str | None]:
        """The resource and the wrapper's name; (None, None) for a wrapper
        that does not parse (NACKed, as C-core)."""
        if wrapped.type_url != RESOURCE_WRAPPER_TYPE_URL:
            return wrapped, None
        inner = discovery_pb2.Resource()
        try:
            inner.ParseFromString(wrapped.value)
        except Exception:
            return None, None
        return inner.resource, (inner.name or None)

    def _accepted(
        self, entry: _Entry, resource: Any, raw: any_pb2.Any, version: str, now: float
    ) -> None:
        unchanged = entry.resource is not None and entry.resource == resource
        entry.state = CacheState.ACKED
        entry.version = version
        entry.last_updated = now
        entry.nack = None
        entry.error = None
        entry.raw = raw
        if unchanged:
            # Nothing new for watchers (TRAPS, grpc-go#6565), except that a
            # standing ambient error is now cleared (A88).
            if entry.ambient is not None:
                entry.ambient = None
                self._notify(entry, "ambient", OK_STATUS)
            return
        entry.resource = resource
        entry.ambient = None
        self._notify(entry, "changed", resource)

    def _nacked(self, entry: _Entry, short: str, error: str, version: str, now: float) -> None:
        entry.state = CacheState.NACKED
        entry.nack = NackInfo(error, version, now)
        status = Status(
            grpc.StatusCode.UNAVAILABLE,
            f"{short} resource {entry.name}: invalid resource: {error}",
        )
        self._data_error(entry, status)

    def _received_error(
        self,
        entry: _Entry,
        short: str,
        detail: Any,
        response: discovery_pb2.DiscoveryResponse,
        now: float,
    ) -> None:
        """A88 "Support for Errors Provided by the xDS server" (xRFC TP3)."""
        code = _CODES.get(detail.code, grpc.StatusCode.UNKNOWN)
        status = Status(code, f"{short} resource {entry.name}: {detail.message}")
        entry.state = CacheState.RECEIVED_ERROR
        entry.nack = NackInfo(detail.message, response.version_info, now)
        data_error = code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
        if data_error:
            self._data_error(entry, status)
        else:
            self._transient_error(entry, status)

    def _deleted(self, entry: _Entry, short: str, version: str, now: float) -> None:
        entry.state = CacheState.DOES_NOT_EXIST
        # CSDS error_state of a deletion, as C-core's (the resource's own
        # version and time stay only while it is kept).
        entry.nack = NackInfo(DOES_NOT_EXIST_DETAILS, version, now)
        status = Status(
            grpc.StatusCode.NOT_FOUND,
            f"{short} resource {entry.name} does not exist (deleted by the xDS server)",
        )
        # A88 on: ambient unless fail_on_data_errors; off: A53 decides (C-core).
        keep = not self._fail_on_data_errors if self._a88 else self._server.ignore_resource_deletion
        if keep:
            _log.warning(
                "xDS server %s deleted %s resource %s; the cached resource stays in use",
                self._server.server_uri,
                short,
                entry.name,
            )
            self._set_ambient(entry, status)
            return
        self._drop(entry)
        entry.error = status
        self._notify(entry, "changed", status)

    @staticmethod
    def _drop(entry: _Entry) -> None:
        """Forget the cached resource; CSDS then shows no resource, version
        or update time for the entry (C-core)."""
        entry.resource = None
        entry.raw = None
        entry.ambient = None
        entry.version = ""
        entry.last_updated = None

    def _data_error(self, entry: _Entry, status: Status) -> None:
        """A88 "Handling Data Errors"."""
        if entry.resource is not None and self._fail_on_data_errors:
            self._drop(entry)
        if entry.resource is not None:
            self._set_ambient(entry, status)
        elif entry.error != status:
            entry.error = status
            self._notify(entry, "changed", status)

    def _transient_error(self, entry: _Entry, status: Status) -> None:
        """A88 "Handling Transient Errors": the cache state is unchanged."""
        if entry.resource is not None:
            self._set_ambient(entry, status)
        elif entry.error != status:
            entry.error = status
            self._notify(entry, "changed", status)

    def _set_ambient(self, entry: _Entry, status: Status) -> None:
        if entry.ambient == status:
            return
        entry.ambient = status
        self._notify(entry, "ambient", status)

    def _maybe_start_timer(self, entry: _Entry) -> None:
        if (
            not self._connected
            or entry.timer is not None
            or entry.sent_generation != self._generation
            or entry.seen_generation == self._generation
            or entry.state is CacheState.DOES_NOT_EXIST
            or entry.resource is not None
        ):
            return
        generation = self._generation
        entry.timer = self._clock.call_later(
            self._timeout, lambda: self._on_timer(entry, generation)
        )

    def _on_timer(self, entry: _Entry, generation: int) -> None:
        entry.timer = None
        ts = self._state.get(entry.type_url)
        if (
            self._shut_down
            or generation != self._generation
            or not self._connected
            or ts is None
            or ts.entries.get(entry.name) is not entry
            or entry.resource is not None
            or entry.seen_generation == generation
            or entry.state is CacheState.DOES_NOT_EXIST
        ):
            return  # a timer of an older stream or a satisfied entry
        short = _short_name(self._types.get(entry.type_url), entry.type_url)
        if self._timer_is_transient:
            entry.state = CacheState.TIMEOUT
            entry.nack = NackInfo(
                f"timeout obtaining resource from xDS server {self._server.server_uri}", "", None
            )
            status = Status(
                grpc.StatusCode.UNAVAILABLE,
                f"timeout obtaining {short} resource {entry.name} from xDS server "
                f"{self._server.server_uri}",
            )
        else:
            entry.state = CacheState.DOES_NOT_EXIST
            entry.nack = NackInfo(DOES_NOT_EXIST_DETAILS, "", None)
            status = Status(
                grpc.StatusCode.NOT_FOUND, f"{short} resource {entry.name} does not exist"
            )
        _log.info("xDS server %s: %s", self._server.server_uri, status.details)
        if entry.error == status:
            return  # the same outcome again (a later stream's timer)
        entry.error = status
        self._notify(entry, "changed", status)

    def _cancel_all_timers(self) -> None:
        for ts in self._state.values():
            for entry in ts.entries.values():
                entry.cancel_timer()

    def _notify(self, entry: _Entry, kind: str, value: Any) -> None:
        for watch in list(entry.watches.values()):
            self._notify_one(watch, kind, value)

    def _notify_one(self, watch: _Watch, kind: str, value: Any) -> None:
        if self._shut_down:
            return
        watcher = watch.watcher
        if kind == "changed":

            def call() -> None:
                if watch.active:
                    watcher.on_resource_changed(value)
        else:

            def call() -> None:
                if watch.active:
                    watcher.on_ambient_error(value)

        self._post(watch.executor, call)


@dataclass(frozen=True)
class _Failed:
    """A resource its decoder failed on (a bug, logged): NACKed with ``error``."""

    name: str | None
    error: str
    resource: Any = None
