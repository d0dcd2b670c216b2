"""XdsClient over a fake transport (no sockets): threading of watcher calls,
stream restarts with backoff on the injected clock, shared clients, CSDS
dump shape (A27, A40, A57, A88)."""

from __future__ import annotations

import asyncio
import gc
import importlib
import threading
import time
import weakref
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest
from envoy.config.core.v3 import base_pb2
from test_xds_client_ads_state import CDS, EDS, INVALID, LDS, TYPES, FakeServer, res, response

from pyxds.lb.api import OK_STATUS, Status
from pyxds.testing.fake_clock import FakeClock
from pyxds.xds import csds
from pyxds.xds.ads_state import DATA_ERROR_HANDLING_ENV, RESOURCE_TIMEOUT
from pyxds.xds.client import CLIENT_FEATURES, XdsClient

WAIT = 5.0


class FakeTransport:
    """Records streams and requests; the test fires the transport events."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.streams: list[int] = []
        self.sent: list[tuple[int, Any]] = []
        self.closed = False

    def start_stream(self) -> int:
        stream_id = len(self.streams) + 1
        self.streams.append(stream_id)
        return stream_id

    def send(self, stream_id: int, request: Any) -> bool:
        self.sent.append((stream_id, request))
        return True

    def close(self) -> None:
        self.closed = True

    # events, as the transport threads would deliver them
    @property
    def current(self) -> int:
        return self.streams[-1]

    def connected(self) -> None:
        self.channel.stream_connected(self.current)

    def respond(self, msg: Any) -> None:
        self.channel.stream_response(self.current, msg)

    def close_stream(self, status: Status = OK_STATUS) -> None:
        self.channel.stream_closed(self.current, status)

    def requests(self, stream_id: int | None = None) -> list[Any]:
        return [r for s, r in self.sent if stream_id is None or s == stream_id]


@dataclass
class ThreadWatcher:
    """Records calls and the thread they ran on."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    threads: set[int] = field(default_factory=set)
    event: threading.Event = field(default_factory=threading.Event)

    def on_resource_changed(self, value: Any) -> None:
        self.threads.add(threading.get_ident())
        self.calls.append(("changed", value))
        self.event.set()

    def on_ambient_error(self, status: Status) -> None:
        self.threads.add(threading.get_ident())
        self.calls.append(("ambient", status))
        self.event.set()

    def wait(self, n: int = 1) -> list[tuple[str, Any]]:
        for _ in range(int(WAIT / 0.01)):
            if len(self.calls) >= n:
                break
            self.event.wait(0.01)
            self.event.clear()
        assert len(self.calls) >= n, self.calls
        return self.calls


class FakeNode:
    def to_proto(self) -> base_pb2.Node:
        return base_pb2.Node(id="n1")


def make_bootstrap(**features: bool) -> Any:
    return SimpleNamespace(xds_servers=(FakeServer(**features),), node=FakeNode(), authorities={})


@pytest.fixture
def env():
    transports: list[FakeTransport] = []

    def factory(channel: Any) -> FakeTransport:
        transport = FakeTransport(channel)
        transports.append(transport)
        return transport

    clock = FakeClock()
    client = XdsClient(
        make_bootstrap(), clock=clock, resource_types=TYPES, transport_factory=factory
    )
    yield SimpleNamespace(client=client, clock=clock, transports=transports)
    client.close()


def inline(fn):
    fn()


def test_watchers_never_run_on_the_transport_thread(env):
    watcher = ThreadWatcher()
    env.client.watch(LDS, "a", watcher)
    transport = env.transports[0]
    transport.connected()
    transport.respond(response(LDS, "1", "n1", ("a", "v")))  # "transport thread" = this one
    assert watcher.wait() == [("changed", res(LDS, "a", "v"))]
    assert threading.get_ident() not in watcher.threads


def test_watcher_executor_is_used_for_every_call(env):
    seen: list[Any] = []

    def executor(fn):
        seen.append(fn)
        fn()

    watcher = ThreadWatcher()
    env.client.watch(LDS, "a", watcher, executor=executor)
    env.transports[0].respond(response(LDS, "1", "n1", ("a", "v")))
    watcher.wait()
    assert len(seen) == 1


