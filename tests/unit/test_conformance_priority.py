"""Conformance scenarios for ``priority_experimental`` (gRFC A56, latest text),
taken from the reference implementations' own suites (grpc-go
balancer/priority, grpc-java PriorityLoadBalancerTest, C-core xds
FailoverTest) and replayed against pyxds with the real ``round_robin`` and
``pick_first`` leaves over :mod:`pyxds.testing` fakes.

Where a reference behaves differently from A56 (grpc-go closes lower
priorities at once; grpc-java fails over on READY -> CONNECTING), the test
asserts A56 / C-core and says so in its docstring.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from pyxds.lb import (
    ConnectivityState,
    Endpoint,
    PickComplete,
    PickFail,
    PickQueue,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.hierarchy import PATH_KEY
from pyxds.lb.priority import CHILD_RETENTION, FAILOVER_TIMEOUT, PriorityFactory
from pyxds.testing import FakeHelper

try:
    from test_priority_leaf_support import ep, leaf, leaf_config, reset_leaves
except ImportError:  # pragma: no cover - package-style test collection
    from .test_priority_leaf_support import (  # type: ignore[no-redef]
        ep,
        leaf,
        leaf_config,
        reset_leaves,
    )

CS = ConnectivityState
READY, IDLE, CONNECTING, TF = CS.READY, CS.IDLE, CS.CONNECTING, CS.TRANSIENT_FAILURE
EPS = 1e-3


# ---------------------------------------------------------------------------
# Harness: priority over real leaves
# ---------------------------------------------------------------------------


def priority_config(
    priorities: list[str],
    policies: dict[str, str] | None = None,
    ignore: tuple[str, ...] = (),
    extra_children: tuple[str, ...] = (),
) -> Any:
    policies = policies or {}
    children: dict[str, Any] = {}
    for name in list(dict.fromkeys([*priorities, *extra_children])):
        child: dict[str, Any] = {"config": [{policies.get(name, "round_robin"): {}}]}
        if name in ignore:
            child["ignore_reresolution_requests"] = True
        children[name] = child
    factory, parsed = registry.select(
        [{"priority_experimental": {"children": children, "priorities": priorities}}]
    )
    assert factory.name == "priority_experimental"
    return parsed


def endpoints(addresses: dict[str, list[str]]) -> list[Endpoint]:
    return [
        Endpoint((address,), {PATH_KEY: (child,)})
        for child, listed in addresses.items()
        for address in listed
    ]


class Tree:
    """priority_experimental over real leaves, one address per child by default
    (``<child>-addr:80``)."""

    def __init__(self, destroy_removed_children: bool | None = None) -> None:
        self.helper = FakeHelper(seed=3)
        self.clock = self.helper.clock
        self.lb = PriorityFactory(destroy_removed_children).build(self.helper)

    def update(
        self,
        priorities: list[str],
        addresses: dict[str, list[str]] | None = None,
        *,
        policies: dict[str, str] | None = None,
        ignore: tuple[str, ...] = (),
        attributes: dict[str, Any] | None = None,
        extra_children: tuple[str, ...] = (),
    ) -> Status | None:
        if addresses is None:
            addresses = {name: [f"{name}-addr:80"] for name in priorities}
        config = priority_config(priorities, policies, ignore, extra_children)
        return self.lb.update(ResolverUpdate(endpoints(addresses), config, attributes or {}, ""))

    def sub(self, address: str):
        return self.helper.subchannel(address)

    def ready(self, address: str) -> None:
        sub = self.sub(address)
        sub.set_state(CONNECTING)
        sub.set_state(READY)

    def fail(self, address: str, why: str | None = None) -> None:
        self.sub(address).set_state(TF, why)

    @property
    def current(self) -> str | None:
        return self.lb.current_child

    @property
    def state(self) -> ConnectivityState:
        return self.helper.state

    def picks(self, n: int = 12) -> set[str]:
        out: set[str] = set()
        for _ in range(n):
            result = self.helper.pick()
            assert isinstance(result, PickComplete), result
            out.add(result.subchannel.address)
        return out

    def queues(self) -> bool:
        return isinstance(self.helper.pick(), PickQueue)

    def created(self) -> list[str]:
        return [s.address for s in self.helper.subchannels]

    def shut_down(self) -> list[str]:
        return [s.address for s in self.helper.subchannels if s.shut_down]


# ---------------------------------------------------------------------------
# grpc-go balancer/priority/balancer_test.go
# ---------------------------------------------------------------------------


def test_adding_and_removing_a_lower_priority_while_p0_is_ready_changes_nothing():
    """grpc-go TestPriority_HighPriorityReady."""
    t = Tree()
    t.update(["p0", "p1"])
    t.ready("p0-addr:80")
    assert t.picks() == {"p0-addr:80"}
    before = t.created()
    t.update(["p0", "p1", "p2"])
    assert t.created() == before and t.shut_down() == []
    assert t.picks() == {"p0-addr:80"}
    t.update(["p0", "p1"])
    assert t.created() == before and t.shut_down() == []
    assert t.picks() == {"p0-addr:80"}


def test_switch_down_the_priorities_and_back_when_the_lowest_is_removed():
    """grpc-go TestPriority_SwitchPriority (A56 retention: the removed p2 keeps
    its connection for 15 minutes instead of closing it at once)."""
    t = Tree()
    t.update(["p0", "p1"])
    t.ready("p0-addr:80")
    assert t.picks() == {"p0-addr:80"}
    t.fail("p0-addr:80")
    assert t.state is CONNECTING and t.queues()  # p1 just created
    assert "p1-addr:80" in t.created()
    t.ready("p1-addr:80")
    assert t.picks() == {"p1-addr:80"}
    created = t.created()
    t.update(["p0", "p1", "p2"])
    assert t.created() == created  # p2 is not needed: not built
    t.fail("p1-addr:80", "test error")
    assert t.state is CONNECTING and t.queues()
    t.ready("p2-addr:80")
    assert t.picks() == {"p2-addr:80"}
    # Remove p2: back to p1, which is failing -> its own failing picker.
    t.update(["p0", "p1"])
    assert t.current == "p1" and t.state is TF
    result = t.helper.pick()
    assert isinstance(result, PickFail) and "test error" in result.status.details
    assert not t.sub("p2-addr:80").shut_down
    # round_robin stays in TRANSIENT_FAILURE through a reconnect attempt.
    t.sub("p1-addr:80").set_state(CONNECTING)
    assert t.state is TF
    t.sub("p1-addr:80").set_state(READY)
    assert t.picks() == {"p1-addr:80"}
    t.clock.advance(CHILD_RETENTION)
    assert "p2-addr:80" in t.shut_down()


def test_ready_to_connecting_waits_for_the_failover_timer_then_fails_back():
    """grpc-go TestPriority_HighPriorityToConnectingFromReady, per A56 latest:
    READY -> CONNECTING restarts p0's failover timer (grpc-go used to fail
    over at once); p0 READY again switches back and retires p1 after 15 min."""
    t = Tree()
    t.update(["p0", "p1"])
    t.ready("p0-addr:80")
    t.sub("p0-addr:80").set_state(IDLE)  # connection dropped: round_robin reconnects
    assert t.state is CONNECTING and t.current == "p0" and t.queues()
    t.clock.advance(FAILOVER_TIMEOUT - EPS)
    assert "p1-addr:80" not in t.created()
    t.clock.advance(EPS)
    assert t.current == "p1"
    t.ready("p1-addr:80")
    assert t.picks() == {"p1-addr:80"}
    t.sub("p0-addr:80").set_state(READY)
    assert t.picks() == {"p0-addr:80"}
    assert not t.sub("p1-addr:80").shut_down
    t.clock.advance(CHILD_RETENTION)
    assert "p1-addr:80" in t.shut_down()


def test_adding_a_lower_priority_while_all_fail_uses_it():
    """grpc-go TestPriority_HigherDownWhileAddingLower."""
    t = Tree()
    t.update(["p0", "p1"])
    t.fail("p0-addr:80")
    t.fail("p1-addr:80")
    assert t.state is TF and isinstance(t.helper.pick(), PickFail)
    t.update(["p0", "p1", "p2"])
    assert t.current == "p2" and t.state is CONNECTING and t.queues()
    t.ready("p2-addr:80")
    assert t.picks() == {"p2-addr:80"}


def test_higher_priority_ready_retires_all_lower_priorities():
    """grpc-go TestPriority_HigherReadyCloseAllLower (A56: deactivated, closed
    after the 15-minute retention)."""
    t = Tree()
    t.update(["p0", "p1", "p2"])
    t.fail("p0-addr:80")
    t.fail("p1-addr:80")
    t.ready("p2-addr:80")
    assert t.picks() == {"p2-addr:80"}
    t.sub("p0-addr:80").set_state(READY)
    assert t.picks() == {"p0-addr:80"}
    assert t.lb.children["p1"].deactivated and t.lb.children["p2"].deactivated
    t.clock.advance(CHILD_RETENTION - EPS)
    assert t.shut_down() == []
    t.clock.advance(EPS)
    assert sorted(t.shut_down()) == ["p1-addr:80", "p2-addr:80"]
    assert t.picks() == {"p0-addr:80"}


def test_connecting_p0_starts_p1_only_after_the_failover_timeout():
    """grpc-go TestPriority_InitTimeout."""
    t = Tree()
    t.update(["p0", "p1"])
    t.sub("p0-addr:80").set_state(CONNECTING)
    t.clock.advance(FAILOVER_TIMEOUT * 3 / 4)
    assert t.created() == ["p0-addr:80"]
    t.clock.advance(FAILOVER_TIMEOUT / 4)
    assert t.created() == ["p0-addr:80", "p1-addr:80"]
    t.ready("p1-addr:80")
    assert t.picks() == {"p1-addr:80"}


def test_removing_and_readding_all_priorities():
    """grpc-go TestPriority_RemovesAllPriorities (with A56 retention the
    removed p0 is reused when its name comes back with other backends)."""
    t = Tree()
    t.update(["p0", "p1"])
    t.ready("p0-addr:80")
    p0_policy = t.lb.children["p0"].policy
    t.lb.update(ResolverUpdate([], priority_config([]), {}, ""))
    expected = Status(grpc.StatusCode.UNAVAILABLE, "priority policy has empty priority list")
    assert t.state is TF and t.helper.last.status == expected
    assert t.helper.pick() == PickFail(expected)
    assert t.shut_down() == []  # retained, not closed
    t.update(["p0", "p1"], {"p0": ["b2:80"], "p1": ["b3:80"]})
    assert t.lb.children["p0"].policy is p0_policy and t.current == "p0"
    t.ready("b2:80")
    assert t.picks() == {"b2:80"}
    assert "p0-addr:80" in t.shut_down() and "p1" not in t.lb.children


def test_removing_the_used_lower_priority_falls_back_to_the_connecting_one():
    """grpc-go TestPriority_RemovesAllPriorities (second half): after p1
    took over from a p0 that never connected, removing p1 publishes p0's
    own queueing picker, never p1's stale one."""
    t = Tree()
    t.update(["p0", "p1"])
    t.clock.advance(FAILOVER_TIMEOUT)
    assert t.current == "p1"
    t.ready("p1-addr:80")
    assert t.picks() == {"p1-addr:80"}
    t.update(["p0"])
    assert t.current == "p0" and t.state is CONNECTING and t.queues()
    t.ready("p0-addr:80")
    assert t.picks() == {"p0-addr:80"}


