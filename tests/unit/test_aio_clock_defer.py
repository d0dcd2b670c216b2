"""pyxds.aio: the channel clock's zero-delay callbacks made on the channel's
event loop run on that loop, not through the timer thread (issue 18: a
ring_hash pick on the loop that asks for a connection; the grpc.aio channel
must be made on the loop anyway)."""

from __future__ import annotations

import asyncio
import threading

import pyxds.aio


def test_a_zero_delay_callback_made_on_the_channels_loop_runs_there_after_the_caller_returns():
    async def main() -> None:
        channel = pyxds.aio.insecure_channel("ipv4:127.0.0.1:1")
        try:
            clock = channel._core.clock
            loop = asyncio.get_running_loop()
            ran_on: list[int] = []
            done = asyncio.Event()

            def callback() -> None:
                ran_on.append(threading.get_ident())
                done.set()

            clock.call_later(0, callback)
            assert ran_on == []  # deferred: never on the caller's stack
            await asyncio.wait_for(done.wait(), 5)
            assert ran_on == [threading.get_ident()]

            cancelled: list[int] = []
            clock.call_later(0, lambda: cancelled.append(1)).cancel()
            await asyncio.sleep(0.01)
            assert cancelled == []

            # made on another thread: the timer thread runs it, as before
            names: list[str] = []
            other = threading.Event()

            def elsewhere() -> None:
                def record() -> None:
                    names.append(threading.current_thread().name)
                    other.set()

                clock.call_later(0, record)

            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join(5)
            assert await loop.run_in_executor(None, other.wait, 5)
            assert names == ["pyxds-timer"]
        finally:
            await channel.close()

    asyncio.run(main())


def test_a_callback_deferred_on_the_loop_does_not_run_once_the_channel_is_closed():
    async def main() -> None:
        channel = pyxds.aio.insecure_channel("ipv4:127.0.0.1:1")
        ran: list[int] = []
        channel._core.clock.call_later(0, lambda: ran.append(1))
        await channel.close()
        await asyncio.sleep(0.01)
        assert ran == []

    asyncio.run(main())
