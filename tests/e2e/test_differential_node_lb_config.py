"""Differential: grpc-node's LB policy config parsing cases, through grpcio
1.85 and pyxds with the same ``loadBalancingConfig``.

Sources: grpc-node ``packages/grpc-js/test/test-confg-parsing.ts`` and
``packages/grpc-js-xds/test/test-confg-parsing.ts`` (every case, with C-core's
policy names), plus the neighbouring configs those cases led to (null
fields, numbers in strings, wrong field spellings, bounds).  grpcio gets the
config as ``grpc.service_config`` on a channel to a refusing address and
refuses it at channel creation ("errors validating service config", seen on
the first RPC as INVALID_ARGUMENT); pyxds gets it as ``service_config=`` and
refuses it by raising ValueError.  Accept or refuse must agree.  grpcio runs
in a subprocess so that a config C-core takes and then aborts on cannot take
the test run down; the two it aborts on are left out and noted below.
Per-case parsed values are asserted in
``tests/unit/test_conformance_node_lb_config.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from channel_fixtures import CoreXdsClient
from ports import held_ports

import pyxds._api as pyxds

RR = [{"round_robin": {}}]


def _rls(cache_size: Any, **fields: Any) -> dict[str, Any]:
    lookup = {
        "grpcKeybuilders": [{"names": [{"service": "s"}]}],
        "lookupService": "localhost:1",
        "cacheSizeBytes": cache_size,
        **fields,
    }
    return {
        "rls_experimental": {
            "routeLookupConfig": lookup,
            "childPolicy": [{"pick_first": {}}],
            "childPolicyConfigTargetFieldName": "serviceName",
        }
    }


# (case id, one loadBalancingConfig entry).  Left out: weighted_target weight
# 0 (grpcio 1.85 accepts it, then aborts: "Check failed: child->weight() > 0";
# pyxds refuses it) and a valid xds_cluster_impl config outside xDS (grpcio
# aborts in child_policy_handler).
CASES: list[tuple[str, dict[str, Any]]] = [
    # grpc-js test-confg-parsing.ts
    ("pick_first-no-fields", {"pick_first": {}}),
    ("pick_first-shuffle", {"pick_first": {"shuffleAddressList": True}}),
    ("pick_first-shuffle-string", {"pick_first": {"shuffleAddressList": "true"}}),
    ("pick_first-shuffle-null", {"pick_first": {"shuffleAddressList": None}}),
    ("pick_first-null", {"pick_first": None}),
    ("pick_first-array", {"pick_first": []}),
    ("round_robin-no-fields", {"round_robin": {}}),
    ("round_robin-unknown-field", {"round_robin": {"x": 1}}),
    ("round_robin-null", {"round_robin": None}),
    ("od-required-only", {"outlier_detection_experimental": {"childPolicy": RR}}),
    (
        "od-optional-null",
        {
            "outlier_detection_experimental": {
                "interval": None,
                "baseEjectionTime": None,
                "maxEjectionTime": None,
                "maxEjectionPercent": None,
                "successRateEjection": None,
                "failurePercentageEjection": None,
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-empty-ejection",
        {
            "outlier_detection_experimental": {
                "successRateEjection": {},
                "failurePercentageEjection": {},
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-all-fields",
        {
            "outlier_detection_experimental": {
                "interval": "20s",
                "baseEjectionTime": "40s",
                "maxEjectionTime": "400s",
                "maxEjectionPercent": 20,
                "successRateEjection": {
                    "stdevFactor": 1800,
                    "enforcementPercentage": 90,
                    "minimumHosts": 4,
                    "requestVolume": 200,
                },
                "failurePercentageEjection": {
                    "threshold": 95,
                    "enforcementPercentage": 90,
                    "minimumHosts": 4,
                    "requestVolume": 60,
                },
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-node-duration-object",
        {"outlier_detection_experimental": {"interval": {"seconds": 20}, "childPolicy": RR}},
    ),
    ("od-node-child_policy", {"outlier_detection_experimental": {"child_policy": RR}}),
    (
        "od-percent-101",
        {"outlier_detection_experimental": {"maxEjectionPercent": 101, "childPolicy": RR}},
    ),
    (
        "od-percent-string",
        {"outlier_detection_experimental": {"maxEjectionPercent": " 50", "childPolicy": RR}},
    ),
    (
        "od-percent-hex",
        {"outlier_detection_experimental": {"maxEjectionPercent": "0x10", "childPolicy": RR}},
    ),
    (
        "od-interval-negative",
        {"outlier_detection_experimental": {"interval": "-1s", "childPolicy": RR}},
    ),
    (
        "od-interval-no-unit",
        {"outlier_detection_experimental": {"interval": "10", "childPolicy": RR}},
    ),
    (
        "od-interval-10-digits",
        {"outlier_detection_experimental": {"interval": "1.0000000001s", "childPolicy": RR}},
    ),
    ("od-child-empty", {"outlier_detection_experimental": {"childPolicy": []}}),
    # grpc-js test-outlier-detection.ts "Outlier detection config validation"
    # (durations in C-core's string form) and its pick_first child case
    (
        "od-interval-1e12",
        {"outlier_detection_experimental": {"interval": "1000000000000s", "childPolicy": RR}},
    ),
    (
        "od-interval-max",
        {
            "outlier_detection_experimental": {
                "interval": "315576000000.999999999s",
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-base-negative",
        {"outlier_detection_experimental": {"baseEjectionTime": "-1s", "childPolicy": RR}},
    ),
    (
        "od-base-1e12",
        {
            "outlier_detection_experimental": {
                "baseEjectionTime": "1000000000000s",
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-max-negative",
        {"outlier_detection_experimental": {"maxEjectionTime": "-1s", "childPolicy": RR}},
    ),
    (
        "od-max-1e12",
        {
            "outlier_detection_experimental": {
                "maxEjectionTime": "1000000000000s",
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-percent-negative",
        {"outlier_detection_experimental": {"maxEjectionPercent": -1, "childPolicy": RR}},
    ),
    (
        "od-sr-enforcement-101",
        {
            "outlier_detection_experimental": {
                "successRateEjection": {"enforcementPercentage": 101},
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-sr-enforcement-negative",
        {
            "outlier_detection_experimental": {
                "successRateEjection": {"enforcementPercentage": -1},
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-fp-threshold-101",
        {
            "outlier_detection_experimental": {
                "failurePercentageEjection": {"threshold": 101},
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-fp-threshold-negative",
        {
            "outlier_detection_experimental": {
                "failurePercentageEjection": {"threshold": -1},
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-fp-enforcement-101",
        {
            "outlier_detection_experimental": {
                "failurePercentageEjection": {"enforcementPercentage": 101},
                "childPolicy": RR,
            }
        },
    ),
    (
        "od-fp-enforcement-negative",
        {
            "outlier_detection_experimental": {
                "failurePercentageEjection": {"enforcementPercentage": -1},
                "childPolicy": RR,
            }
        },
    ),
    # node refuses a pick_first child; C-core (and pyxds) take it
    (
        "od-pick_first-child",
        {"outlier_detection_experimental": {"childPolicy": [{"pick_first": {}}]}},
    ),
    # grpc-js test-weighted-round-robin.ts "Config parsing" (C-core's names)
    (
        "wrr-all-fields",
        {
            "weighted_round_robin": {
                "enableOobLoadReport": True,
                "errorUtilizationPenalty": 0.5,
                "blackoutPeriod": "1s",
                "oobReportingPeriod": "1s",
                "weightExpirationPeriod": "1s",
                "weightUpdatePeriod": "2s",
            }
        },
    ),
    ("wrr-update-0.01s", {"weighted_round_robin": {"weightUpdatePeriod": "0.01s"}}),
    (
        "wrr-blackout-object",
        {"weighted_round_robin": {"blackoutPeriod": {"seconds": 1, "nanos": 0}}},
    ),
    ("wrr-update-object", {"weighted_round_robin": {"weightUpdatePeriod": {"seconds": 2}}}),
    ("wrr-node-snake-case", {"weighted_round_robin": {"enable_oob_load_report": "notabool"}}),
    # RLS's int64 cacheSizeBytes read the same way
    *(
        (f"rls-cache-size-{label}", _rls(size))
        for label, size in [
            ("number", 1000),
            ("float", 1000.0),
            ("exponent", 1e3),
            ("string", "1000"),
            ("blank-string", " 1000"),
            ("plus-string", "+1000"),
        ]
    ),
    # grpc-js-xds test-confg-parsing.ts
    ("cds-populated", {"cds_experimental": {"cluster": "abc"}}),
    ("cds-empty", {"cds_experimental": {}}),
    ("cds-non-string", {"cds_experimental": {"cluster": 123}}),
    ("cds-null", {"cds_experimental": {"cluster": None}}),
    ("cds-isDynamic-string", {"cds_experimental": {"cluster": "abc", "isDynamic": "yes"}}),
    (
        "cluster_impl-node-required",
        {"xds_cluster_impl_experimental": {"cluster": "abc", "child_policy": RR}},
    ),
    (
        "cluster_impl-node-non-string",
        {"xds_cluster_impl_experimental": {"cluster": 123, "child_policy": RR}},
    ),
    ("priority-empty", {"priority_experimental": {"children": {}, "priorities": []}}),
    (
        "priority-populated",
        {
            "priority_experimental": {
                "children": {
                    "child0": {"config": RR, "ignore_reresolution_requests": True},
                    "child1": {"config": RR, "ignore_reresolution_requests": False},
                },
                "priorities": ["child0", "child1"],
            }
        },
    ),
    (
        "priority-unknown",
        {"priority_experimental": {"children": {"a": {"config": RR}}, "priorities": ["b"]}},
    ),
    ("priority-no-config", {"priority_experimental": {"children": {"a": {}}, "priorities": ["a"]}}),
    ("priority-no-priorities", {"priority_experimental": {"children": {"a": {"config": RR}}}}),
    (
        "priority-ignore-null",
        {
            "priority_experimental": {
                "children": {"a": {"config": RR, "ignore_reresolution_requests": None}},
                "priorities": ["a"],
            }
        },
    ),
    ("wt-empty", {"weighted_target_experimental": {"targets": {}}}),
    (
        "wt-populated",
        {
            "weighted_target_experimental": {
                "targets": {
                    "target0": {"weight": 1, "childPolicy": RR},
                    "target1": {"weight": 2, "childPolicy": RR},
                }
            }
        },
    ),
    (
        "wt-node-child_policy",
        {"weighted_target_experimental": {"targets": {"t": {"weight": 1, "child_policy": RR}}}},
    ),
    (
        "wt-weight-missing",
        {"weighted_target_experimental": {"targets": {"t": {"childPolicy": RR}}}},
    ),
    (
        "wt-weight-negative",
        {"weighted_target_experimental": {"targets": {"t": {"weight": -1, "childPolicy": RR}}}},
    ),
    (
        "wt-weight-fraction",
        {"weighted_target_experimental": {"targets": {"t": {"weight": 1.5, "childPolicy": RR}}}},
    ),
    (
        "wt-weight-2to32",
        {"weighted_target_experimental": {"targets": {"t": {"weight": 2**32, "childPolicy": RR}}}},
    ),
    (
        "wt-weight-string",
        {"weighted_target_experimental": {"targets": {"t": {"weight": "3", "childPolicy": RR}}}},
    ),
    (
        "wt-weight-plus",
        {"weighted_target_experimental": {"targets": {"t": {"weight": "+3", "childPolicy": RR}}}},
    ),
    (
        "wt-weight-string-fraction",
        {"weighted_target_experimental": {"targets": {"t": {"weight": "3.0", "childPolicy": RR}}}},
    ),
    (
        "wt-weight-empty-string",
        {"weighted_target_experimental": {"targets": {"t": {"weight": "", "childPolicy": RR}}}},
    ),
    ("cm-empty", {"xds_cluster_manager_experimental": {"children": {}}}),
    (
        "cm-populated",
        {"xds_cluster_manager_experimental": {"children": {"child0": {"childPolicy": RR}}}},
    ),
    (
        "cm-node-child_policy",
        {"xds_cluster_manager_experimental": {"children": {"child0": {"child_policy": RR}}}},
    ),
    ("rh-empty", {"ring_hash_experimental": {}}),
    ("rh-populated", {"ring_hash_experimental": {"minRingSize": 2048, "maxRingSize": 8192}}),
    ("rh-min-too-large", {"ring_hash_experimental": {"minRingSize": 8388609}}),
    ("rh-max-too-large", {"ring_hash_experimental": {"maxRingSize": 8388609}}),
    ("rh-node-min_ring_size", {"ring_hash_experimental": {"min_ring_size": 8388609}}),
    ("rh-node-max_ring_size", {"ring_hash_experimental": {"max_ring_size": 8388609}}),
    ("rh-min-10.0", {"ring_hash_experimental": {"minRingSize": 10.0}}),
    (
        "wt-weight-3.0",
        {"weighted_target_experimental": {"targets": {"t": {"weight": 3.0, "childPolicy": RR}}}},
    ),
    (
        "od-percent-1e1",
        {"outlier_detection_experimental": {"maxEjectionPercent": 1e1, "childPolicy": RR}},
    ),
    ("rh-min-zero", {"ring_hash_experimental": {"minRingSize": 0}}),
    ("rh-min-above-max", {"ring_hash_experimental": {"minRingSize": 2000, "maxRingSize": 1000}}),
    ("rh-min-string", {"ring_hash_experimental": {"minRingSize": " 2048 "}}),
    ("rh-min-bool", {"ring_hash_experimental": {"minRingSize": True}}),
    ("rh-min-null", {"ring_hash_experimental": {"minRingSize": None}}),
    # WRR and xds_wrr_locality / xds_override_host: the same JSON rules
    ("wrr-penalty-negative", {"weighted_round_robin": {"errorUtilizationPenalty": -1}}),
    ("wrr-penalty-string", {"weighted_round_robin": {"errorUtilizationPenalty": "1.5"}}),
    ("wrr-oob-string", {"weighted_round_robin": {"enableOobLoadReport": "true"}}),
    ("wrr-expiration-number", {"weighted_round_robin": {"weightExpirationPeriod": 5}}),
    ("wrr-blackout-null", {"weighted_round_robin": {"blackoutPeriod": None}}),
    ("wrr_locality-empty", {"xds_wrr_locality_experimental": {}}),
    ("override_host-empty", {"xds_override_host_experimental": {}}),
]

# JSON duration forms (pyxds._duration; tests/unit/test_duration.py has the
# values and words), each as a weighted_round_robin and an rls duration,
# where no gRFC adds a rule to C-core's reader
DURATION_FORMS = [
    *("1.5s", " 1.5s", "1.5 s", "+1s", "-0s", "-0.5s", "-0.000000001s", "1. 5s", "1.+5s"),
    *("1.-5s", "0.-5s", "1.000000001s", "315576000000.999999999s"),
    *("1", "1.5s ", "1S", "s", ".5s", "1e3s", "0x10s", "inf s", "1.s", "1..5s", "1.- 5s"),
    *("1.99999999999s", "1.0000000001s", "1.-000000001s", "-1s", "315576000001s"),
    *("99999999999999999999s", "\u0661s"),
]
CASES += [
    (f"wrr-blackout-{text!r}", {"weighted_round_robin": {"blackoutPeriod": text}})
    for text in DURATION_FORMS
]
CASES += [(f"rls-timeout-{text!r}", _rls(10, lookupServiceTimeout=text)) for text in DURATION_FORMS]


# Configs where pyxds knowingly answers otherwise (docs/differences-from-c-core.md):
# grpcio 1.85 refuses a negative duration ("-1s": "seconds must be in the
# range [0, ...]") but takes one whose seconds part is 0 or whose fraction
# has the minus ("-0.000000001s", "-0.5s", "1.-5s"); outlier detection
# refuses them all (A50: "they must have non-negative values").
KNOWN_DIFFERENCES: list[tuple[str, dict[str, Any]]] = [
    (
        f"od-interval-{text!r}",
        {"outlier_detection_experimental": {"interval": text, "childPolicy": RR}},
    )
    for text in ("-0.000000001s", "-0.5s", "1.-5s", "0.-5s")
]

_CORE_PROBE = """
import json, sys
import grpc
target, cases = json.loads(sys.stdin.read())
out = {}
for case_id, entry in cases:
    config = json.dumps({"loadBalancingConfig": [entry]})
    channel = grpc.insecure_channel(target, options=[("grpc.service_config", config)])
    try:
        channel.unary_unary("/pyxds.Probe/Call", _registered_method=False)(b"", timeout=5)
        out[case_id] = "OK"
    except grpc.RpcError as err:
        out[case_id] = f"{err.code().name}: {err.details()}"
    finally:
        channel.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def dead_target() -> Iterator[str]:
    """A loopback address that refuses every connection, for both channels."""
    with held_ports() as holds:
        yield "ipv4:" + holds.dead_address()


