"""``xds_override_host_experimental``: stateful session affinity in the LB
tree (gRFC A55 "LB Policy for Stateful Session Affinity", as changed by A75
"Stateful Session Affinity Changes"; C-core's xds_override_host.cc).

Place: the cds policy builds ``outlier_detection -> xds_cluster_impl ->
xds_override_host -> priority`` for every leaf cluster (A75, as C-core),
so every RPC is load reported and counted by outlier detection, and a
session holds across the cluster's priorities.  An ejection reaches the
policies below this one, not the session picks (OverrideHostSubchannel).
Config: ``{"clusterName": NAME, "childPolicy": [...]}``; the rest comes from
the cluster in the ``xds_config`` attribute: ``override_host_statuses``
(EDS health statuses a session may stay on, A55) and ``idle_timeout``
(A75: how long a subchannel no child uses is kept for sessions).

Theory of operation
-------------------

* The address map (A55 ``address_map``): every address of every endpoint
  of the update, keyed ``"host:port"``, with the endpoint's EDS health
  status, its *address list* (this address first, then the endpoint's other
  addresses, comma-joined: what the cookie carries, A61), the endpoint's
  attributes, the subchannel (if any) and its state, and ``last_used`` (the
  last time a session's pick landed on it).  A DRAINING endpoint is left
  out unless DRAINING is in ``override_host_statuses``.  The map is
  replaced, never mutated, on an update (pickers read it on RPC threads);
  an entry's fields are single-value writes.
* The child (the cluster's priority policy) never sees a DRAINING endpoint:
  no new session lands on it (A55).
* Every subchannel the child creates is wrapped (:class:`OverrideHostSubchannel`)
  and recorded in its address's entry (the newest one wins).  When the child
  shuts one down, the policy keeps it (*owns* it) if a session used it
  within ``idle_timeout``; otherwise it is closed.  An owned subchannel is
  closed when its endpoint leaves the update, when the child makes a new
  one for the address, or by the sweep: a timer armed while the policy
  owns a subchannel, due when the least recently used one reaches
  ``idle_timeout`` (at least 5 s between sweeps), closes owned subchannels
  idle for longer than ``idle_timeout`` (A75; C-core keeps its timer armed
  even when it owns nothing, which changes nothing it does).
* The picker (A75's pseudo-code): with the call attribute
  :data:`OVERRIDE_HOST_ATTRIBUTE` (an :class:`OverrideHostAttribute` set by
  the stateful session filter) holding the cookie's addresses, it walks
  them in order, skipping addresses not in the map or whose health status
  is not in ``override_host_statuses``: the first READY subchannel is the
  pick (its ``last_used`` is set, and the attribute's
  ``actual_address_list`` is the entry's address list).  Else an IDLE one
  is asked to connect and the pick queues; else a CONNECTING one queues the
  pick; else an entry without a subchannel gets one created (owned) and
  the pick queues.  Otherwise (no cookie, no usable address: gone,
  TRANSIENT_FAILURE, not overridable) the child picks; when the RPC has the
  attribute, the picked endpoint's address list is written into it so the
  filter can set the cookie.
* The child's pick names our wrapper (or, in a tree with outlier_detection
  below this policy, a no-op outlier_detection wrapper around it): the
  picker hands the parent the subchannel it wrapped, so
  ``xds_cluster_impl`` still counts the call by locality.  Mapped results
  of a child picker's constant results are memoized (no allocation on the
  common path, as outlier_detection does).  When every result of the
  child's READY picker is a plain pick of our wrapper (round_robin over
  this cluster's endpoints, no callbacks, no labels), an RPC without the
  session attribute is picked by the child's own rotation mapped in C to
  the wrappers' constant results (``_plain_stream``): the same result the
  full path gives, with no Python frame below this picker's.  That map is
  made by the picker's first such pick, not when it is built: N endpoints
  connecting publish N pickers, most never picked from.  An RPC with
  the attribute always takes the full path (the cookie, A55/A60), on the
  same rotation.
* State: the child's, unchanged.  An owned subchannel's state change
  publishes a new picker (queued session picks wait on it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyxds._values import dataclass
from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    OVERRIDE_HOST_ATTRIBUTE,
    ConnectivityState,
    Endpoint,
    FailPicker,
    Helper,
    PickArgs,
    PickComplete,
    Picker,
    PickQueue,
    PickResult,
    PolicyFactory,
    ResolverUpdate,
    Status,
    Subchannel,
)
from pyxds.lb.child_handler import ChildPolicyHandler, DelegatingHelper, OneChildPolicy
from pyxds.lb.errors import LBConfigError, expect_object, expect_string
from pyxds.lb.outlier_detection import OutlierDetectionSubchannel
from pyxds.lb.registry import PolicySelection
from pyxds.lb.subchannel_wrapper import SubchannelWrapper
from pyxds.lb.unwatch import Watched
from pyxds.resolver.xds_config import cluster_entry

__all__ = [
    "NAME",
    "OVERRIDE_HOST_ATTRIBUTE",
    "HEALTH_STATUS_ATTRIBUTE",
    "MIN_SWEEP_INTERVAL",
    "OverrideHostAttribute",
    "OverrideHostConfig",
    "OverrideHostPicker",
    "OverrideHostSubchannel",
    "XdsOverrideHostPolicy",
]

_log = logging.getLogger(__name__)

NAME = "xds_override_host_experimental"
#: ``Endpoint.attributes`` key of the EDS health status name (cds sets it)
HEALTH_STATUS_ATTRIBUTE = "health_status"
#: A75: at least this long between two sweeps of owned subchannels
MIN_SWEEP_INTERVAL = 5.0
DEFAULT_IDLE_TIMEOUT = 3600.0
DEFAULT_STATUSES = frozenset({"UNKNOWN", "HEALTHY"})

_READY = ConnectivityState.READY
_IDLE = ConnectivityState.IDLE
_CONNECTING = ConnectivityState.CONNECTING
_QUEUE = PickQueue()


class OverrideHostAttribute:
    """One RPC's session (A55/A60 ``XdsOverrideHostAttribute``): the address
    list from its cookie (``cookie_address_list``, comma-separated, "" when
    the RPC has no usable cookie) and, after a pick, the address list of the
    endpoint picked (``actual_address_list``, written by the picker).
    Made per RPC by the stateful session filter; the picker of each attempt
    writes it (retries of one RPC pick one after the other)."""

    __slots__ = ("cookie_address_list", "cookie_addresses", "actual_address_list")

    def __init__(self, cookie_address_list: str = "") -> None:
        self.cookie_address_list = cookie_address_list
        self.cookie_addresses: tuple[str, ...] = (
            tuple(cookie_address_list.split(",")) if cookie_address_list else ()
        )
        self.actual_address_list = ""

    def __repr__(self) -> str:
        return (
            f"OverrideHostAttribute(cookie={self.cookie_address_list!r}, "
            f"actual={self.actual_address_list!r})"
        )


@dataclass(frozen=True)
class OverrideHostConfig:
    """The policy's config: the cluster (whose ``xds_config`` entry gives the
    session statuses and idle timeout) and the child policy."""

    cluster_name: str
    child_policy: PolicySelection


class _Entry:
    """One address of the map (module docstring)."""

    __slots__ = ("address", "health", "address_list", "attributes", "subchannel", "last_used")

    def __init__(self, address: str) -> None:
        self.address = address
        self.health = "UNKNOWN"
        self.address_list = address
        self.attributes: Mapping[str, Any] = {}
        self.subchannel: OverrideHostSubchannel | None = None
        self.last_used = -math.inf

    @property
    def state(self) -> ConnectivityState | None:
        sub = self.subchannel
        return sub.state if sub is not None else None


class OverrideHostSubchannel(Watched, SubchannelWrapper):
    """What the child sees instead of its parent's subchannel.  It watches
    the real subchannel once (its entry's state) and forwards the reports to
    the child's watchers.  ``owned``: the policy keeps it for sessions after
    the child let go of it.

    Over an outlier_detection wrapper (cds's A75 tree puts outlier_detection
    above this policy) it watches twice, as C-core's does: the connectivity
    (``watch_connectivity``: every real report, ejected or not) is its
    entry's ``state``, what session picks read (A55/A75: a session stays on
    an ejected endpoint); the health (``watch_state``: TRANSIENT_FAILURE
    while ejected) is what the child sees,
    so the cluster's policy stops picking an ejected endpoint (``_health``,
    ``_health_status``: its last report)."""

    __slots__ = (
        "real",
        "address",
        "entry",
        "owned",
        "state",
        "result",
        "_status",
        "_policy",
        "_unwatch",
        "_closed",
        "_health",
        "_health_status",
    )

    def __init__(self, real: Subchannel, policy: XdsOverrideHostPolicy) -> None:
        self.real = real
        self.address = real.address
        self.entry: _Entry | None = None
        self.owned = False
        self.state = ConnectivityState.IDLE
        self._status = OK_STATUS
        #: the pick of a session landing here (constant: no allocation per pick)
        self.result = PickComplete(real)
        self._policy = policy
        self._watchers = None
        self._closed = False
        self._unwatch: Callable[[], None] | None = None
        #: the last health report's state when the connectivity is watched
        #: apart (over outlier_detection), else None (two slots, not a tuple
        #: per report: issue 18's objects per endpoint)
        self._health: ConnectivityState | None = None
        self._health_status = OK_STATUS
        connectivity = getattr(real, "watch_connectivity", None)
        if connectivity is not None:
            self._health = ConnectivityState.IDLE
            connectivity(self)
        self._unwatch = real.watch_state(self)

    # -- Subchannel (the child's side) ---------------------------------------
    def watch_state(self, fn: Callable[[ConnectivityState, Status], None]) -> Callable[[], None]:
        unwatch = self._add_watcher(fn)
        health = self._health
        if health is None:
            fn(self.state, self._status)
        else:
            fn(health, self._health_status)
        return unwatch

    def shutdown(self) -> None:
        """The child lets go: the policy keeps it for sessions or closes it."""
        self._watchers = None
        if not self._closed:
            self._policy._released(self)

    # -- the policy's side ---------------------------------------------------
    def __call__(
        self, state: ConnectivityState, status: Status, healthy: bool | None = None
    ) -> None:
        """A report, one call each (the wrapper is the real subchannel's
        watcher: no bound method per endpoint, issue 18).  ``healthy`` None:
        the real subchannel's report, both the entry's ``state`` and what
        the child hears; over outlier_detection, its health report alone.
        False or True (:meth:`connectivity_changed`): outlier_detection's
        connectivity report (ejected or not), the entry's state for session
        picks; True: the endpoint is not ejected, so this is the health
        report too."""
        if self._closed:
            return
        health = self._health
        if healthy is not None or health is None:  # the connectivity
            changed = state is not self.state
            self.state = state
            self._status = status
            if health is None:  # watched once: the child hears it first
                self._notify(state, status)
            if changed and self.owned:
                self._policy._owned_state_changed(self)
            if not healthy or self._closed:
                return
        self._health = state
        self._health_status = status
        self._notify(state, status)

    #: outlier_detection's connectivity watch (``watch_connectivity``) calls
    #: this with ``healthy`` False or True
    connectivity_changed = __call__

    def close(self) -> None:
        """Close the real subchannel (the policy no longer needs it)."""
        if self._closed:
            return
        self._closed = True
        self._watchers = None
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
        if self._health is not None:
            self.real.watch_connectivity(None)  # type: ignore[attr-defined]
        self.real.shutdown()

    def __repr__(self) -> str:
        tag = " owned" if self.owned else ""
        return f"OverrideHostSubchannel({self.address}, {self.state.name}{tag})"


def _unwrap(result: PickComplete) -> tuple[PickComplete, OverrideHostSubchannel | None]:
    """The child's pick with our wrapper (and a no-op outlier_detection
    wrapper above it) replaced by the parent's subchannel."""
    sub = result.subchannel
    if sub.__class__ is OutlierDetectionSubchannel:
        sub = sub.real  # type: ignore[attr-defined]
    if sub.__class__ is not OverrideHostSubchannel:
        return result, None
    assert isinstance(sub, OverrideHostSubchannel)
    mapped = PickComplete(
        sub.real, result.on_call_done, result.on_call_trailers, result.attempt_labels
    )
    return mapped, sub


