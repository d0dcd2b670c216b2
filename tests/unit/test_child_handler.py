"""ChildPolicyHandler: building children from the registry, forwarding, and the
graceful switch (the old child serves until the new one leaves CONNECTING)."""

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
    PolicyFactory,
    PolicySelection,
    QueuePicker,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.child_handler import ChildPolicyHandler, DelegatingHelper, on_state_callback
from pyxds.lb.pick_first import PickFirstConfig
from pyxds.testing import FakeHelper

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE


@dataclass(frozen=True)
class Cfg:
    tag: str = ""


class Recorder(LoadBalancer):
    """A policy the test drives: it reports whatever the test tells it to."""

    built: list[Recorder] = []

    def __init__(self, name: str, helper: Helper) -> None:
        self.name = name
        self.helper = helper
        self.updates: list[ResolverUpdate] = []
        self.errors: list[Status] = []
        self.exit_idle_calls = 0
        self.reset_backoff_calls = 0
        self.shut_down = False
        Recorder.built.append(self)

    def report(self, state: ConnectivityState) -> None:
        picker = FailPicker(Status(grpc.StatusCode.UNAVAILABLE, self.name))
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
        self.shut_down = True


class RecorderFactory(PolicyFactory):
    def __init__(self, name: str) -> None:
        self.name = name

    def parse_config(self, json_config):
        return Cfg(json_config.get("tag", ""))

    def build(self, helper: Helper) -> Recorder:
        return Recorder(self.name, helper)


@pytest.fixture(autouse=True)
def recorder_policies():
    Recorder.built = []
    for name in ("test_old", "test_new", "test_third"):
        registry.register(RecorderFactory(name))
    yield
    for name in ("test_old", "test_new", "test_third"):
        registry.unregister(name)


def upd(name: str, tag: str = "") -> ResolverUpdate:
    return ResolverUpdate([Endpoint(("a:1",))], PolicySelection(name, Cfg(tag)))


def reported_by(helper: FakeHelper) -> str:
    """Which child's picker the parent holds now."""
    picker = helper.last.picker
    assert isinstance(picker, FailPicker)
    return picker.status.details


def test_first_update_builds_the_named_policy_and_forwards_its_config():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old", "x"))
    (child,) = Recorder.built
    assert child.name == "test_old"
    assert child.updates[0].config == Cfg("x")
    assert handler.child is child and handler.policy_name == "test_old"
    child.report(CONNECTING)
    assert helper.state_sequence() == [CONNECTING]


def test_update_naming_the_same_policy_goes_to_the_current_child():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old", "1"))
    handler.update(upd("test_old", "2"))
    assert len(Recorder.built) == 1
    assert [u.config for u in Recorder.built[0].updates] == [Cfg("1"), Cfg("2")]


def test_graceful_switch_old_serves_until_new_leaves_connecting():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    old = Recorder.built[0]
    old.report(READY)
    handler.update(upd("test_new"))
    new = Recorder.built[1]
    assert new.updates and not old.shut_down
    new.report(CONNECTING)
    new.report(CONNECTING)
    assert helper.state_sequence() == [READY]
    assert reported_by(helper) == "test_old"
    new.report(READY)
    assert old.shut_down
    assert helper.state_sequence() == [READY, READY]
    assert reported_by(helper) == "test_new"
    assert handler.child is new


def test_graceful_switch_completes_when_new_reports_transient_failure():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    old = Recorder.built[0]
    old.report(READY)
    handler.update(upd("test_new"))
    Recorder.built[1].report(TF)
    assert old.shut_down and helper.state is TF and reported_by(helper) == "test_new"


def test_graceful_switch_completes_when_old_leaves_ready():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    old = Recorder.built[0]
    old.report(READY)
    handler.update(upd("test_new"))
    new = Recorder.built[1]
    new.report(CONNECTING)
    old.report(IDLE)
    assert old.shut_down
    assert helper.state is CONNECTING  # the new child's state, not the old's IDLE
    assert reported_by(helper) == "test_new"


def test_old_leaving_ready_before_new_reported_does_not_keep_a_dead_picker():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    old = Recorder.built[0]
    old.report(READY)
    handler.update(upd("test_new"))  # the new child has not reported anything yet
    old.report(IDLE)
    assert old.shut_down
    # the parent must not keep the shut-down child's READY picker
    assert helper.state is CONNECTING
    assert isinstance(helper.last.picker, QueuePicker)


