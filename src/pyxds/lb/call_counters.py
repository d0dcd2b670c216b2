"""Process-wide call counters per (cluster, EDS service name) (gRFC A37, A27).

A37 "Use Global Circuit Breaking Atomic": a cluster used both on its own and
through an aggregate cluster gets two ``xds_cluster_impl_experimental``
policies, possibly on different channels, and both must share one
``max_requests`` limit.  So the in-flight count lives here, in a process-wide
map keyed by ``(cluster, eds_service_name)``, not in a policy (TRAPS.md,
"Circuit-breaker counters are per (cluster, EDS service name) across all
channels of the process", grpc-go#4560).

The same object carries what load reporting (LRS, A27 "Load Reporting")
needs: drops per category, uncategorized drops (circuit breaker), and per
locality calls started, succeeded, failed and in flight.  :meth:`ClusterCounters.snapshot`
reads them, optionally resetting the interval counts the way an LRS report does
(in-flight counts are never reset).

Rules:

* :func:`cluster_counters` returns the live object for a key or makes one; the
  registry holds it weakly, so counters live as long as some policy holds them.
* Counts are changed from RPC threads (pickers, call completion) without a
  lock: a cluster's in-flight calls are the length of a deque (append/pop
  are atomic), a locality's counts are ``itertools.count`` objects (one
  ``next()`` is atomic; in flight is started minus finished).  Drops
  (rarer) and snapshots take a small lock.  The circuit-breaker check and the
  increment are separate steps, so racing picks may admit a call or two over
  the limit, as in C-core (which checks in the picker and increments when the
  call starts).
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from collections.abc import Callable
from dataclasses import field
from typing import Any

from pyxds._values import dataclass

__all__ = [
    "ClusterCounters",
    "LocalityCounters",
    "LocalityLoad",
    "ClusterLoad",
    "cluster_counters",
    "all_cluster_counters",
]


@dataclass(frozen=True)
class LocalityLoad:
    """Per-locality numbers of one snapshot (LRS ``UpstreamLocalityStats``)."""

    locality: Any
    started: int
    succeeded: int
    failed: int
    in_flight: int


@dataclass(frozen=True)
class ClusterLoad:
    """One snapshot of a cluster's counters (LRS ``ClusterStats``)."""

    cluster: str
    eds_service_name: str
    in_flight: int
    dropped: dict[str, int] = field(default_factory=dict)
    uncategorized_drops: int = 0
    localities: tuple[LocalityLoad, ...] = ()

    @property
    def total_dropped(self) -> int:
        return self.uncategorized_drops + sum(self.dropped.values())


def _count_value(counter: itertools.count[int]) -> int:
    """The next value ``counter`` would return, without taking it."""
    return int(repr(counter)[6:-1])


class LocalityCounters:
    """Calls of one locality of one cluster.

    Lock-free on the RPC path, and no Python frame per call: three
    ``itertools.count`` totals that never reset (one ``next()`` is atomic
    in CPython), counted through their bound ``__next__``
    (:attr:`count_started`, :attr:`count_succeeded`, :attr:`count_failed`,
    which a picker may keep: they never change).  In flight is started
    minus finished; a snapshot that resets remembers the totals it read
    and the next one reports from there, so no call is lost to a reset."""

    __slots__ = (
        "locality",
        "count_started",
        "count_succeeded",
        "count_failed",
        "_started",
        "_succeeded",
        "_failed",
        "_reported",
    )

    def __init__(self, locality: Any) -> None:
        self.locality = locality
        self._started = itertools.count()
        self._succeeded = itertools.count()
        self._failed = itertools.count()
        self.count_started: Callable[[], int] = self._started.__next__
        self.count_succeeded: Callable[[], int] = self._succeeded.__next__
        self.count_failed: Callable[[], int] = self._failed.__next__
        #: (started, succeeded, failed) totals at the last resetting snapshot
        self._reported = (0, 0, 0)

    def call_started(self) -> None:
        self.count_started()

    def call_finished(self, ok: bool) -> None:
        (self.count_succeeded if ok else self.count_failed)()

    def _totals(self) -> tuple[int, int, int]:
        # the finished counts first: a call's end is counted after its
        # start, so started - finished never goes below zero
        succeeded = _count_value(self._succeeded)
        failed = _count_value(self._failed)
        return _count_value(self._started), succeeded, failed

    @property
    def in_flight(self) -> int:
        started, succeeded, failed = self._totals()
        return started - succeeded - failed

    @property
    def started(self) -> int:
        return _count_value(self._started) - self._reported[0]

    @property
    def succeeded(self) -> int:
        return _count_value(self._succeeded) - self._reported[1]

    @property
    def failed(self) -> int:
        return _count_value(self._failed) - self._reported[2]

    def _take(self, reset: bool) -> LocalityLoad:
        totals = started, succeeded, failed = self._totals()
        base_started, base_succeeded, base_failed = self._reported
        if reset:
            self._reported = totals
        return LocalityLoad(
            self.locality,
            started - base_started,
            succeeded - base_succeeded,
            failed - base_failed,
            started - succeeded - failed,
        )


