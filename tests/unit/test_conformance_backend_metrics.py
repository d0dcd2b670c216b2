"""Conformance: backend metrics (gRFC A51 recorders, A58/A114 utilization)
beyond what test_orca_server.py, test_weighted_round_robin.py and
test_conformance_weighted_round_robin.py already show.

Sources:

* C++ ``src/cpp/server/backend_metric_recorder.cc`` (ranges, the merge of
  the per-call recorder over the per-server one) and grpc-java
  ``CallMetricRecorderTest`` / grpc-go ``orca/server_metrics_test.go``
  (``TestServerMetrics_Setters_Range``, ``TestServerMetrics_Deleters``);
* C-core ``weighted_round_robin.cc`` ``EndpointWeight::MaybeUpdateWeight``
  (the error term only for a positive ``eps``), checked live against
  grpcio 1.85 in tests/e2e/test_differential_orca_wire.py;
* A114 "Only the following fields are supported": grpcio 1.85's C-core
  rejects a config naming any other (live: its CDS is NACKed with
  ``unsupported metric name "<name>"`` at
  ``metricNamesForComputingUtilization[<i>]``).
"""

from __future__ import annotations

import math

import pytest
from test_conformance_weighted_round_robin import A, B, C, Wrr, assert_shares, load
from test_orca_oob_stream import FakeCore
from test_orca_oob_stream import calls as calls  # the fixture
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.channel import orca_oob
from pyxds.lb import registry
from pyxds.lb.errors import LBConfigError
from pyxds.lb.orca import utilization
from pyxds.lb.weighted_round_robin import WeightedRoundRobin
from pyxds.orca import CallMetricRecorder, ServerMetricRecorder

INF, NAN = math.inf, math.nan

# -- A58 weights: the error term -----------------------------------------------------


def test_a_negative_eps_adds_no_error_term():
    """C-core MaybeUpdateWeight adds ``eps / qps * penalty`` only when
    ``eps > 0``: a report with eps -40 weighs as one without (live, grpcio
    1.85: the same share as an eps-0 backend).  The old code subtracted it
    (qps 100 / (0.5 - 0.4) = 1000 where C-core has 200)."""
    h = Wrr({"blackoutPeriod": "1s"})
    h.per_call({A: load(cpu=0.5, eps=-40), B: load(cpu=0.5), C: load(cpu=0.25)})
    h.advance(1.0)
    assert_shares(h, {A: 200, B: 200, C: 400})


def test_a_nan_eps_adds_no_error_term():
    """C-core: ``eps > 0`` is false for NaN, so no error term; the old code
    made the weight NaN and dropped the report (the endpoint got the mean)."""
    h = Wrr({"blackoutPeriod": "1s"})
    h.per_call({A: load(cpu=0.5, eps=NAN), B: load(cpu=0.5), C: load(cpu=0.125)})
    h.advance(1.0)
    assert_shares(h, {A: 200, B: 200, C: 800})


def test_an_infinite_eps_gives_no_weight():
    """qps / (u + inf) is 0: no weight, as in C-core (weight 0 is not stored)."""
    h = Wrr({"blackoutPeriod": "1s"})
    h.per_call({A: load(cpu=0.5, eps=INF), B: load(cpu=0.5), C: load(cpu=0.125)})
    h.advance(1.0)
    assert_shares(h, {A: 500, B: 200, C: 800})  # A: the mean of the known weights


def test_a_zero_penalty_ignores_even_an_infinite_eps():
    """C-core adds the error term only when ``eps > 0 && penalty > 0``: with
    errorUtilizationPenalty 0 an eps of +inf changes nothing (live, grpcio
    1.85: weight 200 like eps 0).  The old code computed inf * 0 = NaN and
    dropped the report (the endpoint got the mean, 500)."""
    h = Wrr({"blackoutPeriod": "1s", "errorUtilizationPenalty": 0.0})
    h.per_call({A: load(cpu=0.5, eps=INF), B: load(cpu=0.5), C: load(cpu=0.125)})
    h.advance(1.0)
    assert_shares(h, {A: 200, B: 200, C: 800})


def test_an_infinite_qps_gives_no_weight():
    """qps +inf (Go's and Java's recorders accept it) would be an infinite
    weight: pyxds ignores the report, the endpoint gets the mean of the
    others.  grpcio 1.85's C-core stores it and its scheduler then splits
    evenly over every endpoint (live; docs/differences-from-c-core.md)."""
    h = Wrr({"blackoutPeriod": "1s"})
    h.per_call({A: load(cpu=0.5, qps=INF), B: load(cpu=0.5), C: load(cpu=0.125)})
    h.advance(1.0)
    assert_shares(h, {A: 500, B: 200, C: 800})


# -- A58 / A114 utilization ----------------------------------------------------------


