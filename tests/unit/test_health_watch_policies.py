"""The health watch in the LB policies (gRFC A61 "Generic Health Reporting
Mechanism", A17 "LB Policies Can Disable Health Checking When Needed"),
with fake subchannels whose health the test drives.

pick_first under a petiole policy (round_robin, weighted_round_robin,
least_request, ring_hash) starts the health watch on the subchannel it
selected and reports what it says; connection management stays on the
connectivity state.  A top-level pick_first never starts it, and a
subchannel without a health signal (a channel that does not health check)
is reported READY as before."""

from __future__ import annotations

import grpc
import pytest
from test_round_robin import CONNECTING, IDLE, READY, TF, eps

from pyxds.lb import PickComplete, PickFail, ResolverUpdate, Status
from pyxds.lb.api import REQUEST_HASH_KEY
from pyxds.lb.least_request import LeastRequest, LeastRequestConfig
from pyxds.lb.pick_first import PickFirst, PickFirstConfig
from pyxds.lb.ring_hash import RingHash, RingHashFactory
from pyxds.lb.round_robin import RoundRobin, RoundRobinConfig
from pyxds.lb.weighted_round_robin import WeightedRoundRobinFactory
from pyxds.testing import FakeHelper

UNHEALTHY = "ipv4:a:1: backend unhealthy"


def petiole_pick_first(helper: FakeHelper) -> PickFirst:
    policy = PickFirst(helper, omit_status_prefix=True, health_watch=True)
    policy.update(ResolverUpdate(eps("a:1", "b:1"), PickFirstConfig()))
    return policy


def test_a_petiole_pick_first_reports_the_selected_subchannels_health_once_each():
    """Selected READY: CONNECTING until the first health answer (A17), then
    READY / TRANSIENT_FAILURE as the health changes, each reported once and
    in order; the failing picker carries the health's status."""
    helper = FakeHelper(health_checked=True)
    petiole_pick_first(helper)
    a = helper.subchannel("a:1")
    a.set_state(CONNECTING)
    a.set_state(READY)
    assert a.health_watched and not helper.subchannel("b:1", live=False).health_watched
    a.set_health(READY)
    a.set_health(TF, UNHEALTHY)
    a.set_health(READY)
    assert helper.state_sequence() == [CONNECTING, READY, TF, READY]
    a.set_health(TF, UNHEALTHY)
    result = helper.pick()
    assert isinstance(result, PickFail)
    assert result.status == Status(grpc.StatusCode.UNAVAILABLE, UNHEALTHY)


def test_connection_management_stays_on_connectivity():
    """An IDLE from the health watch is left to the connectivity watch; a
    dropped connection goes IDLE (re-resolving) and ends the health watch;
    reconnecting selects and watches again."""
    helper = FakeHelper(health_checked=True)
    policy = petiole_pick_first(helper)
    a = helper.subchannel("a:1")
    a.set_state(READY)
    a.set_health(READY)
    reported = len(helper.states)
    a.set_health(IDLE)
    assert len(helper.states) == reported
    a.set_state(IDLE)
    assert helper.state is IDLE and not a.health_watched
    assert helper.reresolution_requests == 1
    a.set_health(TF, UNHEALTHY)  # a late report of the ended watch
    assert helper.state is IDLE
    policy.exit_idle()
    a.set_state(READY)
    assert a.health_watched and helper.state is CONNECTING


def test_the_health_watch_ends_with_the_selection():
    """An update without the selected address, and shutdown, end the watch."""
    helper = FakeHelper(health_checked=True)
    policy = petiole_pick_first(helper)
    a = helper.subchannel("a:1")
    a.set_state(READY)
    policy.update(ResolverUpdate(eps("c:1"), PickFirstConfig()))
    assert not a.health_watched
    policy.exit_idle()
    c = helper.subchannel("c:1")
    c.set_state(READY)
    assert c.health_watched
    policy.shutdown()
    assert not c.health_watched


def test_a_top_level_pick_first_never_watches_health():
    """A17 "pick_first" / A61: only a petiole policy's pick_first does."""
    helper = FakeHelper(health_checked=True)
    policy = PickFirst(helper)
    policy.update(ResolverUpdate(eps("a:1"), PickFirstConfig()))
    a = helper.subchannel("a:1")
    a.set_state(READY)
    assert not a.health_watched
    assert helper.state is READY


