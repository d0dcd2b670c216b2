"""``outlier_detection_experimental``: passive health checking (gRFC A50).

Config (JSON, A50 "LB Policy Config"; durations as protobuf JSON strings
such as ``"10s"`` or ``"0.5s"``)::

    {"interval": "10s", "baseEjectionTime": "30s", "maxEjectionTime": "300s",
     "maxEjectionPercent": 10,
     "successRateEjection": {"stdevFactor": 1900, "enforcementPercentage": 100,
                             "minimumHosts": 5, "requestVolume": 100},
     "failurePercentageEjection": {"threshold": 85, "enforcementPercentage": 100,
                                   "minimumHosts": 5, "requestVolume": 50},
     "childPolicy": [...]}

Validation (A50 "Validation"): durations non-negative; ``maxEjectionPercent``,
both ``enforcementPercentage`` and ``threshold`` <= 100; a violation is an
:class:`LBConfigError` naming the field.  ``childPolicy`` is required.

Behaviour:

* State is kept per *endpoint* (A61 turned A50's per-address map into a
  per-endpoint one, as C-core does): call counter (two buckets, A50 "Call
  Counter"), ejection timestamp, ejection multiplier.  An update creates an
  entry for each new endpoint and drops entries of endpoints no longer
  listed; a surviving endpoint keeps its counters and ejection state even
  when its subchannels are re-created.  An update re-points only the
  subchannel wrappers of dropped endpoints and those in no endpoint (every
  wrapper when an address is in two endpoints or the ejection rule
  changed), so one changed locality of 10,000 endpoints costs its own.
* Every subchannel the child creates is wrapped
  (:class:`OutlierDetectionSubchannel`, A50 "Subchannel Wrapper").  While its
  endpoint is ejected the wrapper reports TRANSIENT_FAILURE to the child
  and holds back the real subchannel's reports; on un-ejection it reports the
  latest real state.  A wrapper created for an ejected endpoint starts ejected.
* With an ejection algorithm configured, the picker delegates to the
  child's picker; a completed pick hands the channel the real subchannel
  and an ``on_call_done`` that counts the attempt's result in its
  endpoint's active bucket (OK = success, anything else = failure).
  Without one (the no-op config cds uses for clusters without outlier
  detection) the child's picker is published unchanged: its results name
  wrapper subchannels, whose ``core`` slot (the real subchannel's) is what
  the channel reads from a pick, so the unmapped picker costs nothing per
  pick.  The channel calls
  ``on_call_done`` once per attempt, so retries count per attempt.  Fields of
  the child's :class:`PickComplete` this policy does not use pass through
  (``dataclasses.replace``).
* The ejection timer (``helper.clock``) runs every ``interval`` while an
  algorithm is configured (A50 "Outlier Detection Behavior"): swap buckets,
  run success rate, then failure percentage, then decay multipliers and
  un-eject endpoints whose ejection time
  ``min(base * multiplier, max(base, max_ejection_time))`` has passed.  A new
  config restarts the timer for the rest of the current interval; a config
  with no algorithm cancels it, un-ejects everything and zeroes multipliers.
* Randomness (enforcement percentage) comes from ``helper.random``.
* ``max_ejection_percent`` is checked before each ejection ("stop when the
  ejected share is >= max", grpc-java#9492), except that with no endpoint
  ejected one may always be: C-core's ``ejected_host_count == 0 ||
  current_percent < max_ejection_percent``, Envoy's "will eject at least
  one host regardless of the value", so even 0 % ejects one (A50's step
  3.1 read literally would not; grpc-java#9489).
* A child that is ``pick_first`` itself is never ejected (counted only):
  C-core applies ejection through the endpoint health signal, which a
  top-level pick_first ignores (grpc#32967, A61).  Under cds's A75 tree
  (``xds_cluster_impl -> xds_override_host -> priority -> cluster policy``)
  that is the cluster's policy (:func:`ejection_reaches`).
* A wrapper also offers C-core's connectivity watch beside that health
  signal (:meth:`OutlierDetectionSubchannel.watch_connectivity`): the
  real subchannel's every report, ejected or not.  xds_override_host (above
  the wrapper in the A75 tree) reads it, so an ejected endpoint keeps its
  sessions while the policies below the override see the ejection, as in
  C-core, whose xds_override_host watches connectivity, not health.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    Endpoint,
    Helper,
    PickArgs,
    PickComplete,
    Picker,
    PickResult,
    PolicyFactory,
    ResolverUpdate,
    Status,
    Subchannel,
    address_set,
)
from pyxds.lb.call_counters import _count_value
from pyxds.lb.child_handler import ChildPolicyHandler, DelegatingHelper, OneChildPolicy
from pyxds.lb.errors import (
    LBConfigError,
    duration_field,
    expect_object,
    expect_uint32,
    field_path,
)
from pyxds.lb.registry import PolicySelection
from pyxds.lb.subchannel_wrapper import SubchannelWrapper
from pyxds.lb.timer_slot import TimerSlot
from pyxds.lb.unwatch import Watched, slot_add, slot_items, slot_remove

__all__ = [
    "NAME",
    "SuccessRateEjection",
    "FailurePercentageEjection",
    "OutlierDetectionConfig",
    "OutlierDetectionFactory",
    "OutlierDetectionPolicy",
    "OutlierDetectionPicker",
    "OutlierDetectionSubchannel",
    "EJECTED_STATUS",
]

NAME = "outlier_detection_experimental"
_OK = grpc.StatusCode.OK
_TF = ConnectivityState.TRANSIENT_FAILURE
EJECTED_STATUS = Status(grpc.StatusCode.UNAVAILABLE, "subchannel ejected by outlier detection")


# -- config ----------------------------------------------------------------------


@dataclass(frozen=True)
class SuccessRateEjection:
    """A50 ``SuccessRateEjection`` with its defaults."""

    stdev_factor: int = 1900
    enforcement_percentage: int = 100
    minimum_hosts: int = 5
    request_volume: int = 100


@dataclass(frozen=True)
class FailurePercentageEjection:
    """A50 ``FailurePercentageEjection`` with its defaults."""

    threshold: int = 85
    enforcement_percentage: int = 100
    minimum_hosts: int = 5
    request_volume: int = 50


@dataclass(frozen=True)
class OutlierDetectionConfig:
    """A50 ``OutlierDetectionLoadBalancingConfig``; durations in seconds."""

    child_policy: PolicySelection
    interval: float = 10.0
    base_ejection_time: float = 30.0
    max_ejection_time: float = 300.0
    max_ejection_percent: int = 10
    success_rate_ejection: SuccessRateEjection | None = None
    failure_percentage_ejection: FailurePercentageEjection | None = None

    @property
    def counting(self) -> bool:
        """A50: without an algorithm the picker does not count calls."""
        return (
            self.success_rate_ejection is not None or self.failure_percentage_ejection is not None
        )


def _percent(obj: dict[str, Any], name: str, path: str, default: int) -> int:
    value = expect_uint32(obj, name, path, default)
    if value > 100:
        raise LBConfigError(field_path(path, name), f"value must be <= 100, got {value}")
    return value


def _duration(obj: dict[str, Any], name: str, default: float) -> float:
    """A50 "Validation": a duration must be non-negative (``"-0.5s"``, which
    grpcio 1.85 reads as 0.5 s, is refused too)."""
    return duration_field(obj, name, "", default, non_negative=True)


class OutlierDetectionFactory(PolicyFactory):
    name = NAME

    def parse_config(self, json_config: Any) -> OutlierDetectionConfig:
        obj = expect_object(json_config, "")
        interval = _duration(obj, "interval", 10.0)
        base = _duration(obj, "baseEjectionTime", 30.0)
        max_time = _duration(obj, "maxEjectionTime", 300.0)
        max_percent = _percent(obj, "maxEjectionPercent", "", 10)
        success_rate = None
        if obj.get("successRateEjection") is not None:
            sr = expect_object(obj["successRateEjection"], "successRateEjection")
            p = "successRateEjection"
            success_rate = SuccessRateEjection(
                stdev_factor=expect_uint32(sr, "stdevFactor", p, 1900),
                enforcement_percentage=_percent(sr, "enforcementPercentage", p, 100),
                minimum_hosts=expect_uint32(sr, "minimumHosts", p, 5),
                request_volume=expect_uint32(sr, "requestVolume", p, 100),
            )
        failure_percentage = None
        if obj.get("failurePercentageEjection") is not None:
            fp = expect_object(obj["failurePercentageEjection"], "failurePercentageEjection")
            p = "failurePercentageEjection"
            failure_percentage = FailurePercentageEjection(
                threshold=_percent(fp, "threshold", p, 85),
                enforcement_percentage=_percent(fp, "enforcementPercentage", p, 100),
                minimum_hosts=expect_uint32(fp, "minimumHosts", p, 5),
                request_volume=expect_uint32(fp, "requestVolume", p, 50),
            )
        if "childPolicy" not in obj:
            raise LBConfigError("childPolicy", "required field missing")
        child = registry.select_policy(obj["childPolicy"], "childPolicy")
        return OutlierDetectionConfig(
            child_policy=child,
            interval=interval,
            base_ejection_time=base,
            max_ejection_time=max_time,
            max_ejection_percent=max_percent,
            success_rate_ejection=success_rate,
            failure_percentage_ejection=failure_percentage,
        )

    def build(self, helper: Helper) -> OutlierDetectionPolicy:
        return OutlierDetectionPolicy(helper)


# -- per-endpoint state --------------------------------------------------------------


class _Bucket:
    """One call-counter bucket: ``itertools.count`` objects, so that RPC
    threads count without a lock (one ``next()`` is atomic)."""

    __slots__ = ("successes", "failures")

    def __init__(self) -> None:
        self.successes = itertools.count()
        self.failures = itertools.count()

    def values(self) -> tuple[int, int]:
        return _count_value(self.successes), _count_value(self.failures)


_UNCOUNTED = _Bucket()
"""The bucket of every entry while the config counts nothing."""


class EndpointState:
    """A50's map entry, per endpoint: counter, ejection time, multiplier and
    the wrappers of the endpoint's subchannels."""

    __slots__ = (
        "addresses",
        "active",
        "successes",
        "failures",
        "ejected_at",
        "multiplier",
        "_wrappers",
    )

    def __init__(self, addresses: frozenset[str], counting: bool = True) -> None:
        self.addresses = addresses
        # Without an algorithm nothing is counted (the picker does not wrap
        # the calls): no bucket of its own until counting starts, which
        # reset()s every entry (_apply_timer).  Calls picked from a counting
        # picker still in use then land in the shared bucket, never read.
        self.active = _Bucket() if counting else _UNCOUNTED
        self.successes = 0  # the inactive bucket, read at the last sweep
        self.failures = 0
        self.ejected_at: float | None = None
        self.multiplier = 0
        #: the wrappers of the endpoint's subchannels: None, one (nearly
        #: always), or a tuple of two or more (no set per endpoint: an empty
        #: set is ~200 bytes, issue 18)
        self._wrappers: OutlierDetectionSubchannel | tuple[OutlierDetectionSubchannel, ...] | None
        self._wrappers = None

    @property
    def wrappers(self) -> tuple[OutlierDetectionSubchannel, ...]:
        """The wrappers attached to this entry (a snapshot)."""
        return slot_items(self._wrappers)

    def attach(self, wrapper: OutlierDetectionSubchannel) -> None:
        """Attach ``wrapper`` (once)."""
        if wrapper not in self.wrappers:
            self._wrappers = slot_add(self._wrappers, wrapper)

    def detach(self, wrapper: OutlierDetectionSubchannel) -> None:
        """Detach ``wrapper`` if attached."""
        self._wrappers = slot_remove(self._wrappers, wrapper)

    @property
    def ejected(self) -> bool:
        return self.ejected_at is not None

    @property
    def volume(self) -> int:
        return self.successes + self.failures

    def record(self, status: Status) -> None:
        """``on_call_done`` of a counted attempt (any thread)."""
        bucket = self.active
        next(bucket.successes if status.code is _OK else bucket.failures)

    def swap(self) -> None:
        """A50: zero the inactive bucket and swap it with the active one."""
        bucket, self.active = self.active, _Bucket()
        self.successes, self.failures = bucket.values()

    def reset(self) -> None:
        self.active = _Bucket()
        self.successes = self.failures = 0

    def __repr__(self) -> str:
        return (
            f"EndpointState({sorted(self.addresses)}, ejected={self.ejected}, "
            f"multiplier={self.multiplier})"
        )


