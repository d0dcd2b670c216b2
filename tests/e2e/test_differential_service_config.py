"""Differential: ``service_config=`` on a non-xDS pyxds channel against
grpcio's own channel given the same JSON as ``grpc.service_config``, same
backend: methodConfig timeout, message-size limits, waitForReady, name
precedence."""

from __future__ import annotations

import json
import time

import grpc
import pytest
from channel_fixtures import SERVICE, Backend

import pyxds._api as pyxds


@pytest.fixture(scope="module")
def backend():
    started = Backend("a0").start()
    yield started
    started.stop()


def both(target: str, sc: dict):
    theirs = grpc.insecure_channel(target, options=[("grpc.service_config", json.dumps(sc))])
    ours = pyxds.insecure_channel(target, service_config=sc)
    return ours, theirs


def outcome(channel: grpc.Channel, method: str, request: bytes, **kwargs) -> str:
    try:
        return channel.unary_unary(f"/{SERVICE}/{method}")(request, **kwargs).decode()
    except grpc.RpcError as err:
        return f"{err.code().name}: {err.details()}"


def test_method_timeout_and_name_precedence_like_grpcio(backend):
    """The exact service+method entry wins over the default one.  Measured,
    not followed: grpcio 1.85.1 ends a methodConfig timeout about 1.5-2 s
    early (a "1s" timeout fails a 50 ms RPC at once, "2.5s" ends after
    0.5-1 s); pyxds keeps the configured time.  So grpcio is held to the
    outcome, pyxds also to the time, by one-sided bounds a starved process
    cannot break: the RPC ends no earlier than 2.4 s, and the server sees at
    most 2.5 s left (+ the grpc-timeout header's rounding).  A two-sided
    wall-clock bound (< 2.9 s) failed under load: 5.66 s, the calling thread
    woken 3 s after the deadline."""
    exact = [{"service": SERVICE, "method": "Sleep"}, {"service": SERVICE, "method": "Left"}]
    sc = {
        "methodConfig": [
            {"name": [{}], "timeout": "30s"},
            {"name": exact, "timeout": "2.5s"},
        ]
    }
    ours, theirs = both(f"ipv4:{backend.address}", sc)
    try:
        for channel in (ours, theirs):
            assert outcome(channel, "Who", b"", timeout=5) == "a0"
            assert outcome(channel, "Sleep", b"0.05", timeout=5) == "a0"
            # a shorter per-call deadline still wins
            assert outcome(channel, "Sleep", b"3", timeout=0.2).startswith("DEADLINE_EXCEEDED")
            start = time.monotonic()
            got = outcome(channel, "Sleep", b"3", timeout=30)
            took = time.monotonic() - start
            assert got == "DEADLINE_EXCEEDED: Deadline Exceeded"
            if channel is ours:
                assert took >= 2.4
                # (the grpc-timeout header rounds up: 2.508 s seen)
                assert 0 < float(outcome(channel, "Left", b"", timeout=30)) <= 2.6
    finally:
        ours.close()
        theirs.close()


def test_short_method_timeout_applies(ports):
    ours = pyxds.insecure_channel(
        f"ipv4:{ports.dead_address()}",
        service_config={"methodConfig": [{"name": [{}], "timeout": "0.2s"}]},
    )
    try:
        start = time.monotonic()
        got = outcome(ours, "Who", b"", wait_for_ready=True)
        assert got == "DEADLINE_EXCEEDED: Deadline Exceeded"
        assert 0.15 <= time.monotonic() - start < 1.0
    finally:
        ours.close()


def test_message_size_limits_like_grpcio(backend):
    sc = {
        "methodConfig": [
            {
                "name": [{"service": SERVICE}],
                "maxRequestMessageBytes": 10,
                "maxResponseMessageBytes": 1,
            }
        ]
    }
    ours, theirs = both(f"ipv4:{backend.address}", sc)
    try:
        big = [
            outcome(ch, "Who", b"x" * 100, timeout=5, wait_for_ready=True) for ch in (ours, theirs)
        ]
        assert big[0] == big[1]
        assert big[0].startswith("RESOURCE_EXHAUSTED")
        small = [outcome(ch, "Who", b"", timeout=5, wait_for_ready=True) for ch in (ours, theirs)]
        assert small[0] == small[1]  # the response ("a0") is over 1 byte
        assert small[0].startswith("RESOURCE_EXHAUSTED")
    finally:
        ours.close()
        theirs.close()


def test_wait_for_ready_from_the_config_unless_the_call_says_like_grpcio(ports):
    sc = {"methodConfig": [{"name": [{}], "waitForReady": True}]}
    ours, theirs = both(f"ipv4:{ports.dead_address()}", sc)  # nothing listens
    try:
        waited = {outcome(ch, "Who", b"", timeout=0.5) for ch in (ours, theirs)}
        assert waited == {"DEADLINE_EXCEEDED: Deadline Exceeded"}
        fast = {
            outcome(ch, "Who", b"", timeout=5, wait_for_ready=False).split(":")[0]
            for ch in (ours, theirs)
        }
        assert fast == {"UNAVAILABLE"}
    finally:
        ours.close()
        theirs.close()
