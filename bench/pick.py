"""Nanoseconds per pick, each beside the floor: ``next()`` on an
``itertools.cycle`` measured in the same run (ARCHITECTURE.md "Pickers are
immutable ... never allocate more than they must").  Goal: round_robin within
10x the floor.

Run:  python bench/pick.py            (about 10 s)
      python bench/pick.py cluster_impl   (only the cases whose name has a word)

Adding a case: write ``def bench_<name>() -> tuple[str, float]`` that builds
a policy tree with :mod:`pyxds.testing` fakes, drives its subchannels READY
and returns ``(label, time_picker(picker))``; then append it to ``CASES``.
"""

from __future__ import annotations

import itertools
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from pyxds.lb import (
    OK_STATUS,
    ConnectivityState,
    Endpoint,
    PickArgs,
    PickComplete,
    Picker,
    ResolverUpdate,
)
from pyxds.lb.pick_first import PickFirst, PickFirstConfig
from pyxds.lb.round_robin import RoundRobin, RoundRobinConfig
from pyxds.testing import FakeHelper

ARGS = PickArgs("/helloworld.Greeter/SayHello", (), {"cluster": "cluster:foo"})
NUMBER = 1_000_000  # calls per timing run
OK = OK_STATUS
REPEAT = 7  # timing runs; the minimum is reported


def time_ns(stmt: Callable[[], object], number: int = NUMBER, repeat: int = REPEAT) -> float:
    """Best-of-``repeat`` nanoseconds per call of ``stmt``."""
    timer = timeit.Timer(stmt)
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e9


def time_picker(picker: Picker, args: PickArgs = ARGS) -> float:
    """ns per ``picker.pick(args)``; checks the picker completes picks."""
    result = picker.pick(args)
    if not isinstance(result, PickComplete):
        raise RuntimeError(f"benchmark picker did not complete a pick: {result!r}")
    pick = picker.pick
    timer = timeit.Timer("pick(args)", globals={"pick": pick, "args": args})
    return min(timer.repeat(repeat=REPEAT, number=NUMBER)) / NUMBER * 1e9


def floor_ns() -> float:
    """The floor: ``next()`` on an ``itertools.cycle``."""
    cycle = itertools.cycle(range(3))
    timer = timeit.Timer("next(c)", globals={"c": cycle})
    return min(timer.repeat(repeat=REPEAT, number=NUMBER)) / NUMBER * 1e9