class OutlierDetectionSubchannel(Watched, SubchannelWrapper):
    """What the child sees instead of its parent's subchannel (A50 "Subchannel
    Wrapper").  The picker hands ``real`` to the channel."""

    __slots__ = (
        "real",
        "address",
        "endpoint",
        "ejected",
        "core",
        "mapped",
        "connectivity_watcher",
        "_policy",
        "_state",
        "_status",
        "_unwatch",
    )

    def __init__(self, real: Subchannel, policy: OutlierDetectionPolicy) -> None:
        self.real = real
        self.address = real.address
        self.endpoint: EndpointState | None = None
        self.ejected = False
        #: the channel's subchannel core, read by the channel from a pick of
        #: a no-op outlier_detection (its picker is the child's, unmapped):
        #: a slot, not a ``__getattr__`` per pick
        self.core = getattr(real, "core", None)
        #: (child result, endpoint entry, mapped result) of the last counted
        #: pick of this wrapper (:meth:`OutlierDetectionPicker._map`)
        self.mapped: tuple[PickComplete, EndpointState | None, PickComplete] | None = None
        #: the one watcher of the real reports, ejected or not (watch_connectivity)
        self.connectivity_watcher: Any = None
        self._policy = policy
        self._watchers = None
        self._state = ConnectivityState.IDLE
        self._status = OK_STATUS
        self._unwatch: Callable[[], None] | None = None

    # -- Subchannel ------------------------------------------------------------
    def watch_state(self, fn: Callable[[ConnectivityState, Status], None]) -> Callable[[], None]:
        if self._unwatch is None:
            self._unwatch = self.real.watch_state(self)
        unwatch = self._add_watcher(fn)
        if self.ejected:
            fn(_TF, EJECTED_STATUS)
        else:
            fn(self._state, self._status)
        return unwatch

    def watch_connectivity(self, watcher: Any) -> None:
        """C-core's connectivity watch (A61), beside :meth:`watch_state`,
        which is the health signal an ejection changes: ``watcher``'s
        ``connectivity_changed(state, status, False)`` gets the real subchannel's
        current state now and every report after, whether the endpoint is
        ejected or not.  One watcher (the xds_override_host wrapper above
        this one); None detaches it.  When the watcher also watches the
        health (:meth:`watch_state`, as the only watcher), a real report while
        not ejected is ``connectivity_changed(state, status, True)``: both
        at once."""
        self.connectivity_watcher = watcher
        if watcher is None:
            return
        if self._unwatch is None:
            self._unwatch = self.real.watch_state(self)
        watcher.connectivity_changed(self._state, self._status, False)

    def shutdown(self) -> None:
        self._policy._untrack(self)
        self._watchers = None
        self.mapped = None  # its child result names this wrapper: no cycle left
        self.connectivity_watcher = None
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
        self.real.shutdown()

    # -- ejection ----------------------------------------------------------------
    def __call__(self, state: ConnectivityState, status: Status) -> None:
        """The real subchannel's report (the wrapper is its watcher: no
        bound method per endpoint, issue 18).  The connectivity watcher
        that is also the one health watcher (the xds_override_host wrapper
        above, nearly always) gets both in one call while not ejected."""
        self._state, self._status = state, status
        watcher = self.connectivity_watcher
        if watcher is not None:
            if self._watchers is watcher and not self.ejected:
                watcher.connectivity_changed(state, status, True)
                return
            watcher.connectivity_changed(state, status, False)
        if not self.ejected:
            self._notify(state, status)

    def eject(self) -> None:
        """Report TRANSIENT_FAILURE and hold back the real reports."""
        if self.ejected:
            return
        self.ejected = True
        self._notify(_TF, EJECTED_STATUS)

    def uneject(self) -> None:
        """Report the real subchannel's latest state and pass reports again."""
        if not self.ejected:
            return
        self.ejected = False
        self._notify(self._state, self._status)

    def __repr__(self) -> str:
        return f"OutlierDetectionSubchannel({self.real!r}, ejected={self.ejected})"


