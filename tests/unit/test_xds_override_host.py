"""xds_override_host_experimental (gRFC A55 "LB Policy for Stateful Session
Affinity", A75 "Stateful Session Affinity Changes"), driven through the real
cds -> xds_cluster_impl -> xds_override_host -> priority -> ... tree on a
FakeHelper, with the per-RPC session attribute the stateful session filter
sets."""

from __future__ import annotations

import pytest
from test_cds_support import (
    CONNECTING,
    IDLE,
    OK,
    READY,
    TF,
    build,
    cds_update,
    channel_subchannel,
    cluster_impl_of,
    connect_all,
    eds_cluster,
    eds_entry,
    loc,
    xds_config,
)

from pyxds.lb import LBConfigError, PickArgs, PickComplete, PickQueue, registry
from pyxds.lb.xds_override_host import (
    MIN_SWEEP_INTERVAL,
    OVERRIDE_HOST_ATTRIBUTE,
    OverrideHostAttribute,
)
from pyxds.xds.resources.types import EndpointAddress, Locality

A, B = loc("a"), loc("b")


def locality(name, endpoints, weight=1):
    """``endpoints``: "host:port" or ("host:port", health) or (("a1", "a2"), health)."""
    eps = []
    for e in endpoints:
        if isinstance(e, str):
            e = (e, "UNKNOWN")
        addresses, health = e
        if isinstance(addresses, str):
            addresses = (addresses,)
        eps.append(EndpointAddress(tuple(addresses), 1, health))
    return Locality(name, weight, tuple(eps))


def tree(name="c1", statuses=None, idle_timeout=3600.0):
    helper, policy, config = build([{"cds_experimental": {"cluster": name}}])
    kwargs = {"idle_timeout": idle_timeout}
    if statuses is not None:
        kwargs["override_host_statuses"] = frozenset(statuses)
    cluster = eds_cluster(name, lb_policy_config='[{"round_robin": {}}]', **kwargs)

    def update(*priorities):
        entry = eds_entry(cluster, *priorities)
        assert policy.update(cds_update(config, xds_config({name: entry}))) is None

    return helper, policy, update


def pick(helper, cookie=None):
    """One pick of an RPC with a session attribute (``cookie``: its address
    list, "" for an RPC of a session without a usable cookie)."""
    attrs = {"cluster": "cluster:c1"}
    session = None
    if cookie is not None:
        session = OverrideHostAttribute(cookie)
        attrs[OVERRIDE_HOST_ATTRIBUTE] = session
    result = helper.last.picker.pick(PickArgs("/svc/M", (), attrs))
    return result, session


def picked(helper, cookie=None):
    result, session = pick(helper, cookie)
    assert isinstance(result, PickComplete), result
    return result.subchannel.address, session


def live(helper, address):
    return [s for s in helper.subchannels if s.address == address and not s.shut_down]


# -- the picker -----------------------------------------------------------------------


def test_without_a_cookie_the_child_picks_and_the_session_learns_the_address():
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    seen = set()
    for _ in range(4):
        address, session = picked(helper, cookie="")
        assert session.actual_address_list == address
        seen.add(address)
    assert seen == {"10.0.0.1:80", "10.0.0.2:80"}  # round robin as usual


def test_an_rpc_without_the_attribute_is_a_plain_child_pick():
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    result, _ = pick(helper)
    assert isinstance(result, PickComplete)
    assert channel_subchannel(result.subchannel) in helper.subchannels  # the channel's own


def test_a_cookie_naming_a_ready_endpoint_pins_every_pick_to_it():
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"])])
    connect_all(helper)
    for _ in range(10):
        address, session = picked(helper, cookie="10.0.0.2:80")
        assert address == "10.0.0.2:80"
        assert session.actual_address_list == "10.0.0.2:80"


def test_the_pinned_pick_is_counted_by_load_reporting_like_any_other():
    helper, policy, update = tree("c1-ssa-count")
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    for _ in range(5):
        result, _session = pick(helper, cookie="10.0.0.1:80")
        assert channel_subchannel(result.subchannel) in helper.subchannels
        result.on_call_done(OK)
    load = cluster_impl_of(policy).counters.snapshot()
    assert sum(x.succeeded for x in load.localities) == 5


@pytest.mark.parametrize("cookie", ["10.9.9.9:80", "not-an-address", "10.0.0.1", ","])
def test_a_cookie_naming_no_endpoint_of_the_cluster_falls_back_to_a_normal_pick(cookie):
    """A55: an address not in the cluster (or not an address at all) is a
    normal pick; the session learns the new address (the filter re-sets the
    cookie)."""
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    address, session = picked(helper, cookie=cookie)
    assert address in ("10.0.0.1:80", "10.0.0.2:80")
    assert session.actual_address_list == address


def test_a_cookie_naming_a_failed_endpoint_falls_back_to_a_normal_pick():
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    live(helper, "10.0.0.1:80")[0].set_state(TF)
    for _ in range(4):
        address, session = picked(helper, cookie="10.0.0.1:80")
        assert address == "10.0.0.2:80" and session.actual_address_list == "10.0.0.2:80"


