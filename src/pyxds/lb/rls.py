"""``rls_experimental``: route each RPC to the target a Route Lookup Service names.

The protocol and config are grpc/lookup/v1 ``rls.proto`` and
``rls_config.proto`` (their comments are the spec; config rules in
:mod:`pyxds.lb.rls_config`); where they are silent this follows C-core's
``rls.cc`` (and grpc-go's ``balancer/rls`` where C-core has a known flaw,
named in docs/differences-from-c-core.md).

Theory of operation
-------------------

**Keys.**  The picker builds the RPC's request key with the config's key
builders (headers, constant keys, extra keys host/service/method; the host
is the channel's authority).

**Cache.**  One entry per key: the targets of the last good response (as
child wrappers), its ``header_data``, ``data_expiration`` (response time +
``maxAge``) and ``stale_time`` (+ ``staleAge``), or the status of the last
failed lookup with ``backoff_time`` and ``backoff_expiration`` (now + twice
the backoff delay).  Sizes as C-core counts them (:func:`entry_size`); the
cache stays within ``cacheSizeBytes`` by evicting least recently used
entries (an entry younger than :data:`MIN_EXPIRATION` is never evicted, and
eviction stops at the first such entry, as C-core); every
:data:`CLEANUP_INTERVAL` entries whose data and backoff both expired are
dropped.

**Pick** (C-core ``Picker::Pick``, in this order):

1. No entry, or an entry that is stale (``stale_time`` passed) and not in
   backoff, and no lookup pending for the key: ask the throttler.
   Throttled and no valid data: the default target's child picks, else the
   RPC fails UNAVAILABLE "RLS request throttled".  Otherwise a lookup
   starts (reason ``REASON_STALE`` with the entry's ``header_data`` when its
   data is still valid, else ``REASON_MISS``).
2. Valid data: the first target whose child is not in TRANSIENT_FAILURE
   (the last one in any case) picks; a complete pick carries the
   ``x-google-rls-data: <header_data>`` header when ``header_data`` is set.
3. In backoff: the default target's child picks, else the RPC fails
   UNAVAILABLE "RLS request failed: <status>".
4. Otherwise the pick queues until the lookup answers (a new picker is
   published for every response, backoff end and child state change).

**Lookups** go to the RLS server through a channel of their own, made by
the helper (``create_route_lookup_channel``: the pyxds channel builds a
grpcio channel to ``lookupService`` with the parent channel's credentials
and authority, and ``routeLookupChannelServiceConfig``), with
``lookupServiceTimeout`` as deadline.  A response without targets fails
with INVALID_ARGUMENT "RLS response has no target entry".  A failure puts
the entry in backoff: exponential (1 s, x1.6, +-20 %, at most 120 s; the
sequence continues across the failed lookups of one entry and restarts on
success); when the backoff ends a new picker is published, so a waiting
(wait_for_ready) RPC looks up again.  When the RLS channel comes back to
READY after TRANSIENT_FAILURE every entry's backoff is reset (C-core).

**Throttling** (:class:`AdaptiveThrottler`): client-side adaptive
throttling over the last :data:`THROTTLE_WINDOW` seconds, probability
``(requests - 2 * successes) / (requests + 8)``; a throttled lookup counts
as a failed request.

**Children.**  One child policy per target (the ``childPolicy`` config with
the target in ``childPolicyConfigTargetFieldName``), shared by every cache
entry naming the target and by the default target, and shut down when the
last of them lets go.  Every parent update reaches every child.  A child
that reported TRANSIENT_FAILURE stays there (for this policy's view) until
it reports READY.  The policy reports READY if any child is READY, else
CONNECTING if any is CONNECTING, else IDLE if any is IDLE (or there is no
child), else TRANSIENT_FAILURE "no children available".

**Threads.**  Everything but the pick runs on the serializer.  The picker
reads the cache (entries publish immutable :class:`_Data` snapshots),
marks entries used (the time of use, an attribute store), registers a pending lookup
in a dict and asks the serializer to start it; the throttler's counts take
a small lock of their own (only on cache misses).  The picker object
changes with every publication, as the channel's queued picks need.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from enum import IntEnum
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.clock import Clock, Timer
from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    FailPicker,
    Helper,
    LoadBalancer,
    PickArgs,
    PickComplete,
    Picker,
    PickFail,
    PickQueue,
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
)
from pyxds.lb.child_handler import ChildPolicyHandler, DelegatingHelper
from pyxds.lb.errors import LBConfigError
from pyxds.lb.registry import PolicySelection
from pyxds.lb.rls_config import Key, RlsConfig, key_map, parse_rls_config
from pyxds.xds.backoff import ExponentialBackoff

__all__ = [
    "NAME",
    "RLS_DATA_HEADER",
    "LookupReason",
    "LookupResult",
    "RouteLookupChannel",
    "AdaptiveThrottler",
    "RlsPolicy",
    "RlsFactory",
    "entry_size",
]

_log = logging.getLogger(__name__)

NAME = "rls_experimental"
#: The header that carries a response's ``header_data`` to the target.
RLS_DATA_HEADER = "x-google-rls-data"
#: An entry is never evicted (LRU or cleanup) this soon after it was made.
MIN_EXPIRATION = 5.0
#: How often entries whose data and backoff both expired are dropped.
CLEANUP_INTERVAL = 60.0
#: Backoff of failed lookups (gRPC connection backoff's numbers, as C-core).
BACKOFF_INITIAL = 1.0
BACKOFF_MULTIPLIER = 1.6
BACKOFF_JITTER = 0.2
BACKOFF_MAX = 120.0
#: Adaptive throttling (C-core's and grpc-go's defaults).
THROTTLE_WINDOW = 30.0
THROTTLE_RATIO_FOR_SUCCESSES = 2.0
THROTTLE_PADDING = 8
#: C-core's entry size accounting (64-bit, libstdc++): a key counts twice
#: (LRU list and map), each ``sizeof(RequestKey)`` plus its strings, plus
#: ``sizeof(Entry)``.
KEY_OVERHEAD = 48
ENTRY_OVERHEAD = 160

_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_READY = ConnectivityState.READY
_CONNECTING = ConnectivityState.CONNECTING
_IDLE = ConnectivityState.IDLE
_TF = ConnectivityState.TRANSIENT_FAILURE
_NEVER = float("-inf")
_QUEUE = PickQueue()
_THROTTLED = Status(_UNAVAILABLE, "RLS request throttled")
_NO_TARGETS = Status(grpc.StatusCode.INVALID_ARGUMENT, "RLS response has no target entry")


def _used(entry: _Entry) -> float:
    return entry.used


def entry_size(key: Key) -> int:
    """A cache entry's size in bytes, as C-core counts it."""
    strings = sum(len(k.encode()) + len(v.encode()) for k, v in key_map(key).items())
    return 2 * (KEY_OVERHEAD + strings) + ENTRY_OVERHEAD


