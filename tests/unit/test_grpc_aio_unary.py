"""When the lean grpc.aio unary call (pyxds/channel/grpc_aio_unary.py) is
used: only on a grpcio whose mirrored functions are the ones it was checked
against, only for grpc.aio unary-unary multicallables without interceptors,
and not when switched off.  (Its behaviour against grpc.aio:
tests/e2e/test_conformance_aio_unary_lean.py.)"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from pyxds.channel import grpc_aio_unary

CHECKED_GRPCIO = f"grpcio {grpc.__version__}" in grpc_aio_unary.VERIFIED.values()
needs_checked_grpcio = pytest.mark.skipif(
    not CHECKED_GRPCIO, reason=f"grpcio {grpc.__version__} is not a checked one"
)


@pytest.fixture
def fresh():
    """The check taken again in the test, and again after it (a test's
    answer is not kept)."""
    grpc_aio_unary.available.reset()
    yield
    grpc_aio_unary.available.reset()


@needs_checked_grpcio
def test_this_grpcio_is_a_checked_one(fresh):
    assert grpc_aio_unary.fingerprint() in grpc_aio_unary.VERIFIED
    assert grpc_aio_unary.available()


def test_a_grpcio_with_other_sources_keeps_its_own_multicallables(fresh, monkeypatch):
    monkeypatch.setattr(grpc_aio_unary, "VERIFIED", {"0" * 64: "not this one"})

    async def main():
        async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:
            mc = channel.unary_unary("/s/m")
            assert grpc_aio_unary.lean(mc) is mc

    asyncio.run(main())
    assert not grpc_aio_unary.available()


def test_a_grpcio_missing_a_mirrored_function_keeps_its_own_multicallables(fresh, monkeypatch):
    def missing():
        raise AttributeError("_invoke")

    monkeypatch.setattr(grpc_aio_unary, "_mirrored", missing)
    assert not grpc_aio_unary.available()


@needs_checked_grpcio
def test_only_aio_unary_unary_multicallables_without_interceptors_are_made_lean(fresh, monkeypatch):
    class Interceptor(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, details, request):
            return await continuation(details, request)

    async def main():
        async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:
            lean = grpc_aio_unary.lean(channel.unary_unary("/s/m"))
            assert isinstance(lean, grpc_aio_unary.LeanAioUnaryUnary)
            stream = channel.unary_stream("/s/m")
            assert grpc_aio_unary.lean(stream) is stream
        async with grpc.aio.insecure_channel("127.0.0.1:1", interceptors=[Interceptor()]) as ch:
            intercepted = ch.unary_unary("/s/m")
            assert grpc_aio_unary.lean(intercepted) is intercepted
        async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:
            monkeypatch.setattr(grpc_aio_unary, "ENABLED", False)
            plain = channel.unary_unary("/s/m")
            assert grpc_aio_unary.lean(plain) is plain

    asyncio.run(main())
    sync = grpc.insecure_channel("127.0.0.1:1")
    try:
        mc = sync.unary_unary("/s/m")
        assert grpc_aio_unary.lean(mc) is mc
    finally:
        sync.close()
