"""Differential: WRR weights (gRFC A58, A114) from ORCA reports whose values
no A51 recorder would send but a backend in another language, or one
written by hand, can put on the wire; the same bytes through pyxds and
grpcio 1.85's C-core ``xds:///`` channel, the same pyxds.server config.

Each backend (:class:`foreign_orca_backends.ForeignOrcaBackend` with a fixed
report) sends one report per call in the standard trailer (which C-core
reads) and in pyxds.orca's mirror key (which pyxds reads: grpcio hides the
standard one from Python), and serves it out of band on its own
OpenRcaService.  What C-core does with each (grpcio 1.85, live):

=================================  ===========================================
report (qps 100 unless said)       C-core weight
=================================  ===========================================
cpu 0.5, eps -40                   200: a negative eps adds no error term
cpu 0.5, eps NaN                   200: nor does NaN
application NaN, cpu 0.25          400: cpu (application not > 0)
application -1, cpu 0.25           400
cpu 0.1, deprecated ``rps`` only   none: qps is ``rps_fractional``
qps NaN; cpu NaN; cpu +inf         none
mem 0.1 only                       none (without A114 names)
=================================  ===========================================

Also: A114 names (the same weights; names A114 does not support make both
NACK the cluster with the same field and words), the reports of failed
calls (counted by both), and the StreamCoreMetrics request each client
sends (the same bytes: whole milliseconds).  Sources: C-core ``weighted_round_robin.cc``
(``EndpointWeight::MaybeUpdateWeight``, the call tracker's utilization),
A114 "Weight Calculation Logic".
"""

from __future__ import annotations

import collections
import math

import grpc
import pytest
from channel_fixtures import pyxds_calls, wait_until
from foreign_orca_backends import ForeignOrcaBackend
from orca_backends import both_clients, warm_then_count, wrr_snapshot
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.server import ManagementServer

N = 1600
TOLERANCE = 0.02  # per backend share; the stride schedule is exact, up to its start


def R(**fields: object) -> OrcaLoadReport:
    return OrcaLoadReport(**fields)  # type: ignore[arg-type]


#: name -> (report, C-core's weight; 0: none, the mean of the others)
EDGE = {
    "light": (R(cpu_utilization=0.125, rps_fractional=100), 800),
    "plain": (R(cpu_utilization=0.5, rps_fractional=100), 200),
    "neg-eps": (R(cpu_utilization=0.5, rps_fractional=100, eps=-40), 200),
    "nan-eps": (R(cpu_utilization=0.5, rps_fractional=100, eps=math.nan), 200),
    "nan-app": (R(application_utilization=math.nan, cpu_utilization=0.25, rps_fractional=100), 400),
    "neg-app": (R(application_utilization=-1, cpu_utilization=0.25, rps_fractional=100), 400),
    "rps-only": (R(cpu_utilization=0.1, rps=100), 0),
    # what Go's recorder lets through (``val < 0`` rejected only) and C++'s
    # and Java's too for +inf
    "nan-qps": (R(cpu_utilization=0.5, rps_fractional=math.nan), 0),
    "nan-cpu": (R(cpu_utilization=math.nan, rps_fractional=100), 0),
    "inf-cpu": (R(cpu_utilization=math.inf, rps_fractional=100), 0),
    "mem-only": (R(mem_utilization=0.1, rps_fractional=100), 0),
}

