"""pyxds.connectivity: one monitor polls many grpcio channels (no thread per
channel); its changes reach the subchannel's LB policy once each, in order,
also when the subchannel shuts down or is released meanwhile (issue 18).

Everything runs on a FakeClock: a sweep happens when the test advances it."""

from __future__ import annotations

import gc
import random
import threading
import weakref

import grpc
import pytest

from pyxds import connectivity
from pyxds.channel.subchannel import PolledTransport
from pyxds.channel.subchannel_pool import SubchannelPool
from pyxds.connectivity import (
    COLD_BUDGET,
    COLD_PERIOD,
    HOT_PERIOD,
    TIMED_SWEEP,
    UNTIMED_SWEEPS,
    WARM_BUDGET,
    WARM_RATIO,
    ConnectivityMonitor,
)
from pyxds.lb.api import ConnectivityState as CS
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock

IDLE, CONNECTING, READY, TF, SHUTDOWN = (s.value[0] for s in grpc.ChannelConnectivity)


class FakeCygrpcChannel:
    """The cygrpc channel under a grpc.Channel: its C-core state is whatever
    the test sets; closed, it raises as cygrpc does."""

    def __init__(self) -> None:
        self.code = IDLE
        self.checks = 0
        self.connect_requests = 0
        self.closed = False

    def check_connectivity_state(self, try_to_connect: bool) -> int:
        if self.closed:
            raise ValueError("Cannot invoke RPC: Channel closed!")
        self.checks += 1
        if try_to_connect:
            self.connect_requests += 1
        return self.code


class FakeGrpcChannel:
    def __init__(self) -> None:
        self._channel = FakeCygrpcChannel()
        self.closes = 0

    def close(self) -> None:
        self.closes += 1
        self._channel.closed = True

    def set(self, code: int) -> None:
        self._channel.code = code


def make_monitor() -> tuple[ConnectivityMonitor[int], FakeClock]:
    clock = FakeClock()
    return ConnectivityMonitor(clock, READY, IDLE), clock


def watched(monitor: ConnectivityMonitor[int]) -> tuple[FakeGrpcChannel, list[int], object]:
    channel = FakeGrpcChannel()
    seen: list[int] = []
    watch = monitor.watch(lambda: channel._channel.check_connectivity_state(False), seen.append)
    return channel, seen, watch


# -- the monitor ----------------------------------------------------------------


def test_the_first_check_delivers_the_state_found_and_each_change_once_in_order():
    monitor, clock = make_monitor()
    channel, seen, _ = watched(monitor)
    clock.advance(0)
    assert seen == [IDLE]
    clock.advance(1.0)
    assert seen == [IDLE]  # no change, nothing delivered however often it looks
    for code in (CONNECTING, READY, IDLE, CONNECTING, TF):
        channel.set(code)
        clock.advance(1.0)
    assert seen == [IDLE, CONNECTING, READY, IDLE, CONNECTING, TF]


def test_a_connection_asked_for_is_seen_ready_within_the_hot_period():
    monitor, clock = make_monitor()
    channel, seen, watch = watched(monitor)
    clock.advance(5.0)  # long idle: cold
    watch.expect_change()
    channel.set(CONNECTING)
    clock.advance(HOT_PERIOD)
    assert seen[-1] == CONNECTING
    channel.set(READY)
    clock.advance(HOT_PERIOD)
    assert seen[-1] == READY


def test_a_connection_asked_for_is_asked_again_until_a_check_sees_it_out_of_idle():
    """Rule 7: polling sees states, not transitions.  A connection that came
    up and was GOAWAYed between two checks leaves the channel IDLE as it
    was: each check asks again until one sees the channel out of IDLE; after
    that, what happens to the connection is its owner's to decide (nothing
    more is asked for)."""
    monitor, clock = make_monitor()
    cygrpc = FakeCygrpcChannel()
    seen: list[int] = []
    watch = monitor.watch_cygrpc(cygrpc, seen.append)
    clock.advance(5.0)
    watch.connect()
    assert cygrpc.connect_requests == 1
    # CONNECTING, READY, and the server's GOAWAY all before the next check
    clock.advance(HOT_PERIOD)
    assert seen == [IDLE] and cygrpc.connect_requests == 2
    clock.advance(0.1)
    assert cygrpc.connect_requests > 2, "every check asks while it sees IDLE"
    cygrpc.code = CONNECTING  # the new attempt, seen
    clock.advance(1.0)
    asked = cygrpc.connect_requests
    for code in (READY, IDLE):  # up, then GOAWAYed: IDLE is the owner's to act on
        cygrpc.code = code
        clock.advance(1.0)
    clock.advance(30.0)
    assert seen == [IDLE, CONNECTING, READY, IDLE]
    assert cygrpc.connect_requests == asked


