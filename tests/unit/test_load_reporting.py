"""Load reporting (gRFC A27 "Load Reporting", A37 xds_cluster_impl): the load
store, the LRS stream protocol and the XdsClient's LRS channel, on a
FakeClock with a fake LRS transport; xds_cluster_impl counting into the store
over seeded picks."""

from __future__ import annotations

import itertools
import threading

import grpc
from envoy.service.load_stats.v3 import lrs_pb2
from lrs_support import FakeLrsTransport, lrs_client
from test_cds_support import (
    attributes,
    build,
    connect_all,
    eds_cluster,
    eds_entry,
    loc,
    locality,
    xds_config,
)

from pyxds.lb import Endpoint, PickComplete, PickDrop, ResolverUpdate, Status
from pyxds.resolver.xds_config import XDS_CLIENT_ATTRIBUTE
from pyxds.testing import FakeClock, FakeHelper
from pyxds.xds.backoff import ExponentialBackoff, StreamBackoff
from pyxds.xds.load_store import LoadStore
from pyxds.xds.lrs_client import LrsChannel
from pyxds.xds.lrs_state import LRS_CLIENT_FEATURE, LrsStreamState

OK = Status(grpc.StatusCode.OK)
FAILED = Status(grpc.StatusCode.UNAVAILABLE, "boom")
SERVER = "xds.example:443"
_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


# --------------------------------------------------------------------------- store


def test_report_interval_is_measured_on_the_clock_since_the_previous_report():
    clock = FakeClock(100.0)
    store = LoadStore(clock)
    store.drop_stats(SERVER, "c", "svc")
    clock.advance(2.5)
    (first,) = store.take_report(SERVER, True, ())
    assert first.load_report_interval == 2.5
    clock.advance(0.75)
    (second,) = store.take_report(SERVER, True, ())
    assert second.load_report_interval == 0.75


def test_counts_of_clusters_the_server_did_not_ask_for_are_dropped_not_carried_over():
    clock = FakeClock()
    store = LoadStore(clock)
    wanted = store.locality_stats(SERVER, "wanted", "", loc("a"))
    other = store.locality_stats(SERVER, "other", "", loc("a"))
    wanted.call_started()
    other.call_started()
    other.call_finished(True)
    reports = store.take_report(SERVER, False, {"wanted"})
    assert [r.cluster for r in reports] == ["wanted"]
    # "other" is now asked for: its earlier calls are not in this report.
    (later,) = store.take_report(SERVER, False, {"other"})
    assert later.localities[0].total_issued_requests == 0
    assert later.localities[0].total_successful_requests == 0


def test_released_stats_are_flushed_by_one_more_report_then_forgotten():
    clock = FakeClock()
    needed: list[str] = []
    store = LoadStore(clock, on_needed=needed.append)
    drops = store.drop_stats(SERVER, "c", "")
    stats = store.locality_stats(SERVER, "c", "", loc("a"))
    assert needed == [SERVER]  # the first stats of a server start its stream
    drops.add("lb")
    stats.call_started()
    stats.call_finished(False)
    store.release(drops)
    store.release(stats)
    assert store.has_stats(SERVER)
    (report,) = store.take_report(SERVER, True, ())
    assert report.dropped_requests == {"lb": 1}
    assert report.localities[0].total_error_requests == 1
    assert not store.has_stats(SERVER)
    assert store.take_report(SERVER, True, ()) == []


def test_released_locality_stays_while_calls_on_it_are_in_progress():
    store = LoadStore(FakeClock())
    stats = store.locality_stats(SERVER, "c", "", loc("a"))
    stats.call_started()
    store.release(stats)
    (report,) = store.take_report(SERVER, True, ())
    assert report.localities[0].total_requests_in_progress == 1
    stats.call_finished(True)
    (report,) = store.take_report(SERVER, True, ())
    assert report.localities[0].total_successful_requests == 1
    assert report.localities[0].total_requests_in_progress == 0
    assert not store.has_stats(SERVER)


def test_stats_taken_again_before_the_flush_are_the_same_object_and_lose_nothing():
    store = LoadStore(FakeClock())
    first = store.locality_stats(SERVER, "c", "", loc("a"))
    first.call_started()
    store.release(first)
    second = store.locality_stats(SERVER, "c", "", loc("a"))
    assert second is first
    second.call_started()
    (report,) = store.take_report(SERVER, True, ())
    assert report.localities[0].total_issued_requests == 2