NAMES = (
    "named_metrics.foo",
    "utilization.gpu",
    "mem_utilization",
    "named_metrics.a.b",
)
#: under NAMES
A114 = {
    "named": (R(cpu_utilization=0.5, rps_fractional=100, named_metrics={"foo": 0.8}), 125),
    "util-map": (R(cpu_utilization=0.5, rps_fractional=100, utilization={"gpu": 0.25}), 400),
    "mem": (R(cpu_utilization=0.5, rps_fractional=100, mem_utilization=0.125), 800),
    "dotted-key": (R(cpu_utilization=0.5, rps_fractional=100, named_metrics={"a.b": 0.25}), 400),
    "negative": (R(cpu_utilization=0.25, rps_fractional=100, named_metrics={"foo": -1}), 400),
    "max": (
        R(
            cpu_utilization=0.1,
            rps_fractional=100,
            named_metrics={"foo": 0.8},
            utilization={"gpu": 0.4},
        ),
        125,
    ),
    "nan": (
        R(cpu_utilization=0.25, rps_fractional=100, named_metrics={"foo": math.nan}),
        400,
    ),
    "others": (R(cpu_utilization=0.5, rps_fractional=100, named_metrics={"x": 0.01}), 200),
}


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


def expected_shares(table: dict) -> dict[str, float]:
    """C-core's weights, an unknown one as the mean of the known (A58)."""
    known = [w for _, w in table.values() if w]
    mean = sum(known) / len(known)
    weights = {name: (w or mean) for name, (_, w) in table.items()}
    total = sum(weights.values())
    return {name: w / total for name, w in weights.items()}


def shares(counts: collections.Counter) -> dict[str, float]:
    assert not [k for k in counts if k.startswith("error:")], counts
    total = sum(counts.values())
    return {name: count / total for name, count in counts.items()}


def counts(
    server,
    backends: list,
    oob: bool,
    node: str,
    names: tuple[str, ...] = (),
    penalty: float | None = None,
    **call_args,
) -> tuple[collections.Counter, collections.Counter]:
    """(pyxds counts, C-core counts) of N calls each after a warm-up, the
    ``backends`` stopped at the end."""
    try:
        addresses = [b.address for b in backends]
        snapshot = wrr_snapshot("wire", addresses, oob, node, 0.1, names, penalty)
        server.set_snapshot(snapshot)
        with both_clients(server, node) as (channel, core):
            return warm_then_count(channel, core, N, **call_args)
    finally:
        for backend in backends:
            backend.stop()


def run(
    server,
    table: dict,
    oob: bool,
    node: str,
    names: tuple[str, ...] = (),
    penalty: float | None = None,
):
    """(pyxds shares, C-core shares) of the backends of ``table``."""
    backends = [
        ForeignOrcaBackend(name, report=report, mirror=not oob)
        for name, (report, _) in table.items()
    ]
    ours, theirs = counts(server, backends, oob, node, names, penalty)
    return shares(ours), shares(theirs)


def assert_same(ours: dict[str, float], theirs: dict[str, float], want: dict[str, float]) -> None:
    for name, share in want.items():
        assert theirs.get(name, 0.0) == pytest.approx(share, abs=TOLERANCE), (name, theirs)
        assert ours.get(name, 0.0) == pytest.approx(theirs.get(name, 0.0), abs=TOLERANCE), (
            name,
            ours,
            theirs,
        )


def test_edge_case_reports_per_call_weigh_like_c_core(server):
    """Per-call reports (A58's default).  The old pyxds gave neg-eps 1000
    (0.5 - 0.4 utilization) and nan-eps no weight."""
    ours, theirs = run(server, EDGE, oob=False, node="wire-per-call")
    assert_same(ours, theirs, expected_shares(EDGE))


def test_edge_case_reports_out_of_band_from_a_foreign_backend_weigh_like_c_core(server):
    """The same reports on a Go/Java-like backend's own OpenRcaService (no
    mirror: the way pyxds reads backends it did not write)."""
    ours, theirs = run(server, EDGE, oob=True, node="wire-oob")
    assert_same(ours, theirs, expected_shares(EDGE))


def test_a_zero_penalty_ignores_an_infinite_eps_like_c_core(server):
    """errorUtilizationPenalty 0: C-core adds no error term at all, so eps
    +inf weighs as eps 0 (200); the old pyxds made it inf * 0 = NaN and
    gave the endpoint the mean (500)."""
    table = {
        "inf-eps": (R(cpu_utilization=0.5, rps_fractional=100, eps=math.inf), 200),
        "light": (R(cpu_utilization=0.125, rps_fractional=100), 800),
        "plain": (R(cpu_utilization=0.5, rps_fractional=100), 200),
    }
    ours, theirs = run(server, table, oob=False, node="wire-penalty-0", penalty=0.0)
    assert_same(ours, theirs, expected_shares(table))


