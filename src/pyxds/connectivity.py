"""Connectivity of many sync grpcio channels without a thread each (issue 18).

Theory of operation
-------------------

A pyxds channel has one grpcio channel per backend address (a subchannel's
transport), plus the xDS client's ADS channel.  Their LB policies must hear
every connectivity change (READY; IDLE after a GOAWAY or a lost connection;
TRANSIENT_FAILURE after a failed attempt).  grpcio's sync API has no way to
wait for a change on several channels at once: ``Channel.subscribe()``
starts a thread per channel that wakes every 200 ms, and cygrpc's
``watch_connectivity_state`` blocks one thread per channel (each waking
every 200 ms to check for signals), and a pending watch makes ``close()``
wait for it.  At 1000 endpoints that was 1000 threads and 65 % of a core
spent idle (``grpc.aio``'s channels, which can wait for changes on one event
loop, are watched that way instead: ``pyxds.channel.subchannel.AioTransport``).

So this module *polls*, from one place for the whole process:
:class:`ConnectivityMonitor` asks each watched channel for its state
(cygrpc's ``check_connectivity_state(False)``, ~0.5 us: a read of C-core's
state under the channel's lock) on the process's one timer thread
(:class:`pyxds.clock.RealClock`), and delivers each change it sees to that
channel's ``deliver`` callback, in order, once.  It costs no thread of its
own and no wake-up per channel.  How often a channel is asked depends on
what is likely to happen to it next:

* **warm** channels are in a transition: just created, a connection just
  asked for (``Watch.connect``), a change just seen (but READY), or an
  RPC just failed on them (``Watch.check_now``: the RPC's UNAVAILABLE is
  the fastest signal a connection went away).  A warm channel is asked
  again after ``age * WARM_RATIO`` seconds (age: since that event), never
  more often than ``HOT_PERIOD``: every 0.25 ms in the first 2.5 ms, so a
  loopback connection (~0.5-1.5 ms) is seen READY within ~0.25 ms of it (a
  first RPC waits on this, and so does every RPC that lands on a ring_hash
  endpoint not yet connected: at 1 ms, detection was ~40 % of such an RPC's
  time on loopback), and a slow one (a TLS
  handshake, another region) within 10 % of the time it took.  A channel
  stays warm for ``COLD_PERIOD / WARM_RATIO`` (2.5 s) after its event.
* **cold** channels are all asked together every ``COLD_PERIOD`` (0.25 s):
  READY ones whose connection is lost or GOAWAYed while no RPC runs on them
  are seen within that.  The period stretches so that the cold sweeps take
  at most ``COLD_BUDGET`` of a core (the sweep's own CPU time, so a busy
  machine does not stretch it): 1000 channels cost ~0.7-1 ms a sweep, within
  budget at 0.25-0.33 s; 10,000 stretch it to ~3 s.
* A sweep of warm channels is never closer to the last one than its own
  cost divided by ``WARM_BUDGET`` (a connection storm of 10,000 channels
  costs at most that share of a core, and gets slower, not more expensive).
  A sweep's cost is its CPU time less that of the garbage collections that
  ran in it (a collection is not the checks' cost).  Reading the thread's
  CPU clock is a system call (~1-4 us, as much as a few checks), so small
  sweeps are costed instead (rule 6).

Rules:

1. One sweep at a time (the timer thread, or FakeClock in tests); the
   channels are asked outside the monitor's lock (watching, cancelling,
   ``expect_change`` and ``check_now`` never wait for a sweep); every
   change seen in a sweep is delivered after the sweep, outside the lock,
   in the order the channels were checked; a channel's changes reach its
   ``deliver`` once each, in the order they were seen.  States skipped
   between two checks are not seen (a connection lost and re-made between
   two cold sweeps looks READY throughout; its RPCs reconnected it).
2. ``Watch.cancel()`` (any thread) stops every later delivery, including one
   of a sweep in progress that has not reached its ``deliver`` yet.
   A watch with a ``final`` state ends when it sees that state: the state is
   delivered, and the channel is never checked again (a subchannel's
   transport is retired on its first TRANSIENT_FAILURE, so checking it on
   until the channel's serializer gets round to retiring it only costs: with
   thousands of refusing endpoints that was ~20 checks per failed attempt).
3. A probe that raises (its grpcio channel closed under it) ends the watch.
4. :meth:`ConnectivityMonitor.close_soon` runs a close on the same timer
   thread, never on the caller's (a channel's serializer) and never on a
   thread of its own: closing 1000 subchannels starts no thread.
5. The process's monitor (:func:`monitor`) runs on a ``prompt``
   :class:`~pyxds.clock.RealClock`: a due sweep or close comes before the
   other clocks' due timers (backoffs ending, LB timers), so a refused
   attempt is seen and its channel closed within a sweep or two even when
   thousands of backoffs end at once, and its objects die young instead of
   living for the length of that backlog (issue 18).
6. A warm sweep of fewer than ``TIMED_SWEEP`` channels is costed at the
   cost per check of the last timed warm sweep; a larger one, the first
   one, and one after ``UNTIMED_SWEEPS`` untimed ones are timed (the
   thread's CPU clock, less the collections that ran on that thread
   meanwhile).  With thousands of refusing endpoints, sweeps of a few
   attempts each run every ``HOT_PERIOD``, and their two clock reads cost
   more than their checks (issue 18: ~4 % of the GIL-holding samples, and
   the collector's callback as much again).  Cold sweeps are always timed.
7. A connection asked for with :meth:`Watch.connect` is asked for again
   (C-core's ``try_to_connect``, in the same check) at every check of that
   channel until one sees it out of IDLE.  Polling sees states, not
   transitions: a connection that comes up and is ended by the server's
   GOAWAY between two checks (a 20 ms ``grpc.max_connection_age_ms``, on a
   machine loaded enough to hold the timer thread off for longer) leaves the
   channel IDLE as it was, nothing is delivered, and its owner (a subchannel
   whose LB policy asked for that connection, an RPC queued behind it)
   would wait for a change that is over, until the RPC's deadline.  Asking
   again makes the next attempt, as the owner would have had it seen the
   IDLE, and that attempt is checked as closely as a first one (from
   ``HOT_PERIOD`` up: checks thinned out to more than a connection's life
   apart would miss every one).  The ask ends when a check that asked sees
   the channel out of IDLE (a check that began before the ask does not end
   it), so an owner that goes IDLE afterwards (A62's pick_first after a
   GOAWAY) is not reconnected against its will.

The monitor takes an injected :class:`~pyxds.clock.Clock` (FakeClock in
unit tests); :func:`monitor` is the process's own, on a RealClock.
"""

