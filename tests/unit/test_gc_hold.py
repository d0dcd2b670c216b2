"""The cyclic collector held off during a long serializer drain
(pyxds.gc_hold, issue 18): a drain that has done ``BULK`` pieces of work (a
10,000-endpoint update, a flood of reports) disables it until it ends, then
moves the survivors to the oldest generation without a traversal; short
drains never touch it, however long they take; a program that disabled or
froze its collector is left alone."""

from __future__ import annotations

import gc
import random
import textwrap
import time
import weakref
from collections.abc import Iterator

import pytest
from test_channel_support import TransportFactory
from test_lb_registry_loading import fresh

from pyxds import gc_hold
from pyxds.channel.subchannel_pool import SubchannelPool
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector as a program normally has it: enabled, nothing frozen;
    put back as it was afterwards."""
    was_enabled = gc.isenabled()
    gc.enable()
    assert gc.get_freeze_count() <= gc_hold.interpreter_frozen()  # the program froze nothing
    yield
    assert gc_hold.holding() == 0
    if not was_enabled:
        gc.disable()


def test_a_drain_of_bulk_callbacks_holds_the_collector_off_until_it_ends(
    collector: None,
) -> None:
    serializer = WorkSerializer()
    enabled: list[bool] = []

    def first() -> None:
        for _ in range(gc_hold.BULK + 10):  # queued: one drain runs them all
            serializer.run(lambda: enabled.append(gc.isenabled()))

    serializer.run(first)
    assert enabled[: gc_hold.BULK - 1] == [True] * (gc_hold.BULK - 1)  # not before BULK
    assert enabled[-10:] == [False] * 10  # held from the BULK-th piece on
    assert gc.isenabled() and gc_hold.holding() == 0


def test_a_drain_that_never_empties_lets_the_collector_go_after_limit_pieces(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 4: work submitted as fast as it runs keeps one drain going; the
    hold ends after LIMIT pieces and is not taken again in that drain."""
    monkeypatch.setattr(gc_hold, "LIMIT", gc_hold.BULK * 4)
    serializer = WorkSerializer()
    enabled: list[bool] = []

    def again() -> None:
        enabled.append(gc.isenabled())
        if len(enabled) < gc_hold.LIMIT * 3:
            serializer.run(again)  # one more piece, queued from inside

    serializer.run(again)
    assert enabled[gc_hold.BULK + 1] is False  # held once bulk
    assert enabled[gc_hold.LIMIT - 1] is False
    assert enabled[gc_hold.LIMIT :] == [True] * (len(enabled) - gc_hold.LIMIT)
    assert gc.isenabled() and gc_hold.holding() == 0


def test_short_drains_never_touch_the_collector_however_long_they_take(
    collector: None,
) -> None:
    """A loaded machine stretches a drain of a few callbacks to milliseconds:
    the hold counts work, not time."""
    serializer = WorkSerializer()
    seen: list[bool] = []

    def slow() -> None:
        time.sleep(0.03)
        seen.append(gc.isenabled())

    for _ in range(3):
        serializer.run(slow)
    for _ in range(gc_hold.BULK * 2):  # many drains, each of one callback
        serializer.run(lambda: seen.append(gc.isenabled()))
    assert all(seen) and gc_hold.holding() == 0


def test_a_drain_ended_by_an_exception_lets_the_collector_go(collector: None) -> None:
    serializer = WorkSerializer()

    def long_then_interrupted() -> None:
        for _ in range(gc_hold.BULK):
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


