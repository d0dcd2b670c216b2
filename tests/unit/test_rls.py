"""rls_experimental (grpc/lookup/v1 rls.proto, C-core rls.cc): the cache,
lookups, backoff, throttling, default target and shared child policies,
sans-IO with a FakeClock and a fake RLS channel."""

from __future__ import annotations

import math
from typing import Any

import grpc
import pytest

from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    FailPicker,
    Helper,
    LoadBalancer,
    PickArgs,
    PickComplete,
    Picker,
    PickFail,
    PickQueue,
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
)
from pyxds.lb.errors import LBConfigError
from pyxds.lb.rls import (
    CLEANUP_INTERVAL,
    RLS_DATA_HEADER,
    AdaptiveThrottler,
    LookupReason,
    RlsPolicy,
    entry_size,
)
from pyxds.lb.rls_config import make_key
from pyxds.testing import FakeClock, FakeHelper
from pyxds.testing.fake_rls import FakeRouteLookupChannel

READY = ConnectivityState.READY
CONNECTING = ConnectivityState.CONNECTING
IDLE = ConnectivityState.IDLE
TF = ConnectivityState.TRANSIENT_FAILURE
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
PATH = "/pkg.Svc/Get"


# -- a child policy whose config names a target -------------------------------------


class TargetChild(LoadBalancer):
    """Connects one subchannel to its config's target; READY picks it."""

    instances: list[TargetChild] = []

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self.target: str | None = None
        self.subchannel: Any = None
        self.updates = 0
        self.shut_down = False
        self.backoff_resets = 0
        TargetChild.instances.append(self)

    def update(self, update: ResolverUpdate) -> Status | None:
        self.updates += 1
        target = update.config["target"]
        if target.startswith("bad"):
            return Status(UNAVAILABLE, f"cannot use {target}")
        if self.subchannel is None:
            self.target = target
            self.subchannel = self.helper.create_subchannel(target, {})
            self.subchannel.watch_state(self._on_state)
        return None

    def _on_state(self, state: ConnectivityState, status: Status) -> None:
        picker: Picker
        if state is READY:
            picker = _Fixed(PickComplete(self.subchannel))
        elif state is TF:
            picker = FailPicker(Status(UNAVAILABLE, f"{self.target} down"))
        else:
            picker = QueuePicker()
        self.helper.update_state(state, status, picker)

    def resolver_error(self, status: Status) -> None:
        pass

    def exit_idle(self) -> None:
        pass

    def reset_backoff(self) -> None:
        self.backoff_resets += 1

    def shutdown(self) -> None:
        self.shut_down = True


class _Fixed(Picker):
    def __init__(self, result: PickResult) -> None:
        self.result = result

    def pick(self, args: PickArgs) -> PickResult:
        return self.result


class TargetChildFactory(PolicyFactory):
    name = "test_rls_target_child"

    def parse_config(self, json_config: Any) -> Any:
        target = json_config.get("target")
        if not isinstance(target, str) or "/" in target:
            raise LBConfigError("target", f"bad target {target!r}")
        return dict(json_config)

    def build(self, helper: Helper) -> TargetChild:
        return TargetChild(helper)


@pytest.fixture(autouse=True)
def _child_policy():
    registry.register(TargetChildFactory())
    TargetChild.instances.clear()
    yield
    registry.unregister(TargetChildFactory.name)


def rls_config(**route_lookup: Any) -> Any:
    rlc: dict[str, Any] = {
        "grpcKeybuilders": [
            {
                "names": [{"service": "pkg.Svc"}],
                "headers": [{"key": "user", "names": ["x-user"]}],
            }
        ],
        "lookupService": "rls.example:443",
        "cacheSizeBytes": 100_000,
        "maxAge": "60s",
        "staleAge": "30s",
    }
    rlc.update(route_lookup)
    for name in [k for k, v in rlc.items() if v is None]:
        del rlc[name]
    return registry.select_policy(
        [
            {
                "rls_experimental": {
                    "routeLookupConfig": rlc,
                    "childPolicy": [{TargetChildFactory.name: {}}],
                    "childPolicyConfigTargetFieldName": "target",
                }
            }
        ]
    ).config