from __future__ import annotations

import gc
import operator
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import grpc

from pyxds.clock import Clock, RealClock, Timer

_get_ident = threading.get_ident
#: a watch's ``due``, read in C: the next sweep is the earliest of every warm
#: watch's, found after every sweep (a generator resumed per watch was ~45
#: Python steps per failed attempt with attempts in flight under load)
_due_of = operator.attrgetter("due")

__all__ = [
    "COLD_BUDGET",
    "COLD_PERIOD",
    "HOT_PERIOD",
    "TIMED_SWEEP",
    "UNTIMED_SWEEPS",
    "WARM_BUDGET",
    "WARM_RATIO",
    "ConnectivityMonitor",
    "Watch",
    "monitor",
    "request_connection",
    "watch_channel",
]

#: The shortest time between two checks of a warm channel (seconds).
HOT_PERIOD = 0.00025
#: A warm channel is checked again after this share of the time since its event.
WARM_RATIO = 0.1
#: Every cold channel is checked this often (at least; see COLD_BUDGET).
COLD_PERIOD = 0.25
#: The share of one core the cold sweeps may take: beyond it, COLD_PERIOD stretches.
COLD_BUDGET = 0.004
#: The share of one core back-to-back sweeps of warm channels may take.
WARM_BUDGET = 0.2
#: A warm sweep of at least this many channels reads the CPU clock for its
#: cost; a smaller one is costed at the last timed sweep's cost per check,
#: and is timed itself after UNTIMED_SWEEPS such sweeps (rule 6).
TIMED_SWEEP = 32
UNTIMED_SWEEPS = 15

S = TypeVar("S")
_NEVER = float("-inf")

