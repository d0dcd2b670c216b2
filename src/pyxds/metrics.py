"""gRPC metrics (gRFC A66, A78) through the OpenTelemetry API, off by default.

    from opentelemetry.sdk.metrics import MeterProvider
    import pyxds.metrics

    pyxds.metrics.enable(MeterProvider(metric_readers=[reader]))
    ...
    pyxds.metrics.disable()

Optional labels (A78, as C-core's ``AddOptionalLabel`` and grpc-go's
``MetricsOptions.OptionalLabels``) are emitted only when enabled::

    pyxds.metrics.enable(provider, optional_labels=["grpc.lb.locality"])

An enabled optional label is then on every point of the instruments that
declare it, with the value the LB policy set, or "" when none did (A78: "If
no locality information is available, the label will be set to the empty
string").  ``grpc.lb.locality`` is set on ``grpc.client.attempt.duration`` by
``xds_cluster_impl`` for the endpoint the attempt was sent to, and on the
``grpc.lb.wrr.*`` metrics by ``weighted_round_robin`` for its locality.

``pip install pyxds[otel]`` brings the OpenTelemetry API; nothing imports it
until :func:`enable`. While disabled, every recording site costs one module
attribute check (``metrics.RECORDER is None``).

Instruments (names, units and labels as A66/A78; :data:`INSTRUMENTS`):

* per call and call attempt (A66): ``grpc.client.call.duration``,
  ``grpc.client.attempt.started``, ``grpc.client.attempt.duration`` and
  ``grpc.client.attempt.sent_total_compressed_message_size`` /
  ``rcvd_total_compressed_message_size`` for pyxds channels (the serialized
  message bytes of each attempt: the size before grpcio compresses, when
  compression is on);
* pick_first (A78): ``grpc.lb.pick_first.disconnections``,
  ``connection_attempts_succeeded``, ``connection_attempts_failed``;
* XdsClient (A78): ``grpc.xds_client.connected``, ``server_failure``,
  ``resource_updates_valid``, ``resource_updates_invalid``, ``resources``;
* weighted_round_robin (A78, declared for that policy to record):
  ``grpc.lb.wrr.rr_fallback``, ``endpoint_weight_not_yet_usable``,
  ``endpoint_weight_stale``, ``endpoint_weights``.

A66's per-call metrics are recorded once metrics are enabled
(:data:`DEFAULT_METRICS`); A78's are experimental and off by default (A78
"Metric Stability", as in C-core and grpc-go) until named::

    pyxds.metrics.enable(provider, enable_metrics=["grpc.lb.wrr.rr_fallback"])

A policy or component records with :func:`add` (counters) and :func:`record`
(histograms) under a name of :data:`INSTRUMENTS`, or registers a gauge's
observer with :func:`observe`::

    if metrics.RECORDER is not None:
        metrics.add("grpc.lb.wrr.rr_fallback", 1,
                    {"grpc.target": target, "grpc.lb.locality": locality})
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyxds._values import dataclass

_log = logging.getLogger(__name__)

Labels = Mapping[str, str]
Observation = tuple[float, Labels]


@dataclass(frozen=True)
class Instrument:
    """One metric: its OpenTelemetry kind, unit, labels (A66/A78 tables)."""

    name: str
    kind: str  # "counter" | "histogram" | "gauge"
    unit: str
    description: str
    labels: tuple[str, ...]
    optional_labels: tuple[str, ...] = ()


_T = "grpc.target"
_M = "grpc.method"
_S = "grpc.status"
_LOC = "grpc.lb.locality"
_BS = "grpc.lb.backend_service"  # A89
_SERVER = "grpc.xds.server"
_RTYPE = "grpc.xds.resource_type"

INSTRUMENTS: dict[str, Instrument] = {
    i.name: i
    for i in (
        Instrument(
            "grpc.client.attempt.started",
            "counter",
            "{attempt}",
            "Number of client call attempts started.",
            (_M, _T),
        ),
        Instrument(
            "grpc.client.call.duration",
            "histogram",
            "s",
            "End-to-end time the gRPC library takes to complete a client call, from the"
            " application's perspective.",
            (_M, _T, _S),
        ),
        Instrument(
            "grpc.client.attempt.duration",
            "histogram",
            "s",
            "End-to-end time taken to complete a client call attempt, pick included.",
            (_M, _T, _S),
            (_LOC, _BS),
        ),
        Instrument(
            "grpc.client.attempt.sent_total_compressed_message_size",
            "histogram",
            "By",
            "Total bytes (compressed but not encrypted) sent across all request messages"
            " (metadata excluded) per RPC attempt; does not include grpc or transport"
            " framing bytes.",
            (_M, _T, _S),
            (_LOC, _BS),
        ),
        Instrument(
            "grpc.client.attempt.rcvd_total_compressed_message_size",
            "histogram",
            "By",
            "Total bytes (compressed but not encrypted) received across all response"
            " messages (metadata excluded) per RPC attempt; does not include grpc or"
            " transport framing bytes.",
            (_M, _T, _S),
            (_LOC, _BS),
        ),
        Instrument(
            "grpc.lb.pick_first.disconnections",
            "counter",
            "{disconnection}",
            "Number of times the selected subchannel becomes disconnected.",
            (_T,),
        ),
        Instrument(
            "grpc.lb.pick_first.connection_attempts_succeeded",
            "counter",
            "{attempt}",
            "Number of successful connection attempts.",
            (_T,),
        ),
        Instrument(
            "grpc.lb.pick_first.connection_attempts_failed",
            "counter",
            "{attempt}",
            "Number of failed connection attempts.",
            (_T,),
        ),
        Instrument(
            "grpc.lb.wrr.rr_fallback",
            "counter",
            "{update}",
            "Number of scheduler updates in which there were not enough endpoints with "
            "valid weight, which caused the WRR policy to fall back to RR behavior.",
            (_T,),
            (_LOC, _BS),
        ),
        Instrument(
            "grpc.lb.wrr.endpoint_weight_not_yet_usable",
            "counter",
            "{endpoint}",
            "Number of endpoints from each scheduler update that don't yet have usable "
            "weight information.",
            (_T,),
            (_LOC, _BS),
        ),
        Instrument(
            "grpc.lb.wrr.endpoint_weight_stale",
            "counter",
            "{endpoint}",
            "Number of endpoints from each scheduler update whose latest weight is older "
            "than the expiration period.",
            (_T,),
            (_LOC, _BS),
        ),
        Instrument(
            "grpc.lb.wrr.endpoint_weights",
            "histogram",
            "{weight}",
            "Weight of each endpoint, recorded on every scheduler update.",
            (_T,),
            (_LOC, _BS),
        ),
        Instrument(
            "grpc.xds_client.connected",
            "gauge",
            "{bool}",
            "Whether or not the xDS client currently has a working ADS stream to the xDS server.",
            (_T, _SERVER),
        ),
        Instrument(
            "grpc.xds_client.server_failure",
            "counter",
            "{failure}",
            "A counter of xDS servers going from healthy to unhealthy.",
            (_T, _SERVER),
        ),
        Instrument(
            "grpc.xds_client.resource_updates_valid",
            "counter",
            "{resource}",
            "A counter of resources received that were considered valid.",
            (_T, _SERVER, _RTYPE),
        ),
        Instrument(
            "grpc.xds_client.resource_updates_invalid",
            "counter",
            "{resource}",
            "A counter of resources received that were considered invalid.",
            (_T, _SERVER, _RTYPE),
        ),
        Instrument(
            "grpc.xds_client.resources",
            "gauge",
            "{resource}",
            "Number of xDS resources.",
            (_T, "grpc.xds.authority", "grpc.xds.cache_state", _RTYPE),
        ),
    )
}

#: The metrics recorded by default: A66's per-call ones.  A78's (WRR,
#: pick_first, XdsClient) "start as experimental and therefore off by
#: default" (A78 "Metric Stability"; C-core's ``enable_by_default=false``,
#: grpc-go's ``DefaultMetrics()``): :func:`enable` turns them on by name.
DEFAULT_METRICS = frozenset(name for name in INSTRUMENTS if name.startswith("grpc.client."))

#: A66 latency buckets (seconds) for the duration histograms.
LATENCY_BUCKETS = (
    0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13,
    0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1, 2, 5, 10, 20, 50, 100,
)  # fmt: skip

#: A66 size buckets (bytes) for the message-size histograms.
SIZE_BUCKETS = (
    0, 1024, 2048, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
    268435456, 1073741824, 4294967296,
)  # fmt: skip

_observers: dict[str, list[Callable[[], Iterable[Observation]]]] = {}
_lock = threading.Lock()

#: every optional label some instrument declares (what ``enable`` accepts)
OPTIONAL_LABELS = frozenset(label for i in INSTRUMENTS.values() for label in i.optional_labels)


def locality_label(locality: Any) -> str:
    """A78's ``grpc.lb.locality`` value of a locality (an object with
    ``region``, ``zone``, ``sub_zone``): ``{region="r", zone="z", sub_zone="s"}``,
    the form C-core's locality names print as; "" for None."""
    if locality is None:
        return ""
    return f'{{region="{locality.region}", zone="{locality.zone}", sub_zone="{locality.sub_zone}"}}'


