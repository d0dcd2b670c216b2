"""The channel's dns: resolver (C-core's polling DNS resolver semantics):
lookups off the serializer, re-resolution rate-limited to one per 30 s,
failures retried with backoff, optional periodic refresh. FakeClock and
FakeDnsResolver: no real time, no real DNS."""

from __future__ import annotations

import random

import grpc

from pyxds.resolver.api import ResolverArgs
from pyxds.resolver.dns import FakeDnsResolver
from pyxds.resolver.dns_target import DnsTargetResolver
from pyxds.serializer import WorkSerializer
from pyxds.status import Status
from pyxds.testing import FakeClock

HOST = "svc.example"


def make(options: dict | None = None):
    clock = FakeClock()
    dns = FakeDnsResolver()
    results: list = []
    args = ResolverArgs(
        target=f"dns:///{HOST}:50051",
        authority=f"{HOST}:50051",
        serializer=WorkSerializer(),
        clock=clock,
        random=random.Random(7),
        on_result=results.append,
        options=options or {},
    )
    resolver = DnsTargetResolver(args, HOST, 50051, dns=dns)
    return resolver, clock, dns, results


def addresses(result) -> list[str]:
    return [e.addresses[0] for e in result.endpoints]


def test_first_lookup_delivers_every_address_in_order():
    resolver, _, dns, results = make()
    resolver.start()
    assert dns.requests == [(HOST, 50051)]
    dns.complete(HOST, ["10.0.0.1:50051", "10.0.0.2:50051"])
    assert addresses(results[-1]) == ["10.0.0.1:50051", "10.0.0.2:50051"]


def test_reresolution_requests_are_rate_limited_to_one_per_30_seconds():
    resolver, clock, dns, results = make()
    resolver.start()
    dns.complete(HOST, ["10.0.0.1:50051"])
    clock.advance(1)
    resolver.request_reresolution()
    resolver.request_reresolution()  # merged into the scheduled one
    assert len(dns.requests) == 1
    clock.advance(28.9)
    assert len(dns.requests) == 1
    clock.advance(0.1)
    assert len(dns.requests) == 2
    dns.complete(HOST, ["10.0.0.1:50051", "10.0.0.9:50051"])
    assert addresses(results[-1]) == ["10.0.0.1:50051", "10.0.0.9:50051"]


def test_a_request_30_seconds_after_the_last_lookup_resolves_at_once():
    resolver, clock, dns, _ = make()
    resolver.start()
    dns.complete(HOST, ["10.0.0.1:50051"])
    clock.advance(45)
    resolver.request_reresolution()
    assert len(dns.requests) == 2


def test_requests_during_a_lookup_are_merged_into_it():
    resolver, clock, dns, _ = make()
    resolver.start()
    resolver.request_reresolution()
    clock.advance(100)
    assert len(dns.requests) == 1


def test_the_rate_limit_is_the_min_time_option():
    resolver, clock, dns, _ = make({"grpc.dns_min_time_between_resolutions_ms": 2000})
    resolver.start()
    dns.complete(HOST, ["10.0.0.1:50051"])
    resolver.request_reresolution()
    clock.advance(1.99)
    assert len(dns.requests) == 1
    clock.advance(0.01)
    assert len(dns.requests) == 2


def test_a_failed_lookup_is_reported_and_retried_with_backoff():
    resolver, clock, dns, results = make()
    resolver.start()
    dns.complete(HOST, "no such host")
    assert isinstance(results[-1].endpoints, Status)
    assert results[-1].endpoints.code is grpc.StatusCode.UNAVAILABLE
    resolver.request_reresolution()  # merged into the retry
    clock.advance(0.79)
    assert len(dns.requests) == 1
    clock.advance(0.42)  # the first retry is 1 s +- 20 %
    assert len(dns.requests) == 2
    dns.complete(HOST, "no such host")
    clock.advance(1.6 * 0.8 - 0.01)
    assert len(dns.requests) == 2
    clock.advance(1.6 * 0.4 + 0.02)
    assert len(dns.requests) == 3
    dns.complete(HOST, ["10.0.0.1:50051"])
    assert addresses(results[-1]) == ["10.0.0.1:50051"]


def test_periodic_refresh_is_off_by_default_and_on_with_the_option():
    resolver, clock, dns, _ = make()
    resolver.start()
    dns.complete(HOST, ["10.0.0.1:50051"])
    clock.advance(3600)
    assert len(dns.requests) == 1
    resolver, clock, dns, _ = make({"pyxds.dns_refresh_interval_ms": 5000})
    resolver.start()
    dns.complete(HOST, ["10.0.0.1:50051"])
    clock.advance(5)
    assert len(dns.requests) == 2
    dns.complete(HOST, ["10.0.0.1:50051"])
    clock.advance(5)
    assert len(dns.requests) == 3


def test_shutdown_cancels_timers_and_drops_a_late_answer():
    resolver, clock, dns, _ = make()
    resolver.start()
    dns.complete(HOST, ["10.0.0.1:50051"])
    resolver.request_reresolution()
    resolver.shutdown()
    clock.advance(60)
    assert len(dns.requests) == 1
    resolver2, _, dns2, results2 = make()
    resolver2.start()
    resolver2.shutdown()
    dns2.complete(HOST, ["10.0.0.1:50051"])
    assert results2 == []