def status_text(status: Status) -> str:
    """absl's ``Status::ToString`` (``NOT_FOUND: no such key``), C-core's words."""
    return f"{status.code.name}: {status.details}"


# -- the RLS server, as the policy sees it ----------------------------------------


class LookupReason(IntEnum):
    """``RouteLookupRequest.Reason``."""

    MISS = 1
    STALE = 2


@dataclass(frozen=True, slots=True)
class LookupResult:
    """A RouteLookup RPC's outcome: OK with the response's targets and
    header data, or the RPC's (or the response parser's) failure."""

    status: Status = OK_STATUS
    targets: tuple[str, ...] = ()
    header_data: str = ""


class RouteLookupChannel(ABC):
    """A channel to the Route Lookup Service (the helper's
    ``create_route_lookup_channel(target, service_config)``).  Callbacks run
    on the channel's serializer."""

    @abstractmethod
    def lookup(
        self,
        key_map: Mapping[str, str],
        reason: LookupReason,
        stale_header_data: str,
        timeout: float,
        on_done: Callable[[LookupResult], None],
    ) -> Callable[[], None]:
        """Send one RouteLookup RPC (``target_type`` "grpc"); ``on_done``
        runs once with its result unless the returned cancel ran first."""

    @abstractmethod
    def watch_state(self, fn: Callable[[ConnectivityState], None]) -> Callable[[], None]:
        """Report the channel's connectivity changes; returns unwatch."""

    def reset_backoff(self) -> None:  # noqa: B027 - optional hook
        """End the channel's reconnect backoff early."""

    @abstractmethod
    def close(self) -> None: ...


