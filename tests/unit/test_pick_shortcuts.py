"""The pick path's shortcuts (issue 18 item 2) change the cost of a pick,
never its outcome or what it counts:

* ``xds_cluster_impl`` hands the channel one counted result per (child
  result, counters, load stats) of an endpoint instead of a new one per
  pick; every call is still counted (circuit breaking, A32/A37; the
  locality's counts; LRS, A27) and every child ``on_call_done`` still runs;
* ``xds_override_host`` maps the child's stream in C for RPCs without a
  session, only when every child result is a plain pick of its wrapper;
  RPCs with a session take the full path (A55/A60) and share the rotation;
* a locality's counts survive a resetting snapshot without losing a call.
"""

from __future__ import annotations

import itertools
from typing import Any

import grpc
from test_cds_support import (
    OK,
    build,
    cds_update,
    connect_all,
    eds_cluster,
    eds_entry,
    loc,
    xds_config,
)
from test_xds_cluster_impl import start, unique

from pyxds.lb import PickArgs, PickComplete, PickDrop, Status
from pyxds.lb.api import ATTEMPT_NOT_STARTED, ConnectivityState, Picker
from pyxds.lb.call_counters import LocalityCounters, cluster_counters
from pyxds.lb.xds_cluster_impl import CountedSubchannel
from pyxds.lb.xds_override_host import (
    OVERRIDE_HOST_ATTRIBUTE,
    OverrideHostAttribute,
    OverrideHostPicker,
    _plain_stream,
)
from pyxds.xds.resources.types import EndpointAddress, Locality

FAILED = Status(grpc.StatusCode.UNAVAILABLE, "boom")
READY = ConnectivityState.READY


# -- xds_cluster_impl: one counted result per endpoint --------------------------------


def test_picks_of_one_endpoint_reuse_one_counted_result_and_count_every_call():
    name = unique("reuse")
    helper, _, _, _ = start(name)
    picks = [helper.pick() for _ in range(6)]
    by_address: dict[str, list[Any]] = {}
    for p in picks:
        assert isinstance(p, PickComplete)
        by_address.setdefault(p.subchannel.address, []).append(p)
    assert set(by_address) == {"10.0.0.1:80", "10.0.0.2:80"}
    for same in by_address.values():
        assert all(p is same[0] for p in same), "a constant child result is counted, not rebuilt"
    counters = cluster_counters(name)
    assert counters.in_flight == 6
    a = by_address["10.0.0.1:80"]
    a[0].on_call_done(OK)
    a[1].on_call_done(FAILED)  # the same object's callback, once per call
    load = {s.locality: s for s in counters.snapshot().localities}
    assert (load[loc("a")].started, load[loc("a")].succeeded, load[loc("a")].failed) == (3, 1, 1)
    assert load[loc("a")].in_flight == 1
    assert counters.in_flight == 4


def test_circuit_breaking_counts_each_call_through_the_reused_result():
    name = unique("cb-reuse")
    helper, _, _, _ = start(name, max_requests=2)
    first, second = helper.pick(), helper.pick()
    assert isinstance(first, PickComplete) and isinstance(second, PickComplete)
    assert isinstance(helper.pick(), PickDrop)
    first.on_call_done(OK)
    again = helper.pick()  # the same endpoint again (2 endpoints, round robin)
    assert isinstance(again, PickComplete)
    assert isinstance(helper.pick(), PickDrop)
    assert cluster_counters(name).in_flight == 2


class _Fresh(Picker):
    """A child picker whose every pick is a new result with its own callback
    on one of the policy's subchannels (as a per-call ORCA policy's)."""

    def __init__(self, subchannel: Any, seen: list[Status]) -> None:
        self.subchannel = subchannel
        self.seen = seen

    def pick(self, args: PickArgs) -> PickComplete:
        return PickComplete(self.subchannel, self.seen.append)


