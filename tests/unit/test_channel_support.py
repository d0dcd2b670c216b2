"""Fakes for the channel's unit tests: a transport without sockets, a
resolver the test drives, and an LB policy whose pickers the test sets."""

from __future__ import annotations

import time
from typing import Any

import grpc

from pyxds.channel.calls import StreamingCall, blocking_unary
from pyxds.channel.core import ChannelCore
from pyxds.channel.rpc import DEADLINE_EXCEEDED, Rpc
from pyxds.channel.subchannel import Transport
from pyxds.lb import registry as lb_registry
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    Helper,
    LoadBalancer,
    Picker,
    ResolverUpdate,
    Status,
)
from pyxds.resolver import registry as resolver_registry
from pyxds.resolver.api import Resolver, ResolverArgs, ResolverResult
from pyxds.testing import FakeClock


class FakeGrpcError(grpc.RpcError, grpc.Call):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeMultiCallable:
    def __init__(self, transport: FakeTransport, method: str) -> None:
        self.transport = transport
        self.method = method

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        return self.with_call(request, **kwargs)[0]

    def with_call(self, request: Any, **kwargs: Any) -> tuple[Any, Any]:
        self.transport.calls.append((self.method, request, kwargs))
        if self.transport.fail_with:
            raise self.transport.fail_with.pop(0)
        return (self.transport.address, request), None


class FakeGrpcChannel:
    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> FakeMultiCallable:
        return FakeMultiCallable(self.transport, method)


class FakeTransport(Transport):
    def __init__(self, address: str, credentials: Any, on_state: Any) -> None:
        super().__init__()
        self.address = address
        self.credentials = credentials
        self.on_state = on_state
        self.connects = 0
        self.closed_now = False
        self.calls: list = []
        self.fail_with: list[Exception] = []
        self._channel = FakeGrpcChannel(self)

    @property
    def channel(self) -> FakeGrpcChannel:
        return self._channel

    def connect(self) -> None:
        self.connects += 1

    def _close_now(self) -> None:
        self.closed_now = True

    def report(self, state: grpc.ChannelConnectivity) -> None:
        self.on_state(state)


class TransportFactory:
    def __init__(self) -> None:
        self.made: list[FakeTransport] = []

    def __call__(self, address: str, credentials: Any, on_state: Any) -> FakeTransport:
        transport = FakeTransport(address, credentials, on_state)
        self.made.append(transport)
        return transport

    def last(self, address: str) -> FakeTransport:
        return [t for t in self.made if t.address == address][-1]


class DrivenResolver(Resolver):
    instances: list[DrivenResolver] = []

    def __init__(self, args: ResolverArgs) -> None:
        self.args = args
        self.started = False
        self.shut_down = False
        self.reresolutions = 0
        DrivenResolver.instances.append(self)

    def start(self) -> None:
        self.started = True

    def request_reresolution(self) -> None:
        self.reresolutions += 1

    def shutdown(self) -> None:
        self.shut_down = True

    def push(self, result: ResolverResult) -> None:
        self.args.serializer.run(lambda: self.args.on_result(result))


class DrivenPolicy(LoadBalancer):
    """Publishes whatever picker the test hands it; records updates."""

    instances: list[DrivenPolicy] = []

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self.updates: list[ResolverUpdate] = []
        self.errors: list[Status] = []
        self.on_update: Any = None
        self.shut_down = False
        DrivenPolicy.instances.append(self)

    def update(self, update: ResolverUpdate) -> Status | None:
        self.updates.append(update)
        if self.on_update is not None:
            self.on_update(update)
        return None

    def resolver_error(self, status: Status) -> None:
        self.errors.append(status)

    def exit_idle(self) -> None:
        pass

    def reset_backoff(self) -> None:
        pass

    def shutdown(self) -> None:
        self.shut_down = True


class DrivenFactory:
    name = "channel_test_driven"

    def parse_config(self, json_config: Any) -> Any:
        return "driven"

    def build(self, helper: Helper) -> DrivenPolicy:
        return DrivenPolicy(helper)


lb_registry.register(DrivenFactory())  # type: ignore[arg-type]
resolver_registry.register("drivenres", DrivenResolver)
DRIVEN = lb_registry.select_policy([{"channel_test_driven": {}}])


class Harness:
    """A ChannelCore over fakes, with its resolver and policy at hand."""

    def __init__(self, target: str = "drivenres:///svc", options: Any = None) -> None:
        self.clock = FakeClock()
        self.transports = TransportFactory()
        self.core = ChannelCore(target, self.transports, options=options, clock=self.clock)

    @property
    def resolver(self) -> DrivenResolver:
        return DrivenResolver.instances[-1]

    @property
    def policy(self) -> DrivenPolicy:
        return DrivenPolicy.instances[-1]

    def start(self) -> None:
        """Leave idle the way the first RPC does."""
        self.core.call_started()
        self.core.call_ended()

    def resolve(self, endpoints: Any = (), selector: Any = None, **kw: Any) -> None:
        self.resolver.push(
            ResolverResult(endpoints=endpoints, lb_policy=DRIVEN, config_selector=selector, **kw)
        )

    def publish(self, picker: Picker, state: ConnectivityState = ConnectivityState.READY) -> None:
        helper = self.policy.helper
        self.core.serializer.run(lambda: helper.update_state(state, OK_STATUS, picker))

    def advance(self, seconds: float) -> None:
        self.core.serializer.run(lambda: self.clock.advance(seconds))


class FnMethod:
    """A :class:`pyxds.channel.grpc_calls.GrpcMethod` double: each attempt
    runs ``start(transport, remaining)`` (remaining: the attempt's timeout)."""

    def __init__(self, start: Any) -> None:
        self._start = start

    def start(
        self,
        transport: Any,
        rpc: Rpc,
        request: Any,
        credentials: Any,
        compression: Any,
        verb: Any = None,
        serialized: bool = False,
    ) -> Any:
        return self._start(transport, rpc.timeout)


def new_rpc(
    core: ChannelCore,
    path: str,
    metadata: Any = None,
    timeout: float | None = None,
    wait_for_ready: bool | None = None,
    blocking: bool = True,
) -> Rpc:
    return Rpc(core, path, metadata, timeout, wait_for_ready, None, blocking)


def pick_blocking(rpc: Rpc) -> Any:
    """What the blocking adapter does until a pick completes or the RPC is
    over: the transport to start on, or the Status."""
    core = rpc.core
    while True:
        generation = core.generation
        step = rpc.pick()
        if step is None:
            if not core.wait_for_publication(generation, rpc.remaining()):
                return rpc.finish(DEADLINE_EXCEEDED)
            continue
        if step.__class__ is float:
            time.sleep(step)
            continue
        return step


def run_blocking(rpc: Rpc, invoke: Any, replay: Any = None) -> Any:
    """``blocking_unary`` (with_call) with ``invoke(transport, remaining)``
    as each attempt's grpcio call; ``replay``: a client stream's requests."""
    if replay is not None:
        rpc.buffer = replay.buffer
    return blocking_unary(rpc, FnMethod(invoke), replay, None, None, True)  # type: ignore[arg-type]


def streaming(rpc: Rpc, start: Any, replay: Any = None) -> StreamingCall:
    if replay is not None:
        rpc.buffer = replay.buffer
    return StreamingCall(rpc, FnMethod(start), replay, None, None)  # type: ignore[arg-type]
