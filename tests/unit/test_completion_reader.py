"""When the xDS stream loop yields grpc.aio's completions
(pyxds/xds/completion_reader.py): only on a checked grpcio whose completion
reader has the expected shape, and only to a running loop with a reader on
the same socket.  (Behaviour with real xDS streams:
tests/e2e/test_stream_loop_yield.py.)"""

from __future__ import annotations

import asyncio
import threading

import grpc
import grpc.aio
import pytest

from pyxds.xds import completion_reader

needs_checked_grpcio = pytest.mark.skipif(
    grpc.__version__ not in completion_reader.VERIFIED,
    reason=f"grpcio {grpc.__version__} is not a checked one",
)


Attached = list[completion_reader.CompletionReader | None]


def _stream_loop() -> tuple[asyncio.AbstractEventLoop, Attached, threading.Thread]:
    """A stream loop of its own (no xDS) running on a thread, with grpc.aio
    bound to it and a CompletionReader attached (the list gets it, or None)."""
    stream = asyncio.new_event_loop()
    attached: list[completion_reader.CompletionReader | None] = []

    def run_stream() -> None:
        asyncio.set_event_loop(stream)
        grpc.aio.init_grpc_aio()
        attached.append(completion_reader.CompletionReader.attach(stream))
        stream.run_forever()
        if attached[0] is not None:
            attached[0].detach()
        grpc.aio.shutdown_grpc_aio()

    thread = threading.Thread(target=run_stream, daemon=True)
    thread.start()
    return stream, attached, thread