def test_a_new_child_result_per_pick_gets_its_own_callback_each_time():
    name = unique("fresh")
    helper, policy, _, _ = start(name)
    counted = next(iter(policy._subchannels))
    assert type(counted) is CountedSubchannel
    seen: list[Status] = []
    policy._child_reported(READY, OK, _Fresh(counted, seen))
    first, second = helper.pick(), helper.pick()
    assert isinstance(first, PickComplete) and isinstance(second, PickComplete)
    assert first is not second
    assert first.subchannel is counted.real and second.subchannel is counted.real
    first.on_call_done(OK)
    second.on_call_done(FAILED)
    assert seen == [OK, FAILED]
    assert cluster_counters(name).in_flight == 0


class _LoadStats:
    """What xds_cluster_impl calls on a locality's load-report stats."""

    wants_backend_metrics = False

    def __init__(self) -> None:
        self.events: list[str] = []

    def call_started(self) -> None:
        self.events.append("started")

    def call_finished(self, ok: bool) -> None:
        self.events.append("ok" if ok else "failed")

    def call_not_started(self) -> None:
        self.events.append("not started")


def test_load_stats_attached_later_count_the_next_pick_not_a_stale_result():
    name = unique("lrs-later")
    helper, policy, _, _ = start(name)
    before = [helper.pick() for _ in range(2)]  # both endpoints seen, results remembered
    stats = {s.address: _LoadStats() for s in policy._subchannels}
    for subchannel in policy._subchannels:
        subchannel.lrs = stats[subchannel.address]  # what _set_load_reporting does
    after = [helper.pick() for _ in range(2)]
    assert {p.subchannel.address for p in after} == {"10.0.0.1:80", "10.0.0.2:80"}
    assert not any(a is b for a in after for b in before), "a result without LRS was reused"
    after[0].on_call_done(OK)
    after[1].on_call_done(ATTEMPT_NOT_STARTED)
    events = sorted(e for s in stats.values() for e in s.events)
    assert events == ["not started", "ok", "started", "started"]


def test_new_counters_for_the_cluster_rebuild_the_counted_result():
    name = unique("recount")
    helper, policy, _, _ = start(name)
    old = helper.pick()
    assert isinstance(old, PickComplete)
    # the cluster's counters change (as an update to another EDS service
    # name does); the locality stats are left as they were, so only the
    # cluster's in-flight deque tells the remembered result is stale
    policy._counters = cluster_counters(name, "another-service")
    policy._dirty = True
    policy._publish()
    picks = [helper.pick() for _ in range(2)]
    assert all(isinstance(p, PickComplete) and p is not old for p in picks)
    assert cluster_counters(name, "another-service").in_flight == 2
    for p in picks:
        p.on_call_done(OK)
    assert cluster_counters(name, "another-service").in_flight == 0
    assert cluster_counters(name).in_flight == 1  # the old call, still running
    old.on_call_done(OK)
    assert cluster_counters(name).in_flight == 0


def test_a_removed_endpoint_forgets_its_counted_result_and_leaves_no_cycle():
    name = unique("forget")
    helper, policy, _, _ = start(name)
    for _ in range(2):
        helper.pick()
    counted = list(policy._subchannels)
    assert all(c.counted is not None for c in counted)
    policy.shutdown()  # every subchannel of the child is shut down
    # the remembered child result named the wrapper (wrapper -> memo ->
    # override_host's result -> wrapper): gone, so reference counts free it
    assert all(c.counted is None for c in counted)


# -- locality counts across a resetting snapshot ---------------------------------------


def test_a_locality_reset_loses_no_call_and_keeps_what_is_in_flight():
    counters = LocalityCounters("z")
    for _ in range(3):
        counters.call_started()
    counters.call_finished(True)
    first = counters._take(reset=True)
    assert (first.started, first.succeeded, first.failed, first.in_flight) == (3, 1, 0, 2)
    counters.call_finished(False)  # a call of the last interval ends in this one
    counters.count_started()  # the bound counter a picker keeps
    counters.count_succeeded()
    second = counters._take(reset=True)
    assert (second.started, second.succeeded, second.failed, second.in_flight) == (1, 1, 1, 1)
    third = counters._take(reset=False)
    assert (third.started, third.succeeded, third.failed, third.in_flight) == (0, 0, 0, 1)
    assert (counters.started, counters.succeeded, counters.failed) == (0, 0, 0)


