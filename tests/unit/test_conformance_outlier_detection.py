"""Conformance: outlier_detection_experimental against the scenarios of the
other implementations' suites (C-core
test/core/load_balancing/outlier_detection_test.cc, grpc-go
internal/xds/balancer/outlierdetection/balancer_test.go, grpc-java
util/src/test/java/io/grpc/util/OutlierDetectionLoadBalancerTest.java) and
gRFC A50, with C-core's choices where A50 and C-core part (each says so).

Each test names the test it was taken from.  FakeClock drives the ejection
timer; ``helper.random`` stands in for the enforcement draw.  grpc-java's
``subchannelUpdateAddress_*`` cases have no counterpart: a pyxds subchannel
keeps its address for life (C-core's too); an endpoint whose address set
changes is covered instead (C-core EjectionStateResetsWhenEndpointAddressesChange).
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from test_outlier_detection import drive as calls

from pyxds.lb import PickComplete, ResolverUpdate, Status, registry
from pyxds.lb.api import ConnectivityState, Endpoint
from pyxds.lb.outlier_detection import EJECTED_STATUS, OutlierDetectionPolicy
from pyxds.testing import FakeHelper, FakeSubchannel

IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
OK = Status(grpc.StatusCode.OK)
FAILED = Status(grpc.StatusCode.UNAVAILABLE, "uh oh")
RR = [{"round_robin": {}}]

ADDRESSES = [f"127.0.0.1:{port}" for port in range(440, 446)]


def od_config(**fields: Any) -> Any:
    body: dict[str, Any] = {"childPolicy": RR, **fields}
    return registry.select([{"outlier_detection_experimental": body}])[1]


def as_endpoints(groups: list[str | tuple[str, ...]]) -> list[Endpoint]:
    return [Endpoint((g,) if isinstance(g, str) else g) for g in groups]


def start(groups: list[str | tuple[str, ...]], **fields: Any):
    helper = FakeHelper()
    policy = registry.get("outlier_detection_experimental").build(helper)
    assert isinstance(policy, OutlierDetectionPolicy)
    policy.update(ResolverUpdate(as_endpoints(groups), od_config(**fields)))
    return policy, helper


def all_ready(helper: FakeHelper) -> None:
    for subchannel in helper.subchannels:
        if subchannel.state is not READY:
            subchannel.set_state(CONNECTING)
            subchannel.set_state(READY)
    assert helper.state is READY


def calls_to(helper: FakeHelper, address: str, status: Status, n: int) -> None:
    """``n`` finished calls on ``address`` exactly (round_robin picks until
    it has sent that many there; the others succeed)."""
    sent = 0
    for _ in range(100 * n):  # bounded
        if sent == n:
            return
        result = helper.pick()
        assert isinstance(result, PickComplete), result
        assert result.on_call_done is not None
        if result.subchannel.address == address:
            result.on_call_done(status)
            sent += 1
    raise AssertionError(f"{address} was picked {sent} times, wanted {n}")


def served(helper: FakeHelper, n: int = 60) -> set[str]:
    return {helper.pick().subchannel.address for _ in range(n)}


def ejected(policy: OutlierDetectionPolicy) -> set[str]:
    return {address for key in policy.ejected for address in key}


# -- C-core outlier_detection_test.cc ------------------------------------------------------


def test_one_failed_call_ejects_its_endpoint_until_the_next_sweep():
    """C-core OutlierDetectionTest.FailurePercentage: threshold 1 %, volume
    1, one host, 1 s ejections, default interval (10 s) and default
    maxEjectionPercent (10 %, yet one of three is ejected)."""
    fp = {"threshold": 1, "minimumHosts": 1, "requestVolume": 1}
    policy, helper = start(
        ADDRESSES[:3],
        failurePercentageEjection=fp,
        baseEjectionTime="1s",
        maxEjectionTime="1s",
    )
    all_ready(helper)
    result = helper.pick()
    bad = result.subchannel.address
    result.on_call_done(FAILED)
    helper.clock.advance(10)
    assert ejected(policy) == {bad}
    assert served(helper) == set(ADDRESSES[:3]) - {bad}
    helper.clock.advance(10)
    assert ejected(policy) == set()
    assert served(helper) == set(ADDRESSES[:3])


def test_an_ejected_endpoint_is_not_served_on_its_other_address_and_returns_on_it():
    """C-core OutlierDetectionTest.MultipleAddressesPerEndpoint (grpc-go
    TestMultipleAddressesPerEndpoint): a call on the endpoint's first
    address counts for the endpoint, and the ejection covers the subchannels
    of both its addresses; its connection fails while it is ejected and its
    second address connects: not served until the sweep that un-ejects it,
    then served there.  (C-core's pick_first reconnects during the ejection,
    which reaches it through the health watch; pyxds's wrapper holds the
    real reports back as A50 says, so pick_first reconnects at
    un-ejection: docs/differences-from-c-core.md.)"""
    e1, e2, e3 = ADDRESSES[0:2], ADDRESSES[2:4], ADDRESSES[4:6]
    fp = {"threshold": 1, "minimumHosts": 1, "requestVolume": 1}
    policy, helper = start(
        [tuple(e1), tuple(e2), tuple(e3)],
        failurePercentageEjection=fp,
        baseEjectionTime="1s",
        maxEjectionTime="1s",
    )
    for endpoint in (e1, e2, e3):
        sc = helper.subchannel(endpoint[0])
        sc.set_state(CONNECTING)
        sc.set_state(READY)
    assert helper.state is READY
    calls_to(helper, e1[0], FAILED, 1)
    helper.clock.advance(10)
    assert ejected(policy) == set(e1)
    assert served(helper) == {e2[0], e3[0]}
    wrappers = [w for w in policy._wrappers if w.address in e1]
    assert wrappers and all(w.ejected for w in wrappers)
    # The first address's connection fails; the second address connects.
    first = helper.subchannel(e1[0])
    first.set_state(IDLE)
    first.set_state(CONNECTING)
    first.set_state(TF)
    second = helper.subchannel(e1[1])
    second.set_state(CONNECTING)
    second.set_state(READY)
    assert served(helper) == {e2[0], e3[0]}
    helper.clock.advance(10)
    assert ejected(policy) == set()
    assert served(helper) == {e1[1], e2[0], e3[0]}


def test_an_endpoint_whose_address_set_changes_starts_unejected():
    """C-core OutlierDetectionTest.EjectionStateResetsWhenEndpointAddressesChange
    (grpc-go TestEjectionStateResetsWhenEndpointAddressesChange): the
    ejected endpoint loses one address; the remaining address is a new
    endpoint, not ejected, and is served at once."""
    e1, e2, e3 = ADDRESSES[0:2], ADDRESSES[2:4], ADDRESSES[4:6]
    fp = {"threshold": 1, "minimumHosts": 1, "requestVolume": 1}
    body = {"failurePercentageEjection": fp, "baseEjectionTime": "1s", "maxEjectionTime": "1s"}
    policy, helper = start([tuple(e1), tuple(e2), tuple(e3)], **body)
    for endpoint in (e1, e2, e3):
        sc = helper.subchannel(endpoint[0])
        sc.set_state(CONNECTING)
        sc.set_state(READY)
    calls_to(helper, e1[0], FAILED, 1)
    helper.clock.advance(10)
    assert served(helper) == {e2[0], e3[0]}
    policy.update(ResolverUpdate(as_endpoints([e1[0], tuple(e2), tuple(e3)]), od_config(**body)))
    assert ejected(policy) == set()
    assert policy.endpoint_state(e1[0]).multiplier == 0
    assert served(helper) == {e1[0], e2[0], e3[0]}


# -- A50 and C-core: max_ejection_percent --------------------------------------------------


def test_max_ejection_percent_zero_still_ejects_one_endpoint():
    """C-core's sweep ejects while ``ejected_host_count == 0 ||
    current_percent < max_ejection_percent`` (Envoy: "will eject at least
    one host regardless of the value"); A50's literal step 3.1 would stop at
    0 %.  grpc-java successRateThreeOutliers_maxEjectionPercentage calls this
    the Envoy behaviour."""
    fp = {"threshold": 50, "minimumHosts": 3, "requestVolume": 10}
    policy, helper = start(ADDRESSES[:4], failurePercentageEjection=fp, maxEjectionPercent=0)
    all_ready(helper)
    calls(helper, {ADDRESSES[0]: FAILED, ADDRESSES[1]: FAILED}, 80)
    helper.clock.advance(10)
    assert len(ejected(policy)) == 1


def test_success_rate_may_overshoot_max_ejection_percent_by_the_last_ejection():
    """grpc-java successRateThreeOutliers_maxEjectionPercentage: five
    endpoints, three outliers, 30 %: the second ejection takes the share to
    40 %, and the third is refused."""
    sr = {"minimumHosts": 3, "requestVolume": 10, "stdevFactor": 1}
    policy, helper = start(ADDRESSES[:5], successRateEjection=sr, maxEjectionPercent=30)
    all_ready(helper)
    calls(helper, {a: FAILED for a in ADDRESSES[:3]}, 100)
    helper.clock.advance(10)
    assert len(ejected(policy)) == 2


# -- grpc-java: the two algorithms together --------------------------------------------------


def test_failure_percentage_ejects_what_success_rate_lacked_the_volume_for():
    """grpc-java successRateAndFailurePercentageThreeOutliers: success rate
    (volume 10) ejects the two failing endpoints; failure percentage
    (threshold 0, volume 1) also ejects the one whose single call failed,
    skipping those already ejected."""
    sr = {"minimumHosts": 3, "requestVolume": 10, "stdevFactor": 1}
    fp = {"threshold": 0, "minimumHosts": 3, "requestVolume": 1}
    policy, helper = start(
        ADDRESSES[:5],
        successRateEjection=sr,
        failurePercentageEjection=fp,
        maxEjectionPercent=100,
    )
    all_ready(helper)
    outcome = {ADDRESSES[0]: FAILED, ADDRESSES[1]: FAILED}
    for address in (ADDRESSES[0], ADDRESSES[1], ADDRESSES[3], ADDRESSES[4]):
        calls_to(helper, address, outcome.get(address, OK), 20)
    calls_to(helper, ADDRESSES[2], FAILED, 1)
    # calls_to finishes only the calls to its address: one failed call here.
    assert policy.endpoint_state(ADDRESSES[2]).active.values() == (0, 1)
    helper.clock.advance(10)
    assert ejected(policy) == set(ADDRESSES[:3])
    assert policy.endpoint_state(ADDRESSES[0]).multiplier == 1  # ejected once, not twice


def test_success_rate_threshold_uses_the_population_standard_deviation():
    """grpc-java mathChecksOut (success rates 60, 47, 17, 43, 30 %: mean
    39.4, stdev 14.732, the population one) and C-core's sweep: with
    stdevFactor 600 the threshold is 30.56 %, so 17 % and 30 % are ejected
    (a sample standard deviation, 16.47, would give 29.52 % and spare 30 %)."""
    rates = dict(zip(ADDRESSES[:5], (60, 47, 17, 43, 30), strict=True))
    sr = {"minimumHosts": 5, "requestVolume": 100, "stdevFactor": 600}
    policy, helper = start(ADDRESSES[:5], successRateEjection=sr, maxEjectionPercent=100)
    all_ready(helper)
    for address, percent in rates.items():
        state = policy.endpoint_state(address)
        for _ in range(percent):
            state.record(OK)
        for _ in range(100 - percent):
            state.record(FAILED)
    helper.clock.advance(10)
    assert ejected(policy) == {ADDRESSES[2], ADDRESSES[4]}


def test_a_config_change_keeps_an_ejection_and_enforcement_zero_adds_none():
    """grpc-java successRateOneOutlier_configChange."""
    sr = {"minimumHosts": 3, "requestVolume": 10}
    policy, helper = start(ADDRESSES[:5], successRateEjection=sr, maxEjectionPercent=50)
    all_ready(helper)
    calls(helper, {ADDRESSES[0]: FAILED}, 100)
    helper.clock.advance(10)
    assert ejected(policy) == {ADDRESSES[0]}
    quiet = {**sr, "enforcementPercentage": 0}
    policy.update(
        ResolverUpdate(
            as_endpoints(ADDRESSES[:5]),
            od_config(successRateEjection=quiet, maxEjectionPercent=50),
        )
    )
    assert ejected(policy) == {ADDRESSES[0]}
    calls(helper, {ADDRESSES[1]: FAILED}, 100)
    helper.clock.advance(10)
    assert ejected(policy) == {ADDRESSES[0]}


# -- C-core: what counts as a candidate ------------------------------------------------------


def test_endpoints_without_calls_are_no_candidates_even_with_request_volume_zero():
    """C-core's GetSuccessRateAndVolume gives no candidate for an endpoint
    with no calls in the interval, whatever requestVolume is (A50 read
    literally would count them with requestVolume 0): one endpoint with
    calls is fewer than minimumHosts 2, so nothing is ejected."""
    fp = {"threshold": 10, "minimumHosts": 2, "requestVolume": 0}
    policy, helper = start(ADDRESSES[:3], failurePercentageEjection=fp, maxEjectionPercent=100)
    all_ready(helper)
    policy.endpoint_state(ADDRESSES[0]).record(FAILED)
    helper.clock.advance(10)
    assert ejected(policy) == set()


# -- the interval timer (A50 "Outlier Detection Behavior") -------------------------------------


def test_timer_starts_at_the_interval_and_a_later_config_keeps_its_start():
    """grpc-go TestDurationOfInterval (8 s; then 9 s five seconds later runs
    ~4 s after; a no-op config starts no timer) and grpc-java
    acceptResolvedAddresses_intervalUpdate (after the timer ran, the same
    config 4 s later keeps the due time)."""
    sr = {"minimumHosts": 5, "requestVolume": 100}
    policy, helper = start(ADDRESSES[:2], successRateEjection=sr, interval="8s")
    assert helper.clock.next_deadline() == pytest.approx(8.0)
    helper.clock.advance(5)
    policy.update(
        ResolverUpdate(
            as_endpoints(ADDRESSES[:2]), od_config(successRateEjection=sr, interval="9s")
        )
    )
    assert helper.clock.next_deadline() == pytest.approx(9.0)  # 4 s from now
    helper.clock.advance(4)  # the sweep ran at t=9; next at 18
    assert helper.clock.next_deadline() == pytest.approx(18.0)
    helper.clock.advance(4)
    policy.update(
        ResolverUpdate(
            as_endpoints(ADDRESSES[:2]), od_config(successRateEjection=sr, interval="9s")
        )
    )
    assert helper.clock.next_deadline() == pytest.approx(18.0)
    policy.update(ResolverUpdate(as_endpoints(ADDRESSES[:2]), od_config(interval="10s")))
    assert helper.clock.pending == []


def test_detection_disabled_then_enabled_starts_a_fresh_interval_and_fresh_counters():
    """grpc-java acceptResolvedAddresses_outlierDetectionDisabled and A50:
    a config without algorithms cancels the timer and un-ejects; enabling
    again starts the timer for a full interval from then, with counters
    reset."""
    fp = {"threshold": 50, "minimumHosts": 2, "requestVolume": 10}
    policy, helper = start(ADDRESSES[:2], failurePercentageEjection=fp, maxEjectionPercent=100)
    all_ready(helper)
    calls(helper, {ADDRESSES[0]: FAILED}, 40)
    helper.clock.advance(10)
    assert ejected(policy) == {ADDRESSES[0]}
    helper.clock.advance(3)
    policy.update(ResolverUpdate(as_endpoints(ADDRESSES[:2]), od_config()))
    assert helper.clock.pending == []
    assert ejected(policy) == set()
    assert helper.pick().on_call_done is None  # nothing is counted
    helper.clock.advance(4)  # t=17
    policy.update(
        ResolverUpdate(
            as_endpoints(ADDRESSES[:2]),
            od_config(failurePercentageEjection=fp, maxEjectionPercent=100),
        )
    )
    assert helper.clock.next_deadline() == pytest.approx(27.0)
    calls(helper, {}, 40)  # healthy now
    helper.clock.advance(10)
    assert ejected(policy) == set()
    assert policy.endpoint_state(ADDRESSES[0]).multiplier == 0


# -- the subchannel wrapper (A50 "Subchannel Wrapper") -----------------------------------------


def test_every_watcher_of_a_wrapper_sees_ejection_and_the_latest_state_after_it():
    """A50 "Subchannel Wrapper" with several watchers on one wrapper (the
    wrapper keeps one watcher in a slot, lb/unwatch.py): each registered
    watcher gets TRANSIENT_FAILURE on ejection, none of the real reports
    while ejected, and the latest real state on un-ejection; a watcher
    added while ejected starts with TRANSIENT_FAILURE; one unwatched gets
    nothing more."""
    fp = {"threshold": 50, "minimumHosts": 2, "requestVolume": 10}
    policy, helper = start(ADDRESSES[:2], failurePercentageEjection=fp, maxEjectionPercent=100)
    all_ready(helper)
    wrapper = next(w for w in policy._wrappers if w.address == ADDRESSES[0])
    seen: dict[str, list[tuple[ConnectivityState, Status]]] = {"a": [], "b": [], "c": []}
    stop_a = wrapper.watch_state(lambda s, st: seen["a"].append((s, st)))
    wrapper.watch_state(lambda s, st: seen["b"].append((s, st)))
    assert seen["a"] == seen["b"] == [(READY, OK)]
    calls(helper, {ADDRESSES[0]: FAILED}, 40)
    helper.clock.advance(10)
    assert seen["a"][-1] == seen["b"][-1] == (TF, EJECTED_STATUS)
    wrapper.watch_state(lambda s, st: seen["c"].append((s, st)))
    assert seen["c"] == [(TF, EJECTED_STATUS)]
    real: FakeSubchannel = wrapper.real  # type: ignore[assignment]
    before = {k: len(v) for k, v in seen.items()}
    real.set_state(IDLE)
    real.set_state(CONNECTING)
    assert {k: len(v) for k, v in seen.items()} == before
    stop_a()
    stop_a()  # twice: harmless
    helper.clock.advance(30)  # base 30 s: un-ejected at t=40
    assert ejected(policy) == set()
    assert len(seen["a"]) == before["a"]
    assert seen["b"][-1] == seen["c"][-1] == (CONNECTING, OK)


def test_a_subchannel_the_child_shut_down_is_no_longer_ejected_or_counted():
    """grpc-go TestSubConnShutdownRemovesFromEndpointMap."""
    fp = {"threshold": 50, "minimumHosts": 2, "requestVolume": 10}
    policy, helper = start(ADDRESSES[:2], failurePercentageEjection=fp, maxEjectionPercent=100)
    all_ready(helper)
    wrapper = next(w for w in policy._wrappers if w.address == ADDRESSES[0])
    reports: list[ConnectivityState] = []
    wrapper.watch_state(lambda s, st: reports.append(s))
    wrapper.shutdown()
    assert wrapper not in policy.endpoint_state(ADDRESSES[0]).wrappers
    for _ in range(20):
        policy.endpoint_state(ADDRESSES[0]).record(FAILED)
        policy.endpoint_state(ADDRESSES[1]).record(OK)
    helper.clock.advance(10)
    assert ejected(policy) == {ADDRESSES[0]}
    assert reports == [READY]


# -- the policy around its child ------------------------------------------------------------


def test_resolver_error_without_a_config_fails_and_with_one_goes_to_the_child():
    """grpc-java handleNameResolutionError_noChildLb / _withChildLb."""
    helper = FakeHelper()
    policy = registry.get("outlier_detection_experimental").build(helper)
    error = Status(grpc.StatusCode.UNAVAILABLE, "not reachable")
    policy.resolver_error(error)
    assert helper.state is TF
    assert helper.pick().status == error
    policy.update(ResolverUpdate(as_endpoints(ADDRESSES[:1]), od_config()))
    all_ready(helper)
    reports = len(helper.states)
    policy.resolver_error(Status(grpc.StatusCode.NOT_FOUND, "target not found"))
    assert helper.state is READY  # round_robin keeps its endpoints
    assert len(helper.states) == reports


def test_child_reports_pass_through_and_calls_reach_the_child():
    """grpc-go TestChildBasicOperations: the child's state reaches the
    parent, reset_backoff reaches the subchannels, shutdown shuts them
    down and cancels the timer."""
    sr = {"minimumHosts": 5, "requestVolume": 100}
    policy, helper = start(ADDRESSES[:2], successRateEjection=sr)
    assert helper.state is CONNECTING
    all_ready(helper)
    policy.reset_backoff()
    assert all(sc.reset_backoff_calls == 1 for sc in helper.subchannels)
    policy.shutdown()
    assert all(sc.shut_down for sc in helper.subchannels)
    assert helper.clock.pending == []


@pytest.mark.parametrize(
    ("counts", "want"),
    [
        # (successes, calls) per endpoint; stdevFactor 1000 with two endpoints
        # puts the threshold exactly on the lower rate: rounding decides.
        (((2, 10), (2, 3)), set()),  # 20.0 < 20.0; in fractions 0.2 < 0.20000000000000004
        (((3, 7), (13, 20)), {0}),  # 42.857142857142854 < 42.85714285714286
        (((73, 100), (7, 20)), set()),  # 35.0 < 35.0; 0.35 < 0.35000000000000003
    ],
)
def test_success_rate_ties_round_as_c_cores_percent_arithmetic(counts, want):
    """C-core's sweep works in percent (``successes * 100.0 / calls``) with
    plain sums; with two endpoints and stdevFactor 1000 the threshold is
    mathematically the lower rate, and whether that endpoint is ejected
    depends on rounding: pyxds rounds as C-core does (fractions with an
    exact sum, as pyxds had, disagree on these cases)."""
    addresses = ADDRESSES[:2]
    sr = {"minimumHosts": 2, "requestVolume": 3, "stdevFactor": 1000}
    policy, helper = start(addresses, successRateEjection=sr, maxEjectionPercent=100)
    all_ready(helper)
    for address, (successes, total) in zip(addresses, counts, strict=True):
        state = policy.endpoint_state(address)
        for _ in range(successes):
            state.record(OK)
        for _ in range(total - successes):
            state.record(FAILED)
    helper.clock.advance(10)
    assert ejected(policy) == {addresses[i] for i in want}