class ShortLivedConnections(FakeCygrpcChannel):
    """C-core behind a server whose connections live ``life`` seconds (a
    short ``grpc.max_connection_age_ms``): asked to connect from IDLE, it is
    READY at once and IDLE again ``life`` later; asks before ``deaf_until``
    go nowhere (C-core busy: the checks have thinned out meanwhile)."""

    def __init__(self, clock: FakeClock, life: float, deaf_until: float) -> None:
        super().__init__()
        self._clock = clock
        self._life = life
        self._deaf_until = deaf_until
        self._up_until = -1.0

    def check_connectivity_state(self, try_to_connect: bool) -> int:
        now = self._clock.now()
        self.code = READY if now < self._up_until else IDLE
        code = super().check_connectivity_state(try_to_connect)
        if try_to_connect and code == IDLE and now >= self._deaf_until:
            self._up_until = now + self._life
        return code


def test_a_connection_asked_for_again_is_checked_as_closely_as_a_first_one():
    """Rule 7: each ask is a new attempt, checked from HOT_PERIOD up.  Checks
    that had thinned out (here: an ask that went nowhere for a second) to
    more than a connection's life apart would miss every one of them."""
    monitor, clock = make_monitor()
    cygrpc = ShortLivedConnections(clock, life=2 * HOT_PERIOD, deaf_until=1.0)
    seen: list[int] = []
    watch = monitor.watch_cygrpc(cygrpc, seen.append)
    watch.connect()
    clock.advance(1.5)
    assert READY in seen


def test_a_check_that_began_before_a_connection_was_asked_for_does_not_end_the_ask():
    """Rule 7: an ask made while a check is under way (from the serializer,
    while the timer thread checks) is ended only by a check that asked: the
    one under way saw the channel as it was before the ask."""
    monitor, clock = make_monitor()
    cygrpc = FakeCygrpcChannel()
    cygrpc.code = READY
    watch = monitor.watch_cygrpc(cygrpc, lambda code: None)
    clock.advance(5.0)
    check = cygrpc.check_connectivity_state

    def ask_during_the_check(try_to_connect: bool) -> int:
        cygrpc.check_connectivity_state = check  # type: ignore[method-assign]
        watch.connect()
        return check(try_to_connect)

    cygrpc.check_connectivity_state = ask_during_the_check  # type: ignore[method-assign]
    watch.check_now()
    clock.advance(0)
    assert watch.asked != 0
    clock.advance(HOT_PERIOD)  # a check that asked, and saw READY
    assert watch.asked == 0


def test_a_slow_connection_is_checked_less_and_less_often_then_cold():
    """A blackholed endpoint stays CONNECTING (up to the 20 s connect
    timeout): its checks thin out (every 10 % of its age) and stop once it
    is cold, so 10,000 of them do not burn a core."""
    monitor, clock = make_monitor()
    channel, seen, watch = watched(monitor)
    watch.expect_change()
    channel.set(CONNECTING)
    checks = []
    for _ in range(2000):  # 20 s in 10 ms steps
        before = channel._channel.checks
        clock.advance(0.01)
        checks.append(channel._channel.checks - before)
    first_second = sum(checks[:100])
    last_ten = sum(checks[1000:])
    # every 0.25 ms for 2.5 ms, then every 10 % of the age: ~70, not 4000
    assert first_second <= 75
    assert last_ten <= 10 / COLD_PERIOD + 1  # cold: one check per cold period
    assert seen == [CONNECTING]


def test_a_ready_channel_is_cold_and_its_loss_is_seen_within_the_cold_period():
    monitor, clock = make_monitor()
    channel, seen, watch = watched(monitor)
    watch.expect_change()
    channel.set(READY)
    clock.advance(HOT_PERIOD)
    assert seen[-1] == READY
    clock.advance(10.0)
    before = channel._channel.checks
    clock.advance(10.0)
    assert channel._channel.checks - before <= 10 / COLD_PERIOD + 1  # cold cadence
    channel.set(IDLE)  # GOAWAY or connection lost, no RPC running
    clock.advance(COLD_PERIOD)
    assert seen[-1] == IDLE


