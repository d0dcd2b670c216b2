"""pyxds at mesh scale (issue 18): a cluster of 1000 real loopback endpoints
is served in full, by sync and asyncio channels, with a bounded number of
threads (a count: the threads a channel adds do not grow with endpoints),
and a channel among endpoints that never answer, refuse, or flap keeps
serving from the good ones; after close() the process has the threads and
sockets it had before.

The 1000 backends run in one subprocess (one grpc.aio server per port on
one event loop); the control plane is the real pyxds.server."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest
from backends import Blackhole, EchoBackend
from channel_fixtures import Backend, snapshot, wait_until
from many_backends import WHO, ManyBackends

import pyxds._api as pyxds
import pyxds.aio
from pyxds import connectivity

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")

#: The threads a pyxds channel may add, whatever its number of endpoints
#: (issue 18: at most C-core's count + 8; C-core's own are there already in
#: this process): its share of the process's timer thread, the channel
#: reaper, the xDS client's stream reader, watcher notifier and grpcio's two
#: threads of the ADS stream, and some slack for grpcio's own.
MAX_ADDED_THREADS = 8
#: Native threads besides the Python ones (grpcio's timer, pollers).
MAX_ADDED_OS_THREADS = MAX_ADDED_THREADS + 8
#: C-core's elastic thread pool (its workers and the "lifeguard" that grows
#: it): it serves the test's servers in this process too, and grows with the
#: machine's load (17 more threads in a loaded run), so it is not counted.
CORE_POOL = ("event_engine", "lifeguard")


def os_threads() -> int:
    """OS threads of the process but C-core's elastic pool's and those of
    the servers' Python threads (:data:`SERVER_THREADS`): a backend's pool
    grows with how soon each handler's worker is idle again, up to 16
    workers under Python 3.12 where 3.11 kept 2-4 for the same RPCs."""
    servers = {str(t.native_id) for t in threading.enumerate() if _server_thread(t)}
    count = 0
    for task in os.listdir("/proc/self/task"):
        if task in servers:
            continue
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().strip() in CORE_POOL:
                    continue
        except OSError:
            continue  # ended meanwhile
        count += 1
    return count


def sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


#: Threads of the servers this process runs for the test (the control
#: plane's pool and its ADS stream readers, grpcio servers' loops, backends'
#: pools, the blackholes, the test's flapper): not the client's.
SERVER_THREADS = (
    "pyxds-xds-server",
    "pyxds-ads-reader",
    "backend-",
    "good-",
    "flap-",
    "blackhole",
    "flapper",
)


def _server_thread(thread: threading.Thread) -> bool:
    return thread.name.startswith(SERVER_THREADS) or "(_serve)" in thread.name


def client_threads() -> int:
    """Python threads of the client side of this process."""
    return sum(1 for t in threading.enumerate() if not _server_thread(t))


class Counts:
    """Python threads, OS threads and sockets of the process, now."""

    def __init__(self) -> None:
        self.threads = client_threads()
        self.os_threads = os_threads()
        self.sockets = sockets()

    def assert_bounded_above(self, before: Counts) -> None:
        assert self.threads - before.threads <= MAX_ADDED_THREADS, threading.enumerate()
        assert self.os_threads - before.os_threads <= MAX_ADDED_OS_THREADS

    @staticmethod
    def back_to(before: Counts, timeout: float = 15.0) -> Counts:
        """Wait (bounded) until threads and sockets are back to ``before``."""
        wait_until(
            lambda: client_threads() <= before.threads and sockets() <= before.sockets,
            timeout=timeout,
        )
        return Counts()


def scale_snapshot(addresses: list[str]):
    from channel_fixtures import route

    return snapshot([route(prefix="", cluster="scale")], {"scale": [addresses]}, listener="scale")


@pytest.fixture(scope="module")
def thousand():
    with ManyBackends(1000) as backends:
        yield backends


def test_rpcs_reach_every_one_of_1000_endpoints_with_bounded_threads(xds_server, thousand):
    xds_server.set_snapshot(scale_snapshot(thousand.addresses))
    before = Counts()
    channel = pyxds.insecure_channel("xds:///scale", bootstrap=xds_server.bootstrap())
    who = channel.unary_unary(WHO)
    served: set[bytes] = set()
    deadline = time.monotonic() + 120
    while len(served) < 1000 and time.monotonic() < deadline:
        served.add(who(b"", wait_for_ready=True, timeout=60))
    assert served == {str(p).encode() for p in thousand.ports}
    Counts().assert_bounded_above(before)
    assert connectivity.monitor().watched >= 1000  # polled, not a thread each
    channel.close()
    after = Counts.back_to(before)
    assert after.threads <= before.threads, threading.enumerate()
    assert after.sockets <= before.sockets


def test_an_asyncio_channel_reaches_every_one_of_1000_endpoints_with_bounded_threads(
    xds_server, thousand
):
    xds_server.set_snapshot(scale_snapshot(thousand.addresses))
    bootstrap = xds_server.bootstrap()

    async def run() -> tuple[set[bytes], Counts]:
        channel = pyxds.aio.insecure_channel("xds:///scale", bootstrap=bootstrap)
        who = channel.unary_unary(WHO)
        served: set[bytes] = set()
        deadline = time.monotonic() + 120
        while len(served) < 1000 and time.monotonic() < deadline:
            served.add(await who(b"", wait_for_ready=True, timeout=60))
        during = Counts()
        await channel.close()
        return served, during

    async def plain_channel() -> grpc.aio.Channel:
        return grpc.aio.insecure_channel("127.0.0.1:1")

    loop = asyncio.new_event_loop()
    try:
        # grpc.aio's poller thread lives while any grpc.aio channel object
        # does (C-core's asyncio channels have it too): started before counting
        plain = loop.run_until_complete(plain_channel())
        before = Counts()
        served, during = loop.run_until_complete(run())
        assert served == {str(p).encode() for p in thousand.ports}
        during.assert_bounded_above(before)
        after = Counts.back_to(before)
        assert after.threads <= before.threads, threading.enumerate()
        assert after.sockets <= before.sockets
        loop.run_until_complete(plain.close())
    finally:
        loop.close()


#: endpoints of the WRR + out-of-band ORCA test below
OOB_ENDPOINTS = 200


def test_sync_wrr_with_oob_reports_over_200_endpoints_adds_no_thread_each_and_follows_them(
    xds_server,
):
    """weighted_round_robin with ``enable_oob_load_report`` (A58, A51) on a
    sync channel: one OpenRcaService stream per endpoint, and still the
    threads of any channel (a count, not one or two per stream as grpcio's
    sync streaming calls would take); the split follows the utilization the
    backends report out of band (90/10, then 10/90 once they change it);
    after close() the streams end and threads and sockets are back."""
    from channel_fixtures import TARGET
    from orca_backends import wrr_snapshot

    with ManyBackends(OOB_ENDPOINTS, oob=True) as fleet:
        fleet.set_loads(even=0.1, odd=0.9)  # qps 100: weights 1000 : 111
        xds_server.set_snapshot(wrr_snapshot("wrr-oob", fleet.addresses, True, "oob-200", 0.5))
        even = {str(p).encode() for p in fleet.ports[0::2]}
        before = Counts()
        channel = pyxds.insecure_channel(TARGET, bootstrap=xds_server.bootstrap())
        who = channel.unary_unary(WHO)

        def even_share(n: int) -> float:
            return sum(who(b"", wait_for_ready=True, timeout=30) in even for _ in range(n)) / n

        try:
            served: set[bytes] = set()
            deadline = time.monotonic() + 60
            while len(served) < OOB_ENDPOINTS and time.monotonic() < deadline:
                served.add(who(b"", wait_for_ready=True, timeout=30))
            assert len(served) == OOB_ENDPOINTS
            assert wait_until(lambda: fleet.oob_streams() == OOB_ENDPOINTS, 30)
            Counts().assert_bounded_above(before)
            assert wait_until(lambda: even_share(200) > 0.8, 20)  # reports arrived
            assert even_share(2000) == pytest.approx(0.9, abs=0.04)
            fleet.set_loads(even=0.9, odd=0.1)
            assert wait_until(lambda: even_share(200) < 0.2, 20)
            assert even_share(2000) == pytest.approx(0.1, abs=0.04)
            Counts().assert_bounded_above(before)
            assert fleet.oob_streams() == OOB_ENDPOINTS  # one each, none restarted twice
        finally:
            channel.close()
        after = Counts.back_to(before)
        assert after.threads <= before.threads, threading.enumerate()
        assert after.sockets <= before.sockets
        assert wait_until(lambda: fleet.oob_streams() == 0, 10)


def test_a_channel_among_dead_silent_and_flapping_endpoints_serves_from_the_good_ones(
    xds_server, ports
):
    """Bad input: endpoints that never answer (accept TCP, never speak
    HTTP/2), refuse connections, or go down and up (GOAWAY) all the time,
    beside good ones: every RPC is served, by good or momentarily up
    endpoints; threads stay bounded; after close nothing is left."""
    good = [EchoBackend(f"good-{i}").start() for i in range(5)]
    flapping = [EchoBackend(f"flap-{i}").start() for i in range(5)]
    silent = [Blackhole() for _ in range(5)]
    refused = [ports.dead_address() for _ in range(5)]
    addresses = (
        [b.address for b in good]
        + [b.address for b in flapping]
        + [h.address for h in silent]
        + refused
    )
    xds_server.set_snapshot(scale_snapshot(addresses))
    stop = threading.Event()

    def flap() -> None:
        while not stop.is_set():
            for backend in flapping:
                backend.stop(grace=2.0)  # GOAWAY; RPCs in flight finish (not cancelled)
                if stop.wait(0.05):
                    return
                backend.start()

    before = Counts()
    flapper = threading.Thread(target=flap, name="flapper", daemon=True)
    channel = pyxds.insecure_channel("xds:///scale", bootstrap=xds_server.bootstrap())
    try:
        flapper.start()
        who = channel.unary_unary("/pyxds.test.Echo/Echo")
        from protos import echo_pb2

        request = echo_pb2.EchoRequest(message="hi").SerializeToString()
        served: dict[str, int] = {}
        cancelled_by_a_stopping_backend = 0
        for _ in range(300):
            try:
                reply = who(request, wait_for_ready=True, timeout=30)
            except grpc.RpcError as err:
                # grpcio's server, stopping, cancels the calls it had accepted
                # but not yet handed to a handler thread (the client sees
                # CANCELLED "CANCELLED"; C-core's client sees the same from
                # it). That is the flapping backend's doing, not the
                # channel's: a channel closing a transport under an RPC says
                # "Channel closed!", and any other failure fails the test.
                if (err.code(), err.details()) != (grpc.StatusCode.CANCELLED, "CANCELLED"):
                    raise
                cancelled_by_a_stopping_backend += 1
                continue
            backend = echo_pb2.EchoReply.FromString(reply).backend
            served[backend] = served.get(backend, 0) + 1
        assert {f"good-{i}" for i in range(5)} <= set(served)
        assert cancelled_by_a_stopping_backend <= 3, served
        Counts().assert_bounded_above(before)
    finally:
        stop.set()
        flapper.join(10)
        channel.close()
        for backend in good + flapping:
            backend.release()
        for hole in silent:
            hole.close()
    after = Counts.back_to(before)
    assert after.threads <= before.threads, threading.enumerate()
    assert after.sockets <= before.sockets


def test_a_refusing_endpoint_that_starts_listening_among_hundreds_is_served(xds_server, ports):
    """Bad input: 300 endpoints refuse every connection, retrying with
    backoff, while RPCs run on the good one; one of them starts listening
    (its port was held, refusing, until then): its next attempt connects,
    it reaches READY and serves, and no RPC failed meanwhile."""
    good = Backend("good").start()
    late = Backend("late").hold()  # refuses connections until it starts
    refused = [ports.dead_address() for _ in range(300)]
    xds_server.set_snapshot(scale_snapshot([good.address, late.address, *refused]))
    before = Counts()
    channel = pyxds.insecure_channel(
        "xds:///scale",
        bootstrap=xds_server.bootstrap(),
        options=[
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 300),
        ],
    )
    try:
        who = channel.unary_unary("/pyxds.test.Echo/Who")
        served: dict[bytes, int] = {}
        deadline = time.monotonic() + 1.0  # several failed attempts of every refusing one
        while time.monotonic() < deadline:
            reply = who(b"", wait_for_ready=True, timeout=10)
            served[reply] = served.get(reply, 0) + 1
        assert set(served) == {b"good"}
        late.start()
        deadline = time.monotonic() + 15.0
        while b"late" not in served and time.monotonic() < deadline:
            reply = who(b"", wait_for_ready=True, timeout=10)
            served[reply] = served.get(reply, 0) + 1
        assert b"late" in served, served
        Counts().assert_bounded_above(before)
    finally:
        channel.close()
        good.release()
        late.release()
    after = Counts.back_to(before)
    assert after.threads <= before.threads, threading.enumerate()
    assert after.sockets <= before.sockets


def test_closing_a_channel_of_1000_connected_endpoints_prints_nothing_and_starts_no_thread_each(
    xds_server, thousand, capfd
):
    """grpcio's subscribe() poller printed "Cannot monitor channel state"
    when a channel closed under it; pyxds never subscribes, and closes its
    subchannels' channels on the one timer thread."""
    xds_server.set_snapshot(scale_snapshot(thousand.addresses))
    channel = pyxds.insecure_channel("xds:///scale", bootstrap=xds_server.bootstrap())
    who = channel.unary_unary(WHO)
    served: set[bytes] = set()
    deadline = time.monotonic() + 120
    while len(served) < 1000 and time.monotonic() < deadline:
        served.add(who(b"", wait_for_ready=True, timeout=60))
    peak = [threading.active_count()]
    stop = threading.Event()

    def watch_threads() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], threading.active_count())
            stop.wait(0.001)

    watcher = threading.Thread(target=watch_threads, daemon=True)
    before_close = threading.active_count() + 1  # the watcher
    watcher.start()
    channel.close()
    stop.set()
    watcher.join(5)
    assert peak[0] <= before_close + 2  # not one per subchannel
    out, err = capfd.readouterr()
    assert "Cannot monitor" not in out + err
    assert "Traceback" not in out + err


