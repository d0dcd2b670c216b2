"""EDS validation (A27 "ClusterLoadAssignment Proto", A61 additional addresses) and the
normalisation that keeps weight-0 localities, gaps and unhealthy endpoints away from the
LB policies (TRAPS.md "weighted_target and EDS shaping")."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from pyxds.xds.resources import (
    ENDPOINTS,
    ClusterLoadAssignment,
    DropOverload,
    EndpointAddress,
    LocalityName,
)

HEALTHY = health_check_pb2.HEALTHY
UNKNOWN = health_check_pb2.UNKNOWN
UNHEALTHY = health_check_pb2.UNHEALTHY
DRAINING = health_check_pb2.DRAINING


def cla_with(*localities) -> endpoint_pb2.ClusterLoadAssignment:
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name="eds")
    for loc in localities:
        cla.endpoints.append(loc)
    return cla


def locality(
    zone="z1", weight=1, priority=0, addrs=(("10.0.0.1", 80),), health=None, region="r"
) -> endpoint_components_pb2.LocalityLbEndpoints:
    loc = endpoint_components_pb2.LocalityLbEndpoints(priority=priority)
    loc.locality.region = region
    loc.locality.zone = zone
    if weight is not None:
        loc.load_balancing_weight.value = weight
    for i, (host, port) in enumerate(addrs):
        lbe = loc.lb_endpoints.add()
        sa = lbe.endpoint.address.socket_address
        sa.address = host
        if port is not None:
            sa.port_value = port
        if health is not None:
            lbe.health_status = health[i] if isinstance(health, tuple) else health
    return loc


def decode_ok(cla) -> ClusterLoadAssignment:
    result = ENDPOINTS.decode(cla.SerializeToString())
    assert result.error is None, result.error
    assert result.name == "eds"
    return result.resource


def decode_err(cla) -> str:
    result = ENDPOINTS.decode(cla.SerializeToString())
    assert result.resource is None and result.name == "eds"
    return result.error


def test_basic_assignment():
    got = decode_ok(cla_with(locality(addrs=(("10.0.0.1", 80), ("10.0.0.2", 81)), weight=3)))
    assert got.cluster_name == "eds"
    (prio0,) = got.priorities
    (loc,) = prio0
    assert loc.name == LocalityName("r", "z1", "")
    assert loc.weight == 3 and loc.priority == 0
    assert [e.addresses for e in loc.endpoints] == [("10.0.0.1:80",), ("10.0.0.2:81",)]
    assert all(e.weight == 1 and e.health_status == "UNKNOWN" for e in loc.endpoints)
    assert got.excluded_endpoints == 0 and got.endpoint_count == 2


def test_ipv6_addresses_are_bracketed():
    got = decode_ok(cla_with(locality(addrs=(("2001:db8::1", 443),))))
    assert got.priorities[0][0].endpoints[0].addresses == ("[2001:db8::1]:443",)


def test_empty_assignment_is_valid_with_no_priorities():
    got = decode_ok(cla_with())
    assert got.priorities == () and got.endpoint_count == 0 and not got.all_endpoints_unhealthy


# ---------------------------------------------------------------- locality weights and priorities


def test_locality_without_weight_is_dropped():
    got = decode_ok(cla_with(locality("a", weight=None), locality("b", weight=2)))
    assert [loc.name.zone for loc in got.priorities[0]] == ["b"]
    assert got.ignored_localities == (LocalityName("r", "a", ""),)


def test_locality_with_weight_zero_is_dropped():
    got = decode_ok(cla_with(locality("a", weight=0), locality("b", weight=2)))
    assert [loc.name.zone for loc in got.priorities[0]] == ["b"]
    assert got.ignored_localities == (LocalityName("r", "a", ""),)


def test_only_localities_without_weight_leave_no_endpoints_and_say_why():
    # The docs example that failed a quarter of its RPCs (issue 22): valid, ACKed, empty.
    got = decode_ok(cla_with(locality("a", weight=None)))
    assert got.priorities == () and got.endpoint_count == 0
    assert got.no_endpoints_reason == "locality without weight ignored"
    got = decode_ok(cla_with(locality("a", weight=None), locality("b", weight=0, addrs=())))
    assert got.no_endpoints_reason == "2 localities without weight ignored"


@pytest.mark.parametrize(
    ("localities", "reason"),
    [
        ((), "no localities"),
        ((dict(addrs=()),), "locality without endpoints"),
        ((dict(addrs=()), dict(zone="b", addrs=())), "2 localities without endpoints"),
        ((dict(health=UNHEALTHY),), "all endpoints unhealthy"),
        (
            (dict(zone="x", weight=None), dict(health=DRAINING)),
            "locality without weight ignored; all endpoints unhealthy",
        ),
    ],
)
def test_no_endpoints_reason_names_every_cause(localities, reason):
    got = decode_ok(cla_with(*(locality(**kw) for kw in localities)))
    assert got.endpoint_count == 0 and got.no_endpoints_reason == reason


def test_priorities_grouped_and_ordered():
    got = decode_ok(
        cla_with(
            locality("p1a", priority=1, addrs=(("10.0.0.1", 1),)),
            locality("p0a", priority=0, addrs=(("10.0.0.2", 1),)),
            locality("p1b", priority=1, addrs=(("10.0.0.3", 1),)),
        )
    )
    assert [[loc.name.zone for loc in p] for p in got.priorities] == [["p0a"], ["p1a", "p1b"]]
    assert [loc.priority for loc in got.priorities[1]] == [1, 1]


def test_priority_gap_is_rejected():
    err = decode_err(
        cla_with(locality("a", priority=0), locality("b", priority=2, addrs=(("10.0.0.9", 1),)))
    )
    assert "endpoints: priority 1 empty" in err


def test_priority_gap_from_dropped_locality_is_rejected():
    err = decode_err(
        cla_with(
            locality("a", priority=0),
            locality("b", priority=1, weight=0, addrs=(("10.0.0.8", 1),)),
            locality("c", priority=2, addrs=(("10.0.0.9", 1),)),
        )
    )
    assert "priority 1 empty" in err


def test_same_locality_twice_in_one_priority_is_rejected():
    err = decode_err(cla_with(locality("a"), locality("a", addrs=(("10.0.0.2", 1),))))
    assert "endpoints[1]: duplicate locality" in err and "in priority 0" in err


def test_same_locality_in_two_priorities_is_allowed():
    got = decode_ok(cla_with(locality("a"), locality("a", priority=1, addrs=(("10.0.0.2", 1),))))
    assert got.priorities[0][0].name == got.priorities[1][0].name


def test_locality_weight_sum_over_uint32_is_rejected():
    err = decode_err(
        cla_with(
            locality("a", weight=0xFFFFFFFF),
            locality("b", weight=1, addrs=(("10.0.0.2", 1),)),
        )
    )
    assert "sum of locality weights for priority 0" in err and "exceeds uint32 max" in err


def test_locality_with_no_endpoints_is_kept():
    got = decode_ok(cla_with(locality("a", addrs=()), locality("b", addrs=(("10.0.0.2", 1),))))
    assert [len(loc.endpoints) for loc in got.priorities[0]] == [0, 1]


# ---------------------------------------------------------------- endpoints


@pytest.mark.parametrize("health", [UNHEALTHY, health_check_pb2.TIMEOUT, 5])
def test_unhealthy_endpoints_are_excluded_and_counted(health):
    got = decode_ok(
        cla_with(locality(addrs=(("10.0.0.1", 1), ("10.0.0.2", 1)), health=(HEALTHY, health)))
    )
    eps = got.priorities[0][0].endpoints
    assert [e.addresses for e in eps] == [("10.0.0.1:1",)]
    assert eps[0].health_status == "HEALTHY"
    assert got.excluded_endpoints == 1 and not got.all_endpoints_unhealthy


def test_draining_endpoints_are_kept_with_their_status_but_not_usable():
    """A55: the XdsClient keeps DRAINING endpoints (for the sessions pinned
    to them) with their health status; they are not usable endpoints."""
    got = decode_ok(
        cla_with(locality(addrs=(("10.0.0.1", 1), ("10.0.0.2", 1)), health=(HEALTHY, DRAINING)))
    )
    eps = got.priorities[0][0].endpoints
    assert [(e.addresses, e.health_status, e.usable) for e in eps] == [
        (("10.0.0.1:1",), "HEALTHY", True),
        (("10.0.0.2:1",), "DRAINING", False),
    ]
    assert got.excluded_endpoints == 0 and got.endpoint_count == 1 and got.draining_count == 1
    assert not got.all_endpoints_unhealthy


def test_all_endpoints_unhealthy_is_valid_and_says_so():
    got = decode_ok(cla_with(locality(addrs=(("10.0.0.1", 1), ("10.0.0.2", 1)), health=UNHEALTHY)))
    assert got.endpoint_count == 0 and got.excluded_endpoints == 2
    assert got.all_endpoints_unhealthy


def test_only_draining_endpoints_count_as_all_unhealthy():
    got = decode_ok(cla_with(locality(addrs=(("10.0.0.1", 1), ("10.0.0.2", 1)), health=DRAINING)))
    assert got.endpoint_count == 0 and got.draining_count == 2 and got.excluded_endpoints == 0
    assert got.all_endpoints_unhealthy


def test_endpoint_weight_default_and_explicit():
    loc = locality(addrs=(("10.0.0.1", 1), ("10.0.0.2", 1)))
    loc.lb_endpoints[1].load_balancing_weight.value = 7
    eps = decode_ok(cla_with(loc)).priorities[0][0].endpoints
    assert [e.weight for e in eps] == [1, 7]


def test_endpoint_weight_zero_is_rejected():
    loc = locality()
    loc.lb_endpoints[0].load_balancing_weight.value = 0
    err = decode_err(cla_with(loc))
    assert "endpoints[0].lb_endpoints[0].load_balancing_weight: must be greater than 0" in err


@pytest.mark.parametrize("host", ["backend.example.com", "10.0.0", "1.2.3.4.5", "::g"])
def test_non_ip_address_is_rejected(host):
    err = decode_err(cla_with(locality(addrs=(("10.0.0.1", 1), (host, 80)))))
    assert "endpoints[0].lb_endpoints[1].endpoint.address.socket_address: " in err
    assert "Failed to parse address:" in err


def test_missing_port_is_port_zero_as_in_c_core():
    """C-core ParseXdsAddress reads an unset port_value as 0 (no error)."""
    got = decode_ok(cla_with(locality(addrs=(("10.0.0.1", None),))))
    assert got.priorities[0][0].endpoints[0].addresses == ("10.0.0.1:0",)


def test_port_out_of_range_is_rejected():
    err = decode_err(cla_with(locality(addrs=(("10.0.0.1", 70000),))))
    assert "socket_address.port_value: invalid port" in err


def test_missing_endpoint_address_and_socket_address_are_rejected():
    loc = locality(addrs=())
    loc.lb_endpoints.add()  # no endpoint
    loc.lb_endpoints.add().endpoint.SetInParent()  # no address
    loc.lb_endpoints.add().endpoint.address.pipe.path = "/p"  # no socket_address
    err = decode_err(cla_with(loc))
    assert "endpoints[0].lb_endpoints[0].endpoint: field not present" in err
    assert "endpoints[0].lb_endpoints[1].endpoint.address: field not present" in err
    assert "endpoints[0].lb_endpoints[2].endpoint.address.socket_address: field not present" in err


def test_duplicate_address_in_cluster_is_rejected():
    err = decode_err(cla_with(locality("a"), locality("b", priority=1, addrs=(("10.0.0.1", 80),))))
    assert 'endpoints[1].lb_endpoints[0]: duplicate endpoint address "10.0.0.1:80"' in err


def test_additional_addresses_become_extra_addresses():
    loc = locality(addrs=(("10.0.0.1", 80),))
    extra = loc.lb_endpoints[0].endpoint.additional_addresses.add()
    extra.address.socket_address.address = "2001:db8::1"
    extra.address.socket_address.port_value = 80
    ep = decode_ok(cla_with(loc)).priorities[0][0].endpoints[0]
    assert ep.addresses == ("10.0.0.1:80", "[2001:db8::1]:80")


def test_additional_address_invalid_is_rejected():
    loc = locality()
    loc.lb_endpoints[0].endpoint.additional_addresses.add()  # no address
    bad = loc.lb_endpoints[0].endpoint.additional_addresses.add()
    bad.address.socket_address.address = "not-an-ip"
    bad.address.socket_address.port_value = 1
    err = decode_err(cla_with(loc))
    assert "endpoint.additional_addresses[0].address: field not present" in err
    assert "endpoint.additional_addresses[1].address.socket_address: Failed to parse" in err


# ---------------------------------------------------------------- drops


@pytest.mark.parametrize(
    ("den", "num", "ppm"),
    [(0, 5, 50_000), (1, 5, 500), (2, 5, 5), (0, 150, 1_000_000), (2, 2_000_000, 1_000_000)],
)
def test_drop_overloads_converted_to_parts_per_million(den, num, ppm):
    cla = cla_with(locality())
    d = cla.policy.drop_overloads.add(category="lb")
    d.drop_percentage.numerator = num
    d.drop_percentage.denominator = den
    assert decode_ok(cla).drop_overloads == (DropOverload("lb", ppm),)


def test_drop_overload_empty_category_and_missing_percentage_are_rejected():
    cla = cla_with(locality())
    cla.policy.drop_overloads.add(category="")
    err = decode_err(cla)
    assert "policy.drop_overloads[0].category: empty drop category name" in err
    assert "policy.drop_overloads[0].drop_percentage: field not present" in err


def test_locality_field_missing_is_rejected():
    loc = locality()
    loc.ClearField("locality")
    assert "endpoints[0].locality: field not present" in decode_err(cla_with(loc))


def test_endpoint_hostname_is_kept():
    loc = locality()
    loc.lb_endpoints[0].endpoint.hostname = "backend-0.example.com"
    ep = decode_ok(cla_with(loc)).priorities[0][0].endpoints[0]
    assert ep.hostname == "backend-0.example.com"


def test_every_priority_gap_is_reported():
    err = decode_err(
        cla_with(locality("a", priority=1), locality("b", priority=3, addrs=(("10.0.0.9", 1),)))
    )
    assert "priority 0 empty" in err and "priority 2 empty" in err


def test_drop_overload_unknown_denominator_is_rejected():
    cla = cla_with(locality())
    d = cla.policy.drop_overloads.add(category="lb")
    d.drop_percentage.numerator = 1
    d.drop_percentage.denominator = 9
    assert "policy.drop_overloads[0].drop_percentage.denominator" in decode_err(cla)


# ---------------------------------------------------------------- values


def test_same_bytes_decode_to_equal_hashable_values():
    cla = cla_with(
        locality("a", addrs=(("10.0.0.1", 1), ("10.0.0.2", 1)), health=(HEALTHY, DRAINING)),
        locality("b", priority=1, addrs=(("::1", 2),)),
    )
    cla.policy.drop_overloads.add(category="x").drop_percentage.numerator = 1
    data = cla.SerializeToString()
    a, b = ENDPOINTS.decode(data).resource, ENDPOINTS.decode(data).resource
    assert a == b and hash(a) == hash(b) and a is not b


def test_endpoint_address_fast_construction_equals_normal_construction():
    ep = decode_ok(cla_with(locality())).priorities[0][0].endpoints[0]
    assert ep == EndpointAddress(("10.0.0.1:80",), 1, "UNKNOWN")
    assert hash(ep) == hash(EndpointAddress(("10.0.0.1:80",), 1, "UNKNOWN"))


def test_unparseable_bytes():
    result = ENDPOINTS.decode(b"\x0a\x05ab")
    assert result.name is None and "could not parse" in result.error


def big_assignment() -> bytes:
    cla = cla_with(
        *(
            locality(f"z{z}", addrs=tuple((f"10.1.{z}.{i}", 80) for i in range(200)))
            for z in range(4)
        )
    )
    return cla.SerializeToString()


def test_big_resource_resent_is_answered_from_the_memo():
    from pyxds.xds.resources import MEMO_MIN_BYTES

    data = big_assignment()
    assert len(data) >= MEMO_MIN_BYTES
    ENDPOINTS.clear_memo()
    first = ENDPOINTS.decode(data)
    again = ENDPOINTS.decode(bytes(bytearray(data)))  # equal bytes, new object
    assert again is first
    fresh = ENDPOINTS.decode(data, use_memo=False)
    assert fresh is not first and fresh == first


def test_small_resources_are_not_memoised():
    data = cla_with(locality()).SerializeToString()
    assert ENDPOINTS.decode(data) is not ENDPOINTS.decode(data)


def test_memo_is_bounded(monkeypatch):
    from pyxds.xds import resources

    monkeypatch.setattr(resources, "MEMO_MIN_BYTES", 1)
    monkeypatch.setattr(resources, "MEMO_MAX_ENTRIES", 3)
    ENDPOINTS.clear_memo()
    cla = cla_with(locality())
    results = []
    for i in range(5):
        cla.cluster_name = f"eds-{i}"
        results.append(ENDPOINTS.decode(cla.SerializeToString()))
    assert len(ENDPOINTS._memo) == 3
    cla.cluster_name = "eds-4"
    assert ENDPOINTS.decode(cla.SerializeToString()) is results[4]  # newest kept
    cla.cluster_name = "eds-0"
    assert ENDPOINTS.decode(cla.SerializeToString()) is not results[0]  # oldest evicted
    ENDPOINTS.clear_memo()


# ---------------------------------------------------------------- locality memo


def big_locality(zone: str, base: int, n: int = 20, priority: int = 0, health=None):
    return locality(
        zone,
        priority=priority,
        addrs=tuple((f"10.{base}.0.{i}", 80) for i in range(n)),
        health=health,
    )


def test_unchanged_locality_is_reused_across_updates():
    from pyxds.xds.resources import endpoints as eds_module

    ENDPOINTS.clear_memo()
    first = decode_ok(cla_with(big_locality("a", 1), big_locality("b", 2)))
    assert len(eds_module._locality_memo) == 2
    second = decode_ok(cla_with(big_locality("a", 1), big_locality("b", 3)))
    assert second.priorities[0][0] is first.priorities[0][0]  # reused
    assert second.priorities[0][1] != first.priorities[0][1]  # changed one re-validated
    ENDPOINTS.clear_memo()


def test_reused_locality_colliding_with_another_is_still_an_error():
    ENDPOINTS.clear_memo()
    decode_ok(cla_with(big_locality("a", 1)))
    # "b" reuses an address of the remembered "a": the error must name the endpoint
    dup = big_locality("b", 2)
    dup.lb_endpoints[5].endpoint.address.socket_address.address = "10.1.0.7"
    err = decode_err(cla_with(dup, big_locality("a", 1)))
    assert 'endpoints[1].lb_endpoints[7]: duplicate endpoint address "10.1.0.7:80"' in err
    ENDPOINTS.clear_memo()


def test_draining_endpoints_of_a_reused_locality_still_count_for_duplicates():
    ENDPOINTS.clear_memo()
    health = tuple(DRAINING if i == 3 else HEALTHY for i in range(20))
    a = big_locality("a", 1, health=health)
    first = decode_ok(cla_with(a))
    assert first.draining_count == 1
    again = decode_ok(cla_with(a))
    assert again.draining_count == 1 and again == first
    clash = locality("b", addrs=(("10.1.0.3", 80),))
    err = decode_err(cla_with(a, clash))
    assert 'duplicate endpoint address "10.1.0.3:80"' in err
    ENDPOINTS.clear_memo()


def test_locality_memo_is_bounded_by_bytes(monkeypatch):
    from pyxds.xds.resources import endpoints as eds_module

    ENDPOINTS.clear_memo()
    monkeypatch.setattr(eds_module, "LOCALITY_MEMO_MAX_BYTES", 1500)
    for i in range(10):
        decode_ok(cla_with(big_locality("a", i)))
    assert 0 < eds_module._locality_memo_size <= 1500
    assert eds_module._locality_memo_size == sum(len(k) for k in eds_module._locality_memo)
    ENDPOINTS.clear_memo()


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.lists(
            st.tuples(
                st.integers(0, 3),  # zone
                st.integers(0, 4),  # address block (collisions when equal)
                st.integers(0, 1),  # priority
                st.sampled_from([HEALTHY, UNKNOWN, DRAINING]),
            ),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_memo_never_changes_the_result(steps):
    ENDPOINTS.clear_memo()
    for update in steps:
        cla = cla_with(
            *(
                big_locality(f"z{zone}", block, n=16, priority=prio, health=health)
                for zone, block, prio, health in update
            )
        )
        data = cla.SerializeToString()
        with_memo = ENDPOINTS.decode(data)
        without = ENDPOINTS.decode(data, use_memo=False)
        assert with_memo == without
    ENDPOINTS.clear_memo()