def test_check_now_looks_at_once_even_when_cold():
    """An RPC that failed UNAVAILABLE on a READY transport: the loss is seen
    without waiting for the cold sweep."""
    monitor, clock = make_monitor()
    channel, seen, watch = watched(monitor)
    channel.set(READY)
    clock.advance(10.0)
    channel.set(IDLE)
    watch.check_now()
    clock.advance(0)
    assert seen == [READY, IDLE]


def test_a_suspect_channel_stays_warm_after_an_unchanged_check():
    """check_now right before C-core notices the GOAWAY: the change that
    follows a moment later is still seen within the hot period."""
    monitor, clock = make_monitor()
    channel, seen, watch = watched(monitor)
    channel.set(READY)
    clock.advance(10.0)
    watch.check_now()
    clock.advance(0)
    assert seen == [READY]
    channel.set(IDLE)
    clock.advance(HOT_PERIOD)
    assert seen == [READY, IDLE]


def test_cancel_stops_every_later_delivery_and_every_check():
    monitor, clock = make_monitor()
    channel, seen, watch = watched(monitor)
    clock.advance(0)
    watch.cancel()
    checks = channel._channel.checks
    channel.set(READY)
    clock.advance(10.0)
    assert seen == [IDLE]
    assert channel._channel.checks == checks
    assert monitor.watched == 0
    assert clock.pending == []  # nothing watched: no timer (the thread may exit)


def test_a_watch_ends_at_its_final_state_delivered_and_never_checked_again():
    """A subchannel's transport is retired on its first TRANSIENT_FAILURE:
    its watch delivers that state and ends there, even before the transport
    is closed (issue 18: checked on while the serializer caught up, it cost
    ~20 checks per failed attempt)."""
    monitor, clock = make_monitor()
    channel = FakeGrpcChannel()
    seen: list[int] = []
    watch = monitor.watch(
        lambda: channel._channel.check_connectivity_state(False), seen.append, final=TF
    )
    clock.advance(0)
    watch.expect_change()
    channel.set(CONNECTING)
    clock.advance(HOT_PERIOD)
    channel.set(TF)
    clock.advance(HOT_PERIOD)
    assert seen == [IDLE, CONNECTING, TF]
    checks = channel._channel.checks
    assert monitor.watched == 0
    watch.check_now()  # an RPC failing on it changes nothing either
    channel.set(IDLE)
    clock.advance(30.0)
    assert channel._channel.checks == checks
    assert seen == [IDLE, CONNECTING, TF]
    assert clock.pending == []


def test_a_channel_heated_twice_before_a_sweep_is_checked_once_in_it():
    monitor, clock = make_monitor()
    channel, _, watch = watched(monitor)
    clock.advance(0)
    clock.advance(0.5)  # its checks have thinned out
    before = channel._channel.checks
    watch.check_now()
    watch.check_now()
    clock.advance(0)
    assert channel._channel.checks == before + 1
    clock.advance(HOT_PERIOD)  # and it is checked again soon after, once
    assert channel._channel.checks == before + 2


def test_warm_channels_are_checked_at_their_own_due_times_however_many_are_warm():
    """Many warm channels of different ages: each is checked when it is due
    (a young one every HOT_PERIOD, older ones ever less often), never because
    another one was."""
    monitor, clock = make_monitor()
    old = [watched(monitor) for _ in range(200)]
    clock.advance(0)
    clock.advance(1.0)  # the old ones are now checked every ~0.1 s
    young_channel, _, _ = watched(monitor)
    old_checks = sum(channel._channel.checks for channel, _, _ in old)
    for _ in range(10):
        clock.advance(HOT_PERIOD)
    assert young_channel._channel.checks >= 10
    # each old channel at most once in those 20 ms
    assert sum(channel._channel.checks for channel, _, _ in old) - old_checks <= len(old)


