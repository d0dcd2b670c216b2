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
import tracemalloc
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
from pyxds.lb import (
    ConnectivityState,
    Endpoint,
    Helper,
    PickComplete,
    ResolverUpdate,
    Subchannel,
)
from pyxds.lb.api import address_set
from pyxds.lb.cds import (
    CLUSTER_NAME_ATTRIBUTE,
    HASH_KEY_ATTRIBUTE,
    HASH_KEY_BACKWARD_COMPAT_ENV,
    HEALTH_STATUS_ATTRIBUTE,
    LOCALITY_ATTRIBUTE,
    LOCALITY_WEIGHT_ATTRIBUTE,
    WEIGHT_ATTRIBUTE,
    _locality_endpoints,
)
from pyxds.lb.child_handler import DelegatingHelper
from pyxds.lb.hierarchy import PATH_KEY, split
from pyxds.lb.pick_first import PickFirst, PickFirstConfig, interleave_families, order_addresses
from pyxds.lb.subchannel_list import unique_addresses
from pyxds.security.tls_config import ADDRESS_NAME_ATTRIBUTE
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock, FakeHelper
from pyxds.xds.resources.types import EndpointAddress, Locality, LocalityName

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


def test_an_endpoint_keeps_at_most_28_gc_tracked_objects_in_the_lb_tree() -> None:
    """cds -> ... -> round_robin -> pick_first, READY, per endpoint: every
    layer's objects, FakeSubchannel's own included (issue 18: a full
    collection walks each of them; 39 here before pick_first's entries and
    the outlier_detection and override_host wrappers became their
    subchannels' watchers themselves, 36 after; 32 since the endpoints of a
    locality share one attributes mapping and one view of it per level; 30
    since the outlier_detection and override_host wrappers keep their one
    watcher without a list; 29 since outlier_detection and round_robin key
    an endpoint by one shared address set; 28 since outlier_detection keeps
    an endpoint's one wrapper without a set)."""
    _cds_tree(25)[1].shutdown()  # one-time caches and registrations first
    start = _tracked()
    small = _cds_tree(25)  # a tree's own objects + 100 endpoints'
    with_small = _tracked()
    large = _cds_tree(275)  # a tree's own objects + 1100 endpoints'
    with_both = _tracked()
    per_endpoint = ((with_both - with_small) - (with_small - start)) / 1000
    assert isinstance(large[0].pick(), PickComplete)
    assert per_endpoint <= 28.5, per_endpoint
    for _helper, policy in (small, large):
        policy.shutdown()


def test_an_endpoint_keeps_at_most_3_6_kb_of_python_objects_in_the_lb_tree() -> None:
    """The same tree's bytes per endpoint (tracemalloc; issue 18, memory per
    endpoint): ~3.86 KB before outlier_detection dropped its set per
    endpoint and pick_first its dict of one address; ~3.5 KB after."""
    _cds_tree(25)[1].shutdown()  # one-time caches and registrations first
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        small = _cds_tree(25)
        gc.collect()
        with_small = tracemalloc.get_traced_memory()[0]
        large = _cds_tree(125)  # 500 endpoints: 400 more than the small tree
        gc.collect()
        with_both = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    per_endpoint = ((with_both - with_small) - (with_small - start)) / 400
    assert isinstance(large[0].pick(), PickComplete)
    assert per_endpoint <= 3600, per_endpoint
    for _helper, policy in (small, large):
        policy.shutdown()


def test_a_shut_down_endpoint_leaves_no_watcher_on_its_subchannel() -> None:
    """Each wrapper watches the one below it with itself: shutting the tree
    down removes every watcher it added (the handle matches the watcher)."""
    helper, policy = _cds_tree(5)
    subchannels = helper.live_subchannels()
    assert all(len(s._watchers) == 1 for s in subchannels)
    states = {s.address: s.state for s in subchannels}
    assert set(states.values()) == {ConnectivityState.READY}
    policy.shutdown()
    assert all(s._watchers == [] for s in subchannels)


# -- cds: one attributes mapping per locality, one view of it per level --------


def _entry_attributes(
    cluster: str, child: str, loc: Locality, address: EndpointAddress, hash_keys: bool
) -> dict[str, Any]:
    """What cds gave each endpoint before the mappings were shared: one dict
    built from that endpoint's EDS entry alone."""
    attributes: dict[str, Any] = {
        PATH_KEY: (child, str(loc.name)),
        WEIGHT_ATTRIBUTE: loc.weight * address.weight,
        LOCALITY_ATTRIBUTE: loc.name,
        LOCALITY_WEIGHT_ATTRIBUTE: loc.weight,
        HEALTH_STATUS_ATTRIBUTE: address.health_status,
        CLUSTER_NAME_ATTRIBUTE: cluster,
    }
    if address.hash_key and hash_keys:
        attributes[HASH_KEY_ATTRIBUTE] = address.hash_key
    if address.hostname:
        attributes[ADDRESS_NAME_ATTRIBUTE] = address.hostname
    return attributes


