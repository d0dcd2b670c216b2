"""What one new endpoint of an EDS update costs (issue 18 item 4, the
1k -> 10k grow): the shortcuts taken per endpoint give exactly what the
general path gives, and the GC-tracked objects the LB tree keeps per
endpoint do not grow back.  Real cds tree on a FakeHelper, as
tests/unit/test_eds_update_reuse.py; real SubchannelPool and
PolledTransport over fake grpcio channels, as tests/unit/test_connectivity.py.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import grpc
import pytest
from test_cds_support import build, cds_update, connect_all, eds_cluster, eds_entry, locality
from test_cds_support import xds_config as make_xds_config
from test_connectivity import FakeGrpcChannel, make_monitor

from pyxds.channel.subchannel import PolledTransport, backoff_from_options
from pyxds.channel.subchannel_pool import SubchannelPool
from pyxds.lb import ConnectivityState, Endpoint, PickComplete, ResolverUpdate
from pyxds.lb.pick_first import PickFirst, PickFirstConfig, interleave_families, order_addresses
from pyxds.lb.subchannel_list import unique_addresses
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock, FakeHelper

IDLE, CONNECTING, READY, TF, SHUTDOWN = (s.value[0] for s in grpc.ChannelConnectivity)


# -- pick_first: one endpoint of one address ------------------------------------


def _general(endpoints: list[Endpoint]) -> tuple[tuple[str, ...], dict[str, Mapping[str, Any]]]:
    """A61's steps without any shortcut: flatten, dedupe, interleave."""
    pairs = unique_addresses(endpoints)
    return tuple(interleave_families([a for a, _ in pairs])), dict(pairs)


@pytest.mark.parametrize(
    "address", ["10.0.0.1:80", "[::1]:80", "unix:/tmp/s", "unix-abstract:x", "host.example:443"]
)
def test_one_endpoint_of_one_address_orders_as_the_general_steps(address: str) -> None:
    attributes = MappingProxyType({"weight": 3, "name": "a"})
    endpoint = Endpoint((address,), attributes)
    order, by_address = order_addresses([endpoint], False, None)
    assert (order, by_address) == _general([endpoint])
    assert by_address[address] is attributes  # the endpoint's own mapping, as before


def test_several_addresses_or_endpoints_still_take_the_general_steps() -> None:
    dual = Endpoint(("10.0.0.1:80", "[::1]:80", "10.0.0.2:80", "[::2]:80"))
    two = [Endpoint(("10.0.0.1:80",)), Endpoint(("[::1]:80", "10.0.0.1:80"))]
    assert order_addresses([dual], False, None) == _general([dual])
    assert order_addresses([dual], False, None)[0] == (
        "10.0.0.1:80",
        "[::1]:80",
        "10.0.0.2:80",
        "[::2]:80",
    )
    assert order_addresses(two, False, None) == _general(two)


def test_interleaving_one_address_or_none_gives_it_back() -> None:
    assert interleave_families(["[::1]:80"]) == ["[::1]:80"]
    assert interleave_families([]) == []


def test_shuffling_needs_a_generator() -> None:
    with pytest.raises(ValueError, match="random generator"):
        order_addresses([Endpoint(("10.0.0.1:80",))], True, None)


class _CountingRandom(FakeHelper):
    """A helper whose ``random`` counts its reads (a DelegatingHelper reads
    it through every level of the tree above the policy)."""

    def __init__(self) -> None:
        super().__init__()
        self.random_reads = 0

    @property
    def random(self) -> random.Random:
        self.random_reads += 1
        return random.Random(7)

    @random.setter
    def random(self, value: random.Random) -> None:
        pass


def test_pick_first_reads_the_helper_random_only_to_shuffle() -> None:
    helper = _CountingRandom()
    policy = PickFirst(helper)
    endpoints = (Endpoint(("10.0.0.1:80",)), Endpoint(("10.0.0.2:80",)))
    policy.update(ResolverUpdate(endpoints, PickFirstConfig(shuffle_address_list=False)))
    assert helper.random_reads == 0
    assert policy.addresses == ("10.0.0.1:80", "10.0.0.2:80")
    policy.update(ResolverUpdate(endpoints[::-1], PickFirstConfig(shuffle_address_list=True)))
    assert helper.random_reads == 1
    policy.shutdown()


# -- the channel's side: one subchannel per new endpoint ---------------------------


