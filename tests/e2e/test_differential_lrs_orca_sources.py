"""Differential LRS custom metrics (gRFC A64 "Per-Request Support Only", A85)
under a weighted_round_robin cluster, where the same backend's reports also
arrive out of band: only per-call reports reach LRS, in pyxds as in
grpcio 1.85's C-core, whatever WRR reads.

The backend (:class:`foreign_orca_backends.ForeignOrcaBackend`) sends one
fixed report per call (the standard trailer; with ``mirror`` also pyxds.orca's
copy, which is the only one pyxds can read) and streams the same report on
its OpenRcaService every 0.1 s.  Each out-of-band report counted in LRS
would add a request to ``num_requests_finished_with_metric``.
"""

from __future__ import annotations

from foreign_orca_backends import ForeignOrcaBackend
from orca_backends import wrr_policy
from test_differential_lrs_metrics import N, lrs_snapshot, run_both
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.server import ManagementServer

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
