"""The e2e helpers: Echo backends restart on their port; a blackhole never answers."""

from __future__ import annotations

import grpc
import pytest
from protos import echo_pb2, echo_pb2_grpc


def echo(address: str, timeout: float = 5.0) -> str:
    with grpc.insecure_channel(address) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        return stub.Echo(echo_pb2.EchoRequest(message="x"), timeout=timeout).backend


def test_echo_backend_names_itself_and_counts_calls(echo_backends):
    a, b_ = echo_backends(["alpha", "beta"])
    assert (echo(a.address), echo(b_.address)) == ("alpha", "beta")
    assert (a.calls, b_.calls) == (1, 1)


def test_echo_stream_sends_count_replies(echo_backends):
    (a,) = echo_backends(1)
    with grpc.insecure_channel(a.address) as channel:
        replies = list(
            echo_pb2_grpc.EchoStub(channel).EchoStream(
                echo_pb2.EchoRequest(message="m", count=3), timeout=5
            )
        )
    assert [(r.message, r.backend) for r in replies] == [("m", "backend-0")] * 3


def test_stopped_backend_restarts_on_the_same_port(echo_backends):
    (a,) = echo_backends(["alpha"])
    port = a.port
    a.stop()
    with pytest.raises(grpc.RpcError) as info:
        echo(a.address, timeout=1)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    a.start()
    assert a.port == port
    assert echo(a.address) == "alpha"


def test_blackhole_accepts_but_never_answers(blackhole):
    with pytest.raises(grpc.RpcError) as info, grpc.insecure_channel(blackhole.address) as ch:
        echo_pb2_grpc.EchoStub(ch).Echo(echo_pb2.EchoRequest(), timeout=0.5, wait_for_ready=True)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert blackhole.accepted >= 1
