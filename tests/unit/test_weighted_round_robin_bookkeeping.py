"""weighted_round_robin's per-report bookkeeping (issue 18 item 3): a READY
report costs no pass over the other endpoints, and what it publishes is
exactly what a full rebuild would publish.

* Each endpoint's transition reaches the policy once and in order: one
  picker per change of the READY set, over the READY endpoints in endpoint
  order, with each endpoint's own weight (FakeClock, fake subchannels).
* ``FirstReport``: a picker built while every weight is still inside its
  blackout is round robin without reading the weights, and a world of such
  pickers stays the same as a world that reads every weight each time (the
  scheduler and every weight's state), whatever the blackout and expiration
  periods.
* Connecting endpoints inside the blackout reads no weight, and
  xds_override_host above weighted_round_robin maps no result of a picker
  that has no result stream.
"""

from __future__ import annotations

import random

import pytest
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.lb import registry, xds_override_host
from pyxds.lb import weighted_round_robin as wrr
from pyxds.lb.api import ConnectivityState, Endpoint, PickComplete, ResolverUpdate
from pyxds.lb.weighted_round_robin import (
    EndpointWeight,
    FirstReport,
    WeightedRoundRobin,
    WeightedRoundRobinConfig,
    WeightedRoundRobinPicker,
)
from pyxds.testing import FakeClock, FakeHelper

READY = ConnectivityState.READY
CONNECTING = ConnectivityState.CONNECTING
IDLE = ConnectivityState.IDLE
TRANSIENT_FAILURE = ConnectivityState.TRANSIENT_FAILURE


def parse(cfg: dict) -> WeightedRoundRobinConfig:
    _, config = registry.select([{"weighted_round_robin": cfg}])
    return config


def report(qps: float, util: float) -> OrcaLoadReport:
    return OrcaLoadReport(rps_fractional=qps, cpu_utilization=util)


def connecting_policy(n: int, cfg: dict) -> tuple[FakeHelper, WeightedRoundRobin, list[str]]:
    helper = FakeHelper(seed=3)
    policy = WeightedRoundRobin(helper)
    addrs = [f"10.0.{i // 250}.{i % 250}:80" for i in range(n)]
    endpoints = [Endpoint((a,)) for a in addrs]
    assert policy.update(ResolverUpdate(endpoints, parse(cfg))) is None
    return helper, policy, addrs


def published_addresses(helper: FakeHelper) -> list[str]:
    picker = helper.last.picker
    assert isinstance(picker, WeightedRoundRobinPicker)
    return [r.subchannel.address for r in picker.results]


@pytest.mark.parametrize("oob", [False, True])
def test_each_ready_change_publishes_one_picker_over_the_ready_endpoints_in_order(oob):
    helper, policy, addrs = connecting_policy(60, {"enableOobLoadReport": oob})
    rng = random.Random(11)
    ready: set[str] = set()
    order = {a: i for i, a in enumerate(addrs)}
    # every endpoint connects, in a random order, with flaps in between
    steps = [(a, READY) for a in addrs]
    rng.shuffle(steps)
    for _ in range(40):
        a = rng.choice(addrs)
        steps.insert(rng.randrange(len(steps) + 1), (a, TRANSIENT_FAILURE))
        steps.insert(rng.randrange(len(steps) + 1), (a, READY))
    steps += [(a, READY) for a in addrs]  # those a flap left down come back
    for address, state in steps:
        sub = helper.subchannel(address)
        if state is READY and address in ready:
            continue  # already READY: a fake subchannel would report READY again
        if state is TRANSIENT_FAILURE and address not in ready:
            continue
        before = len(helper.states)
        sub.set_state(state)
        if state is READY:
            ready.add(address)
        else:
            ready.discard(address)
        if not ready:
            continue
        # the change reached the policy once: exactly one new READY picker
        new = helper.states[before:]
        assert [s.state for s in new] == [READY], (address, state)
        assert published_addresses(helper) == sorted(ready, key=order.__getitem__)
        picker = helper.last.picker
        assert isinstance(picker, WeightedRoundRobinPicker)
        for result, weight in zip(picker.results, picker.weights, strict=True):
            child = policy._children[frozenset((result.subchannel.address,))]
            assert weight is child.wrr_weight  # type: ignore[attr-defined]
            assert (result.on_call_trailers is None) is oob
    assert ready == set(addrs)


