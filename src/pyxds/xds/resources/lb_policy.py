"""The xDS LB policy registry: CDS LB fields -> gRPC LB config JSON (A52, A62, A42, A48, A58).

``convert_load_balancing_policy`` walks ``load_balancing_policy.policies``
and returns the first supported entry converted to a gRPC
``loadBalancingConfig`` list; unsupported entries are skipped; nesting
deeper than :data:`MAX_RECURSION_DEPTH` (16) is an error, and so is a list
with no supported entry.  An entry without ``typed_config``, or whose type URL
(or a TypedStruct's) names no type, is an error, not skipped.  Errors inside
an entry's message are named ``...typed_config.value[<type>].<field>``, as
C-core's XdsLbPolicyRegistry names them.  An entry is supported when its type is one below
AND the gRPC policy it maps to is registered in :mod:`pyxds.lb.registry`:

=====================================================  ==============================
xDS type (typed_config)                                gRPC policy
=====================================================  ==============================
...round_robin.v3.RoundRobin                           round_robin
...pick_first.v3.PickFirst                             pick_first {shuffleAddressList}
...wrr_locality.v3.WrrLocality                         xds_wrr_locality_experimental
...ring_hash.v3.RingHash                               ring_hash_experimental
...least_request.v3.LeastRequest                       least_request_experimental
...client_side_weighted_round_robin.v3.ClientSide...   weighted_round_robin
xds.type.v3.TypedStruct / udpa.type.v1.TypedStruct     <type name of the struct>
=====================================================  ==============================

``convert_legacy_lb_policy`` handles the older ``lb_policy`` enum:
ROUND_ROBIN -> wrr_locality(round_robin), RING_HASH -> ring_hash_experimental,
LEAST_REQUEST -> wrr_locality(least_request_experimental); anything else is an
error.  The XdsClient then checks the result with the gRPC LB policy registry
(A52: a config the registry cannot parse is a NACK).
"""

from __future__ import annotations

from typing import Any

from pyxds.xds.resources._common import (
    TYPED_STRUCT_TYPES,
    Errors,
    duration,
    type_name,
    unpack,
    valid_type_url,
)

__all__ = [
    "convert_load_balancing_policy",
    "convert_legacy_lb_policy",
    "MAX_RECURSION_DEPTH",
]

MAX_RECURSION_DEPTH = 16
MAX_RING_SIZE = 8_388_608
_P = "envoy.extensions.load_balancing_policies."
ROUND_ROBIN = _P + "round_robin.v3.RoundRobin"
PICK_FIRST = _P + "pick_first.v3.PickFirst"
WRR_LOCALITY = _P + "wrr_locality.v3.WrrLocality"
RING_HASH = _P + "ring_hash.v3.RingHash"
LEAST_REQUEST = _P + "least_request.v3.LeastRequest"
CSWRR = _P + "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin"


class _Unsupported(Exception):
    pass


def _registered(name: str) -> bool:
    from pyxds.lb import registry

    return registry.get(name) is not None


def _duration_json(d: Any, path: str, errs: Errors) -> str | None:
    v = duration(d, path, errs)
    if v is None:
        return None
    return f"{d.seconds}.{d.nanos:09d}s" if d.nanos else f"{d.seconds}s"


def convert_load_balancing_policy(
    lbp: Any, errs: Errors, path: str = "load_balancing_policy", depth: int = 1
) -> list[dict[str, Any]] | None:
    """Convert a ``LoadBalancingPolicy`` message; None (with errors) on failure."""
    if depth > MAX_RECURSION_DEPTH:
        errs.add(path, f"exceeded max recursion depth of {MAX_RECURSION_DEPTH}")
        return None
    for i, policy in enumerate(lbp.policies):
        if not policy.HasField("typed_extension_config"):
            errs.add(f"{path}.policies[{i}].typed_extension_config", "field not present")
            return None
        p = f"{path}.policies[{i}].typed_extension_config.typed_config"
        if not policy.typed_extension_config.HasField("typed_config"):
            errs.add(p, "field not present")
            return None
        any_msg = policy.typed_extension_config.typed_config
        if not valid_type_url(any_msg.type_url, f"{p}.type_url", errs):
            return None
        n_before = len(errs)
        try:
            result = _convert_one(any_msg, errs, p, depth)
        except _Unsupported:
            continue
        if len(errs) > n_before or result is None:
            return None
        return result
    errs.add(path, "no supported load balancing policy config found")
    return None


