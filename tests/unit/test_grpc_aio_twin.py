"""When a sync transport's grpc.aio twin (pyxds/channel/grpc_aio_twin.py)
is made on the sync channel's own C-core arguments: only on a grpcio whose
mirrored functions are the ones it was checked against, only for options
keyed by ``transport_options``, and not when switched off; each transport's
key is its own.  (That the twin then shares the connection, and the
fallback's side connection: tests/e2e/test_wrr_orca_channel.py.)"""

from __future__ import annotations

import asyncio
import gc

import grpc
import grpc.aio
import pytest

from pyxds.channel import grpc_aio_twin
from pyxds.channel.subchannel import subchannel_options

CHECKED_GRPCIO = f"grpcio {grpc.__version__}" in grpc_aio_twin.VERIFIED.values()
needs_checked_grpcio = pytest.mark.skipif(
    not CHECKED_GRPCIO, reason=f"grpcio {grpc.__version__} is not a checked one"
)


@pytest.fixture
def fresh():
    """The check taken again in the test, and again after it (a test's
    answer is not kept)."""
    grpc_aio_twin.available.reset()
    yield
    grpc_aio_twin.available.reset()


@pytest.fixture
def public_made(monkeypatch):
    """The targets grpc.aio's public constructors were called with."""
    made: list[str] = []
    real = grpc.aio.insecure_channel

    def insecure(target, options=None, compression=None):
        made.append(target)
        return real(target, options, compression)

    monkeypatch.setattr(grpc.aio, "insecure_channel", insecure)
    return made


def make_twin(options) -> tuple[str, grpc.StatusCode]:
    """Make a twin on a fresh loop, read one unary-stream call on it (the
    OOB stream's shape) to a port nobody listens on; its type name and the
    call's status code."""

    async def main():
        channel = grpc_aio_twin.twin("127.0.0.1:1", None, options, None)
        try:
            if isinstance(channel, grpc_aio_twin.Twin):
                call = channel.call(b"/s/m")
                ended: list[tuple[grpc.StatusCode, str]] = []

                class Sink:
                    message = staticmethod(messages.append)

                    @staticmethod
                    def end(code: grpc.StatusCode, details: str) -> None:
                        ended.append((code, details))

                reader = grpc_aio_twin.UnaryStreamReader(channel, call, Sink())
                reader.start(b"")
                await reader.ended()
                return type(channel).__name__, ended[0][0]
            call = channel.unary_stream("/s/m")(b"", wait_for_ready=False)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            return type(channel).__name__, err.value.code()
        finally:
            await channel.close()

    messages: list[bytes] = []
    result = asyncio.run(main())
    assert messages == []
    return result


@needs_checked_grpcio
def test_this_grpcio_is_a_checked_one(fresh):
    assert grpc_aio_twin.fingerprint() in grpc_aio_twin.VERIFIED
    assert grpc_aio_twin.available()


def test_a_grpcio_missing_a_mirrored_function_is_not_used(fresh, monkeypatch):
    def missing():
        raise AttributeError("_augment_options")

    monkeypatch.setattr(grpc_aio_twin, "_mirrored", missing)
    assert not grpc_aio_twin.available()


def test_each_transport_gets_a_key_of_its_own_in_place_of_a_local_pool():
    options = subchannel_options([("grpc.max_receive_message_length", 10)])
    assert ("grpc.use_local_subchannel_pool", 1) in options
    first = grpc_aio_twin.transport_options(options)
    second = grpc_aio_twin.transport_options(options)
    for keyed in (first, second):
        assert "grpc.use_local_subchannel_pool" not in dict(keyed)
        assert dict(keyed)["grpc.max_receive_message_length"] == 10
    assert dict(first)[grpc_aio_twin.KEY] != dict(second)[grpc_aio_twin.KEY]


def test_switched_off_transports_keep_the_local_pool(monkeypatch):
    monkeypatch.setattr(grpc_aio_twin, "ENABLED", False)
    options = subchannel_options(None)
    assert grpc_aio_twin.transport_options(options) == options


@needs_checked_grpcio
def test_a_keyed_transport_twin_is_made_on_the_sync_arguments(fresh, public_made):
    options = grpc_aio_twin.transport_options(subchannel_options(None))
    assert make_twin(options) == ("Twin", grpc.StatusCode.UNAVAILABLE)
    assert public_made == []


def test_a_twin_on_another_grpcio_is_made_the_public_way(fresh, monkeypatch, public_made):
    monkeypatch.setattr(grpc_aio_twin, "VERIFIED", {"0" * 64: "not this one"})
    options = grpc_aio_twin.transport_options(subchannel_options(None))
    assert make_twin(options) == ("Channel", grpc.StatusCode.UNAVAILABLE)
    assert public_made == ["127.0.0.1:1"]


def test_unkeyed_options_get_a_public_twin(fresh, public_made):
    assert make_twin(subchannel_options(None)) == ("Channel", grpc.StatusCode.UNAVAILABLE)
    assert public_made == ["127.0.0.1:1"]


@needs_checked_grpcio
def test_a_twin_dropped_without_close_destroys_its_channel(fresh):
    """As grpc.aio's Channel.__del__: an unclosed twin's C-core channel is
    destroyed when the twin goes (else it would hold the shared C-core
    subchannel, and its connection, for the process's life)."""
    options = grpc_aio_twin.transport_options(subchannel_options(None))

    async def main():
        twin = grpc_aio_twin.twin("127.0.0.1:1", None, options, None)
        assert isinstance(twin, grpc_aio_twin.Twin)
        inner = twin._channel
        assert not inner.closed()
        del twin
        gc.collect()
        return inner.closed()

    assert asyncio.run(main())
