"""Differential: an xDS route retry policy (gRFC A44 over A6) through pyxds
(sync and asyncio, unary and streaming) and through grpcio's C-core
``xds:///`` channel, same pyxds.server, same backends.

Two round_robin backends behind one cluster; one of them fails every RPC
with UNAVAILABLE.  A policy covering UNAVAILABLE loses no RPC (a retry is a
fresh pick, so it lands on the healthy backend); a policy that does not
cover it loses about half; server pushback "do not retry" loses about half;
retries carry ``grpc-previous-rpc-attempts``; a backoff longer than the
deadline ends the RPC at its deadline.

Both clients live for the whole module while the tests push one retry
policy after another, and a count is only meaningful under the policy the
test pushed: each push has a version of its own, and ``settled`` first waits
until that client (its own node id) ACKed it, then until both backends take
RPCs.  (Waiting only for both backends returned at once, still under the
previous test's policy, when the push was slow to arrive: a loaded machine
then counted the old policy's failures, or left round_robin on the wrong
backend for the ``grpc-previous-rpc-attempts`` counts.)"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import grpc
import pytest
from channel_fixtures import (
    LISTENER,
    SERVICE,
    TARGET,
    CoreXdsClient,
    pyxds_calls,
    route,
    snapshot,
    wait_until,
)
from ports import EXCLUSIVE

import pyxds._api as pyxds
import pyxds.aio
from pyxds.server import ManagementServer
from pyxds.server import builders as b

N = 60
NODE = "retry-differential"  # pyxds's channel
CORE_NODE = "retry-differential-core"  # C-core's
PUSH_WAIT = 30.0  # seconds a client may take to ACK a pushed policy (ends as soon as it does)
_pushes = itertools.count(1)


class RetryBackend:
    """A backend on 127.0.0.1: ``Who`` answers its name (or, when
    ``failing``, aborts UNAVAILABLE; request "pushback:V" adds trailing
    ``grpc-retry-pushback-ms: V`` (V1|V2: the header twice), "headers"
    sends response headers first, "code:NAME" aborts with status NAME;
    "pushback:V;code:NAME" both);
    ``Stream`` streams its name twice, ``Collect`` joins the requests and
    ``Chat`` answers each (or they abort); ``Ok`` always answers.  Counts
    the ``grpc-previous-rpc-attempts`` value of every RPC it sees ("" when
    absent)."""

    def __init__(self, name: str, failing: bool) -> None:
        self.name = name
        self.failing = failing
        self.previous: collections.Counter = collections.Counter()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[EXCLUSIVE])
        server.add_generic_rpc_handlers((self._handlers(),))
        self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _seen(self, context: grpc.ServicerContext) -> None:
        md = dict(context.invocation_metadata())
        self.previous[md.get("grpc-previous-rpc-attempts", "")] += 1

    def _maybe_fail(self, request: bytes, context: grpc.ServicerContext) -> None:
        if not self.failing:
            return
        text = request.decode()
        fields = dict(part.split(":", 1) for part in text.split(";") if ":" in part)
        if text == "headers":  # response headers first: the RPC commits
            context.send_initial_metadata((("x-sent", "headers"),))
        if "pushback" in fields:  # "pushback:V1|V2": one header per value
            values = fields["pushback"].split("|")
            context.set_trailing_metadata(tuple(("grpc-retry-pushback-ms", v) for v in values))
        if "code" in fields:  # "code:NAME": that status, its name in the message
            name = fields["code"]
            context.abort(grpc.StatusCode[name], f"{self.name} says {name}")
        context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name} is failing")

    def _handlers(self) -> grpc.GenericRpcHandler:
        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            self._seen(context)
            self._maybe_fail(request, context)
            return self.name.encode()

        def stream(request: bytes, context: grpc.ServicerContext):
            self._seen(context)
            self._maybe_fail(request, context)
            yield self.name.encode()
            yield self.name.encode()

        def ok(request: bytes, context: grpc.ServicerContext) -> bytes:
            self._seen(context)
            return self.name.encode()

        def collect(requests, context: grpc.ServicerContext) -> bytes:
            self._seen(context)
            got = [r.decode() for r in requests]
            self._maybe_fail(b"", context)
            return f"{self.name}:{','.join(got)}".encode()

        def chat(requests, context: grpc.ServicerContext):
            self._seen(context)
            got = [r.decode() for r in requests]
            self._maybe_fail(b"", context)
            for text in got:
                yield f"{self.name}:{text}".encode()

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Who": grpc.unary_unary_rpc_method_handler(who),
                "Stream": grpc.unary_stream_rpc_method_handler(stream),
                "Collect": grpc.stream_unary_rpc_method_handler(collect),
                "Chat": grpc.stream_stream_rpc_method_handler(chat),
                "Ok": grpc.unary_unary_rpc_method_handler(ok),
            },
        )

    def stop(self) -> None:
        self._server.stop(None).wait(5)


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def good():
    backend = RetryBackend("good", failing=False)
    yield backend
    backend.stop()


@pytest.fixture(scope="module")
def bad():
    backend = RetryBackend("bad", failing=True)
    yield backend
    backend.stop()


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id=CORE_NODE))
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(server):
    ch = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=NODE))
    yield ch
    ch.close()


def push_version(name: str) -> str:
    """A version no earlier push of this module had (``settled`` waits for its ACK)."""
    return f"{name}-{next(_pushes)}"


def configure(server, good, bad, policy, version: str) -> str:
    """Push ``policy`` on the route to cluster c; the pushed version."""
    version = push_version(version)
    server.set_snapshot(
        snapshot(
            [route(prefix="", cluster="c", retry_policy=policy)],
            {"c": [[good.address, bad.address]]},
            version=version,
        )
    )
    return version


def settled(channel_or_core, server, version: str, good, bad) -> None:
    """The client ACKed ``version`` of the route configuration, then both
    backends took RPCs (round_robin over both).  RPCs are made meanwhile: a
    new channel opens its ADS stream on its first RPC."""
    node = CORE_NODE if isinstance(channel_or_core, CoreXdsClient) else NODE

    def acked() -> bool:
        return any(r.version_info == version for r in server.acks("RDS", node_id=node))

    def settled_now() -> bool:
        was_acked = acked()
        before = sum(bad.previous.values()), sum(good.previous.values())
        # a short deadline: a policy with long backoffs (5 s) would hold each
        # RPC to the failing backend for its whole deadline
        if isinstance(channel_or_core, CoreXdsClient):
            channel_or_core.call(6, request="x", timeout=1.0)
        else:
            pyxds_calls(channel_or_core, 6, request="x", timeout=1.0)
        both = sum(bad.previous.values()) > before[0] and sum(good.previous.values()) > before[1]
        return was_acked and both

    assert wait_until(settled_now, PUSH_WAIT, interval=0.05), (version, server.acks("RDS"))


def failures(counts: collections.Counter) -> int:
    return sum(v for k, v in counts.items() if k.startswith("error:"))


def test_policy_covering_the_code_loses_no_rpc_like_c_core(server, good, bad, core, channel):
    version = configure(server, good, bad, b.retry_policy("unavailable", num_retries=3), "cover")
    settled(channel, server, version, good, bad)
    settled(core, server, version, good, bad)
    bad_before = sum(bad.previous.values())
    ours = pyxds_calls(channel, N)
    bad_during = sum(bad.previous.values()) - bad_before
    theirs = core.call(N)
    assert failures(theirs) == 0
    assert failures(ours) == 0, ours
    assert ours == collections.Counter({"good": N})
    assert bad_during > N // 4  # the failing backend was really picked and retried away


def test_virtual_host_policy_applies_to_routes_without_one_like_c_core(
    server, good, bad, core, channel
):
    """A44: a route without a retry_policy takes its virtual host's; a
    route's own policy replaces it."""

    def with_vhost_policy(route_policy, name: str) -> str:
        vhost_policy = b.retry_policy("unavailable", num_retries=3)
        return configure_vhost(
            server, [good.address, bad.address], route_policy, name, vhost_policy
        )

    version = with_vhost_policy(None, "vh-policy")
    settled(channel, server, version, good, bad)
    settled(core, server, version, good, bad)
    assert failures(pyxds_calls(channel, N)) == failures(core.call(N)) == 0
    version = with_vhost_policy(b.retry_policy("internal", num_retries=3), "route-policy")
    settled(channel, server, version, good, bad)
    settled(core, server, version, good, bad)
    ours, theirs = failures(pyxds_calls(channel, N)), failures(core.call(N))
    assert 0.3 * N <= ours <= 0.7 * N
    assert 0.3 * N <= theirs <= 0.7 * N


