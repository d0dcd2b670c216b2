"""The asyncio subchannel transport (``AioTransport``) hears its grpc.aio
channel through ``wait_for_state_change``: a connection asked for whose
whole life (CONNECTING, READY, the server's GOAWAY) passes before the watch
looks again must not leave the transport waiting on an IDLE that looks
unchanged; a connection that was seen is its owner's to manage (A62).

The grpc.aio channel is a fake with C-core's watch semantics (a change wakes
the waiter even if the state is back where it was when the waiter looks);
everything runs on one real event loop, no sockets."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from pyxds.channel import subchannel
from pyxds.channel.loop_inbox import LoopInbox
from pyxds.channel.subchannel import AioTransport, subchannel_options

GC = grpc.ChannelConnectivity
#: how long after its last call is freed a closed fake channel reaches SHUTDOWN
SHUTDOWN_LATER = 0.01


class FakeAioChannel:
    """The grpc.aio channel: its state is what the test sets;
    ``wait_for_state_change(last)`` ends at once if the state differs from
    ``last``, else at the next change (as C-core's watch does).  As
    grpcio's, a cancelled wait stays registered until that change
    (``registered``); ``close()`` is a change to SHUTDOWN once no call made
    on it (:meth:`call`) is referred to any more (C-core's channel lives as
    long as its calls): at once, or :data:`SHUTDOWN_LATER` after the last
    one is freed (the completion reaches the loop a little later)."""

    def __init__(self) -> None:
        self.state = GC.IDLE
        self.connect_requests = 0
        self.cancelled_waits = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._active_calls: weakref.WeakSet[object] = weakref.WeakSet()
        self._made: list[weakref.ref[object]] = []

    def _register_call(self, call: FakeCall) -> None:
        """grpcio's: a call is in the registry until it ends."""
        self._active_calls.add(call)
        call.add_done_callback(self._active_calls.discard)

    def call(self) -> FakeCall:
        """A call object, as a multicallable makes and registers it."""
        call = FakeCall()
        self._register_call(call)
        self._made.append(weakref.ref(call))
        return call

    @property
    def registered(self) -> int:
        """Watches C-core holds: waits not yet ended by a change."""
        return len(self._waiters)

    def get_state(self, try_to_connect: bool = False) -> GC:
        if try_to_connect:
            self.connect_requests += 1
        return self.state

    async def wait_for_state_change(self, last_observed_state: GC) -> None:
        if self.state is not last_observed_state:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            self.cancelled_waits += 1
            raise

    def set(self, state: GC, wake: bool = True) -> None:
        """``wake=False``: the change wakes no waiter (a notification lost)."""
        if state is self.state:
            return
        self.state = state
        if not wake:
            return
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def close(self) -> None:
        self._active_calls.clear()  # grpcio's close() cancels them, forgets them
        if all(made() is None for made in self._made):
            self.set(GC.SHUTDOWN)
            return
        loop = asyncio.get_running_loop()

        def freed(_ref: object) -> None:
            if all(made() is None for made in self._made) and not loop.is_closed():
                loop.call_later(SHUTDOWN_LATER, self.set, GC.SHUTDOWN)

        self._made = [weakref.ref(made, freed) for made in (m() for m in self._made) if made]


class FakeCall:
    """A call object of the fake channel: weakly referable, ended by the test."""

    def __init__(self) -> None:
        self._done_callbacks: list[Callable[[FakeCall], None]] = []

    def add_done_callback(self, callback: Callable[[FakeCall], None]) -> None:
        self._done_callbacks.append(callback)

    def end(self) -> None:
        for callback in self._done_callbacks:
            callback(self)


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _asks_unwoken(transport: AioTransport, channel: FakeAioChannel, more: int) -> bool:
    """Ask for a connection, then whether the transport's looks asked the
    channel ``more`` times again, nothing waking it (1 s at most)."""
    transport.connect()
    await _turns()
    asked = channel.connect_requests
    for _ in range(200):
        if channel.connect_requests > asked + more:
            return True
        await asyncio.sleep(0.005)
    return False


def run_on_a_transport(
    monkeypatch: pytest.MonkeyPatch,
    scenario: Callable[[AioTransport, FakeAioChannel, list[GC]], Awaitable[None]],
) -> None:
    channel = FakeAioChannel()
    monkeypatch.setattr(subchannel.grpc_aio_twin, "public_channel", lambda *args: channel)
    monkeypatch.setattr(subchannel, "app_loop_bound", lambda loop: None)
    reports: list[GC] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        options: Any = subchannel_options(None)
        transport = AioTransport(loop, "127.0.0.1:1", None, options, None, reports.append)
        try:
            await scenario(transport, channel, reports)
        finally:
            transport.retire()
            await _turns()

    asyncio.run(main())


def test_a_connection_up_and_goawayed_before_the_watch_looks_is_asked_for_again(monkeypatch):
    """Seen under load with a 20 ms ``grpc.max_connection_age_ms``: the
    policy reconnects the IDLE transport for a queued RPC, grpcio connects
    and the server's GOAWAY ends the connection before the event loop lets
    the watch look.  It found IDLE, reported IDLE again and waited for a
    change that was over; the RPC waited for its deadline.  Now it asks
    again, and that connection is seen."""

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        transport.connect()
        await _turns()
        for state in (GC.CONNECTING, GC.READY, GC.IDLE):
            channel.set(state)
            await _turns()
        assert reports[-3:] == [GC.CONNECTING, GC.READY, GC.IDLE]
        transport.connect()  # a queued RPC: the policy reconnects
        asked = channel.connect_requests
        for state in (GC.CONNECTING, GC.READY, GC.IDLE):  # before the watch looks
            channel.set(state)
        await _turns()
        assert channel.connect_requests > asked, "asked again"
        channel.set(GC.CONNECTING)
        await _turns()
        channel.set(GC.READY)
        await _turns()
        assert reports[-2:] == [GC.CONNECTING, GC.READY]

    run_on_a_transport(monkeypatch, scenario)


def test_a_first_connection_up_and_goawayed_before_the_watch_starts_is_asked_for_again(
    monkeypatch,
):
    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        transport.connect()
        for state in (GC.CONNECTING, GC.READY, GC.IDLE):  # before the watch's first look
            channel.set(state)
        await _turns()
        assert reports == [GC.IDLE]
        assert channel.connect_requests == 2, "asked again"
        channel.set(GC.READY)
        await _turns()
        assert reports == [GC.IDLE, GC.READY]

    run_on_a_transport(monkeypatch, scenario)


def test_an_aio_transport_idle_after_a_goaway_is_not_reconnected_until_asked(monkeypatch):
    """A62: once the watch saw the connection it asked for, a GOAWAY's IDLE
    is the policy's to act on (pick_first waits for the next RPC): nothing
    asks grpcio to connect again."""

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        transport.connect()
        await _turns()
        channel.set(GC.CONNECTING)
        await _turns()
        channel.set(GC.READY)
        await _turns()
        asked = channel.connect_requests
        channel.set(GC.IDLE)
        await _turns(20)
        assert reports[-1] is GC.IDLE
        assert channel.connect_requests == asked

    run_on_a_transport(monkeypatch, scenario)


def test_while_a_connection_is_asked_for_the_transport_looks_even_unwoken(monkeypatch):
    """Seen once under extreme load: the grpc.aio channel IDLE with its
    ``wait_for_state_change`` pending seconds after an ask (C-core leaves
    IDLE within ~30 ms of one).  While a connection is asked for the
    transport looks, and asks, every ``ASKED_LOOK`` even if nothing wakes
    it; once it has seen the channel out of IDLE it waits to be woken."""
    monkeypatch.setattr(subchannel, "ASKED_LOOK", 0.005)

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        assert await _asks_unwoken(transport, channel, 1), "looked and asked again, unwoken"
        channel.set(GC.READY, wake=False)
        for _ in range(200):
            if reports[-1:] == [GC.READY]:
                break
            await asyncio.sleep(0.005)
        assert reports[-1:] == [GC.READY]
        asked = channel.connect_requests
        looked = len(reports)
        channel.set(GC.IDLE, wake=False)
        await asyncio.sleep(0.05)  # ten ASKED_LOOKs: no look, no ask
        assert len(reports) == looked and channel.connect_requests == asked

    run_on_a_transport(monkeypatch, scenario)


def test_an_ask_made_while_the_watch_reports_is_looked_after_unwoken(monkeypatch):
    """The policy asks for a connection from inside the watch's report (an
    IDLE after a GOAWAY, a queued RPC): the watch's wait that follows is a
    timed one too."""
    monkeypatch.setattr(subchannel, "ASKED_LOOK", 0.005)

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        def policy(state: GC) -> None:
            reports.append(state)
            if state is GC.IDLE and GC.READY in reports:
                transport.connect()

        transport._on_state = policy
        transport.connect()
        await _turns()
        for state in (GC.CONNECTING, GC.READY, GC.IDLE):
            channel.set(state)
            await _turns()
        channel.set(GC.READY, wake=False)
        for _ in range(200):  # 1 s at most
            if reports[-1] is GC.READY:
                break
            await asyncio.sleep(0.005)
        assert reports[-2:] == [GC.IDLE, GC.READY]

    run_on_a_transport(monkeypatch, scenario)


def test_a_connection_asked_for_that_does_not_come_holds_one_watch_not_one_per_look(
    monkeypatch,
):
    """grpcio keeps C-core's watch of a cancelled ``wait_for_state_change``
    until the state changes (TRAPS): a look every ``ASKED_LOOK`` that
    cancelled its wait left one watch per look while the channel stayed
    IDLE.  The looks go on (and ask), beside one pending wait."""
    monkeypatch.setattr(subchannel, "ASKED_LOOK", 0.005)

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        assert await _asks_unwoken(transport, channel, 5), "looked and asked again, unwoken"
        assert channel.registered == 1 and channel.cancelled_waits == 0
        channel.set(GC.CONNECTING)
        await _turns()
        assert reports[-1] is GC.CONNECTING
        assert channel.registered == 1, "waits on CONNECTING alone"

    run_on_a_transport(monkeypatch, scenario)


def test_a_closed_aio_transports_watch_ends_with_its_channels_close_uncancelled(monkeypatch):
    """grpcio strands the watch of a ``wait_for_state_change`` cancelled on
    a channel then closed when it was the process's last ``grpc.aio``
    channel (TRAPS: one CallbackWrapper and C-core watch per failed
    connection attempt of a ``pyxds.aio`` channel to a plain target).  The
    transport's close ends its watch's wait (SHUTDOWN), in a timed look
    too; nothing is cancelled."""
    monkeypatch.setattr(subchannel, "ASKED_LOOK", 0.005)

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        transport.connect()  # asked: the watch's wait is a timed look's
        await asyncio.sleep(0.02)
        channel.set(GC.TRANSIENT_FAILURE, wake=False)
        await asyncio.sleep(0.02)
        assert reports[-1] is GC.TRANSIENT_FAILURE
        transport.retire()
        await _turns(10)
        assert transport._watcher is not None and transport._watcher.done()
        assert channel.registered == 0 and channel.cancelled_waits == 0

    run_on_a_transport(monkeypatch, scenario)


@pytest.mark.parametrize("let_go", ["before the loop's end", "by a task the loop's end cancels"])
def test_a_closed_transports_wait_for_its_shutdown_is_left_to_its_loops_end_not_to_a_task(
    monkeypatch, let_go
):
    """A closed transport's channel reaches SHUTDOWN only once its calls are
    freed (grpcio: a call object keeps C-core's channel), and grpcio's wait
    must see it: its completion for a closed loop would strand C-core's
    watch (TRAPS).  While a task holds a call at the close, it cannot come
    yet; the close must still leave no task pending (a program closing its
    own loop right after reports each "Task was destroyed but it is
    pending!"), so the watch ends and hands the wait, uncancelled, to the
    loop's end: ``asyncio.run`` cancels every task (the holder lets go),
    then shuts down the loop's async generators, where the SHUTDOWN is
    read."""
    channels: list[FakeAioChannel] = []

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        channels.append(channel)
        await _turns()
        watcher = transport._watcher
        assert watcher is not None and channel.registered == 1
        call = channel.call()
        call.end()

        async def holder(held: FakeCall) -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return  # (its frame, and the call, let go)

        task = asyncio.get_running_loop().create_task(holder(call))
        del call
        transport.retire()
        for _ in range(200):  # LET_GO_WAIT for the call to be let go (1 s at most)
            if watcher.done():
                break
            await asyncio.sleep(0.005)
        assert watcher.done(), "the close leaves no task of the transport pending"
        assert channel.state is GC.IDLE, "no SHUTDOWN while the call is referred to"
        assert channel.registered == 1 and channel.cancelled_waits == 0
        if let_go == "before the loop's end":
            task.cancel()
            for _ in range(200):  # 1 s at most
                if channel.registered == 0:
                    break
                await asyncio.sleep(0.005)
            assert channel.registered == 0

    monkeypatch.setattr(subchannel, "SHUTDOWN_READ_WAIT", 5.0)  # (a wait for nothing would show)
    started = time.monotonic()
    run_on_a_transport(monkeypatch, scenario)
    assert time.monotonic() - started < 2.0
    assert channels[0].registered == 0, "the loop's end read the SHUTDOWN"
    assert channels[0].cancelled_waits == 0


def test_a_call_let_go_a_completion_after_the_close_has_its_shutdown_read_by_the_close(
    monkeypatch,
):
    """A health or ORCA stream of pyxds's own, cancelled by the close, lets
    go of its call only once grpcio read the cancelled call's status (a
    completion away: 1.3 ms, 24 loop iterations, seen under load): the
    closed transport's watch waits for that (``LET_GO_WAIT``) and reads the
    SHUTDOWN itself, rather than leaving it to a loop's end a program that
    closes its own loop never runs.  (A call held on a transport that ran
    no such stream is the application's: no wait, the loop's end reads it.)"""
    seen: dict[str, int] = {}

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        await _turns()
        watcher = transport._watcher
        assert watcher is not None
        call = channel.call()
        call.end()

        async def stream(held: FakeCall) -> None:
            await asyncio.sleep(0.003)  # its status read, a completion later

        transport.spawn(stream(call))  # (subchannel_stream's reader)
        del call
        transport.retire()
        for _ in range(200):  # 1 s at most
            if watcher.done():
                break
            await asyncio.sleep(0.005)
        assert watcher.done()
        seen["registered"] = channel.registered

    run_on_a_transport(monkeypatch, scenario)
    assert seen == {"registered": 0}, "read by the close, not left to the loop's end"


@pytest.mark.parametrize("close_ran", [True, False], ids=["closed", "close not run yet"])
def test_a_closed_transports_watch_cancelled_by_its_loops_end_returns_at_once_while_a_call_is_kept(
    monkeypatch, close_ran
):
    """A program that keeps a call object of the channel past its loop's end
    (returns it from ``asyncio.run``): C-core's channel cannot reach
    SHUTDOWN before the loop closes, so the cancelled watch does not hold
    the loop's end for it (it waited 0.1 s, ``SHUTDOWN_READ_WAIT``), and
    leaves grpcio's wait pending, uncancelled.  The call ended before the
    close (grpcio's own registry lets go of a call as it ends); the loop
    may also end before the transport's close ran on it."""

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        await _turns()
        watcher = transport._watcher
        assert watcher is not None
        kept = channel.call()
        kept.end()
        if not close_ran:
            monkeypatch.setattr(transport, "_inbox", _Unrun())
        transport.retire()
        await _turns()
        watcher.cancel()  # the loop ends
        await _turns(subchannel.LET_GO_TURNS + 3)  # (the loop's end runs the loop meanwhile)
        assert watcher.done(), "it does not wait for a SHUTDOWN that cannot come"
        assert channel.registered == 1 and channel.cancelled_waits == 0
        assert kept is not None

    monkeypatch.setattr(subchannel, "SHUTDOWN_READ_WAIT", 5.0)  # (it would show)
    run_on_a_transport(monkeypatch, scenario)


class _Unrun:
    """A loop inbox whose posts never run (the loop ended first)."""

    def run(self, fn: Callable[[], None]) -> None:
        pass


def test_an_open_transports_watch_cancelled_by_its_loops_end_returns_at_once(monkeypatch):
    """An open transport (a channel never closed) has no SHUTDOWN coming: its
    cancelled watch does not hold the loop's end, and leaves grpcio's wait
    to end by itself rather than cancelling it."""

    async def scenario(transport: AioTransport, channel: FakeAioChannel, reports: list) -> None:
        await _turns()
        watcher = transport._watcher
        assert watcher is not None
        watcher.cancel()
        await _turns()
        assert watcher.done()
        assert channel.cancelled_waits == 0 and channel.registered == 1

    run_on_a_transport(monkeypatch, scenario)


def test_a_transport_made_to_connect_off_the_loop_reaches_it_in_one_hop(monkeypatch):
    """Made and connected from another thread (an xDS update's subchannel,
    ``SubchannelCore.connect``) with ``prepare`` (the engine hold) and
    ``connect=True``: one wake-up of the loop runs ``prepare``, makes the
    channel and asks it to connect, even when the loop has taken that hop
    before the thread's connect() follows (the first RPC of ``pyxds.aio``
    went to the loop in three).  A later connect() is asked for again."""
    channel = FakeAioChannel()
    order: list[str] = []

    def made(*_args: Any) -> FakeAioChannel:
        order.append("channel")
        return channel

    monkeypatch.setattr(subchannel.grpc_aio_twin, "public_channel", made)
    monkeypatch.setattr(subchannel, "app_loop_bound", lambda loop: None)
    reports: list[GC] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        wakeups: list[object] = []
        plain = loop.call_soon_threadsafe

        def counted(*args: Any) -> Any:
            wakeups.append(args[0])
            return plain(*args)

        monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
        inbox = LoopInbox(loop)
        options: Any = subchannel_options(None)
        holder: list[AioTransport] = []

        def make() -> None:
            holder.append(
                AioTransport(
                    loop,
                    "127.0.0.1:1",
                    None,
                    options,
                    None,
                    reports.append,
                    inbox,
                    prepare=lambda: order.append("prepare"),
                    connect=True,
                )
            )

        await asyncio.to_thread(make)
        (transport,) = holder
        await _turns()  # the loop takes the hop before the connect() that follows
        assert order == ["prepare", "channel"]
        assert channel.connect_requests >= 1, "asked as it was made"
        asked = channel.connect_requests
        await asyncio.to_thread(transport.connect)
        await _turns()
        hops = [w for w in wakeups if w == inbox.drain]  # (not to_thread's own returns)
        assert len(hops) == 1, wakeups
        assert channel.connect_requests == asked
        try:
            channel.set(GC.CONNECTING)
            await _turns()
            channel.set(GC.IDLE)
            await _turns()
            await asyncio.to_thread(transport.connect)  # the policy reconnects
            await _turns()
            assert channel.connect_requests > asked, "a later connect() asks again"
            assert reports[-2:] == [GC.CONNECTING, GC.IDLE]
        finally:
            transport.retire()
            await _turns()

    asyncio.run(main())