_MEMO_LIMIT = 4096


def _plain_result(result: PickResult) -> PickComplete | None:
    """What :meth:`OverrideHostPicker.pick` hands the parent for the child's
    ``result`` of an RPC without a session, when that is our wrapper's
    constant result (a plain pick of our wrapper); None otherwise."""
    if result.__class__ is not PickComplete:
        return None
    assert isinstance(result, PickComplete)
    sub: Any = result.subchannel
    if sub.__class__ is OutlierDetectionSubchannel:
        sub = sub.real
    if (
        sub.__class__ is OverrideHostSubchannel
        and result.on_call_done is None
        and result.on_call_trailers is None
        and result.attempt_labels is None
    ):
        return sub.result  # type: ignore[no-any-return]
    return None


def _plain_stream(child: Picker) -> Callable[[], PickResult] | None:
    """A picker-build-time shortcut for RPCs without a session: when the
    child offers a :meth:`~pyxds.lb.api.Picker.result_stream` over a fixed
    tuple of results (round_robin's READY picker) and every one is a plain
    pick of our wrapper, that stream mapped in C (``map`` of ``id`` then of
    a dict of each result's wrapper's constant result); its ``__next__`` is
    that RPC's pick.  It advances the child's own rotation, so picks with a
    session (through ``child.pick``) share it.  A stream result that is not
    one of the tuple's raises KeyError (the channel fails that pick as a
    picker error): never a silently different result.  None otherwise (the
    full ``pick`` runs)."""
    results = getattr(child, "results", None)
    if not isinstance(results, tuple) or not results:
        return None
    # asked first: a child without a stream (weighted_round_robin's picker)
    # must not cost a pass over its N results per picker (issue 18: N
    # endpoints connecting publish N pickers)
    stream = child.result_stream()
    if stream is None:
        return None
    mapped: dict[int, PickResult] = {}
    for result in results:
        plain = _plain_result(result)
        if plain is None:
            return None
        mapped[id(result)] = plain
    # the child picker (ours for as long as this picker lives) keeps every
    # result alive, so their ids stay theirs
    return map(mapped.__getitem__, map(id, stream)).__next__


