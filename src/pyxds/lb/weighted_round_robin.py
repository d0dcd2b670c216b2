"""The ``weighted_round_robin`` LB policy (gRFC A58, with A51 backend
metrics and A114 custom utilization metrics).

round_robin whose rotation is weighted by the load each endpoint reports.
Everything round_robin does (A61 pick_first child per endpoint, children
kept across updates, aggregate state and its error text, reconnect on IDLE,
removed endpoints serving until the new list connects) is inherited from
:class:`pyxds.lb.round_robin.RoundRobin`; this module adds the weights.

Config (service config ``{"weighted_round_robin": {...}}``, A58 "LB Policy
Config and Parameters"; durations as JSON strings such as ``"10s"``):

=================================== ======= ==========================================
field                               default rule
=================================== ======= ==========================================
enableOobLoadReport                 false   out-of-band reports instead of per-call
oobReportingPeriod                  10s     OOB period asked of the backend
blackoutPeriod                      10s     reports needed for this long before use
weightExpirationPeriod              3m      a weight older than this is unused
weightUpdatePeriod                  1s      scheduler rebuild period, at least 100ms
errorUtilizationPenalty             1.0     must be >= 0
metricNamesForComputingUtilization  []      A114 (see :func:`pyxds.lb.orca.utilization`);
                                            a name A114 does not support is an error
=================================== ======= ==========================================

Weights (A58 "Subchannel Weights")
----------------------------------
Each endpoint (each round_robin child, so a weight survives updates that
keep the endpoint) has an :class:`EndpointWeight`.  A report with
utilization ``u > 0`` and ``qps > 0`` sets the weight to
``qps / (u + eps / qps * errorUtilizationPenalty)`` (the error term only
for ``eps > 0`` and a penalty above 0: grpcio 1.85's C-core ignores a
negative or NaN ``eps``, which A51 never lets a backend record, and an
infinite one under penalty 0); other reports are ignored.
``non_empty_since`` is the time of the first report that set a weight
since the endpoint last became READY (or since its weight expired);
``last_updated`` the time of the latest.  At scheduler build time a weight
is used only when it is younger than ``weightExpirationPeriod`` and (with a
non-zero ``blackoutPeriod``) the endpoint has been reporting for at least
``blackoutPeriod``; otherwise it counts as unknown (0).

Reports arrive per call (the default): each completed pick carries
``PickComplete.on_call_trailers``, which reads the call's
``endpoint-load-metrics-bin`` trailer (a missing or malformed trailer is no
report, never an RPC failure).  With ``enableOobLoadReport`` per-call
trailers are not read; instead every READY endpoint's subchannel has an OOB
watch (:func:`pyxds.lb.orca.watch_oob`) at ``oobReportingPeriod``, restarted
when that period changes, stopped when the option is turned off.

Per-call reports pyxds cannot see (a deviation from A58's letter, in
docs/differences-from-c-core.md): grpcio's C-core consumes the standard
``endpoint-load-metrics-bin`` trailer and never shows it to Python, so only
:mod:`pyxds.orca` backends (which also send it as
``x-endpoint-load-metrics-bin``) give per-call reports here.  When a call
to an endpoint ends without a report key pyxds can see (a malformed one
counts as seen: no weight, as in C-core) and the endpoint never gave one,
the endpoint gets an OOB watch at ``oobReportingPeriod`` as a
stand-in (Go and Java backends usually serve ``OpenRcaService`` next to
their per-call reports); a visible per-call report ends the stand-in.  An
endpoint whose backend does not serve OpenRcaService either has no weight
(A58: the mean of the others'; all of them: round robin, counted by A78's
``grpc.lb.wrr.rr_fallback``), logged once per cluster as a warning naming
the cluster, the address and why, and shown by ``config_dump()`` (each
endpoint's weight and where it comes from).

Picker and scheduler (A58 "EDF Scheduler")
------------------------------------------
The READY picker holds the READY endpoints' results and weights.  Its
scheduler is the static stride scheduler (:mod:`pyxds.lb.wrr_scheduler`),
materialized as one full period of picks and cycled from a random start; a
pick is one C call, as in round_robin.  Fewer than two known weights, or
all equal: plain round robin (A58).  The policy's timer rebuilds the
current picker's scheduler every ``weightUpdatePeriod`` (``helper.clock``)
by swapping the cycle it reads: picks in flight finish on the old one.  A
new picker is published when the READY set or the config changes; the same
config and list twice publish nothing.

Cost (issue 18 item 3: N endpoints connecting publish N pickers)
------------------------------------------------------------------
A READY report costs no Python pass over the other endpoints: each READY
endpoint's result (pick_first's own in OOB mode; with this policy's hooks,
made once per picker and weight, in per-call mode) is kept in round_robin's
READY lists (``RoundRobin._ready_result``), a published picker is keyed by
their version, and the picker copies results and weights in C.  Its
scheduler reads every weight, except while every weight is certainly 0:
:class:`FirstReport` keeps the earliest ``non_empty_since`` any weight of the
policy ever had, and while ``now`` is closer to it than both the blackout
and the expiration period no weight is usable and reading one would change
none, so the picker is round robin without reading them (what connecting
endpoints within the first blackout period build).  Anything else (removed
endpoints still serving, a custom leaf) takes the full path.  The weight
update timer's rebuild reads every weight (A58), but scales them again only
when they differ from the ones that picker scaled last (the integer weights
are a function of them alone): with steady reports, about half the cost
of a period (~1 ms instead of ~2 ms at 1000 endpoints).
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pyxds import metrics as _metrics
from pyxds._values import dataclass
from pyxds.clock import Clock, Timer
from pyxds.lb import orca, registry
from pyxds.lb.api import (
    ATTEMPT_NOT_STARTED,
    OK_STATUS,
    ConnectivityState,
    Helper,
    PickArgs,
    PickComplete,
    Picker,
    PickResult,
    PolicyFactory,
    ResolverUpdate,
    Status,
)
from pyxds.lb.errors import LBConfigError, describe, duration_field
from pyxds.lb.pick_first import _ReadyPicker, all_ready_pickers, constant_result
from pyxds.lb.round_robin import RoundRobin, _Child
from pyxds.lb.wrr_scheduler import materialize, max_weight_for, scale_weights

__all__ = [
    "POLICY_NAME",
    "WeightedRoundRobinConfig",
    "WeightedRoundRobinFactory",
    "WeightedRoundRobin",
    "WeightedRoundRobinPicker",
    "EndpointWeight",
    "MIN_WEIGHT_UPDATE_PERIOD",
]

POLICY_NAME = "weighted_round_robin"
_log = logging.getLogger(__name__)

MIN_WEIGHT_UPDATE_PERIOD = 0.1
DEFAULT_OOB_REPORTING_PERIOD = 10.0
DEFAULT_BLACKOUT_PERIOD = 10.0
DEFAULT_WEIGHT_EXPIRATION_PERIOD = 180.0
DEFAULT_WEIGHT_UPDATE_PERIOD = 1.0
DEFAULT_ERROR_UTILIZATION_PENALTY = 1.0
_READY = ConnectivityState.READY
#: a child's EndpointWeight (WeightedRoundRobin.weight_of made it), read in C
_WEIGHT_OF: Callable[[_Child], EndpointWeight] = operator.attrgetter("wrr_weight")


@dataclass(frozen=True)
class WeightedRoundRobinConfig:
    """Parsed ``weighted_round_robin`` config (durations in seconds)."""

    enable_oob_load_report: bool = False
    oob_reporting_period: float = DEFAULT_OOB_REPORTING_PERIOD
    blackout_period: float = DEFAULT_BLACKOUT_PERIOD
    weight_expiration_period: float = DEFAULT_WEIGHT_EXPIRATION_PERIOD
    weight_update_period: float = DEFAULT_WEIGHT_UPDATE_PERIOD
    error_utilization_penalty: float = DEFAULT_ERROR_UTILIZATION_PENALTY
    metric_names_for_computing_utilization: tuple[str, ...] = ()


def _number_string(text: str) -> float | None:
    """A decimal number written as a JSON string (``"1.5"``, ``" 2"``,
    ``"1e1"``), which grpcio 1.85 accepts for a number field; None when the
    string holds no finite number (NaN and infinities are refused as they are
    when written as numbers)."""
    try:
        number = float(text.strip(" \t\n\v\f\r"))
    except ValueError:
        return None
    return number if math.isfinite(number) else None


class WeightedRoundRobinFactory(PolicyFactory):
    name = POLICY_NAME

    def parse_config(self, json_config: Any) -> WeightedRoundRobinConfig:
        if json_config is None:
            return WeightedRoundRobinConfig()
        if not isinstance(json_config, dict):
            raise LBConfigError("", f"expected object, got {describe(json_config)}")
        oob = json_config.get("enableOobLoadReport", False)
        if not isinstance(oob, bool):
            raise LBConfigError("enableOobLoadReport", f"expected boolean, got {describe(oob)}")
        penalty = json_config.get("errorUtilizationPenalty", DEFAULT_ERROR_UTILIZATION_PENALTY)
        if isinstance(penalty, str):  # a number in a string, read as grpcio 1.85 does
            penalty = _number_string(penalty)
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)):
            raise LBConfigError(
                "errorUtilizationPenalty",
                f"expected number, got {describe(json_config['errorUtilizationPenalty'])}",
            )
        if not penalty >= 0 or math.isinf(penalty):  # also NaN
            raise LBConfigError("errorUtilizationPenalty", "must be non-negative")
        names = json_config.get("metricNamesForComputingUtilization", [])
        if not isinstance(names, list):
            raise LBConfigError(
                "metricNamesForComputingUtilization", f"expected array, got {describe(names)}"
            )
        for index, name in enumerate(names):
            if not isinstance(name, str):
                raise LBConfigError(
                    f"metricNamesForComputingUtilization[{index}]",
                    f"expected string, got {describe(name)}",
                )
            if not orca.supported_metric_name(name):
                # A114 lists the names it supports; grpcio 1.85's C-core
                # rejects the config for any other (a CDS with one is NACKed)
                # rather than parse a name it would then ignore.
                raise LBConfigError(
                    f"metricNamesForComputingUtilization[{index}]",
                    f'unsupported metric name "{name}"',
                )
        update_period = duration_field(
            json_config, "weightUpdatePeriod", "", DEFAULT_WEIGHT_UPDATE_PERIOD
        )
        return WeightedRoundRobinConfig(
            enable_oob_load_report=oob,
            oob_reporting_period=duration_field(
                json_config, "oobReportingPeriod", "", DEFAULT_OOB_REPORTING_PERIOD
            ),
            blackout_period=duration_field(
                json_config, "blackoutPeriod", "", DEFAULT_BLACKOUT_PERIOD
            ),
            weight_expiration_period=duration_field(
                json_config, "weightExpirationPeriod", "", DEFAULT_WEIGHT_EXPIRATION_PERIOD
            ),
            # A58: "Values less than 100ms are capped at 100ms."
            weight_update_period=max(update_period, MIN_WEIGHT_UPDATE_PERIOD),
            error_utilization_penalty=float(penalty),
            metric_names_for_computing_utilization=tuple(names),
        )

    def build(self, helper: Helper) -> WeightedRoundRobin:
        return WeightedRoundRobin(helper)


# -- weights -------------------------------------------------------------------


class FirstReport:
    """The earliest ``non_empty_since`` any weight of one policy ever had (a
    lower bound of every weight's current one: the clock only moves on).
    While ``now - at`` is below both the blackout and the expiration period,
    every weight of the policy is unusable and reading them would change
    none (:meth:`EndpointWeight.value`): a picker built then is round robin
    without asking each endpoint (issue 18: N endpoints connecting build N
    pickers, all inside the blackout period)."""

    __slots__ = ("at", "_lock")

    def __init__(self) -> None:
        self.at = math.inf
        self._lock = threading.Lock()

    def lower(self, now: float) -> None:
        """A weight's ``non_empty_since`` becomes ``now``."""
        if now < self.at:
            with self._lock:
                if now < self.at:
                    self.at = now

    def none_usable(self, config: WeightedRoundRobinConfig, now: float) -> bool:
        """Whether every weight sharing this (with ``config``) is 0 now and
        :meth:`EndpointWeight.value` would leave each as it is."""
        blackout = config.blackout_period
        return blackout > 0 and now - self.at < min(blackout, config.weight_expiration_period)


class EndpointWeight:
    """One endpoint's weight and its two timestamps (A58 "Subchannel
    Weights").  Reports arrive from RPC threads (per call) or the serializer
    (OOB); the scheduler reads on the serializer: a lock keeps the three
    values consistent."""

    __slots__ = (
        "_clock",
        "config",
        "weight",
        "non_empty_since",
        "last_updated",
        "_lock",
        "per_call_seen",
        "source",
        "no_report",
        "needs_stand_in",
        "on_need_stand_in",
        "_first",
    )

    def __init__(
        self,
        clock: Clock,
        config: WeightedRoundRobinConfig,
        first: FirstReport | None = None,
    ) -> None:
        self._clock = clock
        self.config = config
        #: the policy's earliest ``non_empty_since`` (shared by its weights)
        self._first = first
        self.weight = 0.0
        self.non_empty_since: float | None = None  # None: never / reset
        self.last_updated = -math.inf
        self._lock = threading.Lock()
        #: a per-call report was seen (pyxds.orca's mirror key)
        self.per_call_seen = False
        #: where the last report came from ("per-call", "out-of-band",
        #: "out-of-band (stand-in)"), "" before any
        self.source = ""
        #: why no report can be had (the backend does not serve
        #: OpenRcaService), "" while one may come
        self.no_report = ""
        #: per-call mode: a call ended with no visible report (OOB stand-in wanted)
        self.needs_stand_in = False
        #: called (any thread) when needs_stand_in or per_call_seen first turns true
        self.on_need_stand_in: Callable[[], None] | None = None

    def on_report(self, report: orca.OrcaLoadReport, source: str = "per-call") -> None:
        """Take one ORCA report into account (ignored unless it gives a weight)."""
        config = self.config
        qps = report.rps_fractional
        eps = report.eps
        utilization = orca.utilization(report, config.metric_names_for_computing_utilization)
        if not (utilization > 0 and qps > 0):
            return
        penalty = config.error_utilization_penalty
        if eps > 0 and penalty > 0:  # as C-core: no error term for eps <= 0, NaN,
            utilization += eps / qps * penalty  # or penalty 0 (inf * 0 is NaN)
        weight = qps / utilization
        if not (weight > 0) or math.isinf(weight):
            return
        now = self._clock.now()
        with self._lock:
            if self.non_empty_since is None:
                if self._first is not None:
                    self._first.lower(now)  # before the weight shows it
                self.non_empty_since = now
            self.last_updated = now
            self.weight = weight
            self.source = source

    def on_oob_report(self, report: orca.OrcaLoadReport) -> None:
        self.on_report(report, "out-of-band")

    def on_stand_in_report(self, report: orca.OrcaLoadReport) -> None:
        self.on_report(report, "out-of-band (stand-in)")

    def on_call_trailers(self, trailers: Sequence[tuple[str, Any]]) -> None:
        """``PickComplete.on_call_trailers``: the call's ORCA trailer, if any
        (a malformed one is no report, but says per-call reports are visible:
        no stand-in, as C-core would have none either)."""
        present, report = orca.trailer_report(trailers)
        if present and not self.per_call_seen:
            self.per_call_seen = True
            if self.needs_stand_in and self.on_need_stand_in is not None:
                self.on_need_stand_in()  # the stand-in is not needed any more
        if report is not None:
            self.on_report(report)

    def on_call_done(self, status: Status) -> None:
        """``PickComplete.on_call_done`` in per-call mode: a call that reached
        the backend ended (its trailers, if any, were read just before)."""
        if self.per_call_seen or self.needs_stand_in or status is ATTEMPT_NOT_STARTED:
            return
        self.needs_stand_in = True
        if self.on_need_stand_in is not None:
            self.on_need_stand_in()

    def became_ready(self) -> None:
        """The endpoint (re)connected: the blackout period starts over."""
        with self._lock:
            self.non_empty_since = None

    def value(self, now: float) -> float:
        """The weight to schedule with now, 0 when unusable."""
        config = self.config
        with self._lock:
            if now - self.last_updated >= config.weight_expiration_period:
                self.non_empty_since = None
                return 0.0
            blackout = config.blackout_period
            if blackout > 0 and (
                self.non_empty_since is None or now - self.non_empty_since < blackout
            ):
                return 0.0
            return self.weight

    def __repr__(self) -> str:
        return f"EndpointWeight({self.weight:g}, since={self.non_empty_since})"


def _record_scheduler_update(
    weights: Sequence[EndpointWeight], now: float, labels: Mapping[str, str]
) -> None:
    """A78's per-update WRR metrics: weights, not-yet-usable and stale counts."""
    not_yet_usable = stale = 0
    for weight in weights:
        config = weight.config
        with weight._lock:
            last, since, value = weight.last_updated, weight.non_empty_since, weight.weight
        if last == -math.inf:
            not_yet_usable += 1
            value = 0.0
        elif now - last >= config.weight_expiration_period:
            stale += 1
            value = 0.0
        elif config.blackout_period > 0 and (since is None or now - since < config.blackout_period):
            not_yet_usable += 1
            value = 0.0
        _metrics.record("grpc.lb.wrr.endpoint_weights", value, labels)
    if not_yet_usable:
        _metrics.add("grpc.lb.wrr.endpoint_weight_not_yet_usable", not_yet_usable, labels)
    if stale:
        _metrics.add("grpc.lb.wrr.endpoint_weight_stale", stale, labels)


def cluster_name(endpoints: Sequence[Any]) -> str:
    """The xDS cluster of the endpoints (cds's ``xds_cluster`` attribute), or ""."""
    for endpoint in endpoints:
        name = getattr(endpoint, "attributes", {}).get("xds_cluster")
        if name:
            return str(name)
    return ""


def _chain(first: Callable[[Status], None], second: Callable[[Status], None]) -> Any:
    def both(status: Status) -> None:
        first(status)
        second(status)

    return both


#: (channel target, cluster, stand-in) already warned about (one warning each)
_WARNED: set[tuple[str, str, bool]] = set()


def locality_label(endpoints: Sequence[Any]) -> str:
    """A78's ``grpc.lb.locality``: ``{region="r", zone="z", sub_zone="s"}`` or ""."""
    for endpoint in endpoints:
        locality = getattr(endpoint, "attributes", {}).get("locality")
        if locality is not None:
            return _metrics.locality_label(locality)
    return ""


# -- picker --------------------------------------------------------------------


class WeightedRoundRobinPicker(Picker):
    """Cycles over one materialized period of the stride scheduler.
    :meth:`rebuild` (the policy's timer, on the serializer) swaps the cycle;
    a pick reads whichever cycle is current (one attribute load, atomic)."""

    __slots__ = (
        "results",
        "weights",
        "_clock",
        "_random",
        "_scaled",
        "_next",
        "_labels",
        "_first",
        "_memo",
    )

    def __init__(
        self,
        results: Sequence[PickComplete],
        weights: Sequence[EndpointWeight],
        clock: Clock,
        rng: Any,
        metric_labels: Mapping[str, str] | None = None,
        first: FirstReport | None = None,
    ) -> None:
        self._labels = metric_labels  # A78 grpc.target / grpc.lb.locality
        self.results = tuple(results)
        self.weights = tuple(weights)
        #: the weights' shared FirstReport (they all share it and one config)
        self._first = first
        self._clock = clock
        self._random = rng
        self._scaled: tuple[int, ...] | Literal[False] | None = False  # False: never built
        #: the weights last read and what scale_weights made of them (a pure
        #: function: the same weights, the same integer weights)
        self._memo: tuple[list[float], tuple[int, ...] | None] | None = None
        self._next: Callable[[], PickResult] = itertools.cycle(self.results).__next__
        self.rebuild()

    def pick(self, args: PickArgs) -> PickResult:
        return self._next()

    @property
    def scaled_weights(self) -> tuple[int, ...] | None:
        """The integer weights in use (None: round robin)."""
        return self._scaled if self._scaled is not False else None

    def rebuild(self) -> None:
        """Read every endpoint's weight now and rebuild the scheduler (a no-op
        when the integer weights did not change)."""
        now = self._clock.now()
        n = len(self.results)
        top = max_weight_for(n)
        labels = self._labels if _metrics.RECORDER is not None else None
        if labels is not None:
            _record_scheduler_update(self.weights, now, labels)
        first = self._first
        scaled: tuple[int, ...] | None
        if first is not None and n and first.none_usable(self.weights[0].config, now):
            scaled = None  # every value() would be 0 (FirstReport)
        else:
            values = [weight.value(now) for weight in self.weights]
            memo = self._memo
            if memo is not None and memo[0] == values:
                scaled = memo[1]  # unchanged weights (each rebuild period)
            else:
                scaled = scale_weights(values, top)
                self._memo = (values, scaled)
        if labels is not None and scaled is None:
            _metrics.add("grpc.lb.wrr.rr_fallback", 1, labels)
        if scaled == self._scaled:
            return
        self._scaled = scaled
        if scaled is None:
            table = list(self.results)
        else:
            table = [self.results[i] for i in materialize(scaled, top)]
        start = self._random.randrange(len(table))
        self._next = itertools.cycle(table[start:] + table[:start]).__next__

    def __repr__(self) -> str:
        addresses = [r.subchannel.address for r in self.results]
        return f"WeightedRoundRobinPicker({addresses}, weights={self.scaled_weights})"


# -- policy --------------------------------------------------------------------


class WeightedRoundRobin(RoundRobin):
    """round_robin plus endpoint weights (module docstring)."""

    def __init__(self, helper: Helper) -> None:
        self._config = WeightedRoundRobinConfig()
        self._timer: Timer | None = None
        #: the period the running weight update timer was started with
        self._timer_period = DEFAULT_WEIGHT_UPDATE_PERIOD
        self._picker: WeightedRoundRobinPicker | None = None
        #: child -> its OOB watch (subchannel watched, period, stand-in for per-call)
        self._oob: dict[_Child, _OobWatch] = {}
        self._locality = ""
        self._cluster = ""
        #: the child whose state report is being applied (None: any other change)
        self._reporting: _Child | None = None
        #: the earliest report of any of this policy's weights (FirstReport)
        self._first_report = FirstReport()
        #: every weight's ``on_need_stand_in`` (one for the policy, not a
        #: closure per endpoint)
        self._need_stand_in = self._stand_in_needed
        super().__init__(helper)

    # -- LoadBalancer ----------------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if not isinstance(update.endpoints, Status):
            self._locality = locality_label(update.endpoints)
            self._cluster = cluster_name(update.endpoints)
        if isinstance(update.config, WeightedRoundRobinConfig):
            if update.config != self._config:
                # round_robin skips an update of the very endpoint objects it
                # has (cds hands an unchanged locality's on): a new config
                # takes the full path, which lists every READY result again
                # (_ready_result: the mode decides their hooks), publishes
                # and syncs the OOB watches
                self._last_list = None
            self._config = update.config
            for child in self.children:
                weight = getattr(child, "wrr_weight", None)
                if weight is not None:
                    weight.config = self._config
        return super().update(update)

    def shutdown(self) -> None:
        self._cancel_timer()
        self._picker = None
        for watch in self._oob.values():
            watch.cancel()
        self._oob.clear()
        super().shutdown()

    # -- weights ---------------------------------------------------------------
    def weight_of(self, child: _Child) -> EndpointWeight:
        weight = getattr(child, "wrr_weight", None)
        if weight is None:
            weight = EndpointWeight(self.helper.clock, self._config, self._first_report)
            weight.on_need_stand_in = self._need_stand_in
            # round_robin's child carries this policy's state for it (no slot declared there)
            child.wrr_weight = weight  # type: ignore[attr-defined]  # per-policy state on the child
        return weight

    def _stand_in_needed(self) -> None:  # from an RPC thread: hop onto the serializer
        self.helper.clock.call_later(0, self._sync_oob)

    # -- round_robin hooks -----------------------------------------------------
    def _on_child_state(
        self, child: _Child, state: ConnectivityState, status: Status, picker: Picker
    ) -> None:
        if state is _READY and child.state is not _READY:
            self.weight_of(child).became_ready()
        outer, self._reporting = self._reporting, child
        try:
            super()._on_child_state(child, state, status, picker)
        finally:
            self._reporting = outer

    def _aggregate(self) -> None:
        super()._aggregate()
        child = self._reporting
        if child is None:
            self._sync_oob()
        elif not self._shutdown:
            # one child's report changes only that child's watch (a pass
            # over every child per report made connecting N endpoints cost
            # N^2: ~0.45 s of CPU at 1000 endpoints)
            if child.index >= 0:
                self._sync_oob_child(child)
            elif child in self._oob:
                self._stop_oob(child)  # an old endpoint, draining

    def _ready_result(self, child: _Child, picker: Picker) -> PickComplete | None:
        """What the READY picker rotates over for ``child``: its pick_first
        result, with this policy's hooks in per-call mode (kept while its
        picker and weight stay: round_robin keeps the results of the READY
        children listed, so a READY report costs no pass over the others);
        None when ``picker`` is not pick_first's constant one."""
        result = constant_result(picker)
        if result is None:
            return None
        weight = self.weight_of(child)
        if self._config.enable_oob_load_report:
            return result  # no hooks: the child's own result
        cached = getattr(child, "wrr_result", None)
        if cached is not None and cached[0] is picker and cached[1] is weight:
            return cached[2]  # type: ignore[no-any-return]  # the tuple stored below
        done = result.on_call_done
        done = weight.on_call_done if done is None else _chain(done, weight.on_call_done)
        complete = PickComplete(
            result.subchannel, done, weight.on_call_trailers, result.attempt_labels, result.metadata
        )
        child.wrr_result = (picker, weight, complete)  # type: ignore[attr-defined]  # as wrr_weight
        return complete

    def _report_ready(self, ready: list[_Child]) -> None:
        config = self._config
        reported = self._reported_key
        if ready is self._ready_children:
            # the current READY children, their results listed already
            # (round_robin's bookkeeping): keyed by their version
            if self._non_constant:
                super()._report_ready(ready)  # not pick_first children: unweighted
                return
            key: tuple[Any, ...] = (_READY, config, self._ready_version)
            if key == reported:
                return
            if (
                reported is not None
                and len(reported) == 2 + len(ready)
                and reported[:2] == (_READY, config)
                and list(reported[2:]) == self._ready_pickers
            ):
                # the same pickers published by themselves (e.g. while
                # draining): nothing to publish
                self._reported_key = key
                return
            results: list[PickComplete] = self._ready_results  # type: ignore[assignment]  # no None: _non_constant is 0
        else:  # removed children serving: no current child is READY
            pickers = [child.picker for child in ready]
            if not all_ready_pickers(pickers):
                super()._report_ready(ready)  # not pick_first children: unweighted
                return
            key = (_READY, config, *pickers)
            if key == reported:
                return
            results = [
                self._ready_result(child, picker)  # type: ignore[misc]  # constant pickers
                for child, picker in zip(ready, pickers, strict=True)
            ]
        weights = list(map(_WEIGHT_OF, ready))  # each made by _ready_result
        labels = None
        if _metrics.RECORDER is not None:
            labels = {
                "grpc.target": getattr(self.helper, "channel_target", ""),
                "grpc.lb.locality": self._locality,
                # A89: the cluster of the endpoints (xds_cluster_impl's)
                "grpc.lb.backend_service": self._cluster,
            }
        wrr = WeightedRoundRobinPicker(
            results, weights, self.helper.clock, self.helper.random, labels, self._first_report
        )
        self._report(_READY, OK_STATUS, wrr, key)

    def _report(
        self, state: ConnectivityState, status: Status, picker: Picker, key: tuple[Any, ...]
    ) -> None:
        if key == self._reported_key:
            return
        if isinstance(picker, WeightedRoundRobinPicker):
            self._picker = picker
            period = self._config.weight_update_period
            if self._timer is not None and self._timer_period != period:
                # a new weightUpdatePeriod counts from this picker (C-core:
                # each picker runs its own timer at its config's period)
                self._cancel_timer()
            if self._timer is None:
                self._timer_period = period
                self._timer = self.helper.clock.call_later(period, self._on_timer)
        else:
            self._picker = None
            self._cancel_timer()
        super()._report(state, status, picker, key)

    # -- weight update timer ------------------------------------------------------
    def _on_timer(self) -> None:
        self._timer = None
        if self._shutdown or self._picker is None:
            return
        self._picker.rebuild()
        self._timer_period = self._config.weight_update_period
        self._timer = self.helper.clock.call_later(self._timer_period, self._on_timer)

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    # -- out-of-band reports -------------------------------------------------------
    def _sync_oob(self) -> None:
        """One OOB watch per READY endpoint while enableOobLoadReport, at the
        configured period; in per-call mode one per READY endpoint that needs
        the stand-in (module docstring); none otherwise."""
        if self._shutdown:
            return
        live = set(self.children)
        for child in list(self._oob):
            if child not in live:
                self._stop_oob(child)
        for child in live:
            self._sync_oob_child(child)

    def _wants_oob(self, child: _Child) -> bool:
        if self._config.enable_oob_load_report:
            return True
        weight = getattr(child, "wrr_weight", None)
        return (
            weight is not None
            and weight.needs_stand_in
            and not weight.per_call_seen
            and not weight.no_report
        )

    def _sync_oob_child(self, child: _Child) -> None:
        config = self._config
        want: tuple[Any, float, bool] | None = None
        if (
            not child.closed
            and child.state is _READY
            and type(child.picker) is _ReadyPicker
            and self._wants_oob(child)
        ):
            stand_in = not config.enable_oob_load_report
            want = (child.picker.subchannel, config.oob_reporting_period, stand_in)
        have = self._oob.get(child)
        if have is not None and (
            want is None
            or have.subchannel is not want[0]
            or have.period != want[1]
            or have.stand_in != want[2]
        ):
            self._stop_oob(child)
            have = None
        if want is not None and have is None:
            weight = self.weight_of(child)
            on_report = weight.on_stand_in_report if want[2] else weight.on_oob_report
            watch = _OobWatch(self, weight, *want)
            watch.unsubscribe = orca.watch_oob(want[0], want[1], on_report, watch)
            self._oob[child] = watch

    def _no_oob(self, weight: EndpointWeight, address: str, details: str) -> None:
        """The backend does not serve OpenRcaService (on the serializer)."""
        stand_in = not self._config.enable_oob_load_report
        weight.no_report = (
            "its backend does not serve OpenRcaService (out-of-band load reports)"
            + (
                " and grpcio hides its per-call reports (endpoint-load-metrics-bin), if any"
                if stand_in
                else ""
            )
            + (f": {details}" if details else "")
        )
        key = (getattr(self.helper, "channel_target", ""), self._cluster, stand_in)
        if key not in _WARNED:
            _WARNED.add(key)
            _log.warning(
                "pyxds: cluster %s: weighted_round_robin gets no load reports from %s: %s; "
                "such endpoints get no weight of their own (round robin when none has one)",
                self._cluster or "?",
                address,
                weight.no_report,
            )

    def config_dump(self) -> dict[str, Any]:
        """Each endpoint's weight (0: none usable now) and where it comes from."""
        now = self.helper.clock.now()
        rows = []
        for child in self.children:
            weight = getattr(child, "wrr_weight", None)
            row: dict[str, Any] = {"addresses": sorted(child.addresses)}
            if weight is not None:
                row["weight"] = round(weight.value(now), 6)
                row["source"] = weight.source or "none yet"
                if weight.no_report:
                    row["no_weight"] = weight.no_report
            else:
                row["weight"] = 0.0
                row["source"] = "none yet"
            rows.append(row)
        mode = "out-of-band" if self._config.enable_oob_load_report else "per-call"
        out: dict[str, Any] = {"reporting": mode, "endpoint_weights": rows}
        if self._cluster:
            out["cluster"] = self._cluster
        return out

    def _stop_oob(self, child: _Child) -> None:
        self._oob.pop(child).cancel()


class _OobWatch:
    """One endpoint's OOB watch (its subchannel, period and mode, and the
    unsubscribe), and its ``on_unimplemented``: one slotted object per
    endpoint instead of a closure, its defaults and a tuple (issue 18,
    memory per endpoint)."""

    __slots__ = ("policy", "weight", "subchannel", "period", "stand_in", "unsubscribe")

    def __init__(
        self,
        policy: WeightedRoundRobin,
        weight: EndpointWeight,
        subchannel: Any,
        period: float,
        stand_in: bool,
    ) -> None:
        self.policy = policy
        self.weight = weight
        self.subchannel = subchannel
        self.period = period
        self.stand_in = stand_in
        self.unsubscribe: Callable[[], None] | None = None

    def __call__(self, details: str) -> None:
        """The backend does not serve OpenRcaService (on the serializer)."""
        address = str(getattr(self.subchannel, "address", "?"))
        self.policy._no_oob(self.weight, address, details)

    def cancel(self) -> None:
        unsubscribe, self.unsubscribe = self.unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()


registry.register(WeightedRoundRobinFactory())
