"""The channel's call path with an RPC's retry policy and filter verdicts,
over fakes (no sockets): attempts re-pick and report to the LB policy once
each, retries carry grpc-previous-rpc-attempts, the policy is the RPC's own
across a config change (A31), fault verdicts run before the pick (A33)."""

from __future__ import annotations

import random

import grpc
import pytest
from test_channel_picks import CountingPicker, Selector, ready_subchannel
from test_channel_support import FakeGrpcError, FnMethod, Harness, new_rpc, run_blocking

from pyxds.lb.api import Endpoint, PickComplete, PickDrop, Picker, PickFail, Status
from pyxds.resolver.api import CallConfig
from pyxds.resolver.fault_filter import FaultConfig, FaultInjector, _ActiveFaults
from pyxds.resolver.retry_policy import RetryPolicy
from pyxds.server import builders as b

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
POLICY = RetryPolicy.from_xds(("unavailable",), 3, 0.001, 0.002)


@pytest.fixture
def h():
    harness = Harness()
    harness.start()
    harness.resolve(
        [Endpoint(("10.0.0.1:80",))],
        Selector(CallConfig(call_attributes={"cluster": "c1"}, retry_policy=POLICY)),
    )
    yield harness
    harness.core.close()


def tracking(h, done):
    sub = ready_subchannel(h)

    class Tracking(Picker):
        calls = 0

        def pick(self, args):
            Tracking.calls += 1
            return PickComplete(sub, lambda status: done.append(status.code))

    picker = Tracking()
    h.publish(picker)
    return picker, h.transports.last("10.0.0.1:80")


def invoke_for(rpc):
    def invoke(t, remaining):
        return t.channel.unary_unary("/svc/M").with_call(b"req", metadata=rpc.send_metadata)

    return invoke


def test_each_attempt_is_a_fresh_pick_reported_once_with_previous_attempts(h):
    done = []
    picker, transport = tracking(h, done)
    transport.fail_with = [FakeGrpcError(UNAVAILABLE, "down"), FakeGrpcError(UNAVAILABLE, "down")]
    rpc = new_rpc(h.core, "/svc/M", [("k", "v")], 5.0, False)
    run_blocking(rpc, invoke_for(rpc))
    assert picker.calls == 3
    assert done == [UNAVAILABLE, UNAVAILABLE, grpc.StatusCode.OK]
    sent = [kwargs["metadata"] for _, _, kwargs in transport.calls]
    assert sent == [
        (("k", "v"),),  # the pairs as the RPC read them (an iterator is read once)
        (("k", "v"), ("grpc-previous-rpc-attempts", "1")),
        (("k", "v"), ("grpc-previous-rpc-attempts", "2")),
    ]


def test_attempts_stop_at_max_attempts(h):
    done = []
    _, transport = tracking(h, done)
    transport.fail_with = [FakeGrpcError(UNAVAILABLE, "down") for _ in range(10)]
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    with pytest.raises(grpc.RpcError):
        run_blocking(rpc, invoke_for(rpc))
    assert len(transport.calls) == 4  # num_retries 3 -> 4 attempts
    assert done == [UNAVAILABLE] * 4


def test_code_outside_the_policy_is_not_retried(h):
    _, transport = tracking(h, [])
    transport.fail_with = [FakeGrpcError(grpc.StatusCode.INTERNAL, "bug")]
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    with pytest.raises(grpc.RpcError):
        run_blocking(rpc, invoke_for(rpc))
    assert len(transport.calls) == 1


def test_the_policy_stays_the_rpcs_across_a_config_change(h):
    """A31: the ConfigSelector result belongs to the call."""
    _, transport = tracking(h, [])
    no_retry = Selector(CallConfig(call_attributes={"cluster": "c1"}))
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    inner = invoke_for(rpc)

    def invoke(t, remaining):
        h.core.selector = no_retry  # a new config while the RPC runs
        return inner(t, remaining)

    transport.fail_with = [FakeGrpcError(UNAVAILABLE, "down")]
    run_blocking(rpc, invoke)
    assert len(transport.calls) == 2
    assert no_retry.calls == 0


def fault(**kwargs) -> tuple[FaultInjector, ...]:
    cfg = FaultConfig.parse(b.fault_config(**kwargs).SerializeToString())
    return (FaultInjector(cfg, _ActiveFaults()),)


def test_fault_abort_fails_before_the_pick(h):
    picker = CountingPicker(None)
    h.publish(picker)
    h.core.selector = Selector(CallConfig(filters=fault(abort_grpc_status=14, abort_percent=100)))
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    with pytest.raises(grpc.RpcError) as info:
        run_blocking(rpc, invoke_for(rpc))
    assert (info.value.code(), info.value.details()) == (UNAVAILABLE, "Fault injected")
    assert picker.calls == 0


def test_fault_delay_holds_the_pick_then_goes_on(h):
    done = []
    picker, _ = tracking(h, done)
    h.core.random = random.Random(1)
    filters = fault(delay=0.5, delay_percent=100)
    h.core.selector = Selector(CallConfig(filters=filters))
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    held = rpc.pick()
    assert isinstance(held, float) and 0.4 < held <= 0.5
    assert picker.calls == 0
    assert filters[0]._active.count == 1
    rpc._hold_until -= 1.0  # the delay is over
    assert rpc.pick() is not None and picker.calls == 1
    assert filters[0]._active.count == 0