def test_first_watch_starts_stream_and_sends_node_with_client_features(env):
    env.client.watch(CDS, "c", ThreadWatcher())
    transport = env.transports[0]
    assert transport.streams == [1]
    (request,) = transport.requests()
    assert request.node.id == "n1" == env.client.node_id
    assert request.node.user_agent_name == "pyxds"
    assert set(CLIENT_FEATURES) <= set(request.node.client_features)
    assert list(request.resource_names) == ["c"]


def test_cancel_sends_unsubscribe_request(env):
    cancel = env.client.watch(CDS, "c", ThreadWatcher())
    env.client.watch(CDS, "d", ThreadWatcher())
    cancel()
    cancel()  # idempotent
    last = env.transports[0].requests()[-1]
    assert list(last.resource_names) == ["d"]
    assert len(env.transports[0].requests()) == 3


def test_stream_restarts_after_backoff_and_resubscribes(env):
    watcher = ThreadWatcher()
    env.client.watch(EDS, "e", watcher)
    transport = env.transports[0]
    transport.connected()
    transport.respond(response(EDS, "1", "n1", ("e", "v")))
    watcher.wait()
    transport.close_stream(Status(grpc.StatusCode.UNAVAILABLE, "server went away"))
    assert transport.streams == [1]  # not at once: never a tight loop
    env.clock.advance(1.21)
    assert transport.streams == [1, 2]
    (resend,) = transport.requests(2)
    assert resend.version_info == "1" and resend.response_nonce == ""
    assert list(resend.resource_names) == ["e"]
    assert resend.node.id == "n1"
    assert watcher.calls == [("changed", res(EDS, "e", "v"))]  # routine closure


def test_failed_streams_back_off_exponentially(env):
    env.client.watch(LDS, "a", ThreadWatcher())
    transport = env.transports[0]
    starts = []
    for _ in range(5):
        started_at = env.clock.now()
        transport.close_stream(Status(grpc.StatusCode.UNAVAILABLE, "refused"))
        count = len(transport.streams)
        while len(transport.streams) == count:
            env.clock.advance(0.01)
        starts.append(env.clock.now() - started_at)
    for got, base in zip(starts, [1.0, 1.6, 2.56, 4.096, 6.5536], strict=True):
        assert base * 0.8 - 0.02 <= got <= base * 1.2 + 0.02