class Harness:
    def __init__(self, **route_lookup: Any) -> None:
        self.clock = FakeClock(1000.0)
        self.helper = FakeHelper(self.clock)
        self.helper.channel_authority = "svc.example"  # type: ignore[misc]
        self.policy = RlsPolicy(self.helper)
        self.config = rls_config(**route_lookup)
        assert self.policy.update(ResolverUpdate((), self.config)) is None

    @property
    def rls(self) -> FakeRouteLookupChannel:
        return self.helper.lookup_channels[-1]

    def pick(self, user: str | None = "alice", path: str = PATH, **extra: str) -> PickResult:
        metadata = [("x-user", user)] if user is not None else []
        metadata += list(extra.items())
        return self.helper.pick_with(path, metadata)

    def run(self, seconds: float = 0.0) -> None:
        self.clock.advance(seconds)

    def ready(self, target: str) -> None:
        self.helper.subchannel(target).set_state(READY)

    def fail(self, target: str) -> None:
        self.helper.subchannel(target).set_state(TF)

    def update(self, **route_lookup: Any) -> Status | None:
        self.config = rls_config(**route_lookup)
        return self.policy.update(ResolverUpdate((), self.config))


def _pick_with(self: FakeHelper, path: str, metadata: list) -> PickResult:
    return self.last.picker.pick(PickArgs(path, metadata, {}))


FakeHelper.pick_with = _pick_with  # type: ignore[attr-defined]


def address_of(result: PickResult) -> str:
    assert isinstance(result, PickComplete), result
    return result.subchannel.address


def lookup_for(h: Harness, user: str = "alice") -> Any:
    h.pick(user)
    h.run()
    lookup = h.rls.last()
    assert lookup.key_map["user"] == user
    return lookup


# -- the first pick of a key ----------------------------------------------------------


def test_a_miss_queues_the_pick_and_sends_one_lookup_for_all_picks_of_the_key():
    h = Harness()
    assert h.helper.state is IDLE  # no children yet (C-core)
    assert h.rls.target == "rls.example:443"
    for _ in range(3):
        assert isinstance(h.pick(), PickQueue)
    h.run()
    assert len(h.rls.lookups) == 1
    lookup = h.rls.last()
    assert lookup.key_map == {"user": "alice"}
    assert lookup.reason is LookupReason.MISS
    assert lookup.stale_header_data == ""
    assert lookup.timeout == 10.0


def test_the_answer_routes_the_rpc_to_the_targets_child():
    h = Harness()
    lookup = lookup_for(h)
    states_before = len(h.helper.states)
    lookup.respond(["cluster-a"])
    assert len(h.helper.states) > states_before  # a new picker: queued picks go on
    assert TargetChild.instances[-1].target == "cluster-a"
    assert isinstance(h.pick(), PickQueue)  # the child is not READY yet
    h.ready("cluster-a")
    assert h.helper.state is READY
    assert address_of(h.pick()) == "cluster-a"
    assert len(h.rls.lookups) == 1  # a cache hit sends nothing


def test_header_data_goes_to_the_target_in_the_rls_data_header():
    h = Harness()
    lookup_for(h).respond(["cluster-a"], header_data="opaque-123")
    h.ready("cluster-a")
    result = h.pick(**{RLS_DATA_HEADER: "from-the-app"})
    assert isinstance(result, PickComplete)
    assert result.metadata == ((RLS_DATA_HEADER, "opaque-123"),)


def test_no_header_data_adds_no_header():
    h = Harness()
    lookup_for(h).respond(["cluster-a"])
    h.ready("cluster-a")
    result = h.pick()
    assert isinstance(result, PickComplete) and result.metadata is None


def test_an_answer_without_targets_fails_the_lookup():
    h = Harness()
    lookup_for(h).respond([])
    result = h.pick()
    assert isinstance(result, PickFail)
    assert result.status == Status(
        UNAVAILABLE, "RLS request failed: INVALID_ARGUMENT: RLS response has no target entry"
    )


def test_a_failed_lookup_fails_picks_in_c_cores_words():
    h = Harness()
    lookup_for(h).fail(Status(grpc.StatusCode.NOT_FOUND, "no such user"))
    result = h.pick()
    assert isinstance(result, PickFail)
    assert result.status == Status(UNAVAILABLE, "RLS request failed: NOT_FOUND: no such user")


