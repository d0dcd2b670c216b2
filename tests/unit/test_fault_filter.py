"""A33 fault injection and the A39 filter chain, sans I/O: config parsing,
percentages over seeded draws for every denominator, header control,
max_active_faults, override precedence, and the channel's pick path
carrying out a verdict (delay, then abort, before the pick)."""

from __future__ import annotations

import random

import grpc
import pytest

from pyxds.resolver.fault_filter import (
    FaultConfig,
    FaultFilter,
    FaultInjector,
    _ActiveFaults,
    http_to_grpc,
)
from pyxds.resolver.http_filters import build_chain, registered, run_chain
from pyxds.server import builders as b
from pyxds.xds.resources.types import HttpFilter

FAULT = "envoy.extensions.filters.http.fault.v3.HTTPFault"


def config(**kwargs) -> FaultConfig:
    return FaultConfig.parse(b.fault_config(**kwargs).SerializeToString())


def injector(**kwargs) -> FaultInjector:
    return FaultInjector(config(**kwargs), _ActiveFaults())


def abort_rate(inj: FaultInjector, n: int, metadata=(), seed: int = 5) -> float:
    rng = random.Random(seed)
    aborted = 0
    for _ in range(n):
        verdict = inj.on_call(metadata, rng)
        if verdict is not None:
            if verdict.abort is not None:
                aborted += 1
            verdict.done()
    return aborted / n


def test_parse_abort_delay_and_limit():
    cfg = config(
        abort_grpc_status=14, abort_percent=(25, 100), delay=0.2, delay_percent=(3, 10_000)
    )
    assert cfg.abort_code is grpc.StatusCode.UNAVAILABLE
    assert (cfg.abort_numerator, cfg.abort_denominator) == (25, 100)
    assert cfg.delay == 0.2
    assert (cfg.delay_numerator, cfg.delay_denominator) == (3, 10_000)
    assert config(max_active_faults=3).max_active_faults == 3
    assert config(abort_grpc_status=14) == config(abort_grpc_status=14)  # structural


@pytest.mark.parametrize(
    ("http", "code"),
    [
        (400, grpc.StatusCode.INTERNAL),
        (401, grpc.StatusCode.UNAUTHENTICATED),
        (403, grpc.StatusCode.PERMISSION_DENIED),
        (404, grpc.StatusCode.UNIMPLEMENTED),
        (429, grpc.StatusCode.UNAVAILABLE),
        (502, grpc.StatusCode.UNAVAILABLE),
        (503, grpc.StatusCode.UNAVAILABLE),
        (504, grpc.StatusCode.UNAVAILABLE),
        (418, grpc.StatusCode.UNKNOWN),
    ],
)
def test_http_status_mapping(http, code):
    assert http_to_grpc(http) is code
    assert config(abort_http_status=http, abort_percent=100).abort_code is code


def test_grpc_status_ok_abort_ends_the_rpc_with_ok():
    """A33 "200/OK Error Injection": a configured ``grpc_status`` OK is an
    abort that ends the RPC with OK (no details); C-core 1.85 injects
    nothing (test_conformance_fault.py, test_differential_fault.py)."""
    chain = FaultFilter().call_filter(
        b.fault_config(abort_grpc_status=0, abort_percent=100).SerializeToString()
    )
    assert chain is not None
    verdict = chain.on_call((), random.Random(1))
    verdict.done()  # the process-wide active-fault count
    assert verdict.abort.code is grpc.StatusCode.OK and verdict.abort.details == ""


def test_unset_percentage_never_injects_and_costs_no_filter():
    assert not config(abort_grpc_status=14).injects
    assert FaultFilter().call_filter(b.fault_config().SerializeToString()) is None


@pytest.mark.parametrize(
    "percent", [(30, 100), (3_000, 10_000), (300_000, 1_000_000), (1, 100), (99, 100)]
)
def test_abort_percentage_over_seeded_draws_for_every_denominator(percent):
    inj = injector(abort_grpc_status=14, abort_percent=percent)
    want = percent[0] / percent[1]
    got = abort_rate(inj, 20_000)
    assert abs(got - want) < 0.015, (got, want)


def test_abort_and_delay_are_drawn_independently():
    inj = injector(abort_grpc_status=14, abort_percent=20, delay=0.1, delay_percent=5)
    rng = random.Random(11)
    faulted = 0
    n = 20_000
    for _ in range(n):
        verdict = inj.on_call((), rng)
        if verdict is not None:
            faulted += 1
            verdict.done()
    # independent draws: 1 - 0.8 * 0.95 = 24 % (one shared draw would give 20 %)
    assert abs(faulted / n - 0.24) < 0.015


def test_verdict_carries_status_text_and_delay():
    verdict = injector(
        abort_grpc_status=8, abort_percent=100, delay=0.25, delay_percent=100
    ).on_call((), random.Random(1))
    assert verdict.delay == 0.25
    assert verdict.abort.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert verdict.abort.details == "Fault injected"


def test_header_abort_code_and_percentage_cap():
    inj = injector(header_abort=True, abort_percent=(50, 100))
    assert abort_rate(inj, 100) == 0  # no header: nothing
    md = [("x-envoy-fault-abort-grpc-request", "5")]
    assert 0.4 < abort_rate(inj, 4000, md) < 0.6
    # the percentage header sets the numerator (over the config's
    # denominator), capped at the config's numerator
    capped = [*md, ("x-envoy-fault-abort-request-percentage", "90")]
    assert 0.4 < abort_rate(inj, 4000, capped) < 0.6
    lower = [*md, ("x-envoy-fault-abort-request-percentage", "10")]
    assert 0.05 < abort_rate(inj, 4000, lower) < 0.15
    # invalid headers are ignored
    assert abort_rate(inj, 200, [*md, ("x-envoy-fault-abort-request-percentage", "x")]) > 0.3
    assert abort_rate(inj, 200, [("x-envoy-fault-abort-grpc-request", "abc")]) == 0


