"""Differential WRR (gRFC A58) with backends pyxds did not write: plain
grpcio servers that report load like Go or Java backends
(:mod:`foreign_orca_backends`: the standard ``endpoint-load-metrics-bin``
trailer per call, their own ``OpenRcaService`` out of band), through pyxds
and through grpcio's C-core ``xds:///`` channel, same pyxds.server config.

grpcio's C-core consumes the standard trailer and never shows it to Python,
so pyxds reads such a backend's per-call load through its OpenRcaService
instead (the OOB stand-in, docs/lb-policies.md); what each scenario shows:

=========================  ===================  =============  =============
backend reports            config               C-core         pyxds
=========================  ===================  =============  =============
out of band only           enableOobLoadReport  weighted       weighted
both ways                  per call (default)   weighted       weighted (stand-in)
both ways                  enableOobLoadReport  weighted       weighted
out of band only           per call (default)   round robin    weighted (deviation)
per call only              per call (default)   weighted       round robin + warning
=========================  ===================  =============  =============

The last two are the documented differences (docs/differences-from-c-core.md).
"""

from __future__ import annotations

import collections
import logging

import pytest
from foreign_orca_backends import ForeignOrcaBackend
from orca_backends import both_clients, warm_then_count, wrr_snapshot

from pyxds.cli.inspect_model import wrr_weights
from pyxds.server import ManagementServer

N = 1500
TOLERANCE = 0.05  # the "within 5 points"
HEAVY, LIGHT = 0.1, 0.9  # qps 100 at cpu 0.1 vs 0.9: 90 % / 10 %


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


def share(counts: collections.Counter, name: str) -> float:
    assert not [k for k in counts if k.startswith("error:")], counts
    return counts[name] / sum(counts.values())


def run(server, per_call: bool, oob_service: bool, oob_config: bool, node: str):
    """(pyxds share, C-core share) of the lightly loaded backend, and the
    pyxds channel's config dump, each client after a warm-up."""
    backends = [
        ForeignOrcaBackend("heavy", HEAVY, per_call=per_call, oob=oob_service),
        ForeignOrcaBackend("light", LIGHT, per_call=per_call, oob=oob_service),
    ]
    try:
        server.set_snapshot(
            wrr_snapshot("foreign", [x.address for x in backends], oob_config, node, 0.1)
        )
        with both_clients(server, node) as (channel, core):
            counts = warm_then_count(channel, core, N)  # warm-up: per call or stand-in
            ours, theirs = (share(c, "heavy") for c in counts)
            dump = channel.config_dump()
    finally:
        for backend in backends:
            backend.stop()
    return ours, theirs, dump


def wrr_rows(dump: dict) -> list[dict]:
    """The WRR endpoint rows of a channel dump, as ``pyxds inspect`` reads them."""
    return list(wrr_weights(dump["lb_policy"]).values())


def test_out_of_band_only_backend_with_oob_config_splits_like_c_core(server):
    ours, theirs, _ = run(server, per_call=False, oob_service=True, oob_config=True, node="f-oob")
    assert theirs == pytest.approx(0.9, abs=TOLERANCE)
    assert abs(ours - theirs) <= TOLERANCE


def test_both_ways_backend_with_per_call_config_splits_like_c_core(server):
    """The A58 default with a Go/Java-like backend: C-core weighs by the
    per-call trailer it reads; pyxds by the same backend's OpenRcaService."""
    ours, theirs, dump = run(
        server, per_call=True, oob_service=True, oob_config=False, node="f-both"
    )
    assert theirs == pytest.approx(0.9, abs=TOLERANCE), "C-core does not obey the trailer"
    assert abs(ours - theirs) <= TOLERANCE
    sources = {row["source"] for row in wrr_rows(dump)}
    assert sources == {"out-of-band (stand-in)"}


def test_both_ways_backend_with_oob_config_splits_like_c_core(server):
    ours, theirs, _ = run(
        server, per_call=True, oob_service=True, oob_config=True, node="f-both-oob"
    )
    assert theirs == pytest.approx(0.9, abs=TOLERANCE)
    assert abs(ours - theirs) <= TOLERANCE


def test_out_of_band_only_backend_with_per_call_config_is_the_documented_deviation(server):
    """C-core sees no per-call report: round robin.  pyxds cannot tell "no
    per-call report" from "a per-call report grpcio hid", and weighs by the
    OOB stand-in (docs/differences-from-c-core.md)."""
    ours, theirs, _ = run(
        server, per_call=False, oob_service=True, oob_config=False, node="f-oob-percall"
    )
    assert theirs == pytest.approx(0.5, abs=TOLERANCE)
    assert ours == pytest.approx(0.9, abs=TOLERANCE)


def test_per_call_only_backend_gives_pyxds_no_weights_and_says_so(server, caplog):
    """The gap pyxds cannot close (grpcio hides the trailer, no OOB service):
    round robin, one warning naming the cluster and the reason, the dump
    shows the endpoints without weights."""
    from pyxds.lb import weighted_round_robin as wrr

    wrr._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="pyxds.lb.weighted_round_robin"):
        ours, theirs, dump = run(
            server, per_call=True, oob_service=False, oob_config=False, node="f-percall"
        )
    assert theirs == pytest.approx(0.9, abs=TOLERANCE)
    assert ours == pytest.approx(0.5, abs=TOLERANCE)
    warnings = [r.getMessage() for r in caplog.records if r.name.endswith("weighted_round_robin")]
    assert len(warnings) == 1, warnings
    assert "cluster foreign" in warnings[0] and "OpenRcaService" in warnings[0]
    rows = wrr_rows(dump)
    assert len(rows) == 2
    assert all(row["weight"] == 0.0 and "OpenRcaService" in row["no_weight"] for row in rows)