# -- picker ----------------------------------------------------------------------------


_Done = Callable[[Status], None]


def _chain(first: _Done, then: _Done) -> _Done:
    def on_call_done(status: Status) -> None:
        first(status)
        then(status)

    return on_call_done


class OutlierDetectionPicker(Picker):
    """Delegates to the child's picker; unwraps the subchannel and adds the
    counting ``on_call_done`` (chained before the child's own).  Child
    results are mostly constant objects (xds_cluster_impl's per-endpoint
    results in cds's A75 tree, pick_first's READY result, least_request's
    per-endpoint results): the last one picked on a wrapper maps to a result
    remembered on that wrapper (``mapped``, checked by identity with the
    endpoint entry it counts into), so such a pick allocates nothing, for
    any number of endpoints.  Build with :func:`make_picker`."""

    __slots__ = ("_child", "_pick", "_counting")

    def __init__(self, child: Picker, counting: bool) -> None:
        self._child = child
        self._pick = child.pick
        self._counting = counting

    @property
    def child(self) -> Picker:
        return self._child

    def pick(self, args: PickArgs) -> PickResult:
        result = self._pick(args)
        if type(result) is not PickComplete:
            return result
        subchannel: Any = result.subchannel
        if subchannel.__class__ is not OutlierDetectionSubchannel:
            return result
        memo = subchannel.mapped
        if (
            memo is not None
            and memo[0] is result
            and memo[1] is (subchannel.endpoint if self._counting else None)
        ):
            return memo[2]  # type: ignore[no-any-return]
        return self._map(result)

    def _map(self, result: PickComplete, remember: bool = True) -> PickResult:
        subchannel = result.subchannel
        if subchannel.__class__ is not OutlierDetectionSubchannel:
            return result
        assert isinstance(subchannel, OutlierDetectionSubchannel)
        inner = result.on_call_done
        endpoint = subchannel.endpoint if self._counting else None
        done = inner
        if endpoint is not None:
            done = endpoint.record if inner is None else _chain(endpoint.record, inner)
        mapped = replace(result, subchannel=subchannel.real, on_call_done=done)
        if remember:
            subchannel.mapped = (result, endpoint, mapped)
        return mapped

    def __repr__(self) -> str:
        return f"OutlierDetectionPicker({self._child!r}, counting={self._counting})"