def test_connectivity_error_before_first_response_reaches_watchers(env):
    watcher = ThreadWatcher()
    env.client.watch(LDS, "a", watcher)
    env.transports[0].close_stream(Status(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    ((kind, status),) = watcher.wait()
    assert kind == "changed" and status.code == grpc.StatusCode.UNAVAILABLE
    assert "connection refused" in status.details


def test_resource_timer_runs_on_injected_clock_once_connected(env):
    watcher = ThreadWatcher()
    env.client.watch(CDS, "c", watcher)
    env.clock.advance(RESOURCE_TIMEOUT * 2)
    assert watcher.calls == []
    env.transports[0].connected()
    env.clock.advance(RESOURCE_TIMEOUT)
    ((kind, status),) = watcher.wait()
    assert kind == "changed" and status.code == grpc.StatusCode.NOT_FOUND


def test_resource_timeout_is_injectable():
    transports: list[FakeTransport] = []
    clock = FakeClock()
    client = XdsClient(
        make_bootstrap(),
        clock=clock,
        resource_types=TYPES,
        transport_factory=lambda ch: transports.append(FakeTransport(ch)) or transports[-1],
        resource_timeout=0.5,
    )
    try:
        watcher = ThreadWatcher()
        client.watch(CDS, "c", watcher)
        transports[0].connected()
        clock.advance(0.5)
        assert watcher.wait()[0][1].code == grpc.StatusCode.NOT_FOUND
    finally:
        client.close()


def test_unknown_authority_is_an_error_for_the_watcher(env):
    watcher = ThreadWatcher()
    env.client.watch(LDS, "xdstp://nowhere/envoy.config.listener.v3.Listener/a", watcher)
    ((kind, status),) = watcher.wait()
    assert kind == "changed" and 'authority "nowhere"' in status.details
    assert env.transports == []


def test_unknown_resource_type_is_an_error_for_the_watcher(env):
    watcher = ThreadWatcher()
    env.client.watch("type.googleapis.com/some.Other", "x", watcher)
    ((kind, status),) = watcher.wait()
    assert kind == "changed" and "unknown xDS resource type" in status.details
    assert env.transports == []


def test_close_stops_streams_timers_and_watchers(env):
    watcher = ThreadWatcher()
    env.client.watch(LDS, "a", watcher)
    env.transports[0].connected()
    env.client.close()
    assert env.transports[0].closed
    env.clock.advance(RESOURCE_TIMEOUT * 2)
    assert watcher.calls == []
    assert env.clock.pending == []


def test_dump_is_a_csds_client_config(env):
    env.client.watch(CDS, "good", ThreadWatcher())
    env.client.watch(CDS, "bad", ThreadWatcher())
    env.client.watch(LDS, "waiting", ThreadWatcher())
    transport = env.transports[0]
    transport.connected()
    transport.respond(response(CDS, "1", "n1", ("good", "v"), ("bad", "v")))
    transport.respond(response(CDS, "2", "n2", ("good", "v"), ("bad", INVALID)))
    dump = env.client.dump()
    assert dump["node"]["id"] == "n1"
    by_name = {c["name"]: c for c in dump["generic_xds_configs"]}
    assert by_name["good"]["client_status"] == "ACKED"
    assert by_name["good"]["version_info"] == "2"
    assert by_name["good"]["xds_config"]["@type"] == CDS
    assert by_name["good"]["xds_config"]["name"] == "good"
    assert by_name["good"]["last_updated"].endswith("Z")
    assert by_name["bad"]["client_status"] == "NACKED"
    assert by_name["bad"]["version_info"] == "1"
    assert by_name["bad"]["error_state"]["version_info"] == "2"
    assert "is not valid" in by_name["bad"]["error_state"]["details"]
    assert by_name["waiting"]["client_status"] == "REQUESTED"
    assert "xds_config" not in by_name["waiting"]
    proto = csds.client_config_proto(dump)  # the shape parses as the real proto
    assert len(proto.generic_xds_configs) == 3


def test_dump_shows_timeout_state(env, monkeypatch):
    monkeypatch.setenv(DATA_ERROR_HANDLING_ENV, "true")  # A88's guard
    client = env.client
    client.close()
    transports: list[FakeTransport] = []
    clock = FakeClock()
    client = XdsClient(
        make_bootstrap(resource_timer_is_transient_error=True),
        clock=clock,
        resource_types=TYPES,
        transport_factory=lambda ch: transports.append(FakeTransport(ch)) or transports[-1],
    )
    try:
        client.watch(EDS, "e", ThreadWatcher())
        transports[0].connected()
        clock.advance(30.0)
        (entry,) = client.dump()["generic_xds_configs"]
        assert entry["client_status"] == "TIMEOUT"
    finally:
        client.close()


def test_shared_client_is_refcounted_per_bootstrap():
    bootstrap = make_bootstrap()
    bootstrap_key = SimpleNamespace(xds_servers=bootstrap.xds_servers, node=None)
    a, release_a = XdsClient.get_or_create(bootstrap_key)
    b, release_b = XdsClient.get_or_create(bootstrap_key)
    assert a is b
    release_a()
    release_a()  # idempotent
    c, release_c = XdsClient.get_or_create(bootstrap_key)
    assert c is a
    release_b()
    release_c()
    d, release_d = XdsClient.get_or_create(bootstrap_key)
    assert d is not a
    release_d()


def real_bootstrap(port: int = 1, features: tuple[str, ...] = ()) -> dict:
    return {
        "xds_servers": [
            {
                "server_uri": f"127.0.0.1:{port}",
                "channel_creds": [{"type": "insecure"}],
                "server_features": list(features),
            }
        ],
        "node": {"id": "n"},
    }


def test_shared_client_per_equal_bootstrap_content():
    a, release_a = XdsClient.get_or_create(real_bootstrap())
    b, release_b = XdsClient.get_or_create(real_bootstrap())
    c, release_c = XdsClient.get_or_create(real_bootstrap(port=2))
    try:
        assert a is b
        assert c is not a
    finally:
        release_a()
        release_b()
        release_c()


def test_real_bootstrap_server_features_reach_the_ads_state(monkeypatch):
    monkeypatch.setenv(DATA_ERROR_HANDLING_ENV, "true")  # A88's guard
    transports: list[FakeTransport] = []
    clock = FakeClock()
    client = XdsClient(
        real_bootstrap(features=("resource_timer_is_transient_error",)),
        clock=clock,
        resource_types=TYPES,
        transport_factory=lambda ch: transports.append(FakeTransport(ch)) or transports[-1],
    )
    try:
        watcher = ThreadWatcher()
        client.watch(CDS, "c", watcher)
        transports[0].connected()
        clock.advance(RESOURCE_TIMEOUT + 1)
        assert watcher.calls == []
        clock.advance(15)
        assert watcher.wait()[0][1].code == grpc.StatusCode.UNAVAILABLE
        (request,) = transports[0].requests()
        assert request.node.id == "n"
    finally:
        client.close()


def test_xdstp_name_uses_its_authority_servers():
    config = real_bootstrap()
    config["authorities"] = {
        "other.example": {
            "xds_servers": [{"server_uri": "127.0.0.1:9", "channel_creds": [{"type": "insecure"}]}]
        }
    }
    transports: list[FakeTransport] = []
    client = XdsClient(
        config,
        clock=FakeClock(),
        resource_types=TYPES,
        transport_factory=lambda ch: transports.append(FakeTransport(ch)) or transports[-1],
    )
    try:
        client.watch(LDS, "plain", ThreadWatcher())
        client.watch(
            LDS, "xdstp://other.example/envoy.config.listener.v3.Listener/x", ThreadWatcher()
        )
        assert [t.channel.server.server_uri for t in transports] == ["127.0.0.1:1", "127.0.0.1:9"]
    finally:
        client.close()


class _FakeAdsCall:
    """A grpc.aio ADS call that yields nothing until cancelled (bounded wait)."""

    def __init__(self) -> None:
        self._cancelled = asyncio.Event()

    async def read(self):
        try:
            await asyncio.wait_for(self._cancelled.wait(), WAIT)
        except TimeoutError:
            pass
        return grpc.aio.EOF

    def cancel(self) -> bool:
        self._cancelled.set()
        return True

    async def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    async def details(self) -> str:
        return "cancelled"


class _FakeGrpcChannel:
    """Stands in for the grpc.aio channel the default transport creates."""

    def __init__(self) -> None:
        self.calls: list[_FakeAdsCall] = []
        self.closed = threading.Event()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.IDLE

    async def wait_for_state_change(self, state: grpc.ChannelConnectivity) -> None:
        await asyncio.sleep(WAIT)

    async def close(self, grace: float | None = None) -> None:
        self.closed.set()

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        def invoke(requests: Any, *a: Any, **kw: Any) -> _FakeAdsCall:
            call = _FakeAdsCall()
            self.calls.append(call)
            return call

        return invoke


@pytest.mark.parametrize("extra_options", [(), (("grpc.primary_user_agent", "app"),)])
def test_default_transport_opens_the_ads_channel_with_keepalive(monkeypatch, extra_options):
    """TRAPS grpc-rust#2744: the channel the XdsClient really creates to the
    control plane has keepalive (and a matching ping timeout), also when the
    application passes channel options of its own."""
    from pyxds.xds import transport as transport_module

    created: list[tuple[str, dict[str, Any], _FakeGrpcChannel]] = []

    def insecure_channel(target: str, options: Any = None, *args: Any, **kwargs: Any):
        channel = _FakeGrpcChannel()
        created.append((target, dict(options or ()), channel))
        return channel

    monkeypatch.setattr(transport_module.grpc.aio, "insecure_channel", insecure_channel)
    client = XdsClient(
        real_bootstrap(), clock=FakeClock(), resource_types=TYPES, channel_options=extra_options
    )
    try:
        client.watch(LDS, "a", ThreadWatcher())
        deadline = time.monotonic() + WAIT
        while not (created and created[0][2].calls) and time.monotonic() < deadline:
            time.sleep(0.01)  # the channel and the stream are made on the stream loop
        ((target, options, channel),) = created
        assert target == "127.0.0.1:1"
        assert len(channel.calls) == 1  # the ADS stream runs on this channel
        keepalive_ms = int(transport_module.KEEPALIVE_TIME * 1000)
        timeout_ms = int(transport_module.KEEPALIVE_TIMEOUT * 1000)
        assert options["grpc.keepalive_time_ms"] == keepalive_ms
        assert options["grpc.keepalive_timeout_ms"] == timeout_ms
        assert options["grpc.http2.ping_timeout_ms"] == timeout_ms
        for key, value in extra_options:
            assert options[key] == value
    finally:
        client.close()
    assert channel.closed.wait(WAIT)


def test_shared_clients_are_per_target_scope_and_dump_names_it():
    """A71: one XdsClient per data-plane target; CSDS ``client_scope`` (A40 as A71 amends)."""
    a, release_a = XdsClient.get_or_create(real_bootstrap(), "xds:///one")
    b, release_b = XdsClient.get_or_create(real_bootstrap(), "xds:///two")
    c, release_c = XdsClient.get_or_create(real_bootstrap(), "xds:///one")
    try:
        assert a is c and a is not b
        dump = a.dump()
        assert dump["client_scope"] == "xds:///one"
        assert csds.client_config_proto(dump).client_scope == "xds:///one"
    finally:
        release_a()
        release_b()
        release_c()


class _CyclicStreamCall:
    """Shaped like a ``grpc.aio`` stream call where it matters here: its
    response iterator and the call refer to each other (grpc.aio keeps the
    iterator on the call), so an iteration left suspended is a cycle."""

    def __init__(self, responses: list[Any]) -> None:
        self._responses = list(responses)
        self._iterator: Any = None

    def __aiter__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._fetch()
        return self._iterator

    async def _fetch(self) -> Any:
        while self._responses:
            yield self._responses.pop(0)

    async def read(self) -> Any:
        return self._responses.pop(0) if self._responses else grpc.aio.EOF

    def cancel(self) -> bool:
        return True

    async def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.OK

    async def details(self) -> str:
        return ""


@pytest.mark.parametrize("module", ["transport", "lrs_transport"])
def test_a_stream_reader_that_stops_early_leaves_its_call_to_reference_counting(module):
    """A stream's reader that stops at a response of a stream no longer
    current (closed or replaced) leaves nothing holding the call: C-core
    keeps a closed channel's connection open while a call object lives, and
    a call kept by a suspended response iterator (a cycle) lived until the
    cyclic GC ran (a control plane stopped meanwhile logged a GOAWAY)."""
    mod = importlib.import_module(f"pyxds.xds.{module}")
    kind = mod.AdsTransport if module == "transport" else mod.LrsTransport
    events: list[Any] = []
    if module == "transport":
        transport = kind(
            "127.0.0.1:9",
            None,
            on_connected=events.append,
            on_response=lambda *a: events.append(a),
            on_closed=lambda *a: events.append(a),
        )
    else:
        transport = kind(
            "127.0.0.1:9",
            None,
            on_response=lambda *a: events.append(a),
            on_closed=lambda *a: events.append(a),
        )
    gc.collect()
    gc.disable()
    try:
        call = _CyclicStreamCall([object(), object()])
        freed = weakref.ref(call)
        reader = transport._read(7, call)  # stream 7 is not current: stop at once
        del call
        asyncio.run_coroutine_threadsafe(reader, transport._loop).result(WAIT)
        del reader
        assert freed() is None
    finally:
        gc.enable()
        transport.close()
