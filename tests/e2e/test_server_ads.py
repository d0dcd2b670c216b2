"""ADS protocol behaviour of pyxds.server, driven by a bare grpcio ADS stream.

To assert that the server sent *nothing* in answer to a request without
sleeping, a test follows that request with one that must be answered (a
subscription to another type): the stream handles requests in order, so the
next response being that answer proves no response came in between.
"""

from __future__ import annotations

import threading

import grpc
import pytest
from backends import RawAdsClient, resource_names_of

from pyxds.server import (
    CLUSTER,
    CLUSTER_LOAD_ASSIGNMENT,
    LISTENER,
    ROUTE_CONFIGURATION,
    ManagementServer,
    RawResource,
    Snapshot,
)
from pyxds.server import builders as b
from pyxds.server import server as server_module


def make_snapshot(version: str | None = None, cluster_lb: str = "ROUND_ROBIN") -> Snapshot:
    return Snapshot(
        listeners=[b.listener("l1", "r1"), b.listener("l2", "r2")],
        routes=[
            b.route_config("r1", [b.virtual_host("vh", ["*"], [b.route(cluster="c1")])]),
            b.route_config("r2", [b.virtual_host("vh", ["*"], [b.route(cluster="c2")])]),
        ],
        clusters=[b.cluster("c1", lb_policy=cluster_lb), b.cluster("c2")],
        endpoints=[
            b.endpoints("c1", [b.locality(endpoints=["127.0.0.1:1001"])]),
            b.endpoints("c2", [b.locality(endpoints=["127.0.0.1:1002"])]),
        ],
        version=version,
    )


@pytest.fixture
def server(xds_server: ManagementServer) -> ManagementServer:
    xds_server.set_snapshot(make_snapshot())
    return xds_server


@pytest.fixture
def client(server: ManagementServer):
    with RawAdsClient(server.address) as c:
        yield c


def assert_next_is_answer_to_probe(client: RawAdsClient) -> None:
    """Subscribe to EDS c2 and require that the very next response is its answer."""
    client.send(CLUSTER_LOAD_ASSIGNMENT, ["c2"])
    response = client.recv()
    assert (response.type_url, resource_names_of(response)) == (CLUSTER_LOAD_ASSIGNMENT, ["c2"])


def test_response_holds_only_the_subscribed_resources(client):
    client.send(ROUTE_CONFIGURATION, ["r2"])
    response = client.recv()
    assert response.type_url == ROUTE_CONFIGURATION
    assert resource_names_of(response) == ["r2"]
    assert all(r.type_url == ROUTE_CONFIGURATION for r in response.resources)


def test_empty_first_lds_request_is_a_wildcard_subscription(client):
    client.send(LISTENER, [])
    assert sorted(resource_names_of(client.recv())) == ["l1", "l2"]


def test_empty_first_eds_request_is_not_a_wildcard(client):
    # Not a wildcard: nothing is subscribed, so nothing is sent (not even an empty
    # response); the next response answers the probe's subscription to c2 alone.
    client.send(CLUSTER_LOAD_ASSIGNMENT, [])
    assert_next_is_answer_to_probe(client)


def test_explicit_wildcard_name_subscribes_to_every_cluster(client):
    client.send(CLUSTER, ["*", "c1"])
    assert sorted(resource_names_of(client.recv())) == ["c1", "c2"]


def test_empty_names_after_explicit_names_unsubscribes_everything(client):
    client.send(CLUSTER, ["c1"])
    first = client.recv()
    client.send(CLUSTER, [], version=first.version_info, nonce=first.nonce)
    assert resource_names_of(client.recv()) == []


def test_new_request_replaces_the_subscription(client):
    client.send(CLUSTER, ["c1"])
    first = client.recv()
    client.send(CLUSTER, ["c2"], version=first.version_info, nonce=first.nonce)
    assert resource_names_of(client.recv()) == ["c2"]


def test_unknown_names_are_not_sent(client):
    client.send(CLUSTER, ["c1", "no-such-cluster"])
    assert resource_names_of(client.recv()) == ["c1"]