def test_priority_whose_endpoints_vanish_fails_over_at_once():
    """grpc-go TestPriority_HighPriorityNoEndpoints; C-core FailoverTest
    DoesNotUsePriorityWithNoEndpoints.  round_robin rejects the empty list,
    which the update reports as an error from that child."""
    t = Tree()
    t.update(["p0", "p1"])
    t.ready("p0-addr:80")
    status = t.update(["p0", "p1"], {"p1": ["p1-addr:80"]})
    assert status is not None and status.code is grpc.StatusCode.UNAVAILABLE
    assert status.details.startswith("errors from children: [child p0: ")
    assert "p0-addr:80" in t.shut_down()
    assert t.current == "p1" and t.queues()
    t.ready("p1-addr:80")
    assert t.picks() == {"p1-addr:80"}


def test_only_priority_removed_before_its_timer_fires_is_harmless():
    """grpc-go TestPriority_FirstPriorityUnavailable."""
    t = Tree()
    t.update(["p0"])
    t.lb.update(ResolverUpdate([], priority_config([]), {}, ""))
    reports = len(t.helper.states)
    t.clock.advance(FAILOVER_TIMEOUT * 2)
    assert len(t.helper.states) == reports and t.state is TF


def test_moving_a_new_child_above_a_ready_one_waits_for_it():
    """grpc-go TestPriority_MoveChildToHigherPriority.  A56: the new p0 is
    created and waited for (its failover timer is pending); the READY child
    now at p1 is neither used nor deactivated until p0 is READY."""
    t = Tree()
    t.update(["a", "b"])
    t.ready("a-addr:80")
    t.update(["b", "a"])
    assert t.current == "b" and t.state is CONNECTING and t.queues()
    assert not t.lb.children["a"].deactivated and not t.sub("a-addr:80").shut_down
    t.ready("b-addr:80")
    assert t.picks() == {"b-addr:80"}
    assert t.lb.children["a"].deactivated
    t.clock.advance(CHILD_RETENTION)
    assert "a-addr:80" in t.shut_down()


