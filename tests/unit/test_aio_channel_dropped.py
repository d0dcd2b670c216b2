"""A ``pyxds.aio`` channel the program drops is collected at once and
closed where it can be (pyxds/channel/aio_loop_side.py): by its running
loop's next callback when dropped on it, by the lifecycle reaper when
dropped with no loop running.  No connection is made (nothing is called).
The e2e side, beside grpc.aio: tests/e2e/test_aio_dropped_channel.py."""

from __future__ import annotations

import asyncio
import time
import weakref

import pyxds.aio

TARGET = "ipv4:127.0.0.1:9"  # never connected to: no RPC is made


def test_a_channel_dropped_on_its_loop_is_collected_and_closed_by_the_next_callback() -> None:
    """Collected by its reference count alone (its core refers nowhere back
    to it), its core closed by the loop's next callback, not inside the
    ``del``."""

    async def main() -> tuple[bool, bool, bool]:
        channel = pyxds.aio.insecure_channel(TARGET)
        dropped = weakref.ref(channel)
        core = channel._core
        del channel
        collected, closed_at_del = dropped() is None, core.closed
        await asyncio.sleep(0)
        return collected, closed_at_del, core.closed

    assert asyncio.run(main()) == (True, False, True)


def test_a_channel_kept_by_a_multicallable_or_its_method_stays_open() -> None:
    """A stub holds its channel, as grpc.aio's multicallables do; so does
    the method every call object holds (so a call outlives its channel)."""

    async def main() -> list[bool]:
        channel = pyxds.aio.insecure_channel(TARGET)
        core = channel._core
        stub = channel.unary_stream("/s/m")
        del channel
        await asyncio.sleep(0)
        seen = [core.closed]
        method = stub._method  # type: ignore[attr-defined]  # what a call holds
        del stub
        await asyncio.sleep(0)
        seen.append(core.closed)
        del method
        await asyncio.sleep(0)
        seen.append(core.closed)
        return seen

    assert asyncio.run(main()) == [False, False, True]


def test_a_channel_dropped_with_no_loop_running_is_closed_by_the_reaper() -> None:
    channel = pyxds.aio.insecure_channel(TARGET)  # made outside any loop
    core = channel._core
    del channel
    deadline = time.monotonic() + 5
    while not core.closed and time.monotonic() < deadline:
        time.sleep(0.005)
    assert core.closed
