"""The process's one event loop for xDS streams (ADS and LRS; issue 18).

A sync grpcio stream costs three threads while it lives (a reader blocked
on its responses, grpcio's request-iterator consumer and its channel's
completion spinner), and gRFC A71 gives every data-plane target its own
XdsClient, so every channel target added three threads.  The xDS
transports (:mod:`pyxds.xds.transport`, :mod:`pyxds.xds.lrs_transport`)
run their streams as ``grpc.aio`` calls on this loop instead: one daemon
thread for every stream of the process, whatever the number of targets,
servers and streams (plus grpcio's own asyncio poller thread).

Rules:

* :func:`acquire` returns the loop (starting its thread if needed) for one
  more user; :func:`release` gives it back.  The thread stops
  ``LINGER`` seconds after its last user left (and starts again with the
  next), so a program that closed every channel has no thread of ours left.
* :func:`post` runs a callback on the loop, in the order posted, from any
  thread (the loop's own included: never re-entrantly, never blocking).
* Nothing here blocks the loop; the transports' events are delivered from
  the loop's thread, and their receivers hand them to their serializers.
* grpc.aio's poller wakes every loop bound to it and whichever reads first
  forwards the events of the others (``call_soon_threadsafe``).  An event of
  an application loop that has closed (``asyncio.run`` returned) then raises
  "Event loop is closed" in this loop's callback: nothing is left to
  deliver it to, so it is dropped quietly (:func:`_exception_handler`);
  every other error is reported as asyncio reports it.
* While an application's event loop runs grpc.aio channels of pyxds, this
  loop leaves grpc.aio's completions to it and only reads its own when that
  loop is gone or stuck (:mod:`pyxds.xds.completion_reader`): otherwise this
  idle loop would win the race for most of the application's completions
  and hand each back across threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import grpc
import grpc.aio

from pyxds.xds.completion_reader import CompletionReader
from pyxds.xds.stepped import Stepped

__all__ = [
    "CLOSE_WAIT",
    "LINGER",
    "LoopChannel",
    "Reader",
    "acquire",
    "in_loop",
    "post",
    "release",
]

_log = logging.getLogger(__name__)

#: Seconds the loop's thread stays without users before it stops.
LINGER = 1.0
#: At most this long, :meth:`LoopChannel.close` waits for the connection to
#: close (it returns as soon as it is; on a loaded machine that took over 1 s).
CLOSE_WAIT = 5.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_users = 0
_generation = 0
_READY = grpc.ChannelConnectivity.READY
#: what a watched channel closed under its watch raises (not a lost connection)
_CLOSED_UNDER_WATCH = (grpc.aio.UsageError, RuntimeError, ValueError)


def _exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's handler, but for grpc.aio's poller failing to hand another
    loop's event to that loop because it has closed (module rules)."""
    error = context.get("exception")
    if (
        isinstance(error, RuntimeError)
        and str(error) == "Event loop is closed"
        and "PollerCompletionQueue._handle_events" in repr(context.get("handle"))
    ):
        _log.debug("pyxds: dropped a grpc.aio event of a closed event loop")
        return
    loop.default_exception_handler(context)


def acquire() -> asyncio.AbstractEventLoop:
    """The running loop, for one more user (see :func:`release`)."""
    global _loop, _thread, _users
    with _lock:
        _users += 1
        if _loop is None:
            loop = asyncio.new_event_loop()
            loop.set_exception_handler(_exception_handler)
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                # grpc.aio's machinery stays up while this loop runs: were it
                # shut down under the loop (its last channel object gone),
                # its wake-up socket would close under a reader the loop
                # still polls ("Bad file descriptor" printed from the loop).
                grpc.aio.init_grpc_aio()
                # an application loop reads grpc.aio's completions while one
                # runs (pyxds.xds.completion_reader)
                reader = CompletionReader.attach(loop)
                loop.call_soon(started.set)
                try:
                    loop.run_forever()
                finally:
                    if reader is not None:
                        reader.detach()
                    try:
                        loop.run_until_complete(loop.shutdown_asyncgens())
                    except Exception:
                        pass
                    grpc.aio.shutdown_grpc_aio()
                    loop.close()

            thread = threading.Thread(target=run, name="pyxds-xds-streams", daemon=True)
            thread.start()
            started.wait(5.0)
            _loop, _thread = loop, thread
        return _loop


def release() -> None:
    """One user less; the loop stops ``LINGER`` after its last user left."""
    global _users, _generation
    with _lock:
        _users -= 1
        if _users > 0 or _loop is None:
            return
        _generation += 1
        generation = _generation
        loop = _loop

    def stop_if_unused() -> None:
        global _loop, _thread
        with _lock:
            if _users > 0 or _generation != generation or _loop is not loop:
                return
            _loop, _thread = None, None
        loop.stop()

    try:
        loop.call_soon_threadsafe(lambda: loop.call_later(LINGER, stop_if_unused))
    except RuntimeError:  # closed already (interpreter exit)
        pass