def test_moving_the_ready_child_up_uses_it_without_new_connections():
    """grpc-go TestPriority_MoveReadyChildToHigherPriority."""
    t = Tree()
    t.update(["a", "b"])
    t.fail("a-addr:80")
    t.ready("b-addr:80")
    assert t.picks() == {"b-addr:80"}
    created, reports = t.created(), len(t.helper.states)
    t.update(["b", "a"])
    assert t.created() == created
    assert len(t.helper.states) == reports + 1 and t.picks() == {"b-addr:80"}
    assert t.lb.children["a"].deactivated  # lower than a READY priority


def test_removing_the_ready_lowest_child_falls_back_to_the_failing_one():
    """grpc-go TestPriority_RemoveReadyLowestChild."""
    t = Tree()
    t.update(["a", "b"])
    t.fail("a-addr:80", "test error")
    t.ready("b-addr:80")
    created = t.created()
    t.update(["a"])
    assert t.state is TF
    result = t.helper.pick()
    assert isinstance(result, PickFail) and "test error" in result.status.details
    assert t.created() == created
    assert not t.sub("b-addr:80").shut_down  # retained 15 minutes


def test_removed_ready_child_is_reused_from_the_cache_when_readded():
    """grpc-go TestPriority_ReadyChildRemovedButInCache."""
    t = Tree()
    t.update(["p0"])
    t.ready("p0-addr:80")
    t.lb.update(ResolverUpdate([], priority_config([]), {}, ""))
    assert t.state is TF and t.shut_down() == []
    created = t.created()
    t.update(["p0"])
    assert t.picks() == {"p0-addr:80"}
    assert t.created() == created and t.shut_down() == []


def test_changing_a_childs_policy_switches_it_gracefully():
    """grpc-go TestPriority_ChildPolicyChange (round_robin -> pick_first)."""
    t = Tree()
    t.update(["p0"])
    t.ready("p0-addr:80")
    t.update(["p0"], policies={"p0": "pick_first"})
    assert t.picks() == {"p0-addr:80"}  # the old policy serves meanwhile
    new = t.helper.subchannels[-1]
    assert new is not t.helper.subchannels[0] and new.address == "p0-addr:80"
    new.set_state(CONNECTING)
    new.set_state(READY)
    result = t.helper.pick()
    assert isinstance(result, PickComplete) and result.subchannel is new
    assert t.helper.subchannels[0].shut_down


def test_ignore_reresolution_requests_follows_the_latest_config():
    """grpc-go TestPriority_IgnoreReresolutionRequest."""
    t = Tree()
    t.update(["p0"], ignore=("p0",))
    t.ready("p0-addr:80")
    t.fail("p0-addr:80")  # round_robin asks for re-resolution
    assert t.helper.reresolution_requests == 0
    t.update(["p0"])
    t.sub("p0-addr:80").set_state(READY)
    t.fail("p0-addr:80")
    assert t.helper.reresolution_requests >= 1