def test_a_cancelled_watch_lets_go_of_its_channel_and_its_owner():
    """A transport holds its watch and the watch's deliver holds the
    transport: cancelled, the watch keeps neither, so a retired transport
    is freed at once, not at the next full garbage collection."""

    class Owner:
        def deliver(self, state: int) -> None:
            pass

    monitor, clock = make_monitor()
    owner, channel = Owner(), FakeGrpcChannel()
    watch = monitor.watch(
        lambda channel=channel: channel._channel.check_connectivity_state(False), owner.deliver
    )
    clock.advance(0)
    owner_ref, channel_ref = weakref.ref(owner), weakref.ref(channel)
    watch.cancel()
    del owner, channel
    assert owner_ref() is None and channel_ref() is None
    assert watch.cancelled


def test_a_watch_cancelled_by_another_delivery_of_the_same_sweep_hears_nothing():
    """Two changes seen in one sweep; delivering the first cancels the
    second watch (a policy releasing a subchannel): the second is not
    delivered."""
    monitor, clock = make_monitor()
    first, second = FakeGrpcChannel(), FakeGrpcChannel()
    seen_first: list[int] = []
    seen_second: list[int] = []
    watches = []

    def on_first(code: int) -> None:
        seen_first.append(code)
        watches[1].cancel()

    for channel, deliver in ((first, on_first), (second, seen_second.append)):
        probe = channel._channel.check_connectivity_state
        watches.append(monitor.watch(lambda probe=probe: probe(False), deliver))
    clock.advance(0)  # both due in this sweep, in the order they were watched
    assert seen_first == [IDLE] and seen_second == []
    assert not watches[0].cancelled and watches[1].cancelled


def test_a_probe_that_raises_ends_the_watch():
    monitor, clock = make_monitor()
    channel, seen, _ = watched(monitor)
    clock.advance(0)
    channel.close()
    clock.advance(1.0)
    assert monitor.watched == 0
    assert seen == [IDLE]


def test_the_cold_sweep_stretches_to_stay_within_its_budget(monkeypatch):
    """Each check costing 10 us (10,000 channels: 0.1 s a sweep), the cold
    period grows so that sweeps take at most COLD_BUDGET of a core."""
    ticks = iter(range(10**9))
    cost = 1e-5 * 10_000
    # a sweep reads the time before and after each section: `cost` apart
    monkeypatch.setattr(connectivity.time, "thread_time", lambda: next(ticks) * cost)
    monitor, clock = make_monitor()
    channel, _, _ = watched(monitor)
    channel.set(READY)
    clock.advance(10.0)
    assert monitor.cold_period >= cost / COLD_BUDGET * 0.99
    before = channel._channel.checks
    clock.advance(100.0)
    assert channel._channel.checks - before <= 100 / (cost / COLD_BUDGET) + 2


def test_close_soon_runs_on_the_monitor_clock_not_on_the_caller():
    monitor, clock = make_monitor()
    closed: list[str] = []
    monitor.close_soon(lambda: closed.append("closed"))
    assert closed == []
    clock.advance(0)
    assert closed == ["closed"]


def test_watch_channel_reads_the_cygrpc_state_without_asking_to_connect():
    monitor, clock = make_monitor()
    channel = FakeGrpcChannel()
    seen: list[grpc.ChannelConnectivity] = []
    connectivity.watch_channel(channel, seen.append, monitor)  # type: ignore[arg-type]
    channel.set(READY)
    clock.advance(0)
    assert seen == [grpc.ChannelConnectivity.READY]
    assert channel._channel.connect_requests == 0
    connectivity.request_connection(channel)  # type: ignore[arg-type]
    assert channel._channel.connect_requests == 1


def test_this_grpcio_still_has_the_private_state_check_pyxds_polls():
    """pyxds polls grpcio's private cygrpc channel; a grpcio that drops it
    must fail here, not in users' channels."""
    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        assert channel._channel.check_connectivity_state(False) == IDLE
        monitor, clock = make_monitor()
        seen: list[grpc.ChannelConnectivity] = []
        connectivity.watch_channel(channel, seen.append, monitor)
        clock.advance(0)
        assert seen == [grpc.ChannelConnectivity.IDLE]
    finally:
        channel.close()


def test_a_grpcio_without_the_private_state_check_is_a_clear_error():
    with pytest.raises(RuntimeError, match="check_connectivity_state"):
        connectivity.watch_channel(object(), lambda state: None)  # type: ignore[arg-type]


# -- subchannels on the monitor -------------------------------------------------