def test_objects_the_interpreter_keeps_frozen_keep_no_hold_off(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 1 on CPython 3.12, whose frozen generation holds immortal
    objects of its own (every hold was refused there): they are not the
    program's, and go to the oldest generation with the rest; one object
    more frozen is the program's, and left alone."""
    own = [_Node() for _ in range(3)]  # stand for the interpreter's
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        monkeypatch.setattr(gc_hold, "_interpreter_frozen", frozen)
        assert gc_hold.hold() is True
        assert not gc.isenabled()
        gc_hold.release()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        assert any(o is own[0] for o in gc.get_objects(generation=2))
        monkeypatch.setattr(gc_hold, "_interpreter_frozen", 0)
        gc.freeze()  # the program's own now
        assert gc.get_freeze_count() > 0
        assert gc_hold.hold() is False
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_a_fresh_interpreter_s_own_frozen_objects_keep_no_hold_off() -> None:
    """What Python 3.12 starts with frozen (375 immortal tuples on 3.12.1),
    and puts back after a full collection, is not the program's."""
    script = """
    import gc, json
    from pyxds import gc_hold
    steps = {}
    for step in ("start", "after a full collection"):
        steps[step] = gc_hold.hold()
        if steps[step]:
            gc_hold.release()
        gc.collect()
    print(json.dumps(steps))
    """
    assert fresh(textwrap.dedent(script)) == {"start": True, "after a full collection": True}


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


def test_an_update_connecting_many_endpoints_holds_the_collector_off(collector: None) -> None:
    """One callback (an LB update) connecting endpoints: past BULK of them
    the collector is off for the rest of the update, and back after it."""
    serializer = WorkSerializer()
    transports = TransportFactory()
    pool = SubchannelPool(transports, serializer, FakeClock(), random.Random(1))
    count = gc_hold.BULK + 10
    subchannels = [pool.create(f"10.0.{i // 250}.{i % 250}:80", {}) for i in range(count)]
    enabled: list[bool] = []

    def update() -> None:
        for subchannel in subchannels:
            subchannel.connect()
            enabled.append(gc.isenabled())

    serializer.run(update)
    assert len(transports.made) == count
    assert enabled[:10] == [True] * 10
    assert enabled[-10:] == [False] * 10
    assert gc.isenabled() and gc_hold.holding() == 0


def test_bulk_progress_outside_a_drain_does_nothing(collector: None) -> None:
    serializer = WorkSerializer()
    serializer.run(lambda: None)
    for _ in range(gc_hold.BULK * 2):
        serializer.bulk_progress()  # not draining: nothing to hold, nothing to release
    assert gc.isenabled() and gc_hold.holding() == 0


def test_held_holds_the_collector_over_a_block_and_lets_it_go_however_it_ends(
    collector: None,
) -> None:
    with gc_hold.held():
        assert not gc.isenabled() and gc_hold.holding() == 1
    assert gc.isenabled() and gc_hold.holding() == 0
    with pytest.raises(KeyError), gc_hold.held():
        raise KeyError("x")
    assert gc.isenabled() and gc_hold.holding() == 0
    gc.disable()
    try:
        with gc_hold.held():  # rule 1: a program's own choice is left alone
            assert gc_hold.holding() == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


_FIRST_LOAD = textwrap.dedent(
    """
    import gc, json, random, sys
    from pyxds.resolver import registry
    from pyxds.resolver.api import ResolverArgs
    from pyxds.serializer import WorkSerializer
    from pyxds.testing import FakeClock

    collections = []
    gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(1))
    args = ResolverArgs("xds:///x", "x", WorkSerializer(), FakeClock(), random.Random(1), print)
    steps = {}
    gc.collect()
    collections.clear()
    registry.create(args)  # the first xds: resolver loads the xDS stack
    steps["resolver"] = (len(collections), "pyxds.xds.resources.cluster" in sys.modules)
    from pyxds.resolver import xds_resolver
    collections.clear()
    xds_resolver._load_ahead()  # the LB tree's policies
    steps["policies"] = (len(collections), "pyxds.lb.cds" in sys.modules)
    steps["after"] = (gc.isenabled(), gc.get_freeze_count())
    print(json.dumps(steps))
    """
)


def test_the_first_xds_resolver_loads_the_xds_stack_with_the_collector_held() -> None:
    """Rule 6: loading the resolver, the resource decoders, the descriptor
    bundle and the LB tree (a fresh interpreter's first ``xds:`` channel)
    makes no collection (it made ~20), and leaves the collector on."""
    steps = fresh(_FIRST_LOAD)
    assert steps == {"resolver": [0, True], "policies": [0, True], "after": [True, 0]}