def test_ignore_reresolution_requests_is_per_child():
    """grpc-go TestPriority_IgnoreReresolutionRequestTwoChildren; grpc-java
    bypassReresolutionRequestsIfConfiged."""
    t = Tree()
    t.update(["p0", "p1"], ignore=("p0",))
    t.fail("p0-addr:80")
    assert t.helper.reresolution_requests == 0 and t.current == "p1"
    t.fail("p1-addr:80")
    assert t.helper.reresolution_requests >= 1


def test_idle_priorities_are_used_and_failover_continues_past_them():
    """grpc-go TestPriority_HighPriorityInitIdle (pick_first goes IDLE when
    its connection drops)."""
    t = Tree()
    t.update(["p0", "p1"], policies={"p0": "pick_first", "p1": "pick_first"})
    t.ready("p0-addr:80")
    t.sub("p0-addr:80").set_state(IDLE)
    assert t.state is IDLE and t.current == "p0" and t.queues()
    t.clock.advance(0)  # the queued pick asked p0 to reconnect
    t.fail("p0-addr:80")
    assert t.current == "p1" and t.state is CONNECTING
    t.ready("p1-addr:80")
    t.sub("p1-addr:80").set_state(IDLE)
    assert t.state is IDLE and t.current == "p1"


def test_adding_a_lower_priority_while_p0_is_idle_keeps_p0():
    """grpc-go TestPriority_AddLowPriorityWhenHighIsInIdle."""
    t = Tree()
    t.update(["p0"], policies={"p0": "pick_first"})
    t.ready("p0-addr:80")
    t.sub("p0-addr:80").set_state(IDLE)
    assert t.state is IDLE
    t.update(["p0", "p1"], policies={"p0": "pick_first"})
    assert t.current == "p0" and t.state is IDLE
    assert "p1" not in t.lb.children and "p1-addr:80" not in t.created()


def test_higher_priority_still_gets_updates_while_a_lower_one_is_used():
    """grpc-go TestPriority_HighPriorityUpdatesWhenLowInUse."""
    t = Tree()
    t.update(["p0", "p1"])
    t.sub("p0-addr:80").set_state(CONNECTING)
    t.fail("p0-addr:80")
    t.ready("p1-addr:80")
    assert t.picks() == {"p1-addr:80"}
    t.update(["p0", "p1"], {"p0": ["b2:80"], "p1": ["b3:80"]})
    assert "b2:80" in t.created() and "b3:80" in t.created()
    t.ready("b3:80")
    assert t.current == "p1"
    t.ready("b2:80")
    assert t.current == "p0" and t.picks() == {"b2:80"}


# ---------------------------------------------------------------------------
# grpc-java PriorityLoadBalancerTest
# ---------------------------------------------------------------------------


def test_silent_children_fail_over_every_10_seconds_and_removed_ones_retire_after_15_min():
    """grpc-java acceptResolvedAddresses: p0 and p1 never report, so each
    failover timer hands over to the next priority; an update that drops p0
    and p2 retains them 15 minutes (the A56 default) and updates p1 with the
    new address and attributes."""
    t = Tree()
    t.update(["p0", "p1", "p2"], attributes={"fake": "a"})
    p0 = t.lb.children["p0"].policy
    assert set(t.lb.children) == {"p0"}
    t.clock.advance(FAILOVER_TIMEOUT)
    assert set(t.lb.children) == {"p0", "p1"}
    t.clock.advance(FAILOVER_TIMEOUT)
    assert set(t.lb.children) == {"p0", "p1", "p2"}
    p1 = t.lb.children["p1"].policy
    t.update(["p1"], {"p1": ["new:81"]})
    assert t.lb.children["p1"].policy is p1
    assert "new:81" in t.created() and "p1-addr:80" in t.shut_down()
    assert t.lb.children["p0"].policy is p0  # retained
    t.clock.advance(CHILD_RETENTION)
    assert set(t.lb.children) == {"p1"}


def test_a115_option_destroys_dropped_children_at_once():
    """grpc-java acceptResolvedAddresses_cacheDisabled (gRFC A115 opt-out)."""
    t = Tree(destroy_removed_children=True)
    t.update(["p0", "p1", "p2"])
    t.clock.advance(2 * FAILOVER_TIMEOUT)
    assert set(t.lb.children) == {"p0", "p1", "p2"}
    t.update(["p1"])
    assert set(t.lb.children) == {"p1"}
    assert sorted(t.shut_down()) == ["p0-addr:80", "p2-addr:80"]