def test_ack_of_current_version_gets_no_response(client):
    client.send(CLUSTER, ["c1"])
    client.ack(client.recv(), ["c1"])
    assert_next_is_answer_to_probe(client)


def test_nack_gets_no_resend_of_the_same_version(client):
    client.send(CLUSTER, ["c1"])
    first = client.recv()
    client.send(CLUSTER, ["c1"], version="", nonce=first.nonce, error="bad cluster")
    assert_next_is_answer_to_probe(client)


def test_ack_is_recorded_with_node_version_and_nonce(server, client):
    client.send(CLUSTER, ["c1"])
    response = client.recv()
    client.ack(response, ["c1"])
    ack = server.wait_for_ack("CDS", response.version_info, timeout=5)
    assert (ack.node_id, ack.type_url, ack.nonce, ack.resource_names) == (
        "test-node",
        CLUSTER,
        response.nonce,
        ("c1",),
    )
    assert server.nacks() == []


def test_nack_is_recorded_with_the_client_reason_and_rejected_version(server, client):
    client.send(CLUSTER, ["c1"])
    good = client.recv()
    client.ack(good, ["c1"])
    server.update(clusters=[b.cluster("c1", lb_policy="RANDOM"), b.cluster("c2")])
    bad = client.recv()
    assert bad.version_info != good.version_info
    client.send(CLUSTER, ["c1"], version=good.version_info, nonce=bad.nonce, error="c1: bad")
    nack = server.wait_for_nack("CDS", timeout=5)
    assert nack.node_id == "test-node"
    assert nack.error_message == "c1: bad"
    assert nack.version_info == good.version_info
    assert nack.rejected_version == bad.version_info
    assert nack.nonce == bad.nonce
    assert server.nacks(node_id="other-node") == []
    assert server.nacks(type_url=LISTENER) == []


def test_acks_and_nacks_are_kept_per_node(server):
    with RawAdsClient(server.address, "node-a") as a, RawAdsClient(server.address, "node-b") as b_:
        a.send(CLUSTER, ["c1"])
        a.ack(a.recv(), ["c1"])
        b_.send(CLUSTER, ["c1"])
        b_.send(CLUSTER, ["c1"], nonce=b_.recv().nonce, error="no")
        server.wait_for_ack(CLUSTER, node_id="node-a")
        server.wait_for_nack(CLUSTER, node_id="node-b")
        assert [r.node_id for r in server.acks(CLUSTER)] == ["node-a"]
        assert [r.node_id for r in server.nacks(CLUSTER)] == ["node-b"]


def test_every_response_has_a_fresh_nonce(client):
    client.send(LISTENER, ["l1"])
    client.send(ROUTE_CONFIGURATION, ["r1"])
    client.send(CLUSTER, ["c1"])
    nonces = [client.recv().nonce for _ in range(3)]
    assert len(set(nonces)) == 3 and all(nonces)


def test_versions_are_per_type_and_only_changed_types_bump(server, client):
    for type_url, names in ((LISTENER, ["l1"]), (CLUSTER, ["c1"])):
        client.send(type_url, names)
        client.ack(client.recv(), names)
    server.update(clusters=[b.cluster("c1", lb_policy="RING_HASH"), b.cluster("c2")])
    pushed = client.recv()
    assert pushed.type_url == CLUSTER
    assert pushed.version_info == "2"
    # LDS did not change: nothing was pushed for it.
    client.ack(pushed, ["c1"])
    assert_next_is_answer_to_probe(client)
    assert server.wait_for_ack(LISTENER, "1").version_info == "1"


def test_snapshot_change_is_pushed_at_once_to_connected_streams(server, client):
    client.send(CLUSTER_LOAD_ASSIGNMENT, ["c1"])
    first = client.recv()
    client.ack(first, ["c1"])
    new = b.endpoints("c1", [b.locality(endpoints=["127.0.0.1:2001"])])
    server.update(endpoints=[new, make_snapshot().resources(CLUSTER_LOAD_ASSIGNMENT)["c2"]])
    pushed = client.recv()
    assert pushed.version_info != first.version_info
    assert pushed.resources[0].value == new.SerializeToString(deterministic=True)