class _OtelRecorder:
    """The instruments of one OpenTelemetry meter and the optional labels enabled."""

    def __init__(
        self,
        meter_provider: Any,
        optional_labels: frozenset[str] = frozenset(),
        generic_method_attribute_filter: Callable[[str], bool] | None = None,
        enabled: frozenset[str] = DEFAULT_METRICS,
    ) -> None:
        self.optional_labels = optional_labels
        #: the instruments recorded (the others are not even created)
        self.enabled = enabled
        self.generic_method_attribute_filter = generic_method_attribute_filter
        #: per instrument: (optional labels to drop, enabled optional labels)
        self.shape: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
            inst.name: (
                frozenset(inst.optional_labels) - optional_labels,
                tuple(label for label in inst.optional_labels if label in optional_labels),
            )
            for inst in INSTRUMENTS.values()
        }
        from importlib.metadata import PackageNotFoundError, version

        try:
            pyxds_version = version("pyxds")
        except PackageNotFoundError:
            pyxds_version = None
        meter = meter_provider.get_meter("grpc-python-pyxds", pyxds_version)
        self.counters: dict[str, Any] = {}
        self.histograms: dict[str, Any] = {}
        for inst in INSTRUMENTS.values():
            if inst.name not in enabled:
                continue
            if inst.kind == "counter":
                self.counters[inst.name] = meter.create_counter(
                    inst.name, unit=inst.unit, description=inst.description
                )
            elif inst.kind == "histogram":
                kwargs: dict[str, Any] = {}
                if inst.unit == "s":
                    kwargs["explicit_bucket_boundaries_advisory"] = list(LATENCY_BUCKETS)
                elif inst.unit == "By":
                    kwargs["explicit_bucket_boundaries_advisory"] = list(SIZE_BUCKETS)
                try:
                    self.histograms[inst.name] = meter.create_histogram(
                        inst.name, unit=inst.unit, description=inst.description, **kwargs
                    )
                except TypeError:  # an API without bucket advice
                    self.histograms[inst.name] = meter.create_histogram(
                        inst.name, unit=inst.unit, description=inst.description
                    )
            else:
                meter.create_observable_gauge(
                    inst.name,
                    callbacks=[_gauge_callback(inst.name)],
                    unit=inst.unit,
                    description=inst.description,
                )

    def labels(self, name: str, labels: Labels) -> dict[str, str]:
        """``labels`` as emitted for ``name``: optional labels not enabled are
        left out, enabled ones the caller did not set are ""."""
        drop, fill = self.shape[name]
        if not drop and not fill:
            return dict(labels)
        out = {key: value for key, value in labels.items() if key not in drop}
        for key in fill:
            out.setdefault(key, "")
        return out


