"""weighted_round_robin (gRFC A58, A51 per-call/OOB reports, A114): weights
from ORCA reports, blackout, expiry, error penalty, the stride scheduler's
proportions, config parsing and equality.  FakeClock and fake subchannels."""

from __future__ import annotations

import collections
import math

import pytest
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from pyxds.lb import registry
from pyxds.lb.api import ConnectivityState, Endpoint, PickComplete, ResolverUpdate
from pyxds.lb.errors import LBConfigError
from pyxds.lb.orca import ORCA_TRAILER, report_from_trailers, utilization
from pyxds.lb.weighted_round_robin import (
    WeightedRoundRobin,
    WeightedRoundRobinConfig,
    WeightedRoundRobinPicker,
)
from pyxds.lb.wrr_scheduler import (
    StaticStrideScheduler,
    materialize,
    max_weight_for,
    scale_weights,
)
from pyxds.testing import FakeHelper

READY = ConnectivityState.READY
TRANSIENT_FAILURE = ConnectivityState.TRANSIENT_FAILURE
ADDRS = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]


def parse(cfg: dict) -> WeightedRoundRobinConfig:
    _, config = registry.select([{"weighted_round_robin": cfg}])
    return config


def report(qps: float, util: float = 0.0, eps: float = 0.0, **fields) -> OrcaLoadReport:
    return OrcaLoadReport(rps_fractional=qps, cpu_utilization=util, eps=eps, **fields)


def trailers(r: OrcaLoadReport) -> tuple:
    return (("x-other", "1"), (ORCA_TRAILER, r.SerializeToString()))


class Harness:
    def __init__(self, config: dict | None = None, addrs=ADDRS) -> None:
        self.helper = FakeHelper(seed=7)
        self.policy = WeightedRoundRobin(self.helper)
        self.addrs = list(addrs)
        self.update(config or {})
        for sc in self.helper.subchannels:
            sc.set_state(READY)
        assert self.helper.state is READY

    def update(self, config: dict) -> None:
        self.config = parse(config)
        endpoints = [Endpoint((a,)) for a in self.addrs]
        assert self.policy.update(ResolverUpdate(endpoints, self.config)) is None

    @property
    def picker(self) -> WeightedRoundRobinPicker:
        picker = self.helper.last.picker
        assert isinstance(picker, WeightedRoundRobinPicker)
        return picker

    def result_for(self, address: str) -> PickComplete:
        for r in self.picker.results:
            if r.subchannel.address == address:
                return r
        raise AssertionError(address)

    def feed(self, loads: dict[str, OrcaLoadReport]) -> None:
        """One per-call report per endpoint, through the pick's hook."""
        for address, r in loads.items():
            hook = self.result_for(address).on_call_trailers
            assert hook is not None
            hook(trailers(r))

    def shares(self, n: int = 30000) -> dict[str, float]:
        counts = collections.Counter(self.helper.pick().subchannel.address for _ in range(n))  # type: ignore[union-attr]
        return {a: counts[a] / n for a in self.addrs}

    def advance(self, seconds: float) -> None:
        self.helper.clock.advance(seconds)


# -- config ----------------------------------------------------------------------


def test_defaults_follow_a58():
    c = parse({})
    assert c == WeightedRoundRobinConfig()
    assert (c.blackout_period, c.weight_expiration_period, c.weight_update_period) == (
        10.0,
        180.0,
        1.0,
    )
    assert (c.oob_reporting_period, c.error_utilization_penalty) == (10.0, 1.0)
    assert c.enable_oob_load_report is False


def test_every_field_parses_and_equal_configs_compare_equal():
    cfg = {
        "enableOobLoadReport": True,
        "oobReportingPeriod": "2.5s",
        "blackoutPeriod": "0s",
        "weightExpirationPeriod": "60s",
        "weightUpdatePeriod": "0.200s",
        "errorUtilizationPenalty": 0.5,
        "metricNamesForComputingUtilization": ["named_metrics.foo", "mem_utilization"],
    }
    c = parse(cfg)
    assert c == parse(dict(cfg)) and hash(c) == hash(parse(dict(cfg)))
    assert c.oob_reporting_period == 2.5 and c.weight_update_period == 0.2
    assert c.metric_names_for_computing_utilization == ("named_metrics.foo", "mem_utilization")