class Harness:
    """A SubchannelPool whose transports are PolledTransports over fake
    grpcio channels, on a monitor and a serializer, FakeClock time."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.monitor: ConnectivityMonitor[int] = ConnectivityMonitor(self.clock, READY, IDLE)
        self.serializer = WorkSerializer()
        self.channels: list[FakeGrpcChannel] = []
        self.transports: list[PolledTransport] = []
        self.pool = SubchannelPool(
            self.make_transport, self.serializer, self.clock, random.Random(1)
        )

    def make_transport(self, address: str, credentials: object, on_state) -> PolledTransport:
        channel = FakeGrpcChannel()
        transport = PolledTransport(channel, on_state, self.monitor)  # type: ignore[arg-type]
        self.channels.append(channel)
        self.transports.append(transport)
        return transport

    def subchannel(self, address: str = "10.0.0.1:80"):
        sub = self.pool.create(address, {})
        seen: list[CS] = []
        sub.watch_state(lambda state, status: seen.append(state))
        return sub, seen

    def ready_subchannel(self):
        """A subchannel connected, its CONNECTING and READY seen."""
        sub, seen = self.subchannel()
        self.serializer.run(sub.connect)
        channel = self.channels[-1]
        for code in (CONNECTING, READY):
            channel.set(code)
            self.clock.advance(HOT_PERIOD)
        return sub, seen, channel


def test_each_transition_reaches_the_policy_once_in_order():
    h = Harness()
    sub, seen = h.subchannel()
    h.serializer.run(sub.connect)
    (channel,) = h.channels
    assert channel._channel.connect_requests == 1
    h.clock.advance(0)  # grpcio has not left IDLE yet: not news
    for code in (CONNECTING, READY):
        channel.set(code)
        h.clock.advance(HOT_PERIOD)
    channel.set(IDLE)  # GOAWAY
    h.clock.advance(COLD_PERIOD)
    h.serializer.run(sub.connect)  # the policy reconnects on IDLE
    for code in (CONNECTING, READY):
        channel.set(code)
        h.clock.advance(HOT_PERIOD)
    h.clock.advance(30.0)
    assert seen == [CS.IDLE, CS.CONNECTING, CS.READY, CS.IDLE, CS.CONNECTING, CS.READY]


def test_a_reconnection_up_and_goawayed_between_two_checks_is_made_again():
    """Seen under load with a 20 ms ``grpc.max_connection_age_ms``: the
    policy reconnects an IDLE subchannel for a queued RPC; grpcio connects,
    and the server's GOAWAY takes the connection back to IDLE before the
    monitor looks.  Nothing changed as far as checks can tell, so without
    asking again the subchannel stayed IDLE and the RPC waited for its
    deadline.  The next check asks again, and that connection is seen."""
    h = Harness()
    sub, seen, channel = h.ready_subchannel()
    channel.set(IDLE)  # GOAWAY
    h.clock.advance(COLD_PERIOD)
    h.serializer.run(sub.connect)  # a queued RPC: the policy reconnects
    asked = channel._channel.connect_requests
    h.clock.advance(HOT_PERIOD)  # up and GOAWAYed already: IDLE as it was
    assert channel._channel.connect_requests > asked, "asked again"
    channel.set(READY)  # the connection that request made
    h.clock.advance(HOT_PERIOD)
    assert seen == [CS.IDLE, CS.CONNECTING, CS.READY, CS.IDLE, CS.READY]
    assert sub.state is CS.READY


def test_a_first_connection_up_and_goawayed_before_the_first_check_is_made_again():
    """The same on a new transport (the first RPC of a channel): its first
    check finds the IDLE a fresh grpcio channel starts in, which is not
    news, so the subchannel stayed CONNECTING until the RPC's deadline."""
    h = Harness()
    sub, seen = h.subchannel()
    h.serializer.run(sub.connect)
    (channel,) = h.channels
    h.clock.advance(HOT_PERIOD)
    assert seen == [CS.IDLE, CS.CONNECTING]
    assert channel._channel.connect_requests > 1, "asked again"
    channel.set(READY)
    h.clock.advance(HOT_PERIOD)
    assert seen == [CS.IDLE, CS.CONNECTING, CS.READY]