def test_retries_carry_previous_rpc_attempts_like_c_core(server, good, bad, core, channel):
    version = configure(server, good, bad, b.retry_policy("unavailable", num_retries=3), "cover")
    settled(channel, server, version, good, bad)
    good.previous.clear()
    bad.previous.clear()
    pyxds_calls(channel, N)
    ours = good.previous + bad.previous
    settled(core, server, version, good, bad)
    good.previous.clear()
    bad.previous.clear()
    core.call(N)
    theirs = good.previous + bad.previous
    # first attempts carry no header; retries say "1" (round_robin alternates
    # per pick: every first attempt fails on the bad backend, every retry
    # succeeds on the good one)
    assert ours == theirs == {"": N, "1": N}


def test_policy_not_covering_the_code_loses_about_half_like_c_core(
    server, good, bad, core, channel
):
    version = configure(
        server, good, bad, b.retry_policy("internal,cancelled", num_retries=3), "miss"
    )
    settled(channel, server, version, good, bad)
    settled(core, server, version, good, bad)
    ours = failures(pyxds_calls(channel, N))
    theirs = failures(core.call(N))
    assert 0.3 * N <= theirs <= 0.7 * N
    assert 0.3 * N <= ours <= 0.7 * N


def test_pushback_do_not_retry_loses_about_half_like_c_core(server, good, bad, core, channel):
    version = configure(server, good, bad, b.retry_policy("unavailable", num_retries=3), "pushback")
    settled(channel, server, version, good, bad)
    settled(core, server, version, good, bad)
    ours = failures(pyxds_calls(channel, N, request="pushback:-1"))
    theirs = failures(core.call(N, request="pushback:-1"))
    assert 0.3 * N <= theirs <= 0.7 * N
    assert 0.3 * N <= ours <= 0.7 * N
    # a pushback delay is honoured and the RPC then succeeds elsewhere
    start = time.monotonic()
    assert failures(pyxds_calls(channel, 4, request="pushback:200")) == 0
    assert time.monotonic() - start >= 0.2  # the retries waited 200 ms


def test_response_headers_commit_the_rpc_like_c_core(server, good, bad, core, channel):
    """A6 "When Retries are Valid": once response headers arrived the RPC is
    committed; the failure that follows is not retried."""
    version = configure(server, good, bad, b.retry_policy("unavailable", num_retries=3), "commit")
    settled(channel, server, version, good, bad)
    settled(core, server, version, good, bad)
    ours = failures(pyxds_calls(channel, N, request="headers"))
    theirs = failures(core.call(N, request="headers"))
    assert 0.3 * N <= theirs <= 0.7 * N
    assert 0.3 * N <= ours <= 0.7 * N


def test_backoff_past_the_deadline_ends_at_the_deadline_like_c_core(
    server, good, bad, core, channel
):
    version = configure(
        server,
        good,
        bad,
        b.retry_policy("unavailable", num_retries=4, base_interval=5, max_interval=5),
        "slow",
    )
    settled(channel, server, version, good, bad)
    settled(core, server, version, good, bad)
    # pushback 3 s on every failure: any retry waits past a 0.5 s deadline;
    # the RPC ends at its deadline without another pick, so round_robin
    # alternates: half succeed, half end with DEADLINE_EXCEEDED.
    start = time.monotonic()
    ours = pyxds_calls(channel, 4, timeout=0.5, request="pushback:3000", details=True)
    took = time.monotonic() - start
    theirs = core.call(4, timeout=0.5, request="pushback:3000", details=True)
    assert ours == theirs == {"error:DEADLINE_EXCEEDED: Deadline Exceeded": 2, "good": 2}
    assert took < 4 * 0.5 + 1.0  # never past the deadline


def configure_bad_only(server, bad, policy, version: str, vhost_policy=None) -> str:
    """Cluster c is the failing backend alone (C-core's xDS retry tests: one
    backend that answers every RPC with the status it is told); ``policy``
    on the route, ``vhost_policy`` on its virtual host."""
    return configure_vhost(server, [bad.address], policy, version, vhost_policy)


def configure_vhost(server, addresses, policy, version: str, vhost_policy=None) -> str:
    """Cluster c is ``addresses``; ``policy`` on the route to it,
    ``vhost_policy`` on its virtual host; the pushed version."""
    from pyxds.server.snapshot import Snapshot

    version = push_version(version)
    base = snapshot([], {"c": [addresses]}, version=version)
    vh = b.virtual_host(
        "vh",
        routes=[b.route(prefix="", cluster="c", retry_policy=policy)],
        retry_policy=vhost_policy,
    )
    server.set_snapshot(
        Snapshot(
            listeners=base.listeners,
            routes=[b.route_config(f"{LISTENER}-route", [vh])],
            clusters=base.clusters,
            endpoints=base.endpoints,
            version=version,
        )
    )
    return version


def settled_bad_only(channel_or_core, server, version: str, bad) -> None:
    """The client ACKed ``version`` and its RPCs reach the failing backend."""
    node = CORE_NODE if isinstance(channel_or_core, CoreXdsClient) else NODE

    def ready() -> bool:
        if not any(r.version_info == version for r in server.acks("RDS", node_id=node)):
            if isinstance(channel_or_core, CoreXdsClient):
                channel_or_core.call(1, request="x", timeout=1)
            else:
                pyxds_calls(channel_or_core, 1, request="x", timeout=1)
            return False
        before = sum(bad.previous.values())
        if isinstance(channel_or_core, CoreXdsClient):
            channel_or_core.call(1, request="code:UNAUTHENTICATED")
        else:
            pyxds_calls(channel_or_core, 1, request="code:UNAUTHENTICATED")
        return sum(bad.previous.values()) > before

    assert wait_until(ready, PUSH_WAIT, interval=0.05), (version, server.acks("RDS"))


def attempts_of(client, bad, request: str, timeout: float = 5.0) -> tuple[dict, dict]:
    """One RPC: (its outcome ``{"error:CODE: details": 1}``, the attempts the
    backend saw by ``grpc-previous-rpc-attempts`` value)."""
    bad.previous.clear()
    if isinstance(client, CoreXdsClient):
        outcome = client.call(1, request=request, timeout=timeout, details=True)
    else:
        outcome = pyxds_calls(client, 1, request=request, timeout=timeout, details=True)
    return dict(outcome), dict(bad.previous)


FOUR_ATTEMPTS = {"": 1, "1": 1, "2": 1, "3": 1}


