"""The cyclic collector held off during a long serializer drain
(pyxds.gc_hold, issue 18): a drain that runs ``BULK`` seconds (a
10,000-endpoint update) disables it until it ends, then moves the survivors
to the oldest generation without a traversal; short drains never touch it;
a program that disabled or froze its collector is left alone.  Drain time
is faked (the module's clock is replaced)."""

from __future__ import annotations

import gc
import random
import weakref
from collections.abc import Iterator

import pytest
from test_channel_support import TransportFactory

from pyxds import gc_hold
from pyxds.channel.subchannel_pool import SubchannelPool
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock

MS = 0.001


class FakeTime:
    """``perf_counter`` for gc_hold."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf(self) -> float:
        return self.now

    def work(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(gc_hold, "_perf", fake.perf)
    return fake


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector as a program normally has it: enabled, nothing frozen;
    put back as it was afterwards."""
    was_enabled = gc.isenabled()
    gc.enable()
    assert gc.get_freeze_count() == 0
    yield
    assert gc_hold.holding() == 0
    if not was_enabled:
        gc.disable()


def test_a_drain_past_bulk_holds_the_collector_off_until_it_ends(
    fake_time: FakeTime, collector: None
) -> None:
    serializer = WorkSerializer()
    enabled: list[bool] = []

    def first() -> None:
        for _ in range(30):  # 1 ms each: the drain passes BULK (20 ms)
            serializer.run(lambda: (fake_time.work(1 * MS), enabled.append(gc.isenabled())))

    serializer.run(first)
    assert gc_hold.BULK <= 25 * MS
    assert enabled[0] is True  # not before BULK
    assert enabled[-1] is False  # held from the first slice past BULK
    assert gc.isenabled() and gc_hold.holding() == 0


def test_a_short_drain_never_touches_the_collector(fake_time: FakeTime, collector: None) -> None:
    serializer = WorkSerializer()
    seen: list[bool] = []
    for _ in range(50):  # many drains, each short
        serializer.run(lambda: (fake_time.work(1 * MS), seen.append(gc.isenabled())))
    assert all(seen) and gc_hold.holding() == 0


def test_a_drain_ended_by_an_exception_lets_the_collector_go(
    fake_time: FakeTime, collector: None
) -> None:
    serializer = WorkSerializer()

    def long_then_interrupted() -> None:
        for _ in range(30):
            fake_time.work(1 * MS)
            serializer.bulk_progress()
        assert not gc.isenabled()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        serializer.run(long_then_interrupted)
    assert gc.isenabled() and gc_hold.holding() == 0


def test_holds_nest_and_the_last_release_enables_the_collector(collector: None) -> None:
    assert gc_hold.hold() is True
    assert gc_hold.hold() is True
    assert not gc.isenabled()
    gc_hold.release()
    assert not gc.isenabled()
    gc_hold.release()
    assert gc.isenabled()


def test_a_program_that_disabled_the_collector_is_left_alone(collector: None) -> None:
    gc.disable()
    try:
        assert gc_hold.hold() is False
        assert not gc.isenabled() and gc_hold.holding() == 0
    finally:
        gc.enable()


def test_a_program_that_froze_objects_is_left_alone(collector: None) -> None:
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        assert gc_hold.hold() is False
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.other: object = None


def test_what_survives_a_hold_goes_to_the_oldest_generation_and_garbage_is_not_lost(
    collector: None,
) -> None:
    gc.collect()
    assert gc_hold.hold() is True
    kept = _Node()
    garbage = _Node()
    garbage.other = _Node()
    garbage.other.other = garbage  # a cycle nobody refers to
    probe = weakref.ref(garbage)
    del garbage
    gc_hold.release()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert any(o is kept for o in gc.get_objects(generation=2))
    assert probe() is not None  # not collected yet: no traversal on release
    gc.collect()
    assert probe() is None


def test_an_update_connecting_many_endpoints_holds_the_collector_off(
    fake_time: FakeTime, collector: None
) -> None:
    """One callback (an LB update) connecting endpoints, 1 ms each: past BULK
    the collector is off for the rest of the update, and back after it."""
    serializer = WorkSerializer()
    transports = TransportFactory()
    pool = SubchannelPool(transports, serializer, FakeClock(), random.Random(1))
    subchannels = [pool.create(f"10.0.0.{i}:80", {}) for i in range(40)]
    enabled: list[bool] = []

    def update() -> None:
        for subchannel in subchannels:
            fake_time.work(1 * MS)
            subchannel.connect()
            enabled.append(gc.isenabled())

    serializer.run(update)
    assert len(transports.made) == 40
    assert enabled[:10] == [True] * 10
    assert enabled[-10:] == [False] * 10
    assert gc.isenabled() and gc_hold.holding() == 0


def test_bulk_progress_outside_a_drain_does_nothing(fake_time: FakeTime, collector: None) -> None:
    serializer = WorkSerializer()
    serializer.run(lambda: None)
    fake_time.work(10.0)
    serializer.bulk_progress()  # not draining: nothing to hold, nothing to release
    assert gc.isenabled() and gc_hold.holding() == 0