def test_a_subchannel_idle_after_a_goaway_is_not_reconnected_until_asked():
    """A62: after a GOAWAY pick_first stays IDLE until the next RPC, so the
    subchannel must not reconnect by itself: once a check saw the
    connection it asked for, no check asks again."""
    h = Harness()
    _, seen, channel = h.ready_subchannel()
    asked = channel._channel.connect_requests
    channel.set(IDLE)  # GOAWAY
    h.clock.advance(60.0)
    assert seen[-1] is CS.IDLE
    assert channel._channel.connect_requests == asked


def test_a_failed_attempt_is_seen_within_the_hot_period_and_retires_the_transport():
    h = Harness()
    sub, seen = h.subchannel()
    h.serializer.run(sub.connect)
    (channel,) = h.channels
    channel.set(CONNECTING)
    h.clock.advance(HOT_PERIOD)
    channel.set(TF)
    h.clock.advance(HOT_PERIOD)
    assert seen == [CS.IDLE, CS.CONNECTING, CS.TRANSIENT_FAILURE]
    h.clock.advance(0)  # the close runs on the monitor's clock
    assert channel.closes == 1
    assert h.monitor.watched == 0


def test_a_failed_attempts_transport_is_freed_without_the_cyclic_garbage_collector():
    """Issue 18, refusing endpoints: every failed attempt retires a
    transport (and its grpcio channel).  Nothing may keep it in a reference
    cycle: with 9000 refusing endpoints those cycles made a full collection
    of ~1 s every 2 s."""

    def transports_alive() -> int:
        return sum(isinstance(o, PolledTransport) for o in gc.get_objects())

    h = Harness()
    sub, seen = h.subchannel()
    gc.collect()
    gc.disable()
    try:
        h.serializer.run(sub.connect)
        h.transports.clear()
        assert transports_alive() == 1
        channel = h.channels.pop()
        channel.set(TF)
        h.clock.advance(HOT_PERIOD)
        h.clock.advance(0)  # the close runs on the monitor's clock
        assert seen == [CS.IDLE, CS.CONNECTING, CS.TRANSIENT_FAILURE]
        assert channel.closes == 1
        channel_ref = weakref.ref(channel)
        del channel
        assert transports_alive() == 0
        assert channel_ref() is None
    finally:
        gc.enable()


def test_a_change_seen_while_the_serializer_is_busy_with_the_shutdown_never_arrives():
    """The monitor sees READY while the policy's serializer callback that
    shuts the subchannel down runs: the delivery, queued behind it, finds
    the subchannel shut down and reaches nobody."""
    h = Harness()
    sub, seen = h.subchannel()
    h.serializer.run(sub.connect)
    (channel,) = h.channels
    channel.set(CONNECTING)
    h.clock.advance(HOT_PERIOD)

    def policy_callback() -> None:
        channel.set(READY)
        h.clock.advance(HOT_PERIOD)  # the sweep delivers now: queued on the serializer
        sub.shutdown()

    h.serializer.run(policy_callback)
    h.clock.advance(1.0)
    assert seen == [CS.IDLE, CS.CONNECTING]
    assert channel.closes == 1
    assert h.monitor.watched == 0


def test_a_subchannel_released_while_connecting_hears_nothing_more_and_is_closed():
    h = Harness()
    sub, seen = h.subchannel()
    h.serializer.run(sub.connect)
    (channel,) = h.channels
    channel.set(CONNECTING)
    h.clock.advance(HOT_PERIOD)
    h.serializer.run(sub.shutdown)  # the last handle: the core goes
    assert h.monitor.watched == 0
    channel.set(READY)
    h.clock.advance(1.0)
    assert seen == [CS.IDLE, CS.CONNECTING]
    assert channel.closes == 1
    # asking for the address again builds a fresh transport, watched afresh
    again, seen_again = h.subchannel()
    h.serializer.run(again.connect)
    assert len(h.channels) == 2
    h.channels[1].set(READY)
    h.clock.advance(HOT_PERIOD)
    assert seen_again == [CS.IDLE, CS.CONNECTING, CS.READY]


def test_an_unavailable_rpc_makes_the_transport_look_at_once():
    h = Harness()
    sub, seen = h.subchannel()
    h.serializer.run(sub.connect)
    (channel,) = h.channels
    channel.set(READY)
    h.clock.advance(10.0)
    channel.set(IDLE)  # the connection is gone; an RPC on it failed
    h.transports[0].suspect()
    h.clock.advance(0)
    assert seen[-1] is CS.IDLE


