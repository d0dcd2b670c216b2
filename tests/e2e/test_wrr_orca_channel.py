"""weighted_round_robin from a service config, on real channels and real
pyxds.orca backends: the per-call ORCA hook (``PickComplete.on_call_trailers``)
on the sync unary, sync streaming and asyncio paths; a malformed ORCA trailer
never fails an RPC; the out-of-band stream (A51) is one per subchannel,
shared, at the smallest period, and never retried after UNIMPLEMENTED.
Differential: grpcio's C-core channel with the same service config splits
the same way."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import threading
import time
from concurrent import futures

import grpc
import pytest
from channel_fixtures import wait_until
from orca_backends import HEAVY, LIGHT, SERVICE, OrcaBackend
from ports import EXCLUSIVE

import pyxds._api as pyxds
import pyxds.aio
from pyxds.orca import OrcaService, ServerMetricRecorder

N = 2000
TOLERANCE = 0.04
WRR = {"blackoutPeriod": "0s", "weightUpdatePeriod": "0.1s"}


def options(config: dict) -> list[tuple[str, str]]:
    return [
        (
            "grpc.service_config",
            json.dumps({"loadBalancingConfig": [{"weighted_round_robin": config}]}),
        )
    ]


def target(backends: list[OrcaBackend]) -> str:
    return "ipv4:" + ",".join(b.address for b in backends)


@pytest.fixture(scope="module")
def backends():
    started = [OrcaBackend("heavy", HEAVY), OrcaBackend("light", LIGHT)]
    yield started
    for backend in started:
        backend.stop()


def who_shares(channel, n: int) -> collections.Counter:
    mc = channel.unary_unary(f"/{SERVICE}/Who")
    return collections.Counter(mc(b"", timeout=5, wait_for_ready=True).decode() for _ in range(n))


def heavy_share(counts: collections.Counter) -> float:
    return counts["heavy"] / sum(counts.values())


#: warm until the weights show (the share of 100 calls, bounded): a fixed
#: warm-up (300 calls, 0.3 s) under load sometimes counted before the first
#: weights were in use, picks at the mean weight meanwhile (0.831 seen)
WEIGHTED, WARM_LIMIT = 0.8, 15.0


async def until_weighted(mc) -> bool:
    """``mc`` (a pyxds.aio unary multicallable of ``Who``) splits by weight."""
    deadline = time.monotonic() + WARM_LIMIT
    while time.monotonic() < deadline:
        counts = collections.Counter()
        for _ in range(100):
            counts[(await mc(b"", timeout=5, wait_for_ready=True)).decode()] += 1
        if heavy_share(counts) >= WEIGHTED:
            return True
    return False


def test_service_config_wrr_splits_by_per_call_load_like_c_core(backends):
    ours_channel = pyxds.insecure_channel(target(backends), options=options(WRR))
    theirs_channel = grpc.insecure_channel(target(backends), options=options(WRR))
    try:
        for channel in (ours_channel, theirs_channel):
            assert wait_until(lambda ch=channel: heavy_share(who_shares(ch, 100)) >= WEIGHTED, 15)
        ours = heavy_share(who_shares(ours_channel, N))
        theirs = heavy_share(who_shares(theirs_channel, N))
    finally:
        ours_channel.close()
        theirs_channel.close()
    assert theirs == pytest.approx(0.9, abs=TOLERANCE)
    assert ours == pytest.approx(0.9, abs=TOLERANCE)


def read_stream(stream, request: bytes, i: int) -> list[bytes]:
    """The responses of one stream; a failed one says where its time went
    (a stream of stop 38's loaded run hit its 5 s deadline, cause unknown):
    whether it ever reached a subchannel, how long it took, the channel's
    state and the machine's load."""
    start = time.monotonic()
    call = stream(request, timeout=5, wait_for_ready=True)
    try:
        return list(call)
    except grpc.RpcError as err:
        inner = getattr(call, "_inner", None)
        pytest.fail(
            f"stream {i}: {err.code()} {err.details()!r} after {time.monotonic() - start:.2f} s; "
            f"reached a subchannel: {inner is not None} ({inner!s}); "
            f"load {os.getloadavg()}"
        )


def test_streaming_calls_report_their_trailers(backends):
    channel = pyxds.insecure_channel(target(backends), options=options(WRR))
    try:
        stream = channel.unary_stream(f"/{SERVICE}/Stream")
        counts: collections.Counter = collections.Counter()
        for i in range(300):  # only streams: the weights come from their trailers
            read_stream(stream, b"2", i)
        for i in range(N // 2):
            names = read_stream(stream, b"1", 300 + i)
            counts[names[0].decode()] += 1
    finally:
        channel.close()
    assert heavy_share(counts) == pytest.approx(0.9, abs=TOLERANCE)


def test_aio_channel_reads_per_call_reports(backends):
    async def run() -> float:
        channel = pyxds.aio.insecure_channel(target(backends), options=options(WRR))
        try:
            mc = channel.unary_unary(f"/{SERVICE}/Who")
            assert await until_weighted(mc)
            counts = collections.Counter()
            for _ in range(N):
                counts[(await mc(b"", timeout=5, wait_for_ready=True)).decode()] += 1
            return heavy_share(counts)
        finally:
            await channel.close()

    assert asyncio.run(run()) == pytest.approx(0.9, abs=TOLERANCE)


def test_aio_channel_with_oob_reports_splits_by_load(backends):
    config = dict(WRR, enableOobLoadReport=True, oobReportingPeriod="0.1s")

    async def run() -> float:
        channel = pyxds.aio.insecure_channel(target(backends), options=options(config))
        try:
            mc = channel.unary_unary(f"/{SERVICE}/Who")
            assert await until_weighted(mc)  # OOB reports every 0.1 s
            counts = collections.Counter()
            for _ in range(N):
                counts[(await mc(b"", timeout=5, wait_for_ready=True)).decode()] += 1
            return heavy_share(counts)
        finally:
            await channel.close()

    assert asyncio.run(run()) == pytest.approx(0.9, abs=TOLERANCE)


def test_malformed_orca_trailer_never_fails_an_rpc_and_is_ignored():
    started = [OrcaBackend("heavy", HEAVY, garbage=True), OrcaBackend("light", LIGHT)]
    channel = pyxds.insecure_channel(target(started), options=options(WRR))
    try:
        who_shares(channel, 300)
        counts = who_shares(channel, 1000)  # raises on any failed RPC
    finally:
        channel.close()
        for backend in started:
            backend.stop()
    # one endpoint has a weight, the other none: both get the mean (round robin)
    assert heavy_share(counts) == pytest.approx(0.5, abs=0.02)


# -- out-of-band stream (channel/orca_oob.py) -----------------------------------------


class CountingOrca(OrcaService):
    """OpenRcaService that records each stream's requested interval and
    how many streams are open."""

    def __init__(self) -> None:
        recorder = ServerMetricRecorder()
        recorder.set_cpu_utilization(0.5)
        recorder.set_qps(10.0)
        super().__init__(recorder, min_report_interval=0.05)
        self.intervals: list[float] = []
        self.open = 0
        self._lock = threading.Lock()

    def stream_core_metrics(self, request, context):
        asked = request.report_interval.seconds + request.report_interval.nanos / 1e9
        with self._lock:
            self.intervals.append(round(asked, 3))
            self.open += 1
        try:
            yield from super().stream_core_metrics(request, context)
        finally:
            with self._lock:
                self.open -= 1


def serve(service: OrcaService | None) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[EXCLUSIVE])
    if service is not None:
        server.add_generic_rpc_handlers((service.generic_handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def on_serializer(channel, fn):
    """Run ``fn`` on the channel's work serializer; its result."""
    box: list = []
    done = threading.Event()

    def go() -> None:
        try:
            box.append(fn())
        finally:
            done.set()

    channel._core.serializer.run(go)
    assert done.wait(5)
    return box[0]


def subchannel_of(channel, address: str):
    handle = on_serializer(channel, lambda: channel._core.pool.create(address, {}))
    on_serializer(channel, handle.connect)
    assert wait_until(lambda: handle.state.name == "READY", 10)
    return handle


def test_oob_stream_is_shared_at_the_smallest_period_and_stops_with_its_last_watcher():
    service = CountingOrca()
    server, address = serve(service)
    channel = pyxds.insecure_channel(address)
    reports: collections.Counter = collections.Counter()
    try:
        first = subchannel_of(channel, address)
        second = subchannel_of(channel, address)  # same connection, another handle
        cancel_slow = on_serializer(
            channel, lambda: first.watch_orca_oob(0.5, lambda r: reports.update(["slow"]))
        )
        cancel_fast = on_serializer(
            channel, lambda: second.watch_orca_oob(0.2, lambda r: reports.update(["fast"]))
        )
        assert wait_until(lambda: reports["slow"] >= 2 and reports["fast"] >= 2, 10)
        assert service.open == 1
        assert service.intervals[-1] == 0.2  # restarted at the smaller period
        cancel_fast()
        assert wait_until(lambda: service.intervals[-1] == 0.5 and service.open == 1, 10)
        cancel_slow()
        assert wait_until(lambda: service.open == 0, 10)
        opened = len(service.intervals)
        before = sum(reports.values())
        time.sleep(0.3)  # bounded: no stream, no report, nothing reopened
        assert len(service.intervals) == opened and sum(reports.values()) == before
    finally:
        channel.close()
        server.stop(None)


def test_c_core_keeps_the_smaller_period_after_its_subscriber_left():
    """A51: "If multiple policies subscribe with different intervals, we will
    use the minimum of those intervals."  C-core's OrcaProducer restarts the
    stream only when a subscriber asks for a smaller interval, so once the
    fastest one leaves its stream keeps the old, smaller period; pyxds
    restarts it at the new minimum (the test above; a line in
    docs/differences-from-c-core.md).  Two C-core channels with the same
    arguments share one subchannel (C-core's global pool), so one stream."""
    service = CountingOrca()
    server, address = serve(service)
    oob = dict(WRR, enableOobLoadReport=True)
    slow = grpc.insecure_channel(address, options=options(dict(oob, oobReportingPeriod="0.5s")))
    fast = None
    try:
        grpc.channel_ready_future(slow).result(timeout=10)
        assert wait_until(lambda: service.intervals == [0.5] and service.open == 1, 10)
        fast = grpc.insecure_channel(address, options=options(dict(oob, oobReportingPeriod="0.1s")))
        grpc.channel_ready_future(fast).result(timeout=10)
        assert wait_until(lambda: service.intervals == [0.5, 0.1] and service.open == 1, 10)
        fast.close()
        time.sleep(0.5)  # bounded: C-core starts no stream at 0.5 s again
        assert service.intervals == [0.5, 0.1] and service.open == 1
    finally:
        if fast is not None:
            fast.close()
        slow.close()
        server.stop(None)


def test_oob_stream_is_not_retried_after_unimplemented():
    server, address = serve(None)  # no OpenRcaService
    channel = pyxds.insecure_channel(address)
    try:
        handle = subchannel_of(channel, address)
        on_serializer(channel, lambda: handle.watch_orca_oob(0.1, lambda r: None))
        stream = handle.core.orca_oob
        assert wait_until(lambda: stream._unimplemented, 10)
        assert stream.calls_started == 1 and stream._retry_timer is None
    finally:
        channel.close()
        server.stop(None)


class UnimplementedOrca(grpc.GenericRpcHandler):
    """A backend without OpenRcaService (every method UNIMPLEMENTED) that
    counts the StreamCoreMetrics calls it refused."""

    def __init__(self) -> None:
        self.calls = 0

    def service(self, handler_call_details):
        if handler_call_details.method == "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics":
            self.calls += 1
        return None


def test_c_core_asks_an_unimplemented_connection_again_for_a_smaller_period():
    """A51: after UNIMPLEMENTED "the client must not retry the call on the
    same connection".  C-core's OrcaProducer makes a new stream for a
    smaller interval and asks that connection again; pyxds does not
    (tests/unit/test_orca_oob_stream.py::test_unimplemented_is_not_retried_on_that_connection;
    docs/differences-from-c-core.md)."""
    backend = UnimplementedOrca()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[EXCLUSIVE])
    server.add_generic_rpc_handlers((backend,))
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    oob = dict(WRR, enableOobLoadReport=True)
    slow = grpc.insecure_channel(address, options=options(dict(oob, oobReportingPeriod="0.5s")))
    fast = grpc.insecure_channel(address, options=options(dict(oob, oobReportingPeriod="0.1s")))
    try:
        grpc.channel_ready_future(slow).result(timeout=10)
        assert wait_until(lambda: backend.calls == 1, 10)
        grpc.channel_ready_future(fast).result(timeout=10)  # the same subchannel
        assert wait_until(lambda: backend.calls == 2, 10)
    finally:
        fast.close()
        slow.close()
        server.stop(None)


class PeerOrca(CountingOrca):
    """CountingOrca that also records each stream's peer (the client's
    socket address: one per connection) and answers ``Peer.Who`` with the
    caller's."""

    def __init__(self) -> None:
        super().__init__()
        self.stream_peers: list[str] = []
        #: how long each ended stream lived (seconds), in the order they ended
        self.lifetimes: list[float] = []

    def stream_core_metrics(self, request, context):
        self.stream_peers.append(context.peer())
        started = time.monotonic()
        context.add_callback(lambda: self.lifetimes.append(time.monotonic() - started))
        yield from super().stream_core_metrics(request, context)

    def handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        who = grpc.method_handlers_generic_handler(
            "Peer",
            {"Who": grpc.unary_unary_rpc_method_handler(lambda req, ctx: ctx.peer().encode())},
        )
        return (self.generic_handler(), who)


def serve_peer_orca(
    *server_options: tuple[str, int], tls: grpc.ServerCredentials | None = None
) -> tuple[PeerOrca, grpc.Server, str]:
    """A started PeerOrca backend (with ``server_options``; TLS with
    ``tls``), and its address."""
    service = PeerOrca()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8), options=[EXCLUSIVE, *server_options]
    )
    server.add_generic_rpc_handlers(service.handlers())
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", tls)
    server.start()
    return service, server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("shared", [True, False], ids=["twin", "fallback"])
