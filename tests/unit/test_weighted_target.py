"""weighted_target_experimental (gRFC A28 "Weighted target LB policy"): one
test per rule of issue 3 and per TRAPS.md "weighted_target" item."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
from collections import Counter
from typing import Any

import grpc
import pytest

from pyxds.lb import (
    ConnectivityState,
    PickArgs,
    PickComplete,
    PickFail,
    PickQueue,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.errors import LBConfigError
from pyxds.lb.registry import PolicySelection
from pyxds.lb.weighted_target import (
    CHILD_RETENTION,
    WeightedPicker,
    WeightedTarget,
    WeightedTargetConfig,
    WeightedTargetFactory,
    WeightedTargetLoadBalancer,
)
from pyxds.testing import FakeHelper

try:
    from test_priority_leaf_support import (
        LEAF,
        LeafConfig,
        ep,
        has_leaf,
        leaf,
        leaf_config,
        leaves,
        pick_subchannel,
        reset_leaves,
    )
except ImportError:  # pragma: no cover - package-style test collection
    from .test_priority_leaf_support import (  # type: ignore[no-redef]
        LEAF,
        LeafConfig,
        ep,
        has_leaf,
        leaf,
        leaf_config,
        leaves,
        pick_subchannel,
        reset_leaves,
    )

CS = ConnectivityState
READY, IDLE, CONNECTING, TF = CS.READY, CS.IDLE, CS.CONNECTING, CS.TRANSIENT_FAILURE
ARGS = PickArgs("/svc/Method")


@pytest.fixture(autouse=True)
def _fresh_leaves():
    reset_leaves()
    yield
    reset_leaves()


def wt_json(weights: dict[str, int], children=None) -> dict:
    children = children or {}
    return {
        "targets": {
            name: {"weight": weight, "childPolicy": children.get(name, leaf_config(name))}
            for name, weight in weights.items()
        }
    }


def parse(weights, children=None) -> WeightedTargetConfig:
    factory, parsed = registry.select(
        [{"weighted_target_experimental": wt_json(weights, children)}]
    )
    assert factory.name == "weighted_target_experimental"
    return parsed


class Harness:
    def __init__(self, seed: int = 0) -> None:
        self.helper = FakeHelper(seed=seed)
        self.clock = self.helper.clock
        self.lb: WeightedTargetLoadBalancer = WeightedTargetFactory().build(self.helper)

    def update(self, weights, children=None, endpoints=None, note=""):
        if endpoints is None:
            endpoints = [ep(f"{name}-addr:80", name) for name in weights]
        return self.lb.update(
            ResolverUpdate(endpoints, parse(weights, children), resolution_note=note)
        )

    @property
    def reports(self) -> int:
        return len(self.helper.states)


def picked_addresses(picker, n: int) -> Counter:
    counts: Counter = Counter()
    for _ in range(n):
        result = picker.pick(ARGS)
        counts[result.subchannel.address if isinstance(result, PickComplete) else result] += 1
    return counts


# ---------------------------------------------------------------------------
# Rule 1: config
# ---------------------------------------------------------------------------


def test_config_parses_into_frozen_equal_values():
    a = parse({"a": 1, "b": 3})
    assert a == parse({"a": 1, "b": 3}) and hash(a) == hash(parse({"a": 1, "b": 3}))
    assert a.targets["b"] == WeightedTarget(3, PolicySelection(LEAF, LeafConfig("b")))
    assert a != parse({"a": 1, "b": 4})
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.targets = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.targets["c"] = a.targets["a"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        (
            {"targets": {"a": {"weight": 0, "childPolicy": leaf_config("a")}}},
            'targets["a"].weight',
            "[1, 4294967295]",
        ),
        (
            {"targets": {"a": {"weight": 2**32, "childPolicy": leaf_config("a")}}},
            'targets["a"].weight',
            "4294967296",
        ),
        (
            # "1" is 1 as in grpcio 1.85; "1.0" is not an integer there either
            {"targets": {"a": {"weight": "1.0", "childPolicy": leaf_config("a")}}},
            'targets["a"].weight',
            "expected integer",
        ),
        (
            {"targets": {"a": {"weight": 1.5, "childPolicy": leaf_config("a")}}},
            'targets["a"].weight',
            "expected integer",
        ),
        (
            {"targets": {"a": {"weight": float("inf"), "childPolicy": leaf_config("a")}}},
            'targets["a"].weight',
            "expected integer",
        ),
        (
            {"targets": {"a": {"weight": float("nan"), "childPolicy": leaf_config("a")}}},
            'targets["a"].weight',
            "expected integer",
        ),
        ({"targets": {"a": {"childPolicy": leaf_config("a")}}}, 'targets["a"].weight', "missing"),
        ({"targets": {"a": {"weight": 1}}}, 'targets["a"].childPolicy', "missing"),
        (
            {"targets": {"a": {"weight": 1, "childPolicy": [{"nope": {}}]}}},
            'targets["a"].childPolicy',
            "nope",
        ),
        (
            {"targets": {"a": {"weight": 1, "childPolicy": [{LEAF: {"tag": 1}}]}}},
            'targets["a"].childPolicy[0].test_leaf.tag',
            "expected string",
        ),
        ({"targets": {"a": 5}}, 'targets["a"]', "expected object"),
        ({"targets": []}, "targets", "expected object"),
        ({}, "targets", "missing"),
    ],
)
def test_config_errors_name_the_field(body, path, words):
    with pytest.raises(LBConfigError) as err:
        WeightedTargetFactory().parse_config(body)
    assert err.value.path == path
    assert words in str(err.value)


def test_config_error_is_prefixed_by_the_policy_name_through_the_registry():
    with pytest.raises(LBConfigError) as err:
        registry.select(
            [
                {
                    "weighted_target_experimental": {
                        "targets": {"x": {"weight": 0, "childPolicy": leaf_config("x")}}
                    }
                }
            ]
        )
    assert err.value.path == 'weighted_target_experimental.targets["x"].weight'


def test_config_built_directly_rejects_weight_zero():
    with pytest.raises(LBConfigError):
        WeightedTarget(0, PolicySelection(LEAF, LeafConfig("a")))


# ---------------------------------------------------------------------------
# Rule 2: children
# ---------------------------------------------------------------------------


def test_a_child_is_built_for_every_target_at_once():
    h = Harness()
    h.update({"a": 1, "b": 2, "c": 3})
    assert has_leaf("a") and has_leaf("b") and has_leaf("c")
    assert [e.addresses for e in leaf("b").updates[-1].endpoints] == [("b-addr:80",)]
    assert leaf("b").updates[-1].endpoints[0].attributes["hierarchical_path"] == ()


def test_weight_only_change_updates_the_picker_and_recreates_nothing():
    h = Harness()
    h.update({"a": 1, "b": 1})
    leaf("a").report(READY)
    leaf("b").report(READY)
    subchannels = list(h.helper.subchannels)
    assert isinstance(h.helper.last.picker, WeightedPicker)
    assert h.helper.last.picker.weights == [1, 1]
    h.update({"a": 1, "b": 9})
    assert len(leaves("a")) == len(leaves("b")) == 1
    assert h.helper.subchannels == subchannels
    assert h.helper.last.picker.weights == [1, 9]
    counts = picked_addresses(h.helper.last.picker, 10_000)
    assert counts["b-addr:80"] > 8 * counts["a-addr:80"]


def test_removed_target_is_kept_15_minutes_out_of_picks_and_reused_if_readded():
    h = Harness()
    h.update({"a": 1, "b": 1})
    a = leaf("a")
    a.report(READY)
    leaf("b").report(CONNECTING)
    h.update({"b": 1})
    # Deactivated: neither aggregated nor picked.
    assert h.helper.state is CONNECTING and isinstance(h.helper.pick(), PickQueue)
    assert not a.shut_down
    h.clock.advance(CHILD_RETENTION - 1)
    h.update({"a": 5, "b": 1})
    assert leaf("a") is a and len(leaves("a")) == 1
    assert h.helper.state is READY and pick_subchannel(h.helper) == "a-addr:80"
    h.clock.advance(CHILD_RETENTION * 2)
    assert not a.shut_down


def test_removed_target_is_destroyed_after_15_minutes():
    h = Harness()
    h.update({"a": 1, "b": 1})
    a = leaf("a")
    h.update({"b": 1})
    h.clock.advance(CHILD_RETENTION - 0.001)
    assert not a.shut_down
    h.clock.advance(0.001)
    assert a.shut_down and "a" not in h.lb.children
    h.update({"a": 1, "b": 1})
    assert leaf("a") is not a


def test_stale_retention_timer_after_readding_does_not_destroy_the_target():
    h = Harness()
    h.update({"a": 1, "b": 1})
    a = leaf("a")
    h.update({"b": 1})
    stale = h.clock.pending[0]
    h.update({"a": 1, "b": 1})
    stale.fn()  # a late callback of the cancelled timer
    assert not a.shut_down and "a" in h.lb.children


def test_targets_are_keyed_by_name_even_with_identical_child_configs():
    h = Harness()
    same = leaf_config("same")
    h.update({"p0-loc": 1, "p1-loc": 1}, children={"p0-loc": same, "p1-loc": same})
    assert len(leaves("same")) == 2
    assert set(h.lb.children) == {"p0-loc", "p1-loc"}


# ---------------------------------------------------------------------------
# Rule 3: picking
# ---------------------------------------------------------------------------


def test_picks_only_go_to_ready_children():
    h = Harness()
    h.update({"a": 1, "b": 100, "c": 100})
    leaf("a").report(READY)
    leaf("b").report(CONNECTING)
    leaf("c").report(TF)
    counts = picked_addresses(h.helper.last.picker, 2000)
    assert counts == Counter({"a-addr:80": 2000})


def test_single_ready_child_publishes_its_own_picker():
    h = Harness()
    h.update({"a": 1, "b": 1})
    picker = leaf("a").report(READY)
    assert h.helper.last.picker is picker


def test_picks_follow_the_weights_within_one_percent_over_100k_seeded_picks():
    h = Harness(seed=1234)
    weights = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 10}
    h.update(weights)
    for name in weights:
        leaf(name).report(READY)
    n = 100_000
    counts = picked_addresses(h.helper.last.picker, n)
    total = sum(weights.values())
    for name, weight in weights.items():
        assert abs(counts[f"{name}-addr:80"] / n - weight / total) < 0.01, (name, counts)


class _Scripted:
    """A random source whose draws the test chooses."""

    def __init__(self, bucket: int, position: float) -> None:
        self.bucket, self.position = bucket, position

    def getrandbits(self, bits: int) -> int:
        assert 0 <= self.bucket < (1 << bits)
        return self.bucket

    def random(self) -> float:
        return self.position


class _Tag:
    """A child picker whose every pick is its index (no result stream)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def pick(self, args):
        return self.index


