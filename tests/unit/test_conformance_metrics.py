"""Conformance of pyxds's metrics with gRFC A66 (per-call and per-attempt
OpenTelemetry metrics) and A78 (WRR, pick_first, XdsClient metrics, the
optional locality label), checked through the OpenTelemetry SDK's
in-memory reader; no sockets (the channel's fakes, tests/unit/
test_channel_support.py).  The same behaviours against grpcio's C-core,
live: tests/e2e/test_differential_metrics.py."""

from __future__ import annotations

import random
from types import SimpleNamespace

import grpc
import pytest
from test_channel_picks import CountingPicker, Selector, ready_subchannel
from test_channel_support import FakeGrpcError, Harness, new_rpc, run_blocking

from pyxds import metrics
from pyxds.channel.call_metrics import CallMetrics
from pyxds.lb.api import Endpoint, PickComplete, Picker, PickFail, Status
from pyxds.resolver.api import CallConfig, ResolverResult
from pyxds.resolver.fault_filter import FaultConfig, FaultInjector, _ActiveFaults
from pyxds.resolver.retry_policy import RetryPolicy
from pyxds.server import builders as b

sdk = pytest.importorskip("opentelemetry.sdk.metrics")
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
LOC = "grpc.lb.locality"
BS = "grpc.lb.backend_service"
STARTED = "grpc.client.attempt.started"
ATTEMPT = "grpc.client.attempt.duration"
CALL = "grpc.client.call.duration"
SENT = "grpc.client.attempt.sent_total_compressed_message_size"
RCVD = "grpc.client.attempt.rcvd_total_compressed_message_size"
PER_ATTEMPT = (ATTEMPT, SENT, RCVD)
#: A78's metrics: off by default (A78 "Metric Stability"), enabled by name
A78_METRICS = sorted(set(metrics.INSTRUMENTS) - metrics.DEFAULT_METRICS)

_M, _T, _S = "grpc.method", "grpc.target", "grpc.status"
_SERVER, _RTYPE = "grpc.xds.server", "grpc.xds.resource_type"

#: name -> (kind, unit, required labels, optional labels), as the gRFC tables
GRFC_TABLES = {
    # A66 "Client Per-Attempt Instruments", "Client Per-Call Instruments";
    # A78 "Per-Call Metrics" adds grpc.lb.locality to the three attempt ones
    STARTED: ("counter", "{attempt}", {_M, _T}, set()),
    # and A89 grpc.lb.backend_service to the same three and to WRR's
    ATTEMPT: ("histogram", "s", {_M, _T, _S}, {LOC, BS}),
    SENT: ("histogram", "By", {_M, _T, _S}, {LOC, BS}),
    RCVD: ("histogram", "By", {_M, _T, _S}, {LOC, BS}),
    CALL: ("histogram", "s", {_M, _T, _S}, set()),
    # A78 "Weighted Round Robin LB Policy"
    "grpc.lb.wrr.rr_fallback": ("counter", "{update}", {_T}, {LOC, BS}),
    "grpc.lb.wrr.endpoint_weight_not_yet_usable": ("counter", "{endpoint}", {_T}, {LOC, BS}),
    "grpc.lb.wrr.endpoint_weight_stale": ("counter", "{endpoint}", {_T}, {LOC, BS}),
    "grpc.lb.wrr.endpoint_weights": ("histogram", "{weight}", {_T}, {LOC, BS}),
    # A78 "Pick First LB Policy"
    "grpc.lb.pick_first.disconnections": ("counter", "{disconnection}", {_T}, set()),
    "grpc.lb.pick_first.connection_attempts_succeeded": ("counter", "{attempt}", {_T}, set()),
    "grpc.lb.pick_first.connection_attempts_failed": ("counter", "{attempt}", {_T}, set()),
    # A78 "XdsClient"
    "grpc.xds_client.connected": ("gauge", "{bool}", {_T, _SERVER}, set()),
    "grpc.xds_client.server_failure": ("counter", "{failure}", {_T, _SERVER}, set()),
    "grpc.xds_client.resource_updates_valid": (
        "counter",
        "{resource}",
        {_T, _SERVER, _RTYPE},
        set(),
    ),
    "grpc.xds_client.resource_updates_invalid": (
        "counter",
        "{resource}",
        {_T, _SERVER, _RTYPE},
        set(),
    ),
    "grpc.xds_client.resources": (
        "gauge",
        "{resource}",
        {_T, "grpc.xds.authority", "grpc.xds.cache_state", _RTYPE},
        set(),
    ),
}

#: A66 "Units": latency and size buckets of the default views
A66_LATENCY = (
    0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13,
    0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1, 2, 5, 10, 20, 50, 100,
)  # fmt: skip
A66_SIZE = (
    0, 1024, 2048, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
    268435456, 1073741824, 4294967296,
)  # fmt: skip


@pytest.fixture
def enable():
    """``enable(**kwargs)``: metrics on with a fresh in-memory reader."""

    def on(**kwargs) -> InMemoryMetricReader:
        reader = InMemoryMetricReader()
        metrics.enable(sdk.MeterProvider(metric_readers=[reader]), **kwargs)
        return reader

    yield on
    metrics.disable()