def in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the caller runs on ``loop``'s thread."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def post(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> bool:
    """Run ``fn`` on ``loop`` (after what was posted before); False when the
    loop is closed (``fn`` never runs).

    Posted from the loop's own thread (an XdsClient's requests and ACKs,
    sent while it handles a response there) it is queued with
    ``call_soon``: the same queue, without ``call_soon_threadsafe``'s write
    to the loop's wake-up socket and the loop pass that reads it back (a
    post to its callback: ~5 us -> ~2 us)."""

    def guarded() -> None:
        try:
            fn()
        except Exception:
            _log.exception("pyxds: xDS stream callback raised")

    try:
        if in_loop(loop):
            loop.call_soon(guarded)
        else:
            loop.call_soon_threadsafe(guarded)
        return True
    except RuntimeError:
        return False


class Reader(Protocol):
    """What reads a call of a :class:`LoopChannel` without a task
    (:meth:`LoopChannel.track`): whether it ended, and a future of the loop
    done when it has."""

    def done(self) -> bool: ...

    def ended(self) -> asyncio.Future[None]: ...


class LoopChannel:
    """A ``grpc.aio`` channel that lives on the stream loop: ``make()`` runs
    there (``on_made(channel)`` after it), and :meth:`close` closes it there,
    waiting (at most ``CLOSE_WAIT``, never on the loop itself) until its
    connection is gone: a server stopped right after must not see it open.
    One user of the loop from construction to close.

    ``lazy``: the channel is made with the first :meth:`post`, in the same
    loop callback, before it (one hand-off to the loop instead of two: an
    ORCA side connection is made to start one call at once); else at once.
    A lazy channel's posts are meant to come from one thread at a time (a
    channel's serializer): a post racing the first from another thread may
    run before the channel is made.

    ``on_lost``: the channel's connectivity is watched on the loop from the
    moment it is made (``get_state`` / ``wait_for_state_change``, the
    ``grpc.aio.Channel`` API: no thread, no polling), and ``on_lost(self)``
    is called (on the loop, once) when it leaves READY after it was READY:
    the connection its calls ran on is gone (a GOAWAY, a lost connection).
    :meth:`close` ends the watch."""

    #: Guards ``_lazy``, ``_done`` and ``_released`` of every LoopChannel.
    #: Shared: each holder runs a few bytecodes (``release()`` takes the
    #: module's lock briefly and never waits), never with another
    #: LoopChannel's state; a lock each was ~90 bytes per ORCA side
    #: connection, one per endpoint (issue 18, memory per endpoint).
    _release_lock = threading.Lock()

    # slots, a method and a list rather than a dict, closures and a set: an
    # ORCA side connection per endpoint has one (issue 18, memory per endpoint)
    __slots__ = (
        "loop",
        "channel",
        "closed",
        "_released",
        "_done",
        "_tasks",
        "_make",
        "_on_made",
        "_lazy",
        "_on_lost",
        "_was_ready",
        "_watch",
    )

    def __init__(
        self,
        make: Callable[[], Any],
        on_made: Callable[[Any], None] | None = None,
        lazy: bool = False,
        on_lost: Callable[[LoopChannel], None] | None = None,
    ) -> None:
        self.loop = acquire()
        #: the channel (the loop's; None until made, or when closed first)
        self.channel: Any = None
        self.closed = False
        self._released = False
        #: set once closed (:attr:`close_done`); made when first asked for:
        #: an Event is ~1 KB, and an ORCA side connection per endpoint has one
        self._done: threading.Event | None = None
        #: tasks reading this channel's calls (:meth:`spawn`, :meth:`track`):
        #: close() lets them end before it closes the channel
        self._tasks: list[asyncio.Task[None] | Reader] = []
        self._make: Callable[[], Any] | None = make
        self._on_made = on_made
        #: a lazy channel not made yet: the first post (or close) takes that
        self._lazy = lazy
        self._on_lost = on_lost
        #: the watch (``on_lost``) saw the channel READY
        self._was_ready = False
        #: the watch's pending wait for a state change (``on_lost``)
        self._watch: Stepped | None = None
        if not lazy:
            post(self.loop, self._create)

    def _create(self) -> None:
        # runs once: what made the channel is not kept past it
        make, self._make = self._make, None
        on_made, self._on_made = self._on_made, None
        if self.closed or make is None:
            return
        self.channel = make()
        if self._on_lost is not None:
            self._look()
        if on_made is not None:
            on_made(self.channel)

    # The watch (``on_lost``): a look at the channel's state, then a wait
    # for it to change (``wait_for_state_change``, stepped without a Task:
    # pyxds.xds.stepped), then the next look; until the channel leaves READY
    # after READY, or closes.  Callbacks on the loop rather than a coroutine
    # in a Task: ~0.7 KB less per side connection (issue 18: memory per
    # endpoint, one per WRR+OOB endpoint).

    def _look(self) -> None:
        channel, on_lost = self.channel, self._on_lost
        if channel is None or on_lost is None or self.closed:
            return
        try:
            state = channel.get_state()
            lost = state is not _READY and self._was_ready
            if not lost:
                self._was_ready = self._was_ready or state is _READY
                watch = Stepped(channel.wait_for_state_change(state), self._changed)
                if not watch.done:  # else it ended at once (and may have looked again)
                    self._watch = watch
        except _CLOSED_UNDER_WATCH:
            return  # closed under the watch: not a lost connection
        if lost:
            self._on_lost = None
            on_lost(self)

    def _changed(self, _result: object, error: BaseException | None) -> None:
        self._watch = None
        if error is None:
            self._look()
        elif not isinstance(error, _CLOSED_UNDER_WATCH):
            _log.error("pyxds: a side connection's watch failed", exc_info=error)

    def _take_create(self) -> Callable[[], None] | None:
        """A lazy channel's ``_create``, once (any thread)."""
        with self._release_lock:
            lazy, self._lazy = self._lazy, False
        return self._create if lazy else None

    def post(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the loop (see :func:`post`); a lazy channel is made
        first, in the same callback."""
        create = self._take_create() if self._lazy else None
        if create is None:
            return post(self.loop, fn)

        def made_then() -> None:
            try:
                create()
            except Exception:  # fn finds no channel and says so
                _log.exception("pyxds: making a stream loop channel raised")
            fn()

        return post(self.loop, made_then)

    def spawn(self, reader: Coroutine[Any, Any, None]) -> None:
        """Run ``reader`` (a task reading one of this channel's calls) on the
        loop; call on the loop.  :meth:`close` waits for it to end before it
        closes the channel: ``grpc.aio`` keeps the connection of a channel
        closed under a call whose reader still awaits (the server sees a live
        client, and C-core logs its GOAWAY when that server stops)."""
        self.track(self.loop.create_task(reader))

    def track(self, reader: asyncio.Task[None] | Reader) -> None:
        """Let :meth:`close` wait for ``reader`` (reading one of this
        channel's calls, without a task of :meth:`spawn`) as for a task of
        :meth:`spawn`; call on the loop."""
        # the ended readers are dropped here, not by a done callback each
        # (its bound method and context copy lived as long as the stream:
        # ~140 bytes per ORCA side connection, issue 18)
        tasks = [task for task in self._tasks if not task.done()]
        tasks.append(reader)
        self._tasks = tasks

    def close(self, before: Callable[[], None] | None = None, wait: bool = True) -> None:
        """Run ``before`` on the loop (it ends the calls), let the readers
        end (:meth:`spawn`), then close the channel; idempotent.  ``wait``:
        return once the channel is closed (at most ``CLOSE_WAIT``; never
        waits on the loop itself); else at once (:attr:`close_done` tells
        when it is)."""
        if self.closed:
            return
        self.closed = True
        self._take_create()  # a lazy channel never made is never made
        done = self.close_done

        def finished() -> None:
            done.set()
            self._release()

        def close_channel() -> None:
            self._on_lost = None  # (its owner refers to this channel)
            watch, self._watch = self._watch, None
            if watch is not None:
                watch.close()
            if before is not None:
                before()
            channel = self.channel
            if channel is None:
                finished()
                return
            task = self.loop.create_task(self._close_after_readers(channel))
            task.add_done_callback(lambda _task: finished())

        if not post(self.loop, close_channel):
            finished()
        if wait and not in_loop(self.loop):
            done.wait(CLOSE_WAIT)
            self._release()

    @property
    def close_done(self) -> threading.Event:
        """Set once the channel is closed (its connection gone)."""
        done = self._done
        if done is None:
            with self._release_lock:
                if self._done is None:
                    self._done = threading.Event()
                done = self._done
        return done

    def _release(self) -> None:
        """This user leaves the loop (once)."""
        with self._release_lock:  # held over release(): done when either caller returns
            if self._released:
                return
            self._released = True
            release()

    async def _close_after_readers(self, channel: Any) -> None:
        running = [
            task if isinstance(task, asyncio.Future) else task.ended()
            for task in self._tasks
            if not task.done()
        ]
        self._tasks = []
        if running:
            await asyncio.wait(running, timeout=CLOSE_WAIT)
        await channel.close()
        # grpc.aio's poller thread lives while any of its channels does: a
        # closed one held in a reference cycle (its owner's) would keep it
        # until the next full collection
        self.channel = None