def test_switch_while_current_not_ready_is_immediate():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    old = Recorder.built[0]
    old.report(CONNECTING)
    handler.update(upd("test_new"))
    assert old.shut_down
    new = Recorder.built[1]
    assert handler.child is new and new.updates
    new.report(CONNECTING)
    assert reported_by(helper) == "test_new"


def test_reports_from_a_replaced_child_are_dropped():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    old = Recorder.built[0]
    old.report(CONNECTING)
    handler.update(upd("test_new"))
    n = len(helper.states)
    old.report(READY)
    assert len(helper.states) == n


def test_switching_back_to_current_discards_pending():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    old = Recorder.built[0]
    old.report(READY)
    handler.update(upd("test_new"))
    handler.update(upd("test_old", "again"))
    new = Recorder.built[1]
    assert new.shut_down and not old.shut_down
    assert old.updates[-1].config == Cfg("again")
    new.report(READY)
    assert reported_by(helper) == "test_old"


def test_second_update_to_pending_policy_reuses_the_pending_child():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    Recorder.built[0].report(READY)
    handler.update(upd("test_new", "1"))
    handler.update(upd("test_new", "2"))
    assert len(Recorder.built) == 2
    assert [u.config for u in Recorder.built[1].updates] == [Cfg("1"), Cfg("2")]


def test_third_policy_replaces_pending():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    Recorder.built[0].report(READY)
    handler.update(upd("test_new"))
    handler.update(upd("test_third"))
    assert Recorder.built[1].shut_down
    assert handler.policy_name == "test_third"


def test_forwarding_of_errors_exit_idle_backoff_and_shutdown():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    handler.update(upd("test_old"))
    old = Recorder.built[0]
    old.report(READY)
    handler.update(upd("test_new"))
    new = Recorder.built[1]
    error = Status(grpc.StatusCode.UNAVAILABLE, "boom")
    handler.resolver_error(error)
    handler.reset_backoff()
    handler.exit_idle()
    # resolver errors go to the latest child only (C-core ChildPolicyHandler,
    # grpc-go gracefulswitch ResolverError)
    assert old.errors == [] and new.errors == [error]
    assert old.reset_backoff_calls == new.reset_backoff_calls == 1
    assert new.exit_idle_calls == 1  # the newest child is the one to wake
    handler.shutdown()
    assert old.shut_down and new.shut_down


def test_update_without_policy_selection_is_a_programming_error():
    handler = ChildPolicyHandler(FakeHelper())
    with pytest.raises(TypeError):
        handler.update(ResolverUpdate([], Cfg()))


def test_same_config_twice_through_the_handler_is_a_no_op():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    config = registry.select_policy([{"pick_first": {}}])
    assert config == PolicySelection("pick_first", PickFirstConfig())
    update = ResolverUpdate([Endpoint(("a:1",)), Endpoint(("b:1",))], config)
    handler.update(update)
    again = ResolverUpdate(
        [Endpoint(("a:1",)), Endpoint(("b:1",))], registry.select_policy([{"pick_first": {}}])
    )
    before = (len(helper.states), len(helper.subchannels))
    handler.update(again)
    assert (len(helper.states), len(helper.subchannels)) == before
    assert not any(s.shut_down for s in helper.subchannels)


def test_delegating_helper_forwards_the_helper_api():
    parent = FakeHelper(seed=9)
    seen = []
    helper = on_state_callback(lambda *args: seen.append(args), parent)
    assert isinstance(helper, DelegatingHelper)
    assert helper.clock is parent.clock and helper.random is parent.random
    sc = helper.create_subchannel("a:1", {})
    assert parent.subchannels == [sc]
    helper.request_reresolution()
    assert parent.reresolution_requests == 1
    helper.update_state(READY, OK_STATUS, QueuePicker())
    assert parent.states == [] and seen and seen[0][0] is READY
    # Only the Helper API is forwarded: an attribute lookup never climbs the tree.
    with pytest.raises(AttributeError):
        helper.state_sequence  # noqa: B018