def test_counting_while_reports_are_taken_loses_and_double_counts_nothing():
    store = LoadStore(FakeClock())
    stats = store.locality_stats(SERVER, "c", "", loc("a"))
    drops = store.drop_stats(SERVER, "c", "")
    per_thread = 20_000
    stop = threading.Event()
    totals = {"issued": 0, "ok": 0, "dropped": 0}

    def count() -> None:
        for i in range(per_thread):
            stats.call_started()
            stats.call_finished(True)
            if i % 4 == 0:
                drops.add("lb")

    def report() -> None:
        while not stop.is_set():
            for r in store.take_report(SERVER, True, ()):
                totals["issued"] += r.localities[0].total_issued_requests
                totals["ok"] += r.localities[0].total_successful_requests
                totals["dropped"] += r.total_dropped_requests

    workers = [threading.Thread(target=count) for _ in range(3)]
    reporter = threading.Thread(target=report)
    reporter.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    stop.set()
    reporter.join(30)
    for r in store.take_report(SERVER, True, ()):
        totals["issued"] += r.localities[0].total_issued_requests
        totals["ok"] += r.localities[0].total_successful_requests
        totals["dropped"] += r.total_dropped_requests
    assert totals == {"issued": 3 * per_thread, "ok": 3 * per_thread, "dropped": 3 * 5_000}


# --------------------------------------------------------------------------- protocol


def test_first_request_carries_the_node_with_the_send_all_clusters_feature():
    from envoy.config.core.v3 import base_pb2

    node = base_pb2.Node(id="n", client_features=["x", "xds.config.resource-in-sotw"])
    state = LrsStreamState(node)
    request = state.initial_request()
    assert request.node.id == "n"
    assert list(request.node.client_features) == ["x", LRS_CLIENT_FEATURE]
    assert not request.cluster_stats


def test_response_interval_is_raised_to_one_second_and_identical_response_keeps_the_timer():
    state = LrsStreamState(None)
    response = lrs_pb2.LoadStatsResponse(clusters=["a", "b"])
    response.load_reporting_interval.nanos = 100_000_000
    assert state.on_response(response) is True
    assert state.interval == 1.0
    assert state.clusters == {"a", "b"} and not state.send_all_clusters
    assert state.on_response(response) is False
    response.load_reporting_interval.seconds = 3
    assert state.on_response(response) is True
    assert state.interval == 3.1


def test_all_zero_report_is_sent_once_then_skipped_until_something_counts():
    from pyxds.xds.load_store import ClusterLoadReport, LocalityLoadReport

    state = LrsStreamState(None)
    zero = [ClusterLoadReport("c", "", 1.0, (LocalityLoadReport(loc("a")),))]
    busy = [ClusterLoadReport("c", "", 1.0, (LocalityLoadReport(loc("a"), 1, 0, 0, 1),))]
    assert state.report_request(zero) is not None
    assert state.report_request(zero) is None
    assert state.report_request(busy) is not None
    assert state.report_request(zero) is not None


# --------------------------------------------------------------------------- LRS channel


def make_channel(clock: FakeClock, store: LoadStore) -> tuple[LrsChannel, list]:
    transports: list[FakeLrsTransport] = []

    def factory(channel: LrsChannel) -> FakeLrsTransport:
        transports.append(FakeLrsTransport(channel))
        return transports[-1]

    import random

    backoff = StreamBackoff(ExponentialBackoff(random.Random(1)))
    channel = LrsChannel(SERVER, store, None, clock, backoff, factory)
    return channel, transports


def issued(request: lrs_pb2.LoadStatsRequest) -> int:
    return sum(
        loc.total_issued_requests
        for stats in request.cluster_stats
        for loc in stats.upstream_locality_stats
    )


def test_reports_follow_the_interval_only_after_the_first_response():
    clock = FakeClock()
    store = LoadStore(clock)
    channel, transports = make_channel(clock, store)
    stats = store.locality_stats(SERVER, "c", "svc", loc("a"))
    channel.ensure()
    (transport,) = transports
    assert len(transport.sent[1]) == 1  # the initial request only
    stats.call_started()
    clock.advance(10)
    assert transport.reports() == []  # no response yet: no report
    transport.respond(interval=2.0)
    clock.advance(1.999)
    assert transport.reports() == []
    clock.advance(0.001)
    (report,) = transport.reports()
    (cluster,) = report.cluster_stats
    assert cluster.cluster_name == "c" and cluster.cluster_service_name == "svc"
    # the first interval counts from when the stats were made (t=0), not the response
    assert cluster.load_report_interval.seconds == 12
    assert issued(report) == 1
    clock.advance(2.0)
    assert len(transport.reports()) == 2
    assert transport.reports()[1].cluster_stats[0].load_report_interval.seconds == 2