def test_identical_snapshot_pushes_nothing(server, client):
    client.send(CLUSTER, ["c1"])
    client.ack(client.recv(), ["c1"])
    server.set_snapshot(make_snapshot())
    assert_next_is_answer_to_probe(client)


def test_sotw_cds_response_carries_every_subscribed_cluster(server, client):
    client.send(CLUSTER, ["c1", "c2"])
    client.ack(client.recv(), ["c1", "c2"])
    server.update(clusters=[b.cluster("c1", lb_policy="RING_HASH"), b.cluster("c2")])
    assert sorted(resource_names_of(client.recv())) == ["c1", "c2"]


def test_removed_resource_is_absent_from_the_next_lds_response(server, client):
    client.send(LISTENER, ["l1", "l2"])
    client.ack(client.recv(), ["l1", "l2"])
    server.remove(listeners=["l2"])
    assert resource_names_of(client.recv()) == ["l1"]


def test_new_name_in_subscription_is_answered_with_it(server, client):
    client.send(CLUSTER, ["c1"])
    first = client.recv()
    client.ack(first, ["c1"])
    client.send(CLUSTER, ["c1", "c2"], version=first.version_info, nonce=first.nonce)
    second = client.recv()
    assert second.version_info == first.version_info
    assert second.nonce != first.nonce
    assert sorted(resource_names_of(second)) == ["c1", "c2"]


def test_nothing_is_sent_before_a_snapshot_exists_then_it_is_pushed(xds_server):
    with RawAdsClient(xds_server.address) as client:
        client.send(LISTENER, ["l1"])
        xds_server.wait_for_streams(1, timeout=5)
        with pytest.raises(TimeoutError):
            client.recv(timeout=0.2)
        xds_server.set_snapshot(make_snapshot())
        assert resource_names_of(client.recv()) == ["l1"]


def test_node_snapshot_overrides_the_default_for_that_node_only(server):
    own = Snapshot(clusters=[b.cluster("c1", lb_policy="LEAST_REQUEST")])
    server.set_snapshot(own, node_id="special")
    with RawAdsClient(server.address, "special") as s, RawAdsClient(server.address, "plain") as p:
        s.send(CLUSTER, ["c1", "c2"])
        p.send(CLUSTER, ["c1", "c2"])
        special, plain = s.recv(), p.recv()
    assert resource_names_of(special) == ["c1"]
    assert sorted(resource_names_of(plain)) == ["c1", "c2"]
    assert special.resources[0].value == own.resources(CLUSTER)["c1"].SerializeToString()


def test_explicit_snapshot_version_is_served(server, client):
    server.set_snapshot(make_snapshot(version="v42", cluster_lb="RING_HASH"))
    client.send(CLUSTER, ["c1"])
    assert client.recv().version_info == "v42"


def test_node_is_taken_from_the_first_request_only(server, client):
    client.send(LISTENER, ["l1"])
    client.ack(client.recv(), ["l1"])
    ack = server.wait_for_ack(LISTENER)
    assert ack.node_id == "test-node"
    assert [r.has_node for r in server.requests()] == [True, False]


def test_raw_resource_bytes_are_served_unchanged(server, client):
    server.update(clusters={"c1": RawResource("c1", b"\xff\xffnot a cluster")})
    client.send(CLUSTER, ["c1"])
    assert client.recv().resources[0].value == b"\xff\xffnot a cluster"


def test_connected_nodes_and_stream_count_follow_streams(server):
    assert server.stream_count == 0
    with RawAdsClient(server.address, "n1") as c1, RawAdsClient(server.address, "n2") as c2:
        c1.send(LISTENER, ["l1"])
        c2.send(LISTENER, ["l1"])
        server.wait_for_streams(2, timeout=5)
        assert server.connected_nodes() == ["n1", "n2"]
        assert server.client_connected.is_set()
    server.wait_until(lambda: server.stream_count == 0, timeout=5)
    assert server.connected_nodes() == []
    assert server.total_streams == 2


