"""The tasks a ``pyxds.aio`` channel's close awaits (``ClosingTasks``) and
the work it leaves to its event loop's end (``at_loop_end``): on a real
event loop, no sockets."""

from __future__ import annotations

import asyncio
import gc

from pyxds.channel.aio_closing import ClosingTasks
from pyxds.channel.aio_loop_end import at_loop_end

GIVE_UP = "given up"


def test_closing_tasks_end_returns_once_every_task_ended_those_added_meanwhile_too():
    async def main() -> list[str]:
        closing = ClosingTasks()
        ended: list[str] = []

        async def watch(name: str, turns: int) -> None:
            for _ in range(turns):
                await asyncio.sleep(0)
            ended.append(name)

        async def closer() -> None:
            closing.add(asyncio.get_running_loop().create_task(watch("added meanwhile", 5)))

        closing.add(asyncio.get_running_loop().create_task(closer()))
        closing.add(asyncio.get_running_loop().create_task(watch("first", 1)))
        await closing.ended(5.0, GIVE_UP)
        assert not closing._tasks
        return ended

    assert sorted(asyncio.run(main())) == ["added meanwhile", "first"]


def test_a_closing_task_still_running_after_the_bound_is_cancelled_with_the_give_up_message():
    async def main() -> tuple[str, float]:
        closing = ClosingTasks()
        why: list[str] = []

        async def stuck() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError as cancel:
                why.extend(cancel.args)

        task = asyncio.get_running_loop().create_task(stuck())
        closing.add(task)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await closing.ended(0.02, GIVE_UP)
        assert task.done()
        return why[0], loop.time() - started

    why, took = asyncio.run(main())
    assert why == GIVE_UP
    assert took < 1.0


def test_work_at_the_loops_end_runs_after_asyncio_run_cancelled_its_tasks_held_by_no_task():
    order: list[str] = []

    async def main() -> None:
        async def holder() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                order.append("task cancelled")

        asyncio.get_running_loop().create_task(holder())

        async def at_end() -> None:
            await asyncio.sleep(0)  # the loop still runs it
            order.append("at the loop's end")

        kept.append(at_loop_end(at_end))
        await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) == 2  # main and holder: no task of its own

    kept: list = []
    asyncio.run(main())
    assert order == ["task cancelled", "at the loop's end"]


def test_dropped_work_runs_at_once_and_not_again_and_a_loop_closed_by_hand_drops_it_silently(
    capfd,
):
    ran: list[str] = []

    async def at_end() -> None:
        ran.append("ran")

    async def drop_it() -> None:
        at_loop_end(at_end)()

    asyncio.run(drop_it())
    assert ran == ["ran"]  # by the drop, not again at the end

    ran.clear()
    loop = asyncio.new_event_loop()
    kept: list = []

    async def hold() -> None:
        kept.append(at_loop_end(at_end))

    loop.run_until_complete(hold())
    loop.close()  # no asyncio.run: its async generators are never shut down
    kept.clear()
    gc.collect()
    assert ran == []
    assert capfd.readouterr().err == ""
