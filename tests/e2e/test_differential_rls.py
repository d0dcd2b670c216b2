"""Differential: RLS (the xDS RouteLookupClusterSpecifier plugin and the
rls_experimental policy), pyxds against grpcio's C-core ``xds:///`` channel,
same pyxds.server, same pyxds.server.RouteLookupServer, same backends.

grpcio 1.85's C-core applies the plugin with no environment variable
(``GRPC_EXPERIMENTAL_XDS_RLS_LB`` unset means on; ``false`` turns it off:
test_rls_off_ignores_plugin_routes_like_c_core).

Every scenario is its own listener (its own target, so fresh channels and
caches on both sides).
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from channel_fixtures import SERVICE, Backend, CoreXdsClient, pyxds_calls, wait_until

import pyxds._api as pyxds
import pyxds.aio
from pyxds.lb.rls import RLS_DATA_HEADER
from pyxds.server import ManagementServer, RouteLookupServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

CLUSTERS = ("cluster-a", "cluster-b", "cluster-c", "cluster-d", "plain")
WHO = f"/{SERVICE}/Who"
META = f"/{SERVICE}/Meta"
PLAIN = f"/{SERVICE}/Sleep"  # routed to cluster "plain", not through RLS
RING_HASH_CLUSTER = "cluster-rh"
DYNAMIC_CLUSTER = "cluster-dyn"
PYXDS_NODE = "rls-pyxds"
CORE_NODE = "rls-core"


@pytest.fixture(scope="module")
def server():
    # Every scenario is a target, and each client keeps one ADS stream per
    # target (A71), each holding a server thread: 64 (the default) ran out
    # after some 30 scenarios, and new streams then waited forever.
    srv = ManagementServer(max_workers=256).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backends():
    started = {name: Backend(name).start() for name in CLUSTERS}
    yield started
    for backend in started.values():
        backend.stop()


@pytest.fixture(scope="module")
def rls():
    with RouteLookupServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def core(server):
    client = CoreXdsClient(server.bootstrap(node_id=CORE_NODE))
    yield client
    client.close()


@pytest.fixture(scope="module")
def channels(server):
    opened: dict[str, grpc.Channel] = {}

    def channel(target: str) -> grpc.Channel:
        if target not in opened:
            opened[target] = pyxds.insecure_channel(
                target, bootstrap=server.bootstrap(node_id=PYXDS_NODE)
            )
        return opened[target]

    yield channel
    for ch in opened.values():
        ch.close()


_configured: dict[str, object] = {}
_filters: dict[str, list] = {}
_inline: dict[str, object] = {}


def configure(
    server,
    backends,
    name: str,
    lookup_config,
    plugin=None,
    plugin_routes=None,
    http_filters=(),
    inline=False,
) -> str:
    """Listener ``name``: ``/pyxds.test.Echo/*`` through the RLS plugin
    (or the ``plugin_routes`` given), but ``Sleep`` (PLAIN) to cluster
    ``plain``, and anything else (what a client that ignores the plugin
    route gets) to ``plain``; every cluster of CLUSTERS with its backend;
    ``http_filters`` in the listener before the router; ``inline``: the
    route config in the Listener, not from RDS.  Earlier scenarios'
    listeners stay in the snapshot."""
    plugin = plugin if plugin is not None else b.rls_plugin("rls", lookup_config)
    if plugin_routes is None:
        plugin_routes = [b.route(prefix=f"/{SERVICE}/", cluster_specifier_plugin="rls")]
    routes = [
        b.route(path=PLAIN, cluster="plain"),
        *plugin_routes,
        b.route(prefix="", cluster="plain"),  # what a client without RLS uses
    ]
    _configured[name] = b.route_config(
        f"{name}-route", [b.virtual_host("vh", ["*"], routes)], [plugin]
    )
    _filters[name] = list(http_filters)
    if inline:
        _inline[name] = _configured.pop(name)
    server.set_snapshot(
        Snapshot(
            listeners=[
                *(b.listener(n, http_filters=_filters[n]) for n in _configured),
                *(
                    b.listener(n, route_config=rc, http_filters=_filters[n])
                    for n, rc in _inline.items()
                ),
            ],
            routes=list(_configured.values()),
            clusters=[
                *(b.cluster(c) for c in CLUSTERS),
                # cluster-a's endpoints under ring_hash (an RLS target's own LB policy)
                b.cluster(RING_HASH_CLUSTER, eds_service_name="cluster-a", lb_policy="RING_HASH"),
                # cluster-c's endpoints; named by one scenario's RLS answers only
                b.cluster(DYNAMIC_CLUSTER, eds_service_name="cluster-c"),
            ],
            endpoints=[
                b.endpoints(c, [b.locality(zone=c, endpoints=[backends[c].address])])
                for c in CLUSTERS
            ],
            version=f"v{len(_configured) + len(_inline)}-{name}",
        )
    )
    return f"xds:///{name}"


def key_builder(**extra):
    return b.rls_key_builder(SERVICE, headers={"user": ["x-user", "x-alt-user"]}, **extra)


def both(core, channels, target, n=1, **kwargs):
    """The same RPCs on C-core and on pyxds: (core counts, pyxds counts)."""
    return (
        core.call(n, target=target, **kwargs),
        pyxds_calls(channels(target), n, **kwargs),
    )


def user(name: str | None) -> list[tuple[str, str]]:
    return [("x-user", name)] if name is not None else []


def test_a_table_of_header_values_lands_on_the_same_clusters_as_c_core(
    server, backends, rls, core, channels
):
    extra = {"host_key": "host", "service_key": "svc", "method_key": "meth"}
    config = b.route_lookup_config(
        rls.target,
        [key_builder(constant_keys={"kind": "echo"}, **extra)],
        default_target="cluster-d",
    )
    target = configure(server, backends, "rls-table", config)
    table = {
        "alice": ["cluster-a"],
        "bob": ["cluster-b"],
        "carol": ["cluster-c", "cluster-a"],  # the first target wins
        "erin": ["cluster-b", "cluster-c"],
    }
    for name, targets in table.items():
        keys = {"user": name, "kind": "echo", "host": "rls-table", "svc": SERVICE, "meth": "Who"}
        rls.set(keys, targets)
    metadata_cases = {
        "alice": user("alice"),
        "bob": user("bob"),
        "carol": user("carol"),
        "erin": [("x-alt-user", "erin")],  # the second listed header
        "dave": user("dave"),  # not in the table: NOT_FOUND, default target
        "nobody": [],  # no user key
    }
    want = {
        "alice": "cluster-a",
        "bob": "cluster-b",
        "carol": "cluster-c",
        "erin": "cluster-b",
        "dave": "cluster-d",
        "nobody": "cluster-d",
    }
    for case, md in metadata_cases.items():
        got_core, got_pyxds = both(core, channels, target, n=4, metadata=md)
        assert got_core == got_pyxds == {want[case]: 4}, case
    # the same keys went to the RLS server from both clients
    sent = [r.key_map for r in rls.requests if r.key_map.get("host") == "rls-table"]
    assert all(sent.count(k) == 2 for k in sent), sent
    assert {"user": "erin", "kind": "echo", "host": "rls-table", "svc": SERVICE, "meth": "Who"} in (
        sent
    )
    # the plain route is unaffected
    assert both(core, channels, target, n=2, method=PLAIN) == ({"plain": 2},) * 2


def test_header_data_reaches_the_backend_like_c_core(server, backends, rls, core, channels):
    config = b.route_lookup_config(rls.target, [key_builder(constant_keys={"t": "hd"})])
    target = configure(server, backends, "rls-header", config)
    rls.set({"user": "alice", "t": "hd"}, ["cluster-a"], header_data="opaque-42")
    md = [*user("alice"), (RLS_DATA_HEADER, "from-the-app")]
    got_core, got_pyxds = both(core, channels, target, method=META, metadata=md)
    for got in (got_core, got_pyxds):
        (text,) = got
        assert f"{RLS_DATA_HEADER}=opaque-42" in text.split(";"), text  # replaced, not added
        assert text.count(RLS_DATA_HEADER) == 1, text


def test_an_rls_server_that_is_down_fails_rpcs_or_uses_the_default_like_c_core(
    server, backends, core, channels, ports
):
    dead = ports.dead_address()
    target = configure(server, backends, "rls-down", b.route_lookup_config(dead, [key_builder()]))
    got_core, got_pyxds = both(
        core, channels, target, n=2, metadata=user("alice"), wait_for_ready=False, details=True
    )
    for got in (got_core, got_pyxds):
        ((text, count),) = got.items()
        assert count == 2 and text.startswith("error:UNAVAILABLE: RLS request failed: UNAVAILABLE")
    # the channel keeps serving other routes
    assert both(core, channels, target, n=2, method=PLAIN) == ({"plain": 2},) * 2
    with_default = configure(
        server,
        backends,
        "rls-down-default",
        b.route_lookup_config(dead, [key_builder()], default_target="cluster-d"),
    )
    assert (
        both(core, channels, with_default, n=3, metadata=user("alice")) == ({"cluster-d": 3},) * 2
    )


def test_an_rls_server_that_comes_back_serves_rpcs_again_like_c_core(
    server, backends, core, channels, ports
):
    """While the RLS server is down RPCs fail; once it is up they are served
    again, in both clients (the key's backoff ends, or the RLS channel's
    recovery resets it).  Fast-failing RPCs, polled: a throttled
    wait_for_ready RPC waits for the next picker in both clients (C-core's
    behaviour), which may not come while nothing changes."""
    held = ports.hold()  # refuses connections until the RLS server binds it
    late = RouteLookupServer(port=held.port)
    late.set({"user": "alice", "t": "late"}, ["cluster-a"])
    config = b.route_lookup_config(held.address, [key_builder(constant_keys={"t": "late"})])
    target = configure(server, backends, "rls-comeback", config)
    down = both(core, channels, target, metadata=user("alice"), wait_for_ready=False, details=True)
    for got in down:
        ((text, _),) = got.items()
        assert text.startswith("error:UNAVAILABLE: RLS request failed: UNAVAILABLE"), got
    held.release()
    late.start()
    up = time.monotonic()
    try:
        calls = {
            "core": lambda: core.call(
                1, target=target, metadata=user("alice"), timeout=1, wait_for_ready=False
            ),
            "pyxds": lambda: pyxds_calls(
                channels(target), 1, metadata=user("alice"), timeout=1, wait_for_ready=False
            ),
        }
        for name, call in calls.items():
            assert wait_until(lambda c=call: c() == {"cluster-a": 1}, 25, 0.25), name
            print(f"{name}: served {time.monotonic() - up:.2f} s after the RLS server came up")
    finally:
        late.stop()


def test_a_slow_rls_server_times_out_like_c_core(server, backends, rls, core, channels):
    config = b.route_lookup_config(
        rls.target, [key_builder(constant_keys={"t": "slow"})], lookup_service_timeout=0.5
    )
    target = configure(server, backends, "rls-slow", config)
    rls.set({"user": "slow", "t": "slow"}, ["cluster-a"], delay=3.0)
    for client in ("core", "pyxds"):
        start = time.monotonic()
        if client == "core":
            got = core.call(
                1, target=target, metadata=user("slow"), wait_for_ready=False, details=True
            )
        else:
            got = pyxds_calls(
                channels(target), 1, metadata=user("slow"), wait_for_ready=False, details=True
            )
        took = time.monotonic() - start
        assert got == {
            "error:UNAVAILABLE: RLS request failed: DEADLINE_EXCEEDED: Deadline Exceeded": 1
        }, client
        assert 0.4 <= took < 2.9, (client, took)  # the lookup timeout, not the 3 s answer


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        (
            {"raw": b"\xff\xff\xff"},
            "error:UNAVAILABLE: RLS request failed: INTERNAL: cannot parse RLS response",
        ),
        (
            {"targets": []},
            "error:UNAVAILABLE: RLS request failed: INVALID_ARGUMENT: "
            "RLS response has no target entry",
        ),
    ],
)
def test_garbage_answers_fail_rpcs_like_c_core(server, backends, rls, core, channels, answer, want):
    kind = "raw" if "raw" in answer else "empty"
    config = b.route_lookup_config(rls.target, [key_builder(constant_keys={"t": kind})])
    target = configure(server, backends, f"rls-garbage-{kind}", config)
    rls.set({"user": "x", "t": kind}, **answer)
    got = both(core, channels, target, n=2, metadata=user("x"), wait_for_ready=False, details=True)
    assert got == ({want: 2},) * 2


@pytest.mark.slow
def test_a_target_that_is_no_cluster_fails_like_c_core(server, backends, rls, core, channels):
    """A target naming no cluster: its cds child waits for the CDS resource
    (A27's 15 s does-not-exist timer: a real timer, both clients run at
    once), then fails, and the next target serves."""
    import concurrent.futures

    config = b.route_lookup_config(rls.target, [key_builder(constant_keys={"t": "nocluster"})])
    target = configure(server, backends, "rls-no-cluster", config)
    rls.set({"user": "x", "t": "nocluster"}, ["no-such-cluster", "cluster-b"])
    rls.set({"user": "y", "t": "nocluster"}, ["no-such-cluster"])

    def core_call():
        return core.call(1, target=target, metadata=user("x"), timeout=2)

    def pyxds_call():
        return pyxds_calls(channels(target), 1, metadata=user("x"), timeout=2)

    def served_after(call) -> float:
        start = time.monotonic()
        assert wait_until(lambda: call() == {"cluster-b": 1}, 25)
        return time.monotonic() - start

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        took = [f.result() for f in [pool.submit(served_after, c) for c in (core_call, pyxds_call)]]
    assert all(t > 10 for t in took), took  # the does-not-exist timer, in both
    got = both(core, channels, target, metadata=user("y"), wait_for_ready=False, details=True)
    print("no-cluster failure (C-core, pyxds):", got)
    codes = [{k.split(":")[1] for k in g} for g in got]
    assert codes[0] == codes[1] == {"UNAVAILABLE"}, got
    assert all("no-such-cluster" in k for g in got for k in g), got


def test_a_bad_rls_config_is_nacked_by_both_and_the_last_good_one_stays(
    server, backends, rls, core, channels
):
    name = "rls-nack"
    good = b.route_lookup_config(rls.target, [key_builder(constant_keys={"t": "nack"})])
    target = configure(server, backends, name, good)
    rls.set({"user": "alice", "t": "nack"}, ["cluster-a"])
    assert both(core, channels, target, metadata=user("alice")) == ({"cluster-a": 1},) * 2
    bad_configs = [
        b.route_lookup_config(rls.target, [key_builder()], cache_size_bytes=0),
        b.route_lookup_config(rls.target, [key_builder()], stale_age=5),
        b.route_lookup_config("dns:///", [key_builder()]),
        b.route_lookup_config(rls.target, [key_builder(), key_builder()]),
    ]
    for bad in bad_configs:
        before = {node: len(server.nacks("RDS", node_id=node)) for node in (PYXDS_NODE, CORE_NODE)}
        configure(server, backends, name, bad)
        for node in (PYXDS_NODE, CORE_NODE):
            server.wait_for_nack("RDS", node_id=node, after=before[node], timeout=10)
        assert both(core, channels, target, metadata=user("alice")) == ({"cluster-a": 1},) * 2


def test_a_stale_entry_is_refreshed_with_its_header_data_like_c_core(
    server, backends, rls, core, channels
):
    # staleAge 1 s: a real (short) timer, to see REASON_STALE on the wire
    config = b.route_lookup_config(
        rls.target, [key_builder(constant_keys={"t": "stale"})], max_age=30, stale_age=1
    )
    target = configure(server, backends, "rls-stale", config)
    keys = {"user": "alice", "t": "stale"}
    rls.set(keys, ["cluster-a"], header_data="v1")
    for client in ("core", "pyxds"):
        run = (
            (lambda: core.call(1, target=target, metadata=user("alice")))
            if client == "core"
            else (lambda: pyxds_calls(channels(target), 1, metadata=user("alice")))
        )
        start = len(rls.requests_for(keys))
        assert run() == {"cluster-a": 1}
        time.sleep(1.2)
        assert run() == {"cluster-a": 1}  # stale data still serves
        want = start + 2
        assert wait_until(lambda n=want: len(rls.requests_for(keys)) == n, 5), client
        miss, refresh = rls.requests_for(keys)[start:]
        assert (miss.reason, miss.stale_header_data) == ("REASON_MISS", "")
        assert (refresh.reason, refresh.stale_header_data) == ("REASON_STALE", "v1"), client
        assert refresh.target_type == "grpc"


def test_the_cache_evicts_by_size_and_lru_at_the_same_byte_as_c_core(
    server, backends, rls, core, channels
):
    """The cache holds ``cacheSizeBytes`` by C-core's entry sizes, evicts
    least recently used entries (never one younger than 5 s) when a new
    entry needs room: with room for exactly two entries "bobby" (used after
    "alice") survives the insertion of "carol"; one byte less and it goes
    too.  Every (client, limit) pair has its own listener and key tag."""
    from pyxds.lb.rls import entry_size
    from pyxds.lb.rls_config import make_key

    size = entry_size(make_key([("user", "alice"), ("t", "c547")]))
    targets = {}
    for client in ("core", "pyxds"):
        for room in (2 * size - 1, 2 * size):
            tag = f"{client[0]}{room}"  # same length for every pair: same entry sizes
            config = b.route_lookup_config(
                rls.target, [key_builder(constant_keys={"t": tag})], cache_size_bytes=room
            )
            for name in ("alice", "bobby", "carol"):
                rls.set({"user": name, "t": tag}, ["cluster-a"])
            targets[(client, room)] = (tag, configure(server, backends, f"rls-lru-{tag}", config))

    def call(client, target, name):
        if client == "core":
            return core.call(1, target=target, metadata=user(name))
        return pyxds_calls(channels(target), 1, metadata=user(name))

    def step(name):
        for (client, _room), (_tag, target) in targets.items():
            assert call(client, target, name) == {"cluster-a": 1}, (client, name)

    step("alice")
    step("bobby")
    time.sleep(5.5)  # both entries may now be evicted (C-core's 5 s minimum age)
    step("bobby")  # used: "alice" is the least recently used
    step("carol")  # needs room: "alice" goes, and "bobby" unless two entries fit
    step("bobby")
    step("alice")
    for (client, room), (tag, _target) in targets.items():
        lookups = {n: len(rls.requests_for({"user": n, "t": tag})) for n in ("alice", "bobby")}
        bobby_evicted = room < 2 * size
        assert lookups == {"alice": 2, "bobby": 2 if bobby_evicted else 1}, (client, room)


def test_rls_off_ignores_plugin_routes_like_c_core(monkeypatch, server, backends, rls):
    monkeypatch.setenv("GRPC_EXPERIMENTAL_XDS_RLS_LB", "false")
    config = b.route_lookup_config(rls.target, [key_builder()])
    target = configure(server, backends, "rls-off", config)
    core = CoreXdsClient(server.bootstrap(node_id="rls-off-core"))
    try:
        channel = pyxds.insecure_channel(target, bootstrap=server.bootstrap(node_id="rls-off"))
        with channel:
            got = pyxds_calls(channel, 2, metadata=user("alice"))
        assert got == core.call(2, target=target, metadata=user("alice")) == {"plain": 2}
    finally:
        core.close()


def test_an_aio_channel_routes_through_rls(server, backends, rls):
    config = b.route_lookup_config(rls.target, [key_builder(constant_keys={"t": "aio"})])
    target = configure(server, backends, "rls-aio", config)
    rls.set({"user": "bob", "t": "aio"}, ["cluster-b"], header_data="aio-data")

    async def main() -> tuple[bytes, bytes]:
        async with pyxds.aio.insecure_channel(
            target, bootstrap=server.bootstrap(node_id="rls-aio")
        ) as channel:
            who = await channel.unary_unary(WHO)(b"", metadata=user("bob"), timeout=10)
            meta = await channel.unary_unary(META)(b"", metadata=user("bob"), timeout=10)
            return who, meta

    who, meta = asyncio.run(main())
    assert who == b"cluster-b"
    assert f"{RLS_DATA_HEADER}=aio-data".encode() in meta


def test_key_builders_build_the_same_key_maps_as_c_core(server, backends, core, channels):
    """Key builder edge cases, the key maps the RLS server receives from
    both clients compared: the ``/service/method`` builder wins over the
    ``/service/`` one; the same header feeds different keys in different
    builders; repeated values join with ``,``; an empty value is a value;
    a name listed with capitals never matches (metadata keys are lower
    case and names compare exactly); ``:path`` is the RPC's path (C-core's
    pick sees it among the headers); headers gRPC adds later (``user-agent``,
    ``content-type``, ``te``) and ``:authority`` give no key.  An RLS server
    of its own answers every key (no failures: no throttling)."""
    tag = {"t": "kb"}
    exact = b.rls_key_builder(
        [(SERVICE, "Meta")], headers={"who": ["x-user"]}, constant_keys=tag, method_key="m"
    )
    headers = {"u": ["X-User", "x-user"], "ua": "user-agent", "ct": "content-type", "te": "te"}
    headers |= {"path": ":path", "auth": ":authority"}
    service_wide = b.rls_key_builder(SERVICE, headers=headers, constant_keys=tag, service_key="s")
    other = b.rls_key_builder("other.Service", headers={"who": "x-user"})
    cases = {
        "exact": (META, [("x-user", "a")]),
        "exact-two": (META, [("x-user", "a"), ("x-user", "b")]),
        "exact-empty": (META, [("x-user", "")]),
        "service": (WHO, [("x-user", "a")]),
        "service-two": (WHO, [("x-user", "a"), ("x-user", "b")]),
        "service-none": (WHO, []),
    }
    want = {
        "exact": {"who": "a", "m": "Meta"},
        "exact-two": {"who": "a,b", "m": "Meta"},
        "exact-empty": {"who": "", "m": "Meta"},
        "service": {"u": "a", "s": SERVICE, "path": WHO},
        "service-two": {"u": "a,b", "s": SERVICE, "path": WHO},
        "service-none": {"s": SERVICE, "path": WHO},
    }
    with RouteLookupServer() as rls:
        rls.set_default(["cluster-d"])
        config = b.route_lookup_config(rls.target, [exact, service_wide, other])
        target = configure(server, backends, "rls-kb", config)
        for case, (method, md) in cases.items():
            start = len(rls.requests)
            for got in both(core, channels, target, method=method, metadata=md):
                assert not any(reply.startswith("error:") for reply in got), (case, got)
            assert wait_until(lambda s=start: len(rls.requests) >= s + 2, 5), case
            maps = [r.key_map for r in rls.requests[start:]]
            assert maps == [{**tag, **want[case]}] * 2, (case, maps)


LOOKUP_SERVICES = [
    # C-core accepts
    "foo bar",  # nothing refuses spaces
    "ipv4:",  # an empty address list
    "unix:",
    "google-c2p:",
    "vsock:x",  # no vsock resolver in grpcio: a DNS name
    "dns:///x?y",
    "ipv4:%31.2.3.4:80",  # percent-decoded
    "ipv4:1.2.3.4:80abc",  # sscanf("%d") ignores what follows the digits
    "ipv6:[::1]:80,,[::2]:81",  # empty entries skipped
    "ipv6:[::1]:80%",  # "%" alone is kept; the port reads as 80
    "dns:///x?=y",  # a parameter without a key is skipped
    "unix:" + "a" * 107,
    # C-core refuses
    "ipv4:bogus",
    "ipv4:1.2.3.4",  # no port
    "ipv4:1.2.3.4:99999",
    "ipv4:[1.2.3.4]:80",  # brackets only around IPv6
    "ipv4://auth/1.2.3.4:80",
    "ipv6:::1",
    "ipv6:[::1%no-such-if0]:80",
    "unix:" + "a" * 108,
    "google-c2p://a/x",
    "dns:///x?",  # an empty query
    "dns:///x?a b",  # a space in the query
    "dns:///x#a#b",
    "dns://8.8.8.8/",
]


def test_lookup_service_targets_are_judged_as_c_core_judges_them(
    server, backends, rls, core, channels
):
    """``lookup_service`` must be a target grpcio can open (C-core's
    ``IsValidTarget``): each value of the table is ACKed or NACKed by both
    clients alike (the unit table in test_rls_config.py holds more)."""
    name = "rls-targets"
    target = configure(server, backends, name, b.route_lookup_config(rls.target, [key_builder()]))
    assert both(core, channels, target, metadata=user("nobody"), wait_for_ready=False)

    def answers(node: str) -> int:
        return len(server.acks("RDS", node_id=node)) + len(server.nacks("RDS", node_id=node))

    verdicts = {}
    for lookup_service in LOOKUP_SERVICES:
        before = {node: answers(node) for node in (PYXDS_NODE, CORE_NODE)}
        nacks = {node: len(server.nacks("RDS", node_id=node)) for node in (PYXDS_NODE, CORE_NODE)}
        configure(server, backends, name, b.route_lookup_config(lookup_service, [key_builder()]))
        got = []
        for node in (PYXDS_NODE, CORE_NODE):
            server.wait_until(lambda n=node, k=before[node]: answers(n) > k, 10, f"{node} answered")
            got.append(len(server.nacks("RDS", node_id=node)) > nacks[node])
        verdicts[lookup_service] = got
    differ = {t: v for t, v in verdicts.items() if v[0] != v[1]}
    assert not differ, f"(pyxds NACKed, C-core NACKed): {differ}"
    nacked = [t for t, (_, core_nacked) in verdicts.items() if core_nacked]
    assert nacked == LOOKUP_SERVICES[LOOKUP_SERVICES.index("ipv4:bogus") :], verdicts


def test_an_answer_without_header_data_or_the_default_target_keeps_the_app_s_header(
    server, backends, rls, core, channels
):
    """``x-google-rls-data`` is set only from a non-empty ``header_data``:
    an answer without one, and a pick of the default target after a failed
    lookup, leave the application's own value as it is, in both clients."""
    config = b.route_lookup_config(
        rls.target, [key_builder(constant_keys={"t": "nohd"})], default_target="cluster-d"
    )
    target = configure(server, backends, "rls-no-header", config)
    rls.set({"user": "alice", "t": "nohd"}, ["cluster-a"], header_data="")
    rls.set({"user": "bob", "t": "nohd"}, code=grpc.StatusCode.UNAVAILABLE, details="down")
    for name in ("alice", "bob"):
        md = [*user(name), (RLS_DATA_HEADER, "from-the-app")]
        for got in both(core, channels, target, method=META, metadata=md):
            (text,) = got
            assert f"{RLS_DATA_HEADER}=from-the-app" in text.split(";"), (name, text)
            assert text.count(RLS_DATA_HEADER) == 1, (name, text)


@pytest.mark.parametrize("lookup_service", ["unix:", "foo bar"])
def test_an_accepted_lookup_service_that_cannot_resolve_fails_lookups_like_c_core(
    server, backends, rls, core, channels, lookup_service
):
    """A target C-core accepts but cannot resolve (an empty address list, a
    name with a space): every lookup fails with the resolver's status, the
    RPC fails "RLS request failed: ..." or takes the default target, with
    the same text in both clients."""
    tag = "unres-" + lookup_service.replace(" ", "").replace(":", "")
    for default in (None, "cluster-d"):
        config = b.route_lookup_config(
            lookup_service,
            [key_builder(constant_keys={"t": f"{tag}-{default}"})],
            default_target=default,
        )
        target = configure(server, backends, f"rls-{tag}-{default}", config)
        got_core, got_pyxds = both(
            core, channels, target, n=2, metadata=user("x"), wait_for_ready=False, details=True
        )
        assert got_core == got_pyxds, (default, got_core, got_pyxds)
        (key,) = got_core
        if default is None:
            assert key.startswith("error:UNAVAILABLE: RLS request failed: UNAVAILABLE: "), key
        else:
            assert key == "cluster-d"


def _bad(change):
    """A RouteLookupConfig with one problem, made by ``change(config)``."""

    def make(lookup_service: str):
        config = b.route_lookup_config(lookup_service, [key_builder()])
        change(config)
        return config

    return make


def _set(path: str, value):
    def change(config):
        *parents, name = path.split(".")
        target = config
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, name, value)

    return change


BAD_CONFIGS = {
    "required_match": _bad(
        lambda c: setattr(c.grpc_keybuilders[0].headers[0], "required_match", True)
    ),
    "extra key = header key": _bad(
        lambda c: setattr(c.grpc_keybuilders[0].extra_keys, "host", "user")
    ),
    "constant key = header key": _bad(
        lambda c: c.grpc_keybuilders[0].constant_keys.update(user="x")
    ),
    "empty constant key": _bad(lambda c: c.grpc_keybuilders[0].constant_keys.update({"": "x"})),
    "empty header key": _bad(lambda c: c.grpc_keybuilders[0].headers.add(key="", names=["a"])),
    "no header names": _bad(lambda c: c.grpc_keybuilders[0].headers.add(key="k2")),
    "empty header name": _bad(lambda c: c.grpc_keybuilders[0].headers.add(key="k3", names=[""])),
    "builder without names": _bad(lambda c: c.grpc_keybuilders.add()),
    "name without service": _bad(lambda c: c.grpc_keybuilders.add().names.add(method="M")),
    "no lookup_service": _bad(_set("lookup_service", "")),
    "cache_size_bytes 0": _bad(_set("cache_size_bytes", 0)),
    "negative cache_size_bytes": _bad(_set("cache_size_bytes", -5)),
    "negative timeout": _bad(_set("lookup_service_timeout.seconds", -1)),
    "stale_age alone": _bad(_set("stale_age.seconds", 5)),
}


def test_bad_rls_configs_are_nacked_naming_the_same_field_and_problem_as_c_core(
    server, backends, rls, core, channels
):
    """Each config has one problem; C-core's NACK says ``[field:F error:E]``
    (inside "errors validating RLS LB policy config"), pyxds's says
    ``rls_experimental.F: E``: the same F and E, for every row."""
    name = "rls-nack-texts"
    good = b.route_lookup_config(rls.target, [key_builder(constant_keys={"t": "texts"})])
    configure(server, backends, name, good)
    both(core, channels, f"xds:///{name}", metadata=user("x"), wait_for_ready=False)
    for case, make in BAD_CONFIGS.items():
        before = {node: len(server.nacks("RDS", node_id=node)) for node in (PYXDS_NODE, CORE_NODE)}
        configure(server, backends, name, make(rls.target))
        ours, theirs = (
            server.wait_for_nack("RDS", node_id=node, after=before[node], timeout=10).error_message
            for node in (PYXDS_NODE, CORE_NODE)
        )
        inner = theirs.split("errors validating RLS LB policy config: [", 1)[1]
        field, error = inner[: inner.rfind("]]]")].removeprefix("field:").split(" error:", 1)
        assert f"rls_experimental.{field}: {error}" in ours, (case, ours, theirs)
        configure(server, backends, name, good)


def test_key_builder_configs_c_core_accepts_and_grpc_go_refuses_are_acked_by_both(
    server, backends, rls, core, channels
):
    """grpc-go refuses a key builder name whose method holds a slash
    (keys/builder_test.go ``TestMakeBuilderMapErrors``); grpcio 1.85's C-core
    ACKs it, and so does pyxds.  A ``max_age`` above 5 minutes with a
    ``stale_age`` (config_test.go "maxAge not clamped when staleAge is set")
    is ACKed by both too (that neither caps it took a 5 minute probe:
    test_conformance_rls.py).  Each config is its own
    listener, and the route through RLS serves in both clients (a NACKed
    first RouteConfiguration would leave the listener without routes).
    grpc-go's other refusal, an empty ``service``, cannot be said in xDS:
    proto3 drops an empty string, and both clients NACK the name as having
    no ``service`` (``BAD_CONFIGS["name without service"]``)."""
    cases = {
        "slash in method": {
            "builders": [b.rls_key_builder([(SERVICE, "a/b")], constant_keys={"x": "2"})]
        },
        "max_age 500 s with stale_age": {"builders": [], "max_age": 500, "stale_age": 200},
    }
    for i, (case, args) in enumerate(cases.items()):
        tag = {"t": f"accepted-{i}"}
        config = b.route_lookup_config(
            rls.target,
            [key_builder(constant_keys=tag), *args["builders"]],
            max_age=args.get("max_age"),
            stale_age=args.get("stale_age"),
        )
        name = f"rls-accepted-{i}"
        target = configure(server, backends, name, config)
        rls.set({"user": "alice", **tag}, ["cluster-b"])
        got = both(core, channels, target, metadata=user("alice"), wait_for_ready=False)
        assert got == ({"cluster-b": 1},) * 2, (case, got)
        # other scenarios' routes may be NACKed in the same response; not this one
        ours = [n.error_message for n in server.nacks("RDS") if f"{name}-route" in n.error_message]
        assert not ours, (case, ours)


def test_an_rls_target_cluster_with_ring_hash_serves_like_c_core(
    server, backends, rls, core, channels
):
    """grpc-go test/xds/xds_rls_clusterspecifier_plugin_test.go ``TestRLSinxDS``
    (the ``ringhash`` row): the cluster the RLS server names uses its own
    LB policy (here ring_hash, no hash policy on the route: a random hash,
    A76); the RPC reaches the cluster's endpoint in both clients, and a
    target with round_robin in the same config keeps serving beside it."""
    tag = {"t": "ring-hash"}
    config = b.route_lookup_config(rls.target, [key_builder(constant_keys=tag)])
    target = configure(server, backends, "rls-ring-hash", config)
    rls.set({"user": "alice", **tag}, [RING_HASH_CLUSTER])
    rls.set({"user": "bob", **tag}, ["cluster-b"])
    assert both(core, channels, target, n=3, metadata=user("alice")) == ({"cluster-a": 3},) * 2
    assert both(core, channels, target, n=2, metadata=user("bob")) == ({"cluster-b": 2},) * 2


def test_http_filters_and_their_route_overrides_apply_to_plugin_routes_like_c_core(
    server, backends, rls, core, channels
):
    """grpc-go internal/xds/resolver cluster_specifier_plugin_test.go
    ``TestResolverClusterSpecifierPlugin_WithFilters``: the listener's HTTP
    filters run for a route whose action is a cluster specifier plugin, with
    that route's ``typed_per_filter_config`` override (A39).  A fault filter
    that injects nothing, overridden on the ``Meta`` route to abort every
    RPC with PERMISSION_DENIED: ``Meta`` fails before any pick (the RLS
    server never sees its key), ``Who`` (same plugin, no override) is
    served through RLS, in both clients."""
    tag = {"t": "filters"}
    config = b.route_lookup_config(rls.target, [key_builder(constant_keys=tag)])
    abort = b.fault_config(
        abort_grpc_status=grpc.StatusCode.PERMISSION_DENIED.value[0], abort_percent=100
    )
    plugin_routes = [
        b.route(
            path=META, cluster_specifier_plugin="rls", typed_per_filter_config={"fault": abort}
        ),
        b.route(prefix=f"/{SERVICE}/", cluster_specifier_plugin="rls"),
    ]
    target = configure(
        server,
        backends,
        "rls-filters",
        config,
        plugin_routes=plugin_routes,
        http_filters=[b.fault_filter("fault")],
    )
    rls.set({"user": "alice", **tag}, ["cluster-b"])
    rls.set({"user": "faulted", **tag}, ["cluster-b"])
    got = both(
        core, channels, target, n=2, method=META, metadata=user("faulted"), wait_for_ready=False
    )
    assert got == ({"error:PERMISSION_DENIED": 2},) * 2, got
    assert both(core, channels, target, n=2, metadata=user("alice")) == ({"cluster-b": 2},) * 2
    sent = [r.key_map.get("user") for r in rls.requests if r.key_map.get("t") == "filters"]
    assert sent == ["alice", "alice"], sent


def test_a_plugin_in_a_route_config_inside_the_listener_routes_like_c_core(
    server, backends, rls, core, channels
):
    """C-core xds_rls_end2end_test.cc runs ``XdsRoutingClusterSpecifierPlugin``
    with the route config from RDS and inside the Listener: the plugin, its
    key builder (header, host/service/method extra keys, a constant key)
    and the routing are the same either way, in both clients."""
    extra = {"host_key": "host", "service_key": "svc", "method_key": "meth"}
    config = b.route_lookup_config(
        rls.target, [key_builder(constant_keys={"t": "inline"}, **extra)]
    )
    target = configure(server, backends, "rls-inline", config, inline=True)
    keys = {"t": "inline", "host": "rls-inline", "svc": SERVICE, "meth": "Who"}
    rls.set({"user": "alice", **keys}, ["cluster-c"])
    assert both(core, channels, target, n=2, metadata=user("alice")) == ({"cluster-c": 2},) * 2
    assert both(core, channels, target, n=1, method=PLAIN) == ({"plain": 1},) * 2
    sent = [r.key_map for r in rls.requests if r.key_map.get("t") == "inline"]
    assert sent == [{"user": "alice", **keys}] * 2, sent


def test_zero_max_age_and_timeout_are_unset_in_pyxds_and_literal_in_c_core(
    server, backends, rls, core, channels
):
    """The documented difference (docs/differences-from-c-core.md, RLS),
    kept true: rls_config.proto says a ``max_age`` or
    ``lookup_service_timeout`` "omitted or zero" means the default; pyxds
    reads it so.  grpcio 1.85 takes zero literally: with a zero timeout its
    lookups fail in the client (the RPC fails "RLS request failed:
    DEADLINE_EXCEEDED..." or, wait_for_ready, waits out its deadline);
    with a zero ``max_age`` every RPC sends a lookup (at least one; its
    answer serves that RPC and has expired for the next).  pyxds: one lookup, RPCs
    served from the cache."""
    got = {}
    for name, zero in (("timeout", {"lookup_service_timeout": 0}), ("max-age", {"max_age": 0})):
        tag = {"t": f"zero-{name}"}
        config = b.route_lookup_config(rls.target, [key_builder(constant_keys=tag)], **zero)
        target = configure(server, backends, f"rls-zero-{name}", config)
        rls.set({"user": "alice", **tag}, ["cluster-a"])
        got[name] = both(
            core, channels, target, n=3, metadata=user("alice"), wait_for_ready=False, details=True
        )
        got[name + " lookups"] = [
            r.metadata.get("user-agent", "").startswith("grpc-python")  # pyxds's RLS channel
            for r in rls.requests
            if r.key_map.get("t") == tag["t"]
        ]
    ((core_error, n),) = got["timeout"][0].items()
    assert n == 3 and core_error.startswith(
        "error:UNAVAILABLE: RLS request failed: DEADLINE_EXCEEDED"
    ), got
    assert got["timeout"][1] == {"cluster-a": 3}, got
    # pyxds sent one lookup (the default timeout); C-core's lookups carry a
    # deadline that is already over: they fail in the client, though one
    # may still reach the server when the machine is slow (seen once)
    assert got["timeout lookups"].count(True) == 1, got
    assert got["max-age"] == ({"cluster-a": 3},) * 2, got
    lookups = got["max-age lookups"]
    assert lookups.count(True) == 1 and lookups.count(False) >= 3, got


def test_a_key_whose_lookups_keep_failing_backs_off_as_documented(
    server, backends, rls, core, channels
):
    """The documented difference (docs/differences-from-c-core.md, RLS),
    kept true: a key whose lookups keep failing and that has no valid data
    gets a fresh 1 s backoff after each failure in grpcio 1.85 (rls.cc
    passes the backoff state only into the refresh of valid data), while
    pyxds continues the key's sequence (1 s, 1.6 s, 2.56 s, ... as grpc-go
    and grpc-java).  Fast-failing RPCs every 50 ms for 8 s; the lookups
    each client sent for the key are counted (C-core ~8, pyxds ~4).  Twenty
    answered keys first keep the throttler quiet (its probability stays
    below zero: 2 x 20 accepts against at most 30 requests)."""
    tag = {"t": "backoff"}
    config = b.route_lookup_config(rls.target, [key_builder(constant_keys=tag)])
    target = configure(server, backends, "rls-backoff", config)
    for i in range(20):
        rls.set({"user": f"ok{i}", **tag}, ["cluster-a"])
        assert both(core, channels, target, metadata=user(f"ok{i}")) == ({"cluster-a": 1},) * 2
    rls.set({"user": "failing", **tag}, code=grpc.StatusCode.UNAVAILABLE, details="down")
    end = time.monotonic() + 8
    while time.monotonic() < end:
        both(core, channels, target, metadata=user("failing"), wait_for_ready=False, timeout=1)
        time.sleep(0.05)
    sent = [
        "pyxds" if r.metadata.get("user-agent", "").startswith("grpc-python") else "core"
        for r in rls.requests
        if r.key_map == {"user": "failing", **tag}
    ]
    print("lookups of the failing key:", {c: sent.count(c) for c in ("core", "pyxds")})
    assert sent.count("core") >= 6, sent  # about one a second
    assert 3 <= sent.count("pyxds") <= 5, sent  # 0, 1, 2.6, 5.2 (, 9.3) s


def test_an_rls_target_cluster_is_watched_while_an_entry_names_it_like_c_core(
    server, backends, rls, core, channels
):
    """A74 (dynamic cluster subscriptions, the cds child's ``isDynamic``),
    C-core XdsDependencyManager and rls.cc: the cluster an RLS answer names
    is subscribed over CDS when the answer arrives, and unsubscribed when
    no cache entry names it any more (here: evicted by a cache of one
    entry, once it is 5 s old).  Both clients' CDS requests are watched."""
    tag = {"t": "dynamic"}
    config = b.route_lookup_config(rls.target, [key_builder(constant_keys=tag)], cache_size_bytes=1)
    target = configure(server, backends, "rls-dynamic", config)
    rls.set({"user": "u1", **tag}, [DYNAMIC_CLUSTER])
    rls.set({"user": "u2", **tag}, ["cluster-b"])

    def watched(node: str) -> bool:
        """Some ADS stream of ``node`` asks for the cluster in its latest CDS
        request.  Per stream: each client has one stream per target (A71),
        and the older targets' streams ACK this scenario's snapshot at their
        own pace, so the node's latest request overall may be one of theirs
        (seen: C-core's CDS watch "not seen" under load)."""
        latest = {r.stream_id: r.resource_names for r in server.requests("CDS", node_id=node)}
        return any(DYNAMIC_CLUSTER in names for names in latest.values())

    assert not watched(PYXDS_NODE) and not watched(CORE_NODE)
    assert both(core, channels, target, metadata=user("u1")) == ({"cluster-c": 1},) * 2
    for node in (PYXDS_NODE, CORE_NODE):
        assert wait_until(lambda n=node: watched(n), 5), f"{node}: {DYNAMIC_CLUSTER} not watched"
    time.sleep(5.5)  # C-core's (and pyxds's) 5 s before an entry may be evicted
    assert both(core, channels, target, metadata=user("u2")) == ({"cluster-b": 1},) * 2
    for node in (PYXDS_NODE, CORE_NODE):
        assert wait_until(lambda n=node: not watched(n), 10), f"{node}: still watched"


def test_a_changed_plugin_config_keeps_the_cache_like_c_core(server, backends, rls, core, channels):
    """C-core rls_end2end_test.cc ``UpdateConfig`` (a new config reaches the
    same policy, whose cache stays: no new lookup for a cached key), here
    through xDS: the plugin's RouteLookupConfig changes (a default target
    added, a larger cache); the key answered before is served from the
    cache with no second lookup, in both clients, and the new default
    target serves a key the RLS server refuses."""
    tag = {"t": "update"}
    builders = [key_builder(constant_keys=tag)]
    target = configure(
        server, backends, "rls-update", b.route_lookup_config(rls.target, builders, max_age=60)
    )
    rls.set({"user": "alice", **tag}, ["cluster-a"])
    rls.set({"user": "bob", **tag}, code=grpc.StatusCode.NOT_FOUND, details="no")
    assert both(core, channels, target, metadata=user("alice")) == ({"cluster-a": 1},) * 2
    updated = b.route_lookup_config(
        rls.target, builders, max_age=60, cache_size_bytes=2 << 20, default_target="cluster-d"
    )
    configure(server, backends, "rls-update", updated)
    version = f"v{len(_configured) + len(_inline)}-rls-update"
    for node in (PYXDS_NODE, CORE_NODE):
        server.wait_for_ack("RDS", version=version, node_id=node, timeout=10)
    assert both(core, channels, target, metadata=user("bob")) == ({"cluster-d": 1},) * 2
    assert both(core, channels, target, n=2, metadata=user("alice")) == ({"cluster-a": 2},) * 2
    sent = [r.key_map["user"] for r in rls.requests if r.key_map.get("t") == "update"]
    assert sorted(sent) == ["alice", "alice", "bob", "bob"], sent  # alice's once per client


def test_cluster_specifier_plugin_errors_are_nacked_as_c_core_words_them(backends, rls):
    """C-core xds_rls_end2end_test.cc ``...NacksDuplicateSpecifier``,
    ``...NacksUndefinedSpecifier``, ``...NacksUnknownSpecifierProtoNotOptional``
    and ``...IgnoreUnknownSpecifierProtoOptional``, live against grpcio 1.85
    (whose words have changed since those tests: "duplicate name", "unknown
    cluster specifier plugin name", "unsupported ClusterSpecifierPlugin
    type"): each bad RouteConfiguration is NACKed by both with the same
    field and words (an RPC on it fails with the NACK's text); an optional
    plugin of an unknown type makes the routes naming it be skipped, in
    both.  A control plane and C-core client of their own, every listener
    in one snapshot."""
    from google.protobuf import wrappers_pb2

    config = b.route_lookup_config(rls.target, [key_builder(constant_keys={"t": "plugins"})])
    unknown = b.rls_plugin("rls", config)
    unknown.extension.typed_config.Pack(wrappers_pb2.StringValue(value="x"))
    optional = b.rls_plugin("rls", config)
    optional.CopyFrom(unknown)
    optional.is_optional = True
    cases = {
        "dup": (
            [b.rls_plugin("rls", config), b.rls_plugin("rls", config)],
            "rls",
            'cluster_specifier_plugins[1].extension.name: duplicate name "rls"',
        ),
        "undeclared": (
            [b.rls_plugin("rls", config)],
            "nope",
            "virtual_hosts[0].routes[0].route.cluster_specifier_plugin: "
            'unknown cluster specifier plugin name "nope"',
        ),
        "unknown": (
            [unknown],
            "rls",
            "cluster_specifier_plugins[0].extension.typed_config"
            ".value[google.protobuf.StringValue]: unsupported ClusterSpecifierPlugin type",
        ),
        "optional": ([optional], "rls", None),
    }
    route_configs = []
    for case, (plugins, plugin_name, _) in cases.items():
        routes = [
            b.route(prefix=f"/{SERVICE}/", cluster_specifier_plugin=plugin_name),
            b.route(prefix="", cluster="plain"),
        ]
        vhosts = [b.virtual_host("vh", ["*"], routes)]
        route_configs.append(b.route_config(f"plugin-{case}-route", vhosts, plugins))
    with ManagementServer() as srv:
        srv.set_snapshot(
            Snapshot(
                listeners=[b.listener(f"plugin-{case}") for case in cases],
                routes=route_configs,
                clusters=[b.cluster("plain")],
                endpoints=[
                    b.endpoints("plain", [b.locality(endpoints=[backends["plain"].address])])
                ],
                version="1",
            )
        )
        core = CoreXdsClient(srv.bootstrap(node_id=CORE_NODE))
        try:
            for case, (_, _, want) in cases.items():
                target = f"xds:///plugin-{case}"
                ch = pyxds.insecure_channel(target, bootstrap=srv.bootstrap(node_id=PYXDS_NODE))
                try:
                    kwargs = {"wait_for_ready": False, "details": True, "timeout": 5}
                    got = (core.call(1, target=target, **kwargs), pyxds_calls(ch, 1, **kwargs))
                finally:
                    ch.close()
                if want is None:
                    assert got == ({"plain": 1},) * 2, (case, got)
                    continue
                ((theirs, _),), ((ours, _),) = (g.items() for g in got)
                field, words = want.split(": ", 1)
                assert f"[field:{field} error:{words}]" in theirs, (case, theirs)
                assert f"RDS resource plugin-{case}-route: invalid resource: {want}" in ours, (
                    case,
                    ours,
                )
        finally:
            core.close()