# -- xds_override_host: the plain stream -----------------------------------------------


def _tree(name: str = "c1") -> tuple[Any, Any]:
    helper, policy, config = build([{"cds_experimental": {"cluster": name}}])
    cluster = eds_cluster(name, lb_policy_config='[{"round_robin": {}}]')
    eps = tuple(EndpointAddress((a,), 1, "UNKNOWN") for a in ("10.0.0.1:80", "10.0.0.2:80"))
    entry = eds_entry(cluster, [Locality(loc("a"), 1, eps)])
    assert policy.update(cds_update(config, xds_config({name: entry}))) is None
    connect_all(helper)
    return helper, policy


def _override_host_picker(helper: Any) -> OverrideHostPicker:
    picker = helper.last.picker._child  # xds_cluster_impl's child
    assert type(picker) is OverrideHostPicker
    return picker


def _args(session: OverrideHostAttribute | None = None) -> PickArgs:
    attrs: dict[str, Any] = {"cluster": "cluster:c1"}
    if session is not None:
        attrs[OVERRIDE_HOST_ATTRIBUTE] = session
    return PickArgs("/svc/M", (), attrs)


def test_rpcs_without_a_session_take_the_stream_and_get_the_wrappers_constant_results():
    helper, _ = _tree()
    picker = _override_host_picker(helper)
    wrappers = {r.subchannel.address: r.subchannel for r in picker.child.results}
    results = [picker.pick(_args()) for _ in range(4)]
    assert picker._plain_next is not None, "round_robin over plain wrappers: the shortcut"
    addresses = [r.subchannel.address for r in results]
    assert set(addresses) == {"10.0.0.1:80", "10.0.0.2:80"}
    assert all(a != b for a, b in itertools.pairwise(addresses)), "round robin as usual"
    for r in results:
        assert r is wrappers[r.subchannel.address].result  # what the full path returns


def test_rpcs_with_a_session_take_the_full_path_and_share_the_rotation():
    helper, _ = _tree()
    picker = _override_host_picker(helper)
    addresses = []
    for i in range(6):
        session = OverrideHostAttribute("") if i % 2 else None
        result = picker.pick(_args(session))
        assert isinstance(result, PickComplete)
        addresses.append(result.subchannel.address)
        if session is not None:  # the full path wrote the picked address for the cookie
            assert session.actual_address_list == result.subchannel.address
        else:
            assert picker._plain_next is not None
    assert set(addresses) == {"10.0.0.1:80", "10.0.0.2:80"}
    assert all(a != b for a, b in itertools.pairwise(addresses)), "one rotation for both"
    pinned = OverrideHostAttribute("10.0.0.2:80")
    for _ in range(3):
        result = picker.pick(_args(pinned))
        assert isinstance(result, PickComplete) and result.subchannel.address == "10.0.0.2:80"


class _Results(Picker):
    """A child picker offering a stream over a fixed tuple of results."""

    def __init__(self, results: tuple[Any, ...]) -> None:
        self.results = results
        self._cycle = itertools.cycle(results)

    def pick(self, args: PickArgs) -> Any:
        return next(self._cycle)

    def result_stream(self) -> Any:
        return self._cycle


def test_no_stream_when_a_child_result_is_not_a_plain_pick_of_the_wrapper():
    helper, _ = _tree()
    picker = _override_host_picker(helper)
    plain = picker.child.results
    assert _plain_stream(_Results(plain)) is not None
    done: list[Status] = []
    with_callback = tuple(PickComplete(r.subchannel, done.append) for r in plain)
    with_labels = tuple(PickComplete(r.subchannel, None, None, {"l": "v"}) for r in plain)
    bare = tuple(PickComplete(r.subchannel.real) for r in plain)  # not our wrapper
    for results in (with_callback, with_labels, bare, ()):
        assert _plain_stream(_Results(results)) is None, results

    class NoStream(_Results):
        def result_stream(self) -> Any:
            return None

    assert _plain_stream(NoStream(plain)) is None
    # the full path still maps those results and keeps the child's callback
    full = OverrideHostPicker(picker._policy, _Results(with_callback), frozenset(), lambda: 0.0)
    result = full.pick(_args())
    assert full._plain_next is None
    assert isinstance(result, PickComplete) and result.on_call_done is not None
    assert result.subchannel is plain[0].subchannel.real
    result.on_call_done(OK)
    assert done == [OK]


