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

from test_conformance_weighted_round_robin import A, B, C, Wrr, assert_shares, load

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