class _StreamTag(_Tag):
    """The same, offering its picks as a result stream (as round_robin's)."""

    def result_stream(self):
        return itertools.repeat(self.index)


@pytest.mark.parametrize("tag", [_Tag, _StreamTag], ids=["calls", "streams"])
@pytest.mark.parametrize(
    "weights", [(1, 2, 1), (1, 2), (1, 2, 3, 5, 7), (7,), (1, 10**6, 1), (3,) * 37]
)
def test_picker_maps_every_draw_to_the_child_whose_weight_slice_holds_it(weights, tag):
    total = sum(weights)
    ends = [sum(weights[: i + 1]) / total for i in range(len(weights))]
    entries = [(w, tag(i)) for i, w in enumerate(weights)]
    assert WeightedPicker(entries, _Scripted(0, 0.0)).fast is (tag is _StreamTag)
    buckets = WeightedPicker(entries, _Scripted(0, 0.0)).buckets
    straddling = 0
    for bucket in range(buckets):
        for position in (0.0, 0.25, 0.5, 0.999):
            u = (bucket + position) / buckets
            expected = min(sum(1 for end in ends if end <= u), len(weights) - 1)
            picker = WeightedPicker(entries, _Scripted(bucket, position))
            assert picker.pick(ARGS) == expected, (bucket, position, u)
        lo, hi = bucket / buckets, (bucket + 1) / buckets
        straddling += any(lo < end < hi for end in ends)
    # Most buckets need no bisect: at most one straddling bucket per boundary.
    assert straddling <= len(weights) - 1


