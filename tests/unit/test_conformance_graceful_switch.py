"""Conformance: ChildPolicyHandler's graceful switch against grpc-go
internal/balancer/gracefulswitch/gracefulswitch_test.go and C-core's
ChildPolicyHandler (child_policy_handler.cc), where they agree.

pyxds switches when the policy *name* changes (C-core
ConfigChangeRequiresNewPolicyInstance); an update naming the current policy
while another is pending goes back to the current one (deliberate: no new
instance, nothing restarts).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from pyxds.lb import (
    OK_STATUS,
    ConnectivityState,
    Endpoint,
    FailPicker,
    Helper,
    LoadBalancer,
    PickComplete,
    PolicyFactory,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.child_handler import ChildPolicyHandler
from pyxds.lb.pick_first import PickFirstConfig
from pyxds.lb.registry import PolicySelection
from pyxds.lb.round_robin import RoundRobinConfig
from pyxds.testing import FakeHelper

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
NAMES = ("gs_one", "gs_two", "gs_three")


@dataclass(frozen=True)
class Cfg:
    tag: str = ""


class Mock(LoadBalancer):
    """A child the test drives (grpc-go's mockBalancer)."""

    built: list[Mock] = []

    def __init__(self, name: str, helper: Helper, inline: ConnectivityState | None) -> None:
        self.name = name
        self.helper = helper
        self.updates: list[ResolverUpdate] = []
        self.errors: list[Status] = []
        self.exit_idle_calls = 0
        self.reset_backoff_calls = 0
        self.closed = False
        Mock.built.append(self)
        if inline is not None:  # grpc-go TestInlineCallbackInBuild
            self.report(inline, f"{name} in build")

    def report(self, state: ConnectivityState, tag: str | None = None) -> None:
        picker = FailPicker(Status(grpc.StatusCode.UNAVAILABLE, tag or self.name))
        self.helper.update_state(state, OK_STATUS, picker)

    def update(self, update: ResolverUpdate) -> Status | None:
        self.updates.append(update)
        return None

    def resolver_error(self, status: Status) -> None:
        self.errors.append(status)

    def exit_idle(self) -> None:
        self.exit_idle_calls += 1

    def reset_backoff(self) -> None:
        self.reset_backoff_calls += 1

    def shutdown(self) -> None:
        self.closed = True


class MockFactory(PolicyFactory):
    inline: ConnectivityState | None = None

    def __init__(self, name: str) -> None:
        self.name = name

    def parse_config(self, json_config):
        return Cfg()

    def build(self, helper: Helper) -> Mock:
        return Mock(self.name, helper, MockFactory.inline)


@pytest.fixture(autouse=True)
def mock_policies():
    Mock.built = []
    MockFactory.inline = None
    for name in NAMES:
        registry.register(MockFactory(name))
    yield
    for name in NAMES:
        registry.unregister(name)


def upd(name: str, tag: str = "") -> ResolverUpdate:
    return ResolverUpdate([Endpoint(("a:1",))], PolicySelection(name, Cfg(tag)))


def published(helper: FakeHelper) -> str:
    picker = helper.last.picker
    assert isinstance(picker, FailPicker)
    return picker.status.details


def ready_current() -> tuple[ChildPolicyHandler, FakeHelper, Mock]:
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("gs_one"))
    current = Mock.built[-1]
    current.report(READY)
    return handler, helper, current


def test_pending_connecting_is_held_back_and_its_first_other_state_swaps_it_in():
    """grpc-go TestTwoBalancersSameType (the pending half)."""
    handler, helper, current = ready_current()
    handler.update(upd("gs_two"))
    pending = Mock.built[-1]
    n = len(helper.states)
    pending.report(CONNECTING)
    assert len(helper.states) == n and published(helper) == "gs_one"
    pending.report(READY)
    assert helper.state is READY and published(helper) == "gs_two"
    assert current.closed and not pending.closed


def test_updates_go_to_the_pending_child_only():
    """grpc-go TestTwoBalancersSameType: "A ClientConn update received should
    be forwarded to the new pending LB policy, and not the current one"."""
    handler, _helper, current = ready_current()
    handler.update(upd("gs_two"))
    pending = Mock.built[-1]
    handler.update(upd("gs_two", "again"))
    assert len(current.updates) == 1
    assert [u.config for u in pending.updates] == [Cfg(), Cfg("again")]


def test_current_not_ready_lets_any_pending_report_swap():
    """grpc-go TestCurrentNotReadyPendingUpdate."""
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("gs_one"))
    current = Mock.built[-1]
    current.report(CONNECTING)
    handler.update(upd("gs_two"))
    pending = Mock.built[-1]
    pending.report(CONNECTING, "pending connecting")
    assert helper.state is CONNECTING and published(helper) == "pending connecting"
    assert current.closed


def test_current_leaving_ready_publishes_the_pending_cached_state():
    """grpc-go TestCurrentLeavingReady: the swap publishes the pending
    child's cached CONNECTING picker; the old child is closed and its later
    reports are dropped."""
    handler, helper, current = ready_current()
    handler.update(upd("gs_two"))
    pending = Mock.built[-1]
    pending.report(CONNECTING, "cached")
    current.report(IDLE)
    assert helper.state is CONNECTING and published(helper) == "cached"
    assert current.closed
    n = len(helper.states)
    current.report(READY, "stale")
    assert len(helper.states) == n


