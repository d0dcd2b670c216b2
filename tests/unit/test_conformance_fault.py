"""Fault injection (gRFC A33) conformance cases from the other
implementations' suites and A33's own rules, sans I/O: C-core
``test/cpp/end2end/xds/xds_fault_injection_end2end_test.cc``, grpc-go
``internal/xds/httpfilter/fault/fault_test.go`` (``TestFaultInjection_Unary``,
``TestFaultInjection_MaxActiveFaults``) and grpc-java ``FaultFilterTest`` /
``XdsNameResolverTest`` (``resolved_fault*``).

Cases these sources test that older files already cover are not repeated
here: percentages over every denominator and independent draws
(test_fault_filter.py), abort before the pick and a delay that runs into
the deadline (test_channel_retry.py), A39 override precedence
(test_fault_filter.py, tests/e2e/test_differential_fault.py), config
validation (test_conformance_lds_resource.py, test_conformance_rds_resource.py).
"""

from __future__ import annotations

import contextlib
import random
import time

import grpc
import pytest
from test_channel_picks import Selector, ready_subchannel
from test_channel_support import Harness, new_rpc

from pyxds.lb.api import Endpoint, PickComplete, Picker
from pyxds.resolver.api import CallConfig
from pyxds.resolver.fault_filter import (
    ACTIVE_FAULTS,
    FaultConfig,
    FaultFilter,
    FaultInjector,
    _ActiveFaults,
)
from pyxds.resolver.http_filters import build_chain, run_chain
from pyxds.server import builders as b
from pyxds.xds.resources.types import HttpFilter

FAULT = "envoy.extensions.filters.http.fault.v3.HTTPFault"
ROUTER = "envoy.extensions.filters.http.router.v3.Router"

ABORT_HTTP = "x-envoy-fault-abort-request"
ABORT_GRPC = "x-envoy-fault-abort-grpc-request"
ABORT_PERCENT = "x-envoy-fault-abort-request-percentage"
DELAY = "x-envoy-fault-delay-request"
DELAY_PERCENT = "x-envoy-fault-delay-request-percentage"


def injector(**kwargs) -> FaultInjector:
    return FaultInjector(
        FaultConfig.parse(b.fault_config(**kwargs).SerializeToString()), _ActiveFaults()
    )