@pytest.mark.parametrize("tag", [_Tag, _StreamTag], ids=["calls", "streams"])
def test_picker_never_indexes_past_the_last_child_at_the_top_of_the_range(tag):
    # The boundary 0.999999 lies inside the last bucket, so that bucket bisects.
    entries = [(10**6 - 1, tag(0)), (1, tag(1))]
    buckets = WeightedPicker(entries, _Scripted(0, 0.0)).buckets
    # Out of contract, but a float sum can round up to the very top.
    assert WeightedPicker(entries, _Scripted(buckets - 1, 1.0)).pick(ARGS) == 1
    assert WeightedPicker(entries, _Scripted(buckets - 1, 0.0)).pick(ARGS) == 0


def test_picker_uses_the_helpers_random_source():
    results = []
    for _ in range(2):
        h = Harness(seed=99)
        h.update({"a": 1, "b": 1, "c": 1})
        for name in "abc":
            leaf(name).report(READY)
        results.append([pick_subchannel(h.helper) for _ in range(50)])
    assert results[0] == results[1]
    assert len(set(results[0])) == 3


# ---------------------------------------------------------------------------
# Rule 4: aggregation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ((READY, TF, CONNECTING), READY),
        ((TF, CONNECTING, IDLE), CONNECTING),
        ((TF, IDLE, TF), IDLE),
        ((TF, TF, TF), TF),
        ((READY, READY, READY), READY),
    ],
)
def test_aggregate_state_ready_then_connecting_then_idle_else_failure(states, expected):
    h = Harness()
    h.update({"a": 1, "b": 1, "c": 1})
    for name, state in zip("abc", states, strict=True):
        leaf(name).report(state)
    assert h.helper.state is expected
    if expected in (CONNECTING, IDLE):
        assert isinstance(h.helper.pick(), PickQueue)