def test_close_streams_ends_the_stream_with_unavailable(server, client):
    client.send(LISTENER, ["l1"])
    client.recv()
    assert server.close_streams() == 1
    with pytest.raises(EOFError):
        client.recv()
    assert isinstance(client.closed, grpc.RpcError)
    assert client.closed.code() == grpc.StatusCode.UNAVAILABLE


def test_server_restarts_on_the_same_port_and_serves_again(server):
    port = server.port
    with RawAdsClient(server.address) as client:
        client.send(LISTENER, ["l1"])
        client.recv()
        server.stop()
        with pytest.raises(EOFError):
            client.recv()
    server.start()
    assert server.port == port
    with RawAdsClient(server.address) as client:
        client.send(LISTENER, ["l1"])
        assert resource_names_of(client.recv()) == ["l1"]


def test_wait_for_ack_times_out_naming_what_it_saw(server):
    with pytest.raises(TimeoutError, match="ACK of clusters version '9'"):
        server.wait_for_ack(CLUSTER, "9", timeout=0.05)


def test_bootstrap_points_at_the_server(server):
    config = server.bootstrap(node_id="n", features=("xds_v3", "ignore_resource_deletion"))
    assert config["xds_servers"] == [
        {
            "server_uri": f"127.0.0.1:{server.port}",
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3", "ignore_resource_deletion"],
        }
    ]
    assert config["node"] == {"id": "n"}


def test_start_twice_is_an_error(server):
    with pytest.raises(RuntimeError, match="already started"):
        server.start()


def test_context_manager_starts_and_stops_the_server():
    with ManagementServer() as first:
        assert first.running and first.port > 0
    assert not first.running


def test_server_ignoring_resource_names_sends_every_resource_of_the_type():
    with (
        ManagementServer(ignore_resource_names=True, snapshot=make_snapshot()) as server,
        RawAdsClient(server.address) as client,
    ):
        client.send(ROUTE_CONFIGURATION, ["r1"])
        assert sorted(resource_names_of(client.recv())) == ["r1", "r2"]


def test_clearing_a_node_snapshot_pushes_the_default_again(server):
    server.set_snapshot(Snapshot(clusters=[b.cluster("c1", lb_policy="RING_HASH")]), "n")
    with RawAdsClient(server.address, "n") as client:
        client.send(CLUSTER, ["c1", "c2"])
        own = client.recv()
        client.ack(own, ["c1", "c2"])
        assert resource_names_of(own) == ["c1"]
        server.clear_snapshot("n")
        assert sorted(resource_names_of(client.recv())) == ["c1", "c2"]


def test_changed_content_under_the_same_explicit_version_is_still_pushed(server, client):
    server.set_snapshot(make_snapshot(version="same"))
    client.send(CLUSTER, ["c1"])
    first = client.recv()
    client.ack(first, ["c1"])
    server.set_snapshot(make_snapshot(version="same", cluster_lb="RING_HASH"))
    second = client.recv()
    assert second.version_info == "same"
    assert second.resources[0].value != first.resources[0].value


# -- xDS transport protocol details a real client relies on ------------------------


def assert_next_answers(client: RawAdsClient, type_url: str, names: list[str]) -> None:
    """Subscribe to ``names`` of another type; the very next response must answer it."""
    client.send(type_url, names)
    response = client.recv()
    assert (response.type_url, sorted(resource_names_of(response))) == (type_url, sorted(names))