def test_each_retry_on_code_is_retried_num_retries_times_like_c_core(server, bad, core, channel):
    """C-core xds_routing_end2end_test LdsRdsTest.XdsRetryPolicyNumRetries:
    every code A44 maps ("cancelled", "deadline-exceeded", "internal",
    "resource-exhausted", "unavailable"; "5xx" is ignored) is retried
    num_retries times, each RPC ending with the last attempt's status as the
    server gave it; a code not listed (UNAUTHENTICATED) is not retried."""
    policy = b.retry_policy(
        "5xx,cancelled,deadline-exceeded,internal,resource-exhausted,unavailable",
        num_retries=3,
        base_interval=0.01,
    )
    version = configure_bad_only(server, bad, policy, "codes")
    settled_bad_only(channel, server, version, bad)
    settled_bad_only(core, server, version, bad)
    for name in ("CANCELLED", "DEADLINE_EXCEEDED", "INTERNAL", "RESOURCE_EXHAUSTED", "UNAVAILABLE"):
        ours = attempts_of(channel, bad, f"code:{name}")
        theirs = attempts_of(core, bad, f"code:{name}")
        assert ours == theirs == ({f"error:{name}: bad says {name}": 1}, FOUR_ATTEMPTS), name
    ours = attempts_of(channel, bad, "code:UNAUTHENTICATED")
    theirs = attempts_of(core, bad, "code:UNAUTHENTICATED")
    assert ours == theirs == ({"error:UNAUTHENTICATED: bad says UNAUTHENTICATED": 1}, {"": 1})


def test_retry_on_words_are_matched_exactly_like_c_core(server, bad, core, channel):
    """A44 names the words of x-envoy-retry-grpc-on and says nothing of
    spaces or case; C-core (xds_route_config.cc RetryPolicyParse) splits
    ``retry_on`` on "," and compares each piece exactly, so " unavailable"
    and "UNAVAILABLE" retry nothing.  (grpc-go and grpc-java trim and
    lower-case each piece; pyxds follows C-core, which decides where the
    gRFC is silent.)"""
    policy = b.retry_policy("internal, unavailable,UNAVAILABLE", num_retries=3, base_interval=0.01)
    version = configure_bad_only(server, bad, policy, "words")
    settled_bad_only(channel, server, version, bad)
    settled_bad_only(core, server, version, bad)
    ours = attempts_of(channel, bad, "code:UNAVAILABLE")
    theirs = attempts_of(core, bad, "code:UNAVAILABLE")
    assert theirs == ({"error:UNAVAILABLE: bad says UNAVAILABLE": 1}, {"": 1})
    assert ours == theirs
    ours = attempts_of(channel, bad, "code:INTERNAL")
    theirs = attempts_of(core, bad, "code:INTERNAL")
    assert ours == theirs == ({"error:INTERNAL: bad says INTERNAL": 1}, FOUR_ATTEMPTS)


def test_route_policy_without_a_supported_code_retries_nothing_like_c_core(
    server, bad, core, channel
):
    """C-core LdsRdsTest.XdsRetryPolicyUnsupportedStatusCode and
    ...UnsupportedStatusCodeWithVirtualHostLevelRetry: a route policy whose
    ``retry_on`` has no code gRPC supports ("5xx") retries nothing, and it
    still replaces its virtual host's policy (A44: "If the resulting
    retryableStatusCodes is empty, gRPC xDS client will not include a retry
    policy in the corresponding route action")."""
    everything = "cancelled,deadline-exceeded,internal,resource-exhausted,unavailable"
    for vhost in (None, b.retry_policy(everything, num_retries=3, base_interval=0.01)):
        policy = b.retry_policy("5xx", num_retries=3, base_interval=0.01)
        version = configure_bad_only(server, bad, policy, "5xx", vhost_policy=vhost)
        settled_bad_only(channel, server, version, bad)
        settled_bad_only(core, server, version, bad)
        ours = attempts_of(channel, bad, "code:DEADLINE_EXCEEDED")
        theirs = attempts_of(core, bad, "code:DEADLINE_EXCEEDED")
        assert (
            ours == theirs == ({"error:DEADLINE_EXCEEDED: bad says DEADLINE_EXCEEDED": 1}, {"": 1})
        )


def test_long_back_off_leaves_time_for_one_retry_like_c_core(server, bad, core, channel):
    """C-core LdsRdsTest.XdsRetryPolicyLongBackOff: base_interval 1 s (max
    10x): the first retry waits 0.8-1.2 s, the second 1.6-2.4 s more (A6
    "Exponential Backoff", +-20 % jitter), so an RPC with a 2 s deadline has
    exactly two attempts, then DEADLINE_EXCEEDED.  (A wait drawn in [0,
    backoff], as pyxds did, gave a third attempt in ~3 RPCs out of 4.)"""
    policy = b.retry_policy("unavailable", num_retries=3, base_interval=1)
    version = configure_bad_only(server, bad, policy, "long")
    settled_bad_only(channel, server, version, bad)
    settled_bad_only(core, server, version, bad)
    want = ({"error:DEADLINE_EXCEEDED: Deadline Exceeded": 1}, {"": 1, "1": 1})
    for _ in range(2):
        assert attempts_of(channel, bad, "code:UNAVAILABLE", timeout=2.0) == want
        assert attempts_of(core, bad, "code:UNAVAILABLE", timeout=2.0) == want


def test_max_back_off_caps_every_wait_like_c_core(server, bad, core, channel):
    """C-core LdsRdsTest.XdsRetryPolicyMaxBackOff, with a deadline that
    separates capped from uncapped waits by more than a loaded machine's
    delays: base_interval = max_interval = 0.75 s, so every wait is 0.6-0.9 s
    and the fourth (last) attempt starts by 2.7 s, well before the 3.4 s
    deadline (all four fail: the last one's status); uncapped waits (0.75,
    1.5, 3 s, +-20 %) would start it at 4.2 s at the earliest, past the
    deadline.  (A 2.5 s deadline on 1 s waits put the third attempt 0.1 s
    before it at worst and a fourth attempt before it in ~0.3 % of RPCs.)"""
    policy = b.retry_policy("unavailable", num_retries=3, base_interval=0.75, max_interval=0.75)
    version = configure_bad_only(server, bad, policy, "max")
    settled_bad_only(channel, server, version, bad)
    settled_bad_only(core, server, version, bad)
    want = ({"error:UNAVAILABLE: bad says UNAVAILABLE": 1}, FOUR_ATTEMPTS)
    assert attempts_of(channel, bad, "code:UNAVAILABLE", timeout=3.4) == want
    assert attempts_of(core, bad, "code:UNAVAILABLE", timeout=3.4) == want


def test_future_and_streams_are_retried(server, good, bad, channel):
    version = configure(server, good, bad, b.retry_policy("unavailable", num_retries=3), "cover")
    settled(channel, server, version, good, bad)
    who = channel.unary_unary(f"/{SERVICE}/Who")
    assert [who.future(b"", timeout=5).result() for _ in range(8)] == [b"good"] * 8
    stream = channel.unary_stream(f"/{SERVICE}/Stream")
    for _ in range(8):
        assert list(stream(b"", timeout=5)) == [b"good", b"good"]


def test_client_streams_are_retried_with_their_requests_replayed(server, good, bad, channel):
    version = configure(server, good, bad, b.retry_policy("unavailable", num_retries=3), "cover")
    settled(channel, server, version, good, bad)
    collect = channel.stream_unary(f"/{SERVICE}/Collect")
    pulled = []

    def requests():
        for i in range(3):
            pulled.append(i)
            yield str(i).encode()

    for _ in range(6):
        pulled.clear()
        assert collect(requests(), timeout=5) == b"good:0,1,2"
        assert pulled == [0, 1, 2]  # the user's iterator is read once
    assert collect.future(iter([b"a", b"b"]), timeout=5).result() == b"good:a,b"