def test_child_in_transient_failure_counts_as_failing_until_it_reports_ready():
    h = Harness()
    h.update({"a": 1, "b": 1})
    leaf("a").report(TF, "a down")
    leaf("b").report(TF, "b down")
    assert h.helper.state is TF
    before = h.reports
    leaf("a").report(CONNECTING)
    leaf("a").report(IDLE)
    assert h.helper.state is TF and h.reports == before
    # Still fails with its own last error, not a queue.
    assert {type(r) for r in picked_addresses(h.helper.last.picker, 200)} == {PickFail}
    leaf("a").report(READY)
    assert h.helper.state is READY and pick_subchannel(h.helper) == "a-addr:80"


def test_all_children_failing_fail_each_rpc_with_the_picked_childs_own_error():
    h = Harness()
    h.update({"a": 1, "b": 3})
    leaf("a").report(TF, "a: connection refused")
    leaf("b").report(TF, "b: no route to host")
    assert h.helper.state is TF
    assert h.helper.last.status.details in ("a: connection refused", "b: no route to host")
    counts = picked_addresses(h.helper.last.picker, 4000)
    a_fail = PickFail(Status(grpc.StatusCode.UNAVAILABLE, "a: connection refused"))
    b_fail = PickFail(Status(grpc.StatusCode.UNAVAILABLE, "b: no route to host"))
    assert set(counts) == {a_fail, b_fail}
    assert 2.4 < counts[b_fail] / counts[a_fail] < 3.6


