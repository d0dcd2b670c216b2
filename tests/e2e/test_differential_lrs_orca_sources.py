"""Differential LRS custom metrics (gRFC A64 "Per-Request Support Only", A85)
under a weighted_round_robin cluster, where the same backend's reports also
arrive out of band: only per-call reports reach LRS, in pyxds as in
grpcio 1.85's C-core, whatever WRR reads.

The backend (:class:`foreign_orca_backends.ForeignOrcaBackend`) sends one
fixed report per call (the standard trailer; with ``mirror`` also pyxds.orca's
copy, which is the only one pyxds can read) and streams the same report on
its OpenRcaService every 0.1 s.  Each out-of-band report counted in LRS
would add a request to ``num_requests_finished_with_metric``.

Also which ORCA fields reach LRS at all (A85 "Proposal": named metrics and
the three top-level utilizations; A64 with A85 switched off: every named
metric), with a report that has every kind of field.
"""

from __future__ import annotations

import pytest
from foreign_orca_backends import ForeignOrcaBackend
from orca_backends import wrr_policy
from test_differential_lrs_metrics import N, lrs_snapshot, run_both
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.server import ManagementServer
from pyxds.xds.resources.cluster import ORCA_LRS_PROPAGATION_ENV

REPORT = OrcaLoadReport(
    cpu_utilization=0.25, rps_fractional=10, named_metrics={"": 5.0, "foo": 1.0}
)
METRICS = ["named_metrics.", "named_metrics.foo", "cpu_utilization"]


def run(oob: bool, mirror: bool, node: str) -> tuple[dict, dict]:
    backend = ForeignOrcaBackend("m0", report=REPORT, mirror=mirror)
    server = ManagementServer(lrs_interval=1.0).start()
    try:
        server.set_snapshot(
            lrs_snapshot(backend.address, METRICS, [("wrr_locality", wrr_policy(oob, 0.1))])
        )
        return run_both(server, node)
    finally:
        server.stop()
        backend.stop()


PER_CALL_TOTALS = {
    "requests": (N, 0.0),
    "cpu_utilization": (N, N * 0.25),
    "named_metrics.": (N, N * 5.0),  # the empty key is a key (grpcio 1.85 alike)
    "named_metrics.foo": (N, N * 1.0),
}


def test_out_of_band_reports_of_a_wrr_oob_cluster_do_not_reach_lrs():
    """enableOobLoadReport: WRR reads the OpenRcaService stream; LRS counts
    each call's own report once, as C-core."""
    ours, theirs = run(oob=True, mirror=True, node="lrs-src-oob")
    assert ours == theirs == PER_CALL_TOTALS


def test_the_wrr_stand_in_stream_does_not_reach_lrs():
    """Per-call WRR with a backend whose per-call reports pyxds cannot see
    (no mirror): pyxds weighs it by its OpenRcaService (the stand-in,
    docs/differences-from-c-core.md), but those reports are out of band and
    stay out of LRS, which then has no metrics (the documented gap: grpcio
    hides the standard trailer); C-core reports the per-call ones."""
    ours, theirs = run(oob=False, mirror=False, node="lrs-src-stand-in")
    assert theirs == PER_CALL_TOTALS
    assert ours == {"requests": (N, 0.0)}


#: every kind of ORCA field, each with a value
EVERY_FIELD = OrcaLoadReport(
    cpu_utilization=0.25,
    application_utilization=0.5,
    mem_utilization=0.125,
    rps_fractional=7,
    eps=1,
    request_cost={"x": 1.0, "foo": 9.0},
    utilization={"y": 0.5, "foo": 0.3},
    named_metrics={"foo": 2.0},
)


@pytest.mark.parametrize(
    ("metrics", "a85", "want"),
    [
        (  # A85: only named_metrics.<key> and the three top-level utilizations
            [
                "request_cost.x",
                "request_cost.*",
                "utilization.y",
                "utilization.*",
                "rps_fractional",
                "eps",
                "qps",
                "named_metrics.foo",
            ],
            True,
            {"named_metrics.foo": (N, N * 2.0)},
        ),
        ([], True, {}),  # A85: nothing listed, nothing propagated
        (  # A64 (A85 switched off): every named metric under its own name, nothing else
            ["named_metrics.*", "cpu_utilization"],
            False,
            {"foo": (N, N * 2.0)},
        ),
    ],
    ids=["a85-listed", "a85-unset", "a64"],
)
def test_which_orca_fields_reach_lrs_as_in_c_core(metrics, a85, want, monkeypatch):
    """A64/A85: request costs, the utilization map, qps and eps never reach
    LRS, even when listed; grpcio 1.85 live, the same totals."""
    env = None if a85 else {ORCA_LRS_PROPAGATION_ENV: "false"}
    if env:
        monkeypatch.setenv(ORCA_LRS_PROPAGATION_ENV, "false")
    backend = ForeignOrcaBackend("m0", report=EVERY_FIELD, mirror=True)
    server = ManagementServer(lrs_interval=1.0).start()
    try:
        server.set_snapshot(lrs_snapshot(backend.address, metrics))
        ours, theirs = run_both(server, f"lrs-fields-{len(metrics)}-{a85}", env=env)
    finally:
        server.stop()
        backend.stop()
    assert ours == theirs == {"requests": (N, 0.0), **want}