def test_aio_unary_and_stream_are_retried(server, good, bad):
    configure(server, good, bad, b.retry_policy("unavailable", num_retries=3), "cover")

    async def main() -> tuple[list[bytes], list[list[bytes]]]:
        async with pyxds.aio.insecure_channel(
            TARGET, bootstrap=server.bootstrap(node_id="retry-differential-aio")
        ) as ch:
            who = ch.unary_unary(f"/{SERVICE}/Who")
            # settle: both backends in the picker (the bad one gets picks)
            deadline = time.monotonic() + 15
            bad_before = sum(bad.previous.values())
            while sum(bad.previous.values()) < bad_before + 2 and time.monotonic() < deadline:
                await who(b"", timeout=5, wait_for_ready=True)
            unary = [await who(b"", timeout=5) for _ in range(20)]
            stream = ch.unary_stream(f"/{SERVICE}/Stream")
            streams = []
            for _ in range(6):
                streams.append([r async for r in stream(b"", timeout=5)])
            collect = ch.stream_unary(f"/{SERVICE}/Collect")
            for _ in range(4):
                assert await collect(iter([b"x", b"y"]), timeout=5) == b"good:x,y"
            return unary, streams

    unary, streams = asyncio.run(main())
    assert unary == [b"good"] * 20
    assert streams == [[b"good", b"good"]] * 6


def test_policy_not_covering_the_code_fails_aio_calls_too(server, good, bad):
    configure(server, good, bad, b.retry_policy("internal", num_retries=3), "miss")

    async def main() -> int:
        async with pyxds.aio.insecure_channel(
            TARGET, bootstrap=server.bootstrap(node_id="retry-differential-aio2")
        ) as ch:
            who = ch.unary_unary(f"/{SERVICE}/Who")
            failed = 0
            for _ in range(N):
                try:
                    await who(b"", timeout=5, wait_for_ready=True)
                except grpc.aio.AioRpcError as err:
                    assert err.code() is grpc.StatusCode.UNAVAILABLE
                    failed += 1
            return failed

    # the first RPCs may all go to one backend while the other connects
    assert 0.2 * N <= asyncio.run(main()) <= 0.7 * N


def service_config(codes: list[str]) -> dict:
    return {
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [
            {
                "name": [{"service": SERVICE}],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": codes,
                },
            }
        ],
    }


def settle_static(channel: grpc.Channel, good, bad) -> None:
    """Both backends connected (round_robin picks each)."""

    def both_seen() -> bool:
        before = sum(bad.previous.values()), sum(good.previous.values())
        pyxds_calls(channel, 6, request="x")
        return sum(bad.previous.values()) > before[0] and sum(good.previous.values()) > before[1]

    assert wait_until(both_seen, 15.0, interval=0.05)


@pytest.mark.parametrize(
    ("codes", "enable", "all_pass"),
    [
        (["UNAVAILABLE"], 1, True),
        (["INTERNAL", "CANCELLED"], 1, False),
        (["UNAVAILABLE"], 0, False),  # grpc.enable_retries=0: no retries at all
    ],
)
def test_ipv4_target_service_config_retries_as_grpcio_does(good, bad, codes, enable, all_pass):
    """service_config= on a non-xDS target: the same retryPolicy as grpcio's
    own channel given it as its grpc.service_config."""
    import json

    target = f"ipv4:{good.address},{bad.address}"
    sc = service_config(codes)
    flag = [("grpc.enable_retries", enable)]
    options = [("grpc.service_config", json.dumps(sc)), *flag]
    theirs_channel = grpc.insecure_channel(target, options=options)
    ours_channel = pyxds.insecure_channel(target, service_config=sc, options=flag)
    try:
        settle_static(theirs_channel, good, bad)
        settle_static(ours_channel, good, bad)
        good.previous.clear()
        bad.previous.clear()
        ours = pyxds_calls(ours_channel, N)
        seen_ours = good.previous + bad.previous
        good.previous.clear()
        bad.previous.clear()
        theirs = pyxds_calls(theirs_channel, N)
        seen_theirs = good.previous + bad.previous
    finally:
        ours_channel.close()
        theirs_channel.close()
    if all_pass:
        assert ours == theirs == {"good": N}
        assert seen_ours == seen_theirs == {"": N, "1": N}
    else:
        assert 0.3 * N <= failures(theirs) <= 0.7 * N
        assert 0.3 * N <= failures(ours) <= 0.7 * N


def test_aio_ipv4_target_service_config_retries(good, bad):
    target = f"ipv4:{good.address},{bad.address}"

    async def main() -> list[bytes]:
        async with pyxds.aio.insecure_channel(
            target, service_config=service_config(["UNAVAILABLE"])
        ) as ch:
            who = ch.unary_unary(f"/{SERVICE}/Who")
            deadline = time.monotonic() + 15
            bad_before = sum(bad.previous.values())
            while sum(bad.previous.values()) < bad_before + 2 and time.monotonic() < deadline:
                await who(b"", timeout=5, wait_for_ready=True)
            return [await who(b"", timeout=5) for _ in range(20)]

    assert asyncio.run(main()) == [b"good"] * 20


def test_retry_throttling_matches_grpcio(good, bad):
    """A6 retryThrottling: the same token bucket decisions as grpcio's own
    channel, RPC by RPC.  round_robin alternates per pick: while retries are
    allowed every RPC fails on the bad backend then succeeds on the good one;
    once the bucket is at or below half, RPCs alternate failing and
    succeeding.  (Warm-up RPCs succeed on both backends: a full bucket
    stays full.)"""
    import json

    target = f"ipv4:{good.address},{bad.address}"
    throttling = {"retryThrottling": {"maxTokens": 4, "tokenRatio": 0.5}}
    sc = {**service_config(["UNAVAILABLE"]), **throttling}
    theirs_channel = grpc.insecure_channel(
        target, options=[("grpc.service_config", json.dumps(sc))]
    )
    ours_channel = pyxds.insecure_channel(target, service_config=sc)

    def sequence(channel) -> list[str]:
        ok = channel.unary_unary(f"/{SERVICE}/Ok")
        seen_before = sum(bad.previous.values()), sum(good.previous.values())
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # both backends in the picker
            ok(b"", timeout=5, wait_for_ready=True)
            seen = sum(bad.previous.values()), sum(good.previous.values())
            if seen[0] > seen_before[0] + 1 and seen[1] > seen_before[1] + 1:
                break
        for _ in range(3):  # end on the good backend: the next pick is the bad one
            before = sum(good.previous.values())
            ok(b"", timeout=5)
            if sum(good.previous.values()) > before:
                break
        mc = channel.unary_unary(f"/{SERVICE}/Who")
        out = []
        for _ in range(30):
            try:
                out.append(mc(b"", timeout=5).decode())
            except grpc.RpcError as err:
                out.append(err.code().name)
        return out

    try:
        ours = sequence(ours_channel)
        theirs = sequence(theirs_channel)
    finally:
        ours_channel.close()
        theirs_channel.close()
    assert ours == theirs
    # retried while the bucket allowed it, then alternating
    assert ours[:2] == ["good", "good"] and "UNAVAILABLE" in ours


SERVICE_CONFIG = "grpc.service_config"


@contextlib.contextmanager
def channel_pair(target: str, sc: dict, options: Sequence[tuple[str, Any]] = ()):
    """pyxds's channel and grpcio's to ``target``, both given the service
    config ``sc`` (and ``options``); closed on the way out."""
    import json

    theirs = grpc.insecure_channel(target, options=[*options, (SERVICE_CONFIG, json.dumps(sc))])
    ours = pyxds.insecure_channel(target, options=list(options), service_config=sc)
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


def static_attempts(channel, bad, request: str) -> tuple[dict, dict]:
    """One RPC on a channel to ``ipv4:<bad>``: (outcome, attempts seen)."""
    bad.previous.clear()
    outcome = pyxds_calls(channel, 1, request=request, details=True)
    return dict(outcome), dict(bad.previous)


