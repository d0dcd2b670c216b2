"""Differential: ``client_side_weighted_round_robin`` clusters (gRFC A58 via
A52's WrrLocality) through pyxds and through grpcio's C-core ``xds:///``
channel, against the same pyxds.server and the same backends, whose load
reports come from :mod:`pyxds.orca` (per-call trailers with the server
interceptor, or the OOB ``OpenRcaService``).

Both clients must split the traffic by the reported load (90/10 here) and
agree with each other within a few percent: this is also the test that
C-core's WRR obeys pyxds.orca's reports.
"""

from __future__ import annotations

import collections

import pytest
from channel_fixtures import TARGET, CoreXdsClient, pyxds_calls
from orca_backends import HEAVY, LIGHT, OrcaBackend, wrr_snapshot

import pyxds._api as pyxds
from pyxds.server import ManagementServer

NODE = "differential-wrr"
N = 2000
TOLERANCE = 0.04


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backends():
    started = [OrcaBackend("heavy", HEAVY), OrcaBackend("light", LIGHT)]
    yield started
    for backend in started:
        backend.stop()


def share(counts: collections.Counter, name: str) -> float:
    total = sum(counts.values())
    assert not [k for k in counts if k.startswith("error:")], counts
    return counts[name] / total


def splits(server, backends, oob: bool, version: str) -> tuple[float, float]:
    """(pyxds share, C-core share) of the heavy-weight backend, each over N
    RPCs after a warm-up that lets reports arrive and weights apply."""
    server.set_snapshot(wrr_snapshot("wrr", [x.address for x in backends], oob, version))
    bootstrap = server.bootstrap(node_id=NODE)
    core = CoreXdsClient(bootstrap)
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    try:
        for client in (lambda n: pyxds_calls(channel, n), lambda n: core.call(n)):
            client(300)  # connect, first reports, a few 100 ms weight updates
        ours = share(pyxds_calls(channel, N), "heavy")
        theirs = share(core.call(N), "heavy")
    finally:
        channel.close()
        core.close()
    return ours, theirs


def test_per_call_orca_splits_like_c_core(server, backends):
    ours, theirs = splits(server, backends, oob=False, version="per-call")
    assert theirs == pytest.approx(0.9, abs=TOLERANCE), "C-core does not obey pyxds.orca trailers"
    assert ours == pytest.approx(0.9, abs=TOLERANCE)
    assert abs(ours - theirs) <= TOLERANCE


def test_oob_orca_splits_like_c_core(server, backends):
    ours, theirs = splits(server, backends, oob=True, version="oob")
    assert theirs == pytest.approx(0.9, abs=TOLERANCE), "C-core does not obey pyxds.orca OOB"
    assert ours == pytest.approx(0.9, abs=TOLERANCE)
    assert abs(ours - theirs) <= TOLERANCE


def test_shares_follow_a_change_of_reported_load(server, backends):
    heavy, light = backends
    server.set_snapshot(wrr_snapshot("wrr", [x.address for x in backends], False, "shift"))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=NODE + "-shift"))
    try:
        pyxds_calls(channel, 300)
        assert share(pyxds_calls(channel, N), "heavy") == pytest.approx(0.9, abs=TOLERANCE)
        heavy.set_load(LIGHT)
        light.set_load(HEAVY)
        # new reports, then a weight update: a timer (the weight update
        # period, the blackout), not a count of calls, so wait (bounded)
        for _ in range(20):
            if share(pyxds_calls(channel, 200), "light") > 0.8:
                break
        assert share(pyxds_calls(channel, N), "light") == pytest.approx(0.9, abs=TOLERANCE)
    finally:
        heavy.set_load(HEAVY)
        light.set_load(LIGHT)
        channel.close()


def test_a_cds_only_switch_to_out_of_band_reports_is_followed_like_c_core(server):
    """A CDS update that turns ``enableOobLoadReport`` on while the EDS stays
    the same (cds hands the policy the very endpoint objects it has) takes
    effect at once: each backend's per-call and out-of-band reports disagree
    (per call "heavy" is the light one, out of band the loaded one), so the
    split shows which reports the clients read, before and after."""
    heavy, light = OrcaBackend("heavy", HEAVY), OrcaBackend("light", LIGHT)
    heavy.recorder.set_cpu_utilization(LIGHT)  # out of band: the other way round
    light.recorder.set_cpu_utilization(HEAVY)
    addresses = [heavy.address, light.address]
    server.set_snapshot(wrr_snapshot("wrr", addresses, False, "switch-1"))
    bootstrap = server.bootstrap(node_id=NODE + "-switch")
    core = CoreXdsClient(bootstrap)
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    clients = {"pyxds": lambda n: pyxds_calls(channel, n), "C-core": lambda n: core.call(n)}
    try:
        for name, client in clients.items():
            client(300)  # connect, per-call reports, weight updates
            assert share(client(N), "heavy") == pytest.approx(0.9, abs=TOLERANCE), name
        server.set_snapshot(wrr_snapshot("wrr", addresses, True, "switch-2"))
        for name, client in clients.items():
            for _ in range(20):  # bounded: the new config, its streams, their reports
                if share(client(200), "light") > 0.8:
                    break
            assert share(client(N), "light") == pytest.approx(0.9, abs=TOLERANCE), name
    finally:
        channel.close()
        core.close()
        heavy.stop()
        light.stop()
