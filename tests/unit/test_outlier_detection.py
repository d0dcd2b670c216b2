"""outlier_detection_experimental (gRFC A50): config parsing and validation,
the success-rate and failure-percentage algorithms with the gRFC's rules,
ejection timing on a FakeClock, max_ejection_percent, un-ejection, the
subchannel wrappers, the counting picker, and bugs other gRPC
implementations shipped (each named in its test)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import grpc
import pytest

from pyxds.lb import (
    LBConfigError,
    PickComplete,
    PickFail,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.api import ConnectivityState, Endpoint, FailPicker, PickArgs, Picker
from pyxds.lb.outlier_detection import (
    EJECTED_STATUS,
    FailurePercentageEjection,
    OutlierDetectionPicker,
    SuccessRateEjection,
)
from pyxds.testing import FakeHelper

READY = ConnectivityState.READY
TF = ConnectivityState.TRANSIENT_FAILURE
OK = Status(grpc.StatusCode.OK)
FAIL = Status(grpc.StatusCode.UNAVAILABLE, "boom")
RR = [{"round_robin": {}}]


def parse(body: dict[str, Any]) -> Any:
    return registry.select([{"outlier_detection_experimental": body}])[1]


def fp_config(**overrides: Any) -> dict[str, Any]:
    """Failure percentage every 10 s, small thresholds so tests stay short."""
    body: dict[str, Any] = {
        "interval": "10s",
        "baseEjectionTime": "30s",
        "maxEjectionPercent": 100,
        "failurePercentageEjection": {"minimumHosts": 2, "requestVolume": 10, "threshold": 50},
        "childPolicy": RR,
    }
    body.update(overrides)
    return body


def addresses(n: int) -> list[str]:
    return [f"10.0.0.{i}:80" for i in range(1, n + 1)]


def setup(body: dict[str, Any], n: int = 2, seed: int = 0):
    helper = FakeHelper(seed=seed)
    factory, config = registry.select([{"outlier_detection_experimental": body}])
    policy = factory.build(helper)
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(n)], config))
    for subchannel in helper.subchannels:
        subchannel.set_state(READY)
    assert helper.state is READY
    return helper, policy, config


def drive(helper: FakeHelper, outcome: dict[str, Status], calls: int) -> dict[str, int]:
    """``calls`` picks, each finished with ``outcome[address]``; returns picks per address."""
    seen: dict[str, int] = {}
    for _ in range(calls):
        result = helper.pick()
        assert isinstance(result, PickComplete), result
        address = result.subchannel.address
        seen[address] = seen.get(address, 0) + 1
        assert result.on_call_done is not None
        result.on_call_done(outcome.get(address, OK))
    return seen


def picked(helper: FakeHelper, n: int = 40) -> set[str]:
    return {helper.pick().subchannel.address for _ in range(n)}


# ---------------------------------------------------------------- config


def test_config_defaults_are_a50s():
    config = parse({"childPolicy": RR})
    assert config.interval == 10.0
    assert config.base_ejection_time == 30.0
    assert config.max_ejection_time == 300.0
    assert config.max_ejection_percent == 10
    assert config.success_rate_ejection is None
    assert config.failure_percentage_ejection is None
    assert not config.counting
    both = parse({"successRateEjection": {}, "failurePercentageEjection": {}, "childPolicy": RR})
    assert both.success_rate_ejection == SuccessRateEjection(1900, 100, 5, 100)
    assert both.failure_percentage_ejection == FailurePercentageEjection(85, 100, 5, 50)
    assert both.counting


def test_config_reads_every_field():
    config = parse(
        {
            "interval": "1.5s",
            "baseEjectionTime": "2s",
            "maxEjectionTime": "7.000000001s",
            "maxEjectionPercent": 33,
            "successRateEjection": {
                "stdevFactor": 1000,
                "enforcementPercentage": 90,
                "minimumHosts": 3,
                "requestVolume": 20,
            },
            "failurePercentageEjection": {
                "threshold": 60,
                "enforcementPercentage": 80,
                "minimumHosts": 4,
                "requestVolume": 30,
            },
            "childPolicy": RR,
        }
    )
    assert (config.interval, config.base_ejection_time) == (1.5, 2.0)
    assert config.max_ejection_time == pytest.approx(7.000000001)
    assert config.max_ejection_percent == 33
    assert config.success_rate_ejection == SuccessRateEjection(1000, 90, 3, 20)
    assert config.failure_percentage_ejection == FailurePercentageEjection(60, 80, 4, 30)
    assert config.child_policy.name == "round_robin"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"maxEjectionPercent": 101}, "maxEjectionPercent"),
        ({"successRateEjection": {"enforcementPercentage": 101}}, "enforcementPercentage"),
        ({"failurePercentageEjection": {"enforcementPercentage": 150}}, "enforcementPercentage"),
        ({"failurePercentageEjection": {"threshold": 101}}, "threshold"),
        ({"interval": "-1s"}, "interval"),
        ({"baseEjectionTime": "-0.5s"}, "baseEjectionTime"),
        ({"maxEjectionTime": "forever"}, "maxEjectionTime"),
        ({"interval": 10}, "interval"),
        ({"successRateEjection": {"minimumHosts": -1}}, "minimumHosts"),
    ],
)
def test_out_of_range_values_are_rejected_naming_the_field(body, field):
    with pytest.raises(LBConfigError) as err:
        parse({**body, "childPolicy": RR})
    assert field in str(err.value)


def test_child_policy_is_required():
    with pytest.raises(LBConfigError, match="childPolicy"):
        parse({"interval": "1s"})


def test_durations_parse_as_protobuf_json():
    def interval(text: str) -> float:
        return float(parse({"interval": text, "childPolicy": RR}).interval)

    assert interval("0s") == 0.0
    assert interval("1.25s") == 1.25
    assert interval("3.000000500s") == pytest.approx(3.0000005)
    with pytest.raises(LBConfigError, match="too many digits after decimal"):
        interval("1.0000000001s")


@pytest.mark.parametrize("text", ["-0.5s", "-0.000000001s", "0.-5s", "1.-5s", "-1s"])
def test_a_duration_written_negative_is_refused_as_a50_asks(text):
    """A50 "Validation": durations must be non-negative; grpcio 1.85 reads
    "-0.5s" as 0.5 s and "1.-5s" as 0.95 s, pyxds refuses every form with a
    minus sign (docs/differences-from-c-core.md)."""
    with pytest.raises(LBConfigError) as err:
        parse({"baseEjectionTime": text, "childPolicy": RR})
    assert "baseEjectionTime" in str(err.value)
    assert "must be" in str(err.value)


def test_same_config_twice_is_equal_and_a_no_op():
    """TRAPS "configs and equality" (grpc-java#12213): the same config twice
    changes nothing: no new report, no timer restart."""
    body = fp_config()
    assert parse(body) == parse(fp_config()) and hash(parse(body)) == hash(parse(fp_config()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse(body).interval = 1.0  # type: ignore[misc]
    helper, policy, _config = setup(body)
    reports = len(helper.states)
    pending = list(helper.clock.pending)
    helper.clock.advance(4)
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(2)], parse(body)))
    assert len(helper.states) == reports
    assert helper.clock.pending == pending  # the same timer, not a restarted one


# ---------------------------------------------------------------- failure percentage


def test_failure_percentage_ejects_the_failing_endpoint_and_rpcs_stop_reaching_it():
    helper, policy, _ = setup(fp_config())
    bad, good = addresses(2)
    drive(helper, {bad: FAIL}, 40)
    assert picked(helper) == {bad, good}  # nothing happens before the interval ends
    helper.clock.advance(10)
    assert policy.ejected == [frozenset({bad})]
    assert picked(helper) == {good}
    assert helper.state is READY


def test_ejected_subchannel_reports_transient_failure_to_the_child():
    """A50 "Subchannel Wrapper": eject() reports TRANSIENT_FAILURE to the child."""
    helper, policy, _ = setup(fp_config())
    bad = addresses(2)[0]
    drive(helper, {bad: FAIL}, 40)
    helper.clock.advance(10)
    round_robin = policy.child
    child = next(c for c in round_robin.children if bad in c.addresses)
    assert child.state is TF
    wrapper = next(iter(policy.endpoint_state(bad).wrappers))
    seen: list[tuple[ConnectivityState, Status]] = []
    wrapper.watch_state(lambda state, status: seen.append((state, status)))
    assert seen == [(TF, EJECTED_STATUS)]


def test_failure_percentage_equal_to_threshold_is_not_ejected():
    """A50: eject when the failure percentage is *greater than* threshold."""
    helper, policy, _ = setup(fp_config())
    bad = addresses(2)[0]
    results = iter([FAIL, OK] * 50)
    for _ in range(40):
        result = helper.pick()
        status = next(results) if result.subchannel.address == bad else OK
        result.on_call_done(status)
    helper.clock.advance(10)
    assert policy.ejected == []


def test_request_volume_below_threshold_is_not_considered():
    helper, policy, _ = setup(fp_config())
    drive(helper, {addresses(2)[0]: FAIL}, 18)  # 9 calls each, request volume 10
    helper.clock.advance(10)
    assert policy.ejected == []


def test_fewer_hosts_with_volume_than_minimum_hosts_ejects_nothing():
    body = fp_config(
        failurePercentageEjection={"minimumHosts": 3, "requestVolume": 10, "threshold": 50}
    )
    helper, policy, _ = setup(body)
    drive(helper, {addresses(2)[0]: FAIL}, 40)
    helper.clock.advance(10)
    assert policy.ejected == []


def test_enforcement_percentage_zero_never_ejects():
    body = fp_config(
        failurePercentageEjection={
            "minimumHosts": 2,
            "requestVolume": 10,
            "threshold": 50,
            "enforcementPercentage": 0,
        }
    )
    helper, policy, _ = setup(body)
    for _ in range(5):
        drive(helper, {addresses(2)[0]: FAIL}, 40)
        helper.clock.advance(10)
        assert policy.ejected == []


def test_enforcement_percentage_draws_from_helper_random():
    """Seeded: with 50 % enforcement, some sweeps eject and some do not."""
    body = fp_config(
        failurePercentageEjection={
            "minimumHosts": 2,
            "requestVolume": 10,
            "threshold": 50,
            "enforcementPercentage": 50,
        },
        baseEjectionTime="10s",
        maxEjectionTime="10s",
    )
    outcomes = []
    helper, policy, _ = setup(body, seed=7)
    for _ in range(20):
        drive(helper, {addresses(2)[0]: FAIL}, 40)
        helper.clock.advance(10)
        outcomes.append(bool(policy.ejected))
        helper.clock.advance(10)  # ejection time capped at 10 s: back at the next sweep
        assert policy.ejected == []
    assert any(outcomes) and not all(outcomes)


# ---------------------------------------------------------------- success rate


def sr_config(**sr: Any) -> dict[str, Any]:
    return {
        "interval": "10s",
        "maxEjectionPercent": 100,
        "successRateEjection": {"minimumHosts": 5, "requestVolume": 10, **sr},
        "childPolicy": RR,
    }


def run_success_rate(rates: Sequence[float], seed: int = 0, **sr: Any) -> list[str]:
    """Each endpoint i gets 100 calls with success fraction rates[i]; returns
    the ejected addresses after one sweep."""
    helper, policy, _ = setup(sr_config(**sr), n=len(rates), seed=seed)
    counts = {a: 0 for a in addresses(len(rates))}
    rate = dict(zip(addresses(len(rates)), rates, strict=True))
    for _ in range(100 * len(rates)):
        result = helper.pick()
        address = result.subchannel.address
        counts[address] += 1
        ok = counts[address] <= round(rate[address] * 100) if counts[address] <= 100 else True
        result.on_call_done(OK if ok else FAIL)
    helper.clock.advance(10)
    return sorted(a for key in policy.ejected for a in key)


def test_success_rate_ejects_below_mean_minus_stdev_times_factor():
    """Rates 1,1,1,1,0.5: mean 0.9, stdev 0.2; factor 1.9 gives threshold
    0.52, so the 0.5 endpoint is ejected."""
    assert run_success_rate([1, 1, 1, 1, 0.5]) == [addresses(5)[4]]


def test_success_rate_keeps_an_endpoint_just_above_the_threshold():
    """Factor 2.5: threshold 0.9 - 0.5 = 0.4 < 0.5: nothing ejected."""
    assert run_success_rate([1, 1, 1, 1, 0.5], stdevFactor=2500) == []


def test_success_rate_all_equal_ejects_nothing():
    assert run_success_rate([0.5] * 5) == []


def test_success_rate_needs_minimum_hosts_with_volume():
    assert run_success_rate([1, 1, 1, 0.1], minimumHosts=5) == []


# ---------------------------------------------------------------- max ejection percent


def test_max_ejection_percent_still_ejects_one_endpoint():
    """grpc-java#9489: at least one ejection whatever the percentage (two
    endpoints, 10 %: the first check sees 0 % ejected)."""
    helper, policy, _ = setup(fp_config(maxEjectionPercent=10))
    drive(helper, {a: FAIL for a in addresses(2)}, 40)
    helper.clock.advance(10)
    assert len(policy.ejected) == 1


def test_max_ejection_percent_stops_once_the_ejected_share_reaches_it():
    """A50 step 1 ("greater than or equal"), grpc-java#9492: 4 of 5 failing at
    50 %: ejecting stops once 60 % (3 of 5) are out."""
    body = fp_config(maxEjectionPercent=50)
    body["failurePercentageEjection"]["minimumHosts"] = 5
    helper, policy, _ = setup(body, n=5)
    drive(helper, {a: FAIL for a in addresses(4)}, 100)
    helper.clock.advance(10)
    assert len(policy.ejected) == 3
    body40 = fp_config(maxEjectionPercent=40)
    body40["failurePercentageEjection"]["minimumHosts"] = 5
    helper, policy, _ = setup(body40, n=5)
    drive(helper, {a: FAIL for a in addresses(4)}, 100)
    helper.clock.advance(10)
    assert len(policy.ejected) == 2  # 40 % reached: stop


# ---------------------------------------------------------------- timing


def eject_bad(helper: FakeHelper, policy: Any) -> None:
    drive(helper, {addresses(2)[0]: FAIL}, 40)
    helper.clock.advance(10 - helper.clock.now() % 10)
    assert policy.ejected


def test_unejected_after_base_ejection_time_times_multiplier():
    helper, policy, _ = setup(fp_config())
    eject_bad(helper, policy)  # t=10, multiplier 1: back at the first sweep >= 40
    helper.clock.advance(20)  # t=30
    assert policy.ejected
    helper.clock.advance(10)  # t=40
    assert policy.ejected == []
    assert picked(helper) == set(addresses(2))


def test_second_ejection_lasts_twice_as_long():
    helper, policy, _ = setup(fp_config())
    eject_bad(helper, policy)  # t=10
    helper.clock.advance(30)  # t=40: back, multiplier still 1
    assert policy.ejected == []
    eject_bad(helper, policy)  # t=50, multiplier 2: 60 s
    assert policy.endpoint_state(addresses(2)[0]).multiplier == 2
    helper.clock.advance(50)  # t=100
    assert policy.ejected
    helper.clock.advance(10)  # t=110
    assert policy.ejected == []


def test_ejection_time_is_capped_by_max_ejection_time():
    helper, policy, _ = setup(fp_config(maxEjectionTime="35s"))
    eject_bad(helper, policy)
    helper.clock.advance(30)
    eject_bad(helper, policy)  # t=50, multiplier 2: min(60, max(30, 35)) = 35
    helper.clock.advance(30)  # t=80
    assert policy.ejected
    helper.clock.advance(10)  # t=90 >= 85
    assert policy.ejected == []


def test_base_ejection_time_above_max_ejection_time_wins():
    """A50: the cap is max(base_ejection_time, max_ejection_time)."""
    helper, policy, _ = setup(fp_config(baseEjectionTime="50s", maxEjectionTime="20s"))
    eject_bad(helper, policy)  # t=10
    helper.clock.advance(40)  # t=50
    assert policy.ejected
    helper.clock.advance(10)  # t=60
    assert policy.ejected == []


def test_multiplier_decays_by_one_per_interval_without_ejection():
    helper, policy, _ = setup(fp_config())
    eject_bad(helper, policy)
    helper.clock.advance(30)  # unejected at t=40
    state = policy.endpoint_state(addresses(2)[0])
    assert state.multiplier == 1
    helper.clock.advance(10)
    assert state.multiplier == 0


def test_new_config_restarts_the_timer_for_the_rest_of_the_interval():
    """A50: a new config starts the timer for interval minus time elapsed
    since the last timer start."""
    helper, policy, _ = setup(fp_config())
    helper.clock.advance(4)
    drive(helper, {addresses(2)[0]: FAIL}, 40)
    policy.update(
        ResolverUpdate([Endpoint((a,)) for a in addresses(2)], parse(fp_config(interval="7s")))
    )
    assert helper.clock.next_deadline() == pytest.approx(7.0)  # started at 0, 7 s interval
    helper.clock.advance(3)
    assert policy.ejected


def test_config_without_algorithms_unejects_and_stops_counting():
    helper, policy, _ = setup(fp_config())
    eject_bad(helper, policy)
    body = {"childPolicy": RR}
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(2)], parse(body)))
    assert policy.ejected == []
    assert policy.endpoint_state(addresses(2)[0]).multiplier == 0
    assert helper.clock.pending == []
    result = helper.pick()
    assert result.on_call_done is None  # A50: no counting without an algorithm


def test_timer_is_not_started_without_an_algorithm():
    helper, _policy, _ = setup({"childPolicy": RR})
    assert helper.clock.pending == []


# ---------------------------------------------------------------- endpoints and wrappers


def test_counters_survive_subchannel_recreation_and_updates():
    helper, policy, config = setup(fp_config())
    bad = addresses(2)[0]
    state = policy.endpoint_state(bad)
    drive(helper, {bad: FAIL}, 40)
    # The same endpoints again, in another order: same entries, same counts.
    policy.update(ResolverUpdate([Endpoint((a,)) for a in reversed(addresses(2))], config))
    assert policy.endpoint_state(bad) is state
    helper.clock.advance(10)
    assert policy.ejected == [frozenset({bad})]


def test_removed_endpoint_loses_its_state():
    helper, policy, config = setup(fp_config())
    bad = addresses(2)[0]
    eject_bad(helper, policy)
    policy.update(ResolverUpdate([Endpoint((addresses(2)[1],))], config))
    assert policy.endpoint_state(bad) is None
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(2)], config))
    assert policy.endpoint_state(bad).ejected is False


def test_new_subchannel_for_an_ejected_endpoint_starts_ejected():
    helper, policy, _config = setup(fp_config())
    bad = addresses(2)[0]
    eject_bad(helper, policy)
    from pyxds.lb.outlier_detection import _ODHelper

    # What the child gets when it re-creates the endpoint's subchannel.
    sub = _ODHelper(policy).create_subchannel(bad, {})
    seen: list[ConnectivityState] = []
    sub.watch_state(lambda state, status: seen.append(state))
    assert seen == [TF]
    sub.shutdown()


def test_real_state_changes_are_held_while_ejected_and_the_latest_delivered_on_unejection():
    helper, policy, _ = setup(fp_config())
    bad = addresses(2)[0]
    eject_bad(helper, policy)
    wrapper = next(iter(policy.endpoint_state(bad).wrappers))
    seen: list[ConnectivityState] = []
    wrapper.watch_state(lambda state, status: seen.append(state))
    real = helper.subchannel(bad)
    real.set_state(ConnectivityState.IDLE)
    real.set_state(READY)
    assert seen == [TF]
    helper.clock.advance(30)
    assert seen == [TF, READY]
    assert picked(helper) == set(addresses(2))


def test_dual_stack_endpoint_is_one_entry():
    """A61: state per endpoint, shared by its addresses."""
    helper = FakeHelper()
    factory, config = registry.select([{"outlier_detection_experimental": fp_config()}])
    policy = factory.build(helper)
    policy.update(ResolverUpdate([Endpoint(("[::1]:80", "127.0.0.1:80"))], config))
    assert policy.endpoint_state("[::1]:80") is policy.endpoint_state("127.0.0.1:80")


def test_top_level_pick_first_child_is_never_ejected():
    """grpc#32967 (C-core crashed with pick_first under outlier detection);
    C-core then stopped ejecting for a pick_first child: counted, not ejected."""
    body = fp_config(childPolicy=[{"pick_first": {}}])
    body["failurePercentageEjection"]["minimumHosts"] = 1
    helper, _policy, _ = setup(body, n=1)
    drive(helper, {addresses(1)[0]: FAIL}, 40)
    helper.clock.advance(10)
    assert helper.state is READY
    assert isinstance(helper.pick(), PickComplete)


# ---------------------------------------------------------------- picker


class _Custom(Picker):
    def __init__(self, result: Any) -> None:
        self.result = result

    def pick(self, args: PickArgs) -> Any:
        return self.result


def test_picker_forwards_extra_pick_fields_and_chains_the_childs_done():
    helper, policy, _ = setup(fp_config())
    first = [helper.pick() for _ in range(2)]
    assert [helper.pick() for _ in range(2)] == first
    assert all(a is b for a, b in zip(first, [helper.pick() for _ in range(2)], strict=True))
    calls: list[Status] = []
    wrapper = next(iter(policy.endpoint_state(addresses(2)[0]).wrappers))
    picker = OutlierDetectionPicker(_Custom(PickComplete(wrapper, calls.append)), True)
    result = picker.pick(PickArgs("/s/m"))
    assert result.subchannel is wrapper.real
    result.on_call_done(FAIL)
    assert calls == [FAIL]
    assert policy.endpoint_state(addresses(2)[0]).active.values() == (0, 1)


def test_each_attempt_is_counted_once():
    """The channel calls on_call_done once per attempt: a retried RPC's two
    attempts are two calls in the counter."""
    helper, policy, _ = setup(fp_config())
    result = helper.pick()
    state = policy.endpoint_state(result.subchannel.address)
    result.on_call_done(FAIL)
    helper.pick().on_call_done(OK)
    helper.pick().on_call_done(OK)
    successes, failures = state.active.values()
    assert failures == 1 and successes + failures >= 1


def test_non_complete_picks_pass_through():
    picker = OutlierDetectionPicker(FailPicker(FAIL), True)
    assert picker.pick(PickArgs("/s/m")) == PickFail(FAIL)


def test_usable_from_a_service_config():
    factory, config = registry.select(
        [{"outlier_detection_experimental": fp_config()}, {"round_robin": {}}]
    )
    assert factory.name == "outlier_detection_experimental"
    assert config.child_policy.name == "round_robin"


def test_picker_over_round_robin_keeps_an_even_rotation():
    """The streaming picker (round_robin child) rotates over every READY
    endpoint once per cycle, from where the child's rotation stood."""
    helper, _policy, _ = setup(fp_config(), n=4)
    counts: dict[str, int] = {}
    for _ in range(100):
        address = helper.pick().subchannel.address
        counts[address] = counts.get(address, 0) + 1
    assert counts == {a: 25 for a in addresses(4)}
    assert helper.last.picker.result_stream() is not None


