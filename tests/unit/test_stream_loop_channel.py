"""``stream_loop.LoopChannel.close``: waiting (a transport's close) or not
(an ORCA side connection closed from a channel's serializer, which must not
block): either way the readers end first, then the channel closes, then
``close_done`` is set, the closed channel is dropped (grpc.aio's poller
thread lives while any of its channels does) and the loop's user is
released once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import grpc

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


class TrackedReader:
    """A reader without a task (``LoopChannel.track``): ends a little after
    its call is cancelled (``before``), as a UnaryStreamReader does."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self._ended: asyncio.Future[None] | None = None

    def done(self) -> bool:
        return self._ended is not None and self._ended.done()

    def ended(self) -> asyncio.Future[None]:
        if self._ended is None:
            self._ended = asyncio.get_running_loop().create_future()
        return self._ended

    def cancel(self) -> None:  # on the loop
        ended = self.ended()

        def end() -> None:
            self.log.append("reader ended")
            ended.set_result(None)

        asyncio.get_running_loop().call_later(0.1, end)  # after the channel would have closed


def test_close_waits_for_a_tracked_reader_then_closes_the_channel():
    log: list[str] = []
    side = _made(log)
    reader = TrackedReader(log)
    tracked = threading.Event()

    def track() -> None:
        side.track(reader)
        tracked.set()

    side.post(track)
    assert tracked.wait(5)
    side.close(before=reader.cancel)
    assert log == ["reader ended", "channel closed"]


def test_close_waiting_returns_once_closed_and_releases_once():
    log: list[str] = []
    side = _made(log)
    users = stream_loop._users
    side.close()
    assert side.close_done.is_set() and log == ["channel closed"]
    assert stream_loop._users == users - 1


def _count_handoffs(monkeypatch) -> list[object]:
    """Records each hand-off to the stream loop (``stream_loop.post``)."""
    posted: list[object] = []
    real = stream_loop.post

    def counting(loop, fn):
        posted.append(fn)
        return real(loop, fn)

    monkeypatch.setattr(stream_loop, "post", counting)
    return posted


def test_a_lazy_channel_is_made_with_its_first_post_in_one_handoff(monkeypatch):
    posted = _count_handoffs(monkeypatch)
    log: list[str] = []
    side = stream_loop.LoopChannel(lambda: log.append("made") or FakeAioChannel(log), lazy=True)
    assert posted == [] and side.channel is None  # nothing on the loop yet
    ran = threading.Event()

    def first() -> None:
        log.append("first: channel made" if side.channel is not None else "first: none")
        ran.set()

    assert side.post(first)
    assert ran.wait(5)
    assert len(posted) == 1  # the make and the first callback: one hand-off
    assert log == ["made", "first: channel made"]
    again = threading.Event()
    side.post(again.set)  # later posts are plain: never made again
    assert again.wait(5) and log == ["made", "first: channel made"] and len(posted) == 2
    side.close()
    assert side.close_done.is_set() and log[-1] == "channel closed"


def test_a_lazy_channel_closed_before_any_post_is_never_made():
    log: list[str] = []
    users = stream_loop._users
    side = stream_loop.LoopChannel(lambda: log.append("made") or FakeAioChannel(log), lazy=True)
    side.close()
    assert side.close_done.is_set() and side.channel is None
    ran = threading.Event()
    side.post(ran.set)  # (the loop may be gone: then nothing runs, as for any closed user)
    ran.wait(0.5)
    assert "made" not in log
    assert stream_loop._users == users


def test_a_lazy_channel_whose_make_raises_still_runs_the_first_callback():
    seen: list[object] = []
    ran = threading.Event()

    def make() -> object:
        raise RuntimeError("bad option")

    side = stream_loop.LoopChannel(make, lazy=True)

    def first() -> None:
        seen.append(side.channel)  # a reader finds no channel and ends (orca_oob retries)
        ran.set()

    side.post(first)
    assert ran.wait(5) and seen == [None]
    side.close()