@pytest.mark.parametrize("oob", [False, True], ids=["per-call", "out-of-band"])
def test_a114_metric_names_weigh_like_c_core(server, oob):
    """A114: the max of the named values that are positive, a map name split
    at its first dot, a negative value missing (cpu then), no named value:
    A58's fallback; per call and from a foreign backend's OpenRcaService."""
    node = f"wire-a114-{'oob' if oob else 'per-call'}"
    ours, theirs = run(server, A114, oob=oob, node=node, names=NAMES)
    assert_same(ours, theirs, expected_shares(A114))


def test_reports_of_failed_calls_weigh_like_c_core(server):
    """C-core's call tracker takes the report of every call that carries
    one, whatever its status; so does pyxds (live: both split 800 : 200)."""
    table = {
        "a": (R(cpu_utilization=0.125, rps_fractional=100), 800),
        "b": (R(cpu_utilization=0.5, rps_fractional=100), 200),
    }
    backends = [
        # no OpenRcaService: pyxds's OOB stand-in cannot stand in for the trailers
        ForeignOrcaBackend(
            name, report=report, mirror=True, oob=False, fail=grpc.StatusCode.INTERNAL
        )
        for name, (report, _) in table.items()
    ]
    ours, theirs = counts(server, backends, False, "wire-fail", details=True)
    want = expected_shares(table)
    for name, share in want.items():
        key = f"error:INTERNAL: {name}"
        assert theirs[key] / N == pytest.approx(share, abs=TOLERANCE), theirs
        assert ours[key] / N == pytest.approx(theirs[key] / N, abs=TOLERANCE), (ours, theirs)


@pytest.mark.parametrize("period", [2.5, 0.0129, 0.0004, 0.0, 86400.5])
def test_the_oob_request_is_the_same_bytes_as_c_core_s(server, period):
    """The StreamCoreMetrics request each client sends for the cluster's
    oob_reporting_period: byte for byte the same (C-core asks whole
    milliseconds, rounded down; 0.4 ms is an empty interval)."""
    backend = ForeignOrcaBackend("only", cpu=0.5)
    node = f"wire-request-{period}"
    try:
        server.set_snapshot(wrr_snapshot("wire", [backend.address], True, node, period))
        with both_clients(server, node) as (channel, core):
            assert pyxds_calls(channel, 1) == {"only": 1}
            assert wait_until(lambda: len(backend.oob_requests) == 1, timeout=5)
            assert core.call(1) == {"only": 1}
            assert wait_until(lambda: len(backend.oob_requests) == 2, timeout=5)
    finally:
        backend.stop()
    ours, theirs = backend.oob_requests
    assert ours == theirs


def test_an_unsupported_a114_metric_name_is_a_nack_like_c_core(server):
    """grpcio 1.85 NACKs a cluster whose WRR config names a metric A114 does
    not support; the old pyxds accepted it and ignored the name."""
    backend = ForeignOrcaBackend("only", cpu=0.5)
    names = ("named_metrics.foo", "request_cost.x")
    try:
        server.set_snapshot(
            wrr_snapshot("wire", [backend.address], False, "wire-nack", 0.1, metric_names=names)
        )
        with both_clients(server, "wire-nack") as (channel, core):
            theirs = core.call(1, timeout=3, details=True, wait_for_ready=False)
            ours = pyxds_calls(channel, 1, timeout=3, details=True, wait_for_ready=False)
    finally:
        backend.stop()
    for counts in (theirs, ours):
        (text,) = counts
        assert text.startswith("error:UNAVAILABLE"), counts
        assert "metricNamesForComputingUtilization[1]" in text, text
        assert 'unsupported metric name "request_cost.x"' in text, text