class _StreamPicker(OutlierDetectionPicker):
    """Over a child whose picks rotate over a fixed tuple of constant
    results (round_robin's READY picker): every result is mapped once, up
    front, and the picker rotates over the mapped results from where the
    child's rotation stands (one result is taken from the child's stream to
    find it), so a pick is one ``next()`` on an ``itertools.cycle``, as
    round_robin's; offered to parents as this picker's own stream."""

    __slots__ = ("_stream", "_next")

    def __init__(
        self, child: Picker, counting: bool, stream: Any, results: tuple[PickComplete, ...]
    ) -> None:
        super().__init__(child, counting)
        mapped = [self._map(result, remember=False) for result in results]
        current = next(stream)
        start = next((i for i, r in enumerate(results) if r is current), 0)
        self._stream = itertools.cycle(mapped[start:] + mapped[:start])
        self._next = self._stream.__next__

    def pick(self, args: PickArgs) -> PickResult:
        return self._next()

    def result_stream(self) -> Any:
        return self._stream


def make_picker(child: Picker, counting: bool) -> OutlierDetectionPicker:
    """The outlier_detection picker over ``child`` (the streaming form when
    the child's READY picker allows it)."""
    results = getattr(child, "results", None)
    if (
        isinstance(results, tuple)
        and results
        and all(type(result) is PickComplete for result in results)
    ):
        stream = child.result_stream()
        if stream is not None:
            return _StreamPicker(child, counting, stream, results)
    return OutlierDetectionPicker(child, counting)


