"""Conformance of pyxds's metrics with gRFC A66 (per-call and per-attempt
OpenTelemetry metrics) and A78 (WRR, pick_first, XdsClient metrics, the
optional locality label), checked through the OpenTelemetry SDK's
in-memory reader; no sockets (the channel's fakes, tests/unit/
test_channel_support.py).  The same behaviours against grpcio's C-core,
live: tests/e2e/test_differential_metrics.py."""

from __future__ import annotations

import grpc
import pytest

from pyxds import metrics
from pyxds.channel.call_metrics import CallMetrics
from pyxds.lb.api import Status

sdk = pytest.importorskip("opentelemetry.sdk.metrics")
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

LOC = "grpc.lb.locality"
STARTED = "grpc.client.attempt.started"
ATTEMPT = "grpc.client.attempt.duration"
CALL = "grpc.client.call.duration"
SENT = "grpc.client.attempt.sent_total_compressed_message_size"
RCVD = "grpc.client.attempt.rcvd_total_compressed_message_size"
PER_ATTEMPT = (ATTEMPT, SENT, RCVD)

_M, _T, _S = "grpc.method", "grpc.target", "grpc.status"
_SERVER, _RTYPE = "grpc.xds.server", "grpc.xds.resource_type"

#: name -> (kind, unit, required labels, optional labels), as the gRFC tables
GRFC_TABLES = {
    # A66 "Client Per-Attempt Instruments", "Client Per-Call Instruments";
    # A78 "Per-Call Metrics" adds grpc.lb.locality to the three attempt ones
    STARTED: ("counter", "{attempt}", {_M, _T}, set()),
    ATTEMPT: ("histogram", "s", {_M, _T, _S}, {LOC}),
    SENT: ("histogram", "By", {_M, _T, _S}, {LOC}),
    RCVD: ("histogram", "By", {_M, _T, _S}, {LOC}),
    CALL: ("histogram", "s", {_M, _T, _S}, set()),
    # A78 "Weighted Round Robin LB Policy"
    "grpc.lb.wrr.rr_fallback": ("counter", "{update}", {_T}, {LOC}),
    "grpc.lb.wrr.endpoint_weight_not_yet_usable": ("counter", "{endpoint}", {_T}, {LOC}),
    "grpc.lb.wrr.endpoint_weight_stale": ("counter", "{endpoint}", {_T}, {LOC}),
    "grpc.lb.wrr.endpoint_weights": ("histogram", "{weight}", {_T}, {LOC}),
    # A78 "Pick First LB Policy"
    "grpc.lb.pick_first.disconnections": ("counter", "{disconnection}", {_T}, set()),
    "grpc.lb.pick_first.connection_attempts_succeeded": ("counter", "{attempt}", {_T}, set()),
    "grpc.lb.pick_first.connection_attempts_failed": ("counter", "{attempt}", {_T}, set()),
    # A78 "XdsClient"
    "grpc.xds_client.connected": ("gauge", "{bool}", {_T, _SERVER}, set()),
    "grpc.xds_client.server_failure": ("counter", "{failure}", {_T, _SERVER}, set()),
    "grpc.xds_client.resource_updates_valid": (
        "counter",
        "{resource}",
        {_T, _SERVER, _RTYPE},
        set(),
    ),
    "grpc.xds_client.resource_updates_invalid": (
        "counter",
        "{resource}",
        {_T, _SERVER, _RTYPE},
        set(),
    ),
    "grpc.xds_client.resources": (
        "gauge",
        "{resource}",
        {_T, "grpc.xds.authority", "grpc.xds.cache_state", _RTYPE},
        set(),
    ),
}

#: A66 "Units": latency and size buckets of the default views
A66_LATENCY = (
    0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13,
    0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1, 2, 5, 10, 20, 50, 100,
)  # fmt: skip
A66_SIZE = (
    0, 1024, 2048, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
    268435456, 1073741824, 4294967296,
)  # fmt: skip


@pytest.fixture
def enable():
    """``enable(**kwargs)``: metrics on with a fresh in-memory reader."""

    def on(**kwargs) -> InMemoryMetricReader:
        reader = InMemoryMetricReader()
        metrics.enable(sdk.MeterProvider(metric_readers=[reader]), **kwargs)
        return reader

    yield on
    metrics.disable()


def points(reader, name: str) -> list:
    data = reader.get_metrics_data()
    return [
        p
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


# ---------------------------------------------------------------------------
# Names, kinds, units, labels, buckets
# ---------------------------------------------------------------------------


def test_instruments_are_the_grfc_tables_names_kinds_units_and_labels():
    """A66 "Client Per-Attempt Instruments" / "Client Per-Call Instruments"
    and A78's WRR, Pick First and XdsClient tables, field by field."""
    got = {
        name: (i.kind, i.unit, set(i.labels), set(i.optional_labels))
        for name, i in metrics.INSTRUMENTS.items()
    }
    assert got == GRFC_TABLES


def test_histograms_advise_a66_latency_and_size_buckets(enable):
    """A66 "Units": the latency buckets for the duration histograms, the
    size buckets for the message-size histograms (as bucket advice)."""
    reader = enable()
    labels = {_M: "s/M", _T: "t", _S: "OK"}
    for name in (ATTEMPT, CALL, SENT, RCVD):
        metrics.record(name, 1, labels)
    for name in (ATTEMPT, CALL):
        (point,) = points(reader, name)
        assert tuple(point.explicit_bounds) == A66_LATENCY, name
    for name in (SENT, RCVD):
        (point,) = points(reader, name)
        assert tuple(point.explicit_bounds) == A66_SIZE, name


# ---------------------------------------------------------------------------
# A78 optional locality label on the per-attempt metrics
# ---------------------------------------------------------------------------


def _one_attempt() -> None:
    call = CallMetrics("/pkg.Svc/M", "xds:///svc")
    call.sizes[0], call.sizes[1] = 3, 5
    picked = {LOC: '{region="r", zone="z", sub_zone="s"}'}
    call.attempt_ended(Status(grpc.StatusCode.OK, ""), picked, True)
    call.call_ended(Status(grpc.StatusCode.OK, ""))


def test_locality_label_is_on_no_attempt_metric_unless_enabled(enable):
    """A78 "Optional xDS Locality Label": an optional label, so not emitted
    until enabled, on any of the three per-attempt metrics that carry it
    (the picker sets it; grpcio 1.85's C-core emits none by default: tests/
    e2e/test_differential_metrics.py)."""
    reader = enable()
    _one_attempt()
    for name in PER_ATTEMPT:
        (point,) = points(reader, name)
        assert dict(point.attributes) == {_M: "pkg.Svc/M", _T: "xds:///svc", _S: "OK"}, name


def test_enabled_locality_label_is_on_all_three_attempt_metrics(enable):
    """A78 "Per-Call Metrics": "This label will be available on the
    following per-call metrics: grpc.client.attempt.duration,
    grpc.client.attempt.sent_total_compressed_message_size,
    grpc.client.attempt.rcvd_total_compressed_message_size"; never on
    grpc.client.attempt.started or grpc.client.call.duration."""
    reader = enable(optional_labels=[LOC])
    _one_attempt()
    for name in PER_ATTEMPT:
        (point,) = points(reader, name)
        assert point.attributes[LOC] == '{region="r", zone="z", sub_zone="s"}', name
    for name in (STARTED, CALL):
        (point,) = points(reader, name)
        assert LOC not in point.attributes, name
