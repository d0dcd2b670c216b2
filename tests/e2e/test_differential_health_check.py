"""Differential, gRFC A17 client-side health checking: a plain ``ipv4:``
target whose ``grpc.service_config`` option has ``healthCheckConfig``,
given as is to a pyxds channel and to a grpcio 1.85 channel (C-core), over
the same 127.0.0.1 backends serving ``grpc.health.v1.Health`` with
grpcio-health-checking's servicer (its Watch sends the status at once and
again on every change).

Both skip a NOT_SERVING backend under round_robin and weighted_round_robin
(not under a top-level pick_first: A17 "pick_first", A61), follow a
backend's health live, serve a backend without the health service
(UNIMPLEMENTED: "assuming server is healthy"), turn it off with
``grpc.inhibit_health_checking``, fail RPCs with the same status when every
backend is unhealthy, and ignore the option on an ``xds:`` target (the
xds resolver's service config wins).  The backends are shared by the
module; a flipped backend is put back."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from channel_fixtures import SERVICE, TARGET, route, snapshot, wait_until
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from ports import EXCLUSIVE

import pyxds
import pyxds.aio
from pyxds.server import ManagementServer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
RR = {"round_robin": {}}


class HealthBackend:
    """Who answers the backend's name; ``grpc.health.v1.Health`` says
    ``status`` for the server (""), unless ``checks`` is False (no health
    service: Watch is UNIMPLEMENTED)."""

    def __init__(self, name: str, status: int | None) -> None:
        self.name = name
        #: (method, client address) of every RPC the backend got
        self.peers: list[tuple[str, str]] = []
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            options=[EXCLUSIVE],
            interceptors=[_PeerLog(self.peers)],
        )

        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            return name.encode()

        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE, {"Who": grpc.unary_unary_rpc_method_handler(who)}
                ),
            )
        )
        self.health: health.HealthServicer | None = None
        if status is not None:
            self.health = health.HealthServicer(experimental_non_blocking=True)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
            self.health.set("", status)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def set(self, status: int) -> None:
        assert self.health is not None
        self.health.set("", status)


class _PeerLog(grpc.ServerInterceptor):
    """Records each RPC's method and client address (``context.peer()``)."""

    def __init__(self, peers: list[tuple[str, str]]) -> None:
        self.peers = peers

    def intercept_service(self, continuation, details):  # type: ignore[no-untyped-def]
        handler = continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        method, peers = details.method, self.peers
        if handler.response_streaming:
            inner_stream = handler.unary_stream

            def unary_stream(request, context):  # type: ignore[no-untyped-def]
                peers.append((method, context.peer()))
                return inner_stream(request, context)

            return handler._replace(unary_stream=unary_stream)
        inner = handler.unary_unary

        def unary_unary(request, context):  # type: ignore[no-untyped-def]
            peers.append((method, context.peer()))
            return inner(request, context)

        return handler._replace(unary_unary=unary_unary)


@pytest.fixture(scope="module")
def backends() -> Iterator[dict[str, HealthBackend]]:
    started = {
        "sick": HealthBackend("sick", NOT_SERVING),
        "well": HealthBackend("well", SERVING),
        "flip": HealthBackend("flip", SERVING),
        "bare": HealthBackend("bare", None),
    }
    yield started
    for backend in started.values():
        if backend.health is not None:
            backend.health.enter_graceful_shutdown()  # ends the Watch streams
        backend.server.stop(None)


def service_config(policy: dict | None = None, service_name: str | None = "") -> str:
    config: dict = {"loadBalancingConfig": [policy or RR]}
    if service_name is not None:
        config["healthCheckConfig"] = {"serviceName": service_name}
    return json.dumps(config)


def both(
    backends: dict[str, HealthBackend], names: list[str], sc: str, options: list | None = None
) -> dict[str, grpc.Channel]:
    target = "ipv4:" + ",".join(backends[name].address for name in names)
    opts = [("grpc.service_config", sc), *(options or [])]
    return {
        "pyxds": pyxds.insecure_channel(target, options=opts),
        "grpcio": grpc.insecure_channel(target, options=opts),
    }