def _convert_one(
    any_msg: Any, errs: Errors, typed_config_path: str, depth: int
) -> list[dict[str, Any]] | None:
    """One policy entry: errors inside its message are named under
    ``<typed_config>.value[<type>]`` as C-core names them."""
    tname = type_name(any_msg.type_url)
    p = f"{typed_config_path}.value[{tname}]"
    if tname == ROUND_ROBIN:
        if not _registered("round_robin"):
            raise _Unsupported
        return [{"round_robin": {}}]
    if tname == PICK_FIRST:
        if not _registered("pick_first"):
            raise _Unsupported
        from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2

        m = unpack(any_msg, pick_first_pb2.PickFirst, p, errs)
        if m is None:
            return None
        return [{"pick_first": {"shuffleAddressList": m.shuffle_address_list}}]
    if tname == WRR_LOCALITY:
        if not _registered("xds_wrr_locality_experimental"):
            raise _Unsupported
        from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2

        m = unpack(any_msg, wrr_locality_pb2.WrrLocality, p, errs)
        if m is None:
            return None
        if not m.HasField("endpoint_picking_policy"):
            errs.add(f"{p}.endpoint_picking_policy", "field not present")
            return None
        child = convert_load_balancing_policy(
            m.endpoint_picking_policy, errs, f"{p}.endpoint_picking_policy", depth + 1
        )
        if child is None:
            return None
        return [{"xds_wrr_locality_experimental": {"childPolicy": child}}]
    if tname == RING_HASH:
        if not _registered("ring_hash_experimental"):
            raise _Unsupported
        from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2

        m = unpack(any_msg, ring_hash_pb2.RingHash, p, errs)
        if m is None:
            return None
        return _ring_hash(m, errs, p)
    if tname == LEAST_REQUEST:
        if not _registered("least_request_experimental"):
            raise _Unsupported
        from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2

        m = unpack(any_msg, least_request_pb2.LeastRequest, p, errs)
        if m is None:
            return None
        count = _choice_count(m, errs, p)
        return [{"least_request_experimental": {"choiceCount": count}}]
    if tname == CSWRR:
        if not _registered("weighted_round_robin"):
            raise _Unsupported
        from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
            client_side_weighted_round_robin_pb2 as cswrr_pb2,
        )

        m = unpack(any_msg, cswrr_pb2.ClientSideWeightedRoundRobin, p, errs)
        if m is None:
            return None
        cfg: dict[str, Any] = {}
        if m.enable_oob_load_report.value:
            cfg["enableOobLoadReport"] = True
        for field, key in (
            ("oob_reporting_period", "oobReportingPeriod"),
            ("blackout_period", "blackoutPeriod"),
            ("weight_expiration_period", "weightExpirationPeriod"),
            ("weight_update_period", "weightUpdatePeriod"),
        ):
            if m.HasField(field):
                v = _duration_json(getattr(m, field), f"{p}.{field}", errs)
                if v is not None:
                    cfg[key] = v
        if m.HasField("error_utilization_penalty"):
            penalty = m.error_utilization_penalty.value
            if not penalty >= 0:  # negative or NaN
                errs.add(f"{p}.error_utilization_penalty", "value must be non-negative")
            cfg["errorUtilizationPenalty"] = penalty
        if m.metric_names_for_computing_utilization:  # A114: copied over as is
            cfg["metricNamesForComputingUtilization"] = list(
                m.metric_names_for_computing_utilization
            )
        return [{"weighted_round_robin": cfg}]
    if tname in TYPED_STRUCT_TYPES:
        if tname == "xds.type.v3.TypedStruct":
            from xds.type.v3 import typed_struct_pb2
        else:
            from udpa.type.v1 import typed_struct_pb2
        m = unpack(any_msg, typed_struct_pb2.TypedStruct, p, errs)
        if m is None:
            return None
        if not valid_type_url(m.type_url, f"{p}.type_url", errs):
            return None
        name = type_name(m.type_url)
        if not _registered(name):
            raise _Unsupported
        from google.protobuf import json_format  # with the first TypedStruct policy

        return [{name: _whole_numbers(json_format.MessageToDict(m.value))}]
    raise _Unsupported