#: CPU seconds garbage collections have taken so far (on the threads that
#: ran them) and when the running one started.  A sweep's cost is its own
#: CPU time minus the collections' in it: a full collection inside the probe
#: loop (0.1-1 s at 10,000 endpoints) counted as the sweep's cost stretched
#: the warm gap to seconds, every attempt in flight lived that long, into the
#: oldest generation, and brought on the next full collection (issue 18:
#: refusing endpoints).  Collections do not nest and hold the GIL: one slot.
_GC_SECONDS = [0.0, 0.0]
#: the thread whose sweep is being timed now (0: none).  Only collections
#: on it are timed: a sweep's CPU clock does not count other threads'
#: collections anyway, and every other collection (thousands a second while
#: a 10,000-endpoint update allocates) skips two CPU-clock reads, a system
#: call each (~1-4 us here), in the collector's callback.
_TIMING = [0]


def _time_collection(phase: str, info: dict[str, int]) -> None:
    if _TIMING[0] != _get_ident():
        return
    if phase == "start":
        _GC_SECONDS[1] = time.thread_time()
    else:
        _GC_SECONDS[0] += time.thread_time() - _GC_SECONDS[1]


gc.callbacks.append(_time_collection)


def _cpu() -> float:
    """This thread's CPU seconds, less the garbage collections'."""
    return time.thread_time() - _GC_SECONDS[0]


def _closed_probe() -> Any:
    raise RuntimeError("pyxds: the watch was cancelled")


def _ignore(state: Any) -> None:
    pass


class Watch(Generic[S]):
    """One watched channel (see the module docstring)."""

    __slots__ = (
        "_monitor",
        "probe",
        "channel",
        "deliver",
        "final",
        "state",
        "since",
        "due",
        "warm",
        "ended",
        "cancelled",
        "asked",
    )

    def __init__(
        self,
        monitor: ConnectivityMonitor[S],
        probe: Callable[[], S],
        deliver: Callable[[S], None],
        now: float,
        final: S | None = None,
        channel: Any = None,
    ) -> None:
        self._monitor = monitor
        self.probe = probe
        #: a cygrpc channel checked with ``check_connectivity_state(False)``
        #: instead of ``probe()`` (:meth:`ConnectivityMonitor.watch_cygrpc`)
        self.channel = channel
        self.deliver = deliver
        #: the state after which the channel is not checked again (None: none)
        self.final = final
        #: the last state seen (None before the first check)
        self.state: S | None = None
        #: when the event that made it warm happened
        self.since = now
        #: when a warm channel is checked next
        self.due = now
        self.warm = True
        #: never checked again (its final state seen, or cancelled)
        self.ended = False
        #: never checked or delivered to again
        self.cancelled = False
        #: a connection was asked for (:meth:`connect`) and no check has seen
        #: the channel out of IDLE since: 0, or the ask's token (rule 7)
        self.asked = 0

    def expect_change(self) -> None:
        """A change is expected soon: check it often for a while."""
        self._monitor._heat(self, delay=HOT_PERIOD)

    def connect(self) -> None:
        """Ask the cygrpc channel to connect (``try_to_connect``), check it
        often for a while, and ask again at each check until one sees it out
        of IDLE (rule 7).  Nothing once the watch is cancelled."""
        channel = self.channel
        if channel is None:
            return
        channel.check_connectivity_state(True)
        self._monitor._heat(self, delay=HOT_PERIOD, ask=True)

    def check_now(self) -> None:
        """Something suggests the state changed (an RPC failed UNAVAILABLE on
        it): check at once, then often for a while."""
        self._monitor._heat(self, delay=0.0)

    def cancel(self) -> None:
        """No more deliveries, from now on."""
        monitor = self._monitor
        # (the monitor's _cancel inline: a retired transport's watch is
        # cancelled once per failed connection attempt, issue 18)
        with monitor._lock:
            if not self.cancelled:
                monitor._cancel_locked(self)


def _probe(
    watches: list[Watch[S]], idle: S, asks: list[tuple[Watch[S], int, bool]]
) -> list[tuple[Watch[S], S | None]]:
    """Each of ``watches`` whose state is not the last one seen, with its
    state (None: the probe raised).  A channel whose connection was asked
    for is asked again, and goes into ``asks`` with the ask's token and
    whether it was out of IDLE (rule 7).  Kept tight: ~1 us a channel."""
    seen: list[tuple[Watch[S], S | None]] = []
    for watch in watches:
        try:
            channel = watch.channel
            if channel is None:
                state = watch.probe()
            else:
                asked = watch.asked
                state = channel.check_connectivity_state(asked != 0)
                if asked:
                    asks.append((watch, asked, state != idle))
        except Exception:
            seen.append((watch, None))
            continue
        if state != watch.state:
            seen.append((watch, state))
    return seen