def test_new_interval_restarts_the_timer():
    clock = FakeClock()
    store = LoadStore(clock)
    channel, transports = make_channel(clock, store)
    store.locality_stats(SERVER, "c", "", loc("a")).call_started()
    channel.ensure()
    transports[0].respond(interval=10.0)
    clock.advance(5)
    transports[0].respond(interval=1.0)
    clock.advance(1.0)
    assert len(transports[0].reports()) == 1


def test_reconnect_with_backoff_loses_and_double_counts_nothing():
    clock = FakeClock()
    store = LoadStore(clock)
    channel, transports = make_channel(clock, store)
    stats = store.locality_stats(SERVER, "c", "", loc("a"))
    channel.ensure()
    (transport,) = transports
    transport.respond(interval=1.0)
    for _ in range(3):
        stats.call_started()
    clock.advance(1.0)
    assert sum(issued(r) for r in transport.reports()) == 3
    transport.end()
    # counted while the stream is down
    for _ in range(5):
        stats.call_started()
    clock.advance(0.7)  # within the first backoff (1 s +-20 %, but the stream
    # had a response, so the delay counts from its start at t=0: at once)
    assert transport.current == 2
    assert list(transport.sent[2][0].node.client_features) == [LRS_CLIENT_FEATURE]
    clock.advance(5)  # no response on the new stream yet: nothing reported
    assert sum(issued(r) for r in transport.reports()) == 3
    transport.respond(interval=1.0)
    clock.advance(1.0)
    assert sum(issued(r) for r in transport.reports()) == 8
    last = transport.sent[2][-1].cluster_stats[0]
    assert last.load_report_interval.seconds == 6  # measured across the outage
    assert last.upstream_locality_stats[0].total_requests_in_progress == 8


def test_stream_that_fails_without_a_response_backs_off_exponentially():
    clock = FakeClock()
    store = LoadStore(clock)
    channel, transports = make_channel(clock, store)
    store.drop_stats(SERVER, "c", "")
    channel.ensure()
    (transport,) = transports
    starts = []
    for _ in range(4):
        transport.end()
        before = clock.now()
        for _ in range(400):
            clock.advance(0.05)
            if transport.current:
                break
        starts.append(round(clock.now() - before, 2))
    assert starts[0] <= 1.25 and starts[1] >= 1.25 and starts[3] >= 3.2
    assert starts == sorted(starts)


def test_stream_stops_after_flushing_a_cluster_that_stopped_reporting():
    clock = FakeClock()
    store = LoadStore(clock)
    channel, transports = make_channel(clock, store)
    stats = store.locality_stats(SERVER, "c", "", loc("a"))
    channel.ensure()
    (transport,) = transports
    transport.respond(interval=1.0)
    stats.call_started()
    stats.call_finished(True)
    store.release(stats)
    clock.advance(1.0)
    (report,) = transport.reports()
    assert report.cluster_stats[0].upstream_locality_stats[0].total_successful_requests == 1
    assert transport.finished == [1] and not channel.active
    clock.advance(60)
    assert len(transport.sent) == 1  # no new stream while nothing reports
    store.locality_stats(SERVER, "c", "", loc("a"))
    channel.ensure()
    assert len(transport.sent) == 2


# --------------------------------------------------------------------------- XdsClient


def test_one_lrs_stream_per_server_shared_by_every_cluster_of_the_client():
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        server = client.lrs_server_for("c1")
        assert server == client.lrs_server_for("c2")
        a = client.load_store.locality_stats(server, "c1", "", loc("a"))
        b = client.load_store.locality_stats(server, "c2", "e2", loc("b"))
        (transport,) = transports
        assert len(transport.sent) == 1
        first = transport.sent[1][0]
        assert first.node.id == "lrs-node"
        assert LRS_CLIENT_FEATURE in first.node.client_features
        transport.respond(interval=1.0, clusters=["c2"])
        a.call_started()
        b.call_started()
        clock.advance(1.0)
        (report,) = transport.reports()
        assert [s.cluster_name for s in report.cluster_stats] == ["c2"]
        assert [(r.cluster, r.eds_service_name) for r in client.load_reports()] == [("c2", "e2")]
    finally:
        client.close()
    assert transports[0].closed