def test_the_stream_maps_each_result_to_its_own_wrappers_result_and_nothing_else():
    helper, _ = _tree()
    plain = _override_host_picker(helper).child.results
    # one of the child's own results, one made here on our wrapper
    mixed = (plain[0], PickComplete(plain[1].subchannel))
    nxt = _plain_stream(_Results(mixed))
    assert nxt is not None
    assert [nxt() for _ in range(4)] == [
        plain[0].subchannel.result,
        mixed[1].subchannel.result,
    ] * 2

    class Foreign(_Results):
        def result_stream(self) -> Any:
            return iter([PickComplete(plain[0].subchannel)])  # not one of ``results``

    foreign = _plain_stream(Foreign(plain))
    assert foreign is not None
    try:
        foreign()
    except KeyError:
        pass  # the channel fails the pick as a picker error
    else:
        raise AssertionError("a result outside the tuple was mapped")


def _count_calls(monkeypatch: Any, module: Any, name: str) -> list[Any]:
    """The argument of every call of ``module.name`` from now on."""
    calls: list[Any] = []
    original = getattr(module, name)

    def counted(arg: Any) -> Any:
        calls.append(arg)
        return original(arg)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_picker_maps_its_childs_results_at_its_first_pick_without_a_session_only(monkeypatch):
    """N endpoints connecting publish N pickers, most never picked from:
    none maps the child's N results until an RPC without a session picks
    (issue 18: a pass over N results per READY report was O(N^2) while
    1000 endpoints connect).  The picks are the ones mapped at build time
    gave: the child's rotation, each result's wrapper's constant result."""
    import pyxds.lb.xds_override_host as oh

    helper, _ = _tree()
    child = _override_host_picker(helper).child
    wrapped = {id(r): r.subchannel.result for r in child.results}
    mapped = _count_calls(monkeypatch, oh, "_plain_result")
    policy = _override_host_picker(helper)._policy
    pickers = [OverrideHostPicker(policy, _Results(child.results), frozenset(), lambda: 0.0)]
    pickers += [OverrideHostPicker(policy, child, frozenset(), lambda: 0.0) for _ in range(50)]
    assert mapped == [], "publishing pickers maps nothing"
    picker = pickers[0]
    session = OverrideHostAttribute("")
    first = picker.pick(_args(session))  # with a session: the full path, nothing mapped
    assert mapped == []
    assert first is wrapped[id(child.results[0])]
    picks = [picker.pick(_args()) for _ in range(5)]
    assert len(mapped) == len(child.results), "mapped once, at the first plain pick"
    expected = [wrapped[id(child.results[i % 2])] for i in range(1, 6)]
    assert picks == expected, "the child's rotation, continued after the session's pick"
    assert picker._plain_next is not None


def test_a_picker_whose_child_is_not_plain_looks_once_then_picks_the_full_way(monkeypatch):
    import pyxds.lb.xds_override_host as oh

    helper, _ = _tree()
    picker = _override_host_picker(helper)
    plain = picker.child.results
    done: list[Status] = []
    with_callback = tuple(PickComplete(r.subchannel, done.append) for r in plain)
    looked = _count_calls(monkeypatch, oh, "_plain_stream")
    full = OverrideHostPicker(picker._policy, _Results(with_callback), frozenset(), lambda: 0.0)
    results = [full.pick(_args()) for _ in range(4)]
    assert len(looked) == 1, "one look, by the first pick"
    assert full._plain_next is None
    for r, child_result in zip(results, with_callback * 2, strict=True):
        assert isinstance(r, PickComplete) and r.subchannel is child_result.subchannel.real
        assert r.on_call_done is not None