def endpoints(n: int) -> list[Endpoint]:
    return [Endpoint((f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:443",)) for i in range(n)]


def ready_all(helper: FakeHelper) -> None:
    for subchannel in helper.subchannels:
        if not subchannel.shut_down:
            subchannel.set_state(ConnectivityState.READY)


def _round_robin(n: int) -> tuple[str, float]:
    helper = FakeHelper()
    policy = RoundRobin(helper)
    policy.update(ResolverUpdate(endpoints(n), RoundRobinConfig()))
    ready_all(helper)
    assert helper.state is ConnectivityState.READY
    return f"round_robin, {n} READY", time_picker(helper.last.picker)


def bench_round_robin_3() -> tuple[str, float]:
    return _round_robin(3)


def bench_round_robin_100() -> tuple[str, float]:
    return _round_robin(100)


def bench_round_robin_1000() -> tuple[str, float]:
    return _round_robin(1000)


def bench_pick_first() -> tuple[str, float]:
    helper = FakeHelper()
    policy = PickFirst(helper)
    policy.update(ResolverUpdate(endpoints(3), PickFirstConfig()))
    helper.subchannels[0].set_state(ConnectivityState.READY)
    assert helper.state is ConnectivityState.READY
    return "pick_first, READY", time_picker(helper.last.picker)


CASES: list[Callable[[], tuple[str, float]]] = [
    bench_round_robin_3,
    bench_round_robin_100,
    bench_round_robin_1000,
    bench_pick_first,
]


# -- priority -> weighted_target -> round_robin (issue 3; appended by the priority helper) --


def bench_priority_weighted_target_round_robin() -> tuple[str, float]:
    """The EDS-shaped tree: priority_experimental -> weighted_target_experimental
    (100 localities) -> round_robin (10 endpoints each), beside a bare
    round_robin over 10 endpoints timed in the same call.  Goal: <= 2x bare."""
    from pyxds.lb import registry
    from pyxds.lb.hierarchy import PATH_KEY

    localities, per_locality = 100, 10
    targets = {
        f"locality{i}": {"weight": 1 + i % 7, "childPolicy": [{"round_robin": {}}]}
        for i in range(localities)
    }
    priority_json = {
        "children": {"p0": {"config": [{"weighted_target_experimental": {"targets": targets}}]}},
        "priorities": ["p0"],
    }
    factory, config = registry.select([{"priority_experimental": priority_json}])
    helper = FakeHelper()
    policy = factory.build(helper)
    tree_endpoints = [
        Endpoint((f"10.{i}.0.{j}:443",), {PATH_KEY: ("p0", f"locality{i}")})
        for i in range(localities)
        for j in range(per_locality)
    ]
    policy.update(ResolverUpdate(tree_endpoints, config))
    ready_all(helper)
    assert helper.state is ConnectivityState.READY
    _, bare = _round_robin(per_locality)
    tree = time_picker(helper.last.picker)
    label = f"priority>wt(100)>rr(10) [rr10 {bare:.0f} ns: {tree / bare:.1f}x]"
    return label, tree


CASES.append(bench_priority_weighted_target_round_robin)


# -- ring_hash (A42): a pick is one bisect over the ring plus the READY child's pick --


def bench_ring_hash() -> tuple[str, float]:
    """ring_hash_experimental over 100 READY endpoints (ring of 4096), a
    request hash in the call attributes as the xDS ConfigSelector sets it,
    beside a bare round_robin over 10 endpoints timed in the same call."""
    from pyxds.lb import registry
    from pyxds.lb.api import REQUEST_HASH_KEY

    factory, config = registry.select([{"ring_hash_experimental": {}}])
    helper = FakeHelper()
    policy = factory.build(helper)
    policy.update(ResolverUpdate(endpoints(100), config))
    args = PickArgs(ARGS.path, (), {"cluster": "cluster:foo", REQUEST_HASH_KEY: 0x9E3779B97F4A7C15})
    for _ in range(3):  # ring_hash connects lazily: each pick wakes the endpoint it lands on
        helper.last.picker.pick(args)
        helper.clock.advance(0)
        ready_all(helper)
    assert helper.state is ConnectivityState.READY
    _, bare = _round_robin(10)
    ns = time_picker(helper.last.picker, args)
    return f"ring_hash(100) [rr10 {bare:.0f} ns: {ns / bare:.1f}x]", ns


CASES.append(bench_ring_hash)


# -- weighted_round_robin (A58): a pick is one C call on the materialized stride period --


def bench_weighted_round_robin() -> tuple[str, float]:
    """weighted_round_robin over 100 READY endpoints with distinct reported
    weights (per-call hook on every result), beside a bare round_robin over
    100 endpoints timed in the same call.  Goal: <= 2x bare."""
    from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

    from pyxds.lb import registry

    factory, config = registry.select([{"weighted_round_robin": {"blackoutPeriod": "0s"}}])
    helper = FakeHelper()
    policy = factory.build(helper)
    policy.update(ResolverUpdate(endpoints(100), config))
    ready_all(helper)
    picker = helper.last.picker
    for i, result in enumerate(picker.results):  # type: ignore[attr-defined]
        load = OrcaLoadReport(rps_fractional=100.0, cpu_utilization=0.1 + i / 100)
        result.on_call_trailers((("endpoint-load-metrics-bin", load.SerializeToString()),))
    helper.clock.advance(1.0)  # the weight update timer rebuilds the scheduler
    assert picker.scaled_weights is not None  # type: ignore[attr-defined]
    _, bare = _round_robin(100)
    ns = time_picker(picker)
    return f"weighted_round_robin(100) [rr100 {bare:.0f} ns: {ns / bare:.1f}x]", ns


CASES.append(bench_weighted_round_robin)


# -- xds_cluster_impl (A37/A27): drops, circuit breaking, per-locality load counters --


class _LoadReportingClient:
    """What xds_cluster_impl needs of the XdsClient for load reporting: a load
    store and the LRS server of a cluster (no stream is opened)."""

    def __init__(self) -> None:
        from pyxds.testing import FakeClock
        from pyxds.xds.load_store import LoadStore

        self.load_store = LoadStore(FakeClock())

    def lrs_server_for(self, cluster_name: str) -> str:
        return "lrs.example:443"


def _cluster_impl_picker(lrs: bool) -> Picker:
    from pyxds.lb import registry
    from pyxds.resolver.xds_config import (
        XDS_CLIENT_ATTRIBUTE,
        XDS_CONFIG_ATTRIBUTE,
        ClusterConfig,
        EndpointConfig,
        XdsConfig,
    )
    from pyxds.xds.resources.types import (
        Cluster,
        ClusterLoadAssignment,
        DropOverload,
        EndpointAddress,
        Locality,
        LocalityName,
    )

    name = f"bench-{'lrs' if lrs else 'plain'}"
    localities = tuple(
        Locality(LocalityName("r", f"z{i}"), 1, (EndpointAddress((f"10.0.0.{i}:443",)),))
        for i in range(3)
    )
    load = ClusterLoadAssignment(name, (localities,), (DropOverload("lb", 0),), 0)
    # never circuit-break: the timed picks never finish their calls
    cluster = Cluster(name, "EDS", lrs_server=lrs, max_requests=2**62)
    xds = XdsConfig(None, None, None, {name: ClusterConfig(cluster, EndpointConfig(load, ""))})
    attrs = {XDS_CONFIG_ATTRIBUTE: xds, XDS_CLIENT_ATTRIBUTE: _LoadReportingClient()}
    factory, config = registry.select(
        [
            {
                "xds_cluster_impl_experimental": {
                    "clusterName": name,
                    "childPolicy": [{"round_robin": {}}],
                }
            }
        ]
    )
    helper = FakeHelper()
    policy = factory.build(helper)
    eps = [
        Endpoint(a.addresses, {"locality": lo.name, "locality_weight": 1})
        for lo in localities
        for a in lo.endpoints
    ]
    assert policy.update(ResolverUpdate(eps, config, attrs)) is None
    ready_all(helper)
    assert helper.state is ConnectivityState.READY
    return helper.last.picker


def bench_cluster_impl() -> tuple[str, float]:
    """xds_cluster_impl over round_robin(3): a pick with load-report counters
    on (``lrs_server: self``) beside the same pick with them off, and a whole
    counted call (pick + ``on_call_done``) both ways."""
    from pyxds.lb import Status

    on, off = _cluster_impl_picker(True), _cluster_impl_picker(False)
    ns_on, ns_off = time_picker(on), time_picker(off)
    ok = Status(__import__("grpc").StatusCode.OK)

    def call(picker: Picker) -> Callable[[], None]:
        pick = picker.pick

        def run() -> None:
            pick(ARGS).on_call_done(ok)

        return run

    call_on = time_ns(call(on), number=NUMBER // 4)
    call_off = time_ns(call(off), number=NUMBER // 4)
    label = (
        f"cluster_impl>rr(3) LRS on [off {ns_off:.0f} ns: {ns_on / ns_off:.2f}x; "
        f"call {call_on:.0f}/{call_off:.0f} ns: {call_on / call_off:.2f}x]"
    )
    return label, ns_on


CASES.append(bench_cluster_impl)


# -- least_request (A48) and outlier_detection (A50) over round_robin (issue 11) --


def _tree_picker(policy_json: list, n: int) -> Picker:
    from pyxds.lb import registry

    factory, config = registry.select(policy_json)
    helper = FakeHelper()
    policy = factory.build(helper)
    policy.update(ResolverUpdate(endpoints(n), config))
    ready_all(helper)
    assert helper.state is ConnectivityState.READY
    return helper.last.picker


def _time_completed(picker: Picker) -> float:
    """ns per pick *and* its ``on_call_done``: a counting picker's cost is
    both halves (round_robin's done callback is None)."""
    from pyxds.lb.api import OK_STATUS

    def pick_and_finish(pick=picker.pick, args=ARGS, ok=OK_STATUS) -> None:
        done = pick(args).on_call_done
        if done is not None:
            done(ok)

    pick_and_finish()
    return time_ns(pick_and_finish, number=NUMBER // 4)


def bench_least_request_100() -> tuple[str, float]:
    """least_request_experimental (choiceCount 2) over 100 READY endpoints,
    pick + on_call_done, beside bare round_robin over 100 in the same call.
    Goal: <= 2x."""
    bare = _time_completed(_tree_picker([{"round_robin": {}}], 100))
    ns = _time_completed(_tree_picker([{"least_request_experimental": {}}], 100))
    return f"least_request(100) [rr100 {bare:.0f} ns: {ns / bare:.1f}x]", ns


def bench_outlier_detection_round_robin_100() -> tuple[str, float]:
    """outlier_detection_experimental (failure percentage on: every call is
    counted) over round_robin over 100 READY endpoints, pick + on_call_done,
    beside bare round_robin over 100 in the same call.  Goal: <= 2x."""
    bare = _time_completed(_tree_picker([{"round_robin": {}}], 100))
    od = {"failurePercentageEjection": {}, "childPolicy": [{"round_robin": {}}]}
    ns = _time_completed(_tree_picker([{"outlier_detection_experimental": od}], 100))
    return f"outlier_detection>rr(100) [rr100 {bare:.0f} ns: {ns / bare:.1f}x]", ns


CASES.append(bench_least_request_100)
CASES.append(bench_outlier_detection_round_robin_100)


# -- stateful session (A55/A60): a cookie's RPC through the ConfigSelector and the cluster tree --


def _session_tree() -> tuple[Any, Any, Any, list[str]]:
    """The cds tree of one EDS cluster (outlier_detection > xds_cluster_impl
    > xds_override_host > priority > xds_wrr_locality > weighted_target >
    round_robin, A75; 3 localities x 10 endpoints, all READY) and two
    ConfigSelectors over one route to it: with the stateful session filter
    and without."""
    import random

    from pyxds.lb import registry
    from pyxds.resolver.config_selector import ClusterRef, XdsConfigSelector
    from pyxds.resolver.xds_config import (
        XDS_CONFIG_ATTRIBUTE,
        ClusterConfig,
        EndpointConfig,
        XdsConfig,
    )
    from pyxds.server import builders as b
    from pyxds.xds.resources import LISTENER, ROUTE_CONFIG
    from pyxds.xds.resources.types import (
        Cluster,
        ClusterLoadAssignment,
        EndpointAddress,
        Locality,
        LocalityName,
    )

    name = "bench-session"
    localities = tuple(
        Locality(
            LocalityName("r", f"z{i}"),
            1,
            tuple(EndpointAddress((f"10.0.{i}.{j}:443",)) for j in range(10)),
        )
        for i in range(3)
    )
    load = ClusterLoadAssignment(name, (localities,))
    cluster = Cluster(name, "EDS", max_requests=2**62)
    xds = XdsConfig(None, None, None, {name: ClusterConfig(cluster, EndpointConfig(load, ""))})
    factory, config = registry.select([{"cds_experimental": {"cluster": name}}])
    helper = FakeHelper()
    policy = factory.build(helper)
    assert policy.update(ResolverUpdate((), config, {XDS_CONFIG_ATTRIBUTE: xds})) is None
    ready_all(helper)
    assert helper.state is ConnectivityState.READY
    refs = {name: ClusterRef(name, lambda: None)}
    rc = b.route_config("r", [b.virtual_host("vh", routes=[b.route(prefix="", cluster=name)])])
    vh = ROUTE_CONFIG.decode(rc.SerializeToString()).resource.virtual_hosts[0]
    session_listener = b.listener(
        "L", http_filters=[b.stateful_session_filter(cookie_name="session", ttl=120)]
    )
    filters = LISTENER.decode(session_listener.SerializeToString()).resource.http_filters
    with_session = XdsConfigSelector(vh, refs, rng=random.Random(1), http_filters=filters)
    plain = XdsConfigSelector(vh, refs, rng=random.Random(1))
    addresses = [a for loc in localities for e in loc.endpoints for a in e.addresses]
    return helper.last.picker, plain, with_session, addresses


def bench_stateful_session() -> tuple[str, float]:
    """A pick (and its call done) with a session cookie (A55: the
    override-host pick of the pinned endpoint) through the whole cluster
    tree, beside the plain cluster pick on the same tree, interleaved (goal:
    <= 1.5x); and the whole RPC side (route: cookie read, A60 cluster; pick;
    done; commit) both ways."""
    import base64

    picker, plain, with_session, addresses = _session_tree()
    value = base64.b64encode(f"{addresses[7]};bench-session".encode()).decode()
    cookie_md = (("cookie", f"session={value}"),)
    path = ARGS.path
    session_config = with_session.select(path, cookie_md)
    plain_config = plain.select(path, ())
    session_args = PickArgs(path, cookie_md, session_config.call_attributes)
    plain_args = PickArgs(path, (), plain_config.call_attributes)
    got = picker.pick(session_args)
    assert isinstance(got, PickComplete) and got.subchannel.address == addresses[7]
    pick = picker.pick

    def routed(selector: Any, metadata: Any) -> Callable[[], None]:
        select = selector.select

        def run() -> None:
            config = select(path, metadata)
            result = pick(PickArgs(path, metadata, config.call_attributes))
            if result.on_call_done is not None:
                result.on_call_done(OK)
            config.on_committed()

        return run

    def picked(args: PickArgs) -> Callable[[], None]:
        def run() -> None:  # pick + call done: the in-flight count stays flat
            result = pick(args)
            if result.on_call_done is not None:
                result.on_call_done(OK)

        return run

    runs = {
        "pick": picked(plain_args),
        "session pick": picked(session_args),
        "rpc": routed(plain, ()),
        "session rpc": routed(with_session, cookie_md),
    }
    best = {name: float("inf") for name in runs}
    for _ in range(REPEAT):  # interleaved: the machine's load hits all alike
        for name, fn in runs.items():
            best[name] = min(best[name], time_ns(fn, number=NUMBER // 10, repeat=1))
    session_config.on_committed()
    plain_config.on_committed()
    label = (
        f"stateful session pick [plain {best['pick']:.0f} ns: "
        f"{best['session pick'] / best['pick']:.2f}x; rpc side "
        f"{best['session rpc']:.0f}/{best['rpc']:.0f} ns: "
        f"{best['session rpc'] / best['rpc']:.2f}x]"
    )
    return label, best["session pick"]


CASES.append(bench_stateful_session)


# -- rls_experimental on a cache hit, beside a plain cluster_manager pick (issue 19) --


class _Subscriptions:
    """The dependency manager, as cds (isDynamic) sees it."""

    def subscribe_cluster(self, name: str) -> object:
        return self

    def release(self) -> None:
        pass


def _rls_config(child_policy: list, target_field: str) -> dict:
    """An rls_experimental config: key from the x-user header, the cache big."""
    return {
        "routeLookupConfig": {
            "grpcKeybuilders": [
                {
                    "names": [{"service": "helloworld.Greeter"}],
                    "headers": [{"key": "user", "names": ["x-user"]}],
                }
            ],
            "lookupService": "localhost:1",
            "cacheSizeBytes": "1000000",
        },
        "childPolicy": child_policy,
        "childPolicyConfigTargetFieldName": target_field,
    }


def _rls_tree() -> tuple[Picker, PickArgs, PickArgs]:
    """xds_cluster_manager with child ``cluster:foo`` (cds foo) and child
    ``cluster_specifier_plugin:rls`` (rls_experimental, key from one header,
    whose cache says foo: a cds foo under it), as the xds resolver builds
    them; every endpoint READY.  Returns the picker and the args of a pick
    through each child (same path, same metadata)."""
    from pyxds.lb import registry
    from pyxds.resolver.xds_config import (
        DEPENDENCY_MANAGER_ATTRIBUTE,
        XDS_CONFIG_ATTRIBUTE,
        ClusterConfig,
        EndpointConfig,
        XdsConfig,
    )
    from pyxds.xds.resources.types import (
        Cluster,
        ClusterLoadAssignment,
        EndpointAddress,
        Locality,
        LocalityName,
    )

    locality = Locality(
        LocalityName("r", "z"), 1, tuple(EndpointAddress((f"10.0.0.{i}:443",)) for i in range(3))
    )
    load = ClusterLoadAssignment("foo", ((locality,),), (), 0)
    cluster = Cluster("foo", "EDS", max_requests=2**62)  # never circuit-break
    xds = XdsConfig(None, None, None, {"foo": ClusterConfig(cluster, EndpointConfig(load, ""))})
    rls = _rls_config([{"cds_experimental": {"isDynamic": True}}], "cluster")
    children = {
        "cluster:foo": {"childPolicy": [{"cds_experimental": {"cluster": "foo"}}]},
        "cluster_specifier_plugin:rls": {"childPolicy": [{"rls_experimental": rls}]},
    }
    factory, config = registry.select(
        [{"xds_cluster_manager_experimental": {"children": children}}]
    )
    helper = FakeHelper()
    policy = factory.build(helper)
    attrs = {XDS_CONFIG_ATTRIBUTE: xds, DEPENDENCY_MANAGER_ATTRIBUTE: _Subscriptions()}
    policy.update(ResolverUpdate((), config, attrs))
    metadata = (("x-user", "alice"), ("content-type", "application/grpc"))
    rls_args = PickArgs(ARGS.path, metadata, {"cluster": "cluster_specifier_plugin:rls"})
    plain_args = PickArgs(ARGS.path, metadata, {"cluster": "cluster:foo"})
    helper.last.picker.pick(rls_args)  # a miss: the lookup starts
    helper.clock.advance(0)
    helper.lookup_channels[-1].last().respond(["foo"])
    ready_all(helper)
    assert helper.state is ConnectivityState.READY
    return helper.last.picker, plain_args, rls_args


def bench_rls_cache_hit() -> tuple[str, float]:
    """A call of an RLS route whose key is cached: cluster_manager -> rls ->
    cds foo's tree, beside a call of a cluster route: cluster_manager -> cds
    foo's tree (cluster_impl, priority, wrr_locality, weighted_target,
    round_robin over 3 READY); pick + ``on_call_done`` (cluster_impl counts
    the call), interleaved in one run.  Goal: <= 2x."""
    from pyxds.lb.api import OK_STATUS

    picker, plain_args, rls_args = _rls_tree()

    def call(args: PickArgs, pick=picker.pick, ok=OK_STATUS) -> Callable[[], None]:
        def run() -> None:
            done = pick(args).on_call_done
            if done is not None:
                done(ok)

        return run

    plain_call, rls_call = call(plain_args), call(rls_args)
    for args in (plain_args, rls_args):
        if not isinstance(picker.pick(args), PickComplete):
            raise RuntimeError("benchmark picker did not complete a pick")
    plain = rls = float("inf")
    number = NUMBER // 4
    for _ in range(REPEAT):  # interleaved: the same machine state for both
        plain = min(plain, timeit.Timer(plain_call).timeit(number) / number * 1e9)
        rls = min(rls, timeit.Timer(rls_call).timeit(number) / number * 1e9)
    return f"rls hit>cds call [cluster_manager>cds {plain:.0f} ns: {rls / plain:.2f}x]", rls


def bench_rls_cache_hit_bare() -> tuple[str, float]:
    """The RLS picker's own cost: cluster_manager -> rls -> round_robin(3)
    beside cluster_manager -> round_robin(3), picks only, interleaved (the
    RLS hit path with the least under it; the row above is the real one)."""
    from pyxds.lb import registry

    rls = _rls_config([{"round_robin": {}}], "target")  # round_robin ignores the field
    children = {
        "cluster:foo": {"childPolicy": [{"round_robin": {}}]},
        "cluster_specifier_plugin:rls": {"childPolicy": [{"rls_experimental": rls}]},
    }
    factory, config = registry.select(
        [{"xds_cluster_manager_experimental": {"children": children}}]
    )
    helper = FakeHelper()
    policy = factory.build(helper)
    policy.update(ResolverUpdate(endpoints(3), config))
    metadata = (("x-user", "alice"), ("content-type", "application/grpc"))
    rls_args = PickArgs(ARGS.path, metadata, {"cluster": "cluster_specifier_plugin:rls"})
    plain_args = PickArgs(ARGS.path, metadata, {"cluster": "cluster:foo"})
    helper.last.picker.pick(rls_args)
    helper.clock.advance(0)
    helper.lookup_channels[-1].last().respond(["target-a"])
    ready_all(helper)
    picker = helper.last.picker
    for args in (plain_args, rls_args):
        if not isinstance(picker.pick(args), PickComplete):
            raise RuntimeError("benchmark picker did not complete a pick")
    plain = rls_ns = float("inf")
    for _ in range(REPEAT):
        for args in (plain_args, rls_args):
            timer = timeit.Timer("pick(args)", globals={"pick": picker.pick, "args": args})
            ns = timer.timeit(NUMBER // 2) / (NUMBER // 2) * 1e9
            if args is plain_args:
                plain = min(plain, ns)
            else:
                rls_ns = min(rls_ns, ns)
    return f"rls hit>rr(3) [cluster_manager>rr(3) {plain:.0f} ns: {rls_ns / plain:.2f}x]", rls_ns


CASES.append(bench_rls_cache_hit)
CASES.append(bench_rls_cache_hit_bare)


def main() -> int:
    print(f"{'case':<44} {'ns/pick':>9} {'floor ns':>9} {'ratio':>7}")
    only = sys.argv[1:]
    for case in CASES:
        if only and not any(word in case.__name__ for word in only):
            continue
        floor = floor_ns()  # measured next to each case: same machine state
        label, ns = case()
        print(f"{label:<44} {ns:>9.1f} {floor:>9.1f} {ns / floor:>6.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