class _FailingChannel(RouteLookupChannel):
    """Fails every lookup (the channel could not be made)."""

    def __init__(self, status: Status) -> None:
        self._result = LookupResult(status)

    def lookup(
        self,
        key_map: Mapping[str, str],
        reason: LookupReason,
        stale_header_data: str,
        timeout: float,
        on_done: Callable[[LookupResult], None],
    ) -> Callable[[], None]:
        on_done(self._result)
        return lambda: None

    def watch_state(self, fn: Callable[[ConnectivityState], None]) -> Callable[[], None]:
        return lambda: None

    def close(self) -> None:
        pass


# -- throttling ----------------------------------------------------------------------


class AdaptiveThrottler:
    """Client-side adaptive throttling of lookups (C-core's
    ``RlsChannel::Throttle``, grpc-go's ``adaptive.Throttler``).

    Over the requests of the last ``window`` seconds, a new one is throttled
    with probability ``(requests - ratio * successes) / (requests + padding)``
    (no throttling while that is <= 0); a throttled request counts as a
    request that failed.  Called from picks (any thread): its deques take a
    lock of their own.
    """

    def __init__(
        self,
        clock: Clock,
        uniform: Callable[[], float],
        window: float = THROTTLE_WINDOW,
        ratio_for_successes: float = THROTTLE_RATIO_FOR_SUCCESSES,
        padding: int = THROTTLE_PADDING,
    ) -> None:
        self._clock = clock
        self._uniform = uniform
        self._window = window
        self._ratio = ratio_for_successes
        self._padding = padding
        self._requests: deque[float] = deque()
        self._failures: deque[float] = deque()
        self._lock = threading.Lock()

    def _prune(self, now: float) -> None:
        for times in (self._requests, self._failures):
            while times and now - times[0] > self._window:
                times.popleft()

    def probability(self) -> float:
        """The current throttling probability (may be negative: none)."""
        with self._lock:
            self._prune(self._clock.now())
            requests = len(self._requests)
            successes = requests - len(self._failures)
        return (requests - successes * self._ratio) / (requests + self._padding)

    def should_throttle(self) -> bool:
        now = self._clock.now()
        with self._lock:
            self._prune(now)
            requests = len(self._requests)
            successes = requests - len(self._failures)
            p = (requests - successes * self._ratio) / (requests + self._padding)
            throttle = p > 0 and self._uniform() < p
            if throttle:
                self._requests.append(now)
                self._failures.append(now)
        return throttle

    def register_response(self, success: bool) -> None:
        now = self._clock.now()
        with self._lock:
            self._requests.append(now)
            if not success:
                self._failures.append(now)


# -- children ------------------------------------------------------------------------


class _Child(DelegatingHelper):
    """The child policy of one target, shared by the entries naming it."""

    def __init__(self, policy: RlsPolicy, target: str) -> None:
        super().__init__(policy.helper)
        self._rls = policy  # (not "policy": config dumps walk that name down the tree)
        self.target = target
        self.refs = 0
        self.state = _CONNECTING
        self.picker: Picker = QueuePicker()
        self.handler: ChildPolicyHandler | None = None
        self.selection: PolicySelection | None = None
        self.closed = False

    def configure(self, config: RlsConfig) -> None:
        """Make this target's child config (C-core ``StartUpdate``): a
        target the child policy rejects fails its picks."""
        try:
            self.selection = config.child_config(self.target)
        except LBConfigError as err:
            self.selection = None
            self.state = _TF
            self.picker = FailPicker(Status(_UNAVAILABLE, str(err)))
            if self.handler is not None:
                self.handler.shutdown()
                self.handler = None

    def update(self, update: ResolverUpdate) -> Status | None:
        """Pass the parent's update down (C-core ``MaybeFinishUpdate``)."""
        if self.selection is None or self.closed:
            return None
        if self.handler is None:
            self.handler = ChildPolicyHandler(self)
        return self.handler.update(update.replace(config=self.selection))

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if self.closed:
            return
        if self.state is _TF and state is not _READY:
            return  # sticky TRANSIENT_FAILURE (C-core, picker included)
        self.state = state
        self.picker = picker
        self._rls._child_changed()

    def request_reresolution(self) -> None:
        if not self.closed:
            self.parent.request_reresolution()

    def close(self) -> None:
        self.closed = True
        if self.handler is not None:
            self.handler.shutdown()
            self.handler = None


