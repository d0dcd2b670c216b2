"""least_request_experimental end to end (gRFC A48): a cluster whose
``load_balancing_policy`` is the LeastRequest extension (choice_count 10)
over two real backends, one of which holds slow RPCs.  New RPCs go to the
idle backend while the other holds calls (grpc-go's and grpc-java's
documented behaviour; C-core has no least_request, so no differential), and
once the slow calls end -- completed, cancelled (sync) or their asyncio
tasks cancelled (aio) -- the outstanding counters are back at zero, so the
split is even again (a leaked counter would starve the backend)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from concurrent import futures

import grpc
import pytest
from channel_fixtures import SERVICE, TARGET, route, snapshot, wait_until
from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2
from ports import EXCLUSIVE

import pyxds._api as pyxds
import pyxds.aio
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

NODE = "least-request-e2e"
WHO = f"/{SERVICE}/Who"
SLEEP = f"/{SERVICE}/Sleep"
HELD = 1  # slow calls held on the busy backend (least_request avoids piling more on it)


class _Backend:
    """Who answers the name; Sleep holds the call (up to the requested
    seconds, ending early when the client cancels) only on the slow one."""

    def __init__(self, name: str, slow: bool) -> None:
        self.name = name
        self.in_flight = 0
        self.served: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=[EXCLUSIVE])

        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.served["Who"] += 1
            return name.encode()

        def sleep(request: bytes, context: grpc.ServicerContext) -> bytes:
            if not slow:
                return name.encode()
            with self._lock:
                self.in_flight += 1
            try:
                deadline = time.monotonic() + float(request or b"0")
                while time.monotonic() < deadline and context.is_active():
                    time.sleep(0.01)
            finally:
                with self._lock:
                    self.in_flight -= 1
            return name.encode()

        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        "Who": grpc.unary_unary_rpc_method_handler(who),
                        "Sleep": grpc.unary_unary_rpc_method_handler(sleep),
                    },
                ),
            )
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backends():
    started = {"slow": _Backend("slow", slow=True), "idle": _Backend("idle", slow=False)}
    yield started
    for backend in started.values():
        backend.server.stop(None).wait(5)


def lr_snapshot(backends) -> Snapshot:
    base = snapshot(
        [route(prefix="", cluster="clr")],
        {"clr": [[backends["slow"].address, backends["idle"].address]]},
    )
    listener_t, route_t, _cluster_t, eds_t = list(base._by_type)
    cluster = b.cluster(
        "clr",
        load_balancing_policy=least_request_pb2.LeastRequest(choice_count={"value": 10}),
    )
    return Snapshot(
        listeners=list(base.resources(listener_t).values()),
        routes=list(base.resources(route_t).values()),
        clusters=[cluster],
        endpoints=list(base.resources(eds_t).values()),
    )


def who_counts(channel, n: int) -> collections.Counter:
    call = channel.unary_unary(WHO)
    return collections.Counter(call(b"", timeout=5).decode() for _ in range(n))


def test_new_rpcs_go_to_the_idle_backend_and_counters_return_to_zero(server, backends):
    server.set_snapshot(lr_snapshot(backends))
    slow = backends["slow"]
    with pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=NODE)) as channel:
        assert wait_until(lambda: set(who_counts(channel, 20)) == {"slow", "idle"}, 10)
        sleep = channel.unary_unary(SLEEP)
        held = []
        for _ in range(200):  # bounded: each call lands on either backend
            if slow.in_flight >= HELD:
                break
            held.append(sleep.future(b"20", timeout=30))
            time.sleep(0.02)
        assert wait_until(lambda: slow.in_flight >= HELD, 5)
        busy = who_counts(channel, 100)
        assert busy["idle"] >= 97, busy  # slow holds calls: (1/2)^10 per pick
        for call in held:
            call.cancel()
        assert wait_until(lambda: slow.in_flight == 0, 10)
        assert wait_until(lambda: all(call.done() for call in held), 10)
        even = who_counts(channel, 200)
        assert even["slow"] >= 60 and even["idle"] >= 60, even


def test_aio_task_cancellation_releases_the_counters(server, backends):
    server.set_snapshot(lr_snapshot(backends))
    slow = backends["slow"]

    async def main():
        async with pyxds.aio.insecure_channel(
            TARGET, bootstrap=server.bootstrap(node_id=NODE)
        ) as channel:
            who = channel.unary_unary(WHO)
            sleep = channel.unary_unary(SLEEP)

            async def counts(n):
                return collections.Counter([(await who(b"", timeout=5)).decode() for _ in range(n)])

            for _ in range(100):
                if set(await counts(20)) == {"slow", "idle"}:
                    break
            tasks = []
            for _ in range(200):
                if slow.in_flight >= HELD:
                    break
                tasks.append(asyncio.ensure_future(sleep(b"20", timeout=30)))
                await asyncio.sleep(0.02)
            assert slow.in_flight >= HELD
            busy = await counts(100)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for _ in range(500):
                if slow.in_flight == 0:
                    break
                await asyncio.sleep(0.02)
            return busy, await counts(200)

    busy, even = asyncio.run(main())
    assert busy["idle"] >= 97, busy
    assert slow.in_flight == 0
    assert even["slow"] >= 60 and even["idle"] >= 60, even