def test_typical_failover_flow_across_four_priorities():
    """grpc-java typicalPriorityFailOverFlow, with round_robin leaves."""
    t = Tree()
    names = ["p0", "p1", "p2", "p3"]
    t.update(names)
    t.ready("p0-addr:80")
    assert t.picks() == {"p0-addr:80"}
    t.fail("p0-addr:80")  # p0 fails over to p1 at once
    assert t.state is CONNECTING and set(t.lb.children) == {"p0", "p1"}
    t.clock.advance(FAILOVER_TIMEOUT)  # p1 times out: p2
    assert t.state is CONNECTING and set(t.lb.children) == {"p0", "p1", "p2"}
    t.ready("p2-addr:80")
    assert t.picks() == {"p2-addr:80"}
    t.sub("p0-addr:80").set_state(READY)
    assert t.picks() == {"p0-addr:80"}
    t.fail("p2-addr:80")  # below the READY p0: no effect
    assert t.picks() == {"p0-addr:80"}
    t.fail("p0-addr:80")  # p1 timed out, p2 failing: p3
    assert t.current == "p3" and t.state is CONNECTING
    t.clock.advance(FAILOVER_TIMEOUT)  # p3 times out: first CONNECTING is p1
    assert t.current == "p1" and t.state is CONNECTING and t.queues()
    t.fail("p3-addr:80", "foo")
    assert t.current == "p1" and t.state is CONNECTING
    t.fail("p1-addr:80", "bar")  # nothing connecting: the last priority
    assert t.current == "p3" and t.state is TF
    result = t.helper.pick()
    assert isinstance(result, PickFail) and "foo" in result.status.details
    t.sub("p2-addr:80").set_state(READY)
    assert t.picks() == {"p2-addr:80"}
    t.sub("p0-addr:80").set_state(READY)
    assert t.picks() == {"p0-addr:80"}
    t.fail("p0-addr:80")
    assert t.picks() == {"p2-addr:80"}  # p2's existing picker, no new connection
    t.clock.advance(CHILD_RETENTION)
    assert set(t.lb.children) == {"p0", "p1", "p2"}
    assert t.shut_down() == ["p3-addr:80"]


def test_idle_to_connecting_does_not_fail_over_but_restarts_the_timer():
    """grpc-java idleToConnectingDoesNotTriggerFailOver and
    connectingResetFailOverIfSeenReadyOrIdleSinceTransientFailure."""
    t = Tree()
    t.update(["p0", "p1"], policies={"p0": "pick_first"})
    t.ready("p0-addr:80")
    t.sub("p0-addr:80").set_state(IDLE)
    assert t.state is IDLE and set(t.lb.children) == {"p0"}
    t.clock.advance(5)
    t.lb.exit_idle()  # reconnect: IDLE -> CONNECTING
    assert t.state is CONNECTING and t.current == "p0"
    t.clock.advance(FAILOVER_TIMEOUT - EPS)
    assert set(t.lb.children) == {"p0"}
    t.clock.advance(EPS)
    assert set(t.lb.children) == {"p0", "p1"}


def test_repeated_connecting_does_not_restart_the_failover_timer():
    """grpc-java failoverTimerNotRestartedOnDupConnecting (grpc-go#8516).  The
    real leaves never repeat a state, but a parent re-wrapping its picker
    (e.g. a new drop config) does: the test leaf plays that parent."""
    reset_leaves()
    try:
        helper = FakeHelper()
        lb = PriorityFactory().build(helper)
        children = {n: {"config": leaf_config(n)} for n in ("p0", "p1")}
        config = registry.select(
            [{"priority_experimental": {"children": children, "priorities": ["p0", "p1"]}}]
        )[1]
        lb.update(ResolverUpdate([ep("a:80", "p0"), ep("b:80", "p1")], config, {}))
        leaf("p0").report(IDLE)
        leaf("p0").report(CONNECTING)  # a transition: the timer starts (t=0)
        helper.clock.advance(5)
        leaf("p0").report(CONNECTING)  # a duplicate: ignored
        helper.clock.advance(FAILOVER_TIMEOUT - 5 - EPS)
        assert "p1" not in lb.children
        helper.clock.advance(EPS)
        assert "p1" in lb.children and lb.current_child == "p1"
        # After expiry a duplicate CONNECTING must not hold up failover again.
        leaf("p0").report(CONNECTING)
        assert not lb.children["p0"].failover_pending
        assert lb.current_child == "p1"
    finally:
        reset_leaves()


def test_ready_to_idle_publishes_the_idle_picker_without_failover():
    """grpc-java readyToConnectDoesNotFailOverButUpdatesPicker."""
    t = Tree()
    t.update(["p0", "p1"], policies={"p0": "pick_first"})
    t.ready("p0-addr:80")
    t.sub("p0-addr:80").set_state(IDLE)
    assert t.state is IDLE and set(t.lb.children) == {"p0"}
    t.update(["p0", "p1"], policies={"p0": "pick_first"}, attributes={"fooKey": "barVal"})
    assert t.state is IDLE and set(t.lb.children) == {"p0"}
    assert isinstance(t.helper.pick(), PickQueue)


def test_lower_child_rejecting_its_first_update_requests_reresolution():
    """grpc-java failover_propagatesChildFailures and C-core ChoosePriority:
    a child created by the choice that rejects its update makes the policy
    ask for re-resolution (even if the child ignores re-resolution), and the
    parent update still succeeds."""
    t = Tree()
    status = t.update(["p0", "p1"], {"p0": ["p0-addr:80"]}, ignore=("p0", "p1"))
    assert status is None and t.helper.reresolution_requests == 0
    t.fail("p0-addr:80")  # p1 is created with no endpoints: round_robin rejects
    assert set(t.lb.children) == {"p0", "p1"}
    assert t.helper.reresolution_requests == 1


def test_child_created_by_the_failover_timer_rejecting_requests_reresolution():
    """grpc-java failoverTimer_propagatesChildFailures."""
    t = Tree()
    t.update(["p0", "p1"], {"p0": ["p0-addr:80"]}, ignore=("p0", "p1"))
    assert t.helper.reresolution_requests == 0
    t.clock.advance(FAILOVER_TIMEOUT)
    assert t.helper.reresolution_requests == 1