def test_current_reports_still_reach_the_parent_while_a_child_is_pending():
    """grpc-go balancerWrapper.UpdateState: "continue to forward current
    balancer updates to the Client Conn"."""
    handler, helper, current = ready_current()
    handler.update(upd("gs_two"))
    current.report(READY, "new ready picker")
    assert published(helper) == "new ready picker"
    assert not current.closed


def test_pending_replaced_by_another_pending_is_closed_and_silenced():
    """grpc-go TestPendingReplacedByAnotherPending."""
    handler, helper, current = ready_current()
    handler.update(upd("gs_two"))
    first_pending = Mock.built[-1]
    handler.update(upd("gs_three"))
    second_pending = Mock.built[-1]
    assert first_pending.closed and not current.closed
    n = len(helper.states)
    first_pending.report(READY)
    assert len(helper.states) == n
    second_pending.report(READY)
    assert published(helper) == "gs_three" and current.closed


def test_resolver_error_reaches_only_the_latest_child():
    """grpc-go Balancer.ResolverError: "The resolver data is only relevant to
    the most recent LB Policy"; C-core ChildPolicyHandler does the same."""
    handler, _helper, current = ready_current()
    handler.update(upd("gs_two"))
    pending = Mock.built[-1]
    error = Status(grpc.StatusCode.UNAVAILABLE, "resolver down")
    handler.resolver_error(error)
    assert current.errors == [] and pending.errors == [error]


def test_resolver_error_without_pending_reaches_current():
    """grpc-go Balancer.ResolverError with only a current balancer."""
    handler, _helper, current = ready_current()
    error = Status(grpc.StatusCode.UNAVAILABLE, "resolver down")
    handler.resolver_error(error)
    assert current.errors == [error]


def test_exit_idle_reaches_the_latest_child():
    """grpc-go Balancer.ExitIdle: forwards to the latest balancer."""
    handler, _helper, current = ready_current()
    handler.update(upd("gs_two"))
    pending = Mock.built[-1]
    handler.exit_idle()
    assert (current.exit_idle_calls, pending.exit_idle_calls) == (0, 1)


def test_reresolution_from_the_outgoing_child_is_dropped():
    """C-core ChildPolicyHandler::Helper::RequestReresolution / grpc-go
    ResolveNow: "Ignore ResolveNow requests from anything other than the
    most recent balancer"."""
    handler, helper, current = ready_current()
    handler.update(upd("gs_two"))
    pending = Mock.built[-1]
    current.helper.request_reresolution()
    assert helper.reresolution_requests == 0
    pending.helper.request_reresolution()
    assert helper.reresolution_requests == 1


def test_close_shuts_down_both_children_and_silences_them():
    """grpc-go TestBalancerClose."""
    handler, helper, current = ready_current()
    handler.update(upd("gs_two"))
    pending = Mock.built[-1]
    handler.shutdown()
    assert current.closed and pending.closed
    n = len(helper.states)
    current.report(READY)
    pending.report(READY)
    current.helper.request_reresolution()
    assert len(helper.states) == n and helper.reresolution_requests == 0


def test_child_reporting_inside_build_is_handled():
    """grpc-go TestInlineCallbackInBuild: a child may report before build
    returns."""
    MockFactory.inline = READY
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("gs_one"))
    assert helper.state is READY and published(helper) == "gs_one in build"
    handler.update(upd("gs_two"))  # pending reports READY inline: swaps in
    assert published(helper) == "gs_two in build"
    assert Mock.built[0].closed


def test_switch_back_to_the_current_policy_discards_pending():
    """pyxds (deliberate, see module docstring): no new instance of the
    policy that is already serving."""
    handler, _helper, current = ready_current()
    handler.update(upd("gs_two"))
    pending = Mock.built[-1]
    handler.update(upd("gs_one", "back"))
    assert pending.closed and not current.closed
    assert current.updates[-1].config == Cfg("back")
    assert len(Mock.built) == 2


def test_pick_first_keeps_serving_until_round_robin_is_ready():
    """The switch with real leaves: pick_first READY serves until the new
    round_robin child leaves CONNECTING, then its subchannels go."""
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    endpoints = [Endpoint(("10.0.0.1:80",)), Endpoint(("10.0.0.2:80",))]
    pf = registry.get("pick_first")
    rr = registry.get("round_robin")
    handler.update(ResolverUpdate(endpoints, PolicySelection("pick_first", PickFirstConfig())))
    pf_sc = helper.subchannel("10.0.0.1:80")
    pf_sc.set_state(READY)
    assert helper.state is READY
    handler.update(ResolverUpdate(endpoints, PolicySelection("round_robin", RoundRobinConfig())))
    assert pf is not None and rr is not None
    result = helper.pick()
    assert isinstance(result, PickComplete) and result.subchannel is pf_sc
    rr_sc = [s for s in helper.live_subchannels() if s is not pf_sc]
    assert sorted(s.address for s in rr_sc) == ["10.0.0.1:80", "10.0.0.2:80"]
    rr_sc[0].set_state(READY)
    assert pf_sc.shut_down
    result = helper.pick()
    assert isinstance(result, PickComplete) and result.subchannel is rr_sc[0]
