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
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.lb import registry
from pyxds.lb.errors import LBConfigError
from pyxds.lb.orca import utilization

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