def test_sync_oob_stream_runs_on_the_connection_rpcs_use_like_c_core(shared, monkeypatch):
    """A51: the out-of-band stream is a call on the subchannel's connection.
    The sync subchannel's stream runs on a grpc.aio twin that shares the
    sync grpcio channel's C-core subchannel: the backend sees the stream and
    the RPCs come from one client socket, and no second connection.  The
    fallback (a grpcio the twin was not checked against) streams on a
    second connection of its own, and its reports still arrive."""
    from pyxds.channel import grpc_aio_twin

    if shared:
        assert grpc_aio_twin.available()  # the grpcio this project pins
    else:
        monkeypatch.setattr(grpc_aio_twin, "ENABLED", False)
    service, server, address = serve_peer_orca()
    channel = pyxds.insecure_channel(address)
    reports: list[object] = []
    try:
        handle = subchannel_of(channel, address)
        on_serializer(channel, lambda: handle.watch_orca_oob(0.1, reports.append))
        assert wait_until(lambda: len(reports) >= 2, 10)
        rpc_peers = {channel.unary_unary("/Peer/Who")(b"", timeout=5).decode() for _ in range(5)}
        assert len(rpc_peers) == 1 and len(service.stream_peers) == 1 and service.open == 1
        assert (service.stream_peers == list(rpc_peers)) is shared
    finally:
        channel.close()
        server.stop(None)