def test_pool_close_closes_every_transport_on_the_monitor_clock_without_threads():
    h = Harness()
    subs = [h.subchannel(f"10.0.{i // 250}.{i % 250}:80")[0] for i in range(1000)]
    for sub in subs:
        h.serializer.run(sub.connect)
    threads = threading.active_count()
    h.serializer.run(lambda: h.pool.close())
    assert all(c.closes == 0 for c in h.channels)  # not on the serializer
    h.clock.advance(0)
    assert all(c.closes == 1 for c in h.channels)
    assert all(t.close_done.is_set() for t in h.transports)
    # no thread started; one may have ended meanwhile (the process's timer
    # thread of an earlier test, which exits after TIMER_THREAD_LINGER idle:
    # a loaded run saw 3 threads here against 4 before)
    assert threading.active_count() <= threads
    assert h.monitor.watched == 0


def test_real_transports_closed_by_the_thousand_start_no_thread_per_close():
    """Real grpcio channels on the process's monitor (never connected):
    closing 300 of them adds at most the one timer thread."""
    from pyxds.channel.subchannel import SyncTransport, subchannel_options

    options = subchannel_options(None)
    before = threading.active_count()
    transports = [
        SyncTransport(f"127.0.0.1:{1 + i}", None, options, None, lambda state: None)
        for i in range(300)
    ]
    for transport in transports:
        transport.retire()
    assert threading.active_count() <= before + 1
    for transport in transports:
        assert transport.close_done.wait(10)
    assert threading.active_count() <= before + 1


def test_warm_checks_thin_out_at_the_warm_ratio():
    monitor, clock = make_monitor()
    channel, _, _ = watched(monitor)
    channel.set(CONNECTING)
    clock.advance(0)
    clock.advance(1.0)
    before = channel._channel.checks
    clock.advance(0.5)  # at ~1 s of age: one check per ~0.1 s
    assert channel._channel.checks - before <= 0.5 / (1.0 * WARM_RATIO) + 1


def test_the_channels_are_asked_outside_the_monitor_lock():
    """A probe runs while the sweep holds no lock: watching, expect_change
    and check_now from any thread never wait for a sweep (here: from inside
    a probe, which would deadlock if the sweep held the lock)."""
    monitor, clock = make_monitor()
    _, seen_other, other_watch = watched(monitor)
    calls = []

    def probe() -> int:
        other_watch.check_now()
        calls.append(monitor.watch(lambda: IDLE, lambda code: None))
        return READY

    seen: list[int] = []
    monitor.watch(probe, seen.append)
    clock.advance(0)
    assert seen == [READY]
    assert calls and seen_other == [IDLE]


def test_the_process_monitor_sweeps_and_closes_before_other_clocks_due_timers():
    """Rule 5 (issue 18): the process's monitor is on a prompt clock, so a
    refused attempt is seen and its grpcio channel closed even while
    thousands of backoff timers are due (tests/unit/test_clock.py shows what
    a prompt clock does)."""
    from pyxds.clock import RealClock

    clock = connectivity.monitor()._clock
    assert isinstance(clock, RealClock) and clock._prompt


def test_a_garbage_collection_during_a_sweep_does_not_stretch_the_warm_gap(monkeypatch):
    """A sweep's own CPU time sets the gap to the next warm sweep (budget); a
    collection that ran inside it (0.1-1 s at 10,000 endpoints) is not the
    checks' cost: counted, it stretched the gap to seconds, so every attempt
    in flight lived that long and was promoted into the oldest generation
    (issue 18).  The budget still holds for the checks themselves."""
    cpu = [0.0]
    monkeypatch.setattr(connectivity.time, "thread_time", lambda: cpu[0])

    def slow_collection(phase: str, info: dict) -> None:
        if phase == "start":
            cpu[0] += 1.0  # the collection's CPU

    gc.callbacks.append(slow_collection)  # after the monitor's own: it sees this cost
    try:
        _sweeps_with_a_collection(cpu)
    finally:
        gc.callbacks.remove(slow_collection)