def _stores_asked_by_two_threads_at_once(client) -> list:
    barrier, stores = threading.Barrier(2), []

    def first_use() -> None:
        barrier.wait(10)
        stores.append(client.load_store)

    threads = [threading.Thread(target=first_use) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return stores


def test_the_load_store_is_made_once_by_its_first_user_even_two_threads_at_once():
    """The LRS manager and its store are made by the first cluster that
    reports (a config without LRS never loads them): two threads asking at
    once get the same store; before it nothing was reported."""
    for _ in range(20):
        client, transports = lrs_client(FakeClock())
        try:
            assert client.load_reports() == []
            stores = _stores_asked_by_two_threads_at_once(client)
            assert len(stores) == 2 and stores[0] is stores[1] is client.load_store
        finally:
            client.close()
        assert transports == []


def test_a_load_store_first_asked_for_after_close_never_opens_a_stream():
    client, transports = lrs_client(FakeClock())
    client.close()
    store = client.load_store
    stats = store.locality_stats(client.lrs_server_for("c1"), "c1", "", loc("a"))
    stats.call_started()
    assert transports == []
    assert client.load_reports() == []


# --------------------------------------------------------------------------- xds_cluster_impl


def impl_json(cluster: str) -> list:
    return [
        {
            "xds_cluster_impl_experimental": {
                "clusterName": cluster,
                "childPolicy": [{"round_robin": {}}],
            }
        }
    ]


def start_impl(client, name, *, lrs=True, drops=(), max_requests=1024, seed=7):
    helper = FakeHelper(seed=seed)
    cluster = eds_cluster(name, max_requests=max_requests, eds_service_name="svc", lrs_server=lrs)
    lo_a = locality(loc("a"), ["10.0.0.1:80"])
    lo_b = locality(loc("b"), ["10.0.0.2:80"])
    xds = xds_config({name: eds_entry(cluster, [lo_a, lo_b], drops=drops)})
    _, policy, config = build(impl_json(name), helper)
    endpoints = [
        Endpoint(a.addresses, {"locality": lo.name, "locality_weight": lo.weight})
        for lo in (lo_a, lo_b)
        for a in lo.endpoints
    ]
    attrs = {**attributes(xds), XDS_CLIENT_ATTRIBUTE: client}
    assert policy.update(ResolverUpdate(endpoints, config, attrs)) is None
    connect_all(helper)
    return helper, policy


def test_cluster_impl_counts_per_locality_and_drop_category_over_seeded_picks():
    clock = FakeClock()
    client, transports = lrs_client(clock)
    name = unique("lrs")
    try:
        helper, _ = start_impl(client, name, drops=[("lb", 100_000), ("throttle", 200_000)])
        expected_issued: dict[str, int] = {}
        expected_ok: dict[str, int] = {}
        expected_err: dict[str, int] = {}
        drops: dict[str, int] = {}
        region = {"10.0.0.1:80": "a", "10.0.0.2:80": "b"}
        in_flight = []
        for i in range(3000):
            result = helper.pick()
            if isinstance(result, PickDrop):
                category = result.status.details.rsplit(": ", 1)[1]
                drops[category] = drops.get(category, 0) + 1
                continue
            assert isinstance(result, PickComplete)
            r = region[result.subchannel.address]
            expected_issued[r] = expected_issued.get(r, 0) + 1
            if i % 10 == 0:
                in_flight.append((r, result))
                continue
            ok = i % 3 != 0
            result.on_call_done(OK if ok else FAILED)
            target = expected_ok if ok else expected_err
            target[r] = target.get(r, 0) + 1
        (transport,) = transports
        transport.respond(interval=1.0)
        clock.advance(1.0)
        (report,) = transport.reports()
        (stats,) = report.cluster_stats
        assert (stats.cluster_name, stats.cluster_service_name) == (name, "svc")
        by_region = {s.locality.region: s for s in stats.upstream_locality_stats}
        for r in ("a", "b"):
            s = by_region[r]
            assert s.total_issued_requests == expected_issued[r]
            assert s.total_successful_requests == expected_ok[r]
            assert s.total_error_requests == expected_err[r]
            assert s.total_requests_in_progress == sum(1 for x, _ in in_flight if x == r)
        assert {d.category: d.dropped_count for d in stats.dropped_requests} == drops
        assert stats.total_dropped_requests == sum(drops.values())
        assert 250 < drops["lb"] < 350  # 10 %
    finally:
        client.close()


def test_circuit_breaker_drops_are_reported_as_uncategorized_in_the_total():
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        helper, _ = start_impl(client, unique("cb"), max_requests=1)
        first = helper.pick()
        assert isinstance(first, PickComplete)
        assert isinstance(helper.pick(), PickDrop)
        assert isinstance(helper.pick(), PickDrop)
        transports[0].respond()
        clock.advance(1.0)
        (stats,) = transports[0].reports()[0].cluster_stats
        assert list(stats.dropped_requests) == []
        assert stats.total_dropped_requests == 2
    finally:
        client.close()


def test_cluster_without_lrs_server_reports_nothing():
    client, transports = lrs_client()
    try:
        helper, _ = start_impl(client, unique("nolrs"), lrs=False, drops=[("lb", 500_000)])
        for _ in range(20):
            result = helper.pick()
            if isinstance(result, PickComplete):
                result.on_call_done(OK)
        assert transports == []
        assert client.load_store.servers() == []
    finally:
        client.close()


def test_policy_shutdown_flushes_its_counts_once_more_then_the_stream_ends():
    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        helper, policy = start_impl(client, unique("flush"))
        transports[0].respond()
        result = helper.pick()
        result.on_call_done(OK)
        policy.shutdown()
        clock.advance(1.0)
        (report,) = transports[0].reports()
        total_ok = sum(
            s.total_successful_requests for s in report.cluster_stats[0].upstream_locality_stats
        )
        assert total_ok == 1
        assert transports[0].finished == [1]
        assert client.load_store.servers() == []
    finally:
        client.close()


def test_two_channels_share_the_store_and_the_stream():
    clock = FakeClock()
    client, transports = lrs_client(clock)
    name = unique("shared")
    try:
        helper1, _ = start_impl(client, name)
        helper2, _ = start_impl(client, name)
        for helper in (helper1, helper2):
            helper.pick().on_call_done(OK)
        (transport,) = transports
        transport.respond()
        clock.advance(1.0)
        (report,) = transport.reports()
        (stats,) = report.cluster_stats
        assert sum(s.total_successful_requests for s in stats.upstream_locality_stats) == 2
    finally:
        client.close()


def test_attempt_the_channel_could_not_start_is_not_counted():
    from pyxds.lb.api import ATTEMPT_NOT_STARTED

    clock = FakeClock()
    client, transports = lrs_client(clock)
    try:
        helper, _ = start_impl(client, unique("notstarted"))
        helper.pick().on_call_done(ATTEMPT_NOT_STARTED)
        helper.pick().on_call_done(OK)
        transports[0].respond()
        clock.advance(1.0)
        (stats,) = transports[0].reports()[0].cluster_stats
        locs = stats.upstream_locality_stats
        assert sum(s.total_issued_requests for s in locs) == 1
        assert sum(s.total_successful_requests for s in locs) == 1
        assert sum(s.total_error_requests for s in locs) == 0
        assert sum(s.total_requests_in_progress for s in locs) == 0
    finally:
        client.close()


def test_report_refused_by_a_stream_that_just_ended_goes_into_the_next_one():
    clock = FakeClock()
    store = LoadStore(clock)
    channel, transports = make_channel(clock, store)
    stats = store.locality_stats(SERVER, "c", "", loc("a"))
    drops = store.drop_stats(SERVER, "c", "")
    channel.ensure()
    (transport,) = transports
    transport.respond(interval=1.0)
    stats.call_started()
    stats.call_finished(False)
    drops.add("lb")
    store.release(stats)
    store.release(drops)  # the last stats: this report is the final flush
    transport.current = 0  # the stream ended; its close event is still on its way
    clock.advance(1.0)
    assert transport.reports() == []
    transport.channel.stream_closed(1, FAILED)
    clock.advance(1.5)  # backoff
    assert transport.current == 2
    transport.respond(interval=1.0)
    clock.advance(1.0)
    (report,) = transport.reports()
    (cluster,) = report.cluster_stats
    assert cluster.upstream_locality_stats[0].total_error_requests == 1
    assert cluster.upstream_locality_stats[0].total_issued_requests == 1
    assert [(d.category, d.dropped_count) for d in cluster.dropped_requests] == [("lb", 1)]
    assert cluster.load_report_interval.seconds == 1  # the refused one's second
    assert not channel.active


def test_negative_or_zero_interval_from_the_server_becomes_the_minimum():
    state = LrsStreamState(None)
    response = lrs_pb2.LoadStatsResponse(send_all_clusters=True)
    response.load_reporting_interval.seconds = -5
    assert state.on_response(response) is True
    assert state.interval == 1.0 and state.send_all_clusters


def test_cluster_whose_lrs_server_cannot_be_found_is_served_without_reporting(caplog):
    class NoServer:
        load_store = LoadStore(FakeClock())

        def lrs_server_for(self, cluster_name: str) -> str:
            raise LookupError('authority "nowhere" not present in bootstrap config')

    helper, _ = start_impl(NoServer(), unique("noserver"))
    result = helper.pick()
    assert isinstance(result, PickComplete)
    result.on_call_done(OK)
    assert NoServer.load_store.servers() == []
    assert "no LRS server" in caplog.text and "nowhere" in caplog.text