def test_existing_child_rejecting_an_update_makes_the_update_fail():
    """grpc-java acceptResolvedAddresses_propagatesChildFailures ("A single
    pre-existing child failure propagates"); C-core's "errors from
    children" wording."""
    t = Tree()
    t.update(["p0", "p1"])
    t.fail("p0-addr:80")
    t.fail("p1-addr:80")
    status = t.update(["p0", "p1"], {"p0": ["p0-addr:80"]})
    assert status == Status(
        grpc.StatusCode.UNAVAILABLE,
        f"errors from children: [child p1: {_rr_empty_status()}]",
    )


def _rr_empty_status() -> Status:
    factory = registry.get("round_robin")
    assert factory is not None
    return factory.build(FakeHelper()).update(ResolverUpdate([], factory.parse_config({}), {}))


def test_resolver_error_reaches_listed_children_only():
    """grpc-java handleNameResolutionError: a child dropped from the config
    (deactivated, not yet deleted) no longer gets resolver errors; C-core
    likewise passes an address error only to children of the current config."""
    reset_leaves()
    helper = FakeHelper()
    lb = PriorityFactory().build(helper)

    def config(names):
        children = {name: {"config": leaf_config(name)} for name in names}
        return registry.select(
            [{"priority_experimental": {"children": children, "priorities": names}}]
        )[1]

    lb.update(ResolverUpdate([ep("a:80", "p0")], config(["p0"]), {}))
    error = Status(grpc.StatusCode.DATA_LOSS, "fake error")
    lb.resolver_error(error)
    assert leaf("p0").resolver_errors == [error]
    lb.update(ResolverUpdate([ep("b:80", "p1")], config(["p1"]), {}))
    assert lb.children["p0"].deactivated
    error2 = Status(grpc.StatusCode.UNAVAILABLE, "fake error 2")
    lb.resolver_error(error2)
    assert leaf("p0").resolver_errors == [error]
    assert leaf("p1").resolver_errors == [error2]
    reset_leaves()


def test_resolver_error_with_no_child_fails_with_that_error():
    """grpc-java handleNameResolutionError_updatesDelayAttributes."""
    t = Tree()
    t.lb.resolver_error(Status(grpc.StatusCode.UNAVAILABLE, "priority dns error"))
    assert t.state is TF
    result = t.helper.pick()
    assert isinstance(result, PickFail)
    assert result.status.code is grpc.StatusCode.UNAVAILABLE
    assert "priority dns error" in result.status.details


def test_child_reports_after_shutdown_are_ignored():
    """grpc-java raceBetweenShutdownAndChildLbBalancingStateUpdate."""
    t = Tree()
    t.update(["p0", "p1"])
    sub = t.sub("p0-addr:80")
    t.lb.shutdown()
    reports = len(t.helper.states)
    sub.set_state(READY)
    t.clock.advance(CHILD_RETENTION)
    assert len(t.helper.states) == reports
    assert all(s.shut_down for s in t.helper.subchannels)


def test_deactivated_removed_child_reporting_does_not_change_the_state():
    """grpc-java priorityPicker_deactivatedChild_doesNotPrependNegativePriorityIndex."""
    t = Tree()
    t.update(["p0", "p1"])
    t.fail("p0-addr:80")
    assert "p1" in t.lb.children
    t.update(["p0"])
    assert t.state is TF
    reports = len(t.helper.states)
    t.sub("p1-addr:80").set_state(CONNECTING)
    t.ready("p1-addr:80")
    assert len(t.helper.states) == reports and t.state is TF


# ---------------------------------------------------------------------------
# C-core xds FailoverTest / LocalityMapTest, on priority -> weighted_target
# ---------------------------------------------------------------------------


def wt_priority_config(localities: dict[str, dict[str, int]]) -> Any:
    children = {
        child: {
            "config": [
                {
                    "weighted_target_experimental": {
                        "targets": {
                            name: {"weight": weight, "childPolicy": [{"round_robin": {}}]}
                            for name, weight in targets.items()
                        }
                    }
                }
            ]
        }
        for child, targets in localities.items()
    }
    return registry.select(
        [{"priority_experimental": {"children": children, "priorities": list(localities)}}]
    )[1]


def wt_endpoints(tree: dict[str, dict[str, list[str]]]) -> list[Endpoint]:
    return [
        Endpoint((address,), {PATH_KEY: (child, locality)})
        for child, localities in tree.items()
        for locality, addresses in localities.items()
        for address in addresses
    ]


def test_highest_priority_is_chosen_and_lower_ones_never_connect():
    """C-core FailoverTest.ChooseHighestPriority."""
    t = Tree()
    addresses = {f"p{i}": {f"loc{i}": [f"10.0.0.{i}:80"]} for i in range(4)}
    config = wt_priority_config({f"p{i}": {f"loc{i}": 1} for i in range(4)})
    t.lb.update(ResolverUpdate(wt_endpoints(addresses), config, {}))
    t.ready("10.0.0.0:80")
    assert t.picks() == {"10.0.0.0:80"}
    assert t.created() == ["10.0.0.0:80"]


def test_locality_without_endpoints_is_skipped_inside_a_priority():
    """C-core FailoverTest.DoesNotUseLocalityWithNoEndpoints (grpc#22831):
    the empty locality fails alone; the priority is READY on the other."""
    t = Tree()
    config = wt_priority_config({"p0": {"empty": 1, "full": 1}, "p1": {"other": 1}})
    eps = wt_endpoints({"p0": {"full": ["a:80"]}, "p1": {"other": ["b:80"]}})
    t.lb.update(ResolverUpdate(eps, config, {}))
    assert TF not in t.helper.state_sequence()
    t.ready("a:80")
    assert t.current == "p0" and t.picks() == {"a:80"}
    assert "b:80" not in t.created()


