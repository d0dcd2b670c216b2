"""An EDS update that changes one locality reuses everything of the others
(issue 18 item 4): the same round_robin policies, pick_first children and
subchannels (identity, nothing recreated), the same Endpoint objects down
the tree (hierarchy.split keeps each endpoint's stripped form), while the
update still applies as one piece (A74) and a changed endpoint's
attributes (weight, health status, hash key, host name) reach the policy.
Real cds tree on a FakeHelper, as tests/unit/test_cds.py."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any

import grpc
import pytest
from test_cds_support import (
    READY,
    _unwrap,
    build,
    cds_update,
    connect_all,
    eds_cluster,
    eds_entry,
    loc,
    locality,
    xds_config,
)

from pyxds.lb import (
    ConnectivityState,
    Endpoint,
    LoadBalancer,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.cds import HASH_KEY_BACKWARD_COMPAT_ENV
from pyxds.lb.hierarchy import PATH_KEY, split
from pyxds.lb.round_robin import RoundRobin
from pyxds.testing import FakeHelper
from pyxds.xds.resources.types import EndpointAddress, Locality

A, B, C = loc("a"), loc("b"), loc("c")


def cds(helper: FakeHelper | None = None) -> tuple[FakeHelper, LoadBalancer, Any]:
    return build([{"cds_experimental": {"cluster": "c1"}}], helper)


def round_robins(policy: Any) -> dict[str, RoundRobin]:
    """Every round_robin policy below ``policy``, by its weighted_target
    child name (the locality)."""
    found: dict[str, RoundRobin] = {}

    def walk(lb: Any, name: str) -> None:
        if lb is None:
            return
        if isinstance(lb, RoundRobin):
            found[name] = lb
            return
        children = getattr(lb, "children", None)
        if isinstance(children, Mapping):
            for child_name, child in children.items():
                walk(_unwrap(child), child_name)
        elif hasattr(lb, "child"):
            walk(lb.child, name)

    walk(policy, "")
    return found


def three_localities(b_addresses: tuple[str, ...] = ("10.0.0.3:80", "10.0.0.4:80")) -> Any:
    return eds_entry(
        "c1",
        [
            locality(A, ["10.0.0.1:80", "10.0.0.2:80"], weight=2),
            locality(B, list(b_addresses), weight=3),
            locality(C, ["10.0.0.5:80"]),
        ],
    )


def test_an_unchanged_locality_keeps_its_policy_children_subchannels_and_endpoints():
    helper, policy, config = cds()
    policy.update(cds_update(config, xds_config({"c1": three_localities()})))
    connect_all(helper)
    before = round_robins(policy)
    assert set(before) == {str(A), str(B), str(C)}
    children = {name: list(rr.children) for name, rr in before.items()}
    endpoints = {name: rr._last_list for name, rr in before.items()}
    subchannels = {s.address: s for s in helper.live_subchannels()}
    created = len(helper.subchannels)

    # Locality b's endpoints replaced, in a new XdsConfig (new objects for
    # everything the xDS client made anew: a new Locality for b only, as its
    # locality memo does).
    policy.update(
        cds_update(config, xds_config({"c1": three_localities(("10.0.0.6:80", "10.0.0.7:80"))}))
    )
    after = round_robins(policy)
    for name in (str(A), str(C)):
        assert after[name] is before[name]
        assert list(after[name].children) == children[name]
        assert all(
            new is old for new, old in zip(after[name].children, children[name], strict=True)
        )
        # the very same Endpoint objects reached it (the update was a no-op there)
        assert after[name]._last_list is not None and endpoints[name] is not None
        assert all(
            new is old for new, old in zip(after[name]._last_list, endpoints[name], strict=True)
        )
    for address in ("10.0.0.1:80", "10.0.0.2:80", "10.0.0.5:80"):
        assert helper.subchannel(address) is subchannels[address]
        assert not subchannels[address].shut_down
    assert [s.address for s in helper.subchannels[created:]] == ["10.0.0.6:80", "10.0.0.7:80"]
    # A74: the update applied as one piece: b's new endpoints are in place,
    # and the picker (once they connect) spreads over all three localities.
    connect_all(helper)
    assert helper.state is READY
    assert not any(
        s.shut_down for s in helper.subchannels if s.address in ("10.0.0.6:80", "10.0.0.7:80")
    )


def test_the_same_update_twice_builds_no_endpoint_below_cds():
    helper, policy, config = cds()
    policy.update(cds_update(config, xds_config({"c1": three_localities()})))
    connect_all(helper)
    gc.collect()
    made = sum(1 for obj in gc.get_objects() if type(obj) is Endpoint)
    # an equal XdsConfig of new objects; the ClusterConfig is equal, so cds
    # stops there; a new Locality for b with equal content goes further
    entry = three_localities()
    policy.update(cds_update(config, xds_config({"c1": entry})))
    b_changed = eds_entry(
        "c1",
        [
            entry.children.endpoints.priorities[0][0],
            locality(B, ["10.0.0.3:80", "10.0.0.4:80"], weight=4),  # b's weight only
            entry.children.endpoints.priorities[0][2],
        ],
    )
    policy.update(cds_update(config, xds_config({"c1": b_changed})))
    gc.collect()
    # b's two endpoints are rebuilt at each of the three levels (cds, priority,
    # weighted_target) and the old ones are gone: the count is unchanged
    assert sum(1 for obj in gc.get_objects() if type(obj) is Endpoint) == made


def test_split_hands_back_the_same_stripped_endpoint_for_the_same_input():
    endpoint = Endpoint(("10.0.0.1:80",), {PATH_KEY: ("p0", "a"), "weight": 3})
    first = split([endpoint])
    second = split((endpoint,))
    assert first == {"p0": [Endpoint(("10.0.0.1:80",), {PATH_KEY: ("a",), "weight": 3})]}
    assert second["p0"][0] is first["p0"][0]
    # an equal endpoint that is another object is split afresh (equal value)
    other = split([Endpoint(("10.0.0.1:80",), {PATH_KEY: ("p0", "a"), "weight": 3})])
    assert other == first and other["p0"][0] is not first["p0"][0]
    # the cache is not part of the value
    assert endpoint == Endpoint(("10.0.0.1:80",), {PATH_KEY: ("p0", "a"), "weight": 3})
    assert "_below" not in repr(endpoint)
    assert hash(endpoint) == hash(Endpoint(("10.0.0.1:80",)))


# -- a changed endpoint's attributes reach the policy ---------------------------


class _Recorder(LoadBalancer):
    seen: list[tuple[Endpoint, ...]] = []

    def __init__(self, helper: Any) -> None:
        self.helper = helper

    def update(self, update: ResolverUpdate) -> Status | None:
        assert not isinstance(update.endpoints, Status)
        _Recorder.seen.append(tuple(update.endpoints))
        self.helper.update_state(
            ConnectivityState.CONNECTING, Status(grpc.StatusCode.OK), QueuePicker()
        )
        return None

    def resolver_error(self, status: Status) -> None: ...
    def exit_idle(self) -> None: ...
    def reset_backoff(self) -> None: ...
    def shutdown(self) -> None: ...


class _RecorderFactory(PolicyFactory):
    name = "test.reuse_recorder"

    def parse_config(self, json_config: Any) -> str:
        return "recorder"

    def build(self, helper: Any) -> _Recorder:
        return _Recorder(helper)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(HASH_KEY_BACKWARD_COMPAT_ENV, "false")
    _Recorder.seen = []
    registry.register(_RecorderFactory())
    try:
        yield _Recorder.seen
    finally:
        registry.unregister("test.reuse_recorder")


def _entry(b_endpoint: EndpointAddress) -> Any:
    cluster = eds_cluster(
        "c1",
        lb_policy_config='[{"xds_wrr_locality_experimental": {"childPolicy": '
        '[{"test.reuse_recorder": {}}]}}]',
    )
    return eds_entry(
        cluster,
        [
            locality(A, ["10.0.0.1:80"]),
            Locality(B, 2, (EndpointAddress(("10.0.0.3:80",)), b_endpoint)),
        ],
    )


@pytest.mark.parametrize(
    ("changed", "attribute", "value"),
    [
        (EndpointAddress(("10.0.0.4:80",), weight=7), "weight", 14),
        (EndpointAddress(("10.0.0.4:80",), health_status="HEALTHY"), "health_status", "HEALTHY"),
        (EndpointAddress(("10.0.0.4:80",), hash_key="k2"), "hash_key", "k2"),
        (EndpointAddress(("10.0.0.4:80",), hostname="b4.example"), "address_name", "b4.example"),
    ],
)
def test_a_changed_endpoint_attribute_reaches_the_policy_and_the_rest_stays_the_same_objects(
    recorder: list[tuple[Endpoint, ...]], changed: EndpointAddress, attribute: str, value: object
):
    _helper, policy, config = cds()
    policy.update(cds_update(config, xds_config({"c1": _entry(EndpointAddress(("10.0.0.4:80",)))})))
    by_path = {e.attributes[PATH_KEY]: e for es in recorder for e in es}
    first = {e.addresses[0]: e for es in recorder for e in es}
    assert first["10.0.0.4:80"].attributes.get(attribute) != value
    recorder.clear()
    policy.update(cds_update(config, xds_config({"c1": _entry(changed)})))
    latest = {e.addresses[0]: e for es in recorder for e in es}
    assert latest["10.0.0.4:80"].attributes[attribute] == value
    # the unchanged endpoints are the same objects as before (a's locality
    # and b's other endpoint)
    assert latest["10.0.0.1:80"] is first["10.0.0.1:80"]
    assert latest["10.0.0.3:80"] is first["10.0.0.3:80"]
    assert by_path  # the recorder saw the stripped paths (one element left)
    assert all(len(path) == 0 for path in by_path)


def test_stripped_attributes_read_as_the_level_above_with_the_shorter_path():
    endpoint = Endpoint(("10.0.0.1:80",), {PATH_KEY: ("p0", "a", "x"), "weight": 3})
    (one,) = split([endpoint])["p0"]
    (two,) = split([one])["a"]
    for level, path in ((one, ("a", "x")), (two, ("x",))):
        attributes = level.attributes
        assert attributes[PATH_KEY] == path and attributes.get(PATH_KEY) == path
        assert attributes["weight"] == 3 and attributes.get("weight") == 3
        assert attributes.get("missing", "d") == "d" and "missing" not in attributes
        assert PATH_KEY in attributes and len(attributes) == 2
        assert dict(attributes) == {PATH_KEY: path, "weight": 3}
        assert level == Endpoint(("10.0.0.1:80",), {PATH_KEY: path, "weight": 3})
        with pytest.raises(KeyError):
            attributes["missing"]
    # the second level reads the first level's own mapping, not a view of a view
    assert two.attributes._base is endpoint.attributes
    # what a policy may do with them: copy, merge, rebuild an Endpoint
    assert two.with_attributes(weight=4).attributes == {PATH_KEY: ("x",), "weight": 4}