@pytest.mark.parametrize("app", [NAN, -1.0, 0.0])
def test_an_application_utilization_that_is_not_positive_falls_back_to_cpu(app):
    """A114's fallback (``if application_utilization > 0``; C-core's
    ``utilization <= 0`` test, and live grpcio 1.85 for NaN): cpu is used."""
    report = OrcaLoadReport(application_utilization=app, cpu_utilization=0.25, rps_fractional=1)
    assert utilization(report) == 0.25


@pytest.mark.parametrize(
    "names",
    [
        ["named_metrics.q", "mem_utilization"],  # q 0 is missing, mem 0.3 the max
        ["named_metrics.absent", "utilization.gpu"],
    ],
)
def test_a114_zero_and_absent_values_are_missing(names):
    """A114 "Zero Values": 0 counts as missing, the other names still count."""
    report = OrcaLoadReport(
        cpu_utilization=0.9,
        mem_utilization=0.3,
        named_metrics={"q": 0.0},
        utilization={"gpu": 0.3},
    )
    assert utilization(report, names) == pytest.approx(0.3)


def test_a114_all_named_values_missing_fall_back_to_a58():
    report = OrcaLoadReport(
        application_utilization=0.4, cpu_utilization=0.9, named_metrics={"q": 0.0}
    )
    assert utilization(report, ["named_metrics.q", "utilization.gpu"]) == pytest.approx(0.4)


def parse(names: list) -> object:
    return registry.select(
        [{"weighted_round_robin": {"metricNamesForComputingUtilization": names}}]
    )[1]


@pytest.mark.parametrize(
    "name",
    [
        "cpu_utilization",
        "mem_utilization",
        "application_utilization",
        "named_metrics.foo",
        "named_metrics.foo.bar",  # the first dot splits: key "foo.bar"
        "named_metrics.*",  # a key like any other
        "named_metrics.",  # empty key: grpcio 1.85 accepts it
        "utilization.gpu",
        "utilization.",
    ],
)
def test_a114_supported_metric_names_are_accepted(name):
    config = parse([name])
    assert config.metric_names_for_computing_utilization == (name,)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name",
    [
        "eps",
        "rps_fractional",
        "qps",
        "request_cost",
        "request_cost.x",
        "named_metrics",
        "utilization",
        "cpu_utilization.x",
        "mem_utilization.x",
        "Named_metrics.foo",
        ".foo",
        "",
    ],
)
def test_a114_an_unsupported_metric_name_rejects_the_config(name):
    """grpcio 1.85 (live, the CDS resource NACKed): ``errors validating
    weighted_round_robin LB policy config:
    [field:metricNamesForComputingUtilization[1] error:unsupported metric
    name "eps"]``.  The old code accepted the name and ignored it."""
    with pytest.raises(LBConfigError) as err:
        parse(["named_metrics.ok", name])
    text = str(err.value)
    assert "metricNamesForComputingUtilization[1]" in text
    assert f'unsupported metric name "{name}"' in text


def test_a114_an_unsupported_metric_name_in_cds_is_a_nack_naming_it():
    """The CDS path (A52: the registry's error is the NACK), as C-core's."""
    from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
        client_side_weighted_round_robin_pb2 as cswrr_pb2,
    )
    from test_weighted_round_robin import _cluster_with

    from pyxds.xds.resources import CLUSTER

    m = cswrr_pb2.ClientSideWeightedRoundRobin()
    m.metric_names_for_computing_utilization.extend(["named_metrics.a", "request_cost.x"])
    error = CLUSTER.decode(_cluster_with(m)).error
    assert error is not None
    assert "metricNamesForComputingUtilization[1]" in error
    assert 'unsupported metric name "request_cost.x"' in error


# -- A51 out-of-band request ----------------------------------------------------------


@pytest.mark.parametrize(
    ("period", "seconds", "nanos"),
    [
        (2.5, 2, 500_000_000),
        (0.29, 0, 290_000_000),
        (0.0129, 0, 12_000_000),
        (2.9999999, 2, 999_000_000),
        (1.0005, 1, 0),
        (0.0004, 0, 0),  # zero: "treated as the service minimum" (A51)
    ],
)
def test_the_oob_request_asks_whole_milliseconds_rounded_down(calls, period, seconds, nanos):
    """grpcio 1.85's C-core keeps durations in milliseconds: its
    StreamCoreMetrics request for an oobReportingPeriod of 0.0129 s asks
    12 ms (live, the request bytes a backend receives; tests/e2e/
    test_differential_orca_wire.py).  The old code asked 12.9 ms."""
    stream = orca_oob.OobStream(FakeCore(side=calls.side))
    stream.add(period, lambda report: None)
    (call,) = calls.live
    interval = call["request"].report_interval
    assert (interval.seconds, interval.nanos) == (seconds, nanos)