def _sweeps_with_a_collection(cpu: list[float]) -> None:
    monitor, clock = make_monitor()
    collect = [True]
    channel = FakeGrpcChannel()

    def probe() -> int:
        cpu[0] += 0.1  # the checks' own CPU: a 0.5 s gap at WARM_BUDGET
        if collect[0]:
            gc.collect(0)
        return channel._channel.check_connectivity_state(False)

    seen: list[int] = []
    monitor.watch(probe, seen.append)
    clock.advance(0)  # the first sweep: 0.1 s of checks and a 1 s collection
    before = channel._channel.checks
    clock.advance(1.0)
    assert channel._channel.checks > before  # within 1 s (0.5 s gap), not after 5.5 s
    collect[0] = False
    clock.advance(1.0)
    before = channel._channel.checks
    clock.advance(0.4)
    assert channel._channel.checks == before  # the checks' own cost still spaces sweeps
    assert seen == [IDLE]


def test_small_warm_sweeps_are_costed_at_the_last_timed_cost_per_check(monkeypatch):
    """Rule 6: a warm sweep of a few channels reads no CPU clock (a system
    call, as costly as a few checks; thousands of refusing endpoints make
    such sweeps every HOT_PERIOD); the first sweep and every
    UNTIMED_SWEEPS + 1-th are timed, and the untimed ones are spaced by the
    timed cost per check, so the warm budget still holds."""
    reads = [0]
    cpu = [0.0]

    def thread_time() -> float:
        reads[0] += 1
        return cpu[0]

    monkeypatch.setattr(connectivity.time, "thread_time", thread_time)
    monitor, clock = make_monitor()
    channel = FakeGrpcChannel()
    gap = 0.001 / WARM_BUDGET

    def probe() -> int:
        cpu[0] += 0.001  # a slow check: `gap` between warm sweeps at WARM_BUDGET
        return channel._channel.check_connectivity_state(False)

    monitor.watch(probe, lambda state: None)
    channel.set(CONNECTING)
    clock.advance(0)  # the first sweep: timed
    assert (monitor.sweeps, reads[0]) == (1, 2)
    clock.advance(8 * gap)  # young: checked every HOT_PERIOD, but for the budget
    assert 8 <= channel._channel.checks <= 10  # not ~8 * gap / HOT_PERIOD = 160
    assert reads[0] == 2  # none of those read the clock
    clock.advance(40 * gap)
    timed = 1 + (monitor.sweeps - 1) // (UNTIMED_SWEEPS + 1)
    assert monitor.sweeps > UNTIMED_SWEEPS + 1 and reads[0] == 2 * timed


def test_a_warm_sweep_of_many_channels_is_timed(monkeypatch):
    reads = [0]

    def thread_time() -> float:
        reads[0] += 1
        return 0.0

    monkeypatch.setattr(connectivity.time, "thread_time", thread_time)
    monitor, clock = make_monitor()
    watched(monitor)
    clock.advance(0)
    clock.advance(HOT_PERIOD)  # one untimed sweep: the next small one would be untimed too
    before = reads[0]
    for _ in range(TIMED_SWEEP):
        watched(monitor)
    clock.advance(0)
    assert reads[0] == before + 2


def test_a_collection_outside_a_timed_sweep_reads_no_cpu_clock(monkeypatch):
    """The collector's callback times only collections that run inside a
    timed sweep, on its thread; the thousands of young collections of a big
    update elsewhere cost no clock read each."""
    reads = [0]

    def thread_time() -> float:
        reads[0] += 1
        return 0.0

    monkeypatch.setattr(connectivity.time, "thread_time", thread_time)
    gc.collect(0)
    assert reads[0] == 0


def test_a_watched_grpcio_channel_costs_one_object_the_watch():
    """watch_channel_codes checks the cygrpc channel itself: no partial and
    bound method per watched channel for the cyclic collector (issue 18)."""
    monitor, clock = make_monitor()
    channels = [FakeGrpcChannel() for _ in range(200)]
    seen: list[int] = []
    deliver = seen.append
    gc.collect()
    before = len(gc.get_objects())
    watches = [connectivity.watch_channel_codes(c, deliver, monitor) for c in channels]  # type: ignore[arg-type]
    grown = len(gc.get_objects()) - before
    assert grown <= len(channels) + 5  # the watches (and the list holding them)
    for channel in channels:
        channel.set(READY)
    clock.advance(0)
    assert seen == [READY] * len(channels)
    assert all(w.state == READY for w in watches)