def test_a_cookie_naming_a_connecting_endpoint_queues_the_pick():
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    sub = live(helper, "10.0.0.1:80")[0]
    sub.set_state(IDLE)
    sub.set_state(CONNECTING)
    result, _ = pick(helper, cookie="10.0.0.1:80")
    assert isinstance(result, PickQueue)
    sub.set_state(READY)
    assert picked(helper, cookie="10.0.0.1:80")[0] == "10.0.0.1:80"


def test_a_cookie_naming_an_idle_endpoint_asks_it_to_connect_and_queues():
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    sub = live(helper, "10.0.0.1:80")[0]
    sub.set_state(IDLE)
    before = sub.connect_calls
    result, _ = pick(helper, cookie="10.0.0.1:80")
    assert isinstance(result, PickQueue)
    helper.clock.advance(0)  # the picker's hop into the serializer
    assert sub.connect_calls > before


def test_a_multi_address_cookie_takes_the_first_ready_address_and_reports_the_endpoint():
    """A61 endpoints: the cookie lists an endpoint's addresses; the first
    READY one wins and the session's actual address list is that address's
    (itself first, then the endpoint's others)."""
    helper, _policy, update = tree()
    update([locality(A, [(("10.0.0.1:80", "10.0.1.1:80"), "HEALTHY"), "10.0.0.2:80"])])
    connect_all(helper)
    address, session = picked(helper, cookie="10.0.0.1:80,10.0.1.1:80")
    assert address in ("10.0.0.1:80", "10.0.1.1:80")
    assert session.actual_address_list.split(",")[0] == address
    assert set(session.actual_address_list.split(",")) == {"10.0.0.1:80", "10.0.1.1:80"}


# -- health status (A55 override_host_status) ------------------------------------------


def test_a_draining_endpoint_gets_no_new_traffic():
    helper, _policy, update = tree(statuses={"UNKNOWN", "HEALTHY", "DRAINING"})
    update([locality(A, ["10.0.0.1:80", ("10.0.0.2:80", "DRAINING")])])
    connect_all(helper)
    for _ in range(6):
        assert picked(helper, cookie="")[0] == "10.0.0.1:80"
        result, _ = pick(helper)
        assert result.subchannel.address == "10.0.0.1:80"


def test_a_draining_endpoint_keeps_its_sessions_when_draining_is_overridable():
    helper, _policy, update = tree(statuses={"UNKNOWN", "HEALTHY", "DRAINING"})
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    assert picked(helper, cookie="10.0.0.2:80")[0] == "10.0.0.2:80"  # session in use
    update([locality(A, ["10.0.0.1:80", ("10.0.0.2:80", "DRAINING")])])
    connect_all(helper)
    for _ in range(5):
        assert picked(helper, cookie="10.0.0.2:80")[0] == "10.0.0.2:80"
        assert picked(helper, cookie="")[0] == "10.0.0.1:80"  # no new session there
    assert len(live(helper, "10.0.0.2:80")) == 1  # kept for the session, not re-made


def test_a_draining_endpoint_loses_its_sessions_with_the_default_statuses():
    """Default override_host_status {UNKNOWN, HEALTHY}: DRAINING is not
    overridable, so the session moves."""
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    assert picked(helper, cookie="10.0.0.2:80")[0] == "10.0.0.2:80"
    update([locality(A, ["10.0.0.1:80", ("10.0.0.2:80", "DRAINING")])])
    connect_all(helper)
    address, session = picked(helper, cookie="10.0.0.2:80")
    assert address == "10.0.0.1:80" and session.actual_address_list == "10.0.0.1:80"
    assert live(helper, "10.0.0.2:80") == []


def test_a_status_left_out_of_the_set_is_not_overridden():
    """override_host_status {UNKNOWN}: a HEALTHY endpoint is never pinned."""
    helper, _policy, update = tree(statuses={"UNKNOWN"})
    update([locality(A, [("10.0.0.1:80", "HEALTHY"), ("10.0.0.2:80", "HEALTHY")])])
    connect_all(helper)
    got = {picked(helper, cookie="10.0.0.2:80")[0] for _ in range(6)}
    assert got == {"10.0.0.1:80", "10.0.0.2:80"}


def test_an_endpoint_that_left_the_cluster_moves_its_sessions():
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    assert picked(helper, cookie="10.0.0.2:80")[0] == "10.0.0.2:80"
    update([locality(A, ["10.0.0.1:80"])])
    address, session = picked(helper, cookie="10.0.0.2:80")
    assert address == "10.0.0.1:80" and session.actual_address_list == "10.0.0.1:80"
    assert live(helper, "10.0.0.2:80") == []


# -- across priorities and ownership (A75) -----------------------------------------------