def test_weight_update_period_below_100ms_is_raised_to_100ms():
    assert parse({"weightUpdatePeriod": "0.010s"}).weight_update_period == 0.1


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({"errorUtilizationPenalty": -0.1}, "errorUtilizationPenalty"),
        ({"errorUtilizationPenalty": "one"}, "errorUtilizationPenalty"),  # "1" is 1.0 (grpcio)
        ({"blackoutPeriod": "-1s"}, "blackoutPeriod"),
        ({"weightExpirationPeriod": 10}, "weightExpirationPeriod"),
        ({"oobReportingPeriod": "ten"}, "oobReportingPeriod"),
        ({"enableOobLoadReport": "yes"}, "enableOobLoadReport"),
        ({"metricNamesForComputingUtilization": "cpu"}, "metricNamesForComputingUtilization"),
        ({"metricNamesForComputingUtilization": [1]}, "metricNamesForComputingUtilization[0]"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(cfg, field):
    with pytest.raises(LBConfigError) as err:
        parse(cfg)
    assert f"weighted_round_robin.{field}" in str(err.value)


# -- weights from reports ------------------------------------------------------------


def test_before_any_report_picks_are_round_robin():
    h = Harness({"blackoutPeriod": "0s"})
    assert h.picker.scaled_weights is None
    shares = h.shares(3000)
    assert all(abs(s - 1 / 3) < 0.01 for s in shares.values())


def test_shares_follow_qps_over_utilization():
    h = Harness({"blackoutPeriod": "0s"})
    # weights 100/0.5=200, 100/0.25=400, 100/1.0=100
    h.feed({ADDRS[0]: report(100, 0.5), ADDRS[1]: report(100, 0.25), ADDRS[2]: report(100, 1.0)})
    h.advance(1.0)  # weight update period
    shares = h.shares()
    assert shares[ADDRS[0]] == pytest.approx(2 / 7, abs=0.01)
    assert shares[ADDRS[1]] == pytest.approx(4 / 7, abs=0.01)
    assert shares[ADDRS[2]] == pytest.approx(1 / 7, abs=0.01)


def test_weights_change_only_at_the_weight_update_period():
    h = Harness({"blackoutPeriod": "0s", "weightUpdatePeriod": "5s"})
    h.feed({ADDRS[0]: report(100, 0.1), ADDRS[1]: report(100, 1.0), ADDRS[2]: report(100, 1.0)})
    h.advance(4.9)
    assert h.picker.scaled_weights is None
    h.advance(0.1)
    assert h.picker.scaled_weights is not None


def test_blackout_period_delays_use_of_a_new_weight():
    h = Harness({"blackoutPeriod": "10s"})
    loads = {ADDRS[0]: report(100, 0.1), ADDRS[1]: report(100, 1.0), ADDRS[2]: report(100, 1.0)}
    h.feed(loads)
    h.advance(9.0)
    h.feed(loads)
    assert h.picker.scaled_weights is None  # 9 s of reports: still in blackout
    h.advance(1.0)  # 10 s since the first report
    assert h.picker.scaled_weights is not None
    assert h.shares()[ADDRS[0]] == pytest.approx(10 / 12, abs=0.01)


def test_blackout_restarts_when_an_endpoint_reconnects():
    h = Harness({"blackoutPeriod": "5s"})
    loads = {ADDRS[0]: report(100, 0.1), ADDRS[1]: report(100, 1.0), ADDRS[2]: report(100, 1.0)}
    h.feed(loads)
    h.advance(6.0)
    h.feed(loads)
    h.advance(1.0)
    assert h.picker.scaled_weights is not None
    sc = h.helper.subchannel(ADDRS[0])
    sc.set_state(ConnectivityState.IDLE)
    sc.set_state(ConnectivityState.CONNECTING)
    sc.set_state(READY)
    h.feed(loads)
    h.advance(1.0)
    # ADDRS[0] is blacked out again: only two weights known, both equal
    assert h.picker.scaled_weights is None


def test_weight_expires_after_weight_expiration_period():
    h = Harness({"blackoutPeriod": "0s", "weightExpirationPeriod": "30s"})
    h.feed({ADDRS[0]: report(100, 0.1), ADDRS[1]: report(100, 1.0), ADDRS[2]: report(100, 1.0)})
    h.advance(1.0)
    assert h.picker.scaled_weights is not None
    h.advance(29.0)  # 30 s after the last report: stale
    assert h.picker.scaled_weights is None


def test_error_utilization_penalty_lowers_the_weight_of_an_erroring_endpoint():
    # qps 100, util 0.5, eps 50: penalty 1.0 -> 100 / (0.5 + 0.5) = 100
    h = Harness({"blackoutPeriod": "0s", "errorUtilizationPenalty": 1.0})
    h.feed(
        {
            ADDRS[0]: report(100, 0.5, eps=50),
            ADDRS[1]: report(100, 0.5),
            ADDRS[2]: report(100, 0.5),
        }
    )
    h.advance(1.0)
    assert h.shares()[ADDRS[0]] == pytest.approx(100 / 500, abs=0.01)
    h.update({"blackoutPeriod": "0s", "errorUtilizationPenalty": 0.0})
    h.feed({ADDRS[0]: report(100, 0.5, eps=50)})
    h.advance(1.0)
    assert h.picker.scaled_weights is None  # no penalty: all three equal


def test_reports_without_qps_or_utilization_are_ignored():
    h = Harness({"blackoutPeriod": "0s"})
    h.feed({ADDRS[0]: report(0, 0.5), ADDRS[1]: report(100, 0.0), ADDRS[2]: report(100, 1.0)})
    h.advance(1.0)
    assert h.picker.scaled_weights is None  # one known weight only


def test_application_utilization_wins_over_cpu_utilization():
    r = report(100, 0.9, application_utilization=0.3)
    assert utilization(r) == pytest.approx(0.3)
    assert utilization(report(100, 0.9)) == pytest.approx(0.9)


def test_a114_metric_names_take_the_max_of_valid_values():
    r = OrcaLoadReport(
        cpu_utilization=0.2,
        mem_utilization=0.6,
        named_metrics={"foo": 0.7, "foo.bar": 0.9, "neg": -1.0, "nan": math.nan},
        utilization={"gpu": 0.4},
    )
    assert utilization(r, ["named_metrics.foo", "mem_utilization"]) == pytest.approx(0.7)
    assert utilization(r, ["named_metrics.foo.bar"]) == pytest.approx(0.9)
    assert utilization(r, ["utilization.gpu"]) == pytest.approx(0.4)
    # absent, negative, NaN, unsupported: fall back to A58 (cpu here)
    assert utilization(r, ["named_metrics.nope", "named_metrics.neg", "named_metrics.nan"]) == (
        pytest.approx(0.2)
    )
    assert utilization(r, ["rps_fractional", "request_cost.x"]) == pytest.approx(0.2)


def test_a114_metric_names_drive_weights():
    h = Harness({"blackoutPeriod": "0s", "metricNamesForComputingUtilization": ["named_metrics.q"]})
    loads = {
        a: OrcaLoadReport(rps_fractional=100, cpu_utilization=0.5, named_metrics={"q": q})
        for a, q in zip(ADDRS, (0.1, 0.9, 0.9), strict=True)
    }
    h.feed(loads)
    h.advance(1.0)
    assert h.shares()[ADDRS[0]] == pytest.approx(9 / 11, abs=0.01)


def test_malformed_trailer_is_ignored_and_does_not_raise():
    h = Harness({"blackoutPeriod": "0s"})
    hook = h.result_for(ADDRS[0]).on_call_trailers
    hook(((ORCA_TRAILER, b"\xff\xff\xff"),))
    hook(((ORCA_TRAILER, "not-bytes"),))
    hook(())
    assert report_from_trailers(((ORCA_TRAILER, b"\x0a\x0b"),)) is None
    h.advance(1.0)
    assert h.picker.scaled_weights is None


def test_oob_mode_does_not_read_per_call_trailers():
    h = Harness({"enableOobLoadReport": True})
    assert all(r.on_call_trailers is None for r in h.picker.results)


def test_switching_oob_mode_on_and_off_switches_every_endpoint_result():
    h = Harness({})
    assert all(r.on_call_trailers is not None for r in h.picker.results)
    h.update({"enableOobLoadReport": True})
    assert all(r.on_call_trailers is None for r in h.picker.results)
    h.update({})
    assert all(r.on_call_trailers is not None for r in h.picker.results)


def test_an_endpoint_report_keeps_the_other_endpoints_results_and_renews_its_own():
    h = Harness({"blackoutPeriod": "0s"})
    before = {r.subchannel.address: r for r in h.picker.results}
    first = h.helper.subchannel(ADDRS[0])
    first.set_state(TRANSIENT_FAILURE)
    first.set_state(READY)
    after = {r.subchannel.address: r for r in h.picker.results}
    assert all(after[a] is before[a] for a in ADDRS[1:])
    assert after[ADDRS[0]].on_call_trailers is not None  # a whole result, hooks and all
    h.feed({a: report(100, 0.1 if a == ADDRS[0] else 0.9) for a in ADDRS})
    h.advance(1.0)  # its new result's hooks feed its weight: 1000 against 111 each
    assert h.shares()[ADDRS[0]] == pytest.approx(1000 / (1000 + 111 * (len(ADDRS) - 1)), abs=0.01)


# -- scheduler ------------------------------------------------------------------------


def test_scale_weights_falls_back_to_round_robin():
    assert scale_weights([5.0]) is None  # one endpoint
    assert scale_weights([0.0, 0.0, 0.0]) is None  # nothing known
    assert scale_weights([3.0, 0.0, 0.0]) is None  # one known: all get the mean
    assert scale_weights([2.0, 2.0]) is None  # all equal


def test_scale_weights_caps_at_ten_times_the_mean_and_floors_at_one_percent():
    weights = [1000.0, 400.0] + [0.05] * 18
    mean = sum(weights) / 20  # about 70: the cap is 700, so 1000 weighs as 700
    scaled = scale_weights(weights, 10000)
    assert scaled is not None
    assert scaled[0] == 10000
    assert scaled[1] == round(400 * 10000 / (10 * mean))
    floor = round(round(mean * 10000 / (10 * mean)) * 0.01)  # 1 % of the scaled mean
    assert floor == 10 and scaled[2:] == (floor,) * 18  # 0.05 would scale to 0.7


def test_unknown_weight_gets_the_mean():
    scaled = scale_weights([1.0, 3.0, 0.0], 1000)
    assert scaled == (333, 1000, 667)


@pytest.mark.parametrize("weights", [[1, 2, 3, 4], [10, 1], [5, 5, 1, 7, 9, 2]])
def test_stride_picks_in_proportion_to_weights(weights):
    scaled = scale_weights([float(w) for w in weights], 1000)
    scheduler = StaticStrideScheduler(scaled, 1000)
    seq = iter(range(10**9)).__next__
    counts = collections.Counter(scheduler.pick(seq) for _ in range(50000))
    total = sum(scaled)
    for i, w in enumerate(scaled):
        assert counts[i] / 50000 == pytest.approx(w / total, abs=0.01)


def test_materialized_period_has_each_endpoint_exactly_weight_times():
    scaled = (7, 1, 300, 64)
    out = materialize(scaled, 300)
    assert collections.Counter(out) == {0: 7, 1: 1, 2: 300, 3: 64}
    scheduler = StaticStrideScheduler(scaled, 300)
    seq = iter(range(10**9)).__next__
    assert [scheduler.pick(seq) for _ in range(len(out))] == out


def test_max_weight_shrinks_with_endpoint_count():
    assert max_weight_for(2) == 32768
    assert max_weight_for(100) * 100 <= 1 << 16
    assert max_weight_for(10**6) >= 64


def test_picks_of_one_endpoint_are_spread_not_bunched():
    h = Harness({"blackoutPeriod": "0s"}, addrs=ADDRS[:2])
    h.feed({ADDRS[0]: report(100, 0.25), ADDRS[1]: report(100, 1.0)})  # 4:1
    h.advance(1.0)
    picks = [h.helper.pick().subchannel.address for _ in range(1000)]  # type: ignore[union-attr]
    longest, run = 0, 0
    for a in picks:
        run = run + 1 if a == ADDRS[0] else 0
        longest = max(longest, run)
    assert longest <= 6


# -- policy behaviour ---------------------------------------------------------------------


def test_same_config_and_endpoints_twice_publish_nothing():
    h = Harness({"blackoutPeriod": "0s"})
    before = len(h.helper.states)
    h.update({"blackoutPeriod": "0s"})
    assert len(h.helper.states) == before


def test_config_change_publishes_a_new_picker_and_keeps_weights():
    h = Harness({"blackoutPeriod": "0s"})
    h.feed({ADDRS[0]: report(100, 0.1), ADDRS[1]: report(100, 1.0), ADDRS[2]: report(100, 1.0)})
    old = h.picker
    h.update({"blackoutPeriod": "0s", "weightExpirationPeriod": "100s"})
    assert h.picker is not old
    assert h.picker.scaled_weights is not None  # the weights survived the update


def test_only_ready_endpoints_are_scheduled():
    h = Harness({"blackoutPeriod": "0s"})
    h.helper.subchannel(ADDRS[2]).set_state(ConnectivityState.TRANSIENT_FAILURE)
    shares = h.shares(2000)
    assert shares[ADDRS[2]] == 0


def test_timer_stops_when_not_ready_and_on_shutdown():
    h = Harness({"blackoutPeriod": "0s"})
    assert h.policy._timer is not None
    h.policy.shutdown()
    assert h.policy._timer is None


def test_oob_watch_per_ready_endpoint_at_the_configured_period():
    watches: list[tuple[str, float]] = []
    cancelled: list[str] = []
    h = Harness({"enableOobLoadReport": True, "oobReportingPeriod": "3s", "blackoutPeriod": "0s"})
    # fake subchannels have no OOB stream: give them one and resync
    for sc in h.helper.subchannels:

        def watch(period, fn, on_unimplemented=None, sc=sc):
            watches.append((sc.address, period))
            sc.oob_fn = fn
            return lambda: cancelled.append(sc.address)

        sc.watch_orca_oob = watch
    h.update({"enableOobLoadReport": True, "oobReportingPeriod": "4s", "blackoutPeriod": "0s"})
    assert sorted(watches) == sorted((a, 4.0) for a in ADDRS)
    for address, q in zip(ADDRS, (0.1, 1.0, 1.0), strict=True):
        h.helper.subchannel(address).oob_fn(report(100, q))
    h.advance(1.0)
    assert h.shares()[ADDRS[0]] == pytest.approx(10 / 12, abs=0.01)
    h.update({"blackoutPeriod": "0s"})  # OOB off: every watch stopped
    assert sorted(cancelled) == sorted(ADDRS)


def test_an_endpoint_state_change_starts_or_stops_only_its_own_oob_watch():
    watches: list[str] = []
    cancelled: list[str] = []
    config = {"enableOobLoadReport": True, "blackoutPeriod": "0s"}
    h = Harness(config)
    for sc in h.helper.subchannels:

        def watch(period, fn, on_unimplemented=None, sc=sc):
            watches.append(sc.address)
            return lambda: cancelled.append(sc.address)

        sc.watch_orca_oob = watch
    h.update(dict(config, oobReportingPeriod="2s"))  # resync: one watch each
    assert sorted(watches) == sorted(ADDRS)
    watches.clear()
    first = h.helper.subchannel(ADDRS[0])
    first.set_state(TRANSIENT_FAILURE)
    assert cancelled == [ADDRS[0]] and watches == []
    first.set_state(READY)
    assert watches == [ADDRS[0]] and cancelled == [ADDRS[0]]
    h.addrs = ADDRS[1:]
    h.update(dict(config, oobReportingPeriod="2s"))  # an endpoint removed
    assert cancelled == [ADDRS[0], ADDRS[0]] and watches == [ADDRS[0]]


# -- xDS conversion (A52, A58, A114) --------------------------------------------------


def _cluster_with(cswrr) -> bytes:
    from envoy.config.cluster.v3 import cluster_pb2

    c = cluster_pb2.Cluster(name="c1", type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.ads.SetInParent()
    c.load_balancing_policy.policies.add().typed_extension_config.typed_config.Pack(cswrr)
    return c.SerializeToString()


def test_xds_extension_converts_every_field_to_its_own_config_field():
    # grpc-go#8915: one proto field was read for two config fields; give each a
    # distinct value so such a mix-up cannot pass.
    from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
        client_side_weighted_round_robin_pb2 as cswrr_pb2,
    )

    from pyxds.xds.resources import CLUSTER

    m = cswrr_pb2.ClientSideWeightedRoundRobin()
    m.enable_oob_load_report.value = True
    m.oob_reporting_period.seconds = 2
    m.blackout_period.seconds = 3
    m.weight_expiration_period.seconds = 4
    m.weight_update_period.seconds = 5
    m.error_utilization_penalty.value = 0.5
    m.metric_names_for_computing_utilization.extend(["named_metrics.a", "cpu_utilization"])
    result = CLUSTER.decode(_cluster_with(m))
    assert result.error is None, result.error
    _, config = registry.select(result.resource.lb_policy_json())
    assert config == WeightedRoundRobinConfig(
        enable_oob_load_report=True,
        oob_reporting_period=2.0,
        blackout_period=3.0,
        weight_expiration_period=4.0,
        weight_update_period=5.0,
        error_utilization_penalty=0.5,
        metric_names_for_computing_utilization=("named_metrics.a", "cpu_utilization"),
    )


def test_xds_extension_with_bad_values_is_nacked_naming_the_field():
    from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
        client_side_weighted_round_robin_pb2 as cswrr_pb2,
    )

    from pyxds.xds.resources import CLUSTER

    m = cswrr_pb2.ClientSideWeightedRoundRobin()
    m.error_utilization_penalty.value = -1.0
    error = CLUSTER.decode(_cluster_with(m)).error
    assert error is not None and "error_utilization_penalty" in error
    m = cswrr_pb2.ClientSideWeightedRoundRobin()
    m.blackout_period.seconds = -5
    error = CLUSTER.decode(_cluster_with(m)).error
    assert error is not None and "blackout_period" in error