def points(reader, name: str) -> list:
    data = reader.get_metrics_data()
    return [
        p
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


def total(reader, name: str) -> int:
    """A counter's value, or a histogram's count, over all its points."""
    found = points(reader, name)
    return sum(getattr(p, "count", None) or getattr(p, "value", 0) for p in found)


# ---------------------------------------------------------------------------
# Names, kinds, units, labels, buckets
# ---------------------------------------------------------------------------


def test_instruments_are_the_grfc_tables_names_kinds_units_and_labels():
    """A66 "Client Per-Attempt Instruments" / "Client Per-Call Instruments"
    and A78's WRR, Pick First and XdsClient tables, field by field."""
    got = {
        name: (i.kind, i.unit, set(i.labels), set(i.optional_labels))
        for name, i in metrics.INSTRUMENTS.items()
    }
    assert got == GRFC_TABLES


def test_histograms_advise_a66_latency_and_size_buckets(enable):
    """A66 "Units": the latency buckets for the duration histograms, the
    size buckets for the message-size histograms (as bucket advice)."""
    reader = enable()
    labels = {_M: "s/M", _T: "t", _S: "OK"}
    for name in (ATTEMPT, CALL, SENT, RCVD):
        metrics.record(name, 1, labels)
    for name in (ATTEMPT, CALL):
        (point,) = points(reader, name)
        assert tuple(point.explicit_bounds) == A66_LATENCY, name
    for name in (SENT, RCVD):
        (point,) = points(reader, name)
        assert tuple(point.explicit_bounds) == A66_SIZE, name


# ---------------------------------------------------------------------------
# A78 optional locality label on the per-attempt metrics
# ---------------------------------------------------------------------------


def _one_attempt(registered: bool = True) -> None:
    call = CallMetrics("/pkg.Svc/M", "xds:///svc", registered)
    call.attempt_started()
    call.sizes[0], call.sizes[1] = 3, 5
    picked = {LOC: '{region="r", zone="z", sub_zone="s"}'}
    call.attempt_ended(Status(grpc.StatusCode.OK, ""), picked, True)
    call.call_ended(Status(grpc.StatusCode.OK, ""))


def test_locality_label_is_on_no_attempt_metric_unless_enabled(enable):
    """A78 "Optional xDS Locality Label": an optional label, so not emitted
    until enabled, on any of the three per-attempt metrics that carry it
    (the picker sets it; grpcio 1.85's C-core emits none by default: tests/
    e2e/test_differential_metrics.py)."""
    reader = enable()
    _one_attempt()
    for name in PER_ATTEMPT:
        (point,) = points(reader, name)
        assert dict(point.attributes) == {_M: "pkg.Svc/M", _T: "xds:///svc", _S: "OK"}, name


def test_enabled_locality_label_is_on_all_three_attempt_metrics(enable):
    """A78 "Per-Call Metrics": "This label will be available on the
    following per-call metrics: grpc.client.attempt.duration,
    grpc.client.attempt.sent_total_compressed_message_size,
    grpc.client.attempt.rcvd_total_compressed_message_size"; never on
    grpc.client.attempt.started or grpc.client.call.duration."""
    reader = enable(optional_labels=[LOC])
    _one_attempt()
    for name in PER_ATTEMPT:
        (point,) = points(reader, name)
        assert point.attributes[LOC] == '{region="r", zone="z", sub_zone="s"}', name
    for name in (STARTED, CALL):
        (point,) = points(reader, name)
        assert LOC not in point.attributes, name


# ---------------------------------------------------------------------------
# A66 grpc.method: generic methods are "other" unless the filter says so
# ---------------------------------------------------------------------------


def _methods(reader) -> dict[str, set[str]]:
    return {
        name: {p.attributes[_M] for p in points(reader, name)}
        for name in (STARTED, ATTEMPT, SENT, RCVD, CALL)
    }


def test_registered_method_is_recorded_by_name(enable):
    """A66 "Attributes": grpc.method is the full method name (registered:
    generated stubs pass ``_registered_method=True``)."""
    reader = enable()
    _one_attempt(registered=True)
    assert set().union(*_methods(reader).values()) == {"pkg.Svc/M"}


def test_generic_method_is_recorded_as_other_by_default(enable):
    """A66 "Attributes": "unregistered/generic method names should by
    default be reported with "other" value instead" (C-core through
    grpcio-observability: "other" for ``channel.unary_unary(path)``)."""
    reader = enable()
    _one_attempt(registered=False)
    assert _methods(reader) == {name: {"other"} for name in (STARTED, ATTEMPT, SENT, RCVD, CALL)}


def test_generic_method_filter_chooses_which_generic_names_are_recorded(enable):
    """A66 "Implementations should provide the option to override this
    behavior" (C++ ``SetGenericMethodAttributeFilter``, grpcio's
    ``generic_method_attribute_filter``): called with the method name."""
    asked = []

    def keep(method: str) -> bool:
        asked.append(method)
        return method.startswith("pkg.")

    reader = enable(generic_method_attribute_filter=keep)
    _one_attempt(registered=False)
    CallMetrics("/other.Svc/N", "t", False).call_ended(Status(grpc.StatusCode.OK, ""))
    assert asked == ["pkg.Svc/M", "other.Svc/N"]
    assert {p.attributes[_M] for p in points(reader, CALL)} == {"pkg.Svc/M", "other"}


def test_generic_method_filter_that_raises_records_other(enable):
    def broken(method: str) -> bool:
        raise RuntimeError("bug")

    reader = enable(generic_method_attribute_filter=broken)
    _one_attempt(registered=False)
    assert {p.attributes[_M] for p in points(reader, CALL)} == {"other"}


def test_channel_multicallable_registers_its_method_only_when_asked():
    """``_registered_method=True`` (generated stubs) registers the path
    with the channel; a plain ``unary_unary(path)`` does not."""
    import pyxds

    with pyxds.insecure_channel("127.0.0.1:1") as channel:
        channel.unary_unary("/pkg.Svc/Plain")
        channel.unary_stream("/pkg.Svc/Stub", _registered_method=True)
        assert channel._core.registered_methods == {"/pkg.Svc/Stub"}


# ---------------------------------------------------------------------------
# A66: when an attempt exists ("after name resolution and after any xDS HTTP
# filters but before the LB pick") and how many
# ---------------------------------------------------------------------------

#: the routes' retry policy: UNAVAILABLE, 3 retries, 1-2 ms backoff
POLICY = RetryPolicy.from_xds(("unavailable",), 3, 0.001, 0.002)


@pytest.fixture
def h():
    """A channel over fakes whose routes retry with :data:`POLICY`."""
    harness = Harness()
    harness.start()
    selector = Selector(CallConfig(call_attributes={"cluster": "c1"}, retry_policy=POLICY))
    harness.resolve([Endpoint(("10.0.0.1:80",))], selector)
    yield harness
    harness.core.close()


def _call(rpc, fail_codes=()):
    """Run ``rpc`` through the blocking adapter; each attempt fails with the
    next of ``fail_codes``, then succeeds."""
    codes = list(fail_codes)

    def invoke(transport, remaining):
        if codes:
            raise FakeGrpcError(codes.pop(0), "backend says no")
        return transport.channel.unary_unary("/svc/M").with_call(b"req")

    try:
        run_blocking(rpc, invoke)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def _attempt_statuses(reader) -> list[tuple[str, int]]:
    return sorted((p.attributes[_S], p.count) for p in points(reader, ATTEMPT))


def test_rpc_that_fails_without_a_config_has_no_attempt(enable):
    """A66: no attempt before name resolution: a channel whose resolver
    failed fails the RPC (not wait_for_ready) with a call and no attempt
    (C-core through grpcio-observability: the same, e2e)."""
    reader = enable()
    h = Harness()
    try:
        h.start()
        h.resolver.push(ResolverResult(endpoints=Status(UNAVAILABLE, "resolution failed")))
        rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
        assert _call(rpc) is UNAVAILABLE
    finally:
        h.core.close()
    assert total(reader, STARTED) == 0 and points(reader, ATTEMPT) == []
    assert [p.attributes[_S] for p in points(reader, CALL)] == ["UNAVAILABLE"]


def test_rpc_failed_by_its_route_has_no_attempt(h, enable):
    """A66: no attempt when the ConfigSelector fails the RPC (e.g. A28's
    "No matching route found" or a non-forwarding action)."""
    reader = enable()
    status = Status(UNAVAILABLE, "No matching route found")
    h.core.selector = Selector(CallConfig(status=status))
    assert _call(new_rpc(h.core, "/svc/M", None, 5.0, False)) is UNAVAILABLE
    assert total(reader, STARTED) == 0 and points(reader, ATTEMPT) == []
    assert total(reader, CALL) == 1


def test_rpc_aborted_by_a_fault_filter_has_no_attempt(h, enable):
    """A66: attempts start "after any xDS HTTP filters": an A33 abort fails
    the call before any attempt (C-core: the same, e2e)."""
    reader = enable()
    h.publish(CountingPicker(None))
    fault = FaultConfig.parse(
        b.fault_config(abort_grpc_status=14, abort_percent=100).SerializeToString()
    )
    h.core.selector = Selector(CallConfig(filters=(FaultInjector(fault, _ActiveFaults()),)))
    assert _call(new_rpc(h.core, "/svc/M", None, 5.0, False)) is UNAVAILABLE
    assert total(reader, STARTED) == 0 and points(reader, ATTEMPT) == []
    assert [p.attributes[_S] for p in points(reader, CALL)] == ["UNAVAILABLE"]


class _Ready(Picker):
    def __init__(self, sub):
        self.sub = sub

    def pick(self, args):
        return PickComplete(self.sub)


def test_each_retry_is_one_attempt_with_its_own_status(h, enable):
    """A66 "grpc.client.attempt.started": one per attempt; each attempt's
    duration with its own status, one call duration (C-core: the same
    counts for an A44 retry policy, e2e)."""
    reader = enable()
    h.publish(_Ready(ready_subchannel(h)))
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    assert _call(rpc, [UNAVAILABLE, UNAVAILABLE]) is grpc.StatusCode.OK
    assert total(reader, STARTED) == 3
    assert _attempt_statuses(reader) == [("OK", 1), ("UNAVAILABLE", 2)]
    assert [(p.attributes[_S], p.count) for p in points(reader, CALL)] == [("OK", 1)]


def test_failed_picks_retried_by_the_policy_are_attempts(h, enable):
    """A6/A66: a pick that fails ends its attempt with the pick's status; a
    retry of it is a new attempt (C-core: 3 attempts for 2 retries of a
    cluster that cannot connect, e2e)."""
    reader = enable()
    h.publish(CountingPicker(PickFail(Status(UNAVAILABLE, "all endpoints down"))))
    assert _call(new_rpc(h.core, "/svc/M", None, 5.0, False)) is UNAVAILABLE
    assert total(reader, STARTED) == 4  # 1 + 3 retries
    assert _attempt_statuses(reader) == [("UNAVAILABLE", 4)]


def test_deadline_during_the_retry_backoff_starts_no_attempt(h, enable):
    """A66: an attempt starts before its pick, so a retry whose backoff
    runs into the deadline has none: one attempt (UNAVAILABLE), the call
    DEADLINE_EXCEEDED (C-core: the same, e2e)."""
    reader = enable()
    h.core.random = random.Random(3)  # the backoff draw (A6: random(0, 5 s)) is known
    slow = RetryPolicy.from_xds(("unavailable",), 3, 5.0, 5.0)
    h.core.selector = Selector(CallConfig(retry_policy=slow))
    h.publish(_Ready(ready_subchannel(h)))
    rpc = new_rpc(h.core, "/svc/M", None, 0.05, False)
    assert _call(rpc, [UNAVAILABLE]) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert total(reader, STARTED) == 1
    assert _attempt_statuses(reader) == [("UNAVAILABLE", 1)]
    assert [p.attributes[_S] for p in points(reader, CALL)] == ["DEADLINE_EXCEEDED"]


def test_attempt_started_is_counted_before_the_attempt_ends(h, enable):
    """A66: "The total number of RPC attempts started, including those that
    have not completed": counted when the RPC is routed, before its pick."""
    reader = enable()
    h.publish(CountingPicker(None))  # every pick queues
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    assert rpc.pick() is None
    assert total(reader, STARTED) == 1 and points(reader, ATTEMPT) == []
    rpc.finish(Status(grpc.StatusCode.CANCELLED, "done"))
    assert _attempt_statuses(reader) == [("CANCELLED", 1)]


# ---------------------------------------------------------------------------
# A78 pick_first counters (C-core pick_first.cc's recording rules, grpc-go
# balancer/pickfirst TestPickFirstMetricsE2E)
# ---------------------------------------------------------------------------

PF_FAILED = "grpc.lb.pick_first.connection_attempts_failed"
PF_SUCCEEDED = "grpc.lb.pick_first.connection_attempts_succeeded"
PF_DISCONNECTIONS = "grpc.lb.pick_first.disconnections"
PF_A, PF_B = "127.0.0.1:443", "127.0.0.1:444"


def _pick_first(helper, *addresses):
    from pyxds.lb.api import ResolverUpdate
    from pyxds.lb.pick_first import PickFirst, PickFirstConfig

    helper.channel_target = "dns:///pf.example"
    policy = PickFirst(helper)
    policy.update(ResolverUpdate([Endpoint((a,)) for a in addresses], PickFirstConfig(False)))
    return policy


def _pf_counts(reader) -> dict[str, int]:
    out = {}
    for name in (PF_FAILED, PF_SUCCEEDED, PF_DISCONNECTIONS):
        found = points(reader, name)
        assert all(dict(p.attributes) == {_T: "dns:///pf.example"} for p in found), name
        out[name] = sum(p.value for p in found)
    return out


def _two_addresses(enable):
    """A78 metrics on; pick_first over A and B, out of idle: (reader,
    helper, subchannel A, subchannel B)."""
    from pyxds.testing import FakeHelper

    reader = enable(enable_metrics=A78_METRICS)
    helper = FakeHelper()
    _pick_first(helper, PF_A, PF_B).exit_idle()
    a, b_ = helper.subchannels
    return reader, helper, a, b_


def test_pick_first_counts_a_failed_attempt_a_success_and_a_disconnection(enable):
    """grpc-go TestPickFirstMetricsE2E / A78 "Pick First LB Policy": the
    first address fails to connect (failed 1), the second connects
    (succeeded 1), the selected connection goes away (disconnections 1),
    each labelled with the channel's target."""
    from pyxds.lb.api import ConnectivityState as CS

    reader, _, a, b_ = _two_addresses(enable)
    a.set_state(CS.CONNECTING)
    a.set_state(CS.TRANSIENT_FAILURE, "failed to connect")
    b_.set_state(CS.CONNECTING)
    b_.set_state(CS.READY)
    assert _pf_counts(reader) == {PF_FAILED: 1, PF_SUCCEEDED: 1, PF_DISCONNECTIONS: 0}
    b_.set_state(CS.IDLE)
    assert _pf_counts(reader) == {PF_FAILED: 1, PF_SUCCEEDED: 1, PF_DISCONNECTIONS: 1}


def test_pick_first_counts_one_success_when_two_attempts_connect(enable):
    """A78: "multiple subchannels may successfully establish a connection at
    basically the same moment due to Happy Eyeballs ..., but only one of
    them will actually be used by Pick First, so we want to increment the
    counter only once"."""
    from pyxds.lb.api import ConnectivityState as CS
    from pyxds.lb.pick_first import CONNECTION_ATTEMPT_DELAY

    reader, helper, a, b_ = _two_addresses(enable)
    a.set_state(CS.CONNECTING)
    helper.clock.advance(CONNECTION_ATTEMPT_DELAY)  # Happy Eyeballs: B starts too
    b_.set_state(CS.CONNECTING)
    a.set_state(CS.READY)
    b_.set_state(CS.READY)
    assert _pf_counts(reader)[PF_SUCCEEDED] == 1


def test_pick_first_does_not_count_a_connection_it_found_ready(enable):
    """C-core pick_first.cc Select(): "We consider it a successful
    connection attempt only if the previous state was CONNECTING.  In
    particular, we don't want to increment this counter if we got a new
    address list and found the existing connection already in state READY"
    (a subchannel shared with another channel, A61)."""
    from test_conformance_pick_first import PooledHelper

    from pyxds.lb.api import ConnectivityState as CS

    reader = enable(enable_metrics=A78_METRICS)
    helper = PooledHelper()
    helper.preset(PF_A, CS.READY)
    policy = _pick_first(helper, PF_A, PF_B)
    policy.exit_idle()
    assert helper.state is CS.READY
    assert _pf_counts(reader) == {PF_FAILED: 0, PF_SUCCEEDED: 0, PF_DISCONNECTIONS: 0}


def test_pick_first_does_not_count_a_subchannel_already_failed_as_an_attempt(enable):
    """C-core: a subchannel's initial state (TRANSIENT_FAILURE, shared with
    another channel) is no connection attempt of this policy; its next
    failure is."""
    from test_conformance_pick_first import PooledHelper

    from pyxds.lb.api import ConnectivityState as CS

    reader = enable(enable_metrics=A78_METRICS)
    helper = PooledHelper()
    helper.preset(PF_A, CS.TRANSIENT_FAILURE, "failed to connect")
    policy = _pick_first(helper, PF_A, PF_B)
    policy.exit_idle()
    b_ = helper.subchannels[-1]
    b_.set_state(CS.CONNECTING)
    b_.set_state(CS.TRANSIENT_FAILURE, "failed to connect")
    assert _pf_counts(reader)[PF_FAILED] == 1


# ---------------------------------------------------------------------------
# A78 WRR metrics, C-core weighted_round_robin_test.cc MetricValues replayed
# ---------------------------------------------------------------------------


def test_wrr_metrics_follow_c_cores_metric_values_sequence(enable):
    """C-core weighted_round_robin_test.cc ``MetricValues``: five scheduler
    updates while the endpoints connect (1, 1, 2, 2, 3 endpoints, no weight
    yet: each weight recorded 0, each update an RR fallback, 9 endpoints not
    yet usable), then two endpoints report (111.11 and 333.33: qps 100,
    application utilization 0.9 and 0.3; one more not yet usable, no
    fallback: two valid weights), then all three; after the expiration
    period all three are stale (A78 "Weighted Round Robin LB Policy")."""
    from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

    from pyxds.lb.weighted_round_robin import (
        EndpointWeight,
        WeightedRoundRobinConfig,
        WeightedRoundRobinPicker,
    )
    from pyxds.testing import FakeClock

    reader = enable(optional_labels=[LOC], enable_metrics=A78_METRICS)
    labels = {_T: "xds:///wrr", LOC: '{region="r", zone="z", sub_zone=""}'}
    clock = FakeClock(start=100.0)
    config = WeightedRoundRobinConfig(blackout_period=0.0, weight_expiration_period=2.0)
    weights = [EndpointWeight(clock, config) for _ in range(3)]

    class _Sub:
        def __init__(self, i: int) -> None:
            self.address = f"127.0.0.1:44{i + 1}"

    def update(n: int) -> None:
        results = [PickComplete(_Sub(i)) for i in range(n)]
        WeightedRoundRobinPicker(results, weights[:n], clock, random.Random(1), labels)

    def value(name: str) -> float:
        found = points(reader, name)
        assert all(dict(p.attributes) == labels for p in found), name
        return sum(getattr(p, "value", None) or 0 for p in found)

    for n in (1, 1, 2, 2, 3):
        update(n)
    weights[0].on_report(OrcaLoadReport(rps_fractional=100, application_utilization=0.9))
    weights[1].on_report(OrcaLoadReport(rps_fractional=100, application_utilization=0.3))
    update(3)
    weights[2].on_report(OrcaLoadReport(rps_fractional=100, application_utilization=0.3))
    update(3)
    (hist,) = points(reader, "grpc.lb.wrr.endpoint_weights")
    assert hist.count == 15
    assert hist.sum == pytest.approx(2 * 100 / 0.9 + 3 * 100 / 0.3)
    assert value("grpc.lb.wrr.rr_fallback") == 5
    assert value("grpc.lb.wrr.endpoint_weight_not_yet_usable") == 10
    assert value("grpc.lb.wrr.endpoint_weight_stale") == 0
    clock.advance(2.0)
    update(3)
    assert value("grpc.lb.wrr.endpoint_weight_stale") == 3
    assert value("grpc.lb.wrr.endpoint_weight_not_yet_usable") == 10
    assert value("grpc.lb.wrr.rr_fallback") == 6
    (hist,) = points(reader, "grpc.lb.wrr.endpoint_weights")
    assert hist.count == 18


# ---------------------------------------------------------------------------
# A78 XdsClient resource_updates_valid / _invalid: which resources count
# (C-core xds_client.cc AdsResponseParser::ParseResource, xds_client_test.cc)
# ---------------------------------------------------------------------------


def _counting_state():
    from test_xds_client_ads_state import make_state

    state, _ = make_state()
    counts: list[tuple[str, int, int]] = []
    state.on_resource_counts = lambda type_url, valid, invalid: counts.append(
        (type_url, valid, invalid)
    )
    return state, counts


def test_xds_client_counts_a_valid_resource_on_every_update_even_unchanged():
    """A78: "The counter will be incremented even for resources that have
    not changed" (C-core XdsClientTest.UpdateFromServer: 1, then 2); one
    count per resource, not per watcher (MultipleWatchersForSameResource)."""
    from test_xds_client_ads_state import CDS, RecordingWatcher, connected_stream, response

    state, counts = _counting_state()
    state.add_watcher(CDS, "a", RecordingWatcher())
    state.add_watcher(CDS, "a", RecordingWatcher())
    connected_stream(state)
    state.on_response(response(CDS, "1", "n1", ("a", "x")))
    state.on_response(response(CDS, "2", "n2", ("a", "x")))
    assert counts == [(CDS, 1, 0), (CDS, 1, 0)]


def test_xds_client_counts_only_subscribed_resources_and_unattributable_errors():
    """C-core ParseResource: a resource nobody subscribed to is skipped
    before it is counted, valid or not (its decode error still goes in the
    NACK); an invalid subscribed resource counts invalid; a resource of the
    wrong type counts invalid whoever asked."""
    from test_xds_client_ads_state import (
        CDS,
        INVALID,
        LDS,
        RecordingWatcher,
        _encode,
        connected_stream,
        response,
    )

    state, counts = _counting_state()
    state.add_watcher(CDS, "a", RecordingWatcher())
    state.add_watcher(CDS, "b", RecordingWatcher())
    connected_stream(state)
    msg = response(CDS, "1", "n1", ("a", "x"), ("b", INVALID), ("other", "y"), ("bad", INVALID))
    msg.resources.add(type_url=LDS, value=_encode(LDS, "l", "z"))
    state.on_response(msg)
    (nack,) = state.take_requests()
    assert "bad" in nack.error_detail.message  # still NACKed
    assert counts == [(CDS, 1, 2)]  # a valid; b and the Listener invalid


# ---------------------------------------------------------------------------
# A78 XdsClient grpc.xds_client.connected / server_failure (A57 failures)
# ---------------------------------------------------------------------------


@pytest.fixture
def xds_env():
    from test_xds_client_ads_state import TYPES
    from test_xds_client_client import FakeTransport, make_bootstrap

    from pyxds.testing.fake_clock import FakeClock
    from pyxds.xds.client import XdsClient

    transports: list = []

    def factory(channel):
        transports.append(FakeTransport(channel))
        return transports[-1]

    client = XdsClient(
        make_bootstrap(), clock=FakeClock(), resource_types=TYPES, transport_factory=factory
    )
    yield SimpleNamespace(client=client, transports=transports)
    client.close()


def _server_points(reader, name: str) -> list:
    from test_xds_client_ads_state import FakeServer

    uri = FakeServer().server_uri
    return [p for p in points(reader, name) if p.attributes.get(_SERVER) == uri]


def _connected(reader) -> list[int]:
    return [p.value for p in _server_points(reader, "grpc.xds_client.connected")]


def _failures(reader) -> int:
    return sum(p.value for p in _server_points(reader, "grpc.xds_client.server_failure"))


def test_xds_client_connected_is_1_once_the_stream_is_created(xds_env, enable):
    """A78 grpc.xds_client.connected: "set to 1 when the stream is initially
    created" (C-core XdsClientTest.BasicWatch: true before any response)."""
    from test_xds_client_ads_state import CDS, RecordingWatcher

    reader = enable(enable_metrics=A78_METRICS)
    xds_env.client.watch(CDS, "a", RecordingWatcher())
    assert _connected(reader) == [1]
    assert _failures(reader) == 0


def test_xds_client_server_failure_counts_healthy_to_unhealthy_only(xds_env, enable):
    """A78: connected "will be set to 0 ... when the ADS stream fails
    without seeing a response message ... reset to 1 when we receive the
    first response"; server_failure counts "xDS servers going from healthy
    to unhealthy": a second failure in a row is not counted again, a
    stream that closes after a response is no failure (A57)."""
    from test_xds_client_ads_state import CDS, RecordingWatcher, response

    reader = enable(enable_metrics=A78_METRICS)
    client = xds_env.client
    client.watch(CDS, "a", RecordingWatcher())
    unavailable = Status(UNAVAILABLE, "connection refused")
    transport = xds_env.transports[0]
    transport.close_stream(unavailable)
    assert (_connected(reader), _failures(reader)) == ([0], 1)
    _next_stream(xds_env)
    transport.close_stream(unavailable)
    assert (_connected(reader), _failures(reader)) == ([0], 1)
    _next_stream(xds_env)
    transport.respond(response(CDS, "1", "n1", ("a", "x")))
    assert (_connected(reader), _failures(reader)) == ([1], 1)
    transport.close_stream(unavailable)  # after a response: no failure
    assert (_connected(reader), _failures(reader)) == ([1], 1)
    _next_stream(xds_env)
    transport.close_stream(unavailable)
    assert (_connected(reader), _failures(reader)) == ([0], 2)


def _next_stream(env) -> None:
    """Let the backoff run out: the client starts its next stream."""
    transport = env.transports[0]
    before = len(transport.streams)
    for _ in range(120):  # A57 backoff: at most 120 s
        if len(transport.streams) > before:
            return
        env.client._clock.advance(1.0)
    raise AssertionError("no new ADS stream")


def test_enable_without_a_meter_provider_records_nothing(caplog):
    """A66 "Language-Specific Details": "A MeterProvider not being set
    should result in a no-op. ... gRPC implementations should *NOT*
    fallback on this global" (grpcio's OpenTelemetryPlugin without a
    meter_provider records nothing): metrics stay off, with a warning."""
    from opentelemetry import metrics as otel_metrics

    reader = InMemoryMetricReader()
    global_provider = sdk.MeterProvider(metric_readers=[reader])
    previous = otel_metrics._internal._METER_PROVIDER  # restored below
    otel_metrics._internal._METER_PROVIDER = global_provider
    try:
        metrics.enable()
        assert metrics.RECORDER is None
        _one_attempt()
        assert points(reader, STARTED) == []
        assert "without a MeterProvider records nothing" in caplog.text
        metrics.enable(otel_metrics.get_meter_provider())  # the global one, when asked for
        assert metrics.RECORDER is not None
    finally:
        metrics.disable()
        otel_metrics._internal._METER_PROVIDER = previous


@pytest.mark.parametrize(
    ("target", "canonical"),
    [
        ("127.0.0.1:1234", "dns:///127.0.0.1:1234"),
        ("localhost:50051", "dns:///localhost:50051"),
        ("[::1]:443", "dns:///[::1]:443"),
        ("pubsub.googleapis.com", "dns:///pubsub.googleapis.com"),
        ("dns:///pubsub.googleapis.com:443", "dns:///pubsub.googleapis.com:443"),
        ("xds:///helloworld-gke:8000", "xds:///helloworld-gke:8000"),
        ("xds:svc", "xds:svc"),
        ("ipv4:10.0.0.1:80", "ipv4:10.0.0.1:80"),
        ("unix:/tmp/sock", "unix:/tmp/sock"),
    ],
)
def test_grpc_target_is_the_canonical_target_uri(target, canonical):
    """A66 "Attributes": grpc.target is the "Canonicalized target URI used
    when creating gRPC Channel, e.g. "dns:///pubsub.googleapis.com:443",
    "xds:///helloworld-gke:8000" ... the form with the scheme included if
    the user didn't mention the scheme"; A78's grpc.target is the same."""
    from pyxds.channel.core import canonical_target

    assert canonical_target(target) == canonical


def test_a78_metrics_are_off_by_default_and_on_by_name(enable):
    """A78 "Metric Stability": "All metrics added in this proposal will
    start as experimental and therefore off by default" (C-core registers
    them with enable_by_default=false; grpc-go's DefaultMetrics() leaves
    them out); A66's per-call metrics are on. A79-style enable/disable by
    name (C++ EnableMetrics/DisableMetrics)."""
    assert {STARTED, ATTEMPT, SENT, RCVD, CALL} == metrics.DEFAULT_METRICS
    reader = enable()
    metrics.add("grpc.lb.pick_first.connection_attempts_failed", 1, {_T: "t"})
    metrics.record("grpc.lb.wrr.endpoint_weights", 1.0, {_T: "t"})
    _one_attempt()
    assert points(reader, "grpc.lb.pick_first.connection_attempts_failed") == []
    assert points(reader, "grpc.lb.wrr.endpoint_weights") == []
    assert total(reader, STARTED) == 1
    reader = enable(enable_metrics=["grpc.lb.pick_first.connection_attempts_failed"])
    metrics.add("grpc.lb.pick_first.connection_attempts_failed", 1, {_T: "t"})
    metrics.record("grpc.lb.wrr.endpoint_weights", 1.0, {_T: "t"})
    assert total(reader, "grpc.lb.pick_first.connection_attempts_failed") == 1
    assert points(reader, "grpc.lb.wrr.endpoint_weights") == []
    reader = enable(disable_metrics=[CALL])
    _one_attempt()
    assert points(reader, CALL) == [] and total(reader, STARTED) == 1


def test_unknown_metric_name_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"enable_metrics: unknown metric 'grpc\.lb\.nope'"):
        metrics.enable(sdk.MeterProvider(), enable_metrics=["grpc.lb.nope"])
    with pytest.raises(ValueError, match=r"disable_metrics: unknown metric 'x'"):
        metrics.enable(sdk.MeterProvider(), disable_metrics="x")
    assert metrics.RECORDER is None