def test_request_with_a_stale_nonce_is_ignored(server, client):
    client.send(CLUSTER, ["c1"])
    first = client.recv()
    client.ack(first, ["c1"])
    server.update(clusters=[b.cluster("c1", lb_policy="RING_HASH"), b.cluster("c2")])
    second = client.recv()
    # The client had not seen `second` yet: its change of subscription under the old
    # nonce (and one without any nonce) is ignored, as go-control-plane does.
    client.send(CLUSTER, ["c1", "c2"], version=first.version_info, nonce=first.nonce)
    client.send(CLUSTER, ["c2"], version=first.version_info)
    assert_next_is_answer_to_probe(client)
    # The answer to the latest response carries the subscription again and is served.
    client.send(CLUSTER, ["c1", "c2"], version=second.version_info, nonce=second.nonce)
    third = client.recv()
    assert sorted(resource_names_of(third)) == ["c1", "c2"]
    assert third.version_info == second.version_info and third.nonce != second.nonce
    # Both answers were still recorded as what the client sent.
    assert [a.nonce for a in server.acks(CLUSTER)] == [first.nonce, first.nonce, second.nonce]


def test_nack_with_a_stale_nonce_is_recorded_but_not_answered(server, client):
    client.send(CLUSTER, ["c1"])
    first = client.recv()
    server.update(clusters=[b.cluster("c1", lb_policy="RING_HASH"), b.cluster("c2")])
    second = client.recv()
    client.send(CLUSTER, ["c1", "c2"], nonce=first.nonce, error="old one was bad")
    assert_next_is_answer_to_probe(client)
    nack = server.wait_for_nack(CLUSTER)
    assert (nack.nonce, nack.rejected_version) == (first.nonce, first.version_info)
    assert second.nonce != first.nonce


def test_nonces_are_tracked_per_type(server, client):
    client.send(LISTENER, ["l1"])
    lds = client.recv()
    client.send(CLUSTER, ["c1"])
    cds = client.recv()
    # An LDS request carrying the CDS nonce is stale for LDS: ignored.
    client.send(LISTENER, ["l1", "l2"], version=lds.version_info, nonce=cds.nonce)
    assert_next_is_answer_to_probe(client)
    client.send(LISTENER, ["l1", "l2"], version=lds.version_info, nonce=lds.nonce)
    assert sorted(resource_names_of(client.recv())) == ["l1", "l2"]


def test_error_detail_makes_a_nack_even_with_an_empty_message(server, client):
    client.send(CLUSTER, ["c1"])
    response = client.recv()
    client.send(CLUSTER, ["c1"], nonce=response.nonce, error="")
    nack = server.wait_for_nack(CLUSTER)
    assert (nack.error_message, nack.rejected_version) == ("", response.version_info)
    assert server.acks() == []


def test_unsubscribed_names_are_withdrawn_and_resubscribing_sends_them_again(server, client):
    client.send(ROUTE_CONFIGURATION, ["r1", "r2"])
    first = client.recv()
    client.ack(first, ["r1", "r2"])
    client.send(ROUTE_CONFIGURATION, ["r2"], version=first.version_info, nonce=first.nonce)
    second = client.recv()
    assert resource_names_of(second) == ["r2"]
    client.ack(second, ["r2"])
    client.send(ROUTE_CONFIGURATION, ["r1", "r2"], version=second.version_info, nonce=second.nonce)
    third = client.recv()
    assert sorted(resource_names_of(third)) == ["r1", "r2"]
    assert third.version_info == first.version_info


def test_names_the_snapshot_lacks_get_no_response_until_they_exist(server, client):
    client.send(CLUSTER_LOAD_ASSIGNMENT, ["c9"])
    assert_next_answers(client, LISTENER, ["l1"])
    c9 = b.endpoints("c9", [b.locality(endpoints=["127.0.0.1:1009"])])
    server.update(endpoints=[*make_snapshot().endpoints, c9])
    pushed = client.recv()
    assert (pushed.type_url, resource_names_of(pushed)) == (CLUSTER_LOAD_ASSIGNMENT, ["c9"])


def test_cds_response_still_carries_every_existing_name_when_one_is_missing(server, client):
    client.send(CLUSTER, ["c1", "c9"])
    first = client.recv()
    assert resource_names_of(first) == ["c1"]
    client.ack(first, ["c1", "c9"])
    server.update(clusters=[*make_snapshot().clusters, b.cluster("c9")])
    # SotW: absence from an LDS/CDS response means deletion, so c1 must come along.
    assert sorted(resource_names_of(client.recv())) == ["c1", "c9"]