_MIXED = Locality(
    LocalityName("r", "z", ""),
    3,
    (
        EndpointAddress(("10.0.0.1:80",)),
        EndpointAddress(("10.0.0.2:80",)),
        EndpointAddress(("10.0.0.3:80",), weight=2),
        EndpointAddress(("10.0.0.4:80",), health_status="HEALTHY"),
        EndpointAddress(("10.0.0.5:80",), hostname="b5.example"),
        EndpointAddress(("10.0.0.6:80",), hash_key="k6"),
        EndpointAddress(("10.0.0.7:80",)),
        EndpointAddress(("10.0.0.8:80",), weight=2),
    ),
)


@pytest.mark.parametrize("hash_keys", [False, True])
def test_endpoints_of_a_locality_get_the_attributes_of_their_own_entry(
    hash_keys: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared or not, each endpoint's attributes are exactly those its own
    EDS entry gives (weight, health status, hostname, A76 hash key)."""
    monkeypatch.setenv(HASH_KEY_BACKWARD_COMPAT_ENV, "false" if hash_keys else "true")
    built = _locality_endpoints("c1", "c1[0]", _MIXED)
    assert [e.addresses for e in built] == [a.addresses for a in _MIXED.endpoints]
    for endpoint, address in zip(built, _MIXED.endpoints, strict=True):
        assert dict(endpoint.attributes) == _entry_attributes(
            "c1", "c1[0]", _MIXED, address, hash_keys
        )
        assert isinstance(endpoint.attributes, MappingProxyType)  # read-only, as before


@pytest.mark.parametrize("hash_keys", [False, True])
def test_endpoints_with_equal_attributes_share_one_mapping(
    hash_keys: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One mapping per distinct set of attribute values in a locality, not
    one per endpoint (issue 18: a 10,000-endpoint cluster's GC objects)."""
    monkeypatch.setenv(HASH_KEY_BACKWARD_COMPAT_ENV, "false" if hash_keys else "true")
    built = _locality_endpoints("c1", "c1[0]", _MIXED)
    plain = built[0].attributes
    assert built[1].attributes is plain and built[6].attributes is plain
    assert built[2].attributes is built[7].attributes  # both weight 2
    others = [built[i].attributes for i in (2, 3, 4)]
    assert all(a is not plain for a in others)
    # the hash key counts only where A76 uses it
    assert (built[5].attributes is plain) is not hash_keys
    assert len({id(e.attributes) for e in built}) == (5 if hash_keys else 4)
    # another locality never shares the first one's mapping (its name differs)
    other = Locality(LocalityName("r", "y", ""), 3, _MIXED.endpoints[:1])
    assert _locality_endpoints("c1", "c1[0]", other)[0].attributes is not plain


def test_endpoints_that_share_a_mapping_share_its_view_at_each_level() -> None:
    """split strips the path once per mapping: endpoints sharing one share
    the stripped view, and read the same values as with a view each."""
    built = _locality_endpoints("c1", "c1[0]", _MIXED)
    first = split(built)
    assert list(first) == ["c1[0]"]
    level1 = first["c1[0]"]
    assert [e.addresses for e in level1] == [e.addresses for e in built]
    assert level1[0].attributes is level1[1].attributes is level1[6].attributes
    assert level1[2].attributes is not level1[0].attributes
    second = split(level1)
    level2 = second[str(_MIXED.name)]
    assert level2[0].attributes is level2[1].attributes
    for top, one, two in zip(built, level1, level2, strict=True):
        assert dict(one.attributes) == {**top.attributes, PATH_KEY: (str(_MIXED.name),)}
        assert dict(two.attributes) == {**top.attributes, PATH_KEY: ()}
        assert one.attributes.get(WEIGHT_ATTRIBUTE) == top.attributes[WEIGHT_ATTRIBUTE]
    # split again: each endpoint gives the very same object as before
    assert [a is b for a, b in zip(split(built)["c1[0]"], level1, strict=True)] == [True] * 8


def test_two_mappings_with_one_path_get_views_of_their_own() -> None:
    a = Endpoint(("10.0.0.1:80",), {PATH_KEY: ("p", "l"), "weight": 1})
    b = Endpoint(("10.0.0.2:80",), {PATH_KEY: ("p", "l"), "weight": 2})
    below = split([a, b])["p"]
    assert below[0].attributes is not below[1].attributes
    assert [e.attributes["weight"] for e in below] == [1, 2]


# -- delegating helpers: clock, random and create_subchannel in one step --------


class _Wrapping(DelegatingHelper):
    """A level that makes its own subchannels (as xds_cluster_impl does)."""

    def __init__(self, parent: Helper) -> None:
        super().__init__(parent)
        self.made: list[str] = []

    def create_subchannel(self, address: str, attributes: Mapping[str, Any]) -> Subchannel:
        self.made.append(address)
        return self.parent.create_subchannel(address, attributes)


def _chain(root: Helper, depth: int) -> list[DelegatingHelper]:
    levels: list[DelegatingHelper] = []
    parent = root
    for _ in range(depth):
        parent = DelegatingHelper(parent)
        levels.append(parent)
    return levels


def test_a_delegating_helper_reads_clock_and_random_from_the_top_of_its_run() -> None:
    """Every level of a run of delegating helpers sees the helper above the
    run's clock and random, as when each level asked its parent, including
    a random replaced after the run was built; the levels between are not
    asked (round_robin reads random on each READY report, 7 levels down)."""
    root = FakeHelper()
    levels = _chain(root, 7)
    leaf = levels[-1]
    assert leaf.clock is root.clock and leaf.random is root.random
    root.random = random.Random(5)
    assert leaf.random is root.random and levels[2].random is root.random
    for level in levels[:-1]:
        level.parent = None  # type: ignore[assignment]  # nothing between is read
    assert leaf.random is root.random and leaf.clock is root.clock


class _OwnClock(DelegatingHelper):
    """A custom policy's helper that gives its children a clock of its own."""

    def __init__(self, parent: Helper, clock: Any) -> None:
        super().__init__(parent)
        self._own = clock

    @property
    def clock(self) -> Any:
        return self._own


def test_a_helper_with_its_own_clock_starts_a_run_of_its_own() -> None:
    """The shortcut skips only levels that cannot change clock or random: a
    level whose class gives its own clock is what the levels below see."""
    root = FakeHelper()
    own = FakeClock()
    middle = _OwnClock(_chain(root, 2)[-1], own)
    leaf = _chain(middle, 3)[-1]
    assert leaf.clock is own
    assert leaf.random is root.random


def test_create_subchannel_passes_every_level_that_makes_subchannels() -> None:
    """A level that overrides create_subchannel still sees each new
    subchannel; the forwarding levels around it are skipped."""
    root = FakeHelper()
    middle = _Wrapping(_chain(root, 3)[-1])
    leaf = _chain(middle, 4)[-1]
    top = _Wrapping(leaf)
    subchannel = top.create_subchannel("10.0.0.1:80", {"a": 1})
    assert subchannel is root.subchannels[-1]
    assert (top.made, middle.made) == (["10.0.0.1:80"], ["10.0.0.1:80"])
    assert subchannel.attributes == {"a": 1}
    # a subclass that forwards (no override) is skipped like the base class
    assert _chain(root, 1)[0].create_subchannel("10.0.0.2:80", {}) is root.subchannels[-1]


# -- one address set per endpoint for the whole tree ---------------------------


def test_an_endpoint_address_set_is_made_once_and_is_not_part_of_its_value() -> None:
    endpoint = Endpoint(("10.0.0.2:80", "10.0.0.1:80"), {"weight": 1})
    twin = Endpoint(("10.0.0.2:80", "10.0.0.1:80"), {"weight": 1})
    key = address_set(endpoint)
    assert key == frozenset(endpoint.addresses) and address_set(endpoint) is key
    assert endpoint == twin and hash(endpoint) == hash(twin) and repr(endpoint) == repr(twin)
    assert address_set(twin) == key and address_set(twin) is not key


def test_split_hands_the_address_set_to_the_endpoint_below() -> None:
    """outlier_detection keys the endpoints it sees before weighted_target
    splits them for round_robin: both levels then hold the same set."""
    keyed = Endpoint(("10.0.0.1:80",), {PATH_KEY: ("a", "b")})
    unkeyed = Endpoint(("10.0.0.2:80",), {PATH_KEY: ("a", "b")})
    key = address_set(keyed)
    below = split([keyed, unkeyed])["a"]
    assert address_set(below[0]) is key
    assert address_set(below[1]) == frozenset({"10.0.0.2:80"})  # made when asked
    assert address_set(split([unkeyed])["a"][0]) is address_set(below[1])  # same object below