# ---------------------------------------------------------------------------
# A89 grpc.lb.backend_service
# ---------------------------------------------------------------------------


def test_cluster_impl_picks_carry_the_cluster_as_backend_service(enable):
    """A89: "The LB policy xds_cluster_impl will notify the call attempt
    tracer of the grpc.lb.backend_service label. The value will be copied
    from xds_cluster_impl's service config cluster key"; an optional label
    of the three per-attempt metrics, emitted when enabled."""
    from pyxds.lb.call_counters import cluster_counters
    from pyxds.lb.xds_cluster_impl import CountedSubchannel, XdsClusterImplPicker
    from pyxds.xds.resources.types import LocalityName

    class _Real:
        address = "10.0.0.1:1"

    class _Child(Picker):
        def pick(self, args):
            return PickComplete(counted)

    counted = CountedSubchannel(_Real(), LocalityName("r", "z", ""), None, None, None, "c-89")
    counters = cluster_counters("c-89", None)
    result = XdsClusterImplPicker(_Child(), (), counters, 1024, None).pick(None)
    assert result.attempt_labels[BS] == "c-89"
    reader = enable(optional_labels=[BS])
    call = CallMetrics("/pkg.Svc/M", "xds:///svc")
    call.attempt_started()
    call.attempt_ended(Status(grpc.StatusCode.OK, ""), result.attempt_labels, True)
    for name in PER_ATTEMPT:
        (point,) = points(reader, name)
        assert point.attributes[BS] == "c-89" and LOC not in point.attributes, name
    result.on_call_done(Status(grpc.StatusCode.OK, ""))