def test_pushback_given_twice_the_last_value_counts_like_c_core(bad):
    """A6 "Pushback" says nothing of a repeated ``grpc-retry-pushback-ms``;
    C-core's client keeps the last value (grpc-java's ``Metadata.get`` too),
    so "-1" then "10" is retried and "10" then "-1" is not.  (grpcio's
    transport already hands pyxds only the last value: this guards that it
    stays so, and ``pushback_of`` reads the last one as well.)"""
    import json

    target = f"ipv4:{bad.address}"
    sc = service_config(["UNAVAILABLE"])
    theirs_channel = grpc.insecure_channel(target, options=[(SERVICE_CONFIG, json.dumps(sc))])
    ours_channel = pyxds.insecure_channel(target, service_config=sc)
    try:
        for values, attempts in (("-1|10", 4), ("10|-1", 1), ("abc|10", 4), ("10|abc", 1)):
            request = f"pushback:{values}"
            ours = static_attempts(ours_channel, bad, request)
            theirs = static_attempts(theirs_channel, bad, request)
            assert ours == theirs, values
            assert sum(theirs[1].values()) == attempts, (values, theirs)
    finally:
        ours_channel.close()
        theirs_channel.close()


def test_do_not_retry_pushback_takes_a_token_though_c_core_does_not(bad):
    """A6 "Throttling Retry Attempts and Hedged RPCs": RPCs "that receive a
    pushback response indicating not to retry" count as failures, whatever
    their code (grpc-go and grpc-java count them).  maxTokens 4: three
    INTERNAL answers with pushback -1 take pyxds's bucket to 1, so the
    next UNAVAILABLE is not retried; grpcio 1.85's C-core counts pushback
    only with a retryable code, its bucket stays full and the UNAVAILABLE
    RPC is retried once (4 -> 3 -> 2) (docs/differences-from-c-core.md)."""
    import json

    target = f"ipv4:{bad.address}"
    sc = {
        **service_config(["UNAVAILABLE"]),
        "retryThrottling": {"maxTokens": 4, "tokenRatio": 0.25},
    }
    theirs_channel = grpc.insecure_channel(target, options=[(SERVICE_CONFIG, json.dumps(sc))])
    ours_channel = pyxds.insecure_channel(target, service_config=sc)
    try:
        seen = {}
        for name, ch in (("ours", ours_channel), ("theirs", theirs_channel)):
            static_attempts(ch, bad, "code:UNAUTHENTICATED")  # connected; takes no token
            for _ in range(3):
                assert static_attempts(ch, bad, "pushback:-1;code:INTERNAL")[1] == {"": 1}
            seen[name] = static_attempts(ch, bad, "code:UNAVAILABLE")
    finally:
        ours_channel.close()
        theirs_channel.close()
    failed = {"error:UNAVAILABLE: bad says UNAVAILABLE": 1}
    assert seen["ours"] == (failed, {"": 1})
    assert seen["theirs"] == (failed, {"": 1, "1": 1})


@pytest.mark.parametrize("code", ["unavailable", 14])
def test_status_code_forms_a6_allows_though_c_core_rejects_them(bad, code):
    """A6 "Validation of retryPolicy": status codes "in the integer form or
    the case-insensitive string form (eg. [14], ["UNAVAILABLE"] or
    ["unavailable"])".  pyxds retries by such a policy; grpcio 1.85's C-core
    rejects the whole service config and fails every RPC with
    INVALID_ARGUMENT (docs/differences-from-c-core.md)."""
    import json

    target = f"ipv4:{bad.address}"
    sc = service_config([code])
    theirs_channel = grpc.insecure_channel(target, options=[(SERVICE_CONFIG, json.dumps(sc))])
    ours_channel = pyxds.insecure_channel(target, service_config=sc)
    try:
        ours = static_attempts(ours_channel, bad, "code:UNAVAILABLE")
        theirs = static_attempts(theirs_channel, bad, "code:UNAVAILABLE")
    finally:
        ours_channel.close()
        theirs_channel.close()
    assert ours == ({"error:UNAVAILABLE: bad says UNAVAILABLE": 1}, FOUR_ATTEMPTS)
    ((outcome, _),) = theirs[0].items()
    assert outcome.startswith("error:INVALID_ARGUMENT") and "service config" in outcome
    assert theirs[1] == {}


