"""The watchers of outlier_detection's and xds_override_host's subchannel
wrappers (lb/unwatch.py ``Watched``): one watcher sits in a slot, more make
a tuple; every report reaches the watchers registered when it started, in
the order registered; an unwatch handle forgets its own watcher once.
Issue 18: no list per wrapper at 10,000 endpoints, no copy per report."""

from __future__ import annotations

from typing import Any

import pytest

from pyxds.lb import OK_STATUS, ConnectivityState, Status
from pyxds.lb.outlier_detection import EJECTED_STATUS, OutlierDetectionSubchannel
from pyxds.lb.unwatch import Watched
from pyxds.lb.xds_override_host import OverrideHostSubchannel
from pyxds.testing import FakeSubchannel

READY, TF = ConnectivityState.READY, ConnectivityState.TRANSIENT_FAILURE


class _Wrapper(Watched):
    def __init__(self) -> None:
        self._watchers = None


class _Log:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def watcher(self, name: str) -> Any:
        def fn(state: Any, status: Any) -> None:
            self.seen.append((name, state))

        return fn


def test_one_watcher_is_kept_without_a_container_and_hears_each_report() -> None:
    wrapper, log = _Wrapper(), _Log()
    fn = log.watcher("a")
    unwatch = wrapper._add_watcher(fn)
    assert wrapper._watchers is fn
    wrapper._notify(READY, OK_STATUS)
    unwatch()
    unwatch()  # a second call does nothing
    wrapper._notify(TF, OK_STATUS)
    assert log.seen == [("a", READY)] and wrapper._watchers is None


def test_several_watchers_hear_reports_in_the_order_registered() -> None:
    wrapper, log = _Wrapper(), _Log()
    a, b, c = (log.watcher(n) for n in "abc")
    handles = [wrapper._add_watcher(fn) for fn in (a, b, c)]
    wrapper._notify(READY, OK_STATUS)
    handles[1]()  # the middle one
    wrapper._notify(TF, OK_STATUS)
    handles[0]()
    assert wrapper._watchers is c  # one left: back in the slot
    wrapper._notify(READY, OK_STATUS)
    first = [("a", READY), ("b", READY), ("c", READY)]
    assert log.seen == [*first, ("a", TF), ("c", TF), ("c", READY)]


def test_a_watcher_registered_twice_is_forgotten_once_per_handle() -> None:
    wrapper, log = _Wrapper(), _Log()
    fn = log.watcher("a")
    first, second = wrapper._add_watcher(fn), wrapper._add_watcher(fn)
    first()
    wrapper._notify(READY, OK_STATUS)
    assert log.seen == [("a", READY)]
    second()
    wrapper._notify(TF, OK_STATUS)
    assert log.seen == [("a", READY)] and wrapper._watchers is None


def test_a_report_reaches_the_watchers_registered_when_it_started() -> None:
    """A watcher that unwatches another or adds one: the report under way
    still reaches the one removed and not the one added (as the copied list
    did); the next report sees the change."""
    wrapper, log = _Wrapper(), _Log()
    late = log.watcher("late")
    handles: list[Any] = []

    def first(state: Any, status: Any) -> None:
        log.seen.append(("first", state))
        if state is READY:
            handles[1]()  # unwatch "second"
            wrapper._add_watcher(late)

    handles.append(wrapper._add_watcher(first))
    handles.append(wrapper._add_watcher(log.watcher("second")))
    wrapper._notify(READY, OK_STATUS)
    wrapper._notify(TF, OK_STATUS)
    assert log.seen == [("first", READY), ("second", READY), ("first", TF), ("late", TF)]


@pytest.mark.parametrize("two", [False, True])
def test_outlier_detection_wrapper_reports_ejection_and_real_states_to_its_watchers(
    two: bool,
) -> None:
    real = FakeSubchannel("10.0.0.1:80")
    wrapper = OutlierDetectionSubchannel(real, policy=None)  # type: ignore[arg-type]  # unused here
    log = _Log()
    names = ["a", "b"] if two else ["a"]
    handles = [wrapper.watch_state(log.watcher(n)) for n in names]
    assert log.seen == [(n, ConnectivityState.IDLE) for n in names]  # the current state at once
    real.set_state(READY)
    wrapper.eject()
    real.set_state(ConnectivityState.IDLE)  # held back while ejected
    wrapper.uneject()
    handles[0]()
    real.set_state(READY)
    expected = [(n, ConnectivityState.IDLE) for n in names]
    expected += [(n, READY) for n in names] + [(n, TF) for n in names]
    expected += [(n, ConnectivityState.IDLE) for n in names] + [(n, READY) for n in names[1:]]
    assert log.seen == expected
    ejected: list[Status] = []
    wrapper.watch_state(lambda state, status: ejected.append(status))
    wrapper.eject()
    assert ejected[-1] is EJECTED_STATUS


def test_override_host_wrapper_forwards_reports_until_shut_down() -> None:
    real = FakeSubchannel("10.0.0.1:80")

    class _Policy:
        released: list[Any] = []

        def _released(self, wrapper: Any) -> None:
            self.released.append(wrapper)

    policy = _Policy()
    wrapper = OverrideHostSubchannel(real, policy)  # type: ignore[arg-type]  # the one hook used
    log = _Log()
    unwatch_a = wrapper.watch_state(log.watcher("a"))
    wrapper.watch_state(log.watcher("b"))
    real.set_state(READY)
    assert wrapper.state is READY  # watched once: each report is the entry's state too
    unwatch_a()
    real.set_state(TF)
    assert wrapper.state is TF
    wrapper.shutdown()  # the child lets go: no watcher left
    real.set_state(ConnectivityState.IDLE)
    idle = ConnectivityState.IDLE
    assert log.seen == [("a", idle), ("b", idle), ("a", READY), ("b", READY), ("b", TF)]
    assert policy.released == [wrapper] and wrapper.state is idle


def test_override_host_over_outlier_detection_hears_each_report_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cds's A75 tree puts xds_override_host's wrapper over outlier_detection's:
    it watches the connectivity (for session picks) and the health (for its
    child).  While not ejected the two are the same report: one call into
    the override_host wrapper per report, not one per watch; while ejected
    the child hears TRANSIENT_FAILURE and the session the real state."""
    calls: list[str] = []
    for name in ("__call__", "connectivity_changed"):
        method = getattr(OverrideHostSubchannel, name)

        def counted(self: Any, *args: Any, _name: str = name, _method: Any = method) -> None:
            calls.append(_name)
            _method(self, *args)

        monkeypatch.setattr(OverrideHostSubchannel, name, counted)
    real = FakeSubchannel("10.0.0.1:80")
    od = OutlierDetectionSubchannel(real, policy=None)  # type: ignore[arg-type]  # unused here
    wrapper = OverrideHostSubchannel(od, policy=None)  # type: ignore[arg-type]  # unused here
    log = _Log()
    wrapper.watch_state(log.watcher("child"))
    calls.clear()
    real.set_state(READY)
    assert len(calls) == 1
    assert (wrapper.state, log.seen[-1]) == (READY, ("child", READY))
    od.eject()  # the health alone
    real.set_state(ConnectivityState.IDLE)  # the connectivity alone
    assert len(calls) == 3
    assert (wrapper.state, log.seen[-1]) == (ConnectivityState.IDLE, ("child", TF))
    od.uneject()
    real.set_state(READY)
    assert len(calls) == 5
    assert (wrapper.state, log.seen[-2:]) == (
        READY,
        [("child", ConnectivityState.IDLE), ("child", READY)],
    )