def test_a_failed_lookup_uses_the_default_target():
    h = Harness(defaultTarget="cluster-d")
    h.ready("cluster-d")
    lookup_for(h).fail("RLS server down")
    assert address_of(h.pick()) == "cluster-d"


# -- targets and children -------------------------------------------------------------


def test_the_first_target_not_in_transient_failure_picks():
    h = Harness()
    lookup_for(h).respond(["cluster-a", "cluster-b", "cluster-c"])
    for target in ("cluster-a", "cluster-b", "cluster-c"):
        h.ready(target)
    assert address_of(h.pick()) == "cluster-a"
    h.fail("cluster-a")
    assert address_of(h.pick()) == "cluster-b"
    h.fail("cluster-b")
    h.fail("cluster-c")
    result = h.pick()  # all failing: the last one's picker decides
    assert isinstance(result, PickFail) and result.status.details == "cluster-c down"


def test_a_child_stays_in_transient_failure_until_it_is_ready_again():
    h = Harness()
    lookup_for(h).respond(["cluster-a", "cluster-b"])
    h.ready("cluster-a")
    h.ready("cluster-b")
    h.fail("cluster-a")
    h.helper.subchannel("cluster-a").set_state(CONNECTING)
    assert address_of(h.pick()) == "cluster-b"  # still skipped
    h.ready("cluster-a")
    assert address_of(h.pick()) == "cluster-a"


def test_one_child_per_target_shared_by_entries_and_the_default_target():
    h = Harness(defaultTarget="cluster-a")
    lookup_for(h, "alice").respond(["cluster-a"])
    lookup_for(h, "bob").respond(["cluster-a", "cluster-b"])
    assert sorted(i.target for i in TargetChild.instances) == ["cluster-a", "cluster-b"]
    assert sorted(h.policy.children) == ["cluster-a", "cluster-b"]
    assert h.policy.children["cluster-a"].refs == 3


def test_a_child_is_shut_down_when_no_entry_names_its_target_any_more():
    h = Harness(maxAge="10s", staleAge="5s")
    lookup_for(h).respond(["cluster-a"])
    child = TargetChild.instances[-1]
    h.run(6)
    h.pick()  # stale: refresh
    h.run()
    h.rls.last().respond(["cluster-b"])
    assert child.shut_down
    assert list(h.policy.children) == ["cluster-b"]


def test_every_parent_update_reaches_every_child():
    h = Harness()
    lookup_for(h, "alice").respond(["cluster-a"])
    lookup_for(h, "bob").respond(["cluster-b"])
    before = [c.updates for c in TargetChild.instances]
    h.update()
    assert [c.updates for c in TargetChild.instances] == [n + 1 for n in before]


def test_the_state_is_the_best_of_the_childrens():
    h = Harness()
    lookup_for(h, "alice").respond(["cluster-a"])
    lookup_for(h, "bob").respond(["cluster-b"])
    assert h.helper.state is IDLE  # both children IDLE
    h.helper.subchannel("cluster-a").set_state(CONNECTING)
    assert h.helper.state is CONNECTING
    h.fail("cluster-a")
    h.helper.subchannel("cluster-b").set_state(CONNECTING)
    assert h.helper.state is CONNECTING
    h.ready("cluster-b")
    assert h.helper.state is READY
    h.fail("cluster-b")
    assert h.helper.state is TF
    assert h.helper.last.status == Status(UNAVAILABLE, "no children available")


def test_a_target_the_child_policy_rejects_fails_its_picks():
    h = Harness()
    lookup_for(h).respond(["bad/name", "cluster-b"])
    h.ready("cluster-b")
    assert address_of(h.pick()) == "cluster-b"  # the bad target is in TRANSIENT_FAILURE
    lookup_for(h, "bob").respond(["bad/name"])
    result = h.pick("bob")
    assert isinstance(result, PickFail) and "bad target" in result.status.details


def test_a_child_rejecting_its_first_update_asks_for_re_resolution():
    h = Harness()
    lookup_for(h).respond(["bad-target"])
    assert h.helper.reresolution_requests == 1


