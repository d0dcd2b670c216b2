"""The xDS stream loop leaves grpc.aio's completions to a running
application loop and takes them back when that loop is gone or stuck
(pyxds.xds.completion_reader): the xDS streams keep following the control
plane in every shape of process: aio apps, ``asyncio.run`` twice, several
application loops in threads, a stuck application loop, sync-only use;
with the yield on and off (grpcio's own dispatch)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from channel_fixtures import SERVICE, TARGET, Backend, route, snapshot, wait_until

import pyxds
import pyxds.aio
from pyxds.channel.core import ChannelCore
from pyxds.server import ManagementServer
from pyxds.xds import completion_reader, stream_loop

WHO = f"/{SERVICE}/Who"


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backends():
    started = [Backend(f"y{i}").start() for i in range(2)]
    yield started
    for b in started:
        b.stop()


@pytest.fixture(params=[True, False], ids=["yield", "no-yield"])
def yielding(request, monkeypatch):
    """A stream loop started afresh with the yield on or off."""
    assert wait_until(lambda: stream_loop._loop is None, 10), "a stream loop outlived its users"
    monkeypatch.setattr(completion_reader, "ENABLED", request.param)
    yield request.param
    assert wait_until(lambda: stream_loop._loop is None, 10)


def _to(server, backends, index: int) -> None:
    server.set_snapshot(
        snapshot([route(prefix="", cluster="c")], {"c": [[backends[index].address]]})
    )


def _yielded() -> bool:
    reader = completion_reader.current()
    return reader is not None and reader.yielded


async def _answer(call) -> str | None:
    try:
        return (await call(b"", timeout=2)).decode()
    except Exception:
        return None


async def _until(call, want: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await _answer(call) == want:
            return True
        await asyncio.sleep(0.02)
    return False


async def _follows_updates(server, backends, bootstrap) -> bool:
    """An aio channel follows y0 -> y1 -> y0 while its loop runs; whether
    the stream loop was yielded then (before the channel closes: its
    close() waits on the stream loop, the application loop blocked)."""
    async with pyxds.aio.insecure_channel(TARGET, bootstrap=bootstrap) as channel:
        who = channel.unary_unary(WHO)
        assert await _until(who, "y0")
        _to(server, backends, 1)
        assert await _until(who, "y1")
        _to(server, backends, 0)
        assert await _until(who, "y0")
        return _yielded()


def test_aio_channel_follows_updates_while_the_stream_loop_yields(server, backends, yielding):
    _to(server, backends, 0)

    assert asyncio.run(_follows_updates(server, backends, server.bootstrap())) is yielding


def test_stream_loop_takes_completions_back_after_asyncio_run_returns(server, backends, yielding):
    """asyncio.run twice in one process; between the runs a sync channel
    (the same stream loop) still follows the control plane."""
    _to(server, backends, 0)
    bootstrap = server.bootstrap()
    sync = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    try:
        who = sync.unary_unary(WHO)
        assert wait_until(lambda: _sync_answer(who) == "y0", 10)
        asyncio.run(_follows_updates(server, backends, bootstrap))
        # the first application loop is closed: the stream loop reads again
        assert wait_until(lambda: not _yielded(), 5)
        _to(server, backends, 1)
        assert wait_until(lambda: _sync_answer(who) == "y1", 10)
        _to(server, backends, 0)
        assert wait_until(lambda: _sync_answer(who) == "y0", 10)
        asyncio.run(_follows_updates(server, backends, bootstrap))
        assert wait_until(lambda: not _yielded(), 5)
    finally:
        sync.close()


def test_aio_close_takes_the_completions_back_while_it_blocks(
    server, backends, yielding, monkeypatch
):
    """``close()`` of an aio channel blocks its loop until the xDS client's
    ADS stream has closed, which needs grpc.aio's completions read: the
    stream loop takes them back as the close starts (not at its next look,
    here never: TICK is a minute), and the ADS stream ends."""
    monkeypatch.setattr(completion_reader, "TICK", 60.0)
    monkeypatch.setattr(completion_reader, "TICK_MAX", 60.0)
    _to(server, backends, 0)
    bootstrap = server.bootstrap()
    reading_when_closing: list[bool] = []
    close = ChannelCore.close

    def close_seen(core, *args, **kwargs):
        # on the application loop's thread, that loop now blocked
        reading_when_closing.append(wait_until(lambda: not _yielded(), 5))
        return close(core, *args, **kwargs)

    monkeypatch.setattr(ChannelCore, "close", close_seen)

    async def main() -> bool:
        channel = pyxds.aio.insecure_channel(TARGET, bootstrap=bootstrap)
        assert await _until(channel.unary_unary(WHO), "y0")
        yielded_before = _yielded()
        await channel.close()
        return yielded_before

    assert asyncio.run(main()) is yielding
    assert reading_when_closing == [True]
    assert wait_until(lambda: server.stream_count == 0, 5)


def test_aio_channels_on_loops_in_two_threads_follow_updates(server, backends, yielding):
    """Two application loops in two threads: the stream loop stays yielded
    while either runs; the one left running still follows the control plane."""
    _to(server, backends, 0)
    bootstrap = server.bootstrap()
    first_up = threading.Event()
    first_may_end = threading.Event()
    results: dict[str, object] = {}

    async def first():
        async with pyxds.aio.insecure_channel(TARGET, bootstrap=bootstrap) as channel:
            who = channel.unary_unary(WHO)
            results["first y0"] = await _until(who, "y0")
            first_up.set()
            while not first_may_end.is_set():
                await asyncio.sleep(0.01)
            results["first later"] = await _answer(who)

    async def second():
        async with pyxds.aio.insecure_channel(TARGET, bootstrap=bootstrap) as channel:
            who = channel.unary_unary(WHO)
            results["second y0"] = await _until(who, "y0")
            _to(server, backends, 1)
            results["second y1"] = await _until(who, "y1")
            first_may_end.set()
            results["yielded while two run"] = _yielded()
            while thread.is_alive():
                await asyncio.sleep(0.01)
            # the first loop is gone; this one still reads every completion
            _to(server, backends, 0)
            results["second y0 again"] = await _until(who, "y0")
            results["yielded while one runs"] = _yielded()

    thread = threading.Thread(target=lambda: asyncio.run(first()), daemon=True)
    thread.start()
    assert first_up.wait(15)
    asyncio.run(asyncio.wait_for(second(), 30))
    thread.join(10)
    assert results == {
        "first y0": True,
        "second y0": True,
        "second y1": True,
        "yielded while two run": yielding,
        "first later": "y1",
        "second y0 again": True,
        "yielded while one runs": yielding,
    }
    assert wait_until(lambda: not _yielded(), 5)


def test_xds_update_arrives_while_the_application_loop_is_stuck(server, backends, yielding):
    """The application's loop blocks (a long computation) after its aio
    channel ran: the stream loop still reads the ADS response (within
    TICK of its arrival), and a sync channel on the same stream loop sees
    the new route while the application loop is still stuck."""
    _to(server, backends, 0)
    bootstrap = server.bootstrap()
    sync = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    try:
        who = sync.unary_unary(WHO)
        assert wait_until(lambda: _sync_answer(who) == "y0", 10)

        async def main():
            async with pyxds.aio.insecure_channel(TARGET, bootstrap=bootstrap) as channel:
                assert await _until(channel.unary_unary(WHO), "y0")
                assert wait_until(lambda: _yielded() is yielding, 5)
                # stuck: no await until the sync channel saw the update
                _to(server, backends, 1)
                seen = wait_until(lambda: _sync_answer(who) == "y1", 10)
                # the stream loop took the completions back for the stall
                # (not one read per look)...
                assert not _yielded()
                # ...and yields again once the loop answers its probe
                deadline = time.monotonic() + 5
                while _yielded() is not yielding and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert _yielded() is yielding
                return seen

        assert asyncio.run(main())
    finally:
        sync.close()


def test_sync_only_process_never_yields(server, backends, yielding):
    _to(server, backends, 0)
    sync = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap())
    try:
        who = sync.unary_unary(WHO)
        assert wait_until(lambda: _sync_answer(who) == "y0", 10)
        _to(server, backends, 1)
        assert wait_until(lambda: _sync_answer(who) == "y1", 10)
        assert not _yielded()
    finally:
        sync.close()


def _sync_answer(who) -> str | None:
    try:
        return who(b"", timeout=2).decode()
    except Exception:
        return None
