"""channel.config_dump()'s LB tree walk (src/pyxds/channel/dump.py)."""

import json

from pyxds.channel.dump import dump_policy
from pyxds.lb import ConnectivityState, Endpoint, ResolverUpdate, registry
from pyxds.lb.child_handler import ChildPolicyHandler
from pyxds.testing import FakeHelper


def _contains_truncation(node: object) -> bool:
    return '"truncated"' in json.dumps(node, default=str)


def test_tree_walk_does_not_climb_back_up_through_delegating_helpers():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    config = registry.select_policy(
        [
            {
                "weighted_target_experimental": {
                    "targets": {"l1": {"weight": 1, "childPolicy": [{"round_robin": {}}]}}
                }
            }
        ]
    )
    endpoint = Endpoint(("10.0.0.1:80",), {"hierarchical_path": ("l1",)})
    handler.update(ResolverUpdate([endpoint], config))
    for subchannel in helper.subchannels:
        subchannel.set_state(ConnectivityState.READY)

    dump = dump_policy(handler)

    assert not _contains_truncation(dump)
    leaf = dump["children"]["l1"]
    assert leaf["policy"] == "round_robin"
    (endpoint_dump,) = leaf["children"].values()
    assert endpoint_dump["state"] == "READY" and "children" not in endpoint_dump


def test_endpoint_children_are_named_by_their_addresses_not_a_frozenset_repr():
    helper = FakeHelper()
    handler = ChildPolicyHandler(helper)
    config = registry.select_policy([{"round_robin": {}}])
    endpoints = [Endpoint(("10.0.0.1:443",)), Endpoint(("[::1]:443", "10.0.0.2:443"))]
    handler.update(ResolverUpdate(endpoints, config))

    dump = dump_policy(handler)

    assert sorted(dump["children"]) == ["10.0.0.1:443", "10.0.0.2:443, [::1]:443"]
    assert "frozenset" not in json.dumps(dump, default=str)
