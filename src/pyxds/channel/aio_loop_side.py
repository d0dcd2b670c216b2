"""What a ``pyxds.aio`` channel's core calls back into, held apart from the
channel, so that a channel the program dropped is collected and closed as
a ``grpc.aio`` one is (docs/channel.md, "Closing, and programs that never close").

The core (:class:`pyxds.channel.core.ChannelCore`) makes the subchannels'
transports and runs its clock's zero-delay callbacks through two callables
it keeps for its life; it is kept alive by pyxds's threads (the
serializer's, the timer's, the xDS client's) while it is open.  Were those
callables the channel's bound method and a closure over it, the channel
would stay reachable from those threads: never collected, its ``__del__``
never run, its connections open until the interpreter exits.  So they are
a :class:`LoopSide`'s: the event loop the channel is bound to, its
:class:`~pyxds.channel.loop_inbox.LoopInbox`, its hold on grpcio's asyncio
engine and its closing transports' tasks, shared by the channel and its
core; nothing in it refers to the channel.

A dropped channel's ``__del__`` closes nothing itself (it may run on any
thread, inside any callback: :mod:`pyxds.channel.lifecycle`, rule 2); it
makes a :class:`Dropped`, the close of its core and then of its hold on
grpcio's engine, as ``grpc.aio``'s ``Channel.__del__`` closes its channel:

* dropped on its loop while the loop runs (a coroutine's channel), the
  loop's next callback runs it (``loop.call_soon``: a deque append), there,
  as ``close()`` would, so the transports' ``grpc.aio`` channels are closed
  at once, before an ending ``asyncio.run`` cancels the loop's tasks: their
  watches, cancelled then, read the SHUTDOWN of a closed channel, and no
  task is left pending;
* dropped anywhere else (another thread, no loop running), the lifecycle
  reaper runs it: the core's close posts the transports' closes to the
  loop through the inbox (dropped when the loop has closed: a ``grpc.aio``
  channel whose loop closed keeps its connection until exit, its watch left
  waiting by the loop's end).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from pyxds.channel.aio_closing import ClosingTasks
from pyxds.channel.aio_engine import EngineHold
from pyxds.channel.loop_inbox import LoopInbox
from pyxds.channel.subchannel import AioTransport
from pyxds.xds.completion_reader import app_loop_blocks

if TYPE_CHECKING:
    from pyxds.channel.core import ChannelCore

__all__ = ["Dropped", "LoopSide"]


class LoopSide:
    """A ``pyxds.aio`` channel's event-loop side (module docstring)."""

    __slots__ = ("loop", "inbox", "engine", "closing", "_sub_options", "_compression")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None,
        sub_options: Sequence[tuple[str, Any]],
        compression: grpc.Compression | None,
    ) -> None:
        #: the loop the channel is bound to (its first use's), or None yet
        self.loop = loop
        #: work for the loop from other threads (the subchannels' grpc.aio
        #: channels are made there), one wake-up of the loop per batch
        self.inbox: LoopInbox | None = None
        #: grpcio's asyncio engine, held from the first connection to the
        #: close: else every failed attempt to a plain target shut it down
        #: and the next built it again (pyxds.channel.aio_engine)
        self.engine = EngineHold()
        #: the watches of its closed transports (close() returns once they end)
        self.closing = ClosingTasks()
        self._sub_options = sub_options
        self._compression = compression

    def make_transport(
        self,
        address: str,
        credentials: Any,
        on_state: Callable[[grpc.ChannelConnectivity], None],
    ) -> AioTransport:
        """The core's transport factory: a ``grpc.aio`` channel to
        ``address`` on the channel's loop."""
        loop = self.loop
        assert loop is not None, "pyxds aio channel used before any event loop"
        inbox = self.inbox
        if inbox is None or inbox.loop is not loop:
            inbox = self.inbox = LoopInbox(loop)
        # made to connect at once (SubchannelCore.connect): the engine
        # taken, the channel made and asked to connect in one hop
        return AioTransport(
            loop,
            address,
            credentials,
            self._sub_options,
            self._compression,
            on_state,
            inbox,
            self.closing,
            prepare=None if self.engine.held else self.engine.take,
            connect=True,
        )

    def close(self, core: ChannelCore) -> None:
        """Close ``core`` on the channel's loop, without awaiting: its
        transports' ``grpc.aio`` channels are closed here, at once (their
        watches end as C-core's SHUTDOWN comes); then the engine is let go.
        The close waits for the xDS client's ADS stream, whose completions
        this loop reads while the stream loop yields them to it
        (pyxds.xds.completion_reader): the stream loop reads meanwhile."""
        resume = app_loop_blocks()
        try:
            core.close()
        finally:
            resume()
            # the transports' grpc.aio channels, closing, hold it until they end
            self.engine.let_go()
        inbox = self.inbox
        if inbox is not None and inbox.loop is asyncio._get_running_loop():
            inbox.drain()  # closes posted from the serializer's thread: run now

    def defer(self, fn: Callable[[], None]) -> bool:
        """The channel clock's zero-delay callbacks made on the channel's
        loop run on it, after the running callback (``call_soon``): e.g. the
        connection ring_hash asks for from a pick is made at once on the loop
        where its grpc.aio channel must be made anyway, not after two thread
        hops (the timer thread, then ``call_soon_threadsafe`` back), each
        waiting for the other thread's Python to let go of the GIL.  From
        any other thread: False (the timer thread runs it)."""
        loop = self.loop
        if loop is None or asyncio._get_running_loop() is not loop:
            return False
        loop.call_soon(fn)
        return True


class Dropped:
    """A dropped channel's close (module docstring): its core's, then the
    engine let go; on the channel's loop when it was dropped there."""

    __slots__ = ("_core", "_side")

    def __init__(self, core: ChannelCore, side: LoopSide) -> None:
        self._core = core
        self._side = side

    @property
    def closed(self) -> bool:
        return self._core.closed

    def close(self) -> None:
        """The reaper's close (any thread but the loop's): what it posts to
        the loop runs there (dropped when the loop closed first)."""
        try:
            self._core.close()
        finally:
            # the transports' grpc.aio channels, closing, hold it until they end
            self._side.engine.let_go()

    def close_on_loop(self) -> None:
        """The close, as a callback of the channel's loop."""
        if not self._core.closed:
            self._side.close(self._core)