def served(channel: grpc.Channel, rpcs: int = 12, wait: bool = True) -> set[str]:
    """Who answered ``rpcs`` RPCs (or "CODE: details" of each failure); the
    first waits for the channel (wait_for_ready) when ``wait``."""
    call = channel.unary_unary(f"/{SERVICE}/Who")
    out = set()
    for i in range(rpcs):
        try:
            out.add(call(b"", timeout=5, wait_for_ready=wait and i == 0).decode())
        except grpc.RpcError as err:
            out.add(f"{err.code().name}: {err.details()}")
    return out


def close(channels: dict[str, grpc.Channel]) -> None:
    for channel in channels.values():
        channel.close()


def both_serve(
    backends: dict[str, HealthBackend],
    names: list[str],
    sc: str,
    expected: set[str],
    options: list | None = None,
) -> None:
    """The pyxds and the grpcio channel to ``names`` each send their RPCs to
    ``expected`` alone."""
    channels = both(backends, names, sc, options)
    try:
        got = {name: served(channel) for name, channel in channels.items()}
    finally:
        close(channels)
    assert got == {"pyxds": expected, "grpcio": expected}


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (RR, {"well"}),
        ({"weighted_round_robin": {}}, {"well"}),
        ({"pick_first": {}}, {"sick"}),  # A17/A61: no health checking at the top
    ],
    ids=["round_robin", "weighted_round_robin", "pick_first"],
)
def test_health_check_config_skips_a_not_serving_backend_like_c_core(backends, policy, expected):
    """A17 "round_robin": a backend whose health service says NOT_SERVING
    gets no RPCs (grpcio 1.85 sends all to the SERVING one; pyxds spread
    them 10/10 before health checking); a top-level pick_first keeps the
    first address, whatever its health."""
    both_serve(backends, ["sick", "well"], service_config(policy), expected)


def test_a_backend_whose_health_flips_is_skipped_and_taken_back_live_like_c_core(backends):
    """A17 "Client Workflow": each Watch response moves the subchannel
    (SERVING -> READY, NOT_SERVING -> TRANSIENT_FAILURE, and back with no
    stop at CONNECTING), on the connection the RPCs use: both clients stop
    sending to the backend once it says NOT_SERVING, and send to it again
    once it says SERVING (each within 5 s, polled)."""
    flip = backends["flip"]
    channels = both(backends, ["flip", "well"], service_config())
    try:
        for channel in channels.values():
            assert wait_until(lambda ch=channel: served(ch, 4) == {"flip", "well"}, 5)
        flip.set(NOT_SERVING)
        for name, channel in channels.items():
            assert wait_until(lambda ch=channel: served(ch, 6) == {"well"}, 5), name
        flip.set(SERVING)
        for name, channel in channels.items():
            assert wait_until(lambda ch=channel: "flip" in served(ch, 4), 5), name
    finally:
        flip.set(SERVING)
        close(channels)


def test_the_watch_runs_on_the_connection_the_rpcs_use_like_c_core(backends):
    """A17 "Client Workflow": the Watch call goes on the subchannel's own
    connection (C-core's HealthProducer streams on the connected
    subchannel; pyxds's sync channel on its grpc.aio twin, which shares the
    grpcio channel's C-core subchannel): the backend sees the Watch and the
    RPCs come from one client address, for each client."""
    well = backends["well"]
    for name, channel in both(backends, ["well"], service_config()).items():
        del well.peers[:]
        try:
            assert served(channel, 3) == {"well"}, name
        finally:
            channel.close()
        by_method: dict[str, set[str]] = {}
        for method, peer in well.peers:
            by_method.setdefault(method, set()).add(peer)
        assert by_method[f"/{SERVICE}/Who"] == by_method["/grpc.health.v1.Health/Watch"], name
        assert len(by_method[f"/{SERVICE}/Who"]) == 1, name


def test_a_backend_without_the_health_service_is_served_like_c_core(backends, caplog):
    """A17: Watch failing UNIMPLEMENTED disables health checking for that
    subchannel, which is then healthy (READY), with an ERROR logged; the
    NOT_SERVING backend beside it is still skipped."""
    both_serve(backends, ["bare", "sick"], service_config(), {"bare"})
    assert "health checking Watch method returned UNIMPLEMENTED" in caplog.text


