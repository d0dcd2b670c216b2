"""``xds_cluster_impl_experimental``: EDS drops, circuit breaking, call counters.

gRFC A37 ("xds_cluster_impl_experimental LB Policy") as reshaped by A74
latest ("Changes in xds_cluster_impl"): the JSON config keeps only
``{"clusterName", "childPolicy"}``; everything else comes from the
``xds_config`` attribute (the XdsConfig of the channel):

* ``drop_overloads`` of the cluster's EDS resource, per category in parts per
  million (A27 "EDS drops");
* ``security``, the cluster's validated UpstreamTlsContext (A29): put on
  every subchannel the child creates (``xds_security`` attribute), so the
  channel's pool connects with TLS/mTLS when the channel has xDS
  credentials; a change of it starts the child over on new subchannels in
  the same update (A74: no RPC of the new cluster on the old TLS config);
* ``max_requests``, the cluster's DEFAULT-priority circuit-breaking threshold
  (A32), counted over every policy of the process for the same
  (cluster, EDS service name) (A37 "Use Global Circuit Breaking Atomic",
  :mod:`pyxds.lb.call_counters`).

The policy owns one child (the cluster's priority policy) and publishes the
child's picker wrapped in :class:`XdsClusterImplPicker`.  A pick, in order
(C-core's order):

1. for each drop category in EDS order, draw ``helper.random`` once; below
   the category's rate, drop: ``PickDrop(UNAVAILABLE "EDS-configured drop: CATEGORY")``;
2. if the cluster's in-flight calls are at ``max_requests`` or above, drop:
   ``PickDrop(UNAVAILABLE "circuit breaker drop")`` (counted as an
   uncategorized drop);
3. otherwise delegate to the child; a completed pick counts a started call
   (cluster in-flight and the picked endpoint's locality) and gets an
   ``on_call_done`` that records success or failure, then calls the child's,
   and the ``attempt_labels`` ``{"grpc.lb.locality": ...}`` of the picked
   endpoint's locality (A78 "Per-Call Metrics": taken from the wrapped
   subchannel made for load reporting, as C-core; "" without a locality);
4. A81 "xds_cluster_impl LB Policy Changes": when the RPC's route asks for
   ``auto_host_rewrite`` (call attribute) and the picked endpoint has a
   host name (its ``address_name`` attribute, kept on the wrapper made for
   it), the result also carries ``(":authority", hostname)`` in its
   ``metadata``, which the channel sends as the attempt's authority (one
   result per endpoint, made once; an endpoint without a host name costs
   the pick one attribute test).

Load reporting (A27 "Load Reporting"): when the cluster has
``lrs_server: self``, the policy takes the cluster's drop stats and each
locality's stats from the XdsClient's load store (the ``xds_client``
attribute; key: the LRS server, the cluster, its EDS service name, the
locality and the cluster's backend metric propagation, A85), as C-core
does: EDS drops count under their category, circuit breaker drops as
uncategorized, and every completed pick (one RPC attempt) counts issued at
the pick and succeeded/failed in its ``on_call_done`` (in progress in
between).  When the cluster's ``lrs_report_endpoint_metrics`` asks for
backend metrics (A64/A85), the pick also gets an ``on_call_trailers`` that
hands the attempt's per-call ORCA report, if any, to its locality's stats
(chained with the child's own hook).  pyxds sees per-call reports only from
backends that send the ``x-endpoint-load-metrics-bin`` mirror
(:mod:`pyxds.orca`): grpcio hides the standard trailer from Python, and A64
counts per-call reports only.  Without ``lrs_server`` nothing is reported.
The stats are given back when the cluster stops reporting, when the key
changes (the next report flushes them) and at shutdown.

The locality of a subchannel is the ``locality`` attribute of the endpoint it
was created for (the cds policy sets it), and follows that endpoint when an
update moves its address to another locality (C-core's policies create the
subchannel again then; see ``_relocate``): the child gets a
:class:`CountedSubchannel` carrying that locality's counters, which the
picker unwraps, so the count costs no lookup on the pick path and the channel
only ever sees its own subchannels.  The picker hands the channel the child's
:class:`PickComplete` rebuilt with every one of its fields passed on
(positionally: a ``dataclasses.replace`` costs 10x on the pick path), so what
a child policy asks of the channel (``on_call_trailers`` for ORCA) survives.
That rebuilt result is made once per (child result, cluster counters,
locality stats, load stats) and kept on the endpoint's
:class:`CountedSubchannel` (:meth:`CountedSubchannel.count`): round_robin's
results, through override_host, are constants per endpoint, so a pick
allocates nothing; its ``on_call_done`` counts the end of whichever call it
is called for.  The counting itself is never skipped: every completed pick
is one more call in flight for circuit breaking, one started call of its
locality and, with ``lrs_server``, of its load stats (issue 18 item 2).

State: the child's state and status, unchanged.  Before the child reports,
nothing is published, except when a category drops every call: then the
policy is READY at once with a picker that drops (C-core does the same).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from itertools import compress
from operator import is_not, not_
from types import MappingProxyType
from typing import Any, cast

import grpc

from pyxds._values import dataclass
from pyxds.lb import registry
from pyxds.lb.api import (
    ATTEMPT_NOT_STARTED,
    AUTHORITY_HEADER,
    AUTO_HOST_REWRITE_KEY,
    OK_STATUS,
    ConnectivityState,
    FailPicker,
    Helper,
    PickArgs,
    PickComplete,
    PickDrop,
    Picker,
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
    Subchannel,
)
from pyxds.lb.call_counters import ClusterCounters, LocalityCounters, cluster_counters
from pyxds.lb.child_handler import ChildPolicyHandler, DelegatingHelper, OneChildPolicy
from pyxds.lb.errors import LBConfigError, expect_object, expect_string
from pyxds.lb.outlier_detection import OutlierDetectionSubchannel
from pyxds.lb.registry import PolicySelection
from pyxds.lb.subchannel_wrapper import SubchannelWrapper
from pyxds.metrics import locality_label
from pyxds.resolver.xds_config import XDS_CLIENT_ATTRIBUTE, EndpointConfig, cluster_entry
from pyxds.security.tls_config import ADDRESS_NAME_ATTRIBUTE, SECURITY_ATTRIBUTE

_log = logging.getLogger(__name__)

NAME = "xds_cluster_impl_experimental"
DEFAULT_MAX_REQUESTS = 1024
PARTS_PER_MILLION = 1_000_000
LOCALITY_ATTRIBUTE = "locality"
#: A78's optional per-attempt label this policy sets
LOCALITY_LABEL = "grpc.lb.locality"
#: A89's optional label: the cluster the attempt was sent to
BACKEND_SERVICE_LABEL = "grpc.lb.backend_service"

_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_OK = grpc.StatusCode.OK
_CIRCUIT_BREAKER_DROP = PickDrop(Status(_UNAVAILABLE, "circuit breaker drop"))


@dataclass(frozen=True)
class XdsClusterImplConfig:
    """The policy's config: the cluster (whose ``xds_config`` entry gives the
    drops, circuit breaking and load reporting) and the child policy."""

    cluster_name: str
    child_policy: PolicySelection


def drop_result(category: str) -> PickDrop:
    """The pick result of an EDS drop of ``category`` (C-core's words)."""
    return PickDrop(Status(_UNAVAILABLE, f"EDS-configured drop: {category}"))


class XdsClusterImplPicker(Picker):
    """Drops, circuit breaking and call counting around the child's picker.
    On the RPC path: no allocation beyond the result and its done callback."""

    __slots__ = (
        "_child",
        "_drops",
        "_counters",
        "_calls",
        "_max_requests",
        "_random",
        "_drop_stats",
    )

    def __init__(
        self,
        child: Picker,
        drops: tuple[tuple[str, float, PickDrop], ...],
        counters: ClusterCounters,
        max_requests: int,
        random_source: Any,
        drop_stats: Any = None,
    ) -> None:
        self._child = child
        self._drops = drops
        self._counters = counters
        self._calls = counters.calls
        self._max_requests = max_requests
        self._random = random_source
        self._drop_stats = drop_stats

    def pick(self, args: PickArgs) -> PickResult:
        result: PickResult
        if self._drops:
            draw = self._random.random
            for category, threshold, result in self._drops:
                if draw() * PARTS_PER_MILLION < threshold:
                    self._counters.call_dropped(category)
                    if self._drop_stats is not None:
                        self._drop_stats.add(category)
                    return result
        calls = self._calls
        if len(calls) >= self._max_requests:
            self._counters.call_dropped(None)
            if self._drop_stats is not None:
                self._drop_stats.add(None)
            return _CIRCUIT_BREAKER_DROP
        result = self._child.pick(args)
        if type(result) is not PickComplete:
            return result
        subchannel = result.subchannel
        if type(subchannel) is OutlierDetectionSubchannel:  # a no-op outlier_detection
            subchannel = subchannel.real
        if type(subchannel) is CountedSubchannel:
            locality = subchannel.stats
            lrs = subchannel.lrs
            # The counted result of a child result seen before (round_robin's
            # and override_host's are constants per endpoint) is reused; a
            # different child result, counters or load stats build it anew.
            memo = subchannel.counted
            if (
                memo is None
                or memo[0] is not result
                or memo[1] is not calls
                or memo[2] is not locality
                or memo[3] is not lrs
            ):
                memo = subchannel.count(result, calls)
            if locality is not None:
                locality.count_started()
            if lrs is not None:
                lrs.call_started()
            calls.append(None)
            # A81: the endpoint has a host name and the route asks for it
            # (memo[5]: the result with it, None without a host name; read
            # from the memo, since the wrapper's own attributes are slow to
            # read: its __getattr__ turns CPython's fast attribute reads off)
            if memo[5] is not None and args.call_attributes.get(AUTO_HOST_REWRITE_KEY):
                return memo[5]
            return memo[4]
        # a subchannel this policy did not wrap (a custom child's own)
        calls.append(None)
        done = _call_done(calls, None, None, result.on_call_done)
        return PickComplete(
            subchannel,
            done,
            result.on_call_trailers,
            result.attempt_labels,
            result.metadata,
        )

    @property
    def child(self) -> Picker:
        return self._child

    def __repr__(self) -> str:
        drops = ", ".join(f"{c}={t:g}ppm" for c, t, _ in self._drops)
        return f"XdsClusterImplPicker(drops=[{drops}], max_requests={self._max_requests})"


#: :attr:`CountedSubchannel.counted`
Counted = tuple[PickComplete, Any, Any, Any, PickComplete, "PickComplete | None"]


def _call_done(
    calls: Any,
    locality: LocalityCounters | None,
    lrs: Any,
    inner: Callable[[Status], None] | None,
) -> Callable[[Status], None]:
    """The ``on_call_done`` of a counted call (``calls`` is the cluster's
    in-flight deque, see :class:`ClusterCounters`; ``lrs`` the locality's
    load-report stats or None): a ``functools.partial`` of
    :func:`_count_call_done`, two GC-tracked objects (a closure over the
    same names is eight: a function and a cell per name), since one is
    kept per endpoint (:meth:`CountedSubchannel.count`)."""
    if locality is None:
        return functools.partial(_count_call_done, calls, None, None, lrs, inner)
    # the locality's counters bound once: no Python frame per call
    succeeded, failed = locality.count_succeeded, locality.count_failed
    return functools.partial(_count_call_done, calls, succeeded, failed, lrs, inner)


def _count_call_done(
    calls: Any,
    succeeded: Callable[[], int] | None,
    failed: Callable[[], int] | None,
    lrs: Any,
    inner: Callable[[Status], None] | None,
    status: Status,
) -> None:
    calls.pop()
    ok = status.code is _OK
    if succeeded is not None:
        (succeeded if ok else failed)()  # type: ignore[misc]  # both set together
    if lrs is not None:
        if status is ATTEMPT_NOT_STARTED:
            lrs.call_not_started()
        else:
            lrs.call_finished(ok)
    if inner is not None:
        inner(status)


def _attempt_labels(locality: Any, cluster: str) -> Mapping[str, str]:
    """The A78/A89 labels of a locality's calls (its locality, the cluster):
    one read-only mapping shared by the endpoints of a locality (not one
    per endpoint)."""
    try:
        return _shared_attempt_labels(locality, cluster)
    except TypeError:  # an unhashable locality attribute (a custom parent's)
        return _labels_of(locality, cluster)


def _labels_of(locality: Any, cluster: str) -> Mapping[str, str]:
    return MappingProxyType(
        {LOCALITY_LABEL: locality_label(locality), BACKEND_SERVICE_LABEL: cluster}
    )


_shared_attempt_labels = functools.lru_cache(maxsize=4096)(_labels_of)

#: fewer new endpoints than this (by position) are looked at one by one
_POSITIONAL_ENOUGH = 64


class CountedSubchannel(SubchannelWrapper):
    """What the child policy sees instead of the channel's subchannel: the
    real one plus the call counters of its endpoint's locality.  The picker
    hands ``real`` to the channel, so the channel never sees this wrapper
    (C-core's StatsSubchannelWrapper does the same)."""

    __slots__ = (
        "real",
        "address",
        "locality",
        "stats",
        "lrs",
        "attempt_labels",
        "counted",
        "hostname",
        "_owner",
        "_hooks",
    )

    def __init__(
        self,
        real: Subchannel,
        locality: Any,
        stats: LocalityCounters | None,
        owner: XdsClusterImplPolicy,
        lrs: Any = None,
        backend_service: str = "",
        hostname: str | None = None,
    ) -> None:
        self.real = real
        #: the endpoint's host name (EDS ``hostname``, a LOGICAL_DNS cluster's
        #: name), None when it has none: the ``:authority`` of its attempts
        #: on a route with A81 ``auto_host_rewrite``
        self.hostname = hostname or None
        self.address = real.address
        self.locality = locality
        self.stats = stats
        self.lrs = lrs
        #: A78/A89 per-attempt optional labels of every call sent to this
        #: endpoint (computed once: a pick only passes the mapping on);
        #: A89's backend service is the policy's cluster
        self.attempt_labels: Mapping[str, str] = _attempt_labels(locality, backend_service)
        self._owner = owner
        #: (lrs, child's trailers hook, the hook handed to the channel)
        self._hooks: tuple[Any, Any, Callable[[Any], None]] | None = None
        #: (child result, cluster calls, locality stats, load stats, counted
        #: result, the same with the A81 authority or None) of the last pick
        #: through this subchannel (see :meth:`count`)
        self.counted: Counted | None = None

    def count(self, result: PickComplete, calls: Any) -> Counted:
        """The pick result handed to the channel for the child's ``result``
        on this subchannel, counted into ``calls`` (the cluster's in-flight
        deque), this locality's stats and its load stats: the real
        subchannel, an ``on_call_done`` that records the end then calls the
        child's, the locality's A78 labels (merged with the child's own),
        the load stats' ORCA hook chained before the child's trailers hook.
        Every field of ``result`` is passed on (positionally:
        ``dataclasses.replace`` costs 10x; a unit test fails when
        PickComplete gains a field this does not name).  Remembered in
        :attr:`counted`: the same child result with the same counters and
        stats gets the same object back, so a pick allocates nothing.  With
        a host name, the same result with ``(AUTHORITY_HEADER, hostname)``
        added to its metadata is made too (A81 "xds_cluster_impl LB Policy
        Changes": the picker sets the authority of a rewriting route's
        attempts).  Returns the remembered tuple."""
        locality = self.stats
        lrs = self.lrs
        labels = result.attempt_labels  # a child's own labels too, merged (rare)
        labels = self.attempt_labels if labels is None else {**labels, **self.attempt_labels}
        trailers = result.on_call_trailers
        if lrs is not None and lrs.wants_backend_metrics:
            trailers = self.metrics_hook(trailers)
        done = _call_done(calls, locality, lrs, result.on_call_done)
        counted = PickComplete(self.real, done, trailers, labels, result.metadata)
        rewritten = None
        if self.hostname is not None:
            authority = ((AUTHORITY_HEADER, self.hostname),)
            metadata = result.metadata
            metadata = authority if metadata is None else (*metadata, *authority)
            rewritten = PickComplete(self.real, done, trailers, labels, metadata)
        memo = self.counted = (result, calls, locality, lrs, counted, rewritten)
        return memo

    def metrics_hook(self, inner: Callable[[Any], None] | None) -> Callable[[Any], None]:
        """The ``on_call_trailers`` that gives the attempt's ORCA report to
        this locality's load stats (A64/A85), then calls ``inner``; made
        once per (stats, inner hook)."""
        lrs = self.lrs
        hooks = self._hooks
        if hooks is not None and hooks[0] is lrs and hooks[1] is inner:
            return hooks[2]
        from pyxds.lb import orca  # ORCA's protos load with the first load report

        add = lrs.add_backend_metrics
        read = orca.report_from_trailers

        def on_call_trailers(trailers: Any) -> None:
            report = read(trailers)
            if report is not None:
                add(report)
            if inner is not None:
                inner(trailers)

        self._hooks = (lrs, inner, on_call_trailers)
        return on_call_trailers

    def watch_state(self, fn: Callable[[ConnectivityState, Status], None]) -> Callable[[], None]:
        return self.real.watch_state(fn)

    def shutdown(self) -> None:
        # the remembered child result names this wrapper (override_host's
        # constant result): forget it, so a removed endpoint leaves no
        # reference cycle for the garbage collector (issue 18)
        self.counted = None
        self._owner._untrack(self)
        self.real.shutdown()

    def __repr__(self) -> str:
        return f"CountedSubchannel({self.real!r}, {self.locality})"


class _ImplHelper(DelegatingHelper):
    """The child's helper: wraps each subchannel with its locality's
    counters, intercepts state."""

    def __init__(self, policy: XdsClusterImplPolicy) -> None:
        super().__init__(policy.helper)
        self.policy = policy

    def create_subchannel(self, address: str, attributes: Mapping[str, Any]) -> Subchannel:
        security = self.policy._security
        if security is not None:
            attributes = {**(attributes or {}), SECURITY_ATTRIBUTE: security}
        real = self.parent.create_subchannel(address, attributes)
        if not attributes:
            return self.policy._track(real, None)
        locality = attributes.get(LOCALITY_ATTRIBUTE)
        return self.policy._track(real, locality, attributes.get(ADDRESS_NAME_ATTRIBUTE))

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self.policy._child_reported(state, status, picker)


class XdsClusterImplPolicy(OneChildPolicy):
    """See the module docstring."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self._child = ChildPolicyHandler(_ImplHelper(self))
        self._config: XdsClusterImplConfig | None = None
        self._counters: ClusterCounters | None = None
        self._drops: tuple[tuple[str, float, PickDrop], ...] = ()
        self._drop_all = False
        self._max_requests = DEFAULT_MAX_REQUESTS
        self._subchannels: set[CountedSubchannel] = set()
        #: the tracked subchannels by address, one or (rarely) a list of
        #: them: no list per endpoint for the garbage collector (issue 18)
        self._by_address: dict[str, CountedSubchannel | list[CountedSubchannel]] = {}
        #: the last update's endpoints (``_relocate`` looks only at
        #: endpoints that were not in it)
        self._last_endpoints: tuple[Any, ...] = ()
        self._child_state: tuple[ConnectivityState, Status, Picker] | None = None
        self._updating = False
        self._dirty = False
        self._shut_down = False
        # Load reporting: (store, server, cluster, EDS service name, backend
        # metric propagation) or None, and the drop stats taken for it.
        self._lrs_key: tuple[Any, Any, str, str, Any] | None = None
        self._drop_stats: Any = None
        self._security: Any = None

    @property
    def counters(self) -> ClusterCounters | None:
        return self._counters

    # -- LoadBalancer --------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shut_down:
            return None
        config: XdsClusterImplConfig = update.config
        entry = cluster_entry(update.attributes, config.cluster_name, "xds_cluster_impl", leaf=True)
        if isinstance(entry, Status):
            return self._fail(entry)
        cluster = entry.cluster
        eds_service_name = cluster.eds_service_name if cluster.kind == "EDS" else None
        counters = cluster_counters(config.cluster_name, eds_service_name)
        load = cast(EndpointConfig, entry.children).endpoints  # (a leaf: cluster_entry)
        drops = tuple(
            (d.category, float(d.parts_per_million), drop_result(d.category))
            for d in (load.drop_overloads if load is not None else ())
            if d.parts_per_million > 0
        )
        max_requests = cluster.max_requests
        security = getattr(cluster, "security", None)
        if security != self._security and self._config is not None:
            # A29/A74: the cluster's TLS config changed: subchannels are keyed
            # by it, so the child starts over on new ones in this same update.
            self._child.shutdown()
            self._child = ChildPolicyHandler(_ImplHelper(self))
            self._child_state = None
        self._security = security
        if (
            counters is not self._counters
            or [d[:2] for d in drops] != [d[:2] for d in self._drops]
            or max_requests != self._max_requests
        ):
            self._dirty = True
        if counters is not self._counters:
            self._counters = counters
            for subchannel in self._subchannels:
                if subchannel.locality is not None:
                    subchannel.stats = counters.locality(subchannel.locality)
        lrs_key = self._load_report_key(update, cluster, config.cluster_name, eds_service_name)
        if lrs_key != self._lrs_key:
            self._set_load_reporting(lrs_key)
            self._dirty = True
        self._config = config
        if not isinstance(update.endpoints, Status):
            self._relocate(update.endpoints)
        self._drops = drops
        self._drop_all = any(t >= PARTS_PER_MILLION for _, t, _ in drops)
        self._max_requests = max_requests
        self._updating = True
        try:
            status = self._child.update(update.replace(config=config.child_policy))
        finally:
            self._updating = False
        self._publish()
        return status

    def shutdown(self) -> None:
        self._shut_down = True
        self._child.shutdown()
        self._set_load_reporting(None)
        self._last_endpoints = ()

    # -- load reporting ------------------------------------------------
    @staticmethod
    def _load_report_key(
        update: ResolverUpdate, cluster: Any, cluster_name: str, eds_service_name: str | None
    ) -> tuple[Any, Any, str, str, Any] | None:
        """Where this cluster's load goes, or None when it does not report."""
        if not getattr(cluster, "lrs_server", False):
            return None
        client = update.attributes.get(XDS_CLIENT_ATTRIBUTE)
        store = getattr(client, "load_store", None)
        if store is None or client is None:
            return None
        try:
            server = client.lrs_server_for(cluster_name)
        except LookupError as err:
            _log.warning("cluster %s: no LRS server: %s", cluster_name, err)
            return None
        propagation = getattr(cluster, "lrs_metrics", None)
        if propagation is not None and propagation.empty:
            propagation = None
        return (store, server, cluster_name, eds_service_name or "", propagation)

    def _set_load_reporting(self, key: tuple[Any, Any, str, str, Any] | None) -> None:
        """Give back the stats of the old key and take those of ``key``."""
        old = self._lrs_key
        if old is not None:
            store = old[0]
            if self._drop_stats is not None:
                store.release(self._drop_stats)
            for subchannel in self._subchannels:
                if subchannel.lrs is not None:
                    store.release(subchannel.lrs)
                    subchannel.lrs = None
        self._lrs_key = key
        self._drop_stats = None
        if key is None:
            return
        store, server, cluster_name, eds, _propagation = key
        self._drop_stats = store.drop_stats(server, cluster_name, eds)
        for subchannel in self._subchannels:
            subchannel.lrs = self._locality_lrs(subchannel.locality)

    def _locality_lrs(self, locality: Any) -> Any:
        key = self._lrs_key
        if key is None or locality is None:
            return None
        store, server, cluster_name, eds, propagation = key
        return store.locality_stats(server, cluster_name, eds, locality, propagation)

    # -- internals -----------------------------------------------------
    def _fail(self, status: Status) -> Status:
        self.helper.update_state(ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status))
        return status

    def _track(
        self, real: Subchannel, locality: Any, hostname: str | None = None
    ) -> CountedSubchannel:
        stats = None
        if locality is not None and self._counters is not None:
            stats = self._counters.locality(locality)
        cluster = self._config.cluster_name if self._config is not None else ""
        subchannel = CountedSubchannel(
            real, locality, stats, self, self._locality_lrs(locality), cluster, hostname
        )
        self._subchannels.add(subchannel)
        by_address = self._by_address
        same = by_address.setdefault(subchannel.address, subchannel)
        if same is not subchannel:
            if isinstance(same, list):
                same.append(subchannel)
            else:
                by_address[subchannel.address] = [same, subchannel]
        return subchannel

    def _relocate(self, endpoints: Any) -> None:
        """Give each subchannel whose address the update puts in another
        locality that locality's counters, load stats and labels from now on
        (calls in flight end where they started), and its endpoint's host
        name if that changed (A81's authority).  C-core gets there by
        building a new wrapper: its pick_first makes a new subchannel list on
        every update and its ring_hash passes the new endpoint to the
        endpoint's pick_first, so load follows the endpoint to its new
        locality (A27 "Load Reporting"; live: tests/e2e/
        test_differential_locality_move.py).  Runs per update, never per pick.

        An Endpoint object of the last update had its locality then already,
        so only new objects are looked at: the cds policy hands unchanged
        endpoints on as the same objects, and finding the new ones runs in C
        (issue 18: a 10,000-endpoint update costs no Python loop over every
        endpoint here)."""
        endpoints = tuple(endpoints)
        previous = self._last_endpoints  # alive: their ids are theirs
        self._last_endpoints = endpoints
        by_address = self._by_address
        if not by_address:
            return
        # at the same position as last time (one C pass), then, when
        # positions moved, anywhere in the last update (a set of ids)
        fresh = endpoints
        if previous:
            fresh = (
                *compress(endpoints, map(is_not, endpoints, previous)),
                *endpoints[len(previous) :],
            )
            if len(fresh) > _POSITIONAL_ENOUGH:
                known = set(map(id, previous)).__contains__
                fresh = tuple(compress(fresh, map(not_, map(known, map(id, fresh)))))
        for endpoint in fresh:
            attributes = endpoint.attributes
            if not attributes:
                continue
            locality = attributes.get(LOCALITY_ATTRIBUTE)
            hostname = attributes.get(ADDRESS_NAME_ATTRIBUTE) or None
            for address in endpoint.addresses:
                found = by_address.get(address)
                if found is None:
                    continue
                for subchannel in found if isinstance(found, list) else (found,):
                    if locality is not None and (
                        subchannel.locality is not locality and subchannel.locality != locality
                    ):
                        self._move(subchannel, locality)
                    if subchannel.hostname != hostname:  # A81: the endpoint's new name
                        subchannel.hostname = hostname
                        subchannel.counted = None

    def _move(self, subchannel: CountedSubchannel, locality: Any) -> None:
        if subchannel.lrs is not None and self._lrs_key is not None:
            self._lrs_key[0].release(subchannel.lrs)
        subchannel.locality = locality
        subchannel.stats = self._counters.locality(locality) if self._counters else None
        subchannel.lrs = self._locality_lrs(locality)
        cluster = self._config.cluster_name if self._config is not None else ""
        subchannel.attempt_labels = _attempt_labels(locality, cluster)
        subchannel.counted = None

    def _untrack(self, subchannel: CountedSubchannel) -> None:
        if subchannel in self._subchannels:
            self._subchannels.discard(subchannel)
            same = self._by_address[subchannel.address]
            if isinstance(same, list):
                same.remove(subchannel)
                if len(same) == 1:
                    self._by_address[subchannel.address] = same[0]
            else:
                del self._by_address[subchannel.address]
            if subchannel.lrs is not None and self._lrs_key is not None:
                self._lrs_key[0].release(subchannel.lrs)
                subchannel.lrs = None

    def _child_reported(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if self._shut_down:
            return
        self._child_state = (state, status, picker)
        self._dirty = True
        if not self._updating:
            self._publish()

    def _publish(self) -> None:
        if not self._dirty or self._counters is None:
            return
        if self._child_state is None:
            if not self._drop_all:
                return
            child_picker: Picker = QueuePicker()
            state, status = ConnectivityState.READY, OK_STATUS
        else:
            state, status, child_picker = self._child_state
            if self._drop_all:
                state, status = ConnectivityState.READY, OK_STATUS
        self._dirty = False
        picker = XdsClusterImplPicker(
            child_picker,
            self._drops,
            self._counters,
            self._max_requests,
            self.helper.random,
            self._drop_stats,
        )
        self.helper.update_state(state, status, picker)


class XdsClusterImplFactory(PolicyFactory):
    name = NAME

    def parse_config(self, json_config: Any) -> XdsClusterImplConfig:
        obj = expect_object(json_config, "")
        cluster_name = expect_string(obj, "clusterName", "")
        if "childPolicy" not in obj:
            raise LBConfigError("childPolicy", "required field missing")
        selection = registry.select_policy(obj["childPolicy"], "childPolicy")
        # A74: every other field (edsServiceName, maxConcurrentRequests,
        # dropCategories, lrsLoadReportingServer) is deprecated and ignored.
        return XdsClusterImplConfig(cluster_name, selection)

    def build(self, helper: Helper) -> XdsClusterImplPolicy:
        return XdsClusterImplPolicy(helper)


registry.register(XdsClusterImplFactory())
