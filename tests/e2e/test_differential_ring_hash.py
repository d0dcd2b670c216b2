"""Differential: RING_HASH clusters (gRFC A42, A61 pick_first children)
through pyxds and through grpcio's C-core ``xds:///`` channel against the
same pyxds.server and backends.  Both build the ring from XXH64 of
"address_N" and hash the request with XXH64, so C-core is the reference for
*which* backend each key lands on, not only for stickiness.

Scenarios follow C-core's xds_ring_hash_end2end_test: HeaderHashing,
ChannelIdHashing (sticky per channel; the ids differ, so not compared),
HeaderHashingWithRegexRewrite, ContinuesPastTerminalPolicyThatDoesNot
ProduceResult, FixedHashingTerminalPolicy, combined policies, the
RandomHashingDistributionAccordingTo*Weight tests made exact (per-key
agreement means the same ring), ring sizes from the A52 RingHash
extension, TransientFailureCheckNextOne (an endpoint unreachable from the
start), ReattemptWhenAllEndpointsUnreachable / TransientFailureSkipTo
AvailableReady, SwitchToLowerPrioirtyAndThenBack.  Every scenario agreed
with C-core 1.85.1; none needed a pyxds-only assertion.
"""

from __future__ import annotations

import pytest
import xxhash
from channel_fixtures import (
    TARGET,
    Backend,
    CoreXdsClient,
    pyxds_calls,
    route,
    snapshot,
    wait_until,
)
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from google.protobuf import wrappers_pb2

import pyxds._api as pyxds
from pyxds.lb.ring_hash import DEFAULT_MIN_RING_SIZE, RING_SIZE_CAP, build_ring
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

FAST_BACKOFF = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 300)]
NODE = "differential-ring-hash"
USERS = [f"user-{i}" for i in range(24)]


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backends():
    started = [Backend(f"r{i}").start() for i in range(4)]
    yield started
    for backend in started:
        backend.stop()


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id=NODE))
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(server):
    ch = pyxds.insecure_channel(
        TARGET, bootstrap=server.bootstrap(node_id=NODE), options=FAST_BACKOFF
    )
    yield ch
    ch.close()


def ring_hash_snapshot(
    addresses: list[str],
    hash_policies: list,
    *,
    localities: list | None = None,
    load_balancing_policy=None,
) -> Snapshot:
    """One route (``hash_policies``) to the RING_HASH cluster "rh", whose
    endpoints are ``addresses`` in one locality unless ``localities`` is given."""
    base = snapshot([route(prefix="", cluster="rh", hash_policies=hash_policies)], {"rh": []})
    listener_t, route_t, _cluster_t, _eds_t = list(base._by_type)
    if localities is None:
        localities = [b.locality(zone="rh-z", endpoints=addresses)]
    return Snapshot(
        listeners=list(base.resources(listener_t).values()),
        routes=list(base.resources(route_t).values()),
        clusters=[
            b.cluster("rh", lb_policy="RING_HASH", load_balancing_policy=load_balancing_policy)
        ],
        endpoints=[b.endpoints("rh", localities)],
    )


def landing(client, user: str, n: int = 3) -> dict:
    """Where ``n`` RPCs carrying ``user`` land (queued until connected)."""
    metadata = [("user", user)]
    if isinstance(client, CoreXdsClient):
        return dict(client.call(n, metadata=metadata, timeout=10.0, wait_for_ready=True))
    return dict(
        pyxds_calls(client, n, metadata=metadata, timeout=10.0, wait_for_ready=True, details=True)
    )


def test_header_hash_sends_each_key_to_the_same_backend_as_c_core(server, backends, core, channel):
    server.set_snapshot(
        ring_hash_snapshot([x.address for x in backends], [b.hash_policy(header="user")])
    )
    assert wait_until(lambda: len(landing(channel, USERS[0])) == 1, 10)
    assert wait_until(lambda: len(landing(core, USERS[0])) == 1, 10)
    ours = {}
    for user in USERS:
        mine, theirs = landing(channel, user), landing(core, user)
        assert len(mine) == 1, (user, mine)  # sticky: every RPC of a key on one backend
        assert mine == theirs, (user, mine, theirs)
        ours[user] = next(iter(mine))
    # The keys spread: the ring is not degenerate.
    assert len(set(ours.values())) >= 3, ours