# -- ages: stale and expired ------------------------------------------------------------


def test_stale_data_is_used_while_one_refresh_with_its_header_data_is_sent():
    h = Harness(maxAge="60s", staleAge="30s")
    lookup_for(h).respond(["cluster-a"], header_data="v1")
    h.ready("cluster-a")
    h.run(31)
    for _ in range(3):
        assert address_of(h.pick()) == "cluster-a"
    h.run()
    assert len(h.rls.lookups) == 2
    refresh = h.rls.last()
    assert refresh.reason is LookupReason.STALE
    assert refresh.stale_header_data == "v1"
    refresh.respond(["cluster-a"], header_data="v2")
    result = h.pick()
    assert isinstance(result, PickComplete) and result.metadata == ((RLS_DATA_HEADER, "v2"),)
    h.run(29)
    h.pick()
    h.run()
    assert len(h.rls.lookups) == 2  # fresh again until 30 s after the refresh


def test_expired_data_is_a_miss_and_the_pick_queues():
    h = Harness(maxAge="60s", staleAge=None)
    lookup_for(h).respond(["cluster-a"])
    h.ready("cluster-a")
    h.run(59)
    assert address_of(h.pick()) == "cluster-a"
    h.run()
    assert len(h.rls.lookups) == 1  # no staleAge: never stale before it expires
    h.run(2)
    assert isinstance(h.pick(), PickQueue)
    h.run()
    assert h.rls.last().reason is LookupReason.MISS
    assert h.rls.last().stale_header_data == ""


def test_a_failed_refresh_keeps_the_data_until_it_expires():
    h = Harness(maxAge="60s", staleAge="10s")
    lookup_for(h).respond(["cluster-a"])
    h.ready("cluster-a")
    h.run(11)
    h.pick()
    h.run()
    h.rls.last().fail("RLS server down")
    assert address_of(h.pick()) == "cluster-a"
    h.run(50)
    result = h.pick()  # expired, backoff long over: a new lookup, the pick waits
    assert isinstance(result, PickQueue)


# -- backoff ------------------------------------------------------------------------------


def backoff_delays(h: Harness, failures: int) -> list[float]:
    """Fail the key's lookups ``failures`` times; the backoff of each."""
    h.policy.throttler = AdaptiveThrottler(h.clock, Uniform(1.0))  # never throttles
    delays = []
    for i in range(failures):
        lookup = lookup_for(h) if i == 0 else h.rls.last()
        start = h.clock.now()
        lookup.fail("RLS server down")
        entry = h.policy.cache[key("alice")]
        delays.append(entry.data.backoff_time - start)
        # the backoff timer publishes a picker; the next pick looks up again
        published = len(h.helper.states)
        h.run(delays[-1] + 0.001)
        assert len(h.helper.states) == published + 1
        assert isinstance(h.pick(), PickQueue)
        h.run()
    return delays


def test_failed_lookups_back_off_exponentially_with_jitter():
    h = Harness()
    delays = backoff_delays(h, 5)
    for i, delay in enumerate(delays):
        base = min(1.0 * 1.6**i, 120.0)
        assert base * 0.8 <= delay <= base * 1.2, (i, delay)
    assert len(h.rls.lookups) == 6


def test_picks_in_backoff_fail_and_send_nothing():
    h = Harness()
    lookup_for(h).fail("RLS server down")
    for _ in range(5):
        assert isinstance(h.pick(), PickFail)
    h.run(0.5)
    assert len(h.rls.lookups) == 1


def test_a_success_restarts_the_backoff_sequence():
    h = Harness()
    backoff_delays(h, 3)
    h.rls.last().respond(["cluster-a"])
    h.run(61)  # expired
    h.pick()
    h.run()
    h.rls.last().fail("down")
    entry = h.policy.cache[key("alice")]
    assert 0.8 <= entry.data.backoff_time - h.clock.now() <= 1.2


def test_reset_backoff_ends_every_entrys_backoff():
    h = Harness()
    lookup_for(h).fail("down")
    h.policy.reset_backoff()
    assert h.rls.reset_backoff_calls == 1
    assert isinstance(h.pick(), PickQueue)
    h.run()
    assert len(h.rls.lookups) == 2


