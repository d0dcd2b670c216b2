"""xds_routing_experimental and the RouteConfiguration converter (A28)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import grpc
import pytest

from pyxds.lb import registry
from pyxds.lb.api import (
    ConnectivityState,
    LoadBalancer,
    PickArgs,
    PickComplete,
    Picker,
    PickFail,
    PickQueue,
    PolicyFactory,
    ResolverUpdate,
    Status,
)
from pyxds.lb.errors import LBConfigError
from pyxds.lb.xds_routing import NO_ROUTE_MESSAGE, XdsRoutingFactory
from pyxds.resolver.route_to_service_config import RouteConfigConverter
from pyxds.testing import FakeHelper, FakeSubchannel
from pyxds.testing.fake_xds_client import make_route
from pyxds.xds.resources.types import HeaderMatcher

# ------------------------------------------------------------- stand-in policies


@dataclass(frozen=True)
class _Cfg:
    text: str


class _Leaf(LoadBalancer):
    """Reports READY with a picker naming its config; counts updates."""

    instances: list[_Leaf] = []

    def __init__(self, helper) -> None:
        self.helper = helper
        self.updates: list[ResolverUpdate] = []
        self.shut_down = False
        _Leaf.instances.append(self)

    def update(self, update):
        self.updates.append(update)
        name = update.config.text
        if "silent" in name:
            return None
        subchannel = FakeSubchannel(name)

        class _P(Picker):
            def pick(self, args):
                return PickComplete(subchannel)

        state = ConnectivityState.CONNECTING if "slow" in name else ConnectivityState.READY
        self.helper.update_state(state, Status(grpc.StatusCode.OK), _P())
        return None

    def resolver_error(self, status):
        pass

    def exit_idle(self):
        pass

    def reset_backoff(self):
        pass

    def shutdown(self):
        self.shut_down = True


class _StandIn(PolicyFactory):
    def __init__(self, name: str) -> None:
        self.name = name

    def parse_config(self, json_config):
        if not isinstance(json_config, dict):
            raise LBConfigError("", "expected object")
        return _Cfg(json.dumps(json_config, sort_keys=True))

    def build(self, helper):
        return _Leaf(helper)


STAND_INS = ("cds_experimental", "weighted_target_experimental")


@pytest.fixture(autouse=True)
def stand_ins():
    registry._load_builtins()
    saved = {n: registry._factories.get(n) for n in STAND_INS}
    for n in STAND_INS:
        registry.register(_StandIn(n))
    _Leaf.instances.clear()
    yield
    for n, factory in saved.items():
        if factory is None:
            registry.unregister(n)
        else:
            registry.register(factory)


# ------------------------------------------------------------- the A28 appendix

APPENDIX_ROUTES = [
    make_route(path="/service_1/method_1", cluster="cluster_1", name="URL_MAP/1"),
    make_route(path="/service_1/method_2", cluster="cluster_1", name="URL_MAP/2"),
    # The gRFC's input says "/service_2/method_2" and its output
    # "/service_2/method_1" (a typo); we use the output's value for both.
    make_route(
        "/service_2/method_1", weighted=[("cluster_1", 75), ("cluster_2", 25)], name="URL_MAP/3"
    ),
    make_route("/service_2", weighted=[("cluster_1", 75), ("cluster_2", 25)], name="URL_MAP/4"),
    make_route(
        regex="^/service_2/method_3$",
        weighted=[("cluster_1", 99), ("cluster_3", 1)],
        name="URL_MAP/5",
    ),
]

# Verbatim from A28's appendix (keys "Action"/"Route" as the gRFC spells them).
APPENDIX_JSON = """
{
  "loadBalancingConfig":[{
    "xds_routing_experimental":{
      "Action":{
        "cds:cluster_1":{
          "childPolicy":[{
            "cds_experimental":{"cluster":"cluster_1"}
          }]
        },
        "weighted:cluster_1_cluster_2_1":{
          "childPolicy":[{
            "weighted_target_experimental":{
              "targets": {
                "cluster_1" : {
                  "weight":75,
                  "childPolicy":[{"cds_experimental":{"cluster":"cluster_1"}}]
                },
                "cluster_2" : {
                  "weight":25,
                  "childPolicy":[{"cds_experimental":{"cluster":"cluster_2"}}]
                }
              }
            }
          }]
        },
        "weighted:cluster_1_cluster_3_1":{
          "childPolicy":[{
            "weighted_target_experimental":{
              "targets": {
                "cluster_1": {
                  "weight":99,
                  "childPolicy":[{"cds_experimental":{"cluster":"cluster_1"}}]
                },
                "cluster_3": {
                  "weight":1,
                  "childPolicy":[{"cds_experimental":{"cluster":"cluster_3"}}]
                }
              }
            }
          }]
        }
      },

      "Route":[{
        "path":"/service_1/method_1",
        "action":"cds:cluster_1"
      },
      {
        "path":"/service_1/method_2",
        "action":"cds:cluster_1"
      },
      {
        "prefix":"/service_2/method_1",
        "action":"weighted:cluster_1_cluster_2_1"
      },
      {
        "prefix":"/service_2",
        "action":"weighted:cluster_1_cluster_2_1"
      },
      {
        "regex":"^/service_2/method_3$",
        "action":"weighted:cluster_1_cluster_3_1"
      }]
    }
  }]
}
"""


def _lower_top_keys(service_config):
    (entry,) = service_config["loadBalancingConfig"]
    (config,) = entry.values()
    return {k.lower(): v for k, v in config.items()}


def test_a28_appendix_example_is_reproduced():
    generated = RouteConfigConverter().convert(APPENDIX_ROUTES)
    expected = json.loads(APPENDIX_JSON)
    assert list(generated["loadBalancingConfig"][0]) == ["xds_routing_experimental"]
    assert _lower_top_keys(generated) == _lower_top_keys(expected)
    # And both parse to the same (frozen, comparable) policy config.
    factory = XdsRoutingFactory()
    parsed_generated = factory.parse_config(generated["loadBalancingConfig"][0][factory.name])
    parsed_appendix = factory.parse_config(expected["loadBalancingConfig"][0][factory.name])
    assert parsed_generated == parsed_appendix


def test_weight_only_change_reuses_the_action_name():
    converter = RouteConfigConverter()
    converter.convert(APPENDIX_ROUTES)
    canary = [
        *APPENDIX_ROUTES[:2],
        make_route("/service_2", weighted=[("cluster_1", 50), ("cluster_2", 50)]),
        APPENDIX_ROUTES[4],
    ]
    config = _lower_top_keys(converter.convert(canary))
    assert config["route"][2]["action"] == "weighted:cluster_1_cluster_2_1"
    targets = config["action"]["weighted:cluster_1_cluster_2_1"]["childPolicy"][0][
        "weighted_target_experimental"
    ]["targets"]
    assert targets["cluster_1"]["weight"] == 50


def test_same_cluster_set_with_both_weightings_present_gets_a_second_name():
    converter = RouteConfigConverter()
    converter.convert(APPENDIX_ROUTES)
    both = [*APPENDIX_ROUTES, make_route("/x", weighted=[("cluster_1", 10), ("cluster_2", 90)])]
    config = _lower_top_keys(converter.convert(both))
    assert config["route"][-1]["action"] == "weighted:cluster_1_cluster_2_2"
    assert config["route"][3]["action"] == "weighted:cluster_1_cluster_2_1"


def test_different_cluster_set_does_not_take_a_removed_name():
    converter = RouteConfigConverter()
    converter.convert([make_route("", weighted=[("a", 1), ("b", 1)])])
    config = _lower_top_keys(converter.convert([make_route("", weighted=[("a", 1), ("c", 1)])]))
    assert config["route"][0]["action"] == "weighted:a_c_1"


def test_converter_emits_headers_fraction_and_ignores_unroutable_routes():
    from pyxds.xds.resources.types import FractionalPercent

    routes = [
        make_route(
            "/s/",
            cluster="c",
            headers=[HeaderMatcher("x-env", "exact", "canary", invert_match=True)],
            fraction=FractionalPercent(5, 100),
            case_sensitive=False,
        ),
        make_route("/nf/", non_forwarding=True),
    ]
    config = _lower_top_keys(RouteConfigConverter().convert(routes))
    assert config["route"] == [
        {
            "prefix": "/s/",
            "case_sensitive": False,
            "headers": [{"name": "x-env", "exact_match": "canary", "invert_match": True}],
            "match_fraction": 50000,
            "action": "cds:c",
        }
    ]


# ------------------------------------------------------------- config validation


def cds(cluster):
    return {"childPolicy": [{"cds_experimental": {"cluster": cluster}}]}


@pytest.mark.parametrize(
    ("config", "error"),
    [
        (
            {"route": [{"path": "/a/b", "prefix": "/a", "action": "x"}], "action": {"x": cds("c")}},
            "xds_routing_experimental.route[0]: exactly one of path, prefix, regex is required",
        ),
        (
            {"route": [{"action": "x"}], "action": {"x": cds("c")}},
            "xds_routing_experimental.route[0]: exactly one of path, prefix, regex",
        ),
        (
            {"route": [{"prefix": "", "action": "y"}], "action": {"x": cds("c")}},
            'xds_routing_experimental.route[0].action: action "y" is not in the action map',
        ),
        (
            {"route": [{"prefix": "", "action": "x"}], "action": {"x": cds("c"), "u": cds("d")}},
            'xds_routing_experimental.action["u"]: action is not used by any route',
        ),
        (
            {"route": [{"prefix": "", "action": "x"}], "action": {"x": {"childPolicy": []}}},
            'xds_routing_experimental.action["x"].childPolicy: no supported load balancing',
        ),
        (
            {
                "route": [{"prefix": "", "action": "x"}],
                "action": {"x": {"childPolicy": [{"no_such_policy": {}}]}},
            },
            "no supported load balancing policy in list: no_such_policy",
        ),
        (
            {"route": [{"regex": "(", "action": "x"}], "action": {"x": cds("c")}},
            "xds_routing_experimental.route[0].regex: invalid RE2 regex",
        ),
        (
            {
                "route": [
                    {
                        "prefix": "",
                        "headers": [{"name": "h", "exact_match": "a", "prefix_match": "b"}],
                        "action": "x",
                    }
                ],
                "action": {"x": cds("c")},
            },
            "xds_routing_experimental.route[0].headers[0]: exactly one of",
        ),
        (
            {
                "route": [{"prefix": "", "match_fraction": -1, "action": "x"}],
                "action": {"x": cds("c")},
            },
            "xds_routing_experimental.route[0].match_fraction: expected uint32, got -1",
        ),
        (
            {
                "route": [{"prefix": "", "action": "x"}],
                "action": {"x": {"childPolicy": [{"cds_experimental": 3}]}},
            },
            'xds_routing_experimental.action["x"].childPolicy[0].cds_experimental',
        ),
    ],
)
def test_invalid_configs_are_rejected_naming_the_field(config, error):
    with pytest.raises(LBConfigError) as info:
        registry.select([{"xds_routing_experimental": config}])
    assert error in str(info.value)


def test_duplicate_matchers_are_allowed_and_the_same_config_twice_is_equal():
    config = {
        "route": [{"prefix": "/a", "action": "x"}, {"prefix": "/a", "action": "y"}],
        "action": {"x": cds("c1"), "y": cds("c2")},
    }
    factory = XdsRoutingFactory()
    assert factory.parse_config(config) == factory.parse_config(json.loads(json.dumps(config)))


# ------------------------------------------------------------- the policy


def build(config):
    helper = FakeHelper()
    factory, parsed = registry.select([{"xds_routing_experimental": config}])
    lb = factory.build(helper)
    lb.update(ResolverUpdate((), parsed))
    return helper, lb


def picked(helper, path, metadata=()):
    result = helper.last.picker.pick(PickArgs(path, metadata))
    return result.subchannel.address if isinstance(result, PickComplete) else result


def test_first_matching_route_picks_its_action_child():
    helper, _ = build(
        {
            "route": [
                {
                    "prefix": "/svc/",
                    "headers": [{"name": "x-v", "exact_match": "2"}],
                    "action": "v2",
                },
                {"prefix": "/svc/", "action": "v1"},
                {"path": "/other/M", "action": "v2"},
            ],
            "action": {"v1": cds("one"), "v2": cds("two")},
        }
    )
    assert helper.state is ConnectivityState.READY
    assert '"one"' in picked(helper, "/svc/M")
    assert '"two"' in picked(helper, "/svc/M", [("x-v", "2")])
    assert '"two"' in picked(helper, "/other/M")
    failed = picked(helper, "/nothing/M")
    assert isinstance(failed, PickFail)
    assert failed.status == Status(grpc.StatusCode.UNAVAILABLE, NO_ROUTE_MESSAGE)


def test_child_without_a_picker_queues_and_a_connecting_child_is_still_delegated_to():
    helper, _ = build(
        {
            "route": [{"prefix": "/q/", "action": "q"}, {"prefix": "/s/", "action": "s"}],
            "action": {"q": cds("silent"), "s": cds("slow")},
        }
    )
    assert isinstance(picked(helper, "/q/m"), PickQueue)
    assert '"slow"' in picked(helper, "/s/m")
    assert helper.state is ConnectivityState.CONNECTING


def test_persisting_action_is_updated_and_removed_action_is_shut_down():
    config = {
        "route": [{"prefix": "/a/", "action": "a"}, {"prefix": "/b/", "action": "b"}],
        "action": {"a": cds("A"), "b": cds("B")},
    }
    helper, lb = build(config)
    leaf_a, leaf_b = _Leaf.instances
    factory = XdsRoutingFactory()
    lb.update(
        ResolverUpdate(
            (),
            factory.parse_config(
                {"route": [{"prefix": "", "action": "a"}], "action": {"a": cds("A2")}}
            ),
        )
    )
    assert len(_Leaf.instances) == 2, "a persisting action must not be recreated"
    assert leaf_b.shut_down and not leaf_a.shut_down
    assert len(leaf_a.updates) == 2
    assert '"A2"' in picked(helper, "/b/m")