def test_each_sweep_sees_only_its_own_interval():
    """A50 "Call Counter" (grpc-java#9447 review): the inactive bucket is
    zeroed at each swap, so calls of earlier intervals never add up to the
    request volume."""
    body = fp_config(failurePercentageEjection={"minimumHosts": 2, "requestVolume": 15})
    helper, policy, _ = setup(body)
    for _ in range(3):
        drive(helper, {addresses(2)[0]: FAIL}, 20)  # 10 calls each per interval
        helper.clock.advance(10)
        assert policy.ejected == []


def test_frequent_config_updates_do_not_postpone_the_sweep():
    """A50 (grpc/proposal#297): a new config restarts the timer for what is
    left of the interval, so updates more frequent than the interval (an
    EDS churn) cannot starve ejection."""
    helper, policy, _ = setup(fp_config())
    bad = addresses(2)[0]
    drive(helper, {bad: FAIL}, 40)
    for percent in (90, 80, 70):
        helper.clock.advance(3)
        update = parse(fp_config(maxEjectionPercent=percent))
        policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(2)], update))
    assert policy.ejected == []  # t=9
    helper.clock.advance(1)  # t=10: the sweep started at t=0 fires on time
    assert policy.ejected == [frozenset({bad})]


def test_over_least_request_both_counters_see_each_call():
    """outlier_detection over least_request: the child's done (outstanding
    count) and the ejection counter both run, once per call."""
    helper, policy, _ = setup(fp_config(childPolicy=[{"least_request_experimental": {}}]))
    result = helper.pick()
    lr_picker = helper.last.picker.child
    assert sum(lr_picker.counters) == 1
    result.on_call_done(FAIL)
    assert sum(lr_picker.counters) == 0
    assert policy.endpoint_state(result.subchannel.address).active.values() == (0, 1)
    again = [helper.pick() for _ in range(20)]
    assert len({id(r) for r in again}) == 2  # one precomputed result per endpoint
    for r in again:
        r.on_call_done(OK)
    assert sum(lr_picker.counters) == 0