# -- A51 recorders ---------------------------------------------------------------------


def test_the_last_recorded_value_wins_for_every_metric():
    """grpc-java CallMetricRecorderTest.lastValueWinForMetricsWithSameName."""
    r = CallMetricRecorder()
    r.record_request_cost("c", 1.0).record_request_cost("c", 2.0)
    r.record_application_utilization(0.9).record_application_utilization(1.8)
    r.record_memory_utilization(0.1).record_memory_utilization(0.3)
    r.record_utilization("u", 0.2).record_utilization("u", 0.8)
    r.record_named_metric("n", 0.5).record_named_metric("n", 3.0)
    r.record_qps(10).record_qps(20).record_eps(1).record_eps(2)
    r.record_cpu_utilization(0.4).record_cpu_utilization(0.6)
    assert r.report() == OrcaLoadReport(
        request_cost={"c": 2.0},
        application_utilization=1.8,
        mem_utilization=0.3,
        utilization={"u": 0.8},
        named_metrics={"n": 3.0},
        rps_fractional=20,
        eps=2,
        cpu_utilization=0.6,
    )


# (recorder method, value, kept?) per A51's ranges: cpu, application, qps, eps
# in [0, inf); memory and named utilization in [0, 1]; request cost and named
# metrics unchecked.  NaN is out of every range (C++ and Java reject it; Go's
# ``val < 0`` keeps it).  +inf: see test_infinity_is_outside_zero_to_infinity.
RANGES = [
    ("cpu_utilization", 1.7, True),
    ("cpu_utilization", 0.0, True),
    ("cpu_utilization", -0.001, False),
    ("cpu_utilization", NAN, False),
    ("application_utilization", 2.5, True),
    ("application_utilization", -1.0, False),
    ("memory_utilization", 1.0, True),
    ("memory_utilization", 1.001, False),
    ("memory_utilization", -0.001, False),
    ("memory_utilization", NAN, False),
    ("qps", 1e6, True),
    ("qps", -0.001, False),
    ("eps", 3.0, True),
    ("eps", -0.001, False),
    ("eps", NAN, False),
]
_FIELD = {
    "cpu_utilization": "cpu_utilization",
    "application_utilization": "application_utilization",
    "memory_utilization": "mem_utilization",
    "qps": "rps_fractional",
    "eps": "eps",
}


@pytest.mark.parametrize(("metric", "value", "kept"), RANGES)
def test_recorders_keep_values_in_a51_ranges_only(metric, value, kept):
    """C++ backend_metric_recorder.cc; grpc-java
    noMetricsRecordedIfUtilizationIsGreaterThanUpperBound /
    ...LessThanLowerBound; grpc-go TestServerMetrics_Setters_Range.  An
    out-of-range value leaves the previous one in place."""
    call = CallMetricRecorder()
    getattr(call, f"record_{metric}")(0.5)
    getattr(call, f"record_{metric}")(value)
    server = ServerMetricRecorder()
    assert getattr(server, f"set_{metric}")(0.5)
    assert getattr(server, f"set_{metric}")(value) is kept
    want = value if kept else 0.5
    assert getattr(call.report(), _FIELD[metric]) == want
    assert getattr(server.report(), _FIELD[metric]) == want


@pytest.mark.parametrize("metric", sorted(_FIELD))
def test_infinity_is_outside_zero_to_infinity(metric):
    """A51 gives cpu, application, qps and eps the range "[0, infy)" and says
    values outside it are ignored; pyxds keeps that letter.  C++, Java
    (``>= 0``) and Go (``< 0`` rejected) let +inf through: the documented
    difference in docs/differences-from-c-core.md."""
    call = CallMetricRecorder()
    getattr(call, f"record_{metric}")(INF)
    assert call.report() == OrcaLoadReport()
    assert getattr(ServerMetricRecorder(), f"set_{metric}")(INF) is False


def test_named_utilization_is_in_zero_to_one_and_named_metrics_and_costs_are_unchecked():
    """grpc-java dumpDumpsAllSavedMetricValues (named metric -1.618 kept);
    C++ RecordUtilizationMetric / RecordRequestCostMetric / RecordNamedMetric."""
    r = CallMetricRecorder()
    r.record_utilization("ok", 1.0).record_utilization("big", 1.001)
    r.record_utilization("neg", -0.1).record_utilization("nan", NAN)
    r.record_named_metric("neg", -1.618).record_named_metric("big", 1e9)
    r.record_request_cost("neg", -2.0).record_request_cost("big", 37465.12)
    report = r.report()
    assert dict(report.utilization) == {"ok": 1.0}
    assert dict(report.named_metrics) == {"neg": -1.618, "big": 1e9}
    assert dict(report.request_cost) == {"neg": -2.0, "big": 37465.12}