def test_a_key_whose_backend_is_down_moves_to_the_same_next_backend_as_c_core(
    server, backends, core, channel
):
    server.set_snapshot(
        ring_hash_snapshot([x.address for x in backends], [b.hash_policy(header="user")])
    )
    user = USERS[5]
    assert wait_until(lambda: landing(channel, user) == landing(core, user), 10)
    home = next(iter(landing(channel, user)))
    victim = next(x for x in backends if x.name == home)
    victim.stop()
    try:
        assert wait_until(lambda: home not in landing(channel, user, 2), 15)
        assert wait_until(lambda: home not in landing(core, user, 2), 15)
        mine, theirs = landing(channel, user), landing(core, user)
        assert len(mine) == 1 and mine == theirs, (mine, theirs)
    finally:
        victim.start()


def test_without_a_hash_policy_both_spread_rpcs_over_the_ring(server, backends, core, channel):
    # No hash policy: each RPC gets a random hash (C-core's resolver draws one).
    server.set_snapshot(ring_hash_snapshot([x.address for x in backends], []))

    def spread(client) -> int:
        if isinstance(client, CoreXdsClient):
            seen = client.call(40, timeout=10.0, wait_for_ready=True)
        else:
            seen = pyxds_calls(client, 40, timeout=10.0, wait_for_ready=True)
        return len([k for k in seen if not k.startswith("error")])

    assert wait_until(lambda: spread(channel) >= 3, 15)
    assert wait_until(lambda: spread(core) >= 3, 15)


# -- more scenarios from C-core's xds_ring_hash_end2end_test ----------------------


def lands(client, metadata: list[tuple[str, str]], n: int = 3, timeout: float = 10.0) -> dict:
    """Where ``n`` wait_for_ready RPCs carrying ``metadata`` land."""
    if isinstance(client, CoreXdsClient):
        return dict(client.call(n, metadata=metadata, timeout=timeout, wait_for_ready=True))
    return dict(pyxds_calls(client, n, metadata=metadata, timeout=timeout, wait_for_ready=True))


def same_landings(channel, core, requests: dict, until=None, timeout: float = 10.0) -> dict:
    """Wait (bounded) until, for every request (name -> metadata), pyxds and
    C-core each send all RPCs to one backend and it is the same backend, and
    the landings satisfy ``until`` (the scenario's expectation); asserts on
    the last disagreement.  Returns name -> backend.

    A snapshot just pushed reaches the two clients at different moments,
    and until it has reached both they may well agree on the *previous*
    ring: ``until`` makes the wait last until the new configuration is what
    both apply.  Waiting also absorbs connections still coming up after an
    earlier scenario's restarts; a real disagreement persists and fails."""
    last: dict = {}

    def agree() -> bool:
        last.clear()
        for name, metadata in requests.items():
            mine, theirs = lands(channel, metadata), lands(core, metadata)
            if len(mine) != 1 or mine != theirs:
                last[name] = (mine, theirs)
                return False
            last[name] = next(iter(mine))
        return until is None or bool(until(last))

    assert wait_until(agree, timeout, interval=0.1), {
        k: v for k, v in last.items() if isinstance(v, tuple)
    } or ("expectation not met", dict(last))
    return dict(last)


def expected_landings(
    backends, addresses: list[str], weights: list[int], keys, low=None, high=None
) -> dict:
    """key -> the backend A42's ring over ``addresses`` sends it to (the ring
    both clients must build: C-core's construction, capped sizes)."""
    ring = build_ring(addresses, weights, low or DEFAULT_MIN_RING_SIZE, high or RING_SIZE_CAP)
    name = {x.address: x.name for x in backends}
    return {
        key: name[addresses[ring.endpoints[ring.start(xxhash.xxh64_intdigest(key.encode()))]]]
        for key in keys
    }


def user_requests(header: str = "user", users: list[str] = USERS) -> dict:
    return {user: [(header, user)] for user in users}


def hashes_to(address: str) -> str:
    """A header value whose XXH64 is the hash of ``address``'s first ring
    entry ("<address>_0"), so its RPCs start the ring walk there."""
    return f"{address}_0"