class OverrideHostPicker(Picker):
    """Sessions first, then the child's picker (module docstring)."""

    __slots__ = ("_policy", "_child", "_statuses", "_now", "_memo", "_plain_next", "_unmapped")

    def __init__(
        self,
        policy: XdsOverrideHostPolicy,
        child: Picker,
        statuses: frozenset[str],
        now: Callable[[], float],
    ) -> None:
        self._policy = policy
        self._child = child
        self._statuses = statuses
        self._now = now
        # id(child result) -> (child result, mapped result, wrapper)
        self._memo: dict[int, tuple[PickComplete, PickComplete, Any]] = {}
        #: the next pick of an RPC without a session, when ``pick`` maps
        #: every pick of the child to a constant (see :func:`_plain_stream`);
        #: made by the first such pick, not here (``_unmapped``): N endpoints
        #: connecting publish N pickers, most never picked from, and making
        #: the map is a pass over the child's N results (issue 18: O(N^2)
        #: Python while 1000 endpoints connect)
        self._plain_next: Callable[[], PickResult] | None = None
        self._unmapped = True

    @property
    def child(self) -> Picker:
        return self._child

    def pick(self, args: PickArgs) -> PickResult:
        session = args.call_attributes.get(OVERRIDE_HOST_ATTRIBUTE)
        if session is None:
            plain = self._plain_next
            if plain is not None:
                return plain()  # what the lines below give, without their frames
            if self._unmapped:
                # the first pick without a session: map the child's results
                # once (racing picks may both map them: the same stream)
                self._unmapped = False
                plain = self._plain_next = _plain_stream(self._child)
                if plain is not None:
                    return plain()
        elif session.cookie_addresses:
            overridden = self._pick_session(session)
            if overridden is not None:
                return overridden
        picked = self._child.pick(args)
        if picked.__class__ is not PickComplete:
            return picked
        result: PickComplete = picked  # type: ignore[assignment]  # the class test above
        mapped: PickComplete
        sub: Any = result.subchannel
        if sub.__class__ is OutlierDetectionSubchannel:
            sub = sub.real
        if (
            sub.__class__ is OverrideHostSubchannel
            and result.on_call_done is None
            and result.on_call_trailers is None
            and result.attempt_labels is None
        ):
            # A plain pick maps to the wrapper's own constant result: nothing
            # to remember (a memo entry per endpoint per picker, built again
            # by every new picker, was GC churn at 10k endpoints: issue 18).
            # (_plain_result's test, inline: this runs per pick of a child
            # without a plain stream, e.g. weighted_target over localities.)
            mapped = sub.result
        else:
            memo = self._memo.get(id(result))
            if memo is not None and memo[0] is result:
                mapped, sub = memo[1], memo[2]
            else:
                mapped, sub = _unwrap(result)
                if len(self._memo) < _MEMO_LIMIT:
                    self._memo[id(result)] = (result, mapped, sub)
        if session is not None:
            entry = sub.entry if sub is not None else None
            if entry is not None:
                entry.last_used = self._now()
                session.actual_address_list = entry.address_list
            else:
                session.actual_address_list = mapped.subchannel.address
        return mapped

    def _pick_session(self, session: OverrideHostAttribute) -> PickResult | None:
        entries = self._policy._map
        statuses = self._statuses
        idle: OverrideHostSubchannel | None = None
        connecting = False
        bare: _Entry | None = None
        for address in session.cookie_addresses:
            entry = entries.get(address)
            if entry is None or entry.health not in statuses:
                continue
            sub = entry.subchannel
            if sub is None:
                if bare is None:
                    bare = entry
                continue
            state = sub.state
            if state is _READY:
                entry.last_used = self._now()
                session.actual_address_list = entry.address_list
                return sub.result
            if state is _IDLE:
                if idle is None:
                    idle = sub
            elif state is _CONNECTING:
                connecting = True
        policy = self._policy
        if idle is not None:
            policy.helper.clock.call_later(0, idle.connect)
            return _QUEUE
        if connecting:
            return _QUEUE
        if bare is not None:
            address = bare.address
            policy.helper.clock.call_later(0, lambda: policy._create_owned(address))
            return _QUEUE
        return None

    def __repr__(self) -> str:
        return f"OverrideHostPicker({self._child!r}, statuses={sorted(self._statuses)})"


