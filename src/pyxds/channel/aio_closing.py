"""The tasks of a ``pyxds.aio`` channel's connections being closed.

A subchannel's ``grpc.aio`` channel is closed on the event loop
(:meth:`pyxds.channel.subchannel.AioTransport._close_channel`), and its
connectivity watch, a task, ends as C-core's SHUTDOWN ends its wait:
within ms of the close once the channel's calls are freed.  The channel's
:meth:`~pyxds.channel.aio.AioXdsChannel.close` returns once those watches
are done, one still running after a bound cancelled (it then leaves its
wait to the loop's end, :mod:`pyxds.channel.aio_loop_end`): a program that
closes its own event loop right after (``loop.run_until_complete(main())``,
then ``loop.close()``) finds no task of the channel pending (each was
reported "Task was destroyed but it is pending!", or its grpcio watch
stranded), as after ``grpc.aio``'s own ``close()``.

One set per channel, holding only the watches of transports being closed
(each leaves it as it ends): nothing per open connection, and one bounded
wait for all of them, not a timer each (1000 endpoints close at once).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["ClosingTasks"]


class ClosingTasks:
    """The closing tasks of one channel's transports (module docstring)."""

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def add(self, task: asyncio.Task[Any]) -> None:
        tasks = self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def ended(self, timeout: float, give_up: str) -> None:
        """Return once every task is done, those added meanwhile too;
        those still running after ``timeout``
        seconds are cancelled with the message ``give_up``, and given as
        long again to end."""
        tasks = self._tasks
        if not tasks:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while tasks:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.wait(set(tasks), timeout=remaining)
        if tasks:
            running = set(tasks)
            for task in running:
                task.cancel(give_up)
            await asyncio.wait(running, timeout=timeout)