def test_without_a_health_signal_the_selection_is_ready_at_once():
    """A channel that does not health check (``watch_health`` None): READY
    as soon as connected, as before health checking existed."""
    helper = FakeHelper()
    petiole_pick_first(helper)
    helper.subchannel("a:1").set_state(READY)
    assert helper.state_sequence() == [CONNECTING, READY]


def round_robin(helper: FakeHelper, *addresses: str) -> RoundRobin:
    policy = RoundRobin(helper)
    policy.update(ResolverUpdate(eps(*addresses), RoundRobinConfig()))
    return policy


def test_round_robin_skips_an_unhealthy_endpoint_and_fails_when_all_are():
    """A17 "round_robin": an unhealthy subchannel is not READY and gets no
    picks; all unhealthy: C-core's TRANSIENT_FAILURE text with the health's
    status as the last error."""
    helper = FakeHelper(health_checked=True)
    round_robin(helper, "a:1", "b:1")
    a, b = helper.subchannel("a:1"), helper.subchannel("b:1")
    for sc in (a, b):
        sc.set_state(READY)
    a.set_health(TF, UNHEALTHY)
    b.set_health(READY)
    got = {helper.pick().subchannel.address for _ in range(6)}  # type: ignore[union-attr]
    assert got == {"b:1"}
    b.set_health(TF, "ipv4:b:1: backend unhealthy")
    assert helper.state is TF
    assert helper.last.status.details == (
        "connections to all backends failing; last error: ipv4:b:1: backend unhealthy"
    )
    a.set_health(READY)
    assert helper.state is READY
    assert {helper.pick().subchannel.address for _ in range(4)} == {"a:1"}  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["weighted_round_robin", "least_request"])
def test_round_robins_relatives_use_the_health_watch(kind):
    """weighted_round_robin and least_request are round_robin over
    pick_first children (C-core checks health under WRR: grpcio 1.85,
    live; it has no least_request, grpc-java's uses the health watch)."""
    helper = FakeHelper(health_checked=True)
    if kind == "weighted_round_robin":
        factory = WeightedRoundRobinFactory()
        policy = factory.build(helper)
        policy.update(ResolverUpdate(eps("a:1", "b:1"), factory.parse_config({})))
    else:
        policy = LeastRequest(helper)
        policy.update(ResolverUpdate(eps("a:1", "b:1"), LeastRequestConfig()))
    for address in ("a:1", "b:1"):
        sc = helper.subchannel(address)
        sc.set_state(READY)
        assert sc.health_watched, address
        sc.set_health(TF, f"ipv4:{address}: backend unhealthy")
    assert helper.state is TF
    helper.subchannel("b:1").set_health(READY)
    assert helper.state is READY
    for _ in range(4):
        result = helper.pick()
        assert isinstance(result, PickComplete) and result.subchannel.address == "b:1"


def test_ring_hash_passes_over_an_unhealthy_endpoint():
    """ring_hash's endpoints are pick_first children too (C-core checks
    health there: grpcio 1.85, live): the hash of an unhealthy endpoint
    goes on along the ring, and comes back when it is healthy again."""
    helper = FakeHelper(health_checked=True)
    policy = RingHash(helper)
    policy.update(ResolverUpdate(eps("a:1", "b:1"), RingHashFactory().parse_config({})))
    ring = policy.ring
    index = [e.endpoint.addresses[0] for e in policy.endpoints].index("a:1")
    on_a = {REQUEST_HASH_KEY: ring.hashes[ring.endpoints.index(index)]}
    assert not isinstance(helper.pick(**on_a), PickComplete)
    helper.clock.advance(0)
    a = helper.subchannel("a:1")
    a.set_state(READY)
    assert a.health_watched
    a.set_health(READY)
    assert helper.pick(**on_a).subchannel is a  # type: ignore[union-attr]
    a.set_health(TF, UNHEALTHY)
    helper.clock.advance(0)
    b = helper.subchannel("b:1")
    b.set_state(READY)
    b.set_health(READY)
    assert helper.pick(**on_a).subchannel is b  # type: ignore[union-attr]
    a.set_health(READY)
    assert helper.pick(**on_a).subchannel is a  # type: ignore[union-attr]