# -- policy ----------------------------------------------------------------------------

#: the policies cds puts between outlier_detection and the cluster's own
#: policy (A75): each hands every endpoint to the policy below it
_PASS_THROUGH = frozenset({"xds_cluster_impl_experimental", "xds_override_host_experimental"})


def ejection_reaches(child: PolicySelection) -> bool:
    """Whether an ejection changes what ``child`` picks: not when the policy
    that manages the endpoints is ``pick_first`` itself (C-core ejects
    through the health watch, which a pick_first outside a petiole policy
    does not read: grpc#32967, A61).  cds's A75 tree is looked through:
    xds_cluster_impl and xds_override_host to their child, the priority
    policy to its children (ejection reaches when it reaches any of them)."""
    name = child.name
    if name in _PASS_THROUGH:
        inner = getattr(child.config, "child_policy", None)
        return not isinstance(inner, PolicySelection) or ejection_reaches(inner)
    if name == "priority_experimental":
        children = getattr(child.config, "children", None)
        if isinstance(children, Mapping) and children:
            return any(ejection_reaches(entry.config) for entry in children.values())
        return True
    return name != "pick_first"


class _ODHelper(DelegatingHelper):
    def __init__(self, policy: OutlierDetectionPolicy) -> None:
        super().__init__(policy.helper)
        self.policy = policy

    def create_subchannel(self, address: str, attributes: Mapping[str, Any]) -> Subchannel:
        real = self.parent.create_subchannel(address, attributes)
        return self.policy._track(OutlierDetectionSubchannel(real, self.policy))

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self.policy._child_reported(state, status, picker)