def verdicts(inj: FaultInjector, n: int, metadata=(), seed: int = 7) -> list:
    """n RPCs' verdicts (each carried out at once: its ``done`` called)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        verdict = inj.on_call(metadata, rng)
        if verdict is not None and verdict.done is not None:
            verdict.done()
        out.append(verdict)
    return out


def abort_codes(inj: FaultInjector, n: int, metadata=()) -> list:
    return [
        None if v is None or v.abort is None else v.abort.code for v in verdicts(inj, n, metadata)
    ]


def delays(inj: FaultInjector, n: int, metadata=()) -> list[float]:
    return [0.0 if v is None else v.delay for v in verdicts(inj, n, metadata)]


@contextlib.contextmanager
def channel_with_fault(retry_policy=None, **fault):
    """A channel core over fakes whose route has one fault filter (``fault``:
    fault_config's arguments): yields (harness, the picks made)."""
    h = Harness()
    h.start()
    try:
        h.resolve([Endpoint(("10.0.0.1:80",))], Selector())
        picks: list = []

        class Counting(Picker):
            def pick(self, args):
                picks.append(args)
                return PickComplete(ready_subchannel(h))

        h.publish(Counting())
        cfg = FaultConfig.parse(b.fault_config(**fault).SerializeToString())
        filters = (FaultInjector(cfg, _ActiveFaults()),)
        h.core.selector = Selector(CallConfig(filters=filters, retry_policy=retry_policy))
        yield h, picks
    finally:
        h.core.close()


# ------------------------------------------------------------ A33 status codes


def test_http_status_200_aborts_with_unknown():
    """A33 "200/OK Error Injection": ``http_status`` 200 aborts with UNKNOWN
    (what a client makes of HTTP 200 without grpc-status); grpc-go
    fault.go ``grpcFromHTTP``, grpc-java ``GrpcUtil.httpStatusToGrpcStatus``.
    C-core 1.85 injects nothing (tests/e2e/test_differential_fault.py)."""
    inj = injector(abort_http_status=200, abort_percent=100)
    assert abort_codes(inj, 3) == [grpc.StatusCode.UNKNOWN] * 3


@pytest.mark.parametrize(
    ("http", "code"),
    [
        ("404", grpc.StatusCode.UNIMPLEMENTED),
        ("429", grpc.StatusCode.UNAVAILABLE),
        ("200", grpc.StatusCode.UNKNOWN),
        ("418", grpc.StatusCode.UNKNOWN),
    ],
)
def test_http_status_header_aborts_with_its_mapped_code(http, code):
    """A33 "Header matching" lists ``x-envoy-fault-abort-request`` (HTTP
    status); grpc-go TestFaultInjection_Unary "header abort" subcases "HTTP
    Status 404/429/200"; grpc-java resolved_faultAbortInLdsUpdate.  C-core
    1.85 does not read it."""
    inj = injector(header_abort=True, abort_percent=100)
    assert abort_codes(inj, 2, [(ABORT_HTTP, http)]) == [code, code]


def test_http_status_header_wins_over_the_grpc_status_header():
    """grpc-java resolved_faultAbortInLdsUpdate "both http and grpc code keys
    provided, rpc should fail with http code"; grpc-go fault.go ("HTTP status
    has priority over gRPC status")."""
    inj = injector(header_abort=True, abort_percent=100)
    md = [(ABORT_GRPC, str(grpc.StatusCode.UNAUTHENTICATED.value[0])), (ABORT_HTTP, "404")]
    assert abort_codes(inj, 2, md) == [grpc.StatusCode.UNIMPLEMENTED] * 2


@pytest.mark.parametrize("bad", ["abc", "99", "600", "-404", ""])
def test_an_invalid_http_status_header_is_ignored(bad):
    """A33: "if any header is invalid ... the invalid headers will be
    ignored": an HTTP status that is no number or outside [200, 600) (grpc-go
    ``grpcFromHTTP``: "Malformed; ignore") leaves the gRPC status header in
    charge, and without one there is no abort."""
    inj = injector(header_abort=True, abort_percent=100)
    assert abort_codes(inj, 2, [(ABORT_HTTP, bad)]) == [None, None]
    md = [(ABORT_HTTP, bad), (ABORT_GRPC, "10")]
    assert abort_codes(inj, 2, md) == [grpc.StatusCode.ABORTED] * 2


def test_a_grpc_status_header_that_is_no_number_is_ignored():
    """grpc-go TestFaultInjection_Unary "invalid header results in no
    abort"; A33 "Header matching" ("the invalid headers will be ignored");
    grpc-java (NumberFormatException: no abort).  grpcio 1.85's C-core
    aborts with UNKNOWN instead (tests/e2e/test_differential_fault.py)."""
    inj = injector(header_abort=True, abort_percent=100)
    for bad in ("error", "1.5", "", "0x5"):
        assert abort_codes(inj, 2, [(ABORT_GRPC, bad)]) == [None, None], bad


@pytest.mark.parametrize("number", ["17", "-1", "99999999999"])
def test_a_grpc_status_header_number_that_is_no_code_aborts_with_unknown(number):
    """A number outside gRPC's codes: C-core (``grpc_status_code_from_int``
    falls back to UNKNOWN, checked live with grpcio 1.85), grpc-go
    (``sanitizeGRPCCode``) and grpc-java (``Status.fromCodeValue``) all abort
    with UNKNOWN; A33 is silent on it."""
    inj = injector(header_abort=True, abort_percent=100)
    assert abort_codes(inj, 2, [(ABORT_GRPC, number)]) == [grpc.StatusCode.UNKNOWN] * 2


def test_grpc_status_ok_abort_and_a_header_of_zero_end_the_rpc_with_ok():
    """A33 "200/OK Error Injection": ``grpc_status`` OK reacts "as if it has
    immediately received trailing metadata from the server with the status
    OK" (grpc-go ``errOKStream``/``okStream``, grpc-go "gRPC Status OK"
    subcase; grpc-java ``FailingClientCall`` with Status.OK); a header of 0
    under header_abort likewise.  C-core 1.85 injects nothing."""
    fixed = injector(abort_grpc_status=0, abort_percent=100)
    assert abort_codes(fixed, 2) == [grpc.StatusCode.OK] * 2
    headers = injector(header_abort=True, abort_percent=100)
    assert abort_codes(headers, 2, [(ABORT_GRPC, "0")]) == [grpc.StatusCode.OK] * 2
    half = injector(abort_grpc_status=0, abort_percent=50)
    codes = abort_codes(half, 4000)
    assert abs(codes.count(grpc.StatusCode.OK) / 4000 - 0.5) < 0.03


def test_an_ok_abort_ends_each_kind_of_sync_call_with_ok_and_no_response():
    """A33 "200/OK Error Injection" on the channel: no pick, no attempt; a
    unary call answers None with OK (what grpcio answers for a server's OK
    without a message), a stream ends with no responses and code OK."""
    from test_channel_support import FnMethod, run_blocking, streaming

    from pyxds.channel.calls import FutureCall

    def never(*args):
        raise AssertionError("an attempt was started")

    with channel_with_fault(abort_grpc_status=0, abort_percent=100) as (h, picks):
        response, call = run_blocking(new_rpc(h.core, "/svc/M", None, 5.0, False), never)
        assert response is None
        assert (call.code(), call.details(), tuple(call.trailing_metadata())) == (
            grpc.StatusCode.OK,
            "",
            (),
        )
        stream = streaming(new_rpc(h.core, "/svc/M", None, 5.0, False), never)
        assert list(stream) == []
        assert stream.code() is grpc.StatusCode.OK and stream.done()
        rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
        future = FutureCall(rpc, FnMethod(never), None, None, None)
        assert future.result(timeout=1) is None and future.exception(timeout=1) is None
        assert future.code() is grpc.StatusCode.OK and not future.cancelled()
        assert picks == []


def test_abort_without_an_error_type_injects_nothing_and_is_accepted():
    """An abort with a percentage but neither grpc_status, http_status nor
    header_abort: C-core's parser (xds_http_fault_filter.cc) leaves the
    abort code OK, which injects nothing, and accepts the config (grpc-go
    likewise injects nothing; grpc-java NACKs it, A33 is silent, C-core
    decides)."""
    fault = b.fault_config(abort_grpc_status=5, abort_percent=100)
    fault.abort.ClearField("grpc_status")
    cfg = FaultConfig.parse(fault.SerializeToString())
    assert cfg.abort_code is None and not cfg.abort_from_headers
    assert FaultFilter().call_filter(fault.SerializeToString()) is None


# ------------------------------------------------------------ header control


def test_abort_percentage_header_is_a33s_name_and_sets_the_numerator():
    """A33 "Header matching": ``x-envoy-fault-abort-request-percentage`` sets
    the numerator over the config's denominator, capped at the config's
    numerator; grpc-go "header abort" subcases ("30% abort", "cannot exceed
    percentage in filter"), grpc-java resolved_faultAbortInLdsUpdate.
    C-core 1.85 reads ``x-envoy-fault-abort-percentage`` instead (C-core's
    XdsFaultInjectionPercentageAbortViaHeaders), which pyxds ignores."""
    inj = injector(header_abort=True, abort_percent=(80, 100))
    code = [(ABORT_GRPC, "15")]
    n = 4000

    def rate(md) -> float:
        return sum(c is not None for c in abort_codes(inj, n, md)) / n

    assert abs(rate([*code, (ABORT_PERCENT, "30")]) - 0.30) < 0.03
    assert abs(rate([*code, (ABORT_PERCENT, "100")]) - 0.80) < 0.03  # capped
    assert abs(rate([*code, (ABORT_PERCENT, "error")]) - 0.80) < 0.03  # ignored
    assert abs(rate([*code, ("x-envoy-fault-abort-percentage", "0")]) - 0.80) < 0.03


def test_percentage_header_counts_over_the_configs_denominator():
    """A33 "Header matching" example: with 500000/1000000 in the config the
    header can only set [0, 500000] (a header of 250000 is 25 %, one above
    500000 is limited to 500000)."""
    inj = injector(header_abort=True, abort_percent=(500_000, 1_000_000))
    code = [(ABORT_GRPC, "4")]
    n = 4000
    quarter = abort_codes(inj, n, [*code, (ABORT_PERCENT, "250000")])
    assert abs(sum(c is not None for c in quarter) / n - 0.25) < 0.03
    capped = abort_codes(inj, n, [*code, (ABORT_PERCENT, "900000")])
    assert abs(sum(c is not None for c in capped) / n - 0.5) < 0.03


def test_header_abort_without_a_config_percentage_never_aborts():
    """grpc-java resolved_faultAbortInLdsUpdate "header abort, no header
    rate, fix rate = 0": the header cannot raise the config's numerator."""
    inj = injector(header_abort=True)
    assert abort_codes(inj, 20, [(ABORT_GRPC, "5"), (ABORT_PERCENT, "100")]) == [None] * 20


def test_delay_percentage_header_sets_the_numerator_capped_at_the_config():
    """C-core XdsFaultInjectionPercentageDelayViaHeaders (50 % by header under
    a cap of 100); grpc-go "header delay" subcases ("30% delay", "cannot
    exceed percentage in filter", "invalid header results in default
    percentage")."""
    inj = injector(header_delay=True, delay_percent=(80, 100))
    n = 4000

    def rate(md) -> float:
        return sum(d > 0 for d in delays(inj, n, md)) / n

    assert abs(rate([(DELAY, "2"), (DELAY_PERCENT, "50")]) - 0.5) < 0.03
    assert abs(rate([(DELAY, "2"), (DELAY_PERCENT, "100")]) - 0.8) < 0.03
    assert abs(rate([(DELAY, "2"), (DELAY_PERCENT, "error")]) - 0.8) < 0.03
    assert set(delays(inj, 50, [(DELAY, "2")])) == {0.0, 0.002}


@pytest.mark.parametrize("bad", ["error", "-5", "1e3", "0"])
def test_an_invalid_or_zero_delay_header_means_no_delay(bad):
    """grpc-go "header delay" subcase "invalid header results in no delay";
    C-core reads a negative delay as none, and a delay of 0 is no fault
    (fault_injection_filter.cc: ``delay != Duration::Zero()``), taking no
    active-fault slot."""
    inj = injector(header_delay=True, delay_percent=(100, 100))
    assert verdicts(inj, 3, [(DELAY, bad), (DELAY_PERCENT, "100")]) == [None] * 3


def test_headers_count_only_when_the_config_asks_for_them():
    """A33: "the header only being evaluated if the delay or abort is set to
    HeaderDelay or HeaderAbort instead of concrete values": a fixed abort
    and a fixed delay ignore the fault headers."""
    md = [(ABORT_GRPC, "5"), (ABORT_HTTP, "404"), (ABORT_PERCENT, "0")]
    fixed_abort = injector(abort_grpc_status=14, abort_percent=100)
    assert abort_codes(fixed_abort, 3, md) == [grpc.StatusCode.UNAVAILABLE] * 3
    fixed_delay = injector(delay=0.25, delay_percent=100)
    assert delays(fixed_delay, 3, [(DELAY, "900"), (DELAY_PERCENT, "0")]) == [0.25] * 3
    assert verdicts(injector(abort_percent=100, delay_percent=100), 3, md) == [None] * 3


# ------------------------------------------------------------ percentages


def test_delay_percentage_applies_to_about_that_share():
    """C-core XdsFaultInjectionPercentageDelay (50 %); grpc-go "delay 10%"
    over TEN_THOUSAND."""
    for percent, want in (((50, 100), 0.5), ((1_000, 10_000), 0.1)):
        got = delays(injector(delay=1, delay_percent=percent), 5000)
        assert abs(sum(d > 0 for d in got) / 5000 - want) < 0.03, percent


@pytest.mark.parametrize(
    ("abort_percent", "delay_percent"),
    [((50, 100), (1_000_000, 1_000_000)), ((500_000, 1_000_000), (100, 100))],
    ids=["AlwaysDelayPercentageAbort", "SwitchDenominator"],
)
def test_each_fault_uses_its_own_denominator(abort_percent, delay_percent):
    """C-core XdsFaultInjectionAlwaysDelayPercentageAbort and
    ...SwitchDenominator: every RPC is delayed, about half are aborted
    (each fault's numerator over its own denominator)."""
    inj = injector(
        abort_grpc_status=10,
        abort_percent=abort_percent,
        delay=1,
        delay_percent=delay_percent,
    )
    got = verdicts(inj, 4000)
    assert all(v is not None and v.delay == 1 for v in got)
    aborted = sum(v.abort is not None for v in got) / len(got)
    assert abs(aborted - 0.5) < 0.03


def test_zero_fixed_delay_is_no_fault():
    """C-core fault_injection_filter.cc: a delay of zero is no delay request
    (so it takes no active-fault slot); a filter that can do nothing else is
    left out of the route's chain."""
    assert (
        FaultFilter().call_filter(b.fault_config(delay=0, delay_percent=100).SerializeToString())
        is None
    )
    inj = injector(delay=0, delay_percent=100, abort_grpc_status=3, abort_percent=(1, 10_000))
    assert all(v is None or v.delay == 0 for v in verdicts(inj, 200))


# ------------------------------------------------------------ max_active_faults


def test_max_active_faults_zero_injects_nothing():
    """grpc-go TestFaultInjection_Unary "max faults zero"; C-core's quota
    check (``active < max_faults``)."""
    inj = injector(abort_grpc_status=10, abort_percent=100, max_active_faults=0)
    assert verdicts(inj, 25) == [None] * 25


def test_an_rpc_over_the_limit_gets_no_fault_at_all():
    """A33 "Maximum active faults" limits the RPCs under a fault: one drawn
    for a delay and an abort while the limit is reached gets neither (grpc-go
    NewStream, grpc-java interceptCall; C-core 1.85 still aborts it,
    without the delay)."""
    inj = injector(
        abort_grpc_status=10, abort_percent=100, delay=5, delay_percent=100, max_active_faults=1
    )
    rng = random.Random(1)
    first = inj.on_call((), rng)
    assert first is not None and first.delay == 5 and first.abort is not None
    assert inj.on_call((), rng) is None
    first.done()
    assert inj.on_call((), rng) is not None


def test_the_active_fault_count_is_shared_by_every_route_and_channel():
    """A33 "Maximum active faults": one count "for the entire process",
    "updated via multiple channels": two routes' filters (as two channels
    build them) share it."""
    config = b.fault_config(delay=5, delay_percent=100, max_active_faults=2).SerializeToString()
    one, two = FaultFilter().call_filter(config), FaultFilter().call_filter(config)
    rng = random.Random(1)
    before = ACTIVE_FAULTS.count
    held = [one.on_call((), rng), two.on_call((), rng)]
    try:
        assert all(v is not None for v in held)
        if before == 0:
            assert one.on_call((), rng) is None and two.on_call((), rng) is None
    finally:
        for verdict in held:
            if verdict is not None:
                verdict.done()
    assert ACTIVE_FAULTS.count == before


class _Ready(Picker):
    def __init__(self, sub):
        self.sub = sub

    def pick(self, args):
        return PickComplete(self.sub)


def test_max_active_faults_over_rpcs_and_the_count_comes_back_after_their_deadline():
    """C-core XdsFaultInjectionMaxFault: 30 RPCs with a 20 s delay and a
    limit of 10: 10 are held (and end at their deadline), 20 go on; a second
    round again holds exactly 10, so the deadline gave the slots back.
    grpc-java resolved_faultDelayWithMaxActiveStreamsInLdsUpdate."""
    h = Harness()
    h.start()
    try:
        h.resolve([Endpoint(("10.0.0.1:80",))], Selector())
        h.publish(_Ready(ready_subchannel(h)))
        active = _ActiveFaults()
        cfg = FaultConfig.parse(
            b.fault_config(delay=20, delay_percent=100, max_active_faults=10).SerializeToString()
        )
        h.core.selector = Selector(CallConfig(filters=(FaultInjector(cfg, active),)))
        for _ in range(2):
            rpcs = [new_rpc(h.core, "/svc/M", None, 4.0, False) for _ in range(30)]
            steps = [rpc.pick() for rpc in rpcs]
            held = [rpc for rpc, step in zip(rpcs, steps, strict=True) if isinstance(step, float)]
            assert len(held) == 10 and active.count == 10
            for step in steps:
                if not isinstance(step, float):
                    assert step is not None  # picked: went on
            # the adapters pick again when the hold ends at the deadline
            # (the first five); an RPC cancelled meanwhile ends there too
            for rpc in held[:5]:
                rpc.deadline = time.monotonic() - 0.001
                step = rpc.pick()
                assert step.code is grpc.StatusCode.DEADLINE_EXCEEDED
            for rpc in held[5:]:
                rpc.cancel()
                assert rpc.pick().code is grpc.StatusCode.CANCELLED
            assert active.count == 0
    finally:
        h.core.close()


def test_an_injected_abort_is_not_retried_by_the_routes_retry_policy():
    """The fault filter runs above the retry logic (C-core's dynamic filters
    above its retry filter; grpc-go and grpc-java wrap the retrying call): an
    injected UNAVAILABLE ends the RPC although its A44 policy retries
    UNAVAILABLE, and nothing is picked (test_differential_fault.py measures
    grpcio 1.85 doing the same)."""
    from pyxds.resolver.retry_policy import RetryPolicy

    policy = RetryPolicy.from_xds(("unavailable",), 4, 0.001, 0.002)
    with channel_with_fault(policy, abort_grpc_status=14, abort_percent=100) as (h, picks):
        rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
        step = rpc.pick()
        assert (step.code, step.details) == (grpc.StatusCode.UNAVAILABLE, "Fault injected")
        assert rpc.done and picks == []


# ------------------------------------------------------------ filter chains


def fault_bytes(**kwargs) -> bytes:
    return b.fault_config(**kwargs).SerializeToString()


def test_an_override_without_a_fault_filter_in_the_listener_injects_nothing():
    """C-core XdsFaultInjectionWithoutListenerFilter: a route's
    typed_per_filter_config for a fault filter the listener does not have
    does nothing (A39: overrides configure the listener's filters)."""
    listener = [HttpFilter("router", ROUTER)]
    route = (("envoy.fault", FAULT, fault_bytes(abort_grpc_status=10, abort_percent=100)),)
    assert build_chain(listener, (), route) == ()


def test_empty_listener_config_with_a_route_override_aborts():
    """C-core FaultInjectionTest with kHttpFilterConfigInRoute: the listener
    has an empty HTTPFault (nothing to do), the route's override aborts."""
    listener = [HttpFilter("envoy.fault", FAULT, fault_bytes()), HttpFilter("router", ROUTER)]
    route = (("envoy.fault", FAULT, fault_bytes(abort_grpc_status=10, abort_percent=100)),)
    assert build_chain(listener) == ()
    verdict = run_chain(build_chain(listener, (), route), (), random.Random(1))
    assert verdict is not None and verdict.abort.code is grpc.StatusCode.ABORTED


def test_an_abort_filter_before_a_delay_filter_skips_the_delay():
    """grpc-go TestFaultInjection_Unary "abort then delay filters": the first
    filter's abort ends the RPC; the second filter (a delay) neither delays
    it nor draws for it; without the abort the delay applies."""
    listener = [
        HttpFilter("fault0", FAULT, fault_bytes(abort_grpc_status=12, abort_percent=50)),
        HttpFilter("fault1", FAULT, fault_bytes(delay=1, delay_percent=80)),
        HttpFilter("router", ROUTER),
    ]
    chain = build_chain(listener)
    rng = random.Random(3)
    seen = {"abort": 0, "delay": 0, "none": 0}
    for _ in range(4000):
        verdict = run_chain(chain, (), rng)
        if verdict is None:
            seen["none"] += 1
            continue
        if verdict.abort is not None:
            assert verdict.delay == 0  # abort skips the delay
            seen["abort"] += 1
        else:
            assert verdict.delay == 1
            seen["delay"] += 1
        if verdict.done is not None:
            verdict.done()
    # 50 % aborted; of the rest 80 % delayed (40 %), 10 % untouched
    assert abs(seen["abort"] / 4000 - 0.5) < 0.03
    assert abs(seen["delay"] / 4000 - 0.4) < 0.03
    assert abs(seen["none"] / 4000 - 0.1) < 0.03