def test_child_reporting_idle_is_told_to_exit_idle_at_once():
    """C-core WeightedChild: IDLE -> ExitIdleLocked() inside the report; no
    clock tick needed (issue 3: "told to exit idle at once")."""
    h = Harness()
    h.update({"a": 1, "b": 1})
    leaf("b").report(READY)
    leaf("a").report(IDLE)
    assert leaf("a").exit_idle_calls == 1
    leaf("a").report(CONNECTING)
    leaf("a").report(IDLE)
    assert leaf("a").exit_idle_calls == 2
    h.clock.advance(0)
    assert leaf("a").exit_idle_calls == 2  # nothing deferred


def test_idle_is_aggregated_before_exit_idle_so_a_nested_report_wins():
    """The IDLE is published first; a CONNECTING the child reports from
    inside exit_idle is the newest state and is published last."""
    h = Harness()
    h.update({"a": 1})
    a = leaf("a")
    original = a.exit_idle

    def exit_idle_reporting_connecting():
        original()
        a.report(CONNECTING)

    a.exit_idle = exit_idle_reporting_connecting
    a.report(IDLE)
    assert [report.state for report in h.helper.states[-2:]] == [IDLE, CONNECTING]
    assert h.helper.state is CONNECTING
    assert a.exit_idle_calls == 1


def test_idle_reported_from_inside_exit_idle_is_not_answered_again():
    h = Harness()
    h.update({"a": 1})
    a = leaf("a")
    original = a.exit_idle

    def exit_idle_reporting_idle():
        original()
        a.report(IDLE)

    a.exit_idle = exit_idle_reporting_idle
    a.report(IDLE)  # no unbounded recursion
    assert a.exit_idle_calls == 1
    assert h.helper.state is IDLE


def test_failing_child_reporting_idle_is_still_told_to_exit_idle():
    """Sticky TRANSIENT_FAILURE keeps the aggregate, but the IDLE child is
    still asked to reconnect (C-core calls ExitIdle before the TF check)."""
    h = Harness()
    h.update({"a": 1})
    leaf("a").report(TF, "down")
    reports = h.reports
    leaf("a").report(IDLE)
    assert leaf("a").exit_idle_calls == 1
    assert h.reports == reports
    assert h.helper.state is TF


def test_all_children_updated_before_aggregating_once():
    h = Harness()
    h.update({"a": 1, "b": 1})
    leaf("a").report(READY)
    leaf("b").report(READY)
    before = h.reports
    # "a" loses its endpoints and reports TRANSIENT_FAILURE mid-update; "b"
    # reports CONNECTING then; the parent sees a single, final report.
    h.update(
        {"a": 1, "b": 1, "c": 1},
        children={
            "a": leaf_config("a", on_update="TRANSIENT_FAILURE"),
            "b": leaf_config("b", on_update="READY"),
            "c": leaf_config("c", on_update="CONNECTING"),
        },
        endpoints=[ep("b-addr:80", "b"), ep("c-addr:80", "c")],
    )
    assert h.reports == before + 1
    assert h.helper.state is READY and pick_subchannel(h.helper) == "b-addr:80"


def test_no_targets_reports_transient_failure_with_the_resolution_note():
    h = Harness()
    h.update({}, note="EDS resource foo: no localities")
    assert h.helper.state is TF
    expected = Status(
        grpc.StatusCode.UNAVAILABLE,
        "no children in weighted_target policy: EDS resource foo: no localities",
    )
    assert h.helper.last.status == expected
    assert h.helper.pick() == PickFail(expected)


def test_same_config_twice_is_a_no_op():
    h = Harness()
    h.update({"a": 1, "b": 2})
    leaf("a").report(READY)
    leaf("b").report(READY)
    subchannels = list(h.helper.subchannels)
    before, picker = h.reports, h.helper.last.picker
    for _ in range(2):
        assert h.update({"a": 1, "b": 2}) is None
    assert len(leaves("a")) == len(leaves("b")) == 1
    assert h.helper.subchannels == subchannels
    assert h.reports == before and h.helper.last.picker is picker
    assert h.helper.state is READY and picker.weights == [1, 2]