@pytest.mark.parametrize("client", ["c-core", "pyxds"])
def test_the_oob_stream_ends_with_its_connections_goaway_and_follows_the_next(client):
    """A51: "when the backend sends a GOAWAY, the client will cancel the
    StreamCoreMetrics call".  The backend ends each connection after
    ~0.4 s (+-10 %: grpcio's jitter) with a GOAWAY but would let its streams
    run on for a minute (the grace).  Sequential RPCs reconnect at once, so
    the sync subchannel's polled state may never show the IDLE between:
    each stream must still end within a bound after its connection's
    GOAWAY (it lives no longer than its connection: ~0.4 s, plus how long
    the client takes to notice) and start again on the next connection:
    streams come from the sockets the RPCs come from, at most one open at
    a time.  grpcio's C-core channel with the same service config does the
    same.  (Before, pyxds's stream stayed on the old connection until the
    server's grace ended it.)"""
    service, server, address = serve_peer_orca(
        ("grpc.max_connection_age_ms", 400), ("grpc.max_connection_age_grace_ms", 60_000)
    )
    config = dict(WRR, enableOobLoadReport=True, oobReportingPeriod="0.1s")
    make = grpc.insecure_channel if client == "c-core" else pyxds.insecure_channel
    channel = make(f"ipv4:{address}", options=options(config))
    who = channel.unary_unary("/Peer/Who")
    rpc_peers: set[str] = set()
    most_open = 0
    try:
        deadline = time.monotonic() + 15
        while len(service.lifetimes) < 3 and time.monotonic() < deadline:
            rpc_peers.add(who(b"", timeout=5, wait_for_ready=True).decode())
            most_open = max(most_open, service.open)
            time.sleep(0.02)
        assert len(service.lifetimes) >= 3, service.lifetimes  # each ended, well within the grace
        assert max(service.lifetimes) < 2.5, service.lifetimes
        assert sum(p in rpc_peers for p in service.stream_peers) >= 3
        assert len(set(service.stream_peers) - rpc_peers) <= 1  # the newest, maybe
        assert most_open <= 1
    finally:
        channel.close()
        server.stop(None)


def test_sync_oob_stream_with_the_applications_tls_credentials_reports_on_its_own_connection():
    """Channel credentials the application passed in (not xDS ones): cygrpc
    makes a new C-core credentials object per grpcio channel and C-core
    tells them apart, so the twin cannot share the subchannel's connection.
    It opens its own, with the same credentials (the TLS handshake with the
    backend succeeds), and the reports arrive (docs/differences-from-c-core.md)."""
    from pyxds.testing.certs import CertAuthority

    ca = CertAuthority()
    leaf = ca.issue("backend", ips=("127.0.0.1",))
    service, server, address = serve_peer_orca(
        tls=grpc.ssl_server_credentials([(leaf.key, leaf.cert)])
    )
    channel = pyxds.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca.pem))
    reports: list[object] = []
    try:
        handle = subchannel_of(channel, address)
        on_serializer(channel, lambda: handle.watch_orca_oob(0.1, reports.append))
        assert wait_until(lambda: len(reports) >= 2, 10)
        rpc_peer = channel.unary_unary("/Peer/Who")(b"", timeout=5).decode()
        assert len(service.stream_peers) == 1 and service.open == 1
        assert service.stream_peers[0] != rpc_peer
    finally:
        channel.close()
        server.stop(None)