def test_subchannels_of_one_pool_get_their_own_backoff_from_the_channel_options() -> None:
    options = (("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 500))
    rng = random.Random(3)
    pool = SubchannelPool(
        lambda *args: None,  # type: ignore[arg-type]  # nothing connects here
        WorkSerializer(),
        FakeClock(),
        rng,
        None,
        options,
    )
    a = pool.create("10.0.0.1:80", {}).core
    b = pool.create("10.0.0.2:80", {}).core
    assert a._backoff is not b._backoff
    expected = backoff_from_options(options, random.Random(0))
    for backoff in (a._backoff, b._backoff):
        assert (backoff._initial, backoff._max) == (expected._initial, expected._max) == (0.2, 0.5)
        assert backoff._rng is rng
    a._backoff.next_delay()
    a._backoff.next_delay()
    assert b._backoff._current is None  # one subchannel's failures are its own


def test_a_polled_transport_hears_its_channel_state_codes_until_closed() -> None:
    monitor, clock = make_monitor()
    channel = FakeGrpcChannel()
    seen: list[grpc.ChannelConnectivity] = []
    transport = PolledTransport(channel, seen.append, monitor)  # type: ignore[arg-type]
    clock.advance(0)
    channel.set(CONNECTING)
    transport.connect()
    clock.advance(0.01)
    channel.set(READY)
    clock.advance(0.01)
    assert seen == [
        grpc.ChannelConnectivity.IDLE,
        grpc.ChannelConnectivity.CONNECTING,
        grpc.ChannelConnectivity.READY,
    ]
    transport.retire()
    channel.set(IDLE)
    clock.advance(1.0)
    transport(IDLE)  # a report already on its way when it closed
    assert seen[-1] is grpc.ChannelConnectivity.READY
    assert channel.closes == 1


def test_retiring_transports_share_no_state_but_their_lock() -> None:
    """The transports' lock is shared: each one still closes exactly once,
    when its own last RPC ends."""
    monitor, clock = make_monitor()
    channels = [FakeGrpcChannel() for _ in range(3)]
    transports = [PolledTransport(c, lambda s: None, monitor) for c in channels]  # type: ignore[arg-type]
    assert transports[0].call_started()
    for transport in transports:
        transport.retire()
    clock.advance(0)
    assert [c.closes for c in channels] == [0, 1, 1]
    assert not transports[1].call_started()  # closed: no RPC starts on it
    transports[0].call_finished()
    clock.advance(0)
    assert [c.closes for c in channels] == [1, 1, 1]
    assert all(t.close_done.is_set() for t in transports)


# -- the LB tree: watchers and GC-tracked objects per endpoint -----------------------


class _LastState(FakeHelper):
    """Keeps only its last state, as a channel keeps only its last picker."""

    def update_state(self, state: ConnectivityState, status: Any, picker: Any) -> None:
        super().update_state(state, status, picker)
        del self.states[:-1]


def _cds_tree(per_locality: int, localities: int = 4) -> tuple[FakeHelper, Any]:
    helper, policy, config = build([{"cds_experimental": {"cluster": "c1"}}], _LastState())
    entry = eds_entry(
        eds_cluster("c1"),
        [
            locality(f"r{i}", [f"10.{i}.{j // 250}.{j % 250}:80" for j in range(per_locality)])
            for i in range(localities)
        ],
    )
    policy.update(cds_update(config, make_xds_config({"c1": entry})))
    connect_all(helper)
    return helper, policy


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_an_endpoint_keeps_at_most_36_gc_tracked_objects_in_the_lb_tree() -> None:
    """cds -> ... -> round_robin -> pick_first, READY, per endpoint: every
    layer's objects, FakeSubchannel's own included (issue 18: a full
    collection walks each of them; 39 here before pick_first's entries and
    the outlier_detection and override_host wrappers became their
    subchannels' watchers themselves, 36 after)."""
    _cds_tree(25)[1].shutdown()  # one-time caches and registrations first
    start = _tracked()
    small = _cds_tree(25)  # a tree's own objects + 100 endpoints'
    with_small = _tracked()
    large = _cds_tree(275)  # a tree's own objects + 1100 endpoints'
    with_both = _tracked()
    per_endpoint = ((with_both - with_small) - (with_small - start)) / 1000
    assert isinstance(large[0].pick(), PickComplete)
    assert per_endpoint <= 36.5, per_endpoint
    for _helper, policy in (small, large):
        policy.shutdown()


def test_a_shut_down_endpoint_leaves_no_watcher_on_its_subchannel() -> None:
    """Each wrapper watches the one below it with itself: shutting the tree
    down removes every watcher it added (Unwatch matches the watcher)."""
    helper, policy = _cds_tree(5)
    subchannels = helper.live_subchannels()
    assert all(len(s._watchers) == 1 for s in subchannels)
    states = {s.address: s.state for s in subchannels}
    assert set(states.values()) == {ConnectivityState.READY}
    policy.shutdown()
    assert all(s._watchers == [] for s in subchannels)