def test_channel_id_hashing_keeps_every_rpc_of_a_channel_on_one_backend(
    server, backends, core, channel
):
    # C-core ChannelIdHashing.  The channel ids are random per channel, so
    # the two clients may pick different backends; each must be sticky.
    server.set_snapshot(
        ring_hash_snapshot([x.address for x in backends], [b.hash_policy(channel_id=True)])
    )
    assert wait_until(lambda: len(lands(channel, [], 30)) == 1, 10)
    assert wait_until(lambda: len(lands(core, [], 30)) == 1, 10)

    # A header the route does not hash on changes nothing.  (Waited for: a
    # backend an earlier scenario restarted may come back in between, and
    # every RPC of the channel then moves to it together.)
    def one_backend(client) -> set:
        return {b for u in USERS[:8] for b in lands(client, [("user", u)], 2)}

    assert wait_until(lambda: len(one_backend(channel)) == 1, 10), one_backend(channel)
    assert wait_until(lambda: len(one_backend(core)) == 1, 10), one_backend(core)


def test_header_hash_with_regex_rewrite_matches_c_core(server, backends, core, channel):
    # C-core HeaderHashingWithRegexRewrite: "[0-9]+" -> "foo" folds every
    # key onto one value, hence one backend.
    addresses = [x.address for x in backends]
    server.set_snapshot(
        ring_hash_snapshot(
            addresses, [b.hash_policy(header="user", regex="[0-9]+", substitution="foo")]
        )
    )
    # hashes_to() values differ only in digits: without the rewrite they
    # would spread over all four backends.
    folded = same_landings(
        channel,
        core,
        {a: [("user", hashes_to(a))] for a in addresses},
        until=lambda got: len(set(got.values())) == 1,
    )
    assert len(set(folded.values())) == 1, folded
    # A rewrite with a group: keys collapse by their last digit, so the
    # per-key agreement checks RE2 GlobalReplace semantics in both stacks.
    server.set_snapshot(
        ring_hash_snapshot(
            addresses,
            [b.hash_policy(header="user", regex=r"^user-\d*?(\d)$", substitution=r"k\1")],
        )
    )
    got = same_landings(
        channel,
        core,
        user_requests(),
        # (and no longer the first rewrite's single landing: under load the
        # second snapshot may not have reached both clients yet)
        until=lambda got: (
            all(got[u] == got[f"user-{u[-1]}"] for u in USERS) and len(set(got.values())) >= 2
        ),
    )
    for user in USERS:
        twin = f"user-{user[-1]}"
        assert got[user] == got[twin], (user, twin, got)
    assert len(set(got.values())) >= 2, got


def test_multiple_hash_policies_and_terminal_match_c_core(server, backends, core, channel):
    addresses = [x.address for x in backends]
    target = backends[2]

    # C-core ContinuesPastTerminalPolicyThatDoesNotProduceResult: a terminal
    # policy on an absent header does not stop the walk.
    server.set_snapshot(
        ring_hash_snapshot(
            addresses,
            [b.hash_policy(header="absent", terminal=True), b.hash_policy(header="user")],
        )
    )
    got = same_landings(
        channel,
        core,
        {"t": [("user", hashes_to(target.address))]},
        until=lambda got: got["t"] == target.name,
    )
    assert got["t"] == target.name, got

    # C-core FixedHashingTerminalPolicy: once "user" produced a hash, the
    # later "noise" policy is ignored, whatever its value.
    server.set_snapshot(
        ring_hash_snapshot(
            addresses,
            [b.hash_policy(header="user", terminal=True), b.hash_policy(header="noise")],
        )
    )
    requests = {f"{i}": [("user", hashes_to(target.address)), ("noise", f"n{i}")] for i in range(8)}
    got = same_landings(
        channel, core, requests, until=lambda got: set(got.values()) == {target.name}
    )
    assert set(got.values()) == {target.name}, got

    # Without terminal both headers feed the hash (rotl64(h, 1) ^ v): the
    # per-key agreement proves the same combination; a repeated header is
    # hashed as its values joined with ",".
    server.set_snapshot(
        ring_hash_snapshot(addresses, [b.hash_policy(header="user"), b.hash_policy(header="team")])
    )
    requests = {u: [("user", u), ("team", f"team-{i % 3}")] for i, u in enumerate(USERS)}
    requests["repeated"] = [("user", "a"), ("user", "b"), ("team", "x")]
    requests["joined"] = [("user", "a,b"), ("team", "x")]
    got = same_landings(channel, core, requests, until=lambda got: len(set(got.values())) >= 3)
    assert got["repeated"] == got["joined"], got
    assert len(set(got.values())) >= 3, got


KEYS = [f"key-{i}" for i in range(48)]