class OutlierDetectionPolicy(OneChildPolicy):
    """See the module docstring."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self._child = ChildPolicyHandler(_ODHelper(self))
        self._config: OutlierDetectionConfig | None = None
        self._endpoints: dict[frozenset[str], EndpointState] = {}
        self._by_address: dict[str, EndpointState] = {}
        self._wrappers: set[OutlierDetectionSubchannel] = set()
        # wrappers whose address is in no endpoint (their entry is None)
        self._unattached: set[OutlierDetectionSubchannel] = set()
        # _may_eject() when every wrapper was last aligned (None: never)
        self._aligned_for: bool | None = None
        self._timer = TimerSlot(helper.clock)
        self._timer_started_at: float | None = None
        #: whether the endpoints' policy acts on an ejection (ejection_reaches)
        self._ejection_reaches = False
        self._child_state: tuple[ConnectivityState, Status, Picker] | None = None
        self._updating = False
        self._dirty = False  # endpoints changed: memoised picks are stale
        self._shut_down = False

    # -- introspection ---------------------------------------------------------
    @property
    def config(self) -> OutlierDetectionConfig | None:
        return self._config

    def endpoint_state(self, address: str) -> EndpointState | None:
        """The state of the endpoint holding ``address`` (tests, dumps)."""
        return self._by_address.get(address)

    @property
    def ejected(self) -> list[frozenset[str]]:
        return [key for key, entry in self._endpoints.items() if entry.ejected]

    # -- LoadBalancer ------------------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shut_down:
            return None
        config: OutlierDetectionConfig = update.config
        old = self._config
        self._config = config
        if old is None or old.child_policy != config.child_policy:
            self._ejection_reaches = ejection_reaches(config.child_policy)
        if not isinstance(update.endpoints, Status):
            self._apply_endpoints(update.endpoints)
        self._apply_timer(config, old)
        self._updating = True
        try:
            status = self._child.update(update.replace(config=config.child_policy))
        finally:
            self._updating = False
        if old is None or old.counting != config.counting or self._dirty:
            self._publish()
        return status

    def shutdown(self) -> None:
        self._shut_down = True
        self._timer.cancel()
        self._child.shutdown()

    # -- endpoints ------------------------------------------------------------------
    def _apply_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        wanted: dict[frozenset[str], EndpointState] = {}
        known = self._endpoints
        counting = self._config is not None and self._config.counting
        for endpoint in endpoints:
            key = address_set(endpoint)
            if key in wanted:
                continue
            entry = known.get(key)
            if entry is None:
                wanted[key] = EndpointState(key, counting)
            else:
                # keyed by the entry's own set: the new one is garbage at
                # once instead of a long-lived object per endpoint per update
                wanted[entry.addresses] = entry
        if wanted.keys() == known.keys():
            return
        self._endpoints = wanted
        by_address = self._by_address = {
            address: entry for entry in wanted.values() for address in entry.addresses
        }
        may_eject = self._may_eject()
        if may_eject == self._aligned_for and len(by_address) == sum(map(len, wanted)):
            # Incremental (no address in two endpoints, ejection rule as at
            # the last alignment): a wrapper attached to a surviving entry
            # stays attached to it and is already aligned with it, so only
            # the wrappers of dropped entries and the unattached ones move.
            moved: set[OutlierDetectionSubchannel] = set(self._unattached)
            for key in known.keys() - wanted.keys():
                moved.update(known[key].wrappers)
        else:
            moved = self._wrappers
        self._aligned_for = may_eject
        for wrapper in list(moved):
            self._attach(wrapper)
        self._dirty = True  # memoised picks point at the old entries

    def _attach(self, wrapper: OutlierDetectionSubchannel) -> None:
        """Point ``wrapper`` at its endpoint's entry and align its ejection."""
        entry = self._by_address.get(wrapper.address)
        if wrapper.endpoint is not entry:
            if wrapper.endpoint is not None:
                wrapper.endpoint.detach(wrapper)
            wrapper.endpoint = entry
            if entry is not None:
                entry.attach(wrapper)
                self._unattached.discard(wrapper)
            else:
                self._unattached.add(wrapper)
        elif entry is None:
            self._unattached.add(wrapper)
        if entry is not None and entry.ejected and self._may_eject():
            wrapper.eject()
        else:
            wrapper.uneject()

    def _track(self, wrapper: OutlierDetectionSubchannel) -> OutlierDetectionSubchannel:
        self._wrappers.add(wrapper)
        self._attach(wrapper)
        return wrapper

    def _untrack(self, wrapper: OutlierDetectionSubchannel) -> None:
        self._wrappers.discard(wrapper)
        self._unattached.discard(wrapper)
        if wrapper.endpoint is not None:
            wrapper.endpoint.detach(wrapper)

    def _may_eject(self) -> bool:
        return self._ejection_reaches

    # -- timer ------------------------------------------------------------------------
    def _apply_timer(
        self, config: OutlierDetectionConfig, old: OutlierDetectionConfig | None
    ) -> None:
        clock = self.helper.clock
        if not config.counting:
            self._timer.cancel()
            self._timer_started_at = None
            if old is not None and not old.counting:
                # Nothing ejects or counts while no algorithm is configured
                # (the sweep is what does, and it is not running): every
                # entry is still as the last config left it, and new ones
                # start un-ejected with multiplier 0.
                return
            for entry in self._endpoints.values():
                if entry.ejected:
                    self._uneject(entry)
                entry.multiplier = 0
            return
        if old == config and self._timer.pending:
            return  # the same config twice: nothing to restart
        now = clock.now()
        if self._timer_started_at is None:
            self._timer_started_at = now
            for entry in self._endpoints.values():
                entry.reset()
            delay = config.interval
        else:
            delay = max(0.0, config.interval - (now - self._timer_started_at))
        self._timer.start(delay, self._sweep)

    def _sweep(self) -> None:
        """A50 timer: swap counters, run the algorithms, decay and un-eject."""
        config = self._config
        if self._shut_down or config is None or not config.counting:
            return
        now = self.helper.clock.now()
        self._timer_started_at = now
        entries = list(self._endpoints.values())
        for entry in entries:
            entry.swap()
        if config.success_rate_ejection is not None:
            self._success_rate(config, config.success_rate_ejection, entries, now)
        if config.failure_percentage_ejection is not None:
            self._failure_percentage(config, config.failure_percentage_ejection, entries, now)
        base = config.base_ejection_time
        cap = max(base, config.max_ejection_time)
        for entry in entries:
            if entry.ejected_at is None:
                if entry.multiplier > 0:
                    entry.multiplier -= 1
            elif now >= entry.ejected_at + min(base * entry.multiplier, cap):
                self._uneject(entry)
        # max(interval, 1 ms): an interval of 0 must not spin the serializer.
        self._timer.start(max(config.interval, 0.001), self._sweep)

    def _ejected_count(self) -> int:
        return sum(1 for entry in self._endpoints.values() if entry.ejected)

    def _ejection_allowed(self, config: OutlierDetectionConfig, ejected: int) -> bool:
        """Whether ``max_ejection_percent`` lets one more endpoint be
        ejected with ``ejected`` out (module docstring): always while none
        is.  The algorithms count their own ejections from one
        :meth:`_ejected_count`, so a sweep is O(endpoints), not O(endpoints²)."""
        if not ejected:
            return True
        return 100.0 * ejected / len(self._endpoints) < config.max_ejection_percent

    def _success_rate(
        self,
        config: OutlierDetectionConfig,
        sr: SuccessRateEjection,
        entries: list[EndpointState],
        now: float,
    ) -> None:
        candidates = [e for e in entries if e.volume >= sr.request_volume and e.volume > 0]
        if len(candidates) < sr.minimum_hosts or not candidates:
            return
        # C-core's arithmetic, operation for operation (percent, plain
        # left-to-right sums), so that a rate on the threshold rounds the
        # same way (with two endpoints and stdevFactor 1000 it always is).
        rates = [e.successes * 100.0 / e.volume for e in candidates]
        total = 0.0
        for rate in rates:
            total += rate
        mean = total / len(rates)
        variance = 0.0
        for rate in rates:
            variance += (rate - mean) ** 2
        variance /= len(rates)
        threshold = mean - math.sqrt(variance) * (sr.stdev_factor / 1000)
        ejected = self._ejected_count()
        for entry, rate in zip(candidates, rates, strict=True):
            if not self._ejection_allowed(config, ejected):
                return
            if entry.ejected:
                continue
            if rate < threshold and self._enforce(sr.enforcement_percentage):
                self._eject(entry, now)
                ejected += 1

    def _failure_percentage(
        self,
        config: OutlierDetectionConfig,
        fp: FailurePercentageEjection,
        entries: list[EndpointState],
        now: float,
    ) -> None:
        candidates = [e for e in entries if e.volume >= fp.request_volume and e.volume > 0]
        if len(candidates) < fp.minimum_hosts or not candidates:
            return
        ejected = self._ejected_count()
        for entry in candidates:
            if not self._ejection_allowed(config, ejected):
                return
            if entry.ejected:
                continue
            if 100.0 * entry.failures / entry.volume > fp.threshold and self._enforce(
                fp.enforcement_percentage
            ):
                self._eject(entry, now)
                ejected += 1

    def _enforce(self, percentage: int) -> bool:
        return self.helper.random.randrange(100) < percentage

    def _eject(self, entry: EndpointState, now: float) -> None:
        entry.ejected_at = now
        entry.multiplier += 1
        if self._may_eject():
            for wrapper in entry.wrappers:
                wrapper.eject()

    def _uneject(self, entry: EndpointState) -> None:
        entry.ejected_at = None
        for wrapper in entry.wrappers:
            wrapper.uneject()

    # -- child state ---------------------------------------------------------------------
    def _child_reported(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if self._shut_down:
            return
        self._child_state = (state, status, picker)
        self._dirty = True
        if not self._updating:
            self._publish()

    def _publish(self) -> None:
        if self._child_state is None or self._config is None:
            return
        self._dirty = False
        state, status, picker = self._child_state
        if self._config.counting:
            picker = make_picker(picker, True)
        # Without an algorithm nothing is counted: the child's picker is
        # published as is (no cost per pick).  Its results carry wrapper
        # subchannels, which xds_cluster_impl and the channel unwrap.
        self.helper.update_state(state, status, picker)


registry.register(OutlierDetectionFactory())
