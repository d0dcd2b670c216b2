"""Code typed against grpcio, handed pyxds's channels: the proof that pyxds's
public API is typed as grpcio's own stubs type their twins.

Rules: ``mypy --strict`` checks this module in CI (``scripts/test.sh``, with
the files of ``[tool.mypy]`` in pyproject.toml); it is never run.  Every
helper here is written the way user code is, against grpcio's types
(``grpc.Channel``, ``grpc.aio.Channel``, the multicallables, futures and
calls of typeshed's ``types-grpcio``) and the generated stubs of
``tests/e2e/protos/echo.proto`` (``echo_pb2*.pyi``, from mypy-protobuf);
pyxds's constructors feed them.  ``assert_type`` pins what each call
returns, so a pyxds return type that stops being grpcio's twin, or decays to
``Any``, fails the check.  The LB policy API (a tiny custom policy driven
through ``pyxds.testing``), ``pyxds.server`` and ``pyxds.testing`` are used
as their docs show.  ``tests/unit/test_typing.py`` shows the check fails on
a wrong use.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, assert_type

import grpc
import grpc.aio
from protos import echo_pb2, echo_pb2_grpc

import pyxds
import pyxds.aio
from pyxds.lb import (
    ConnectivityState,
    Endpoint,
    FailPicker,
    Helper,
    LBConfigError,
    LoadBalancer,
    PickArgs,
    PickComplete,
    Picker,
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
    Subchannel,
    registry,
)
from pyxds.server import ManagementServer, Snapshot
from pyxds.server import builders as b
from pyxds.testing import FakeClock, FakeHelper, FakeXdsClient

ECHO = "/pyxds.test.Echo/Echo"

# -- written against grpcio's types ----------------------------------------------


def echo(channel: grpc.Channel, message: str) -> str:
    stub = echo_pb2_grpc.EchoStub(channel)
    reply = stub.Echo(echo_pb2.EchoRequest(message=message), timeout=5)
    assert_type(reply, echo_pb2.EchoReply)
    return reply.backend


def echo_stream(channel: grpc.Channel, count: int) -> list[str]:
    stub = echo_pb2_grpc.EchoStub(channel)
    replies = stub.EchoStream(echo_pb2.EchoRequest(count=count), timeout=5)
    return [reply.backend for reply in replies]


def echo_future(channel: grpc.Channel) -> echo_pb2.EchoReply:
    echo_call: grpc.UnaryUnaryMultiCallable[echo_pb2.EchoRequest, echo_pb2.EchoReply]
    echo_call = channel.unary_unary(
        ECHO,
        request_serializer=echo_pb2.EchoRequest.SerializeToString,
        response_deserializer=echo_pb2.EchoReply.FromString,
    )
    reply, call = echo_call.with_call(echo_pb2.EchoRequest(message="hi"), timeout=5)
    assert_type(reply, echo_pb2.EchoReply)
    assert_type(call.code(), grpc.StatusCode)
    future = echo_call.future(echo_pb2.EchoRequest(message="hi"), metadata=(("k", "v"),))
    future.add_done_callback(lambda done: None)
    if future.cancel() or future.code() is not grpc.StatusCode.OK:
        raise RuntimeError(future.details())
    return future.result(timeout=5)


def on_connectivity(state: grpc.ChannelConnectivity) -> None:
    print(state)


def watch(channel: grpc.Channel) -> None:
    channel.subscribe(on_connectivity, try_to_connect=True)
    channel.unsubscribe(on_connectivity)


async def echo_aio(channel: grpc.aio.Channel, message: str) -> list[str]:
    stub = echo_pb2_grpc.EchoStub(channel)
    reply = await stub.Echo(echo_pb2.EchoRequest(message=message), timeout=5)
    assert_type(reply, echo_pb2.EchoReply)
    backends = [reply.backend]
    async for streamed in stub.EchoStream(echo_pb2.EchoRequest(count=2)):
        assert_type(streamed, echo_pb2.EchoReply)
        backends.append(streamed.backend)
    raw: grpc.aio.UnaryUnaryMultiCallable[echo_pb2.EchoRequest, echo_pb2.EchoReply]
    raw = channel.unary_unary(
        ECHO,
        request_serializer=echo_pb2.EchoRequest.SerializeToString,
        response_deserializer=echo_pb2.EchoReply.FromString,
    )
    call = raw(echo_pb2.EchoRequest(message=message), timeout=5)
    assert_type(call, grpc.aio.UnaryUnaryCall[echo_pb2.EchoRequest, echo_pb2.EchoReply])
    assert_type(await call, echo_pb2.EchoReply)
    assert_type(await call.code(), grpc.StatusCode)
    state = channel.get_state(try_to_connect=True)
    await channel.wait_for_state_change(state)
    await channel.channel_ready()
    return backends


# -- pyxds's channels where grpcio's go ---------------------------------------------


def sync_channels(bootstrap: dict[str, Any]) -> list[str]:
    with pyxds.insecure_channel("xds:///echo", bootstrap=bootstrap) as channel:
        assert_type(channel, pyxds.XdsChannel)  # not Any: a grpc.Channel subclass
        backends = [echo(channel, "hi"), *echo_stream(channel, 2)]
        watch(channel)
        # pyxds's own objects, used directly, have grpcio's types too
        stub = echo_pb2_grpc.EchoStub(channel)
        assert_type(stub.Echo(echo_pb2.EchoRequest()), echo_pb2.EchoReply)
        for streamed in channel.unary_stream(
            "/pyxds.test.Echo/EchoStream",
            request_serializer=echo_pb2.EchoRequest.SerializeToString,
            response_deserializer=echo_pb2.EchoReply.FromString,
        )(echo_pb2.EchoRequest(count=2)):
            assert_type(streamed, echo_pb2.EchoReply)
    fallback = grpc.ssl_channel_credentials()
    for credentials in (grpc.xds_channel_credentials(fallback), pyxds.xds_channel_credentials()):
        secure: grpc.Channel = pyxds.secure_channel(
            "xds:///echo",
            credentials,
            bootstrap=bootstrap,
            options=[("grpc.max_receive_message_length", 1 << 20)],
            service_config={"loadBalancingConfig": [{"round_robin": {}}]},
        )
        backends.append(echo_future(secure).backend)
        backends.append(echo_future(grpc.intercept_channel(secure)).backend)
        secure.close()
    return backends


async def aio_channels(bootstrap: dict[str, Any]) -> list[str]:
    async with pyxds.aio.insecure_channel("xds:///echo", bootstrap=bootstrap) as channel:
        assert_type(channel, pyxds.aio.AioXdsChannel)  # not Any: a grpc.aio.Channel subclass
        backends = await echo_aio(channel, "hi")
        stub = echo_pb2_grpc.EchoStub(channel)
        assert_type(await stub.Echo(echo_pb2.EchoRequest()), echo_pb2.EchoReply)
    secure = pyxds.aio.secure_channel(
        "xds:///echo", grpc.xds_channel_credentials(grpc.local_channel_credentials())
    )
    backends += await echo_aio(secure, "again")
    await secure.close()
    return backends


# -- the LB policy API: a custom policy, driven by pyxds.testing ------------------------


@dataclass(frozen=True)
class FirstReadyConfig:
    skip: int = 0


class FirstReadyPicker(Picker):
    def __init__(self, result: PickComplete) -> None:
        self._result = result

    def pick(self, args: PickArgs) -> PickResult:
        return self._result

    def result_stream(self) -> Iterator[PickResult] | None:
        return None


class FirstReady(LoadBalancer):
    """Sends every RPC to the first endpoint (after ``skip``) once it is READY."""

    def __init__(self, helper: Helper) -> None:
        self._helper = helper
        self._subchannel: Subchannel | None = None
        self._unwatch: list[Any] = []

    def update(self, update: ResolverUpdate) -> Status | None:
        if isinstance(update.endpoints, Status):
            self.resolver_error(update.endpoints)
            return update.endpoints
        config = update.config if isinstance(update.config, FirstReadyConfig) else None
        skip = config.skip if config is not None else 0
        addresses = [endpoint.addresses[0] for endpoint in update.endpoints][skip:]
        if not addresses:
            status = Status(grpc.StatusCode.UNAVAILABLE, "no endpoint")
            self._helper.update_state(
                ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status)
            )
            return status
        self.shutdown()
        subchannel = self._helper.create_subchannel(addresses[0], {})
        self._subchannel = subchannel
        self._unwatch.append(subchannel.watch_state(self._on_state))
        subchannel.connect()
        return None

    def _on_state(self, state: ConnectivityState, status: Status) -> None:
        subchannel = self._subchannel
        if subchannel is None:
            return
        picker: Picker
        if state is ConnectivityState.READY:
            picker = FirstReadyPicker(PickComplete(subchannel))
        elif state is ConnectivityState.TRANSIENT_FAILURE:
            picker = FailPicker(status)
        else:
            picker = QueuePicker(on_pick=lambda: None)
        self._helper.update_state(state, status, picker)

    def resolver_error(self, status: Status) -> None:
        if self._subchannel is None:
            failing = ConnectivityState.TRANSIENT_FAILURE
            self._helper.update_state(failing, status, FailPicker(status))

    def exit_idle(self) -> None:
        if self._subchannel is not None:
            self._subchannel.connect()

    def reset_backoff(self) -> None:
        if self._subchannel is not None:
            self._subchannel.reset_backoff()

    def shutdown(self) -> None:
        for unwatch in self._unwatch:
            unwatch()
        self._unwatch.clear()
        if self._subchannel is not None:
            self._subchannel.shutdown()
            self._subchannel = None


class FirstReadyFactory(PolicyFactory):
    name = "typed_first_ready"

    def parse_config(self, json_config: Any) -> FirstReadyConfig:
        skip = (json_config or {}).get("skip", 0)
        if not isinstance(skip, int) or skip < 0:
            raise LBConfigError("skip", "must be an integer >= 0")
        return FirstReadyConfig(skip)

    def build(self, helper: Helper) -> LoadBalancer:
        return FirstReady(helper)


def drive_policy() -> PickResult:
    registry.register(FirstReadyFactory())
    clock = FakeClock()
    helper = FakeHelper(clock)
    policy = FirstReadyFactory().build(helper)
    endpoints = [Endpoint(("10.0.0.1:443",)), Endpoint(("10.0.0.2:443",))]
    assert policy.update(ResolverUpdate(endpoints, FirstReadyConfig(skip=1))) is None
    helper.subchannel("10.0.0.2:443").set_state(ConnectivityState.READY)
    clock.advance(1.0)
    assert_type(helper.state, ConnectivityState)
    return helper.pick()


# -- pyxds.server and pyxds.testing ----------------------------------------------------


def control_plane() -> dict[str, Any]:
    with ManagementServer(port=0) as server:
        server.set_snapshot(
            Snapshot(
                listeners=[b.listener("echo", route_config_name="echo-route")],
                routes=[
                    b.route_config(
                        "echo-route", [b.virtual_host("echo", ["*"], [b.route(cluster="a")])]
                    )
                ],
                clusters=[b.cluster("a")],
                endpoints=[b.endpoints("a", [b.locality(endpoints=["127.0.0.1:50051"])])],
            )
        )
        bootstrap = server.bootstrap(node_id="typed")
        sync_channels(bootstrap)
        ack = server.wait_for_ack("CDS", timeout=5)
        assert_type(ack.version_info, str)
        assert_type(server.wait_until(lambda: len(server.acks()), timeout=5), int)
        return bootstrap


def fake_xds_client() -> FakeXdsClient:
    return FakeXdsClient()
