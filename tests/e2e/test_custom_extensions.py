"""The worked examples of docs/custom-resolver.md and docs/custom-policy.md,
run for real: a resolver whose address list changes at runtime (a new backend
gets RPCs without a new channel), a Python LB policy chosen by a service
config and by xDS (gRFC A52 TypedStruct), and the dns: resolver."""

from __future__ import annotations

import collections
import json
import os
import sys

import pytest
from channel_fixtures import SERVICE, Backend, call_until, who
from xds.type.v3 import typed_struct_pb2

import pyxds._api as pyxds
from pyxds.lb import registry as lb_registry
from pyxds.resolver import registry as resolver_registry
from pyxds.server import Snapshot
from pyxds.server import builders as b

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "docs", "examples"))
from address_book_resolver import AddressBook
from least_recent_policy import LeastRecentFactory


@pytest.fixture
def backends():
    started = [Backend(name).start() for name in ("a", "b", "c")]
    yield started
    for backend in started:
        backend.stop()


@pytest.fixture
def least_recent():
    lb_registry.register(LeastRecentFactory())
    yield
    lb_registry.unregister("least_recent")


def spread(channel, n: int = 60) -> collections.Counter:
    return collections.Counter(who(channel) for _ in range(n))


def test_a_backend_added_to_a_custom_resolver_gets_rpcs_without_a_new_channel(backends):
    a, b_, _ = backends
    book = AddressBook()
    resolver_registry.register("book", book.resolver_factory)
    book.set("greeter", [a.address])
    with pyxds.insecure_channel(
        "book:///greeter", options=[("grpc.lb_policy_name", "round_robin")]
    ) as channel:
        assert set(spread(channel, 10)) == {"a"}
        book.set("greeter", [a.address, b_.address])
        call_until(channel, "b", timeout=10)
        assert set(spread(channel)) == {"a", "b"}
        book.set("greeter", [b_.address])
        call_until(channel, "b", timeout=10)
        assert set(spread(channel, 20)) == {"b"}


def test_python_policy_chosen_by_a_service_config(backends, least_recent):
    a, b_, c = backends
    config = {"loadBalancingConfig": [{"least_recent": {"cooldown_picks": 5}}]}
    target = f"static:///{a.address},{b_.address},{c.address}"
    with pyxds.insecure_channel(
        target, options=[("grpc.service_config", json.dumps(config))]
    ) as channel:
        for name in ("a", "b", "c"):  # each READY: the policy picks READY ones only
            call_until(channel, name, timeout=10)
        seen = spread(channel, 90)
        assert set(seen) == {"a", "b", "c"} and min(seen.values()) >= 20
        lb = channel.config_dump()["lb_policy"]
        assert "least_recent" in json.dumps(lb)


def test_python_policy_with_a_bad_config_fails_the_channel_naming_the_field(least_recent):
    config = {"loadBalancingConfig": [{"least_recent": {"cooldown_picks": -1}}]}
    with pyxds.insecure_channel(
        "static:///127.0.0.1:1", options=[("grpc.service_config", json.dumps(config))]
    ) as channel:
        with pytest.raises(Exception) as info:
            channel.unary_unary(f"/{SERVICE}/Who")(b"", timeout=2)
        assert "cooldown_picks" in str(info.value)


def test_python_policy_chosen_by_xds_typed_struct(xds_server, backends, least_recent):
    a, b_, _ = backends
    struct = typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/least_recent")
    struct.value.update({"cooldown_picks": 3})
    xds_server.set_snapshot(
        Snapshot(
            listeners=[b.listener("svc", route_config_name="svc-route")],
            routes=[
                b.route_config("svc-route", [b.virtual_host("v", ["*"], [b.route(cluster="c")])])
            ],
            clusters=[b.cluster("c", load_balancing_policy=[("least_recent", struct)])],
            endpoints=[b.endpoints("c", [b.locality(endpoints=[a.address, b_.address])])],
        )
    )
    with pyxds.insecure_channel("xds:///svc", bootstrap=xds_server.bootstrap()) as channel:
        call_until(channel, "a", timeout=10)
        call_until(channel, "b", timeout=10)
        assert set(spread(channel)) == {"a", "b"}
        # Under the xDS tree each priority runs the policy the cluster named.
        assert '"policy": "least_recent"' in json.dumps(channel.config_dump()["lb_policy"])
    assert xds_server.nacks() == []


def test_dns_target_resolves_localhost_and_serves_rpcs(backends):
    a = backends[0]
    with pyxds.insecure_channel(f"dns:///localhost:{a.port}") as channel:
        assert who(channel) == "a"
        dump = channel.config_dump()["resolver"]
        assert dump["resolver"] == "dns" and f"127.0.0.1:{a.port}" in dump["addresses"]
