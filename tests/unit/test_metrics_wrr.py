"""A78 weighted_round_robin metrics on each scheduler update (FakeClock; the
OpenTelemetry SDK's in-memory reader)."""

from __future__ import annotations

import random

import pytest

from pyxds import metrics
from pyxds.lb.api import PickComplete
from pyxds.lb.weighted_round_robin import (
    EndpointWeight,
    WeightedRoundRobinConfig,
    WeightedRoundRobinPicker,
    locality_label,
)
from pyxds.testing import FakeClock

sdk = pytest.importorskip("opentelemetry.sdk.metrics")
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

#: A78's WRR metrics are off by default: named to be recorded
WRR_METRICS = [name for name in metrics.INSTRUMENTS if name.startswith("grpc.lb.wrr.")]
LABELS = {"grpc.target": "xds:///svc", "grpc.lb.locality": '{region="r", zone="z", sub_zone=""}'}


class _Sub:
    def __init__(self, address: str) -> None:
        self.address = address


@pytest.fixture
def reader():
    reader = InMemoryMetricReader()
    metrics.enable(
        sdk.MeterProvider(metric_readers=[reader]),
        optional_labels=["grpc.lb.locality"],
        enable_metrics=WRR_METRICS,
    )
    yield reader
    metrics.disable()


def values(reader, expected_labels=LABELS) -> dict:
    out = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                assert m.unit == metrics.INSTRUMENTS[m.name].unit
                for p in m.data.data_points:
                    assert dict(p.attributes) == expected_labels
                    out[m.name] = getattr(p, "value", None) or (p.count, p.sum)
    return out


def test_scheduler_updates_record_weights_unusable_stale_and_fallback(reader):
    clock = FakeClock(start=100.0)
    config = WeightedRoundRobinConfig(blackout_period=10.0, weight_expiration_period=180.0)
    weights = [EndpointWeight(clock, config) for _ in range(3)]
    results = [PickComplete(_Sub(f"10.0.0.{i}:1")) for i in range(3)]
    WeightedRoundRobinPicker(results, weights, clock, random.Random(1), LABELS)
    got = values(reader)
    assert got["grpc.lb.wrr.endpoint_weight_not_yet_usable"] == 3
    assert got["grpc.lb.wrr.rr_fallback"] == 1
    assert got["grpc.lb.wrr.endpoint_weights"] == (3, 0)
    # two usable weights, one stale: no fallback this time
    for w, value in zip(weights, (5.0, 7.0), strict=False):
        w.weight, w.non_empty_since, w.last_updated = value, 0.0, 99.0
    weights[2].weight, weights[2].non_empty_since, weights[2].last_updated = 9.0, 0.0, -500.0
    picker = WeightedRoundRobinPicker(results, weights, clock, random.Random(1), LABELS)
    assert picker.scaled_weights is not None
    got = values(reader)
    assert got["grpc.lb.wrr.endpoint_weight_stale"] == 1
    assert got["grpc.lb.wrr.rr_fallback"] == 1  # unchanged
    assert got["grpc.lb.wrr.endpoint_weights"] == (6, 12.0)


def test_locality_label_has_a78s_form():
    from pyxds.lb.api import Endpoint
    from pyxds.xds.resources.types import LocalityName

    endpoint = Endpoint(("1.2.3.4:5",), {"locality": LocalityName("r", "z", "")})
    assert locality_label([endpoint]) == '{region="r", zone="z", sub_zone=""}'
    assert locality_label([Endpoint(("1.2.3.4:5",))]) == ""


def test_locality_label_is_left_out_unless_enabled():
    # A78: grpc.lb.locality is an optional label: only grpc.target by default
    reader = InMemoryMetricReader()
    metrics.enable(sdk.MeterProvider(metric_readers=[reader]), enable_metrics=WRR_METRICS)
    try:
        clock = FakeClock(start=100.0)
        weights = [EndpointWeight(clock, WeightedRoundRobinConfig()) for _ in range(2)]
        results = [PickComplete(_Sub(f"10.0.0.{i}:1")) for i in range(2)]
        WeightedRoundRobinPicker(results, weights, clock, random.Random(1), LABELS)
        got = values(reader, {"grpc.target": "xds:///svc"})
        assert got["grpc.lb.wrr.rr_fallback"] == 1
    finally:
        metrics.disable()
