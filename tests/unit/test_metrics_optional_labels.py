"""A78 optional labels: ``grpc.lb.locality`` set by the xds_cluster_impl
picker for the attempt (from the wrapped subchannel of the picked endpoint)
and emitted by the recorder only when the user enabled it."""

from __future__ import annotations

import pytest

from pyxds import metrics
from pyxds.lb.api import OK_STATUS, PickComplete, Picker
from pyxds.lb.call_counters import cluster_counters
from pyxds.lb.xds_cluster_impl import CountedSubchannel, XdsClusterImplPicker
from pyxds.xds.resources.types import LocalityName

sdk = pytest.importorskip("opentelemetry.sdk.metrics")
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

LOC = "grpc.lb.locality"
BS = "grpc.lb.backend_service"  # A89: the cluster ("" here: no cluster given)
BASE = {"grpc.method": "s/M", "grpc.target": "xds:///svc", "grpc.status": "OK"}


class _Real:
    address = "10.0.0.1:1"

    def shutdown(self) -> None:
        pass


class _Owner:
    def _untrack(self, subchannel) -> None:
        pass


class _Child(Picker):
    def __init__(self, result: PickComplete) -> None:
        self.result = result

    def pick(self, args):
        return self.result


def _pick(subchannel, child_labels=None) -> PickComplete:
    counters = cluster_counters("c-optional-labels", None)
    child = _Child(PickComplete(subchannel, None, None, child_labels))
    result = XdsClusterImplPicker(child, (), counters, 1024, None).pick(None)
    assert isinstance(result, PickComplete)
    result.on_call_done(OK_STATUS)
    return result


def test_cluster_impl_pick_carries_the_picked_endpoints_locality_in_a78_form():
    real = _Real()
    counted = CountedSubchannel(real, LocalityName("us", "us-a", "rack1"), None, _Owner())
    result = _pick(counted)
    assert result.subchannel is real
    assert dict(result.attempt_labels) == {
        LOC: '{region="us", zone="us-a", sub_zone="rack1"}',
        BS: "",
    }
    # the same mapping on every pick of that endpoint (nothing built per pick)
    assert _pick(counted).attempt_labels is result.attempt_labels


def test_cluster_impl_locality_label_is_empty_without_a_locality():
    counted = CountedSubchannel(_Real(), None, None, _Owner())
    assert dict(_pick(counted).attempt_labels) == {LOC: "", BS: ""}


def test_cluster_impl_keeps_a_childs_own_attempt_labels():
    counted = CountedSubchannel(_Real(), LocalityName("r", "z", ""), None, _Owner())
    result = _pick(counted, {"x.label": "v"})
    assert dict(result.attempt_labels) == {
        "x.label": "v",
        LOC: '{region="r", zone="z", sub_zone=""}',
        BS: "",
    }


def _attempt_points(reader) -> list[dict]:
    data = reader.get_metrics_data()
    return [
        dict(p.attributes)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "grpc.client.attempt.duration"
        for p in m.data.data_points
    ]


@pytest.fixture
def reader_with(request):
    readers = []

    def enable(**kwargs):
        reader = InMemoryMetricReader()
        metrics.enable(sdk.MeterProvider(metric_readers=[reader]), **kwargs)
        readers.append(reader)
        return reader

    yield enable
    metrics.disable()


def test_optional_label_is_left_out_unless_enabled(reader_with):
    reader = reader_with()
    metrics.record("grpc.client.attempt.duration", 0.01, {**BASE, LOC: '{region="a"}'})
    assert _attempt_points(reader) == [BASE]


def test_enabled_optional_label_carries_the_value_the_picker_set(reader_with):
    reader = reader_with(optional_labels=[LOC])
    metrics.record("grpc.client.attempt.duration", 0.01, {**BASE, LOC: '{region="a"}'})
    assert _attempt_points(reader) == [{**BASE, LOC: '{region="a"}'}]


def test_enabled_optional_label_is_empty_when_no_policy_set_it(reader_with):
    # A78: "If no locality information is available, the label will be set to
    # the empty string."
    reader = reader_with(optional_labels=[LOC])
    metrics.record("grpc.client.attempt.duration", 0.01, BASE)
    assert _attempt_points(reader) == [{**BASE, LOC: ""}]


def test_optional_label_never_reaches_instruments_that_do_not_declare_it(reader_with):
    reader = reader_with(optional_labels=[LOC])
    metrics.add("grpc.client.attempt.started", 1, {"grpc.method": "s/M", "grpc.target": "t"})
    data = reader.get_metrics_data()
    (point,) = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "grpc.client.attempt.started"
        for p in m.data.data_points
    ]
    assert LOC not in point.attributes


def test_unknown_optional_label_is_refused_naming_it_and_changes_nothing():
    assert metrics.RECORDER is None
    with pytest.raises(ValueError, match=r"optional_labels: unknown label 'grpc\.lb\.nope'"):
        metrics.enable(sdk.MeterProvider(), optional_labels=["grpc.lb.nope"])
    assert metrics.RECORDER is None