def test_zero_blackout_period_uses_a_weight_from_the_first_report():
    h = Harness({"blackoutPeriod": "0s"})
    h.feed({ADDRS[0]: report(100, 0.1), ADDRS[1]: report(100, 1.0), ADDRS[2]: report(100, 1.0)})
    h.advance(1.0)
    assert h.picker.scaled_weights is not None


def test_per_call_reports_on_a_stale_picker_still_update_the_endpoint_weight():
    # A call picked from an older picker reports to the endpoint, not the picker.
    h = Harness({"blackoutPeriod": "0s"})
    old_hook = h.result_for(ADDRS[0]).on_call_trailers
    h.update({"blackoutPeriod": "0s", "weightUpdatePeriod": "2s"})
    old_hook(trailers(report(100, 0.1)))
    h.feed({ADDRS[1]: report(100, 1.0), ADDRS[2]: report(100, 1.0)})
    h.advance(2.0)
    assert h.shares()[ADDRS[0]] == pytest.approx(10 / 12, abs=0.01)


# -- per-call reports pyxds cannot see: the OOB stand-in (issue 19) ---------------------------


def _oob_fakes(h: Harness) -> dict[str, dict]:
    """Give the fake subchannels an OOB stream: address -> its watch record."""
    streams: dict[str, dict] = {}
    for sc in h.helper.subchannels:

        def watch(period, fn, on_unimplemented=None, sc=sc):
            rec = streams.setdefault(sc.address, {"watches": 0, "cancelled": 0})
            rec.update(period=period, fn=fn, unimplemented=on_unimplemented)
            rec["watches"] += 1
            return lambda rec=rec: rec.__setitem__("cancelled", rec["cancelled"] + 1)

        sc.watch_orca_oob = watch
    return streams