def _stop(stream: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop :func:`_stream_loop`'s loop and close it once its thread is out."""
    stream.call_soon_threadsafe(stream.stop)
    thread.join(5)
    stream.close()


@needs_checked_grpcio
def test_this_grpcio_binds_each_loop_with_the_reader_the_module_expects():
    async def main():
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        try:
            loop = asyncio.get_running_loop()
            found = completion_reader._poller_reader(loop)
            assert found is not None
            fd, read = found
            assert completion_reader._reads(loop, fd)
            read()  # nothing pending: grpcio's reader returns quietly
        finally:
            await channel.close()

    asyncio.run(main())


def test_a_loop_without_grpcio_reader_is_not_one_to_yield_to():
    async def main():
        loop = asyncio.get_running_loop()
        assert completion_reader._poller_reader(loop) is None

    asyncio.run(main())


def test_a_closed_or_stopped_loop_does_not_read():
    loop = asyncio.new_event_loop()
    try:
        assert not completion_reader._reads(loop, 0)
    finally:
        loop.close()
    assert not completion_reader._reads(loop, 0)


@pytest.mark.parametrize("why", ["disabled", "other grpcio"])
def test_stream_loop_keeps_its_reader_when_off_or_on_an_unchecked_grpcio(monkeypatch, why):
    if why == "disabled":
        monkeypatch.setattr(completion_reader, "ENABLED", False)
    else:
        monkeypatch.setattr(completion_reader, "VERIFIED", frozenset({"0.0.0"}))

    async def main():
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        try:
            loop = asyncio.get_running_loop()
            assert completion_reader.CompletionReader.attach(loop) is None
            assert completion_reader._poller_reader(loop) is not None or (
                grpc.__version__ not in completion_reader.VERIFIED
            )
        finally:
            await channel.close()

    asyncio.run(main())


@needs_checked_grpcio
def test_reader_yields_to_a_running_bound_loop_and_takes_it_back_when_it_closes(monkeypatch):
    """A stream loop of its own (no xDS): yields while an application loop
    with grpcio's reader runs, takes its reader back once that loop closed."""
    monkeypatch.setattr(completion_reader, "_app_loops", type(completion_reader._app_loops)())
    stream, attached, thread = _stream_loop()

    try:

        async def app():
            channel = grpc.aio.insecure_channel("127.0.0.1:1")
            loop = asyncio.get_running_loop()
            completion_reader.app_loop_bound(loop)
            for _ in range(200):
                if attached and attached[0] is not None and attached[0].yielded:
                    break
                await asyncio.sleep(0.01)
            yielded = bool(attached and attached[0] is not None and attached[0].yielded)
            await channel.close()
            return yielded

        assert asyncio.run(app())
        reader = attached[0]
        assert reader is not None
        for _ in range(100):  # at most TICK after the loop closed
            if not reader.yielded:
                break
            threading.Event().wait(0.02)
        assert not reader.yielded
        fd_read = completion_reader._poller_reader(stream)
        assert fd_read is not None  # its reader is back on its selector
    finally:
        _stop(stream, thread)


@needs_checked_grpcio
def test_a_loop_about_to_block_gets_the_reader_back_until_it_runs_again(monkeypatch):
    """app_loop_blocks(): the stream loop takes its reader back at once (no
    look: TICK is a minute), does not yield again while the application loop
    is blocked, and yields again once it runs (the function returned)."""
    monkeypatch.setattr(completion_reader, "_app_loops", type(completion_reader._app_loops)())
    monkeypatch.setattr(completion_reader, "TICK", 60.0)
    monkeypatch.setattr(completion_reader, "TICK_MAX", 60.0)
    stream, attached, thread = _stream_loop()

    def until(condition) -> bool:
        for _ in range(500):
            if condition():
                return True
            threading.Event().wait(0.01)
        return False

    try:

        async def app():
            channel = grpc.aio.insecure_channel("127.0.0.1:1")
            completion_reader.app_loop_bound(asyncio.get_running_loop())
            assert until(lambda: attached and attached[0] is not None and attached[0].yielded)
            reader = attached[0]
            resume = completion_reader.app_loop_blocks()
            # this loop is blocked now (no await): the stream loop reads
            assert until(lambda: not reader.yielded)
            reader.review_soon()  # a review meanwhile does not yield to a blocked loop
            threading.Event().wait(0.05)
            assert not reader.yielded
            resume()
            assert until(lambda: reader.yielded)  # yields again to the running loop
            await channel.close()

        asyncio.run(app())
    finally:
        _stop(stream, thread)


def test_app_loop_blocks_without_a_stream_loop_does_nothing(monkeypatch):
    monkeypatch.setattr(completion_reader, "_current", None)
    resume = completion_reader.app_loop_blocks()
    resume()


class _ScheduleLoop:
    """The stream loop as the reader uses it: only records what it asks
    (the delays of its looks), runs nothing."""

    def __init__(self) -> None:
        self.later: list[tuple[float, object]] = []

    def call_later(self, delay: float, callback: object) -> None:
        self.later.append((delay, callback))

    def remove_reader(self, fd: int) -> None:
        pass

    def add_reader(self, fd: int, callback: object) -> None:
        pass


def _looks(monkeypatch, answered: list[bool], looks: int) -> list[float]:
    """The delays before each of ``looks`` looks of a yielded reader while
    the application loop runs and completions wait at every look (a busy
    RPC loop); ``answered`` says whether each probe ran in time."""
    monkeypatch.setattr(completion_reader, "_readable", lambda fd: True)
    loop = _ScheduleLoop()
    reader = completion_reader.CompletionReader(loop, 7, lambda: None)  # type: ignore[arg-type]
    monkeypatch.setattr(reader, "_app_reading", lambda: True)
    answers = iter(answered)

    def post_probe() -> bool:
        reader._probe = [True] if next(answers) else []
        return True

    monkeypatch.setattr(reader, "_post_probe", post_probe)
    reader.review()  # yields: the first look after TICK
    delays = []
    while len(delays) < looks:
        delay, callback = loop.later.pop(0)
        if callback == reader._tick:
            delays.append(delay)
        elif reader._probe == [] and not reader.yielded:
            reader._probe.append(True)  # the stalled loop runs again: answered late
        callback()  # type: ignore[operator]
    return delays


def test_a_busy_application_loop_answering_its_probes_is_looked_at_less_and_less(monkeypatch):
    """Module rules: a probe the application loop answers in time counts as
    a look that found nothing, so a steady RPC loop (a byte waiting at
    every look) costs two looks a second, not one every TICK."""
    tick, most = completion_reader.TICK, completion_reader.TICK_MAX
    delays = _looks(monkeypatch, [True] * 5, 5)
    assert delays == [tick, 2 * tick, 4 * tick, most, most]


def test_after_a_stall_the_reader_looks_closely_again(monkeypatch):
    """A probe not answered in time (stuck: the stream loop reads) and
    answered later: yielded again, the next look comes after TICK."""
    tick = completion_reader.TICK
    delays = _looks(monkeypatch, [True, True, False, True], 4)
    assert delays[:3] == [tick, 2 * tick, 4 * tick]
    assert delays[3] == tick