def test_a_config_change_with_the_very_same_endpoint_objects_is_applied_at_once():
    # weighted_target hands an unchanged locality's very endpoint objects on
    # (round_robin skips such an update): a new config must still apply
    helper = FakeHelper(seed=3)
    policy = WeightedRoundRobin(helper)
    addrs = [f"10.0.0.{i}:80" for i in range(5)]
    endpoints = [Endpoint((a,)) for a in addrs]
    policy.update(ResolverUpdate(endpoints, parse({})))
    watched: list[str] = []
    for sub in helper.subchannels:

        def watch(period, fn, on_unimplemented=None, sub=sub):
            watched.append(sub.address)
            return lambda: None

        sub.watch_orca_oob = watch
        sub.set_state(READY)
    assert all(r.on_call_trailers is not None for r in helper.last.picker.results)  # type: ignore[attr-defined]
    published = len(helper.states)
    policy.update(ResolverUpdate(endpoints, parse({"enableOobLoadReport": True})))
    assert len(helper.states) == published + 1  # the new config's picker, at once
    assert all(r.on_call_trailers is None for r in helper.last.picker.results)  # type: ignore[attr-defined]
    assert sorted(watched) == sorted(addrs)  # and every READY endpoint's OOB watch
    # later reports keep the new mode for every listed endpoint
    helper.subchannel(addrs[0]).set_state(TRANSIENT_FAILURE)
    helper.subchannel(addrs[0]).set_state(READY)
    assert all(r.on_call_trailers is None for r in helper.last.picker.results)  # type: ignore[attr-defined]
    assert published_addresses(helper) == addrs
    # the same config and the same objects again: nothing
    published = len(helper.states)
    policy.update(ResolverUpdate(endpoints, parse({"enableOobLoadReport": True})))
    assert len(helper.states) == published


def test_connecting_inside_the_blackout_reads_no_weight(monkeypatch):
    reads = []
    original = EndpointWeight.value

    def counted(self: EndpointWeight, now: float) -> float:
        reads.append(self)
        return original(self, now)

    monkeypatch.setattr(EndpointWeight, "value", counted)
    helper, policy, addrs = connecting_policy(200, {"enableOobLoadReport": True})
    for i, a in enumerate(addrs):
        helper.subchannel(a).set_state(READY)
        helper.clock.advance(0.01)
        if i % 3 == 0:  # reports arrive meanwhile, all inside the blackout
            policy._children[frozenset((a,))].wrr_weight.on_oob_report(report(100, 0.5))  # type: ignore[attr-defined]
    assert len(published_addresses(helper)) == 200
    assert reads == []
    helper.clock.advance(10.0)  # the first reports leave the blackout: the timer reads them all
    assert len(reads) >= 200
    assert helper.last.picker.scaled_weights is None  # type: ignore[attr-defined]  # all equal


def test_override_host_maps_no_result_of_a_picker_without_a_result_stream(monkeypatch):
    mapped = []
    original = xds_override_host._plain_result

    def counted(result):
        mapped.append(result)
        return original(result)

    monkeypatch.setattr(xds_override_host, "_plain_result", counted)
    clock = FakeClock()
    weights = [EndpointWeight(clock, WeightedRoundRobinConfig()) for _ in range(50)]
    results = [PickComplete(object()) for _ in range(50)]  # type: ignore[arg-type]
    picker = WeightedRoundRobinPicker(results, weights, clock, random.Random(1))
    assert xds_override_host._plain_stream(picker) is None
    assert mapped == []


# -- FirstReport: the same scheduler and weights as reading every weight -------


def _world(cfg: WeightedRoundRobinConfig, n: int, shared: bool):
    clock = FakeClock()
    first = FirstReport() if shared else None
    weights = [EndpointWeight(clock, cfg, first) for _ in range(n)]
    results = [PickComplete(object()) for _ in range(n)]  # type: ignore[arg-type]
    return clock, first, weights, results


def _random_step(rng: random.Random, n: int, worlds, odds: tuple[float, float, float]) -> None:
    """The same random step in each world: a report to one endpoint, its
    reconnect, or time passing (``odds``: the cumulative chances of the
    first three; else nothing happens)."""
    op = rng.random()
    i = rng.randrange(n)
    load = rng.choice((0.1, 0.3, 0.9))
    step = rng.choice((0.05, 0.5, 1.0, 3.0))
    for clock, _first, weights, _results in worlds:
        if op < odds[0]:
            weights[i].on_report(report(100, load))
        elif op < odds[1]:
            weights[i].became_ready()
        elif op < odds[2]:
            clock.advance(step)