def test_a_session_follows_its_endpoint_into_an_unused_lower_priority():
    """A75: the endpoint moves from priority 0 to priority 1 while priority
    0 still serves; the session keeps going to it on a subchannel the policy
    creates and owns (priority 1 is never built)."""
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    assert picked(helper, cookie="10.0.0.2:80")[0] == "10.0.0.2:80"
    update([locality(A, ["10.0.0.1:80"])], [locality(B, ["10.0.0.2:80"])])
    connect_all(helper)
    # kept owned: the child let go, the session used it just now
    assert picked(helper, cookie="10.0.0.2:80")[0] == "10.0.0.2:80"
    assert picked(helper, cookie="")[0] == "10.0.0.1:80"  # new sessions: priority 0


def test_a_session_on_an_endpoint_without_subchannel_creates_one_and_queues():
    helper, _policy, update = tree()
    # priority 1 is never built while priority 0 is READY
    update([locality(A, ["10.0.0.1:80"])], [locality(B, ["10.0.0.9:80"])])
    connect_all(helper)
    assert live(helper, "10.0.0.9:80") == []
    result, _ = pick(helper, cookie="10.0.0.9:80")
    assert isinstance(result, PickQueue)
    helper.clock.advance(0)  # the picker's hop: create and connect
    assert len(live(helper, "10.0.0.9:80")) == 1
    connect_all(helper)
    assert picked(helper, cookie="10.0.0.9:80")[0] == "10.0.0.9:80"


def test_an_owned_subchannel_unused_for_the_idle_timeout_is_closed():
    helper, _policy, update = tree(idle_timeout=60.0)
    update([locality(A, ["10.0.0.1:80"])], [locality(B, ["10.0.0.9:80"])])
    connect_all(helper)
    pick(helper, cookie="10.0.0.9:80")
    helper.clock.advance(0)
    connect_all(helper)
    assert picked(helper, cookie="10.0.0.9:80")[0] == "10.0.0.9:80"
    helper.clock.advance(59.0)
    assert picked(helper, cookie="10.0.0.9:80")[0] == "10.0.0.9:80"  # used: timer restarts
    helper.clock.advance(59.0)
    assert len(live(helper, "10.0.0.9:80")) == 1
    helper.clock.advance(2.0)
    assert live(helper, "10.0.0.9:80") == []


def test_the_sweep_runs_at_least_five_seconds_apart():
    helper, _policy, update = tree(idle_timeout=0.5)
    update([locality(A, ["10.0.0.1:80"])], [locality(B, ["10.0.0.9:80"])])
    connect_all(helper)
    pick(helper, cookie="10.0.0.9:80")
    helper.clock.advance(0)
    helper.clock.advance(MIN_SWEEP_INTERVAL - 0.1)
    assert len(live(helper, "10.0.0.9:80")) == 1
    helper.clock.advance(0.2)
    assert live(helper, "10.0.0.9:80") == []


def test_nothing_is_armed_while_nothing_is_owned():
    """C-core arms its sweep on every update; here only an owned subchannel
    arms it (the same behaviour without a timer per cluster)."""
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80", "10.0.0.2:80"])])
    connect_all(helper)
    picked(helper, cookie="10.0.0.1:80")
    assert helper.clock.pending == []


def test_shutdown_closes_owned_subchannels():
    helper, policy, update = tree()
    update([locality(A, ["10.0.0.1:80"])], [locality(B, ["10.0.0.9:80"])])
    connect_all(helper)
    pick(helper, cookie="10.0.0.9:80")
    helper.clock.advance(0)
    policy.shutdown()
    assert [s for s in helper.subchannels if not s.shut_down] == []
    assert helper.clock.pending == []


# -- config ----------------------------------------------------------------------------------


def test_config_requires_child_policy_and_is_a_frozen_value():
    factory = registry.get("xds_override_host_experimental")
    body = {"clusterName": "c1", "childPolicy": [{"round_robin": {}}]}
    assert factory.parse_config(body) == factory.parse_config(dict(body))
    with pytest.raises(LBConfigError, match="childPolicy"):
        factory.parse_config({"clusterName": "c1"})


def test_the_same_cluster_update_twice_publishes_nothing_new():
    helper, _policy, update = tree()
    update([locality(A, ["10.0.0.1:80"])])
    connect_all(helper)
    reports = len(helper.states)
    update([locality(A, ["10.0.0.1:80"])])
    assert len(helper.states) == reports


def test_the_dump_lists_addresses_health_and_owned_subchannels():
    helper, policy, update = tree(statuses={"UNKNOWN", "HEALTHY", "DRAINING"})
    update([locality(A, ["10.0.0.1:80", ("10.0.0.2:80", "DRAINING")])])
    connect_all(helper)
    override_host = cluster_impl_of(policy).child
    dump = override_host.config_dump()
    assert dump["override_host_statuses"] == ["DRAINING", "HEALTHY", "UNKNOWN"]
    assert dump["addresses"]["10.0.0.2:80"]["health"] == "DRAINING"
    assert dump["addresses"]["10.0.0.1:80"]["state"] == "READY"