def test_resolver_error_goes_to_children_and_fails_without_children():
    h = Harness()
    error = Status(grpc.StatusCode.UNAVAILABLE, "resolution failed")
    h.lb.resolver_error(error)
    assert h.helper.state is TF and h.helper.last.status == error
    h.update({"a": 1})
    leaf("a").report(READY)
    before = h.reports
    h.lb.resolver_error(error)
    assert leaf("a").resolver_errors == [error]
    assert h.reports == before  # no child changed: nothing re-published


def test_exit_idle_and_reset_backoff_reach_the_children():
    h = Harness()
    h.update({"a": 1, "b": 1})
    h.lb.exit_idle()
    h.lb.reset_backoff()
    assert leaf("a").exit_idle_calls == leaf("b").exit_idle_calls == 1
    assert leaf("a").reset_backoff_calls == leaf("b").reset_backoff_calls == 1


def test_child_rejections_are_returned_as_errors_from_children():
    h = Harness()
    status = h.update({"a": 1}, children={"a": leaf_config("a", reject=True)})
    assert status is not None
    assert status.details == "errors from children: [child a: UNAVAILABLE: a rejected its update]"


def test_reresolution_requests_pass_through():
    h = Harness()
    h.update({"a": 1})
    leaf("a").helper.request_reresolution()
    assert h.helper.reresolution_requests == 1


def test_shutdown_shuts_every_child_and_ignores_late_reports():
    h = Harness()
    h.update({"a": 1, "b": 1})
    a = leaf("a")
    h.update({"b": 1})
    before = h.reports
    h.lb.shutdown()
    assert a.shut_down and leaf_is_down("b")
    a.report(READY)
    h.clock.advance(CHILD_RETENTION * 2)
    assert h.reports == before


def leaf_is_down(tag: str) -> bool:
    return all(candidate.shut_down for candidate in leaves(tag))


def _round_robin_picker(tag: str, n: int) -> Any:
    from pyxds.lb.round_robin import RoundRobinPicker

    return RoundRobinPicker([PickComplete(f"{tag}{i}") for i in range(n)], 0)


def test_picker_over_round_robin_children_composes_their_streams_into_a_c_level_pick():
    entries = [(w, _round_robin_picker(name, 2)) for name, w in (("a", 1), ("b", 3))]
    picker = WeightedPicker(entries, random.Random(5))
    assert picker.fast
    assert isinstance(picker.pick, functools.partial)  # no Python frame per pick
    assert picker.result_stream() is not None  # offered to a parent in turn


def test_stream_picks_follow_the_weights_within_one_percent_over_100k_seeded_picks():
    weights = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 10}
    entries = [(w, _round_robin_picker(name, 3)) for name, w in weights.items()]
    picker = WeightedPicker(entries, random.Random(1234))
    n = 100_000
    counts = Counter(picker.pick(ARGS).subchannel[0] for _ in range(n))
    total = sum(weights.values())
    for name, weight in weights.items():
        assert abs(counts[name] / n - weight / total) < 0.01, (name, counts)


def test_stream_picks_advance_each_childs_own_round_robin_rotation():
    child = _round_robin_picker("a", 3)
    picker = WeightedPicker([(1, child), (1, _round_robin_picker("b", 1))], random.Random(7))
    seen = [r.subchannel for r in (picker.pick(ARGS) for _ in range(200)) if r.subchannel[0] == "a"]
    assert seen[:6] == ["a0", "a1", "a2", "a0", "a1", "a2"]
    assert child.pick(ARGS).subchannel == ["a0", "a1", "a2"][len(seen) % 3]


def test_nested_weighted_pickers_compose_streams_and_multiply_the_weights():
    inner = WeightedPicker(
        [(1, _round_robin_picker("x", 1)), (3, _round_robin_picker("y", 1))], random.Random(3)
    )
    outer = WeightedPicker([(1, inner), (1, _round_robin_picker("z", 1))], random.Random(4))
    assert inner.fast and outer.fast
    n = 80_000
    counts = Counter(outer.pick(ARGS).subchannel for _ in range(n))
    for name, share in (("x0", 1 / 8), ("y0", 3 / 8), ("z0", 1 / 2)):
        assert abs(counts[name] / n - share) < 0.01, counts