def test_change_to_an_unsubscribed_resource_pushes_nothing(server, client):
    client.send(CLUSTER_LOAD_ASSIGNMENT, ["c1"])
    client.ack(client.recv(), ["c1"])
    c2 = b.endpoints("c2", [b.locality(endpoints=["127.0.0.1:2002"])])
    server.update(endpoints=[make_snapshot().resources(CLUSTER_LOAD_ASSIGNMENT)["c1"], c2])
    assert_next_answers(client, LISTENER, ["l1"])


def test_legacy_wildcard_lds_stays_wildcard_on_acks_and_gets_new_listeners(server, client):
    client.send(LISTENER, [])
    first = client.recv()
    client.ack(first, [])
    server.update(listeners=[*make_snapshot().listeners, b.listener("l3", "r1")])
    second = client.recv()
    assert sorted(resource_names_of(second)) == ["l1", "l2", "l3"]
    client.send(LISTENER, ["l1"], version=second.version_info, nonce=second.nonce)
    assert resource_names_of(client.recv()) == ["l1"]


def test_many_streams_of_many_nodes_all_get_each_push(server):
    clients = [RawAdsClient(server.address, f"node-{i % 5}") for i in range(20)]
    try:
        for c in clients:
            c.send(CLUSTER, ["c1"])
        firsts = [c.recv() for c in clients]
        for c, r in zip(clients, firsts, strict=True):
            c.ack(r, ["c1"])
        server.wait_until(lambda: len(server.acks(CLUSTER)) == 20, timeout=10)
        assert server.connected_nodes() == [f"node-{i}" for i in range(5)]
        server.update(clusters=[b.cluster("c1", lb_policy="RING_HASH"), b.cluster("c2")])
        pushed = [c.recv() for c in clients]
        assert {r.version_info for r in pushed} == {"2"}
        assert len({r.nonce for r in pushed + firsts}) == 40
    finally:
        for c in clients:
            c.close()
    server.wait_until(lambda: server.stream_count == 0, timeout=10)


def test_stream_closed_by_the_client_mid_push_does_not_disturb_others(server):
    big = [b.locality(endpoints=[f"127.0.0.1:{p}" for p in range(10000, 12000)])]
    with RawAdsClient(server.address, "stays") as stays:
        stays.send(CLUSTER, ["c1"])
        stays.ack(stays.recv(), ["c1"])
        leaver = RawAdsClient(server.address, "leaves")
        leaver.send(CLUSTER_LOAD_ASSIGNMENT, ["c1"])
        leaver.recv()
        for i in range(20):
            server.update(endpoints=[b.endpoints("c1", big, {"d": i + 1})])
            if i == 5:
                leaver.close()
        server.wait_until(lambda: server.connected_nodes() == ["stays"], timeout=10)
        server.update(clusters=[b.cluster("c1", lb_policy="RING_HASH")])
        assert resource_names_of(stays.recv()) == ["c1"]


def test_first_request_without_node_ends_the_stream_with_invalid_argument(server):
    from envoy.service.discovery.v3 import discovery_pb2

    with RawAdsClient(server.address) as client:
        request = discovery_pb2.DiscoveryRequest(type_url=LISTENER, resource_names=["l1"])
        client.send_request(request)
        with pytest.raises(EOFError):
            client.recv()
        assert client.closed.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must carry the node" in client.closed.details()
    assert server.stream_count == 0
    with RawAdsClient(server.address) as client:  # the server is fine
        client.send(LISTENER, ["l1"])
        assert resource_names_of(client.recv()) == ["l1"]


def test_request_without_type_url_ends_the_stream_with_invalid_argument(server, client):
    client.send(LISTENER, ["l1"])
    client.recv()
    client.send("", ["l1"])
    with pytest.raises(EOFError):
        client.recv()
    assert client.closed.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "type_url is required" in client.closed.details()
    server.wait_until(lambda: server.stream_count == 0, timeout=5)