RETRY = {
    "maxAttempts": 3,
    "initialBackoff": "0.01s",
    "maxBackoff": "0.01s",
    "backoffMultiplier": 1,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
THROTTLING = {"maxTokens": 10, "tokenRatio": 0.1}
_ABSENT = object()


def retry_variant(key: str, value) -> dict:
    """A service config whose retryPolicy (or, for ``retryThrottling.K``,
    throttling) has ``key`` set to ``value`` (``_ABSENT``: left out)."""
    if key.startswith("retryThrottling."):
        throttling = dict(THROTTLING)
        section, name = throttling, key.split(".", 1)[1]
    else:
        throttling = None
        section, name = dict(RETRY), key
    if value is _ABSENT:
        del section[name]
    else:
        section[name] = value
    sc: dict = {"methodConfig": [{"name": [{"service": SERVICE}]}]}
    if throttling is None:
        sc["methodConfig"][0]["retryPolicy"] = section
    else:
        sc["methodConfig"][0]["retryPolicy"] = RETRY
        sc["retryThrottling"] = throttling
    return sc


def verdicts(good, sc: dict) -> tuple[str, str]:
    """(pyxds's, C-core's) verdict on a service config: "accept" or "reject"
    (pyxds: ValueError at channel creation; C-core: its RPCs fail
    INVALID_ARGUMENT "errors validating service config")."""
    import json

    target = f"ipv4:{good.address}"
    try:
        pyxds.insecure_channel(target, service_config=sc).close()
        ours = "accept"
    except ValueError:
        ours = "reject"
    channel = grpc.insecure_channel(target, options=[(SERVICE_CONFIG, json.dumps(sc))])
    try:
        channel.unary_unary(f"/{SERVICE}/Ok")(b"", timeout=5)
        theirs = "accept"
    except grpc.RpcError as err:
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err
        assert "service config" in (err.details() or "")
        theirs = "reject"
    finally:
        channel.close()
    return ours, theirs


@pytest.mark.parametrize(
    ("key", "value", "verdict"),
    [
        ("maxAttempts", _ABSENT, "reject"),
        ("maxAttempts", 1, "reject"),  # A6: "greater than 1"
        ("maxAttempts", 6, "accept"),  # treated as 5
        ("maxAttempts", "2", "accept"),
        ("maxAttempts", 2.0, "reject"),  # not a JSON integer (pyxds accepted it)
        ("maxAttempts", 2.5, "reject"),
        ("maxAttempts", True, "reject"),
        ("initialBackoff", _ABSENT, "reject"),
        ("initialBackoff", "0s", "reject"),
        ("initialBackoff", "-1s", "reject"),
        ("initialBackoff", 1, "reject"),
        ("initialBackoff", "1", "reject"),
        ("initialBackoff", ".01s", "reject"),
        ("initialBackoff", "1.0000000001s", "reject"),
        ("initialBackoff", "315576000001s", "reject"),  # past proto3's range (pyxds accepted it)
        ("initialBackoff", "2s", "accept"),  # above maxBackoff: A6 does not forbid it
        ("perAttemptRecvTimeout", "1s", "accept"),  # hedging's (C-core: ignored without it)
        ("perAttemptRecvTimeout", "x", "accept"),
        ("noSuchField", 1, "accept"),
        ("maxBackoff", _ABSENT, "reject"),
        ("maxBackoff", "0s", "reject"),
        ("backoffMultiplier", _ABSENT, "reject"),
        ("backoffMultiplier", 0, "reject"),
        (
            "backoffMultiplier",
            "2",
            "accept",
        ),  # proto3 JSON: a number as a string (pyxds rejected it)
        ("backoffMultiplier", "abc", "reject"),
        ("backoffMultiplier", 1e-9, "accept"),
        ("retryableStatusCodes", _ABSENT, "reject"),
        ("retryableStatusCodes", [], "reject"),
        ("retryableStatusCodes", "UNAVAILABLE", "reject"),
        ("retryableStatusCodes", ["NOPE"], "reject"),
        ("retryableStatusCodes", ["OK", "DATA_LOSS"], "accept"),
        ("retryThrottling.maxTokens", _ABSENT, "reject"),
        ("retryThrottling.maxTokens", 0, "reject"),
        ("retryThrottling.maxTokens", 1000, "accept"),
        ("retryThrottling.maxTokens", "10", "accept"),
        ("retryThrottling.maxTokens", 10.0, "reject"),  # not a JSON integer (pyxds accepted it)
        ("retryThrottling.tokenRatio", _ABSENT, "reject"),
        ("retryThrottling.tokenRatio", 0, "reject"),
        ("retryThrottling.tokenRatio", "0.5", "accept"),  # (pyxds rejected it)
        (
            "retryThrottling.tokenRatio",
            0.0004,
            "reject",
        ),  # 0 once decimals past 3 go (pyxds took it)
        ("retryThrottling.tokenRatio", 0.001, "accept"),
    ],
)
def test_retry_policy_validation_like_c_core(good, key, value, verdict):
    """A6 "Validation of retryPolicy" / "Validation of retryThrottling", case
    by case against grpcio 1.85's C-core given the same service config
    (C-core retry_service_config_test covers the same fields).  Where A6 is
    silent C-core decides: numbers may be strings (proto3 JSON mapping), a
    number with a fraction is not an integer, durations stay in proto3's
    range."""
    assert verdicts(good, retry_variant(key, value)) == (verdict, verdict)


@pytest.mark.parametrize(
    "case",
    ["initialBackoff 1 ns", "maxTokens 1001", "retryPolicy and hedgingPolicy"],
)
def test_retry_policy_validation_a6_decides_though_c_core_differs(good, case):
    """Explicit A6 rules grpcio 1.85's C-core does not keep; pyxds follows
    A6 (docs/differences-from-c-core.md): a backoff of 1 ns is "greater than
    0" (C-core rounds it to 0 ms and rejects it); maxTokens "in the range
    (0, 1000]" (C-core takes 1001); "Only one of retryPolicy or
    hedgingPolicy may be set" (C-core takes both and ignores hedging)."""
    if case == "initialBackoff 1 ns":
        sc, ours, theirs = retry_variant("initialBackoff", "0.000000001s"), "accept", "reject"
    elif case == "maxTokens 1001":
        sc, ours, theirs = retry_variant("retryThrottling.maxTokens", 1001), "reject", "accept"
    else:
        sc = retry_variant("maxAttempts", 2)
        sc["methodConfig"][0]["hedgingPolicy"] = {"maxAttempts": 2}
        ours, theirs = "reject", "accept"
    assert verdicts(good, sc) == (ours, theirs)


def test_a_request_past_the_retry_buffer_commits_the_rpc_like_c_core(bad):
    """A6 "When Retries are Valid": an RPC commits once "the client's
    outgoing message has overflowed the gRPC client library's buffer", and
    "for unary and server streaming calls, the outgoing message is a single
    message" (C-core retry_exceeds_buffer_size_in_initial_batch.cc).  With
    ``grpc.per_rpc_retry_buffer_size`` 1000, byte for byte at the edge as
    grpcio 1.85's C-core counts it: the request plus each header, name +
    value + 32 (``:path``, the application's metadata, ``grpc-timeout``),
    for a client stream's requests too.  pyxds retried every such
    single-request RPC before, and counted a client stream's requests
    alone."""
    import json

    target = f"ipv4:{bad.address}"
    sc = json.dumps(service_config(["UNAVAILABLE"]))
    options = [("grpc.per_rpc_retry_buffer_size", 1000)]
    path = f"/{SERVICE}/Who"
    metadata = (("k" * 10, "v" * 20),)
    edge = 1000 - (len(":path") + len(path) + 32)  # largest request still kept
    # C-core writes grpc-timeout in 10 ms steps and as whole seconds when the
    # step count is a multiple of 100: a 5.0 s deadline is "5S" (2 characters)
    # when under 10 ms passed before the headers, else "4990m" (5): the edge
    # moved with the machine's load.  Nearly 4.955 s is "49x0m" either way.
    DEADLINE = 4.955
    cases = [
        (edge, None, None, 4),
        (edge + 1, None, None, 1),
        (edge - 62, metadata, None, 4),  # 10 + 20 + 32
        (edge - 61, metadata, None, 1),
        (edge - 49, None, DEADLINE, 4),  # grpc-timeout: 12 + 5 + 32
        (edge - 48, None, DEADLINE, 1),
    ]
    theirs_channel = grpc.insecure_channel(target, options=[*options, (SERVICE_CONFIG, sc)])
    ours_channel = pyxds.insecure_channel(target, options=options, service_config=sc)

    def attempts(channel, size: int, md, timeout) -> int:
        bad.previous.clear()
        with pytest.raises(grpc.RpcError):
            channel.unary_unary(path)(b"x" * size, timeout=timeout, metadata=md)
        return sum(bad.previous.values())

    try:
        for size, md, timeout, want in cases:
            ours = attempts(ours_channel, size, md, timeout)
            theirs = attempts(theirs_channel, size, md, timeout)
            assert (ours, theirs) == (want, want), (size, md, timeout)
        # a client stream: its requests count with its headers the same way
        collect = f"/{SERVICE}/Collect"
        stream_edge = 1000 - (len(":path") + len(collect) + 32)
        for total, timeout, want in (
            (stream_edge, None, 4),
            (stream_edge + 1, None, 1),
            (stream_edge - 49, DEADLINE, 4),
            (stream_edge - 48, DEADLINE, 1),
        ):
            for channel in (ours_channel, theirs_channel):
                bad.previous.clear()
                halves = [b"x" * (total // 2), b"x" * (total - total // 2)]
                with pytest.raises(grpc.RpcError):
                    channel.stream_unary(collect)(iter(halves), timeout=timeout)
                got = sum(bad.previous.values())
                assert got == want, (channel is ours_channel, total, timeout)
        # the other call kinds with one request: future() (sent serialized)
        # and a response stream
        for size, want in ((edge, 4), (edge + 1, 1)):
            bad.previous.clear()
            with pytest.raises(grpc.RpcError):
                ours_channel.unary_unary(path).future(b"x" * size).result()
            assert sum(bad.previous.values()) == want
            bad.previous.clear()
            with pytest.raises(grpc.RpcError):
                list(ours_channel.unary_stream(f"/{SERVICE}/Stream")(b"x" * (size - 3)))
            assert sum(bad.previous.values()) == want
    finally:
        ours_channel.close()
        theirs_channel.close()


def test_aio_request_past_the_retry_buffer_commits_the_rpc(bad):
    """The same rule on grpc.aio (pyxds.aio): 300 KiB against the default
    256 KiB buffer is not retried, 1 KiB is."""
    target = f"ipv4:{bad.address}"

    async def main() -> list[int]:
        seen = []
        async with pyxds.aio.insecure_channel(
            target, service_config=service_config(["UNAVAILABLE"])
        ) as ch:
            who = ch.unary_unary(f"/{SERVICE}/Who")
            for size in (1024, 300 * 1024):
                bad.previous.clear()
                with pytest.raises(grpc.aio.AioRpcError):
                    await who(b"x" * size, timeout=5)
                seen.append(sum(bad.previous.values()))
        return seen

    assert asyncio.run(main()) == [4, 1]


def test_retries_disabled_on_the_channel_ignore_the_xds_policy(server, bad):
    """A44 "Workflow of xDS Retry": "If the application disables retries for
    the channel via the gRPC API, then the retry config from xDS will be
    validated as described above but will not actually be used" (A6
    "Disabling Retries"; grpc.enable_retries=0, as C-core's channel arg):
    a route policy covering UNAVAILABLE, one attempt; a bad policy is still
    NACKed."""
    node = "retry-differential-disabled"
    policy = b.retry_policy("unavailable", num_retries=3, base_interval=0.01)
    version = configure_bad_only(server, bad, policy, "disabled")
    ch = pyxds.insecure_channel(
        TARGET, bootstrap=server.bootstrap(node_id=node), options=[("grpc.enable_retries", 0)]
    )
    try:

        def acked(v: str) -> bool:
            pyxds_calls(ch, 1, request="code:UNAUTHENTICATED", timeout=1)
            return any(r.version_info == v for r in server.acks("RDS", node_id=node))

        assert wait_until(lambda: acked(version), PUSH_WAIT, interval=0.05)
        assert attempts_of(ch, bad, "code:UNAVAILABLE") == (
            {"error:UNAVAILABLE: bad says UNAVAILABLE": 1},
            {"": 1},
        )
        invalid = b.retry_policy("unavailable", num_retries=0)  # A44: must be at least 1
        rejected = configure_bad_only(server, bad, invalid, "disabled-invalid")

        def nacked() -> bool:
            pyxds_calls(ch, 1, request="code:UNAUTHENTICATED", timeout=1)
            return any(
                r.rejected_version == rejected and "num_retries" in r.error_message
                for r in server.nacks("RDS", node_id=node)
            )

        assert wait_until(nacked, PUSH_WAIT, interval=0.05), rejected
    finally:
        ch.close()


def test_each_channel_has_its_own_token_bucket_like_c_core(bad):
    """A6 "Throttling": "The throttling is done per server name".  grpcio
    1.85's C-core keeps one bucket per channel (seen live: a second channel
    to the same target starts full), and so does pyxds.  maxTokens 6,
    maxAttempts 4: the first RPC fails 3 times (6 -> 3), the second once
    (3 is not above 3); a second channel still retries."""
    import json

    target = f"ipv4:{bad.address}"
    sc = {**service_config(["UNAVAILABLE"]), "retryThrottling": {"maxTokens": 6, "tokenRatio": 0.1}}
    sc["methodConfig"][0]["retryPolicy"]["maxAttempts"] = 3

    def channels(kind: str):
        if kind == "theirs":
            return [
                grpc.insecure_channel(target, options=[(SERVICE_CONFIG, json.dumps(sc))])
                for _ in range(2)
            ]
        return [pyxds.insecure_channel(target, service_config=sc) for _ in range(2)]

    for kind in ("ours", "theirs"):
        first, second = channels(kind)
        try:
            seen = [static_attempts(first, bad, "code:UNAVAILABLE")[1] for _ in range(2)]
            seen.append(static_attempts(second, bad, "code:UNAVAILABLE")[1])
        finally:
            first.close()
            second.close()
        assert [sum(s.values()) for s in seen] == [3, 1, 3], kind


def test_previous_attempts_is_not_added_to_the_response_headers_like_c_core(good, bad):
    """A6 "Exposed Retry Metadata": the client "may also set this entry in
    the received initial metadata"; grpcio 1.85's C-core does not, nor does
    pyxds: a retried RPC shows the application the headers of the attempt
    that answered, unchanged."""
    target = f"ipv4:{good.address},{bad.address}"
    with channel_pair(target, service_config(["UNAVAILABLE"])) as (ours_channel, theirs_channel):
        seen = {}
        for name, ch in (("ours", ours_channel), ("theirs", theirs_channel)):
            settle_static(ch, good, bad)
            headers = []
            good.previous.clear()
            for _ in range(4):  # round_robin: some of them fail on bad first
                reply, call = ch.unary_unary(f"/{SERVICE}/Who").with_call(b"", timeout=5)
                assert reply == b"good"
                headers.append(tuple(call.initial_metadata() or ()))
            assert good.previous["1"] >= 1, good.previous  # some were retries
            seen[name] = headers
    assert seen["ours"] == seen["theirs"]
    assert not any(k == "grpc-previous-rpc-attempts" for h in seen["ours"] for k, _ in h)


RETRIED = ("UNAVAILABLE", 4)  # every attempt failed, each retried
STOPPED = ("UNAVAILABLE", 1)  # pushback said "do not retry"
WAITED = ("DEADLINE_EXCEEDED", 1)  # the retry would come after the deadline


def pushback_outcome(channel, bad, value: str) -> tuple[str, int]:
    bad.previous.clear()
    try:
        channel.unary_unary(f"/{SERVICE}/Who")(
            f"pushback:{value};code:UNAVAILABLE".encode(), timeout=1.0
        )
        code = "OK"
    except grpc.RpcError as err:
        code = err.code().name
    return code, sum(bad.previous.values())


def both_pushback_outcomes(bad, value: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """(pyxds's, C-core's) outcome of one RPC answered with pushback ``value``
    (``ipv4:<bad>``, the module's retryPolicy on UNAVAILABLE)."""
    import json

    target = f"ipv4:{bad.address}"
    sc = service_config(["UNAVAILABLE"])
    theirs_channel = grpc.insecure_channel(target, options=[(SERVICE_CONFIG, json.dumps(sc))])
    ours_channel = pyxds.insecure_channel(target, service_config=sc)
    try:
        return pushback_outcome(ours_channel, bad, value), pushback_outcome(
            theirs_channel, bad, value
        )
    finally:
        ours_channel.close()
        theirs_channel.close()


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("10", RETRIED),
        ("+10", RETRIED),  # grpcio's transport reads the header as a number
        ("010", RETRIED),  # before the application (pyxds) sees it
        (" 10", RETRIED),
        ("2147483647", WAITED),  # the largest signed 32-bit value: ~24 days
        ("-1", STOPPED),
        ("-2147483649", STOPPED),
        ("", STOPPED),
        ("1e3", STOPPED),
        ("0x10", STOPPED),
    ],
)
def test_pushback_values_like_c_core(bad, value, want):
    """A6 "Pushback": "an ASCII encoded signed 32-bit integer ... If the
    value for pushback is negative or unparseable, then it will be seen as
    the server asking the client not to retry at all", else "retry after
    exactly that delay"; value by value against grpcio 1.85's C-core
    (C-core retry_server_pushback_delay.cc, ..._disabled.cc)."""
    ours, theirs = both_pushback_outcomes(bad, value)
    assert (ours, theirs) == (want, want)


@pytest.mark.parametrize(
    ("value", "ours_want", "theirs_want"),
    [("0", RETRIED, WAITED), ("2147483648", STOPPED, WAITED), ("99999999999", STOPPED, WAITED)],
)
def test_pushback_a6_decides_though_c_core_differs(bad, value, ours_want, theirs_want):
    """Where grpcio 1.85's C-core does not keep A6 "Pushback" and pyxds does
    (docs/differences-from-c-core.md): "0" is a retry "after exactly that
    delay", at once (C-core makes no second attempt and the RPC waits out
    its deadline); a value past a signed 32-bit integer is unparseable, "do
    not retry" (C-core waits for it: the deadline comes first)."""
    ours, theirs = both_pushback_outcomes(bad, value)
    assert (ours, theirs) == (ours_want, theirs_want)


def test_successes_of_any_method_refill_the_bucket_though_c_core_does_not(good, bad):
    """A6 "Throttling": "Every outgoing RPC (regardless of service or method
    invoked) will effect token_count ... Every successful RPC will increment
    the token_count by tokenRatio" (grpc-go and grpc-java count every RPC).
    maxTokens 4, tokenRatio 1, maxAttempts 2 on Who only: two failing Who
    RPCs take the bucket to 1; three successful Ok RPCs (no retry policy)
    refill it for pyxds, so the next Who is retried; grpcio 1.85's C-core
    counts successes of RPCs with a retry policy only and does not retry it
    (docs/differences-from-c-core.md)."""
    import json

    sc = {
        "methodConfig": [
            {
                "name": [{"service": SERVICE, "method": "Who"}],
                "retryPolicy": {
                    "maxAttempts": 2,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.01s",
                    "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
        "retryThrottling": {"maxTokens": 4, "tokenRatio": 1},
    }
    target = f"ipv4:{bad.address}"  # Ok always answers, Who always fails
    seen = {}
    for kind in ("ours", "theirs"):
        if kind == "ours":
            ch = pyxds.insecure_channel(target, service_config=sc)
        else:
            ch = grpc.insecure_channel(target, options=[(SERVICE_CONFIG, json.dumps(sc))])
        try:
            drained = [
                sum(static_attempts(ch, bad, "code:UNAVAILABLE")[1].values()) for _ in range(2)
            ]
            for _ in range(3):
                ch.unary_unary(f"/{SERVICE}/Ok")(b"", timeout=5)
            after = sum(static_attempts(ch, bad, "code:UNAVAILABLE")[1].values())
        finally:
            ch.close()
        seen[kind] = (drained, after)
    assert seen == {"ours": ([2, 1], 2), "theirs": ([2, 1], 1)}


def test_aio_written_requests_are_replayed_to_a_retry_like_c_core(good, bad):
    """A6 "Memory Management (Buffering)": for client streams "the outgoing
    message is the entire message stream", kept and replayed to a retry
    while it fits the buffer, however the application sends it.  grpc.aio's
    C-core channel retries a call fed by ``write()`` / ``done_writing()``;
    pyxds.aio committed such a call at its first ``write()`` (no retry).
    round_robin over a failing and a working backend: every call succeeds
    with all its requests, some after a retry."""
    import json

    target = f"ipv4:{good.address},{bad.address}"
    sc = service_config(["UNAVAILABLE"])

    async def run(ch) -> list:
        out: list = []
        collect = ch.stream_unary(f"/{SERVICE}/Collect")
        chat = ch.stream_stream(f"/{SERVICE}/Chat")
        for _ in range(6):
            call = collect(timeout=5, wait_for_ready=True)
            await call.write(b"a")
            await call.write(b"b")
            await call.done_writing()
            out.append(await call)
        for _ in range(4):
            call = chat(timeout=5, wait_for_ready=True)
            await call.write(b"x")
            await call.done_writing()
            out.append([r async for r in call])
        return out

    async def main() -> dict:
        seen = {}
        for kind in ("ours", "theirs"):
            if kind == "ours":
                ch = pyxds.aio.insecure_channel(target, service_config=sc)
            else:
                ch = grpc.aio.insecure_channel(target, options=[(SERVICE_CONFIG, json.dumps(sc))])
            async with ch:
                bad.previous.clear()
                seen[kind] = (await run(ch), sum(bad.previous.values()))
        return seen

    seen = asyncio.run(main())
    want = [b"good:a,b"] * 6 + [[b"good:x"]] * 4
    assert seen["ours"][0] == seen["theirs"][0] == want
    assert seen["ours"][1] > 0 and seen["theirs"][1] > 0  # the bad backend was tried


def test_aio_written_requests_past_the_buffer_commit_like_c_core(bad):
    """The written requests count against ``grpc.per_rpc_retry_buffer_size``
    as an iterator's do: 2 x 600 bytes past a 1000-byte buffer, one attempt;
    2 x 300, retried (4 attempts), for pyxds.aio and grpc.aio alike."""
    import json

    target = f"ipv4:{bad.address}"
    sc = service_config(["UNAVAILABLE"])
    options = [("grpc.per_rpc_retry_buffer_size", 1000)]

    async def attempts(ch, size: int) -> int:
        bad.previous.clear()
        call = ch.stream_unary(f"/{SERVICE}/Collect")(timeout=5)
        await call.write(b"x" * size)
        await call.write(b"x" * size)
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        return sum(bad.previous.values())

    async def main() -> dict:
        seen = {}
        for kind in ("ours", "theirs"):
            if kind == "ours":
                ch = pyxds.aio.insecure_channel(target, options=options, service_config=sc)
            else:
                ch = grpc.aio.insecure_channel(
                    target, options=[*options, (SERVICE_CONFIG, json.dumps(sc))]
                )
            async with ch:
                seen[kind] = [await attempts(ch, 600), await attempts(ch, 300)]
        return seen

    assert asyncio.run(main()) == {"ours": [1, 4], "theirs": [1, 4]}


def test_aio_write_api_rules_like_grpc_aio(good):
    """The write() / done_writing() surface keeps grpc.aio's rules now that
    written requests are kept for a retry: no write after done_writing() or
    after the call ended or was cancelled (InvalidStateError, grpc.aio's
    words), done_writing() twice is a no-op, write() and read() interleave
    on a stream, write() on a call given a request iterator is grpc.aio's
    UsageError."""
    target = f"ipv4:{good.address}"

    async def probe(ch) -> list:
        out: list = []

        async def attempt(label: str, coro) -> None:
            try:
                await coro
            except Exception as err:
                out.append((label, type(err).__name__, str(err)))

        collect = ch.stream_unary(f"/{SERVICE}/Collect")
        call = collect(timeout=5)
        await call.write(b"a")
        await call.done_writing()
        await attempt("after done_writing", call.write(b"b"))
        out.append(await call)
        await attempt("after the end", call.write(b"c"))
        await call.done_writing()
        chat = ch.stream_stream(f"/{SERVICE}/Chat")
        call = chat(timeout=5)
        await call.write(b"1")
        await call.done_writing()
        out.append([await call.read(), await call.read() is grpc.aio.EOF])
        call = collect(iter([b"z"]), timeout=5)
        await attempt("with an iterator", call.write(b"y"))
        out.append(await call)
        call = collect(timeout=5)
        call.cancel()
        await attempt("cancelled", call.write(b"y"))
        return out

    async def main() -> tuple[list, list]:
        async with pyxds.aio.insecure_channel(target) as ours:
            mine = await probe(ours)
        async with grpc.aio.insecure_channel(target) as theirs:
            return mine, await probe(theirs)

    ours, theirs = asyncio.run(main())
    assert ours == theirs
    assert [o[0] for o in ours if isinstance(o, tuple)] == [
        "after done_writing",
        "after the end",
        "with an iterator",
        "cancelled",
    ]


def test_sync_bidi_streams_are_retried_with_their_requests_replayed_like_c_core(good, bad):
    """grpc-go retry_test.go TestRetryStreaming "Multiple requests": a
    bidirectional stream that fails before any response is retried with its
    requests replayed (the iterator read once), as grpcio's C-core does."""
    target = f"ipv4:{good.address},{bad.address}"
    with channel_pair(target, service_config(["UNAVAILABLE"])) as (ours_channel, theirs_channel):
        seen = {}
        for name, ch in (("ours", ours_channel), ("theirs", theirs_channel)):
            settle_static(ch, good, bad)
            bad.previous.clear()
            pulled: list[int] = []

            def requests(pulled=pulled):
                for i in range(3):
                    pulled.append(i)
                    yield str(i).encode()

            chat = ch.stream_stream(f"/{SERVICE}/Chat")
            answers = [list(chat(requests(), timeout=5)) for _ in range(4)]
            seen[name] = (answers, len(pulled), sum(bad.previous.values()) > 0)
    want = ([[b"good:0", b"good:1", b"good:2"]] * 4, 12, True)
    assert seen == {"ours": want, "theirs": want}