def _whole_numbers(value: Any) -> Any:
    """A ``Struct``'s JSON with every whole number written as an integer.

    A ``Struct`` holds every number as a double; grpcio 1.85 reads a whole
    one as an integer (``weight`` 3, 1234567 and 8388608 from a TypedStruct
    all accepted, seen live), while a JSON service config's ``3.0`` is no
    integer to it: so whole doubles become ints here, and integer fields
    refuse floats.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def _ring_hash(m: Any, errs: Errors, p: str) -> list[dict[str, Any]]:
    if m.hash_function != 0 and m.hash_function != 1:  # DEFAULT_HASH / XX_HASH
        errs.add(f"{p}.hash_function", "unsupported value (must be XX_HASH)")
    lo = m.minimum_ring_size.value if m.HasField("minimum_ring_size") else 1024
    hi = m.maximum_ring_size.value if m.HasField("maximum_ring_size") else MAX_RING_SIZE
    if hi == 0 or hi > MAX_RING_SIZE:
        errs.add(f"{p}.maximum_ring_size", f"value must be in the range [1, {MAX_RING_SIZE}]")
    if lo == 0 or lo > MAX_RING_SIZE:
        errs.add(f"{p}.minimum_ring_size", f"value must be in the range [1, {MAX_RING_SIZE}]")
    if lo > hi:
        errs.add(f"{p}.minimum_ring_size", "cannot be greater than maximum_ring_size")
    return [{"ring_hash_experimental": {"minRingSize": lo, "maxRingSize": hi}}]


def _choice_count(m: Any, errs: Errors, p: str) -> int:
    count = m.choice_count.value if m.HasField("choice_count") else 2
    if count < 2:
        errs.add(f"{p}.choice_count", "must be greater than or equal to 2")
    return count


def convert_legacy_lb_policy(cluster: Any, errs: Errors) -> list[dict[str, Any]] | None:
    """Convert the ``lb_policy`` enum (+ its ``*_lb_config``) of a Cluster."""
    lb = cluster.lb_policy
    if lb == 0:  # ROUND_ROBIN
        return [{"xds_wrr_locality_experimental": {"childPolicy": [{"round_robin": {}}]}}]
    if lb == 2:  # RING_HASH
        cfg = cluster.ring_hash_lb_config
        if cfg.hash_function != 0:  # XX_HASH
            errs.add("ring_hash_lb_config.hash_function", "invalid hash function")
        lo = cfg.minimum_ring_size.value if cfg.HasField("minimum_ring_size") else 1024
        hi = cfg.maximum_ring_size.value if cfg.HasField("maximum_ring_size") else MAX_RING_SIZE
        if lo == 0 or lo > MAX_RING_SIZE:
            errs.add(
                "ring_hash_lb_config.minimum_ring_size",
                f"must be in the range of 1 to {MAX_RING_SIZE}",
            )
        if hi == 0 or hi > MAX_RING_SIZE:
            errs.add(
                "ring_hash_lb_config.maximum_ring_size",
                f"must be in the range of 1 to {MAX_RING_SIZE}",
            )
        if lo > hi:
            errs.add(
                "ring_hash_lb_config.minimum_ring_size", "cannot be greater than maximum_ring_size"
            )
        return [{"ring_hash_experimental": {"minRingSize": lo, "maxRingSize": hi}}]
    if lb == 1:  # LEAST_REQUEST
        count = _choice_count(cluster.least_request_lb_config, errs, "least_request_lb_config")
        return [
            {
                "xds_wrr_locality_experimental": {
                    "childPolicy": [{"least_request_experimental": {"choiceCount": count}}]
                }
            }
        ]
    errs.add("lb_policy", "LB policy is not supported")  # C-core's words
    return None
