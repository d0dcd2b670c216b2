"""Conformance: the channel to the Route Lookup Service (pyxds.channel.rls_channel)
against a real ``pyxds.server.RouteLookupServer`` on 127.0.0.1.

grpc-go's ``balancer/rls/control_channel_test.go`` and ``balancer_test.go`` test
their control channel on its own; these replay the behaviours of it that reach
the wire.  The channel is driven as ``rls_experimental`` drives it: one lookup
at a time, the answer handed to a callback.
"""

from __future__ import annotations

import json
import threading

import grpc
import pytest

from pyxds.channel.rls_channel import GrpcRouteLookupChannel
from pyxds.lb.rls import LookupReason, LookupResult
from pyxds.server import RouteLookupServer


@pytest.fixture
def rls():
    with RouteLookupServer() as srv:
        yield srv


def lookup(
    channel: GrpcRouteLookupChannel,
    key_map: dict[str, str],
    reason: LookupReason = LookupReason.MISS,
    stale_header_data: str = "",
    timeout: float = 5.0,
) -> LookupResult:
    """One lookup; its result (bounded wait)."""
    done = threading.Event()
    results: list[LookupResult] = []

    def on_done(result: LookupResult) -> None:
        results.append(result)
        done.set()

    channel.lookup(key_map, reason, stale_header_data, timeout, on_done)
    assert done.wait(timeout + 5), "the lookup never completed"
    return results[0]


def open_channel(target: str, service_config: str | None = None) -> GrpcRouteLookupChannel:
    return GrpcRouteLookupChannel(target, None, "svc.example", service_config, lambda fn: fn())


def test_the_route_lookup_channel_service_config_is_the_rls_channels_service_config(rls):
    """grpc-go balancer_test.go ``TestConfigUpdate_ControlChannelServiceConfig``:
    ``routeLookupChannelServiceConfig`` is the service config of the channel
    to the RLS server (C-core rls.cc ``RlsChannel``: ``GRPC_ARG_SERVICE_CONFIG``
    with service config resolution disabled).  Seen through a method config
    that the RLS answer cannot pass (``maxResponseMessageBytes`` 1): with it
    the lookup fails RESOURCE_EXHAUSTED, without it the same lookup is
    answered."""
    rls.set({"user": "alice"}, ["cluster-a"], header_data="some-data")
    tight = json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{"service": "grpc.lookup.v1.RouteLookupService"}],
                    "maxResponseMessageBytes": 1,
                }
            ]
        }
    )
    plain = open_channel(rls.target)
    limited = open_channel(rls.target, tight)
    try:
        answered = lookup(plain, {"user": "alice"})
        assert answered.status.ok, answered.status
        assert answered.targets == ("cluster-a",)
        failed = lookup(limited, {"user": "alice"})
        assert failed.status.code is grpc.StatusCode.RESOURCE_EXHAUSTED, failed.status
        assert len(rls.requests) == 2  # the server answered both; the client refused one
    finally:
        plain.close()
        limited.close()


def test_a_lookup_request_carries_the_key_map_reason_stale_header_data_and_target_type(rls):
    """grpc-java RlsProtoConvertersTest ``convert_toRequestProto`` and
    ``convert_toRequestProto_staleHeaderData``, C-core rls.cc ``MakeRequestProto``:
    ``target_type`` "grpc", the key map, the reason, and for a refresh of
    stale data the data's ``header_data`` as ``stale_header_data``; the
    answer's targets in order and its ``header_data`` come back."""
    rls.set({"user": "alice", "k": "v"}, ["cluster-a", "cluster-b"], header_data="hd-1")
    channel = open_channel(rls.target)
    try:
        miss = lookup(channel, {"user": "alice", "k": "v"})
        stale = lookup(channel, {"user": "alice", "k": "v"}, LookupReason.STALE, "hd-1")
    finally:
        channel.close()
    for result in (miss, stale):
        assert result.status.ok and result.targets == ("cluster-a", "cluster-b")
        assert result.header_data == "hd-1"
    first, second = rls.requests
    assert (first.key_map, first.reason, first.stale_header_data, first.target_type) == (
        {"user": "alice", "k": "v"},
        "REASON_MISS",
        "",
        "grpc",
    )
    assert (second.reason, second.stale_header_data) == ("REASON_STALE", "hd-1")


def test_a_lookup_the_server_refuses_returns_the_servers_status(rls):
    """grpc-go control_channel_test.go ``TestLookupFailure``: the RLS
    server's error status is the lookup's result, code and message as sent
    (the policy then fails picks "RLS request failed: <code>: <message>")."""
    rls.set({"user": "mallory"}, code=grpc.StatusCode.PERMISSION_DENIED, details="go away")
    channel = open_channel(rls.target)
    try:
        result = lookup(channel, {"user": "mallory"})
    finally:
        channel.close()
    assert (result.status.code, result.status.details) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "go away",
    )
    assert result.targets == ()