class ConnectivityMonitor(Generic[S]):
    """Polls watched channels for connectivity changes on ``clock``'s timers.

    ``ready``: the state that is stable once reached (a channel that just
    became READY goes cold at once: what comes next is unpredictable);
    ``idle``: the state a channel asked to connect must be seen to leave
    (rule 7).
    """

    def __init__(self, clock: Clock, ready: S, idle: S) -> None:
        self._clock = clock
        self._ready = ready
        self._idle = idle
        #: the last ask's token (:attr:`Watch.asked`)
        self._asks = 0
        self._lock = threading.Lock()
        self._warm: dict[Watch[S], None] = {}
        self._cold: dict[Watch[S], None] = {}
        self._timer: Timer | None = None
        self._timer_due = 0.0
        self._cold_due = 0.0
        self._cold_period = COLD_PERIOD
        self._warm_gap = HOT_PERIOD
        #: CPU seconds per check in the last timed warm sweep, and the warm
        #: sweeps since (rule 6)
        self._check_cost = 0.0
        self._untimed = UNTIMED_SWEEPS
        #: sweeps made (for tests and benchmarks)
        self.sweeps = 0
        #: checks made (for tests and benchmarks)
        self.checks = 0

    # -- any thread ------------------------------------------------------
    def watch(
        self, probe: Callable[[], S], deliver: Callable[[S], None], final: S | None = None
    ) -> Watch[S]:
        """Watch a channel: ``probe()`` reads its state, ``deliver(state)``
        hears each change (the first check delivers the state found), up to
        and including ``final`` if given (rule 2)."""
        return self._add(Watch(self, probe, deliver, self._clock.now(), final))

    def watch_cygrpc(
        self, channel: Any, deliver: Callable[[S], None], final: S | None = None
    ) -> Watch[S]:
        """:meth:`watch` with ``channel.check_connectivity_state(False)`` (a
        cygrpc channel's) as the probe, made by the watch itself: no
        ``functools.partial`` and bound method per watched channel, two
        objects per endpoint fewer for the cyclic collector (issue 18)."""
        return self._add(Watch(self, _closed_probe, deliver, self._clock.now(), final, channel))

    def _add(self, watch: Watch[S]) -> Watch[S]:
        with self._lock:
            now = self._clock.now()
            watch.since = watch.due = now
            self._warm[watch] = None
            self._schedule(now, now)
        return watch

    def close_soon(self, close: Callable[[], None]) -> None:
        """Run ``close`` (a grpcio channel's close) on the monitor's clock."""
        self._clock.call_later(0.0, close)

    @property
    def watched(self) -> int:
        with self._lock:
            return len(self._warm) + len(self._cold)

    @property
    def cold_period(self) -> float:
        return self._cold_period

    def _heat(self, watch: Watch[S], delay: float, ask: bool = False) -> None:
        with self._lock:
            if watch.ended:
                return
            if ask:
                self._asks += 1
                watch.asked = self._asks
            now = self._clock.now()
            watch.since = now
            due = now + delay
            if not watch.warm or due < watch.due:
                watch.due = due
            if not watch.warm:
                watch.warm = True
                del self._cold[watch]
                self._warm[watch] = None
            self._schedule(now, watch.due)

    # -- the sweep (on the clock's timer) --------------------------------
    def _schedule(self, now: float, due: float) -> None:
        """Have the sweep run at ``due`` at the latest (lock held)."""
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = self._clock.call_later(max(0.0, due - now), self._sweep)

    def _sweep(self) -> None:
        # Which channels: under the lock.  Asking them: outside it (a sweep
        # of 10,000 takes ~10-20 ms; expect_change / check_now / watch from
        # the channels' serializers never wait for it).  What was seen:
        # under the lock again, against what happened meanwhile.
        with self._lock:
            self._timer = None
            self.sweeps += 1
            now = self._clock.now()
            due = [w for w in self._warm if w.due <= now]
            cold = list(self._cold) if now >= self._cold_due else []
        # (an empty section costs nothing: no clock read, ~2 syscalls a sweep)
        warm_cost = cold_cost = 0.0
        seen_warm: list[tuple[Watch[S], S | None]] = []
        seen_cold: list[tuple[Watch[S], S | None]] = []
        asks: list[tuple[Watch[S], int, bool]] = []
        idle = self._idle
        if due:
            if len(due) >= TIMED_SWEEP or self._untimed >= UNTIMED_SWEEPS:
                self._untimed = 0
                _TIMING[0] = _get_ident()
                started = _cpu()
                seen_warm = _probe(due, idle, asks)
                warm_cost = _cpu() - started
                _TIMING[0] = 0
                self._check_cost = warm_cost / len(due)
            else:
                self._untimed += 1
                seen_warm = _probe(due, idle, asks)
                warm_cost = self._check_cost * len(due)
        if cold:
            _TIMING[0] = _get_ident()
            started = _cpu()
            seen_cold = _probe(cold, idle, asks)
            cold_cost = _cpu() - started
            _TIMING[0] = 0
        changed: list[tuple[Watch[S], S]] = []
        with self._lock:
            self.checks += len(due) + len(cold)
            for watch, asked, out_of_idle in asks:
                if not out_of_idle:
                    # asked again: a new attempt, looked at as closely as
                    # the first (a check later than the connection's life
                    # would miss it again)
                    watch.since = now
                elif watch.asked == asked:  # not asked again since this check began
                    watch.asked = 0
            if now >= self._cold_due:
                if cold:
                    self._cold_period = max(COLD_PERIOD, cold_cost / COLD_BUDGET)
                self._cold_due = now + self._cold_period
            self._warm_gap = max(HOT_PERIOD, warm_cost / WARM_BUDGET)
            self._settle(due, seen_warm, now, changed)
            self._settle(cold, seen_cold, now, changed)
            self._reschedule(now)
        for watch, state in changed:
            if not watch.cancelled:
                watch.deliver(state)

    def _settle(
        self,
        watches: list[Watch[S]],
        seen: list[tuple[Watch[S], S | None]],
        now: float,
        changed: list[tuple[Watch[S], S]],
    ) -> None:
        """Record what a sweep saw of ``watches`` (``seen``: the changed
        ones, None for a probe that raised) and warm or cool each (lock held)."""
        ready = self._ready
        for watch, state in seen:
            if watch.cancelled:
                continue
            if state is None:  # its grpcio channel is closed: nothing more to see
                self._cancel_locked(watch)
                continue
            watch.state = state
            changed.append((watch, state))
            if state == watch.final:
                self._end_locked(watch)
                continue
            # READY is where a connection stays: no event pending any more.
            # Anything else is a transition: look again soon.
            watch.since = _NEVER if state == ready else now
        span = self._cold_period / WARM_RATIO
        for watch in watches:
            if watch.ended:
                continue
            age = now - watch.since  # since: also moved by expect_change/check_now meanwhile
            if age >= span:
                if watch.warm:
                    self._move(watch, warm=False)
                continue
            if not watch.warm:
                self._move(watch, warm=True)
            watch.due = now + min(self._cold_period, max(HOT_PERIOD, age * WARM_RATIO))

    def _cancel_locked(self, watch: Watch[S]) -> None:
        watch.cancelled = True
        # Let go of the channel and its owner now: a transport holds its
        # watch and the watch's deliver holds the transport, a cycle that
        # would otherwise live on until a full garbage collection (one per
        # failed attempt with refusing endpoints, issue 18).  A sweep still
        # holding the watch skips it: it is cancelled.
        watch.probe = _closed_probe
        watch.channel = None
        watch.deliver = _ignore
        if not watch.ended:  # (a watch that saw its final state ended then)
            self._end_locked(watch)

    def _end_locked(self, watch: Watch[S]) -> None:
        watch.ended = True
        (self._warm if watch.warm else self._cold).pop(watch, None)

    def _move(self, watch: Watch[S], warm: bool) -> None:
        if watch.warm is warm:
            return
        if warm:
            del self._cold[watch]
            self._warm[watch] = None
        else:
            del self._warm[watch]
            self._cold[watch] = None
        watch.warm = warm

    def _reschedule(self, now: float) -> None:
        if not self._warm and not self._cold:
            return  # nothing watched: no timer (the timer thread may exit)
        due = self._cold_due if self._cold else float("inf")
        if self._warm:
            due = min(due, max(now + self._warm_gap, min(map(_due_of, self._warm))))
        self._schedule(now, due)