#: The client program of the test below: pyxds is the only user of grpcio in
#: it, and the cyclic garbage collector is off (as with gc.freeze(): nothing
#: may rely on a collection to close what close() left open).
_CLOSE_PROGRAM = """
import gc, json, os, sys, time
gc.disable()

def threads():
    return len(os.listdir("/proc/self/task"))

def sockets():
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count

def names():
    out = []
    for task in os.listdir("/proc/self/task"):
        try:
            out.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except OSError:
            pass
    return sorted(out)

before = {"threads": threads(), "sockets": sockets()}
import pyxds

channel = pyxds.insecure_channel("xds:///scale", bootstrap=sys.argv[1])
who = channel.unary_unary("/pyxds.test.Echo/Who")
for _ in range(300):
    assert who(b"", timeout=10, wait_for_ready=True) == b"good"
during = threads()
channel.close()
deadline = time.monotonic() + 10
while time.monotonic() < deadline and (threads(), sockets()) != tuple(before.values()):
    time.sleep(0.05)
print(json.dumps({"before": before, "during": during, "threads": threads(),
                  "sockets": sockets(), "names": names()}))
"""


def test_after_close_among_refusing_endpoints_a_program_is_back_to_its_threads_and_sockets(
    xds_server, tmp_path
):
    """A program whose only gRPC is one pyxds channel, over one good endpoint
    and 500 refusing ones (ports held by bound, non-listening sockets), with
    the garbage collector off: after close() every connection is closed and
    C-core's own threads (timer, event engine pool, lifeguard) end, as they
    do after closing a C-core channel: threads and sockets back to their
    count before ``import pyxds`` (a count, with a bounded wait).  A
    subchannel's grpcio channel whose close was lost (the timer heap's
    compaction dropped it; tests/unit/test_clock.py) stayed open here."""
    good = Backend("good").start()
    holders = []
    try:
        for _ in range(500):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            holders.append(s)
        refusing = [f"127.0.0.1:{s.getsockname()[1]}" for s in holders]
        xds_server.set_snapshot(scale_snapshot([good.address, *refusing]))
        bootstrap = tmp_path / "bootstrap.json"
        bootstrap.write_text(json.dumps(xds_server.bootstrap()))
        env = dict(os.environ, PYTHONPATH=SRC)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        done = subprocess.run(
            [sys.executable, "-c", _CLOSE_PROGRAM, str(bootstrap)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        good.release()
        for s in holders:
            s.close()
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["during"] > out["before"]["threads"]  # C-core's threads ran
    assert out["threads"] == out["before"]["threads"], out["names"]
    assert out["sockets"] == out["before"]["sockets"]
