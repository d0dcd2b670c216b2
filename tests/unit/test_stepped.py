"""pyxds.xds.stepped: a coroutine run on its loop without an asyncio.Task
(issue 18: memory per endpoint)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyxds.xds.stepped import Stepped


def run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 5))


def test_the_first_step_runs_at_once_and_each_next_with_its_future():
    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        log: list[Any] = []
        first, second = loop.create_future(), loop.create_future()

        async def body() -> str:
            log.append("started")
            log.append(await first)
            log.append(await second)
            return "end"

        stepped = Stepped(body(), lambda result, error: log.append((result, error)))
        assert log == ["started"]  # at once, not in a later callback
        assert not stepped.done
        first.set_result(1)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert log == ["started", 1]
        second.set_result(2)
        for _ in range(3):
            await asyncio.sleep(0)
        assert stepped.done
        return log

    assert run(main) == ["started", 1, 2, ("end", None)]


def test_no_task_is_made():
    async def main() -> int:
        loop = asyncio.get_running_loop()
        before = len(asyncio.all_tasks())
        never = loop.create_future()

        async def body() -> None:
            await never

        stepped = Stepped(body(), lambda *_: None)
        grown = len(asyncio.all_tasks()) - before
        stepped.close()
        return grown

    assert run(main) == 0


@pytest.mark.parametrize("error", [ValueError("bad"), asyncio.CancelledError()])
def test_an_exception_of_the_awaited_future_is_raised_in_the_coroutine_and_ends_it(error):
    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        ended: list[Any] = []
        future = loop.create_future()

        async def body() -> None:
            await future

        Stepped(body(), lambda result, err: ended.append((result, err)))
        if isinstance(error, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(error)
        for _ in range(3):
            await asyncio.sleep(0)
        return ended

    [(result, raised)] = run(main)
    assert result is None
    assert type(raised) is type(error)


def test_a_bare_yield_steps_again_in_the_next_callback():
    async def main() -> list[Any]:
        ended: list[Any] = []

        async def body() -> int:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return 7

        Stepped(body(), lambda result, err: ended.append((result, err)))
        assert ended == []
        for _ in range(4):
            await asyncio.sleep(0)
        return ended

    assert run(main) == [(7, None)]


def test_close_cancels_the_awaited_future_runs_finally_and_never_calls_then():
    async def main() -> tuple[list[str], asyncio.Future[None], list[Any]]:
        loop = asyncio.get_running_loop()
        log: list[str] = []
        ended: list[Any] = []
        future: asyncio.Future[None] = loop.create_future()

        async def body() -> None:
            try:
                await future
            except asyncio.CancelledError:
                log.append("cancelled")  # not run: closed, not cancelled
                raise
            finally:
                log.append("finally")

        stepped = Stepped(body(), lambda *end: ended.append(end))
        stepped.close()
        stepped.close()  # idempotent
        await asyncio.sleep(0)
        assert stepped.done
        return log, future, ended

    log, future, ended = run(main)
    assert log == ["finally"]
    assert future.cancelled()
    assert ended == []


def test_awaiting_something_else_than_a_future_ends_it_with_an_error():
    class Odd:
        def __await__(self) -> Any:
            yield "odd"

    async def main() -> list[Any]:
        ended: list[Any] = []

        async def body() -> None:
            await Odd()

        Stepped(body(), lambda result, err: ended.append(err))
        return ended

    [error] = run(main)
    assert isinstance(error, RuntimeError)
    assert "'odd'" in str(error)
