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
* Counts are changed from RPC threads (pickers, call completion) as well as
  the serializer: one small lock per cluster guards them.  The circuit-breaker
  check reads without the lock (a stale read may admit one call too many, as in
  C-core, which checks in the picker and increments when the call starts).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

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


class LocalityCounters:
    """Calls of one locality of one cluster.  Changed under the cluster's lock."""

    __slots__ = ("locality", "started", "succeeded", "failed", "in_flight")

    def __init__(self, locality: Any) -> None:
        self.locality = locality
        self.started = 0
        self.succeeded = 0
        self.failed = 0
        self.in_flight = 0


class ClusterCounters:
    """Counters shared by every policy instance of one (cluster, EDS service name)."""

    __slots__ = (
        "cluster",
        "eds_service_name",
        "in_flight",
        "dropped",
        "uncategorized_drops",
        "_localities",
        "_lock",
        "__weakref__",
    )

    def __init__(self, cluster: str, eds_service_name: str) -> None:
        self.cluster = cluster
        self.eds_service_name = eds_service_name
        self.in_flight = 0
        self.dropped: dict[str, int] = {}
        self.uncategorized_drops = 0
        self._localities: dict[Any, LocalityCounters] = {}
        self._lock = threading.Lock()

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
        with self._lock:
            self.in_flight += 1
            if locality is not None:
                locality.started += 1
                locality.in_flight += 1

    def call_finished(self, locality: LocalityCounters | None, ok: bool) -> None:
        with self._lock:
            self.in_flight -= 1
            if locality is not None:
                locality.in_flight -= 1
                if ok:
                    locality.succeeded += 1
                else:
                    locality.failed += 1

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
            localities = tuple(
                LocalityLoad(c.locality, c.started, c.succeeded, c.failed, c.in_flight)
                for c in self._localities.values()
            )
            load = ClusterLoad(
                self.cluster,
                self.eds_service_name,
                self.in_flight,
                dict(self.dropped),
                self.uncategorized_drops,
                localities,
            )
            if reset:
                self.dropped.clear()
                self.uncategorized_drops = 0
                for c in self._localities.values():
                    c.started = c.succeeded = c.failed = 0
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