def _call_without_report(h: Harness, address: str) -> None:
    """A call to ``address`` that ended with trailers holding no report pyxds can read."""
    from pyxds.lb.api import OK_STATUS

    result = h.result_for(address)
    result.on_call_trailers((("x-other", "1"),))
    result.on_call_done(OK_STATUS)


def test_a_call_without_visible_report_starts_an_oob_stand_in_at_the_oob_period():
    h = Harness({"blackoutPeriod": "0s", "oobReportingPeriod": "2s"})
    streams = _oob_fakes(h)
    _call_without_report(h, ADDRS[0])
    assert streams == {}  # the RPC thread only schedules it
    h.advance(0)
    assert list(streams) == [ADDRS[0]] and streams[ADDRS[0]]["period"] == 2.0
    _call_without_report(h, ADDRS[0])
    h.advance(0)
    assert streams[ADDRS[0]]["watches"] == 1  # one stand-in per endpoint


def test_stand_in_reports_weight_the_endpoints_like_per_call_ones():
    h = Harness({"blackoutPeriod": "0s"})
    streams = _oob_fakes(h)
    for address in ADDRS:
        _call_without_report(h, address)
    h.advance(0)
    for address, q in zip(ADDRS, (0.1, 1.0, 1.0), strict=True):
        streams[address]["fn"](report(100, q))
    h.advance(1.0)
    assert h.shares()[ADDRS[0]] == pytest.approx(10 / 12, abs=0.01)
    dump = h.policy.config_dump()
    assert dump["reporting"] == "per-call"
    assert {row["source"] for row in dump["endpoint_weights"]} == {"out-of-band (stand-in)"}