#: C-core's connectivity state codes to grpcio's states
BY_CODE: Mapping[int, grpc.ChannelConnectivity] = {
    state.value[0]: state for state in grpc.ChannelConnectivity
}
_CODE = {state: code for code, state in BY_CODE.items()}
#: the same by identity (no ``Enum.__hash__`` frame: one lookup per watch made)
_CODE_BY_ID = {id(state): code for code, state in BY_CODE.items()}
_READY_CODE = _CODE[grpc.ChannelConnectivity.READY]
_IDLE_CODE = _CODE[grpc.ChannelConnectivity.IDLE]


def _cygrpc_channel(channel: grpc.Channel) -> Any:
    """The cygrpc channel under a sync ``grpc.Channel`` (grpcio's private
    ``_channel``; tests/unit/test_connectivity.py fails if grpcio drops it)."""
    inner = getattr(channel, "_channel", None)
    if inner is None or not hasattr(inner, "check_connectivity_state"):
        raise RuntimeError(
            "pyxds: this grpcio has no Channel._channel.check_connectivity_state; "
            "pyxds cannot watch its channels' connectivity"
        )
    return inner


def watch_channel(
    channel: grpc.Channel,
    deliver: Callable[[grpc.ChannelConnectivity], None],
    on: ConnectivityMonitor[int] | None = None,
    until: grpc.ChannelConnectivity | None = None,
) -> Watch[int]:
    """Watch a sync grpcio channel on monitor ``on`` (the process's by
    default): ``deliver`` hears each change of C-core's state (read without
    asking it to connect, without blocking), from the monitor's timer, up to
    and including ``until`` if given (then the watch ends)."""
    return watch_channel_codes(channel, _ByCode(deliver), on, until)