def test_the_rls_channel_coming_back_resets_every_backoff():
    h = Harness()
    lookup_for(h).fail("down")
    h.rls.set_state(TF)
    assert isinstance(h.pick(), PickFail)
    h.rls.set_state(READY)
    assert isinstance(h.pick(), PickQueue)
    h.run()
    assert len(h.rls.lookups) == 2


# -- throttling ----------------------------------------------------------------------------


class Uniform:
    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self) -> float:
        return self.value


def test_the_throttler_throttles_with_c_cores_probability():
    clock = FakeClock()
    draw = Uniform(0.5)
    throttler = AdaptiveThrottler(clock, draw)
    assert not throttler.should_throttle()
    for _ in range(12):
        throttler.register_response(False)
    # 12 requests, 0 successes: (12 - 0) / (12 + 8) = 0.6
    assert math.isclose(throttler.probability(), 0.6)
    assert throttler.should_throttle()  # 0.5 < 0.6; counts as a failed request
    assert math.isclose(throttler.probability(), 13 / 21)
    draw.value = 0.7
    assert not throttler.should_throttle()
    for _ in range(20):
        throttler.register_response(True)
    assert throttler.probability() < 0  # (33 - 2 * 20) / 41
    assert not throttler.should_throttle()


def test_the_throttler_forgets_requests_after_its_30_second_window():
    clock = FakeClock()
    throttler = AdaptiveThrottler(clock, Uniform(0.0))
    for _ in range(10):
        throttler.register_response(False)
    assert throttler.should_throttle()
    clock.advance(30.5)
    assert throttler.probability() == 0.0
    assert not throttler.should_throttle()


def test_a_throttled_miss_uses_the_default_target_or_fails():
    h = Harness()
    h.policy.throttler = AdaptiveThrottler(h.clock, Uniform(0.0))
    for _ in range(10):
        h.policy.throttler.register_response(False)
    result = h.pick()
    assert isinstance(result, PickFail)
    assert result.status == Status(UNAVAILABLE, "RLS request throttled")
    h.run()
    assert h.rls.lookups == []
    h2 = Harness(defaultTarget="cluster-d")
    h2.ready("cluster-d")
    h2.policy.throttler = h.policy.throttler
    assert address_of(h2.pick()) == "cluster-d"


def test_a_throttled_refresh_of_valid_data_still_serves_and_still_refreshes():
    # C-core: throttling only ends picks that have no valid data
    h = Harness(maxAge="60s", staleAge="10s")
    lookup_for(h).respond(["cluster-a"])
    h.ready("cluster-a")
    h.policy.throttler = AdaptiveThrottler(h.clock, Uniform(0.0))
    for _ in range(10):
        h.policy.throttler.register_response(False)
    h.run(11)
    assert address_of(h.pick()) == "cluster-a"
    h.run()
    assert h.rls.last().reason is LookupReason.STALE


def test_lookup_outcomes_feed_the_throttler():
    h = Harness()
    lookup_for(h, "alice").fail("down")
    lookup_for(h, "bob").respond([])  # no targets counts as a failure
    lookup_for(h, "carol").respond(["cluster-a"])
    # 3 requests, 1 success: (3 - 2) / 11
    assert math.isclose(h.policy.throttler.probability(), 1 / 11)


# -- the cache: size, LRU, cleanup -------------------------------------------------------------


def key(user: str) -> str:
    return make_key([("user", user)])


def test_entry_sizes_are_counted_as_c_core_counts_them():
    assert entry_size(key("alice")) == 2 * (48 + len("user") + len("alice")) + 160
    h = Harness()
    lookup_for(h, "alice").respond(["cluster-a"])
    lookup_for(h, "bob").respond(["cluster-a"])
    assert h.policy.cache_bytes == entry_size(key("alice")) + entry_size(key("bob"))