def test_endpoint_and_locality_weights_build_the_same_ring_as_c_core(
    server, backends, core, channel
):
    # C-core RandomHashingDistributionAccordingTo{Endpoint,LocalityAndEndpoint}
    # Weight, made exact: instead of sampling the distribution, every key
    # must land where C-core sends it, which holds only for the same ring
    # (same weights, locality x endpoint, same scale).
    r0, r1, r2, r3 = (x.address for x in backends)
    localities = [
        b.locality(zone="w-a", weight=1, endpoints=[b.endpoint(r0, weight=1), b.endpoint(r1, 5)]),
        b.locality(zone="w-b", weight=3, endpoints=[b.endpoint(r2, weight=2), r3]),
    ]
    server.set_snapshot(
        ring_hash_snapshot([], [b.hash_policy(header="key")], localities=localities)
    )
    # cds gives each endpoint locality weight x endpoint weight (A42).
    expected = expected_landings(backends, [r0, r1, r2, r3], [1, 5, 6, 3], KEYS)
    got = same_landings(channel, core, user_requests("key", KEYS), until=expected.__eq__)
    assert got == expected
    assert len(set(got.values())) >= 3, got


def test_ring_size_from_the_a52_ring_hash_extension_matches_c_core(server, backends, core, channel):
    # min/max ring size through load_balancing_policy (A52) RingHash.  A
    # ring of 6 entries places keys very differently from the default
    # 1024..4096 one, so the expected backend below (computed from A42's
    # construction with the configured sizes) shows both clients used them.
    small = ring_hash_pb2.RingHash(
        minimum_ring_size=wrappers_pb2.UInt64Value(value=6),
        maximum_ring_size=wrappers_pb2.UInt64Value(value=6),
    )
    addresses = [x.address for x in backends]
    weights = [1, 2, 1, 3]
    localities = [
        b.locality(
            zone="small",
            endpoints=[b.endpoint(a, weight=w) for a, w in zip(addresses, weights, strict=True)],
        )
    ]
    server.set_snapshot(
        ring_hash_snapshot(
            [], [b.hash_policy(header="key")], localities=localities, load_balancing_policy=small
        )
    )
    # min(norm) = 1/7 asks for 7 entries; maximum_ring_size caps the ring at 6.
    ring = build_ring(addresses, weights, 6, 6)
    assert len(ring) == 6 and set(ring.endpoints) == {0, 1, 2, 3}, ring
    expected = {
        key: backends[ring.endpoints[ring.start(xxhash.xxh64_intdigest(key.encode()))]].name
        for key in KEYS
    }
    got = same_landings(channel, core, user_requests("key", KEYS), until=expected.__eq__)
    assert got == expected, {k: (got[k], expected[k]) for k in KEYS if got[k] != expected[k]}


def fast(client, metadata: list[tuple[str, str]], n: int = 1) -> dict:
    """``n`` RPCs that do not wait for ready (1 s deadline)."""
    if isinstance(client, CoreXdsClient):
        return dict(client.call(n, metadata=metadata, timeout=1.0, wait_for_ready=False))
    return dict(pyxds_calls(client, n, metadata=metadata, timeout=1.0, wait_for_ready=False))


def test_a_key_on_an_endpoint_unreachable_from_the_start_walks_on_like_c_core(
    server, backends, core, channel, ports
):
    # C-core TransientFailureCheckNextOne: the key starts the walk on an
    # endpoint nothing listens on; it fails to connect (TRANSIENT_FAILURE)
    # and the walk moves on to the next ring entry of another endpoint.
    dead = ports.dead_address()
    addresses = [dead, *(x.address for x in backends)]
    server.set_snapshot(ring_hash_snapshot(addresses, [b.hash_policy(header="user")]))
    ring = build_ring(addresses, [1] * len(addresses), DEFAULT_MIN_RING_SIZE, RING_SIZE_CAP)
    position = ring.start(xxhash.xxh64_intdigest(hashes_to(dead).encode()))
    assert ring.endpoints[position] == 0  # the walk starts on the dead endpoint
    while ring.endpoints[position] == 0:
        position = (position + 1) % len(ring)
    expected = backends[ring.endpoints[position] - 1].name
    got = same_landings(
        channel,
        core,
        {"dead": [("user", hashes_to(dead))]},
        until=lambda got: got["dead"] == expected,
    )
    assert got["dead"] == expected, (got, expected)
    # The other keys still land where C-core sends them.
    same_landings(channel, core, user_requests(users=USERS[:8]))