# -- cache entries ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Data:
    """What the picker reads of an entry, replaced whole on every change."""

    children: tuple[_Child, ...] = ()
    header_data: str = ""
    data_expiration: float = _NEVER
    stale_time: float = _NEVER
    status: Status = OK_STATUS
    backoff_time: float = _NEVER
    backoff_expiration: float = _NEVER
    #: the RLS data header for complete picks (None: no header_data)
    metadata: tuple[tuple[str, str], ...] | None = None
    #: the child of a one-target answer (the common case's fast path)
    single: _Child | None = None


_NO_DATA = _Data()
#: Bounds of the picker's key memo (per path, and paths).
KEY_MEMO_SIZE = 1024
KEY_MEMO_PATHS = 256


class _Entry:
    __slots__ = ("key", "size", "created", "used", "data", "backoff", "timer")

    def __init__(self, key: Key, now: float, used: float) -> None:
        self.key = key
        self.size = entry_size(key)
        self.created = now
        self.used = used  # LRU order: when it was last used
        self.data = _NO_DATA
        self.backoff: ExponentialBackoff | None = None
        self.timer: Timer | None = None

    def can_evict(self, now: float) -> bool:
        return self.created + MIN_EXPIRATION < now


class _Request:
    """A lookup in flight."""

    __slots__ = ("key", "channel", "backoff", "cancel")

    def __init__(self, key: Key, channel: _LookupChannel, backoff: ExponentialBackoff | None):
        self.key = key
        self.channel = channel
        self.backoff = backoff
        self.cancel: Callable[[], None] | None = None


class _LookupChannel:
    """The policy's RouteLookupChannel, its state watch and its lookups
    in flight (a replaced channel closes when its last lookup ends)."""

    def __init__(self, policy: RlsPolicy, channel: RouteLookupChannel, key: tuple[str, Any]):
        self.channel = channel
        self.key = key
        self.in_flight = 0
        self.retired = False
        self.was_failing = False
        self._policy = policy
        self._unwatch = channel.watch_state(self._on_state)

    def _on_state(self, state: ConnectivityState) -> None:
        if self.retired:
            return
        if state is _TF:
            self.was_failing = True
        elif state is _READY and self.was_failing:
            # Lookups that failed while the RLS server was unreachable do not
            # keep their entries in backoff (C-core's StateWatcher).
            self.was_failing = False
            self._policy._reset_all_backoff()

    def retire(self) -> None:
        self.retired = True
        self._unwatch()
        if self.in_flight == 0:
            self.channel.close()

    def finished(self) -> None:
        self.in_flight -= 1
        if self.retired and self.in_flight == 0:
            self.channel.close()


# -- the picker ----------------------------------------------------------------------