def test_failover_and_switch_back_through_weighted_target():
    """C-core FailoverTest.Failover and SwitchBackToHigherPriority."""
    t = Tree()
    config = wt_priority_config({"p0": {"l0": 1, "l1": 1}, "p1": {"l2": 1}})
    eps = wt_endpoints({"p0": {"l0": ["a:80"], "l1": ["b:80"]}, "p1": {"l2": ["c:80"]}})
    t.lb.update(ResolverUpdate(eps, config, {}))
    t.fail("a:80")
    assert t.current == "p0"  # l1 still connecting
    t.fail("b:80")
    assert t.current == "p1"
    t.ready("c:80")
    assert t.picks() == {"c:80"}
    t.sub("b:80").set_state(READY)
    assert t.current == "p0" and t.picks() == {"b:80"}


def test_localities_moved_into_a_higher_priority_keep_their_connections():
    """C-core FailoverTest.MoveAllLocalitiesInCurrentPriorityToHigherPriority:
    the child name serving traffic moves up to priority 0 (a new name takes
    priority 1); no connection is re-made."""
    t = Tree()
    config = wt_priority_config({"c0": {"l0": 1}, "c1": {"l1": 1}})
    eps = wt_endpoints({"c0": {"l0": ["a:80"]}, "c1": {"l1": ["b:80"]}})
    t.lb.update(ResolverUpdate(eps, config, {}))
    t.fail("a:80")
    t.ready("b:80")
    assert t.picks() == {"b:80"}
    created = t.created()
    config2 = wt_priority_config({"c1": {"l1": 1, "l0": 1}, "c2": {"l3": 1}})
    eps2 = wt_endpoints({"c1": {"l1": ["b:80"], "l0": ["a2:80"]}, "c2": {"l3": ["d:80"]}})
    assert t.lb.update(ResolverUpdate(eps2, config2, {})) is None
    assert t.current == "c1" and t.picks() == {"b:80"}
    assert t.sub("b:80") is t.helper.subchannels[created.index("b:80")]
    assert "d:80" not in t.created()


@pytest.mark.parametrize("seed", range(3))
def test_fail_over_then_back_repeatedly_never_leaks_children(seed):
    """TRAPS grpc#25139 / grpc#30045 with real leaves: flapping p0 reuses
    the same p1 and never builds a second one."""
    t = Tree()
    t.update(["p0", "p1"])
    t.ready("p0-addr:80")
    for _ in range(3 + seed):
        t.fail("p0-addr:80")
        assert t.current == "p1"
        t.sub("p1-addr:80").set_state(READY)
        assert t.picks() == {"p1-addr:80"}
        t.sub("p0-addr:80").set_state(READY)
        assert t.picks() == {"p0-addr:80"}
        t.clock.advance(CHILD_RETENTION / 2)
    assert t.created() == ["p0-addr:80", "p1-addr:80"]


def test_unreachable_priorities_recover_when_an_update_brings_new_backends():
    """C-core FailoverTest.UpdateInitialUnavailable: RPCs fail while every
    priority fails; the update with reachable backends is used (p0 first),
    and no failover timer is started for a child that just failed."""
    t = Tree()
    t.update(["p0", "p1"], {"p0": ["bad0:80"], "p1": ["bad1:80"]})
    t.fail("bad0:80")
    t.fail("bad1:80")
    assert t.state is TF and isinstance(t.helper.pick(), PickFail)
    t.update(["p0", "p1"], {"p0": ["b0:80"], "p1": ["b1:80"]})
    assert not isinstance(t.helper.pick(), PickComplete)
    t.ready("b1:80")
    assert t.picks() == {"b1:80"}
    t.ready("b0:80")
    assert t.picks() == {"b0:80"}


def test_reordered_priorities_choose_the_new_highest_once_it_is_ready():
    """C-core FailoverTest.UpdatePriority: the old p0 (now lowest) keeps
    serving nothing; picks wait for the new p0 and then go only there."""
    t = Tree()
    t.update(["c3", "c0", "c1", "c2"])
    t.ready("c3-addr:80")
    assert t.picks() == {"c3-addr:80"}
    t.update(["c1", "c2", "c0", "c3"])
    assert t.current == "c1" and t.queues()
    t.ready("c1-addr:80")
    assert t.picks(50) == {"c1-addr:80"}
    assert "c0-addr:80" not in t.created() and "c2-addr:80" not in t.created()
    assert t.lb.children["c3"].deactivated


def test_new_child_name_at_a_priority_is_waited_for_before_lower_ones():
    """C-core FailoverTest.PriorityChildNameChurn: a new child taking over
    priority 1 holds the choice during its failover timer; priority 2 gets
    no traffic (is not even built) meanwhile."""
    t = Tree()
    t.update(["c0", "c1", "c2"], {"c0": ["bad:80"], "c1": ["b0:80"], "c2": ["b1:80"]})
    t.fail("bad:80")
    t.ready("b0:80")
    assert t.picks() == {"b0:80"}
    t.update(["c0", "c2", "c3"], {"c0": ["bad:80"], "c2": ["b1:80"], "c3": ["b2:80"]})
    t.ready("b1:80")
    assert t.picks() == {"b1:80"}
    t.update(["c0", "c4", "c3"], {"c0": ["bad:80"], "c4": ["b3:80"], "c3": ["b2:80"]})
    assert t.current == "c4" and t.queues()
    t.ready("b3:80")
    assert t.picks() == {"b3:80"}
    assert "b2:80" not in t.created()