def test_the_least_recently_used_entry_is_evicted_when_the_cache_is_full():
    size = entry_size(key("user1"))
    h = Harness(cacheSizeBytes=3 * size)
    for user in ("user1", "user2", "user3"):
        lookup_for(h, user).respond(["cluster-a"])
        h.run(2)
    h.ready("cluster-a")
    h.run(10)  # every entry is old enough to evict
    h.pick("user1")  # user2 is now the least recently used
    lookup_for(h, "user4").respond(["cluster-a"])
    assert sorted(h.policy.cache) == sorted(key(u) for u in ("user1", "user3", "user4"))
    assert h.policy.cache_bytes <= 3 * size


def test_entries_younger_than_five_seconds_are_not_evicted():
    size = entry_size(key("user1"))
    h = Harness(cacheSizeBytes=size)
    lookup_for(h, "user1").respond(["cluster-a"])
    lookup_for(h, "user2").respond(["cluster-a"])
    assert len(h.policy.cache) == 2  # over the limit for now (C-core)
    h.run(6)
    lookup_for(h, "user3").respond(["cluster-a"])
    assert list(h.policy.cache) == [key("user3")]


def test_a_smaller_cache_size_evicts_at_once():
    size = entry_size(key("user1"))
    h = Harness()
    for user in ("user1", "user2", "user3"):
        lookup_for(h, user).respond(["cluster-a"])
    h.run(6)
    h.update(cacheSizeBytes=size)
    assert list(h.policy.cache) == [key("user3")]


def test_evicting_an_entry_releases_its_children():
    size = entry_size(key("user1"))
    h = Harness(cacheSizeBytes=size)
    lookup_for(h, "user1").respond(["cluster-a"])
    child = TargetChild.instances[-1]
    h.run(6)
    lookup_for(h, "user2").respond(["cluster-b"])
    assert child.shut_down
    assert list(h.policy.children) == ["cluster-b"]


def test_the_cleanup_timer_drops_entries_whose_data_and_backoff_expired():
    h = Harness(maxAge="10s", staleAge=None)
    lookup_for(h, "alice").respond(["cluster-a"])
    lookup_for(h, "bob").fail("down")
    h.run(CLEANUP_INTERVAL + 1)
    assert h.policy.cache == {}
    assert h.policy.cache_bytes == 0
    assert h.policy.children == {}


# -- updates and shutdown ----------------------------------------------------------------


def test_a_new_lookup_service_gets_a_new_channel_and_the_old_one_closes_after_its_lookups():
    h = Harness()
    old = h.rls
    lookup = lookup_for(h)
    h.update(lookupService="other.example:443")
    assert h.rls is not old and h.rls.target == "other.example:443"
    assert not old.closed  # a lookup is still in flight on it
    lookup.respond(["cluster-a"])
    assert old.closed
    h.ready("cluster-a")
    assert address_of(h.pick()) == "cluster-a"


def test_a_new_default_target_replaces_the_old_one():
    h = Harness(defaultTarget="cluster-d")
    first = TargetChild.instances[-1]
    h.update(defaultTarget="cluster-e")
    assert first.shut_down
    h.ready("cluster-e")
    lookup_for(h).fail("down")
    assert address_of(h.pick()) == "cluster-e"


def test_shutdown_cancels_lookups_closes_the_channel_and_the_children():
    h = Harness(defaultTarget="cluster-d")
    lookup_for(h, "alice").respond(["cluster-a"])
    pending = lookup_for(h, "bob")
    h.policy.shutdown()
    assert pending.cancelled and h.rls.closed
    assert all(child.shut_down for child in TargetChild.instances)
    assert h.clock.pending == []


def test_without_an_rls_channel_lookups_fail_clearly():
    clock = FakeClock()
    helper = FakeHelper(clock)
    helper.create_route_lookup_channel = None  # type: ignore[assignment,method-assign]
    del helper.create_route_lookup_channel
    policy = RlsPolicy(_NoRlsHelper(helper))
    policy.update(ResolverUpdate((), rls_config()))
    result = helper.last.picker.pick(PickArgs(PATH, [("x-user", "a")], {}))
    assert isinstance(result, PickQueue)
    clock.advance(0)
    result = helper.last.picker.pick(PickArgs(PATH, [("x-user", "a")], {}))
    assert isinstance(result, PickFail)
    assert "RLS channel to rls.example:443" in result.status.details