def test_wrr_metrics_carry_the_endpoints_cluster_as_backend_service(enable):
    """A89 "Add grpc.lb.backend_service to WRR metrics": the WRR policy
    reads the cluster its endpoints belong to (cds's xds_cluster
    attribute)."""
    from pyxds.lb import registry
    from pyxds.lb.api import ConnectivityState as CS
    from pyxds.lb.api import ResolverUpdate
    from pyxds.testing import FakeHelper

    reader = enable(optional_labels=[BS], enable_metrics=A78_METRICS)
    helper = FakeHelper()
    helper.channel_target = "xds:///wrr"
    from pyxds.lb.weighted_round_robin import WeightedRoundRobin

    policy = WeightedRoundRobin(helper)
    _, config = registry.select([{"weighted_round_robin": {}}])
    endpoints = [Endpoint((f"10.0.0.{i}:80",), {"xds_cluster": "c-wrr"}) for i in range(2)]
    policy.update(ResolverUpdate(endpoints, config))
    for sub in helper.subchannels:
        sub.set_state(CS.CONNECTING)
        sub.set_state(CS.READY)
    found = points(reader, "grpc.lb.wrr.rr_fallback")
    assert found and {p.attributes[BS] for p in found} == {"c-wrr"}
    policy.shutdown()