def test_a_visible_per_call_report_ends_the_stand_in():
    h = Harness({"blackoutPeriod": "0s"})
    streams = _oob_fakes(h)
    _call_without_report(h, ADDRS[0])
    h.advance(0)
    assert streams[ADDRS[0]]["cancelled"] == 0
    h.feed({ADDRS[0]: report(100, 0.5)})  # a pyxds.orca backend's mirrored report
    h.advance(0)
    assert streams[ADDRS[0]]["cancelled"] == 1
    _call_without_report(h, ADDRS[0])
    h.advance(0)
    assert streams[ADDRS[0]]["watches"] == 1  # per-call seen: never again


def test_endpoints_whose_per_call_reports_are_visible_get_no_stand_in():
    from pyxds.lb.api import OK_STATUS

    h = Harness({"blackoutPeriod": "0s"})
    streams = _oob_fakes(h)
    h.feed({a: report(100, 0.5) for a in ADDRS})
    for address in ADDRS:
        h.result_for(address).on_call_done(OK_STATUS)
    h.advance(0)
    assert streams == {}


def test_a_call_not_started_asks_for_nothing():
    from pyxds.lb.api import ATTEMPT_NOT_STARTED

    h = Harness({"blackoutPeriod": "0s"})
    streams = _oob_fakes(h)
    h.result_for(ADDRS[0]).on_call_done(ATTEMPT_NOT_STARTED)
    h.advance(0)
    assert streams == {}


