"""LoopInbox: work posted to an event loop from other threads runs there in
order, one wake-up (``call_soon_threadsafe``) per batch; on the loop it runs
at once; a closed loop drops it.  And the asyncio subchannel transport that
uses it: N transports made and connected from another thread (an xDS
update) cost the loop one wake-up per batch, not two per transport, and each
grpc.aio channel is still made on the loop and asked to connect."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from pyxds.channel.loop_inbox import LoopInbox
from pyxds.channel.subchannel import AioTransport, subchannel_options


class _CountingLoop(asyncio.SelectorEventLoop):
    """Counts ``call_soon_threadsafe`` (each one a self-pipe write)."""

    def __init__(self) -> None:
        super().__init__()
        self.wakeups = 0

    def call_soon_threadsafe(self, *args: Any, **kwargs: Any) -> Any:
        self.wakeups += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def _turns(loop: asyncio.AbstractEventLoop, n: int = 3) -> None:
    async def spin() -> None:
        for _ in range(n):
            await asyncio.sleep(0)

    loop.run_until_complete(spin())


def _from_thread(fn: Callable[[], None]) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join(10)
    assert not t.is_alive()


def test_posts_from_another_thread_run_on_the_loop_in_order_with_one_wakeup_per_batch():
    loop = _CountingLoop()
    try:
        inbox = LoopInbox(loop)
        ran: list[tuple[int, int]] = []

        def post_all() -> None:
            for i in range(100):
                inbox.run(lambda i=i: ran.append((i, threading.get_ident())))

        _from_thread(post_all)
        assert ran == [], "nothing runs off the loop"
        assert loop.wakeups == 1
        _turns(loop)
        me = threading.get_ident()  # run_until_complete runs the loop on this thread
        assert ran == [(i, me) for i in range(100)]
        _from_thread(lambda: inbox.run(lambda: ran.append((100, threading.get_ident()))))
        assert loop.wakeups == 2, "a post after the batch was taken wakes the loop again"
        _turns(loop)
        assert ran[-1] == (100, me)
    finally:
        loop.close()


def test_a_post_made_on_the_running_loop_runs_at_once():
    loop = asyncio.new_event_loop()
    try:
        inbox = LoopInbox(loop)
        ran: list[str] = []

        async def on_loop() -> None:
            inbox.run(lambda: ran.append("now"))
            ran.append("after")

        loop.run_until_complete(on_loop())
        assert ran == ["now", "after"]
    finally:
        loop.close()


def test_a_raising_callable_is_logged_and_the_rest_of_its_batch_runs(caplog):
    loop = asyncio.new_event_loop()
    try:
        inbox = LoopInbox(loop)
        ran: list[int] = []

        def boom() -> None:
            raise ValueError("boom")

        def post_all() -> None:
            inbox.run(lambda: ran.append(1))
            inbox.run(boom)
            inbox.run(lambda: ran.append(2))

        _from_thread(post_all)
        with caplog.at_level(logging.ERROR, logger="pyxds.channel.loop_inbox"):
            _turns(loop)
        assert ran == [1, 2]
        assert any("boom" in (r.exc_text or "") for r in caplog.records)
    finally:
        loop.close()


def test_posts_to_a_closed_loop_are_dropped_quietly():
    loop = asyncio.new_event_loop()
    inbox = LoopInbox(loop)
    loop.close()
    ran: list[int] = []
    _from_thread(lambda: inbox.run(lambda: ran.append(1)))
    _from_thread(lambda: inbox.run(lambda: ran.append(2)))
    assert ran == []


@pytest.mark.parametrize("shared", [True, False])
def test_aio_transports_made_and_connected_off_the_loop_wake_it_once_and_each_connects(shared):
    """Ten transports made and connected from another thread (as an xDS
    update does): with the channel's shared inbox one wake-up in all (not
    two per transport); each grpc.aio channel is made on the loop, asked to
    connect once, and reports CONNECTING (or a failure) from there."""
    loop = _CountingLoop()
    try:
        inbox = LoopInbox(loop) if shared else None
        reports: list[list[grpc.ChannelConnectivity]] = [[] for _ in range(10)]
        transports: list[AioTransport] = []
        options = subchannel_options(None)

        def make_and_connect() -> None:
            for i in range(10):
                # nothing listens on port 1 of 127.0.0.1: refused, loopback only
                t = AioTransport(loop, "127.0.0.1:1", None, options, None, reports[i].append, inbox)
                t.connect()
                transports.append(t)

        _from_thread(make_and_connect)
        assert all(t.channel is None for t in transports), "made on the loop, not here"
        assert loop.wakeups == (1 if shared else 10)
        if inbox is not None:  # connect() before the channel is made posts nothing more
            assert len(inbox._queue) == 10, "one callable per transport, its creation"

        async def until_left_idle() -> None:
            for _ in range(500):
                if all(any(s is not grpc.ChannelConnectivity.IDLE for s in r) for r in reports):
                    return
                await asyncio.sleep(0.01)

        loop.run_until_complete(until_left_idle())
        for t, r in zip(transports, reports, strict=True):
            assert t.channel is not None
            assert any(s is not grpc.ChannelConnectivity.IDLE for s in r), r
        asked = loop.wakeups
        for t in transports:  # made now: connect() from another thread hops again
            _from_thread(t.connect)
        assert loop.wakeups == asked + (1 if shared else 10)
        for t in transports:
            t.retire()
        _turns(loop, 10)
    finally:
        loop.close()
