"""grpcio's asyncio engine, held up while a ``pyxds.aio`` channel is open
(issue 18: CPU per failed connection attempt).

grpcio 1.85 counts the ``grpc.aio`` channels (and servers) alive: the first
one starts its asyncio engine (``grpc_init``, a completion queue, a poller
thread and its wake-up socket), and when the last one is deallocated it
shuts them down (``grpc_shutdown``, the poller thread joined).  A
``grpc.aio`` channel holds the engine from its construction to its end.

A ``pyxds.aio`` channel makes a ``grpc.aio`` channel per connection attempt
(:class:`pyxds.channel.subchannel.AioTransport`) and lets it go when the
attempt fails.  To a plain target (no xDS stream loop, which holds the
engine while it runs) with no other ``grpc.aio`` channel in the process,
every failed attempt left none alive: grpcio shut its engine down and the
next attempt built it again (measured against a refusing port, 20 ms
backoff: 103 poller threads started in 2 s, ~10x the CPU of a ``grpc.aio``
channel's attempts).  So a ``pyxds.aio`` channel holds the engine as a
``grpc.aio`` one does: :meth:`EngineHold.take` with its first subchannel
connection (on its event loop, where grpcio binds the loop it reads
completions on), :meth:`EngineHold.let_go` at its ``close()``, or when the
channel is collected unclosed (as ``grpc.aio.Channel``'s deallocation
does).  An open channel at interpreter exit holds it as an open
``grpc.aio`` channel does: the poller thread is a daemon.
"""

from __future__ import annotations

import sys

import grpc.aio

__all__ = ["EngineHold"]


class EngineHold:
    """One ``pyxds.aio`` channel's hold on grpcio's asyncio engine (module
    docstring)."""

    __slots__ = ("_held", "_ended")

    def __init__(self) -> None:
        self._held = False
        #: let go for good: a :meth:`take` queued before it does nothing
        self._ended = False

    @property
    def held(self) -> bool:
        return self._held

    def take(self) -> None:
        """Hold the engine (once); call on the channel's event loop."""
        if self._held or self._ended:
            return
        grpc.aio.init_grpc_aio()
        self._held = True

    def let_go(self) -> None:
        """Let the engine go (once, for good); any thread."""
        self._ended = True
        if not self._held:
            return
        self._held = False
        grpc.aio.shutdown_grpc_aio()

    def __del__(self) -> None:
        # the channel was collected unclosed: as grpc.aio.Channel's end; not
        # while the interpreter finalizes (grpcio's module state may be gone)
        if getattr(self, "_held", False) and not sys.is_finalizing():
            try:
                self.let_go()
            except Exception:  # nothing to report it to from a finalizer
                pass
