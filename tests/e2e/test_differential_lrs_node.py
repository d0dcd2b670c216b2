"""Differential: the first request of an LRS stream (gRFC A27 "Load
Reporting"; C-core lrs_client.cc CreateLrsInitialRequest): the bootstrap's
node (id, cluster, metadata, locality) with the client features
``envoy.lb.does_not_support_overprovisioning`` and
``envoy.lrs.supports_send_all_clusters``, and no load yet, field for field
as grpcio's C-core sends it (``xds:///`` channel in a subprocess), the user
agent aside; and the reporting interval, raised to C-core's 1 s minimum."""

from __future__ import annotations

import itertools
import time

import pytest
from channel_fixtures import TARGET, Backend, CoreXdsClient, pyxds_calls
from channel_fixtures import wait_until as wait_for
from google.protobuf import json_format
from lrs_fixtures import one_cluster_snapshot

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b

NODE_EXTRAS = {
    "cluster": "lrs-node-cluster",
    "metadata": {"team": "lrs", "replicas": 3, "canary": True},
    "locality": {"region": "nr", "zone": "nz", "sub_zone": "ns"},
}


@pytest.fixture(scope="module")
def backend():
    started = Backend("n0").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def server(backend):
    srv = ManagementServer(lrs_interval=1.0).start()
    srv.set_snapshot(
        one_cluster_snapshot(b.cluster("lrs-node", lrs_server=True), "zn", backend.address)
    )
    yield srv
    srv.stop()


def bootstrap(server: ManagementServer, node_id: str) -> dict:
    config = server.bootstrap(node_id=node_id)
    config["node"].update(NODE_EXTRAS)
    return config


def test_first_lrs_request_carries_the_bootstrap_node_as_c_core_s_does(server):
    py_node, core_node = "lrs-node-pyxds", "lrs-node-core"
    core = CoreXdsClient(bootstrap(server, core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap(server, py_node))
    try:
        assert pyxds_calls(channel, 2) == core.call(2) == {"n0": 2}

        def first(node_id: str):
            found = [r for r in server.lrs.initial_requests() if r.node.id == node_id]
            return found[0] if found else None

        assert wait_for(lambda: first(py_node) is not None and first(core_node) is not None, 10)
        sent = {}
        for node_id in (py_node, core_node):
            request = first(node_id)
            assert not request.cluster_stats
            node = json_format.MessageToDict(request.node, preserving_proto_field_name=True)
            for agent in ("user_agent_name", "user_agent_version"):
                assert node.pop(agent)
            assert node.pop("id") == node_id
            sent[node_id] = node
        assert sent[py_node] == sent[core_node]
        assert sent[py_node]["client_features"] == [
            "envoy.lb.does_not_support_overprovisioning",
            "envoy.lrs.supports_send_all_clusters",
        ]
        assert sent[py_node]["locality"] == NODE_EXTRAS["locality"]
    finally:
        channel.close()
        core.close()


def test_an_interval_under_one_second_is_raised_to_one_second_as_in_c_core(server):
    """C-core GRPC_XDS_MIN_CLIENT_LOAD_REPORTING_INTERVAL_MS (1 s): the LRS
    server asks for a report every 100 ms; under steady traffic both clients
    report once a second, each report measuring about one second."""
    server.lrs.configure(interval=0.1)
    py_node, core_node = "lrs-interval-pyxds", "lrs-interval-core"
    core = CoreXdsClient(server.bootstrap(node_id=core_node))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=py_node))
    try:
        end = time.monotonic() + 3.6
        while time.monotonic() < end:
            assert pyxds_calls(channel, 1) == core.call(1) == {"n0": 1}
            time.sleep(0.05)
        for node_id in (py_node, core_node):
            records = server.lrs.reports("lrs-node", node_id)
            assert 2 <= len(records) <= 4, (node_id, len(records))
            gaps = [y.received_at - x.received_at for x, y in itertools.pairwise(records)]
            assert all(0.8 < gap < 1.3 for gap in gaps), (node_id, gaps)
            for record in records[1:]:
                d = record.stats.load_report_interval
                assert 0.8 < d.seconds + d.nanos / 1e9 < 1.3, (node_id, d)
    finally:
        server.lrs.configure(interval=1.0)
        channel.close()
        core.close()