def test_ejection_keeps_the_connection_for_the_return():
    """A50 "Ejection Reporting": ejecting through the wrapper keeps the
    subchannel (and its connection); un-ejection uses the same one at once."""
    helper, policy, _ = setup(fp_config())
    bad = addresses(2)[0]
    real = helper.subchannel(bad)
    eject_bad(helper, policy)
    assert not real.shut_down
    helper.clock.advance(30)
    assert policy.ejected == []
    assert helper.subchannel(bad) is real and not real.shut_down
    assert bad in {helper.pick().subchannel.address for _ in range(4)}


def test_endpoints_added_while_nothing_counts_get_their_own_counters_when_counting_starts():
    """Without an algorithm an entry shares one never-read bucket (no counters
    per endpoint, issue 18); counting starting gives every entry its own, so
    each endpoint's calls are counted apart and the failing one is ejected."""
    helper, policy, _ = setup({"childPolicy": RR}, n=3)
    entries = [policy.endpoint_state(a) for a in addresses(3)]
    assert len({id(entry.active) for entry in entries}) == 1  # shared while not counting
    config = parse(fp_config())
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(3)], config))
    assert len({id(entry.active) for entry in entries}) == 3
    bad = addresses(3)[0]
    drive(helper, {bad: FAIL}, 60)
    helper.clock.advance(10)
    assert policy.ejected == [frozenset({bad})]
    # an endpoint added while counting counts from the start
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(4)], config))
    added = policy.endpoint_state(addresses(4)[3])
    assert all(added.active is not entry.active for entry in entries)


