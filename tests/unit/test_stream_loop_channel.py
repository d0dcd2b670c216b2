"""``stream_loop.LoopChannel.close``: waiting (a transport's close) or not
(an ORCA side connection closed from a channel's serializer, which must not
block): either way the readers end first, then the channel closes, then
``close_done`` is set, the closed channel is dropped (grpc.aio's poller
thread lives while any of its channels does) and the loop's user is
released once."""

from __future__ import annotations

import asyncio
import threading

from pyxds.xds import stream_loop


class FakeAioChannel:
    """Records the order of events; its close takes a little while."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def close(self) -> None:
        await asyncio.sleep(0.05)
        self.log.append("channel closed")


def _reader(log: list[str], stop: asyncio.Event):
    async def read() -> None:
        await stop.wait()
        log.append("reader ended")

    return read()


def _made(log: list[str]) -> stream_loop.LoopChannel:
    """A LoopChannel whose (fake) channel has been made on the loop."""
    made = threading.Event()
    side = stream_loop.LoopChannel(lambda: FakeAioChannel(log), lambda _channel: made.set())
    assert made.wait(5)
    return side


def test_close_without_waiting_ends_readers_then_the_channel_then_sets_close_done():
    log: list[str] = []
    side = _made(log)
    users = stream_loop._users
    stop_box: list[asyncio.Event] = []
    spawned = threading.Event()

    def spawn() -> None:
        stop = asyncio.Event()
        stop_box.append(stop)
        side.spawn(_reader(log, stop))
        spawned.set()

    side.post(spawn)
    assert spawned.wait(5)
    side.close(before=lambda: stop_box[0].set(), wait=False)
    assert side.closed and not side.close_done.is_set()  # returned at once
    assert side.close_done.wait(5)
    assert log == ["reader ended", "channel closed"]
    assert side.channel is None
    assert stream_loop._users == users - 1
    side.close(wait=False)  # idempotent: released once
    assert stream_loop._users == users - 1


def test_close_waiting_returns_once_closed_and_releases_once():
    log: list[str] = []
    side = _made(log)
    users = stream_loop._users
    side.close()
    assert side.close_done.is_set() and log == ["channel closed"]
    assert stream_loop._users == users - 1