def _gauge_callback(name: str) -> Callable[[Any], Iterable[Any]]:
    def callback(_options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation as OtelObservation

        recorder = RECORDER
        if recorder is None:
            return []
        with _lock:
            observers = list(_observers.get(name, ()))
        out: list[OtelObservation] = []
        for observer in observers:
            try:
                out.extend(
                    OtelObservation(value, recorder.labels(name, labels))
                    for value, labels in observer()
                )
            except Exception:  # an observer must never break the collection
                continue
        return out

    return callback


#: The active recorder, or None while metrics are off (the one check on hot paths).
RECORDER: _OtelRecorder | None = None


def enable(
    meter_provider: Any = None,
    optional_labels: Iterable[str] = (),
    generic_method_attribute_filter: Callable[[str], bool] | None = None,
    enable_metrics: Iterable[str] = (),
    disable_metrics: Iterable[str] = (),
) -> None:
    """Record pyxds metrics with ``meter_provider``.  None records nothing
    (A66 "Language-Specific Details": "A MeterProvider not being set should
    result in a no-op ... gRPC implementations should *NOT* fallback on this
    global"; grpcio's ``OpenTelemetryPlugin(meter_provider=None)`` records
    nothing either): metrics stay (or turn) off, with a warning.  To use
    OpenTelemetry's global provider, pass it:
    ``enable(opentelemetry.metrics.get_meter_provider())``.
    ``optional_labels``: the optional labels to emit (A78;
    e.g. ``["grpc.lb.locality"]``), none by default.  A name no instrument
    declares raises ValueError (before anything changes).

    ``generic_method_attribute_filter`` (A66 "Attributes", as grpcio's
    ``OpenTelemetryPlugin``): called with the method (``pkg.Service/Method``)
    of an RPC whose multicallable was not made with ``_registered_method=True``
    (generated stubs register theirs); True records the method's name, False
    records ``"other"``.  Without it every such method is ``"other"``.

    ``enable_metrics`` / ``disable_metrics`` (A79, as C++'s
    ``EnableMetrics``/``DisableMetrics`` and grpc-go's
    ``DefaultMetrics().Add/Remove``): instrument names to record besides
    :data:`DEFAULT_METRICS` (A66's), e.g. A78's ``grpc.lb.wrr.rr_fallback``,
    and names not to record.  An unknown name raises ValueError."""
    global RECORDER
    if isinstance(optional_labels, str):
        optional_labels = (optional_labels,)
    wanted = frozenset(optional_labels)
    unknown = sorted(wanted - OPTIONAL_LABELS)
    if unknown:
        raise ValueError(
            f"optional_labels: unknown label {unknown[0]!r}; pyxds records these optional"
            f" labels: {', '.join(sorted(OPTIONAL_LABELS))}"
        )
    on = frozenset((enable_metrics,) if isinstance(enable_metrics, str) else enable_metrics)
    off = frozenset((disable_metrics,) if isinstance(disable_metrics, str) else disable_metrics)
    for what, names in (("enable_metrics", on), ("disable_metrics", off)):
        unknown = sorted(names - INSTRUMENTS.keys())
        if unknown:
            raise ValueError(f"{what}: unknown metric {unknown[0]!r}")
    enabled = (DEFAULT_METRICS | on) - off
    if meter_provider is None:
        _log.warning(
            "pyxds.metrics.enable() without a MeterProvider records nothing (gRFC A66:"
            " no fallback on OpenTelemetry's global provider); pass one"
        )
        RECORDER = None
        return
    RECORDER = _OtelRecorder(meter_provider, wanted, generic_method_attribute_filter, enabled)


#: ``grpc.method`` of an RPC of a generic (not registered) method (A66)
OTHER_METHOD = "other"


def method_recorded(method: str) -> bool:
    """Whether the generic method ``method`` is recorded by its name (the
    user's ``generic_method_attribute_filter`` says so; A66), else "other"."""
    recorder = RECORDER
    chooser = recorder.generic_method_attribute_filter if recorder is not None else None
    if chooser is None:
        return False
    try:
        return bool(chooser(method))
    except Exception:  # a user's filter must never fail an RPC
        return False


def disable() -> None:
    """Stop recording (gauges stop reporting at the next collection)."""
    global RECORDER
    RECORDER = None


def add(name: str, value: int, labels: Labels) -> None:
    """Add ``value`` to the counter ``name`` (no-op while disabled)."""
    recorder = RECORDER
    if recorder is not None:
        counter = recorder.counters.get(name)
        if counter is not None:  # None: not enabled
            counter.add(value, recorder.labels(name, labels))


def record(name: str, value: float, labels: Labels) -> None:
    """Record ``value`` in the histogram ``name`` (no-op while disabled)."""
    recorder = RECORDER
    if recorder is not None:
        histogram = recorder.histograms.get(name)
        if histogram is not None:  # None: not enabled
            histogram.record(value, recorder.labels(name, labels))


def observe(name: str, observer: Callable[[], Iterable[Observation]]) -> None:
    """Register a gauge observer: ``observer()`` yields ``(value, labels)`` at collection.

    ``name`` must be a gauge of :data:`INSTRUMENTS` (a policy's own is
    declared there first); anything else raises ValueError naming it."""
    instrument = INSTRUMENTS.get(name)
    if instrument is None:
        raise ValueError(
            f"observe: unknown metric {name!r} (declare it in pyxds.metrics.INSTRUMENTS first)"
        )
    if instrument.kind != "gauge":
        raise ValueError(f"{name} is not a gauge")
    with _lock:
        _observers.setdefault(name, []).append(observer)


def is_enabled() -> bool:
    return RECORDER is not None