def test_unknown_type_url_is_recorded_and_ignored(server, client):
    secret = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
    client.send(secret, ["s1"])
    assert_next_is_answer_to_probe(client)
    assert [r.type_url for r in server.requests()][:1] == [secret]


def test_stop_with_open_streams_ends_them_all_and_restarts(server):
    clients = [RawAdsClient(server.address, f"n{i}") for i in range(8)]
    try:
        for c in clients:
            c.send(LISTENER, ["l1"])
            c.recv()
        server.stop()
        for c in clients:
            with pytest.raises(EOFError):
                c.recv()
        server.wait_until(lambda: server.stream_count == 0, timeout=5)
        server.set_snapshot(make_snapshot(cluster_lb="RING_HASH"))  # no streams: no error
    finally:
        for c in clients:
            c.close()
    server.start()
    with RawAdsClient(server.address) as client:
        client.send(CLUSTER, ["c1"])
        assert resource_names_of(client.recv()) == ["c1"]


def test_a_stream_past_max_workers_is_refused_not_left_unanswered():
    """Each open ADS stream holds one of the server's worker threads; a
    stream beyond ``max_workers`` is refused RESOURCE_EXHAUSTED at once (a
    client retries it with backoff) instead of waiting unanswered for a
    worker while the others stay open (it used to: 64 workers were used up
    by one test module's clients, and new streams then got nothing)."""
    with ManagementServer(max_workers=2, snapshot=make_snapshot()) as server:
        # each stream opens when made, on a connection of its own: the third
        # is made once the first two are served (made together, it reached
        # the server before the second once and took its worker)
        streams = [RawAdsClient(server.address) for _ in range(2)]
        try:
            for open_stream in streams:
                open_stream.send(LISTENER, ["l1"])
                assert resource_names_of(open_stream.recv()) == ["l1"]
            streams.append(RawAdsClient(server.address))
            streams[2].send(LISTENER, ["l1"])
            with pytest.raises(EOFError):
                streams[2].recv()
            assert isinstance(streams[2].closed, grpc.RpcError)
            assert streams[2].closed.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            streams[0].close()  # its worker is free again once the server sees it
            for _ in range(50):
                retry = RawAdsClient(server.address)
                streams.append(retry)
                retry.send(LISTENER, ["l2"])
                try:
                    names = resource_names_of(retry.recv())
                except EOFError:
                    continue  # refused: the closed stream's worker not yet free
                assert names == ["l2"]
                break
            else:
                pytest.fail("no stream was served after one closed")
        finally:
            for stream in streams:
                stream.close()


def test_first_response_does_not_wait_for_the_reader_thread(server, monkeypatch):
    # The stream answers its first request itself: the thread that reads the
    # later ones starts after that answer (a client sending its HEADERS and
    # first request together had that thread's start in its first response's
    # time).  Held here until the first response has come: the old server
    # started it before reading anything, so no response came.
    release = threading.Event()
    started = threading.Event()

    class HeldReader(threading.Thread):
        def start(self) -> None:
            if self.name == "pyxds-ads-reader":
                started.set()
                assert release.wait(10)
            super().start()

    monkeypatch.setattr(server_module.threading, "Thread", HeldReader)
    with RawAdsClient(server.address) as client:
        try:
            client.send(LISTENER, ["l1"])
            response = client.recv(timeout=2)
            assert resource_names_of(response) == ["l1"]
        finally:
            release.set()
        assert started.wait(5)
        client.ack(response, ["l1"])
        assert_next_is_answer_to_probe(client)
        assert server.acks(type_url=LISTENER)


def test_stream_finished_by_its_client_before_any_request_ends_ok(server):
    # the stream's own read of its first request sees the end: the RPC ends
    # OK, as a stream finished later does
    with RawAdsClient(server.address) as client:
        client.finish()
        with pytest.raises(EOFError):
            client.recv()
        assert client.closed is True