def watch_channel_codes(
    channel: grpc.Channel,
    deliver_code: Callable[[int], None],
    on: ConnectivityMonitor[int] | None = None,
    until: grpc.ChannelConnectivity | None = None,
) -> Watch[int]:
    """:func:`watch_channel` with ``deliver_code`` hearing C-core's state
    code (``BY_CODE[code]`` is the ``grpc.ChannelConnectivity``): for a
    watcher that is its own deliverer, one object fewer per channel."""
    final = None if until is None else _CODE_BY_ID[id(until)]
    return (on or monitor()).watch_cygrpc(_cygrpc_channel(channel), deliver_code, final)


class _ByCode:
    """Delivers a C-core state code as a ``grpc.ChannelConnectivity``: one
    slotted object per watched channel, not a closure with its cells."""

    __slots__ = ("deliver",)

    def __init__(self, deliver: Callable[[grpc.ChannelConnectivity], None]) -> None:
        self.deliver = deliver

    def __call__(self, code: int) -> None:
        self.deliver(BY_CODE[code])


def is_ready(channel: grpc.Channel) -> bool:
    """Whether a sync grpcio channel is READY now (read without asking it to
    connect, as a sweep reads it)."""
    return bool(_cygrpc_channel(channel).check_connectivity_state(False) == _READY_CODE)


def request_connection(channel: grpc.Channel) -> None:
    """Ask a sync grpcio channel to leave IDLE now (``try_to_connect``)."""
    _cygrpc_channel(channel).check_connectivity_state(True)


_monitor: ConnectivityMonitor[int] | None = None
_monitor_lock = threading.Lock()


def monitor() -> ConnectivityMonitor[int]:
    """The process's monitor of grpcio channels (C-core's state codes), on a
    :class:`RealClock`: the process's one timer thread."""
    global _monitor
    if _monitor is None:
        with _monitor_lock:
            if _monitor is None:
                _monitor = ConnectivityMonitor(
                    RealClock(prompt=True), _CODE[grpc.ChannelConnectivity.READY], _IDLE_CODE
                )
    return _monitor