def test_one_child_without_a_stream_makes_the_picker_call_every_childs_pick():
    entries = [(1, _round_robin_picker("a", 1)), (1, _Tag(7))]
    picker = WeightedPicker(entries, random.Random(2))
    assert not picker.fast
    assert picker.result_stream() is None
    results = {getattr(picker.pick(ARGS), "subchannel", None) for _ in range(200)}
    assert results == {"a0", None}


# ---------------------------------------------------------------------------
# The bucket index: built once per weights, shared by the pickers over them
# (issue 18: a READY child's new picker must not cost a new bucket table)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("tag", [_Tag, _StreamTag], ids=["calls", "streams"])
def test_picker_sharing_an_index_keeps_each_pickers_own_children(tag):
    rng = random.Random(11)
    old = WeightedPicker([(1, tag(0)), (3, tag(1))], rng)
    new = WeightedPicker([(1, tag(10)), (3, tag(1))], rng, old.index)
    assert new.index is old.index
    old_counts: Counter = Counter()
    new_counts: Counter = Counter()
    for _ in range(40_000):  # interleaved: the shared draws never mix the children up
        old_counts[old.pick(ARGS)] += 1
        new_counts[new.pick(ARGS)] += 1
    assert set(old_counts) == {0, 1} and set(new_counts) == {10, 1}
    assert abs(old_counts[1] / 40_000 - 0.75) < 0.01
    assert abs(new_counts[1] / 40_000 - 0.75) < 0.01


def test_picker_builds_its_own_index_when_the_given_one_has_other_weights_or_rng():
    rng = random.Random(3)
    first = WeightedPicker([(1, _Tag(0)), (1, _Tag(1))], rng)
    reweighted = WeightedPicker([(1, _Tag(0)), (2, _Tag(1))], rng, first.index)
    assert reweighted.index is not first.index and reweighted.weights == [1, 2]
    other_rng = WeightedPicker([(1, _Tag(0)), (1, _Tag(1))], random.Random(3), first.index)
    assert other_rng.index is not first.index


def _counting_bucket_index(monkeypatch) -> list[tuple[int, ...]]:
    import pyxds.lb.weighted_target as module

    built: list[tuple[int, ...]] = []

    class Counting(module.BucketIndex):
        __slots__ = ()

        def __init__(self, weights, rng):
            built.append(weights)
            super().__init__(weights, rng)

    monkeypatch.setattr(module, "BucketIndex", Counting)
    return built


def test_ready_childs_new_picker_reuses_the_bucket_index_only_a_weight_change_rebuilds(
    monkeypatch,
):
    built = _counting_bucket_index(monkeypatch)
    h = Harness(seed=4)
    names = [f"t{i}" for i in range(20)]
    h.update({name: 1 + i % 3 for i, name in enumerate(names)})
    for name in names:
        leaf(name).report(READY)
    ramp = len(built)
    first = h.helper.last.picker
    shuffled = random.Random(9)
    for _ in range(300):  # READY children publishing new pickers, weights unchanged
        leaf(shuffled.choice(names)).report(READY)
    last = h.helper.last.picker
    assert last is not first and last.index is first.index
    assert len(built) == ramp
    counts = picked_addresses(last, 60_000)
    total = sum(1 + i % 3 for i in range(20))
    for i, name in enumerate(names):
        assert abs(counts[f"{name}-addr:80"] / 60_000 - (1 + i % 3) / total) < 0.01, name
    h.update({**{name: 1 + i % 3 for i, name in enumerate(names)}, "t0": 7})
    assert len(built) == ramp + 1 and h.helper.last.picker.index is not first.index


def _counting_replacements(monkeypatch) -> list[bool]:
    """Whether each ``WeightedPicker.replacing`` call gave a picker (the O(1) path)."""
    replaced: list[bool] = []
    original = WeightedPicker.replacing

    def counting(self, position, picker):
        result = original(self, position, picker)
        replaced.append(result is not None)
        return result

    monkeypatch.setattr(WeightedPicker, "replacing", counting)
    return replaced