# ---------------------------------------------------------------- bookkeeping


def _wrapper_view(
    helper: FakeHelper, policy: Any
) -> list[tuple[str, int, bool, tuple[str, ...] | None]]:
    """Every live wrapper as (address, creation index, ejected, its entry's
    addresses): what the child and the pickers see of the bookkeeping."""
    made = {id(s): i for i, s in enumerate(helper.subchannels)}
    return sorted(
        (
            w.address,
            made[id(w.real)],
            w.ejected,
            None if w.endpoint is None else tuple(sorted(w.endpoint.addresses)),
        )
        for w in policy._wrappers
    )


@pytest.mark.parametrize("seed", range(6))
def test_an_update_moves_only_the_wrappers_it_must_and_ends_as_a_full_realignment(seed):
    """Issue 18 item 4: an update re-points only the wrappers of dropped
    endpoints and the ones in no endpoint (10,000 endpoints: not every
    wrapper per update).  Over random steps (endpoint lists with overlaps,
    an address in two endpoints, endpoints dropped and re-added while
    someone keeps their subchannels, ejections, the child switching to
    pick_first and back, counting on and off) the wrappers end exactly as a
    policy that re-points and re-aligns every wrapper on every change."""
    import random

    from pyxds.lb.outlier_detection import _ODHelper

    rng = random.Random(seed)
    universe = addresses(10)
    configs = [
        parse(fp_config()),
        parse({"childPolicy": RR}),
        parse(fp_config(childPolicy=[{"pick_first": {}}])),
    ]
    pair = []
    for _ in range(2):  # [incremental, reference]
        helper = FakeHelper(seed=seed)
        factory, _config = registry.select([{"outlier_detection_experimental": fp_config()}])
        pair.append((helper, factory.build(helper), []))
    config = configs[0]
    for _step in range(80):
        roll = rng.random()
        if roll < 0.45:
            chosen = rng.sample(universe, rng.randint(1, len(universe)))
            endpoints, i = [], 0
            while i < len(chosen):
                size = rng.choice((1, 1, 2))
                endpoints.append(tuple(chosen[i : i + size]))
                i += size
            if rng.random() < 0.2 and len(endpoints) > 1:  # one address in two endpoints
                endpoints[-1] = (*endpoints[-1], endpoints[0][0])
            if rng.random() < 0.3:
                config = rng.choice(configs)
            for _helper, policy, _kept in pair:
                if policy is pair[1][1]:
                    policy._aligned_for = None  # the reference re-aligns every wrapper
                policy.update(ResolverUpdate([Endpoint(e) for e in endpoints], config))
        elif roll < 0.65:  # someone keeps a subchannel of an address (listed or not)
            address = rng.choice(universe)
            for _helper, policy, kept in pair:
                kept.append(_ODHelper(policy).create_subchannel(address, {}))
        elif roll < 0.75:
            if pair[0][2]:
                at = rng.randrange(len(pair[0][2]))
                for _helper, _policy, kept in pair:
                    kept.pop(at).shutdown()
        else:  # eject or un-eject an endpoint
            keys = sorted(pair[0][1]._endpoints, key=sorted)
            if keys:
                key = rng.choice(keys)
                eject = rng.random() < 0.6
                for helper, policy, _kept in pair:
                    entry = policy._endpoints[key]
                    if eject:
                        policy._eject(entry, helper.clock.now())
                    else:
                        policy._uneject(entry)
        incremental, reference = pair[0][1], pair[1][1]
        assert _wrapper_view(pair[0][0], incremental) == _wrapper_view(pair[1][0], reference)
        assert incremental._unattached == {w for w in incremental._wrappers if w.endpoint is None}
        for w in incremental._wrappers:
            assert w.endpoint is incremental._by_address.get(w.address)
            assert w.endpoint is None or w in w.endpoint.wrappers


def test_a_kept_wrapper_of_an_ejected_endpoint_is_unejected_when_the_child_becomes_pick_first():
    """The incremental update leaves wrappers of surviving endpoints alone
    only while the ejection rule is the one they were aligned with: when the
    child becomes pick_first (never ejected, grpc#32967) every wrapper is
    re-aligned, including one someone keeps for a surviving endpoint."""
    from pyxds.lb.outlier_detection import _ODHelper

    helper, policy, _ = setup(fp_config(), n=3)
    first = addresses(3)[0]
    kept = _ODHelper(policy).create_subchannel(first, {})
    policy._eject(policy.endpoint_state(first), helper.clock.now())
    assert kept.ejected
    pick_first = parse(fp_config(childPolicy=[{"pick_first": {}}]))
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses(2)], pick_first))
    assert policy.endpoint_state(first).ejected  # the entry keeps its state (A50)
    assert not kept.ejected