def test_a_call_value_wins_over_the_server_value_even_zero():
    """A51 "The Server API": the per-request recorder takes precedence; C++
    ``GetBackendMetricData`` overwrites with every value recorded in range,
    0 included (grpc-java keeps the server's value under a call's 0, against
    that rule)."""
    server = ServerMetricRecorder()
    server.set_cpu_utilization(0.9)
    server.set_qps(50)
    server.set_named_utilization("disk", 0.3)
    call = CallMetricRecorder().record_cpu_utilization(0.0).record_utilization("disk", 0.7)
    report = call.report(server)
    assert report.cpu_utilization == 0.0
    assert report.rps_fractional == 50
    assert dict(report.utilization) == {"disk": 0.7}


def test_an_out_of_range_call_value_leaves_the_server_value():
    """C++ GetBackendMetricData: "Only overwrite if the value is set i.e. in
    the valid range"."""
    server = ServerMetricRecorder()
    server.set_memory_utilization(0.4)
    server.set_eps(2.0)
    call = CallMetricRecorder().record_memory_utilization(1.5).record_eps(-1)
    report = call.report(server)
    assert report.mem_utilization == 0.4
    assert report.eps == 2.0


def test_each_server_metric_can_be_cleared_alone():
    """grpc-go TestServerMetrics_Deleters; C++ Clear*; A51 "Once set metrics
    stay in place until cleared"."""
    server = ServerMetricRecorder()
    for metric in _FIELD:
        getattr(server, f"set_{metric}")(0.5)
    server.set_named_utilization("a", 0.1)
    server.set_named_utilization("b", 0.2)
    for metric, field in _FIELD.items():
        getattr(server, f"clear_{metric}")()
        assert getattr(server.report(), field) == 0
    assert server.report().rps_fractional == 0
    server.clear_named_utilization("a")
    server.clear_named_utilization("absent")
    assert server.report() == OrcaLoadReport(utilization={"b": 0.2})


def test_set_all_named_utilization_replaces_the_map_without_range_checks():
    """A51 ``setAllUtilizationMetrics`` / C++ SetAllNamedUtilization ("No
    range validation"); C++ OrcaServiceEnd2endTest.Basic's last step."""
    server = ServerMetricRecorder()
    server.set_named_utilization("bar", 0.2)
    server.set_named_utilization("baz", 0.1)
    server.set_all_named_utilization({"bar": 0.5, "quux": 1.5})
    assert dict(server.report().utilization) == {"bar": 0.5, "quux": 1.5}


# -- A51 "The Client API": one deserialization for every reader ------------------------


def test_lrs_and_wrr_read_one_call_s_report_with_one_deserialization(monkeypatch):
    """A51: "if multiple LB policies are interested in the data (e.g., both
    xDS and WRR), the protobuf deserialization needs to happen only once"
    (grpc-java OrcaPerRequestUtilTest.twoLevelPoliciesTypicalWorkflow):
    xds_cluster_impl (LRS, A64) over weighted_round_robin, one call's
    trailer parsed once and seen by both."""
    from lrs_support import lrs_client
    from test_lrs_backend_metrics import ALL_NAMED, start

    from pyxds.lb import orca
    from pyxds.lb.api import OK_STATUS, PickComplete
    from pyxds.lb.orca import ORCA_TRAILER_MIRROR
    from pyxds.testing import FakeClock

    parses = []
    real = orca.OrcaLoadReport

    def counting() -> OrcaLoadReport:
        parses.append(1)
        return real()

    monkeypatch.setattr(orca, "OrcaLoadReport", counting)
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        helper, impl = start(client, ALL_NAMED, child={"weighted_round_robin": {}})
        result = helper.pick()
        assert isinstance(result, PickComplete) and result.on_call_trailers is not None
        report = real(cpu_utilization=0.5, rps_fractional=10, named_metrics={"foo": 3.0})
        result.on_call_trailers(((ORCA_TRAILER_MIRROR, report.SerializeToString()),))
        result.on_call_done(OK_STATUS)
        assert parses == [1]
        (transport,) = transports
        transport.respond(interval=1.0)
        clock.advance(1.0)
        (request,) = transport.reports()
        (upstream,) = request.cluster_stats[0].upstream_locality_stats
        assert [(m.metric_name, m.total_metric_value) for m in upstream.load_metric_stats] == [
            ("named_metrics.foo", 3.0)
        ]
        wrr = impl._child.child
        assert isinstance(wrr, WeightedRoundRobin)
        assert [(c.wrr_weight.weight, c.wrr_weight.source) for c in wrr.children] == [
            (20.0, "per-call")
        ]
    finally:
        client.close()