@pytest.mark.parametrize(
    ("backend", "service_name"),
    [("sick", ""), ("well", "no.such.Service")],
    ids=["not_serving", "unknown_service"],
)
def test_every_backend_unhealthy_fails_rpcs_like_c_core(backends, backend, service_name):
    """Every endpoint unhealthy (NOT_SERVING; or a service the server does
    not know: Watch says SERVICE_UNKNOWN): round_robin is in
    TRANSIENT_FAILURE and an RPC fails UNAVAILABLE with C-core's words,
    "connections to all backends failing; last error: ipv4:ADDRESS:
    backend unhealthy", the same text from both."""
    channels = both(backends, [backend], service_config(service_name=service_name))
    try:
        got = {name: served(ch, 3, wait=False) for name, ch in channels.items()}
    finally:
        close(channels)
    address = backends[backend].address
    expected = {
        "UNAVAILABLE: connections to all backends failing; "
        f"last error: ipv4:{address}: backend unhealthy"
    }
    assert got == {"pyxds": expected, "grpcio": expected}


def test_the_inhibit_option_turns_health_checking_off_like_c_core(backends):
    """A17: ``grpc.inhibit_health_checking`` disables it even though the
    service config enables it: the NOT_SERVING backend is served."""
    inhibit = [("grpc.inhibit_health_checking", 1)]
    both_serve(backends, ["sick"], service_config(), {"sick"}, options=inhibit)


def test_an_asyncio_channel_health_checks_on_its_own_loop(backends):
    """``pyxds.aio``: the Watch call runs on the channel's event loop, on
    its subchannel's own grpc.aio channel; the same answer as the sync
    channel's and C-core's."""

    async def run() -> set[str]:
        target = f"ipv4:{backends['sick'].address},{backends['well'].address}"
        async with pyxds.aio.insecure_channel(
            target, options=[("grpc.service_config", service_config())]
        ) as channel:
            call = channel.unary_unary(f"/{SERVICE}/Who")
            first = await call(b"", timeout=5, wait_for_ready=True)
            return {first.decode()} | {(await call(b"", timeout=5)).decode() for _ in range(11)}

    assert asyncio.run(run()) == {"well"}


_CORE_XDS = r"""
import grpc, json, sys
channel = grpc.insecure_channel(sys.argv[1], options=[("grpc.service_config", sys.argv[2])])
call = channel.unary_unary(sys.argv[3])
call(b"", timeout=10, wait_for_ready=True)
print(json.dumps(sorted({call(b"", timeout=5).decode() for _ in range(12)})))
"""


def test_an_xds_target_ignores_the_options_health_check_config_like_c_core(backends):
    """On an ``xds:`` target the xds resolver's service config replaces the
    option's (grpcio 1.85 takes the option only as the default of a
    resolver that returns none): its healthCheckConfig does not apply, and
    the NOT_SERVING backend of the cluster is served by both."""
    server = ManagementServer().start()
    try:
        addresses = [backends["sick"].address, backends["well"].address]
        server.set_snapshot(snapshot([route(prefix="", cluster="hc")], {"hc": [addresses]}))
        bootstrap = server.bootstrap(node_id="differential-health-check")
        sc = json.dumps({"healthCheckConfig": {"serviceName": ""}})
        env = {**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": json.dumps(bootstrap)}
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        core = subprocess.Popen(
            [sys.executable, "-c", _CORE_XDS, TARGET, sc, f"/{SERVICE}/Who"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        channel = pyxds.insecure_channel(
            TARGET, bootstrap=bootstrap, options=[("grpc.service_config", sc)]
        )
        try:
            ours = served(channel)
        finally:
            channel.close()
        out, err = core.communicate(timeout=60)
        assert core.returncode == 0, err[-2000:]
        assert ours == set(json.loads(out.strip().splitlines()[-1])) == {"sick", "well"}
    finally:
        server.stop()
