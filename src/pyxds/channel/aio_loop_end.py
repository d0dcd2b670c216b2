"""Work for the end of an event loop, held by no task.

``asyncio.run`` ends its loop in three steps: it cancels every task and
runs the loop until they are all done, then closes every async generator
the loop saw start and not finish (``loop.shutdown_asyncgens()``: each one's
``aclose()``, run on the loop), then closes the loop.  A pending task is
how the first step's work is held; a program that closes its loop itself
(``loop.run_until_complete(main())`` then ``loop.close()``) has no first
step, and each task still pending there is reported as "Task was destroyed
but it is pending!".  A closed ``pyxds.aio`` channel leaves no task
(:meth:`pyxds.channel.aio.AioXdsChannel.close`), yet one thing of it may
only be done at the loop's end: reading the SHUTDOWN of a subchannel's
``grpc.aio`` channel whose calls the application still held at the close
(C-core's channel shuts down once they are freed, e.g. by a task the loop's
end cancels; its completion for a closed loop strands grpcio's watch,
docs/traps.md).  :func:`at_loop_end` holds such work in a suspended async
generator instead: ``asyncio.run``'s second step runs it, after the tasks
let go of what they held; a loop closed without that step drops it
silently (the loop's finalizer hook does nothing for a closed loop).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

__all__ = ["at_loop_end"]


async def _until_loop_end(fn: Callable[[], Awaitable[None]]) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await fn()


def at_loop_end(fn: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """Run ``fn()`` on the running loop at its end (module docstring), held
    by nothing but what holds the returned ``drop``.  ``drop()``: ``fn`` is
    not needed any more; it runs it at once, and ``fn`` must then return
    without awaiting (e.g. the wait it was for ended).  Called on the loop."""
    agen = _until_loop_end(fn)
    _step(agen.asend(None))  # started on the loop: the loop's to close at its end

    def drop() -> None:
        _step(agen.aclose())

    return drop


def _step(awaitable: Any) -> None:
    """Run ``awaitable`` to its end now, where it needs no loop callback:
    one that awaits is closed where it waits; one of a generator already
    closing (the loop's end runs it) or closed is left alone."""
    try:
        awaitable.send(None)
    except (StopIteration, StopAsyncIteration, RuntimeError):
        return
    awaitable.close()