# ---------------------------------------------------------------------------
# A88 grpc.xds.cache_state values of grpc.xds_client.resources
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fail_on_data_errors", [False, True])
def test_cache_state_says_when_an_errored_entry_keeps_its_resource(
    monkeypatch, fail_on_data_errors
):
    """A88 "Cache Entry States, CSDS, and XdsClient Metrics": new
    grpc.xds.cache_state values ``does_not_exist_but_cached`` (an LDS/CDS
    deletion ignored), ``received_error`` / ``received_error_but_cached``
    (an xRFC TP3 error, with or without a cached resource), beside A78's
    ``nacked`` / ``nacked_but_cached``; with fail_on_data_errors the
    resource is dropped, so the plain states."""
    from test_xds_client_ads_state import CDS, INVALID, LDS, TYPES, RecordingWatcher, response
    from test_xds_client_client import FakeTransport, make_bootstrap

    from pyxds.testing.fake_clock import FakeClock
    from pyxds.xds import client_metrics
    from pyxds.xds.ads_state import DATA_ERROR_HANDLING_ENV
    from pyxds.xds.client import XdsClient

    monkeypatch.setenv(DATA_ERROR_HANDLING_ENV, "true")
    transports: list = []

    def factory(channel):
        transports.append(FakeTransport(channel))
        return transports[-1]

    features = {"fail_on_data_errors": True} if fail_on_data_errors else {}
    client = XdsClient(
        make_bootstrap(**features),
        clock=FakeClock(),
        resource_types=TYPES,
        transport_factory=factory,
    )
    try:
        for type_url, name in ((LDS, "deleted"), (CDS, "bad"), (CDS, "err"), (CDS, "err-new")):
            client.watch(type_url, name, RecordingWatcher())
        transport = transports[0]
        transport.respond(response(LDS, "1", "n1", ("deleted", "x")))
        transport.respond(response(CDS, "1", "n2", ("bad", "x"), ("err", "x")))
        transport.respond(response(LDS, "2", "n3"))  # "deleted" is gone
        msg = response(CDS, "2", "n4", ("bad", INVALID))
        for name in ("err", "err-new"):
            error = msg.resource_errors.add()
            error.resource_name.name = name
            error.error_detail.code = grpc.StatusCode.NOT_FOUND.value[0]
        transport.respond(msg)
        states = {
            e["name"]: client_metrics._cache_state(e) for e in client.dump()["generic_xds_configs"]
        }
    finally:
        client.close()
    cached = "" if fail_on_data_errors else "_but_cached"
    assert states == {
        "deleted": "does_not_exist" + cached,
        "bad": "nacked" + cached,
        "err": "received_error" + cached,
        "err-new": "received_error",
    }