def test_fault_delay_past_the_deadline_is_deadline_exceeded(h):
    tracking(h, [])
    h.core.selector = Selector(CallConfig(filters=fault(delay=5, delay_percent=100)))
    rpc = new_rpc(h.core, "/svc/M", None, 0.05, False)
    with pytest.raises(grpc.RpcError) as info:
        run_blocking(rpc, invoke_for(rpc))
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED


def test_failed_pick_is_retried_by_the_policy_and_a_drop_is_not(h):
    """A6 "Transparent Retries": a pick failure is handled by the retry
    policy; a DROP fails at once."""
    failing = CountingPicker(PickFail(Status(UNAVAILABLE, "all endpoints down")))
    h.publish(failing)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    with pytest.raises(grpc.RpcError) as info:
        run_blocking(rpc, invoke_for(rpc))
    assert info.value.details() == "all endpoints down"
    assert failing.calls == 4  # 1 + 3 retries
    dropping = CountingPicker(PickDrop(Status(UNAVAILABLE, "EDS-configured drop: lb")))
    h.publish(dropping)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    with pytest.raises(grpc.RpcError):
        run_blocking(rpc, invoke_for(rpc))
    assert dropping.calls == 1


def test_failed_pick_without_a_policy_fails_at_once():
    harness = Harness()
    harness.start()
    try:
        harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
        from pyxds.lb.api import PickFail, Status

        failing = CountingPicker(
            PickFail(Status(UNAVAILABLE, "failed to connect to all addresses"))
        )
        harness.publish(failing)
        rpc = new_rpc(harness.core, "/svc/M", None, 5.0, False)
        with pytest.raises(grpc.RpcError):
            run_blocking(rpc, invoke_for(rpc))
        assert failing.calls == 1
    finally:
        harness.core.close()


def test_aio_failed_pick_retries_wait_their_backoff(h):
    """The aio fast path's first pick may answer a backoff: it is waited,
    not skipped (attempts stay spaced by the policy's backoff)."""
    import asyncio
    import time

    from pyxds.channel.aio import AioUnaryResponseCall

    slow = RetryPolicy.from_xds(("unavailable",), 2, 0.05, 0.05)
    h.core.selector = Selector(CallConfig(retry_policy=slow))
    h.core.random = random.Random(3)
    failing = CountingPicker(PickFail(Status(UNAVAILABLE, "all endpoints down")))
    h.publish(failing)

    async def main() -> float:
        rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
        start = time.monotonic()
        call = AioUnaryResponseCall(rpc, FnMethod(lambda t, r: None), None, None, None)
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        return time.monotonic() - start

    draws = random.Random(3)
    expected = 0.05 * draws.uniform(0.8, 1.2) + 0.05 * draws.uniform(0.8, 1.2)
    took = asyncio.run(main())
    assert failing.calls == 3
    assert took >= expected * 0.9


def test_a_rerouted_rpc_carries_out_its_new_routes_fault_verdict_too(h):
    """A route switch routes a failed pick again (A31); the new route's
    filters run for the RPC and their verdict is carried out (its active
    fault counted and given back), without waiting a delay twice."""
    sub = ready_subchannel(h)
    filters = fault(delay=0.01, delay_percent=100)

    class ByCluster(Picker):
        def pick(self, args):
            if args.call_attributes.get("cluster") == "new":
                return PickComplete(sub)
            return PickFail(Status(UNAVAILABLE, "CDS resource old does not exist"))

    h.core.selector = Selector(CallConfig(call_attributes={"cluster": "old"}, filters=filters))
    h.publish(ByCluster())
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    held = rpc.pick()
    assert isinstance(held, float) and filters[0]._active.count == 1
    rpc._hold_until -= 1.0  # the delay is over
    h.core.selector = Selector(CallConfig(call_attributes={"cluster": "new"}, filters=filters))
    assert rpc.pick() is h.transports.last("10.0.0.1:80")  # rerouted, no second delay
    assert filters[0]._active.count == 0


def test_a_retry_picks_with_the_newest_picker(h):
    """A44 "Workflow of xDS Retry": "each retry attempt will re-pick a
    subchannel that routes to the upstream cluster from the most up-to-date
    picker provided by the load balancer" (A6 "Where Retries Occur"): a
    picker published while the first attempt runs serves the retry."""
    first_sub = ready_subchannel(h, "10.0.0.1:80")
    second_sub = ready_subchannel(h, "10.0.0.2:80")

    class One(Picker):
        def __init__(self, sub):
            self.sub, self.calls = sub, 0

        def pick(self, args):
            self.calls += 1
            return PickComplete(self.sub)

    old, new = One(first_sub), One(second_sub)
    h.publish(old)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    tried = []

    def invoke(t, remaining):
        tried.append(t.address)
        if len(tried) == 1:
            h.publish(new)  # the LB policy moves on while the attempt runs
            raise FakeGrpcError(UNAVAILABLE, "down")
        return t.channel.unary_unary("/svc/M").with_call(b"req")

    run_blocking(rpc, invoke)
    assert tried == ["10.0.0.1:80", "10.0.0.2:80"]
    assert (old.calls, new.calls) == (1, 1)