@pytest.mark.parametrize(
    "blackout, expiration",
    [(10.0, 180.0), (10.0, 3.0), (0.0, 30.0), (2.0, 2.0), (5.0, 0.5)],
)
def test_a_picker_that_skips_weights_inside_the_blackout_matches_one_that_reads_them(
    blackout, expiration, monkeypatch
):
    # the scaled weights are compared; their materialized period is not needed
    monkeypatch.setattr(wrr, "materialize", lambda scaled, top: range(len(scaled)))
    skipped = weighted = 0
    cfg = WeightedRoundRobinConfig(blackout_period=blackout, weight_expiration_period=expiration)
    n = 8
    fast = _world(cfg, n, shared=True)
    full = _world(cfg, n, shared=False)
    rng = random.Random(f"{blackout}-{expiration}")
    for _step in range(400):
        _random_step(rng, n, (fast, full), (0.45, 0.55, 0.9))
        pickers = []
        for clock, first, weights, results in (fast, full):
            pickers.append(
                WeightedRoundRobinPicker(results, weights, clock, random.Random(5), None, first)
            )
        assert pickers[0].scaled_weights == pickers[1].scaled_weights
        first = fast[1]
        assert first is not None
        skipped += first.none_usable(cfg, fast[0].now())
        weighted += pickers[1].scaled_weights is not None
        for a, b in zip(fast[2], full[2], strict=True):
            assert (a.non_empty_since, a.last_updated, a.weight) == (
                b.non_empty_since,
                b.last_updated,
                b.weight,
            )
    # both ways were taken (the blackout is skipped only while it can hold;
    # weights expiring sooner than the blackout ends are rarely usable here)
    assert weighted > 0 or expiration <= blackout
    assert (skipped > 0) is (blackout > 0)


@pytest.mark.parametrize(
    "blackout, expiration",
    [(10.0, 180.0), (10.0, 3.0), (0.0, 30.0), (2.0, 2.0), (5.0, 0.5)],
)
def test_a_picker_rebuilt_every_period_schedules_as_a_new_picker_would(
    blackout, expiration, monkeypatch
):
    """The weight update timer's rebuild of one long-lived picker (which
    keeps the weights it last scaled, and skips the scaling when they come
    back the same) gives the scheduler a new picker reading every weight
    gives, through blackouts, expiries, reconnects and repeated reports."""
    monkeypatch.setattr(wrr, "materialize", lambda scaled, top: range(len(scaled)))
    scaled_calls = []
    real_scale = wrr.scale_weights

    def counting(values, top):
        scaled_calls.append(None)
        return real_scale(values, top)

    monkeypatch.setattr(wrr, "scale_weights", counting)
    cfg = WeightedRoundRobinConfig(blackout_period=blackout, weight_expiration_period=expiration)
    n = 8
    kept = _world(cfg, n, shared=True)
    fresh = _world(cfg, n, shared=False)
    picker = WeightedRoundRobinPicker(kept[3], kept[2], kept[0], random.Random(5), None, kept[1])
    scaled_calls.clear()
    rng = random.Random(f"rebuild-{blackout}-{expiration}")
    rebuilds = weighted = full_reads = 0
    first = kept[1]
    assert first is not None
    for _step in range(400):
        _random_step(rng, n, (kept, fresh), (0.3, 0.4, 0.95))
        full_reads += not first.none_usable(cfg, kept[0].now())
        picker.rebuild()
        rebuilds += 1
        clock, _first, weights, results = fresh
        expected = WeightedRoundRobinPicker(results, weights, clock, random.Random(5), None, None)
        assert picker.scaled_weights == expected.scaled_weights
        weighted += expected.scaled_weights is not None
    assert weighted > 0 or expiration <= blackout
    # every fresh picker scaled its weights; the kept one (built once) did
    # for fewer of its rebuilds than read every weight: it skipped unchanged ones
    kept_calls = len(scaled_calls) - rebuilds
    assert kept_calls < full_reads, (kept_calls, full_reads)