def test_header_delay():
    inj = injector(header_delay=True, delay_percent=100)
    rng = random.Random(1)
    assert inj.on_call((), rng) is None
    verdict = inj.on_call([("x-envoy-fault-delay-request", b"150")], rng)
    assert verdict.delay == 0.15 and verdict.abort is None
    off = [("x-envoy-fault-delay-request", "150"), ("x-envoy-fault-delay-request-percentage", "0")]
    assert inj.on_call(off, rng) is None


def test_max_active_faults_limits_concurrent_faulted_rpcs():
    active = _ActiveFaults()
    inj = FaultInjector(config(delay=1, delay_percent=100, max_active_faults=2), active)
    rng = random.Random(1)
    first, second = inj.on_call((), rng), inj.on_call((), rng)
    assert first is not None and second is not None
    assert inj.on_call((), rng) is None  # two active already
    first.done()
    first.done()  # once only
    assert active.count == 1
    assert inj.on_call((), rng) is not None


def fault_bytes(code: int) -> bytes:
    return b.fault_config(abort_grpc_status=code, abort_percent=100).SerializeToString()


def codes_of(chain) -> list[grpc.StatusCode]:
    return [f.config.abort_code for f in chain]


def test_override_precedence_cluster_over_route_over_virtual_host_over_listener():
    listener = [HttpFilter("fault", FAULT, fault_bytes(7))]
    vh = (("fault", FAULT, fault_bytes(8)),)
    route = (("fault", FAULT, fault_bytes(9)),)
    cluster = (("fault", FAULT, fault_bytes(10)),)
    assert codes_of(build_chain(listener)) == [grpc.StatusCode.PERMISSION_DENIED]
    assert codes_of(build_chain(listener, vh)) == [grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert codes_of(build_chain(listener, vh, route)) == [grpc.StatusCode.FAILED_PRECONDITION]
    assert codes_of(build_chain(listener, vh, route, cluster)) == [grpc.StatusCode.ABORTED]
    # an override for another filter name does not apply
    other = (("other", FAULT, fault_bytes(9)),)
    assert codes_of(build_chain(listener, other)) == [grpc.StatusCode.PERMISSION_DENIED]
    # an override that disables the fault removes the filter from the chain
    off = (("fault", FAULT, b.fault_config().SerializeToString()),)
    assert build_chain(listener, off) == ()


def test_chain_runs_in_listener_order_and_first_abort_ends_it():
    listener = [
        HttpFilter("d", FAULT, b.fault_config(delay=0.1, delay_percent=100).SerializeToString()),
        HttpFilter("a", FAULT, fault_bytes(14)),
        HttpFilter("b", FAULT, fault_bytes(7)),
        HttpFilter("router", "envoy.extensions.filters.http.router.v3.Router"),
    ]
    chain = build_chain(listener)
    assert len(chain) == 3  # the router does nothing per call
    verdict = run_chain(chain, (), random.Random(1))
    assert verdict.delay == 0.1
    assert verdict.abort.code is grpc.StatusCode.UNAVAILABLE
    verdict.done()


def test_fault_filter_is_registered_by_type_url():
    assert isinstance(registered(FAULT), FaultFilter)


def test_a_new_filter_is_one_class_and_one_register_call():
    """A39 registry: registering a filter type makes LDS accept it and puts it
    in route chains; before that, a required filter of that type is NACKed."""
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )
    from google.protobuf import any_pb2, struct_pb2

    from pyxds.lb.api import Status
    from pyxds.resolver import http_filters
    from pyxds.resolver.http_filters import CallFilter, FilterVerdict, HttpFilter, register
    from pyxds.xds.resources import ROUTE_CONFIG
    from pyxds.xds.resources._common import HTTP_FILTER_TYPES
    from pyxds.xds.resources.listener import decode_listener

    type_url = "google.protobuf.Struct"  # any message type serves as a config

    def listener_bytes() -> bytes:
        config = any_pb2.Any()
        config.Pack(struct_pb2.Struct())
        lis = b.listener("l", http_filters=[hcm_pb2.HttpFilter(name="deny", typed_config=config)])
        return lis.SerializeToString()

    class Deny(CallFilter):
        def on_call(self, metadata, rng):
            return FilterVerdict(abort=Status(grpc.StatusCode.PERMISSION_DENIED, "denied"))

    class DenyFilter(HttpFilter):
        type_urls = (type_url,)

        def call_filter(self, config):
            return Deny()

    _, _, error = decode_listener(listener_bytes())
    assert error is not None and "unsupported filter type" in error
    register(DenyFilter())
    try:
        _, listener, error = decode_listener(listener_bytes())
        assert error is None
        chain = build_chain(listener.http_filters)
        assert [type(f) for f in chain] == [Deny]
        verdict = run_chain(chain, (), random.Random(1))
        assert verdict.abort.details == "denied"
    finally:
        http_filters._REGISTRY.pop(type_url, None)
        HTTP_FILTER_TYPES.pop(type_url, None)
        ROUTE_CONFIG.clear_memo()