class RlsPicker(Picker):
    """Picks through the policy's cache (module docstring, "Pick").  A new
    object per publication; the state it reads is the policy's.

    The hit path is short: the request key comes from a memo of the RPC's
    (path, metadata) when the metadata repeats (built, and remembered,
    otherwise), and a fresh entry's one target picks at once."""

    __slots__ = ("_policy", "_build", "_host", "_cache", "_pending", "_now", "_memo", "_default")

    def __init__(self, policy: RlsPolicy) -> None:
        config = policy.config
        assert config is not None
        self._policy = policy
        self._build = config.route_lookup.key_builders.build
        self._host = policy.authority
        self._cache = policy.cache
        self._pending = policy.pending
        self._now = policy.helper.clock.now
        self._memo = policy.key_memo
        self._default = policy.default_child

    def pick(self, args: PickArgs) -> PickResult:
        metadata = args.metadata
        by_metadata = self._memo.get(args.path)
        key = None
        if by_metadata is not None:
            try:
                key = by_metadata.get(metadata)
            except TypeError:  # a list, not a tuple: no memo
                pass
        if key is None:
            key = self._key(args.path, metadata)
        now = self._now()
        entry = self._cache.get(key)
        if entry is not None:
            data = entry.data
            entry.used = now
            if data.stale_time >= now:  # fresh (then valid too): no lookup
                single = data.single
                if single is None:
                    return _pick_target(data, args)
                result = single.picker.pick(args)
                if data.metadata is None:
                    return result
                return _with_header(result, data.metadata)
        else:
            data = _NO_DATA
        if (
            entry is None or (data.stale_time < now and data.backoff_time < now)
        ) and key not in self._pending:
            policy = self._policy
            if policy.throttler.should_throttle() and data.data_expiration < now:
                return self._default_or_fail(args, _THROTTLED)
            policy.request_lookup(key)
        if entry is not None:
            if data.data_expiration >= now:
                return _pick_target(data, args)
            if data.backoff_time >= now:
                return self._default_or_fail(
                    args, Status(_UNAVAILABLE, f"RLS request failed: {status_text(data.status)}")
                )
        return _QUEUE

    def _key(self, path: str, metadata: Any) -> Key:
        """Build the key, and remember it for this (path, metadata)."""
        key = self._build(path, metadata, self._host)
        memo = self._memo
        by_metadata = memo.get(path)
        if by_metadata is None:
            if len(memo) >= KEY_MEMO_PATHS:
                memo.clear()
            by_metadata = memo.setdefault(path, {})
        if len(by_metadata) >= KEY_MEMO_SIZE:
            by_metadata.clear()
        try:
            by_metadata[metadata] = key
        except TypeError:  # unhashable metadata (a list): not remembered
            pass
        return key

    def _default_or_fail(self, args: PickArgs, status: Status) -> PickResult:
        default = self._default
        if default is not None:
            return default.picker.pick(args)
        return PickFail(status)

    def __repr__(self) -> str:
        return f"RlsPicker(entries={len(self._cache)}, pending={len(self._pending)})"


def _pick_target(data: _Data, args: PickArgs) -> PickResult:
    """Delegate to the first target not in TRANSIENT_FAILURE (the last one
    anyway), adding the RLS data header to a complete pick."""
    children = data.children
    child = children[-1]
    for candidate in children:
        if candidate.state is not _TF:
            child = candidate
            break
    result = child.picker.pick(args)
    if data.metadata is None:
        return result
    return _with_header(result, data.metadata)


def _with_header(result: PickResult, metadata: tuple[tuple[str, str], ...]) -> PickResult:
    """A complete pick carries the RLS data header (C-core: only those)."""
    if isinstance(result, PickComplete):
        return PickComplete(
            result.subchannel,
            result.on_call_done,
            result.on_call_trailers,
            result.attempt_labels,
            _with_metadata(result.metadata, metadata),
        )
    return result