class _NoRlsHelper(Helper):
    def __init__(self, inner: FakeHelper) -> None:
        self.inner = inner
        self.clock = inner.clock
        self.random = inner.random

    def create_subchannel(self, address: str, attributes: Any) -> Any:
        return self.inner.create_subchannel(address, attributes)

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self.inner.update_state(state, status, picker)

    def request_reresolution(self) -> None:
        pass


def test_the_host_key_is_the_channels_authority():
    h = Harness(
        grpcKeybuilders=[{"names": [{"service": "pkg.Svc"}], "extraKeys": {"host": "host"}}]
    )
    h.pick()
    h.run()
    assert h.rls.last().key_map == {"host": "svc.example"}


def test_config_dump_shows_the_cache():
    h = Harness()
    lookup_for(h).respond(["cluster-a"], header_data="hd")
    dump = h.policy.config_dump()
    assert dump["entries"][0]["key"] == {"user": "alice"}
    assert dump["entries"][0]["targets"] == ["cluster-a"]
    assert dump["entries"][0]["valid"] is True
    assert dump["targets"] == {"cluster-a": "IDLE"}
    assert OK_STATUS.ok


# -- the picker's key memo -------------------------------------------------------------


def tuple_pick(h: Harness, user: str) -> PickResult:
    return h.helper.last.picker.pick(PickArgs(PATH, (("x-user", user),), {}))


def test_repeated_metadata_reuses_the_key_and_the_memo_stays_bounded():
    from pyxds.lb.rls import KEY_MEMO_SIZE

    h = Harness()
    lookup_for(h).respond(["cluster-a"])
    h.ready("cluster-a")
    assert address_of(tuple_pick(h, "alice")) == "cluster-a"
    (memo,) = h.policy.key_memo.values()
    assert list(memo.values()) == [key("alice")]
    assert tuple_pick(h, "alice") == tuple_pick(h, "alice")
    for i in range(KEY_MEMO_SIZE + 5):
        tuple_pick(h, f"user{i}")
    assert len(memo) <= KEY_MEMO_SIZE


def test_new_key_builders_forget_the_memo():
    h = Harness()
    tuple_pick(h, "alice")
    h.run()
    assert h.rls.last().key_map == {"user": "alice"}
    h.update(
        grpcKeybuilders=[
            {"names": [{"service": "pkg.Svc"}], "headers": [{"key": "who", "names": ["x-user"]}]}
        ]
    )
    tuple_pick(h, "alice")
    h.run()
    assert h.rls.last().key_map == {"who": "alice"}


# -- threads ---------------------------------------------------------------------------


def test_concurrent_misses_of_one_key_send_one_lookup():
    import threading

    h = Harness()
    picker = h.helper.last.picker
    args = PickArgs(PATH, (("x-user", "alice"),), {})
    start = threading.Barrier(8)
    results: list[PickResult] = []

    def picks() -> None:
        start.wait(5)
        for _ in range(200):
            results.append(picker.pick(args))

    threads = [threading.Thread(target=picks) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == 1600 and all(isinstance(r, PickQueue) for r in results)
    h.run()
    assert len(h.rls.lookups) == 1


# -- the channel's side: credentials and authority of the RLS channel -----------------


def test_the_rls_channel_gets_the_channels_credentials_and_authority():
    import grpc as grpc_module

    from pyxds.channel.core import ChannelCore, ChannelHelper
    from pyxds.security.credentials import xds_channel_credentials

    fallback = grpc_module.local_channel_credentials()
    plain = grpc_module.local_channel_credentials()

    def core(credentials: Any, **kwargs: Any) -> ChannelCore:
        return ChannelCore("xds:///echo-service", lambda *a: None, credentials, **kwargs)

    cores = [
        core(xds_channel_credentials(fallback)),
        core(plain),
        core(None),
        core(None, options=[("grpc.default_authority", "other.example")]),
    ]
    try:
        assert cores[0].lookup_credentials is fallback  # as C-core's xDS creds
        assert cores[1].lookup_credentials is plain
        assert cores[2].lookup_credentials is None
        assert [c.default_authority for c in cores] == ["echo-service"] * 3 + ["other.example"]
        assert ChannelHelper(cores[3], 0).channel_authority == "other.example"
    finally:
        for c in cores:
            c.close()