class ClusterCounters:
    """Counters shared by every policy instance of one (cluster, EDS service name)."""

    __slots__ = (
        "cluster",
        "eds_service_name",
        "dropped",
        "uncategorized_drops",
        "calls",
        "_localities",
        "_lock",
        "__weakref__",
    )

    def __init__(self, cluster: str, eds_service_name: str) -> None:
        self.cluster = cluster
        self.eds_service_name = eds_service_name
        self.dropped: dict[str, int] = {}
        self.uncategorized_drops = 0
        self.calls: collections.deque[None] = collections.deque()
        self._localities: dict[Any, LocalityCounters] = {}
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Calls started and not yet finished, over every policy of the process
        (the length of ``calls``: one item per call in flight; pickers append
        and pop it directly)."""
        return len(self.calls)

    # -- serializer side -------------------------------------------------
    def locality(self, name: Any) -> LocalityCounters:
        """The counters of locality ``name`` (made on first use)."""
        counters = self._localities.get(name)
        if counters is None:
            with self._lock:
                counters = self._localities.setdefault(name, LocalityCounters(name))
        return counters

    # -- RPC side ---------------------------------------------------------
    def call_started(self, locality: LocalityCounters | None) -> None:
        self.calls.append(None)
        if locality is not None:
            locality.call_started()

    def call_finished(self, locality: LocalityCounters | None, ok: bool) -> None:
        self.calls.pop()
        if locality is not None:
            locality.call_finished(ok)

    def call_dropped(self, category: str | None) -> None:
        """Count a drop: an EDS drop ``category``, or None for the circuit breaker."""
        with self._lock:
            if category is None:
                self.uncategorized_drops += 1
            else:
                self.dropped[category] = self.dropped.get(category, 0) + 1

    # -- load reporting ---------------------------------------------------
    def snapshot(self, reset: bool = False) -> ClusterLoad:
        """The counters now; ``reset`` zeroes the interval counts (not in-flight)."""
        with self._lock:
            localities = tuple(c._take(reset) for c in list(self._localities.values()))
            load = ClusterLoad(
                self.cluster,
                self.eds_service_name,
                len(self.calls),
                dict(self.dropped),
                self.uncategorized_drops,
                localities,
            )
            if reset:
                self.dropped.clear()
                self.uncategorized_drops = 0
        return load

    def __repr__(self) -> str:
        return (
            f"ClusterCounters({self.cluster!r}, {self.eds_service_name!r}, "
            f"in_flight={self.in_flight})"
        )


_registry: weakref.WeakValueDictionary[tuple[str, str], ClusterCounters] = (
    weakref.WeakValueDictionary()
)
_registry_lock = threading.Lock()


def cluster_counters(cluster: str, eds_service_name: str | None = None) -> ClusterCounters:
    """The process-wide counters of ``(cluster, eds_service_name)``.

    ``eds_service_name`` None and "" are the same key (a cluster without an
    EDS service name, or a LOGICAL_DNS cluster).  Hold the returned object for
    as long as you count with it.
    """
    key = (cluster, eds_service_name or "")
    with _registry_lock:
        counters = _registry.get(key)
        if counters is None:
            counters = ClusterCounters(*key)
            _registry[key] = counters
        return counters


def all_cluster_counters() -> list[ClusterCounters]:
    """Every live counters object (for load reporting and config dumps)."""
    with _registry_lock:
        return list(_registry.values())