@pytest.fixture(scope="module")
def core_outcomes(dead_target: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", _CORE_PROBE],
        input=json.dumps([dead_target, CASES + KNOWN_DIFFERENCES]),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    outcomes: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return outcomes


def core_refuses(outcome: str) -> bool:
    return outcome.startswith("INVALID_ARGUMENT") and "errors validating service config" in outcome


def pyxds_refuses(target: str, entry: dict[str, Any]) -> bool:
    try:
        channel = pyxds.insecure_channel(target, service_config={"loadBalancingConfig": [entry]})
    except ValueError as err:
        assert "invalid service config" in str(err)
        return True
    channel.close()
    return False


@pytest.mark.parametrize(("case_id", "entry"), CASES, ids=[case[0] for case in CASES])
def test_lb_config_is_accepted_or_refused_like_grpcio(dead_target, core_outcomes, case_id, entry):
    core = core_outcomes[case_id]
    assert pyxds_refuses(dead_target, entry) == core_refuses(core), f"grpcio 1.85: {core}"


@pytest.mark.parametrize(
    ("case_id", "entry"), KNOWN_DIFFERENCES, ids=[case[0] for case in KNOWN_DIFFERENCES]
)
def test_negative_durations_under_a_second_are_refused_where_grpcio_takes_them(
    dead_target, core_outcomes, case_id, entry
):
    """The documented difference: still so in grpcio (if this fails there,
    C-core has closed the gap and the docs line can go)."""
    assert not core_refuses(core_outcomes[case_id])
    assert pyxds_refuses(dead_target, entry)


@pytest.mark.parametrize(("weight", "accepted"), [(3, True), (1234567, True), (2.5, False)])
def test_typed_struct_numbers_reach_integer_fields_like_grpcio(weight, accepted):
    """A52 TypedStruct: a Struct carries numbers as doubles; grpcio 1.85
    takes a whole one in an integer field (the config is used: "empty address
    list" from weighted_target, whose target gets no endpoints) and NACKs
    one with a fraction.  pyxds must do the same (whole doubles become ints
    before the policy's parser refuses floats)."""
    from test_differential_cds_eds_nack import _cla, _one_rpc_each, _serve
    from xds.type.v3 import typed_struct_pb2

    from pyxds.server import ManagementServer
    from pyxds.server import builders as b

    typed = typed_struct_pb2.TypedStruct(
        type_url="type.googleapis.com/weighted_target_experimental"
    )
    typed.value.update({"targets": {"t": {"weight": weight, "childPolicy": RR}}})
    name = f"node-typed-struct-{str(weight).replace('.', '-')}"
    cluster = b.cluster(f"{name}-cluster")
    cluster.load_balancing_policy.policies.add().typed_extension_config.typed_config.Pack(typed)
    server = ManagementServer().start()
    core = CoreXdsClient(server.bootstrap(node_id="differential-cds-eds-nack"))
    try:
        target = _serve(server, name, cluster, _cla(f"{name}-cluster"))
        ours, theirs = _one_rpc_each(server, core, target)
    finally:
        core.close()
        server.stop()
    for outcome in (ours, theirs):
        assert outcome.startswith("error:UNAVAILABLE: empty address list") == accepted, outcome
    if not accepted:
        assert "weight" in ours and "weight" in theirs, (ours, theirs)