def test_all_endpoints_down_then_one_back_both_recover(server, backends, core, channel):
    # C-core ReattemptWhenAllEndpointsUnreachable / TransientFailureSkipTo
    # AvailableReady: with every endpoint down RPCs fail; once one backend
    # is back, queued wait_for_ready RPCs complete on it, for every key.
    server.set_snapshot(
        ring_hash_snapshot([x.address for x in backends], [b.hash_policy(header="user")])
    )
    addresses = [x.address for x in backends]
    home = expected_landings(backends, addresses, [1] * 4, USERS[:4])
    same_landings(channel, core, user_requests(users=USERS[:4]), until=home.__eq__)
    survivor = backends[1]
    for backend in backends:
        backend.stop()
    try:
        md = [("user", USERS[0])]
        for client in (channel, core):
            assert wait_until(
                lambda c=client: all(k.startswith("error:") for k in fast(c, md)), 10
            ), client
        survivor.start()
        # Queued until the survivor is connected, then served by it.
        assert lands(channel, md, 1) == {survivor.name: 1}
        assert lands(core, md, 1) == {survivor.name: 1}
        got = same_landings(channel, core, user_requests(users=USERS[:12]))
        assert set(got.values()) == {survivor.name}, got
    finally:
        for backend in backends:
            if not backend.running:
                backend.start()


def test_priority_failover_and_back_with_ring_hash_matches_c_core(server, backends, core, channel):
    # C-core SwitchToLowerPrioirtyAndThenBack: a key hashed to the only
    # endpoint of priority 0 moves to priority 1 while it is down, and
    # back once it returns.
    first, second = backends[0], backends[3]
    localities = [
        b.locality(zone="p0", priority=0, endpoints=[first.address]),
        b.locality(zone="p1", priority=1, endpoints=[second.address]),
    ]
    server.set_snapshot(
        ring_hash_snapshot([], [b.hash_policy(header="user")], localities=localities)
    )
    md = [("user", hashes_to(first.address))]
    home = {"k": first.name}
    assert same_landings(channel, core, {"k": md}, until=home.__eq__) == home
    first.stop()
    try:
        for client in (channel, core):
            assert wait_until(lambda c=client: fast(c, md) == {second.name: 1}, 10), client
    finally:
        first.start()
    for client in (channel, core):
        assert wait_until(lambda c=client: fast(c, md) == {first.name: 1}, 10), client
    assert same_landings(channel, core, {"k": md}) == {"k": first.name}


def two_address_endpoint(first: str, second: str):
    """An LbEndpoint at ``first`` with ``second`` as its A61 additional address."""
    lb = b.endpoint(first)
    host, _, port = second.rpartition(":")
    extra = lb.endpoint.additional_addresses.add()
    extra.address.socket_address.address = host
    extra.address.socket_address.port_value = int(port)
    return lb


def test_an_endpoint_is_placed_by_its_first_address_and_served_on_its_second_like_c_core(
    server, backends, core, channel, ports
):
    # grpc-go TestRingHash_FallBackWithinEndpoint / C-core RingHashTest.
    # MultipleAddressesPerEndpoint: each endpoint's first address refuses
    # connections and its second (A61 additional address) is a backend.
    # The ring is built from the first addresses; a key on an endpoint's
    # entry is served by that endpoint's second address (its pick_first
    # falls back within the endpoint), not by the next endpoint.
    dead = [ports.dead_address() for _ in backends]
    lb_endpoints = [two_address_endpoint(d, x.address) for d, x in zip(dead, backends, strict=True)]
    localities = [b.locality(zone="rh-two", endpoints=lb_endpoints)]
    server.set_snapshot(
        ring_hash_snapshot([], [b.hash_policy(header="user")], localities=localities)
    )
    ring = build_ring(dead, [1] * len(dead), DEFAULT_MIN_RING_SIZE, RING_SIZE_CAP)
    requests = {f"e{i}": [("user", hashes_to(d))] for i, d in enumerate(dead)}
    expected = {}
    for name, metadata in requests.items():
        owner = ring.endpoints[ring.start(xxhash.xxh64_intdigest(metadata[0][1].encode()))]
        expected[name] = backends[owner].name
    assert expected == {f"e{i}": x.name for i, x in enumerate(backends)}
    got = same_landings(channel, core, requests, until=expected.__eq__, timeout=15.0)
    assert got == expected