def _round_robin_targets(seed: int, targets: int) -> Harness:
    """Targets t0.. of weights 1.. with a round_robin child of 3 endpoints each."""
    h = Harness(seed=seed)
    weights = {f"t{i}": 1 + i for i in range(targets)}
    rr = [{"round_robin": {}}]
    endpoints = [ep(f"{name}-{j}:80", name) for name in weights for j in range(3)]
    h.update(weights, children={name: rr for name in weights}, endpoints=endpoints)
    return h


def test_ready_child_reports_publish_exactly_what_a_full_aggregate_would(monkeypatch):
    """A READY child's new READY picker is published by replacing that one
    child in the last picker (no pass over every child).  Through 600
    random subchannel events under round_robin children (READY pickers
    with streams, children entering and leaving READY and TRANSIENT_FAILURE)
    every published picker is checked against one built from scratch over
    the policy's READY children: the same state, weights and children."""
    replaced = _counting_replacements(monkeypatch)
    h = _round_robin_targets(seed=6, targets=6)
    rng = random.Random(17)
    states = [READY, READY, READY, CONNECTING, IDLE, TF]
    for _ in range(600):
        subchannel = rng.choice(h.helper.live_subchannels())
        subchannel.set_state(rng.choice(states))
        state, picker = h.helper.last.state, h.helper.last.picker
        ready = [(t.weight, t.picker) for t in h.lb._active if t.state is READY]
        if not ready:
            assert state is not READY
            continue
        assert state is READY
        if len(ready) == 1:
            assert picker is ready[0][1]
            continue
        fresh = WeightedPicker(ready, random.Random(0))
        assert picker.weights == fresh.weights and picker.fast == fresh.fast
        assert all(a == b for a, b in zip(picker._children, fresh._children, strict=True))
    assert sum(replaced) > 50  # the O(1) path ran, and was checked


def test_failing_child_reports_publish_exactly_what_a_full_aggregate_would(monkeypatch):
    """While every child fails, a failing child's new failure (one of its
    endpoints failed another connection attempt: round_robin names the
    last failure) is published by replacing that one child in the last
    picker, as a READY child's new picker is.  Through 600 random failures
    and recoveries under round_robin children, every TRANSIENT_FAILURE
    published is checked against a full aggregate: the first failing
    child's status and a picker over the failing children with their
    weights, each child's own picker.  On the full pass over every child
    the replacing path never ran (the last assertion)."""
    replaced = _counting_replacements(monkeypatch)
    h = _round_robin_targets(seed=8, targets=5)
    for subchannel in h.helper.live_subchannels():
        subchannel.set_state(CONNECTING)
        subchannel.set_state(TF, f"{subchannel.address}: refused")
    rng = random.Random(23)
    checked = 0
    for attempt in range(600):
        subchannel = rng.choice(h.helper.live_subchannels())
        if rng.random() < 0.05:
            subchannel.set_state(CONNECTING)
            subchannel.set_state(READY)
            subchannel.set_state(IDLE)
        subchannel.set_state(TF, f"{subchannel.address}: refused #{attempt % 7}")
        failing = [t for t in h.lb._active if t.state is TF]
        last = h.helper.last
        if len(failing) < len(h.lb._active):
            continue
        assert last.state is TF and last.status == failing[0].status
        checked += 1
        if len(failing) == 1:
            assert last.picker is failing[0].picker
            continue
        fresh = WeightedPicker([(t.weight, t.picker) for t in failing], random.Random(0))
        assert last.picker.weights == fresh.weights and not last.picker.fast
        assert all(a == b for a, b in zip(last.picker._children, fresh._children, strict=True))
        for _ in range(20):
            result = last.picker.pick(ARGS)
            assert isinstance(result, PickFail) and result.status in [t.status for t in failing]
    assert checked > 300
    assert sum(replaced) > 200  # the O(1) path ran, and was checked