def _with_metadata(
    existing: tuple[tuple[str, str], ...] | None, ours: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    if not existing:
        return ours
    return (*(kv for kv in existing if kv[0] != RLS_DATA_HEADER), *ours)


# -- the policy ----------------------------------------------------------------------


class RlsPolicy(LoadBalancer):
    """See the module docstring."""

    name = NAME

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self.config: RlsConfig | None = None
        #: read by pickers on RPC threads (module docstring, "Threads")
        self.cache: dict[Key, _Entry] = {}
        self.pending: dict[Key, object] = {}  # a _Request, or a pick's claim
        #: path -> metadata -> key, for the pickers (RlsPicker); new per config
        self.key_memo: dict[str, dict[Any, Key]] = {}
        self.throttler = AdaptiveThrottler(helper.clock, helper.random.random)
        self.default_child: _Child | None = None
        self.authority: str = getattr(helper, "channel_authority", "") or ""
        self.children: dict[str, _Child] = {}
        self.cache_bytes = 0
        self._size_limit = 0
        self._update: ResolverUpdate | None = None
        self._channel: _LookupChannel | None = None
        self._cleanup: Timer | None = None
        self._updating = False
        self._shut_down = False
        self._schedule_cleanup()

    # -- LoadBalancer ----------------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shut_down:
            return None
        config: RlsConfig = update.config
        old = self.config
        if isinstance(update.endpoints, Status) and self._update is not None:
            update = update.replace(endpoints=self._update.endpoints)  # keep the last good
        self.config = config
        if old is None or old.route_lookup.key_builders != config.route_lookup.key_builders:
            self.key_memo = {}
        self._update = update
        self._updating = True
        errors: list[str] = []
        try:
            rlc = config.route_lookup
            child_config_changed = (
                old is None
                or old.child_policy != config.child_policy
                or old.target_field != config.target_field
            )
            if old is None or old.route_lookup.default_target != rlc.default_target:
                previous = self.default_child
                self.default_child = self._ref(rlc.default_target) if rlc.default_target else None
                if previous is not None:
                    self._unref(previous)
            channel_key = (rlc.lookup_service, config.channel_service_config)
            if self._channel is None or self._channel.key != channel_key:
                self._open_channel(channel_key)
            if old is None or old.route_lookup.cache_size_bytes != rlc.cache_size_bytes:
                self._size_limit = rlc.cache_size_bytes
                self._shrink(self._size_limit)
            for child in list(self.children.values()):
                if child_config_changed or child.handler is None:
                    child.configure(config)
                status = child.update(update)
                if status is not None and not status.ok:
                    errors.append(f"target {child.target}: {status_text(status)}")
        finally:
            self._updating = False
        self._publish()
        if errors:
            return Status(_UNAVAILABLE, f"errors from children: [{'; '.join(errors)}]")
        return None

    def resolver_error(self, status: Status) -> None:
        if self.config is None:
            self.helper.update_state(_TF, status, FailPicker(status))
            return
        self._updating = True
        try:
            for child in list(self.children.values()):
                if child.handler is not None:
                    child.handler.resolver_error(status)
        finally:
            self._updating = False
        self._publish()

    def exit_idle(self) -> None:
        for child in list(self.children.values()):
            if child.handler is not None:
                child.handler.exit_idle()

    def reset_backoff(self) -> None:
        if self._channel is not None:
            self._channel.channel.reset_backoff()
        self._reset_all_backoff()
        for child in list(self.children.values()):
            if child.handler is not None:
                child.handler.reset_backoff()

    def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        if self._cleanup is not None:
            self._cleanup.cancel()
        for request in list(self.pending.values()):
            if isinstance(request, _Request) and request.cancel is not None:
                request.cancel()
                request.channel.finished()
        self.pending.clear()
        for entry in list(self.cache.values()):
            self._drop(entry)
        self.cache.clear()
        if self._channel is not None:
            self._channel.retire()
            self._channel = None
        self.default_child = None
        for child in list(self.children.values()):
            child.close()
        self.children.clear()

    # -- introspection ---------------------------------------------------------
    def config_dump(self) -> dict[str, Any]:
        """The cache, pending lookups and targets' states (``channel.config_dump()``
        adds the targets' child policies, from ``children``)."""
        now = self.helper.clock.now()
        entries = []
        for entry in list(self.cache.values()):
            data = entry.data
            entries.append(
                {
                    "key": key_map(entry.key),
                    "targets": [c.target for c in data.children],
                    "header_data": data.header_data,
                    "valid": data.data_expiration >= now,
                    "stale": data.stale_time < now,
                    "status": "OK" if data.status.ok else status_text(data.status),
                    "in_backoff": data.backoff_time >= now,
                    "size": entry.size,
                }
            )
        return {
            "lookup_service": self.config.route_lookup.lookup_service if self.config else "",
            "cache_bytes": self.cache_bytes,
            "cache_size_limit": self._size_limit,
            "entries": entries,
            "pending": [key_map(k) for k in list(self.pending)],
            "targets": {t: c.state.name for t, c in self.children.items()},
            "default_target": self.default_child.target if self.default_child else "",
        }

    # -- children --------------------------------------------------------------
    def _ref(self, target: str) -> _Child:
        child = self.children.get(target)
        if child is None:
            child = self.children[target] = _Child(self, target)
            assert self.config is not None and self._update is not None
            child.configure(self.config)
            child.refs += 1
            status = child.update(self._update)
            if status is not None and not status.ok:
                # C-core: ask for re-resolution when a new child rejects its update
                self.helper.request_reresolution()
            return child
        child.refs += 1
        return child

    def _unref(self, child: _Child) -> None:
        child.refs -= 1
        if child.refs <= 0 and self.children.get(child.target) is child:
            del self.children[child.target]
            child.close()

    def _child_changed(self) -> None:
        if not self._updating:
            self._publish()

    def _publish(self) -> None:
        if self._updating or self._shut_down or self.config is None:
            return
        state, status = _IDLE, OK_STATUS
        if self.children:
            states = {child.state for child in self.children.values()}
            if _READY in states:
                state = _READY
            elif _CONNECTING in states:
                state = _CONNECTING
            elif _IDLE not in states:
                state, status = _TF, Status(_UNAVAILABLE, "no children available")
        self.helper.update_state(state, status, RlsPicker(self))

    # -- lookups ---------------------------------------------------------------
    def request_lookup(self, key: Key) -> None:
        """From a pick (any thread): claim the key (the first pick to claim
        it wins) and have the serializer start its lookup."""
        claim = object()
        if self.pending.setdefault(key, claim) is claim:
            self.helper.clock.call_later(0, lambda: self._start_lookup(key, claim))

    def _start_lookup(self, key: Key, claim: object) -> None:
        if self._shut_down or self.pending.get(key) is not claim:
            return
        channel = self._channel
        config = self.config
        if channel is None or config is None:
            self.pending.pop(key, None)
            return
        now = self.helper.clock.now()
        entry = self.cache.get(key)
        reason = LookupReason.MISS
        stale_header = ""
        backoff = None
        if entry is not None:
            # The entry's backoff sequence continues (grpc-go, grpc-java;
            # C-core restarts it for a miss: docs/differences-from-c-core.md).
            backoff, entry.backoff = entry.backoff, None
            if entry.data.data_expiration >= now:
                reason = LookupReason.STALE
                stale_header = entry.data.header_data
        request = _Request(key, channel, backoff)
        self.pending[key] = request
        channel.in_flight += 1
        try:
            request.cancel = channel.channel.lookup(
                key_map(key),
                reason,
                stale_header,
                config.route_lookup.lookup_service_timeout,
                lambda result: self._on_lookup_done(request, result),
            )
        except Exception as err:  # a broken channel is a failed lookup, never a crash
            _log.exception("rls: lookup could not start")
            self._on_lookup_done(request, LookupResult(Status(_UNAVAILABLE, str(err))))

    def _on_lookup_done(self, request: _Request, result: LookupResult) -> None:
        request.channel.finished()
        if self._shut_down or self.pending.get(request.key) is not request:
            return
        del self.pending[request.key]
        status = result.status
        if status.ok and not result.targets:
            status = _NO_TARGETS
        self.throttler.register_response(status.ok)
        entry = self._find_or_insert(request.key)
        now = self.helper.clock.now()
        if not status.ok:
            backoff = request.backoff or entry.backoff or self._new_backoff()
            entry.backoff = backoff
            delay = backoff.next_delay()
            old = entry.data
            entry.data = _Data(
                old.children,
                old.header_data,
                old.data_expiration,
                old.stale_time,
                status,
                now + delay,
                now + 2 * delay,
                old.metadata,
                old.single,
            )
            if entry.timer is not None:
                entry.timer.cancel()
            entry.timer = self.helper.clock.call_later(delay, lambda: self._backoff_over(entry))
            self._publish()
            return
        rlc = self.config.route_lookup if self.config is not None else None
        max_age = rlc.max_age if rlc is not None else 0.0
        stale_age = rlc.stale_age if rlc is not None else 0.0
        entry.backoff = None
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        old_children = entry.data.children
        if tuple(c.target for c in old_children) == result.targets:
            children = old_children
        else:
            self._updating = True  # new children report once, in the publication below
            try:
                children = tuple(self._ref(t) for t in result.targets)
            finally:
                self._updating = False
        header = result.header_data
        entry.data = _Data(
            children,
            header,
            now + max_age,
            now + stale_age,
            OK_STATUS,
            metadata=((RLS_DATA_HEADER, header),) if header else None,
            single=children[0] if len(children) == 1 else None,
        )
        if children is not old_children:
            for child in old_children:
                self._unref(child)
        self._publish()  # queued picks of this key go on

    def _new_backoff(self) -> ExponentialBackoff:
        return ExponentialBackoff(
            self.helper.random,
            initial=BACKOFF_INITIAL,
            multiplier=BACKOFF_MULTIPLIER,
            jitter=BACKOFF_JITTER,
            maximum=BACKOFF_MAX,
        )

    def _backoff_over(self, entry: _Entry) -> None:
        entry.timer = None
        if not self._shut_down and self.cache.get(entry.key) is entry:
            self._publish()  # queued wait_for_ready RPCs pick (and look up) again

    def _reset_all_backoff(self) -> None:
        for entry in list(self.cache.values()):
            data = entry.data
            if entry.timer is not None:
                entry.timer.cancel()
                entry.timer = None
            if data.backoff_time != _NEVER:
                entry.data = _Data(
                    data.children,
                    data.header_data,
                    data.data_expiration,
                    data.stale_time,
                    data.status,
                    _NEVER,
                    data.backoff_expiration,
                    data.metadata,
                    data.single,
                )
        self._publish()

    def _open_channel(self, key: tuple[str, Any]) -> None:
        factory = getattr(self.helper, "create_route_lookup_channel", None)
        old = self._channel
        self._channel = None
        if old is not None:
            old.retire()
        channel: RouteLookupChannel
        try:
            if factory is None:
                raise RuntimeError("the channel offers no Route Lookup Service channel")
            channel = factory(key[0], key[1])
        except Exception as err:
            _log.warning("rls: cannot reach %s: %s", key[0], err)
            channel = _FailingChannel(Status(_UNAVAILABLE, f"RLS channel to {key[0]}: {err}"))
        self._channel = _LookupChannel(self, channel, key)

    # -- the cache -------------------------------------------------------------
    def _find_or_insert(self, key: Key) -> _Entry:
        now = self.helper.clock.now()
        entry = self.cache.get(key)
        if entry is not None:
            entry.used = now
            return entry
        entry = _Entry(key, now, now)
        self._shrink(self._size_limit - min(self._size_limit, entry.size))
        self.cache[key] = entry
        self.cache_bytes += entry.size
        return entry

    def _shrink(self, limit: int) -> None:
        """Evict least recently used entries until the cache fits ``limit``
        bytes, stopping at an entry too young to evict (C-core)."""
        if self.cache_bytes <= limit:
            return
        now = self.helper.clock.now()
        while self.cache_bytes > limit and self.cache:
            oldest = min(self.cache.values(), key=_used)
            if not oldest.can_evict(now):
                break
            self._evict(oldest)

    def _evict(self, entry: _Entry) -> None:
        if self.cache.pop(entry.key, None) is entry:
            self.cache_bytes -= entry.size
            self._drop(entry)

    def _drop(self, entry: _Entry) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        children = entry.data.children
        entry.data = _NO_DATA
        for child in children:
            self._unref(child)

    def _schedule_cleanup(self) -> None:
        self._cleanup = self.helper.clock.call_later(CLEANUP_INTERVAL, self._on_cleanup)

    def _on_cleanup(self) -> None:
        if self._shut_down:
            return
        now = self.helper.clock.now()
        for entry in list(self.cache.values()):
            data = entry.data
            if (
                data.data_expiration < now
                and data.backoff_expiration < now
                and entry.can_evict(now)
            ):
                self._evict(entry)
        self._schedule_cleanup()


class RlsFactory(PolicyFactory):
    name = NAME

    def parse_config(self, json_config: Any) -> RlsConfig:
        return parse_rls_config(json_config)

    def build(self, helper: Helper) -> RlsPolicy:
        return RlsPolicy(helper)


registry.register(RlsFactory())
