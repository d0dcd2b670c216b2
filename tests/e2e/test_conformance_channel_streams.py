"""Channel conformance, e2e over real grpcio: an RPC whose stream the server
refused (RST_STREAM REFUSED_STREAM: it never reached the application) is sent
again on a new pick, for every call kind, as C-core's retry filter does
(C-core test/core/end2end/tests/retry_transparent_not_sent_on_wire.cc,
retry_transparent_max_concurrent_streams.cc), with a client stream's
requests replayed and the user's iterator read once."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from channel_fixtures import SERVICE, Backend, RefusingServer, wait_until

import pyxds._api as pyxds
import pyxds.aio as pyxds_aio


@pytest.fixture
def refuser_and_good():
    refuser = RefusingServer()
    good = Backend("good")
    good.start()
    options = [("grpc.lb_policy_name", "round_robin")]
    channel = pyxds.insecure_channel(f"static:///{refuser.address},{good.address}", options=options)
    channel.subscribe(lambda state: None, try_to_connect=True)

    def both_ready() -> bool:
        subchannels = channel.config_dump()["subchannels"]
        return len(subchannels) == 2 and all(s["state"] == "READY" for s in subchannels.values())

    assert wait_until(both_ready, 5)
    yield channel, refuser
    channel.close()
    good.stop()
    refuser.close()


def _rounds(channel, refuser, kind: str, rounds: int = 6) -> list:
    stream = channel.unary_stream(f"/{SERVICE}/Stream")
    collect = channel.stream_unary(f"/{SERVICE}/Collect")
    chat = channel.stream_stream(f"/{SERVICE}/Chat")
    results = []
    for _ in range(rounds):
        if kind == "unary_unary":
            results.append(channel.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5))
        elif kind == "unary_stream":
            results.append(list(stream(b"2", timeout=5)))
        elif kind == "stream_unary":
            results.append(collect(iter([b"a", b"b", b"c"]), timeout=5))
        elif kind == "stream_unary_future":
            results.append(collect.future(iter([b"a", b"b", b"c"]), timeout=5).result(5))
        else:
            results.append(list(chat(iter([b"x", b"y"]), timeout=5)))
    return results


EXPECTED = {
    "unary_unary": b"good",
    "unary_stream": [b"good", b"good"],
    "stream_unary": b"good:3",
    "stream_unary_future": b"good:3",
    "stream_stream": [b"good:x", b"good:y"],
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_rpc_refused_by_the_server_is_sent_again_on_a_new_pick(refuser_and_good, kind):
    channel, refuser = refuser_and_good
    results = _rounds(channel, refuser, kind)
    assert results == [EXPECTED[kind]] * len(results)
    # round_robin alternates: about every other first attempt met the refuser
    assert refuser.refused >= 2


def test_client_stream_sent_again_replays_its_requests_and_reads_the_iterator_once(
    refuser_and_good,
):
    channel, refuser = refuser_and_good
    collect = channel.stream_unary(f"/{SERVICE}/Collect")
    for _ in range(4):
        pulled = []

        def requests(pulled=pulled):
            for i in range(5):
                pulled.append(i)
                yield b"%d" % i

        assert collect(requests(), timeout=5) == b"good:5"
        assert pulled == [0, 1, 2, 3, 4]
    assert refuser.refused >= 2


def test_rpc_refused_twice_fails_with_c_core_refusal_status():
    """pyxds sends a refused RPC again once (A6 allows more for an RPC that
    never left the client): a second refusal ends it with the refusal."""
    refuser = RefusingServer()
    try:
        with (
            pyxds.insecure_channel(f"static:///{refuser.address}") as channel,
            pytest.raises(grpc.RpcError) as info,
        ):
            list(channel.unary_stream(f"/{SERVICE}/Stream")(b"1", timeout=5, wait_for_ready=True))
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "RST_STREAM" in info.value.details()
        assert refuser.refused == 2
    finally:
        refuser.close()


AIO_EXPECTED = {
    "unary_unary": b"good",
    "unary_stream": [b"good", b"good"],
    "unary_stream_read": [b"good", b"good"],
}
# Not listed: aio calls that stream requests.  When grpcio's aio request
# writer meets the refused stream before the status arrives, grpcio sets the
# call's status to INTERNAL "Internal error from Core" (grpc/aio/_call.py
# _write -> set_internal_error), and that is all the call says: nothing left
# tells that the request never reached the server, so pyxds passes it through
# rather than risk sending it twice.  They are retried when grpcio reports
# the refusal itself (requests replayed as in the sync channel).


def _both_ready(channel) -> bool:
    subchannels = channel.config_dump()["subchannels"]
    return len(subchannels) == 2 and all(s["state"] == "READY" for s in subchannels.values())


@pytest.mark.parametrize("kind", sorted(AIO_EXPECTED))
def test_aio_rpc_refused_by_the_server_is_sent_again_on_a_new_pick(kind):
    refuser = RefusingServer()
    good = Backend("good").start()

    async def main():
        options = [("grpc.lb_policy_name", "round_robin")]
        target = f"static:///{refuser.address},{good.address}"
        async with pyxds_aio.insecure_channel(target, options=options) as channel:
            channel.get_state(try_to_connect=True)
            deadline = time.monotonic() + 5
            while not _both_ready(channel):
                assert time.monotonic() < deadline, "subchannels never both READY"
                await asyncio.sleep(0.01)
            stream = channel.unary_stream(f"/{SERVICE}/Stream")
            results = []
            for _ in range(6):
                if kind == "unary_unary":
                    results.append(await channel.unary_unary(f"/{SERVICE}/Who")(b"", timeout=5))
                elif kind == "unary_stream":
                    results.append([r async for r in stream(b"2", timeout=5)])
                else:
                    call = stream(b"2", timeout=5)
                    got = []
                    while (response := await call.read()) is not grpc.aio.EOF:
                        got.append(response)
                    assert await call.code() is grpc.StatusCode.OK
                    results.append(got)
            return results

    try:
        results = asyncio.run(main())
        assert results == [AIO_EXPECTED[kind]] * 6
        assert refuser.refused >= 2
    finally:
        good.stop()
        refuser.close()