def test_no_oob_service_either_is_one_warning_naming_the_cluster_and_a_dump_entry(caplog):
    import logging

    from pyxds.lb import weighted_round_robin as wrr

    wrr._WARNED.clear()
    h = Harness({"blackoutPeriod": "0s"})
    h.helper.channel_target = "xds:///svc"
    h.addrs = list(ADDRS)
    h.policy.update(
        ResolverUpdate([Endpoint((a,), {"xds_cluster": "backend-go"}) for a in ADDRS], h.config)
    )
    streams = _oob_fakes(h)
    for address in ADDRS:
        _call_without_report(h, address)
    h.advance(0)
    with caplog.at_level(logging.WARNING, logger="pyxds.lb.weighted_round_robin"):
        for address in ADDRS:
            streams[address]["unimplemented"]("Method not found!")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cluster backend-go" in warnings[0] and "OpenRcaService" in warnings[0]
    assert "endpoint-load-metrics-bin" in warnings[0]
    rows = h.policy.config_dump()["endpoint_weights"]
    assert all(row["weight"] == 0.0 and "OpenRcaService" in row["no_weight"] for row in rows)
    assert h.policy.config_dump()["cluster"] == "backend-go"
    h.advance(1.0)
    assert h.picker.scaled_weights is None  # round robin
    assert all(s == pytest.approx(1 / 3, abs=0.02) for s in h.shares().values())
    # the endpoint is not asked again on that connection
    _call_without_report(h, ADDRS[0])
    h.advance(0)
    assert streams[ADDRS[0]]["watches"] == 1


def test_a_malformed_visible_report_asks_for_no_stand_in():
    """The key pyxds can see is there, its value is garbage: per-call reports
    are visible, so no OOB stand-in (C-core: no weight either)."""
    from pyxds.lb.api import OK_STATUS
    from pyxds.lb.orca import ORCA_TRAILER_MIRROR

    h = Harness({"blackoutPeriod": "0s"})
    streams = _oob_fakes(h)
    result = h.result_for(ADDRS[0])
    result.on_call_trailers(((ORCA_TRAILER_MIRROR, b"\xff\xff\xff\xff"),))
    result.on_call_done(OK_STATUS)
    h.advance(0)
    assert streams == {}