def test_reordering_while_the_top_fails_and_the_next_connects_waits_for_it():
    """TRAPS grpc-java#7039 with real leaves: [A, B, C] -> [B, A, C] while A
    has failed and B is still within its failover window must not jump to
    C (C is never even built)."""
    t = Tree()
    t.update(["A", "B", "C"])
    t.fail("A-addr:80")
    assert t.current == "B" and t.lb.children["B"].failover_pending
    t.update(["B", "A", "C"])
    assert t.current == "B" and t.queues()
    assert "C" not in t.lb.children and "C-addr:80" not in t.created()
    t.ready("B-addr:80")
    assert t.picks() == {"B-addr:80"}


def test_stale_retention_timer_does_not_destroy_a_redeactivated_child():
    """TRAPS grpc#30045 with real leaves: p1 deactivated at t=0, reactivated
    and deactivated again later; the first deadline must not destroy it."""
    t = Tree()
    t.update(["p0", "p1"])
    t.fail("p0-addr:80")
    t.ready("p1-addr:80")
    t.sub("p0-addr:80").set_state(READY)  # t=0: p1 deactivated
    t.clock.advance(CHILD_RETENTION / 2)
    t.fail("p0-addr:80")  # p1 reactivated and used
    assert t.picks() == {"p1-addr:80"}
    t.clock.advance(60)
    t.sub("p0-addr:80").set_state(READY)  # p1 deactivated again
    t.clock.advance(CHILD_RETENTION / 2)  # the first deadline passes
    assert "p1" in t.lb.children and not t.sub("p1-addr:80").shut_down
    t.clock.advance(CHILD_RETENTION / 2 + 60)
    assert "p1" not in t.lb.children and "p1-addr:80" in t.shut_down()


def test_failover_expiry_never_invents_a_failure_for_a_connecting_child():
    """A56 latest / TRAPS grpc-java#12240 (C-core 1.85 still reports a
    made-up "failover timer fired" failure here): p0 keeps trying after its
    timer expired and p1 failed, so RPCs wait on p0 instead of failing."""
    t = Tree()
    t.update(["p0", "p1"])
    t.clock.advance(FAILOVER_TIMEOUT)
    t.fail("p1-addr:80", "p1 down")
    assert t.current == "p0" and t.state is CONNECTING and t.queues()
    assert all("failover" not in r.status.details for r in t.helper.states)
    t.fail("p0-addr:80", "p0 down")
    assert t.current == "p1" and t.state is TF
    result = t.helper.pick()
    assert isinstance(result, PickFail) and "p1 down" in result.status.details


def test_resolver_error_with_only_delisted_children_fails_with_that_error():
    """grpc-java handleNameResolutionError: when no listed child received the
    error, the policy reports TRANSIENT_FAILURE with it."""
    t = Tree()
    t.update(["p0"])
    t.ready("p0-addr:80")
    t.lb.update(ResolverUpdate([], priority_config([]), {}, ""))
    error = Status(grpc.StatusCode.UNAVAILABLE, "dns down")
    t.lb.resolver_error(error)
    assert t.state is TF and t.helper.last.status == error
    assert t.helper.pick() == PickFail(error)
    assert not t.sub("p0-addr:80").shut_down


def test_reset_backoff_reaches_every_child_including_retained_ones():
    """C-core PriorityLb::ResetBackoffLocked (every child, deactivated too)."""
    t = Tree()
    t.update(["p0", "p1"])
    t.fail("p0-addr:80")
    t.fail("p1-addr:80")
    t.update(["p0"])
    assert t.lb.children["p1"].deactivated
    t.lb.reset_backoff()
    assert t.sub("p0-addr:80").reset_backoff_calls >= 1
    assert t.sub("p1-addr:80").reset_backoff_calls >= 1


def test_children_created_later_get_the_last_updates_endpoints_attributes_and_note():
    """grpc-java acceptResolvedAddresses: a child created by the failover
    timer gets its share of the endpoints, the attributes and the
    resolution note of the latest parent update (path stripped)."""
    reset_leaves()
    try:
        helper = FakeHelper()
        lb = PriorityFactory().build(helper)
        children = {n: {"config": leaf_config(n)} for n in ("p0", "p1")}
        config = registry.select(
            [{"priority_experimental": {"children": children, "priorities": ["p0", "p1"]}}]
        )[1]
        eps = [ep("a:80", "p0"), ep("b:80", "p1", "loc")]
        lb.update(ResolverUpdate(eps, config, {"fakeKey": "fakeValue"}, "note-1"))
        assert leaf("p0").updates[-1].attributes == {"fakeKey": "fakeValue"}
        helper.clock.advance(FAILOVER_TIMEOUT)
        update = leaf("p1").updates[-1]
        assert [e.addresses for e in update.endpoints] == [("b:80",)]
        assert update.endpoints[0].attributes[PATH_KEY] == ("loc",)
        assert update.attributes == {"fakeKey": "fakeValue"}
        assert update.resolution_note == "note-1"
        lb.update(ResolverUpdate([ep("c:81", "p1")], config, {}, ""))
        assert leaf("p1").updates[-1].attributes == {}
        assert [e.addresses for e in leaf("p1").updates[-1].endpoints] == [("c:81",)]
    finally:
        reset_leaves()