class StatefulChannel(FakeAioChannel):
    """A FakeAioChannel with connectivity (``get_state`` and
    ``wait_for_state_change``, the grpc.aio API) that the test moves."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.state = grpc.ChannelConnectivity.IDLE
        self.changed: asyncio.Event | None = None

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.state

    async def wait_for_state_change(self, last: grpc.ChannelConnectivity) -> None:
        while self.state is last:
            self.changed = asyncio.Event()
            await self.changed.wait()

    def move(self, state: grpc.ChannelConnectivity) -> None:  # on the loop
        self.state = state
        if self.changed is not None:
            self.changed.set()


def test_on_lost_is_called_once_when_the_channel_leaves_ready_and_never_after_close():
    """The connection the side's calls ran on is gone when its channel
    leaves READY after it was READY (not while it first connects); a side
    closed first never reports it (its watch ends with the close)."""
    states = grpc.ChannelConnectivity
    log: list[str] = []
    lost: list[stream_loop.LoopChannel] = []
    heard = threading.Event()
    channels: list[StatefulChannel] = []

    def make() -> StatefulChannel:
        channels.append(StatefulChannel(log))
        return channels[-1]

    def on_lost(side: stream_loop.LoopChannel) -> None:
        lost.append(side)
        heard.set()

    def steps(side: stream_loop.LoopChannel, *moves: grpc.ChannelConnectivity) -> None:
        done = threading.Event()

        async def go() -> None:
            for state in moves:
                channels[-1].move(state)
                await asyncio.sleep(0.01)
            done.set()

        def start() -> None:
            side.loop.create_task(go())

        side.post(start)
        assert done.wait(5)

    side = stream_loop.LoopChannel(make, lazy=True, on_lost=on_lost)
    steps(side, states.CONNECTING, states.TRANSIENT_FAILURE, states.CONNECTING, states.READY)
    assert lost == []
    steps(side, states.IDLE)
    assert heard.wait(5) and lost == [side]
    heard.clear()
    steps(side, states.READY, states.IDLE)
    assert lost == [side]  # once
    side.close(wait=True)
    other = stream_loop.LoopChannel(make, lazy=True, on_lost=on_lost)
    steps(other, states.READY)
    other.close(wait=True)
    moved = threading.Event()

    def move_closed() -> None:
        channels[-1].move(states.IDLE)
        moved.set()

    stream_loop.post(other.loop, move_closed)
    assert moved.wait(5)
    assert not heard.wait(0.1)  # bounded: a report would come from that same loop turn
    assert lost == [side]


def test_a_watched_channel_keeps_no_task_on_the_loop():
    """The watch (``on_lost``) waits without an asyncio Task (issue 18:
    ~0.5 KB each, one per WRR+OOB endpoint); closing the channel ends it
    without a report."""
    log: list[str] = []
    channels: list[StatefulChannel] = []
    lost: list[stream_loop.LoopChannel] = []

    def make() -> StatefulChannel:
        channels.append(StatefulChannel(log))
        return channels[-1]

    side = stream_loop.LoopChannel(make, lazy=True, on_lost=lost.append)
    seen: list[int] = []
    looked = threading.Event()

    def count() -> None:
        seen.append(len(asyncio.all_tasks(side.loop)))
        looked.set()

    side.post(count)
    assert looked.wait(5)
    assert seen == [0]  # made and watched: no task
    assert channels[-1].changed is not None  # the wait is pending
    side.close(wait=True)
    assert channels[-1].changed is not None and lost == []


def test_a_post_from_the_loop_thread_runs_in_order_without_a_wake_up(monkeypatch):
    # on the loop's own thread a post is queued behind what was posted
    # before, in order, without call_soon_threadsafe (a write to the loop's
    # wake-up socket, and a loop pass to read it); from another thread it
    # wakes the loop as before
    log: list[str] = []
    side = _made(log)
    loop = side.loop
    woken: list[str] = []
    real = loop.call_soon_threadsafe

    def counting(callback: Callable[..., object], *args: object) -> object:
        woken.append(threading.current_thread().name)
        return real(callback, *args)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    done = threading.Event()

    def on_loop() -> None:
        woken.clear()  # the post that brought us here
        stream_loop.post(loop, lambda: log.append("first"))
        stream_loop.post(loop, lambda: log.append("second"))
        stream_loop.post(loop, done.set)
        log.append("poster returned")

    assert stream_loop.post(loop, on_loop)
    assert done.wait(5)
    assert log == ["poster returned", "first", "second"]
    assert woken == []
    assert stream_loop.post(loop, lambda: None)
    assert woken == [threading.current_thread().name]
    side.close(wait=True)