class _Helper(DelegatingHelper):
    def __init__(self, policy: XdsOverrideHostPolicy) -> None:
        super().__init__(policy.helper)
        self.policy = policy

    def create_subchannel(self, address: str, attributes: Mapping[str, Any]) -> Subchannel:
        real = self.parent.create_subchannel(address, attributes)
        return self.policy._adopt(OverrideHostSubchannel(real, self.policy))

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self.policy._child_reported(state, status, picker)


def _address_lists(addresses: Sequence[str]) -> list[tuple[str, str]]:
    """(address, its address list) for each address of one endpoint: the
    address first, then the others in order (C-core's UpdateAddressMap)."""
    if len(addresses) == 1:
        return [(addresses[0], addresses[0])]
    out = []
    for i, address in enumerate(addresses):
        others = [a for j, a in enumerate(addresses) if j != i]
        out.append((address, ",".join([address, *others])))
    return out


class XdsOverrideHostPolicy(OneChildPolicy):
    """See the module docstring."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self._child = ChildPolicyHandler(_Helper(self))
        self._config: OverrideHostConfig | None = None
        #: address -> entry; replaced (never mutated) by updates
        self._map: dict[str, _Entry] = {}
        self._statuses: frozenset[str] = DEFAULT_STATUSES
        self._idle_timeout = DEFAULT_IDLE_TIMEOUT
        self._child_state: tuple[ConnectivityState, Status, Picker] | None = None
        self._sweep: Any = None
        self._shut_down = False

    @property
    def override_host_statuses(self) -> frozenset[str]:
        return self._statuses

    # -- LoadBalancer ----------------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shut_down:
            return None
        config: OverrideHostConfig = update.config
        entry = cluster_entry(update.attributes, config.cluster_name, "xds_override_host")
        if isinstance(entry, Status):
            return self._fail(entry)
        cluster = entry.cluster
        self._config = config
        self._statuses = frozenset(getattr(cluster, "override_host_statuses", DEFAULT_STATUSES))
        self._idle_timeout = float(getattr(cluster, "idle_timeout", DEFAULT_IDLE_TIMEOUT))
        endpoints = update.endpoints
        if not isinstance(endpoints, Status) and self._update_map(endpoints):
            endpoints = tuple(
                e for e in endpoints if e.attributes.get(HEALTH_STATUS_ATTRIBUTE) != "DRAINING"
            )
        status = self._child.update(update.replace(endpoints=endpoints, config=config.child_policy))
        return status

    def reset_backoff(self) -> None:
        super().reset_backoff()
        for entry in self._map.values():
            sub = entry.subchannel
            if sub is not None and sub.owned:
                sub.reset_backoff()

    def shutdown(self) -> None:
        self._shut_down = True
        self._cancel_sweep()
        self._child.shutdown()
        old, self._map = self._map, {}
        for entry in old.values():
            self._drop(entry)

    # -- address map -------------------------------------------------------------
    def _update_map(self, endpoints: Sequence[Endpoint]) -> bool:
        """Rebuild the address map; whether any endpoint is DRAINING (the
        child gets the others only)."""
        statuses = self._statuses
        old = self._map
        new: dict[str, _Entry] = {}
        draining = False
        for endpoint in endpoints:
            attributes = endpoint.attributes
            health = attributes.get(HEALTH_STATUS_ATTRIBUTE, "UNKNOWN")
            if health == "DRAINING":
                draining = True
                if "DRAINING" not in statuses:
                    continue  # C-core: "draining but not in override_host_status set"
            addresses = endpoint.addresses
            if len(addresses) == 1:
                # the usual endpoint (10,000 per update): no pairs to build,
                # its address list is the address itself
                address = addresses[0]
                entry = old.get(address) or new.get(address) or _Entry(address)
                entry.health, entry.address_list, entry.attributes = health, address, attributes
                new[address] = entry
                continue
            for address, address_list in _address_lists(addresses):
                entry = old.get(address) or new.get(address) or _Entry(address)
                entry.health = health
                entry.address_list = address_list
                entry.attributes = attributes
                new[address] = entry
        self._map = new
        for address, entry in old.items():
            if address not in new:
                self._drop(entry)
        return draining

    def _drop(self, entry: _Entry) -> None:
        """The entry leaves the map: an owned subchannel is closed; a child's
        keeps working for the child, outside the map."""
        sub, entry.subchannel = entry.subchannel, None
        if sub is None:
            return
        sub.entry = None
        if sub.owned:
            sub.close()

    def _adopt(self, sub: OverrideHostSubchannel) -> OverrideHostSubchannel:
        """A subchannel the child made: the newest for its address wins the
        entry (an owned one it replaces is closed)."""
        entry = self._map.get(sub.address)
        if entry is not None:
            previous = entry.subchannel
            entry.subchannel = sub
            sub.entry = entry
            if previous is not None and previous is not sub and previous.owned:
                previous.entry = None
                previous.close()
        return sub

    def _released(self, sub: OverrideHostSubchannel) -> None:
        """The child shut ``sub`` down: keep it for sessions used within the
        idle timeout (A75), else close it."""
        entry = sub.entry
        if (
            not self._shut_down
            and entry is not None
            and entry.subchannel is sub
            and self.helper.clock.now() - entry.last_used < self._idle_timeout
        ):
            sub.owned = True
            self._arm_sweep()
            return
        if entry is not None and entry.subchannel is sub:
            entry.subchannel = None
        sub.entry = None
        sub.close()

    def _create_owned(self, address: str) -> None:
        """A session asked for an address no subchannel serves (picker hop)."""
        if self._shut_down:
            return
        entry = self._map.get(address)
        if entry is None or entry.subchannel is not None:
            return  # gone, or created meanwhile (the update that did it published)
        real = self.helper.create_subchannel(address, entry.attributes)
        sub = OverrideHostSubchannel(real, self)
        sub.owned = True
        sub.entry = entry
        entry.subchannel = sub
        sub.connect()
        self._arm_sweep()
        self._publish()

    def _owned_state_changed(self, sub: OverrideHostSubchannel) -> None:
        entry = sub.entry
        if entry is not None and entry.subchannel is sub:
            self._publish()

    # -- idle sweep (A75) ----------------------------------------------------------
    def _arm_sweep(self) -> None:
        """(Re)arm the sweep for the first owned subchannel to expire; none
        while nothing is owned."""
        self._cancel_sweep()
        now = self.helper.clock.now()
        idle = self._idle_timeout
        delay = None
        for entry in self._map.values():
            sub = entry.subchannel
            if sub is not None and sub.owned:
                expiry = max(entry.last_used + idle - now, 0.0)
                delay = expiry if delay is None else min(delay, expiry)
        if delay is not None:
            self._sweep = self.helper.clock.call_later(
                max(delay, MIN_SWEEP_INTERVAL), self._on_sweep
            )

    def _cancel_sweep(self) -> None:
        timer, self._sweep = self._sweep, None
        if timer is not None:
            timer.cancel()

    def _on_sweep(self) -> None:
        self._sweep = None
        if self._shut_down:
            return
        now = self.helper.clock.now()
        idle = self._idle_timeout
        for entry in self._map.values():
            sub = entry.subchannel
            if sub is not None and sub.owned and entry.last_used <= now - idle:
                entry.subchannel = None
                sub.entry = None
                sub.close()
        self._arm_sweep()

    # -- state -----------------------------------------------------------------------
    def _child_reported(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if self._shut_down:
            return
        self._child_state = (state, status, picker)
        self._publish()

    def _publish(self) -> None:
        if self._child_state is None or self._shut_down:
            return
        state, status, child = self._child_state
        picker = OverrideHostPicker(self, child, self._statuses, self.helper.clock.now)
        self.helper.update_state(state, status, picker)

    def _fail(self, status: Status) -> Status:
        self.helper.update_state(ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status))
        return status

    def config_dump(self) -> dict[str, Any]:
        now = self.helper.clock.now()
        sessions = {}
        for address, entry in sorted(self._map.items()):
            sub = entry.subchannel
            row: dict[str, Any] = {"health": entry.health}
            if sub is not None:
                row["state"] = sub.state.name
                if sub.owned:
                    row["owned"] = True
            if entry.last_used > -math.inf:
                row["last_used_s_ago"] = round(now - entry.last_used, 3)
            sessions[address] = row
        return {
            "override_host_statuses": sorted(self._statuses),
            "idle_timeout_s": self._idle_timeout,
            "addresses": sessions,
        }


class XdsOverrideHostFactory(PolicyFactory):
    name = NAME

    def parse_config(self, json_config: Any) -> OverrideHostConfig:
        obj = expect_object(json_config, "")
        cluster_name = expect_string(obj, "clusterName", "")
        if "childPolicy" not in obj:
            raise LBConfigError("childPolicy", "field not present")
        return OverrideHostConfig(
            cluster_name, registry.select_policy(obj["childPolicy"], "childPolicy")
        )

    def build(self, helper: Helper) -> XdsOverrideHostPolicy:
        return XdsOverrideHostPolicy(helper)


registry.register(XdsOverrideHostFactory())
