"""Cluster validation (A27 "Cluster Proto", A37 "Validation", A52, A75).

Rules:

* Discovery: ``type`` EDS or LOGICAL_DNS, or ``cluster_type`` whose
  ``typed_config`` is an aggregate ``ClusterConfig`` with at least one
  cluster; anything else is an error.
* EDS: ``eds_cluster_config.eds_config`` must be ``ads`` or ``self``;
  ``service_name`` (if set) names the EDS resource; a cluster with an
  ``xdstp:`` name must set it.
* LOGICAL_DNS: ``load_assignment`` with exactly one locality with exactly one
  lb_endpoint whose ``endpoint.address.socket_address`` has a non-empty
  ``address``, a ``port_value`` and no ``resolver_name``.
* LB policy: ``load_balancing_policy`` if present (A52), else the
  ``lb_policy`` enum; the result must parse in the gRPC LB policy registry.
* ``circuit_breakers``: the first DEFAULT-priority threshold's
  ``max_requests`` (1024 when unset).
* ``lrs_server`` if set must be ``self``.
* ``transport_socket`` must hold an ``UpstreamTlsContext``, validated as
  C-core does (A29, :mod:`pyxds.security.tls_config`); with the bootstrap's
  ``certificate_providers`` (``decode_cluster(data, providers)``) every
  provider instance name must exist there.  One inside a ``TypedStruct``
  is named and refused as C-core does ("can't decode UpstreamTlsContext").
* ``outlier_detection`` (A50 "xDS Integration"): durations valid,
  ``max_ejection_percent``, ``enforcing_success_rate``,
  ``failure_percentage_threshold`` and ``enforcing_failure_percentage`` <= 100
  (else NACK naming the field); mapped to the ``outlier_detection_experimental``
  config (``Cluster.outlier_detection``, canonical JSON without childPolicy).
* ``upstream_config`` (A75): if present it must be HttpProtocolOptions;
  ``common_http_protocol_options.idle_timeout`` is validated and kept.
* ``common_lb_config.override_host_status`` (A55, A75): the UNKNOWN,
  HEALTHY and DRAINING entries are kept (others ignored, as C-core); unset
  means {UNKNOWN, HEALTHY}, present and empty means none.
* ``lrs_report_endpoint_metrics`` (A85): ``cpu_utilization``,
  ``mem_utilization``, ``application_utilization``, ``named_metrics.*`` and
  ``named_metrics.<key>``; other strings are ignored (forward
  compatibility).  As in grpcio 1.85's C-core this is on unless
  GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION says false; then the field is
  not read and every named metric is reported under its own name (A64).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyxds.security.tls_config import parse_upstream_tls_context
from pyxds.xds import descriptors
from pyxds.xds.resources._common import (
    TYPED_STRUCT_TYPES,
    Errors,
    config_source_is_ads_or_self,
    duration,
    type_name,
    typed_struct_type,
    valid_type_url,
)
from pyxds.xds.resources.lb_policy import convert_legacy_lb_policy, convert_load_balancing_policy
from pyxds.xds.resources.types import (
    DEFAULT_OVERRIDE_HOST_STATUSES,
    NO_PROPAGATION,
    BackendMetricPropagation,
    Cluster,
)

if TYPE_CHECKING:
    from envoy.config.cluster.v3 import cluster_pb2
else:  # loaded on first use without the generated modules (pyxds.xds.descriptors)
    cluster_pb2 = descriptors.module("envoy.config.cluster.v3.cluster_pb2")

__all__ = [
    "decode_cluster",
    "AGGREGATE_CLUSTER_TYPE",
    "DEFAULT_MAX_REQUESTS",
    "ORCA_LRS_PROPAGATION_ENV",
    "orca_lrs_propagation_enabled",
]

AGGREGATE_CLUSTER_TYPE = "envoy.extensions.clusters.aggregate.v3.ClusterConfig"
HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
UPSTREAM_TLS_CONTEXT = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
DEFAULT_MAX_REQUESTS = 1024
DEFAULT_IDLE_TIMEOUT = 3600.0
#: A85 "Temporary environment variable protection" (default true in 1.85)
ORCA_LRS_PROPAGATION_ENV = "GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION"
#: HealthStatus enum values a session may stay on (A55); others are ignored
_OVERRIDE_STATUS_NAMES = {0: "UNKNOWN", 1: "HEALTHY", 3: "DRAINING"}
_EDS = cluster_pb2.Cluster.EDS
_LOGICAL_DNS = cluster_pb2.Cluster.LOGICAL_DNS


def orca_lrs_propagation_enabled() -> bool:
    """A85's switch as grpcio 1.85's C-core reads it: on when unset; off
    for false/no/0 (any case) or a value that is not a boolean."""
    value = os.environ.get(ORCA_LRS_PROPAGATION_ENV)
    if value is None:
        return True
    return value.strip().lower() in ("true", "yes", "1")


def _lrs_metrics(c: Any) -> BackendMetricPropagation:
    """``lrs_report_endpoint_metrics`` parsed (module docstring)."""
    if not orca_lrs_propagation_enabled():
        return BackendMetricPropagation(legacy=True)
    names = list(c.lrs_report_endpoint_metrics)
    if not names:
        return NO_PROPAGATION
    keys = set()
    named_all = False
    for name in names:
        if name == "named_metrics.*":
            named_all = True
        elif name.startswith("named_metrics."):
            keys.add(name[len("named_metrics.") :])
    return BackendMetricPropagation(
        cpu_utilization="cpu_utilization" in names,
        mem_utilization="mem_utilization" in names,
        application_utilization="application_utilization" in names,
        named_all=named_all,
        named_keys=frozenset() if named_all else frozenset(keys),
    )


def _override_host_statuses(c: Any) -> frozenset[str]:
    if not c.HasField("common_lb_config"):
        return DEFAULT_OVERRIDE_HOST_STATUSES
    clb = c.common_lb_config
    if not clb.HasField("override_host_status"):
        return DEFAULT_OVERRIDE_HOST_STATUSES
    return frozenset(
        _OVERRIDE_STATUS_NAMES[v]
        for v in clb.override_host_status.statuses
        if v in _OVERRIDE_STATUS_NAMES
    )


def decode_cluster(
    data: bytes, providers: Mapping[str, Any] | None = None
) -> tuple[str | None, Any, str | None]:
    """Parse and validate serialized Cluster bytes: (name, resource, error).
    ``providers``: the bootstrap's ``certificate_providers`` (None: instance
    names are not checked)."""
    c = cluster_pb2.Cluster()
    try:
        c.ParseFromString(data)
    except Exception as err:
        return None, None, f"could not parse Cluster: {err}"
    errs = Errors()
    resource = parse_cluster(c, errs, providers)
    if errs:
        return c.name, None, errs.text()
    return c.name, resource, None


def parse_cluster(
    c: Any, errs: Errors, providers: Mapping[str, Any] | None = None
) -> Cluster | None:
    """Validate a ``envoy.config.cluster.v3.Cluster`` message."""
    name = c.name
    kind = None
    eds_service_name = dns_host = dns_port = None
    children: tuple[str, ...] = ()
    which = c.WhichOneof("cluster_discovery_type")
    if which == "type" and c.type == _EDS:
        kind = "EDS"
        ecc = c.eds_cluster_config
        if not c.HasField("eds_cluster_config"):
            errs.add("eds_cluster_config", "field not present")
        elif not ecc.HasField("eds_config"):
            errs.add("eds_cluster_config.eds_config", "field not present")
        elif not config_source_is_ads_or_self(ecc.eds_config):
            errs.add("eds_cluster_config.eds_config", "ConfigSource is not ads or self")
        eds_service_name = ecc.service_name or None
        if (
            eds_service_name is None
            and name.startswith("xdstp:")
            and c.HasField("eds_cluster_config")
        ):
            errs.add(
                "eds_cluster_config.service_name",
                "must be set if Cluster resource has an xdstp name",
            )
    elif which == "type" and c.type == _LOGICAL_DNS:
        kind = "LOGICAL_DNS"
        dns_host, dns_port = _logical_dns(c, errs)
    elif which == "cluster_type":
        ct = c.cluster_type
        tname = type_name(ct.typed_config.type_url)
        if not ct.HasField("typed_config"):
            errs.add("cluster_type.typed_config", "field not present")
        elif tname != AGGREGATE_CLUSTER_TYPE:
            errs.add(
                "cluster_type.typed_config.type_url", f"unknown cluster_type extension: {tname}"
            )
        else:
            from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2

            ap = f"cluster_type.typed_config.value[{AGGREGATE_CLUSTER_TYPE}]"
            cfg = aggregate_pb2.ClusterConfig()
            try:
                cfg.ParseFromString(ct.typed_config.value)
            except Exception:
                errs.add(ap, "can't parse aggregate cluster config")
                cfg = None
            if cfg is not None:
                kind = "AGGREGATE"
                children = tuple(cfg.clusters)
                # A37 "Validation": at least one entry; an entry's name is
                # not checked (C-core neither: an empty name is a cluster
                # that does not exist).
                if not children:
                    errs.add(f"{ap}.clusters", "must be non-empty")
    else:  # another type, or neither type nor cluster_type (C-core's words)
        errs.add("type", "unknown discovery type")

    n_before_lb = len(errs)
    if c.HasField("load_balancing_policy"):
        lb = convert_load_balancing_policy(c.load_balancing_policy, errs)
        lb_path = "load_balancing_policy"
    else:
        lb = convert_legacy_lb_policy(c, errs)
        lb_path = "lb_policy"
    lb_json = None
    # As C-core: the registry sees only a config that converted cleanly
    # (LbPolicyTest.EnumLbPolicyRingHashSetMinAndMaxRingSizeToZero).
    if lb is not None and len(errs) == n_before_lb:
        _validate_with_registry(lb, lb_path, errs)
        lb_json = json.dumps(lb, sort_keys=True)

    max_requests = DEFAULT_MAX_REQUESTS
    if c.HasField("circuit_breakers"):
        for t in c.circuit_breakers.thresholds:
            if t.priority == 0:  # RoutingPriority.DEFAULT
                if t.HasField("max_requests"):
                    max_requests = t.max_requests.value
                break

    lrs = False
    if c.HasField("lrs_server"):
        if c.lrs_server.WhichOneof("config_source_specifier") != "self":
            errs.add("lrs_server", "ConfigSource is not self")
        lrs = True

    ts_bytes = ts_type = security = None
    if c.HasField("transport_socket"):
        ts = c.transport_socket
        ts_type = type_name(ts.typed_config.type_url) or None
        ts_bytes = ts.typed_config.value
        ts_path = f"transport_socket.typed_config.value[{ts_type}]"
        if _has_typed_config(ts, "transport_socket", errs):
            if ts_type in TYPED_STRUCT_TYPES:
                # TlsConfigTest.UpstreamTlsContextInTypedStruct
                _refuse_typed_struct(
                    ts_bytes, ts_path, UPSTREAM_TLS_CONTEXT, "transport socket", errs
                )
            elif ts_type != UPSTREAM_TLS_CONTEXT:
                errs.add(f"{ts_path}.type_url", "unsupported transport socket type")
            else:
                security = parse_upstream_tls_context(ts_bytes, errs, providers)

    outlier_detection = None
    if c.HasField("outlier_detection"):
        outlier_detection = _outlier_detection(c.outlier_detection, errs)

    idle = DEFAULT_IDLE_TIMEOUT
    if c.HasField("upstream_config") and _has_typed_config(
        c.upstream_config, "upstream_config", errs
    ):
        idle = _idle_timeout(c.upstream_config, errs)

    if kind is None or lb_json is None or errs:
        return None
    return Cluster(
        name=name,
        kind=kind,
        eds_service_name=eds_service_name,
        dns_hostname=dns_host,
        dns_port=dns_port,
        aggregate_children=children,
        lb_policy_config=lb_json,
        max_requests=max_requests,
        lrs_server=lrs,
        transport_socket=ts_bytes,
        transport_socket_type_url=ts_type,
        idle_timeout=idle,
        outlier_detection=outlier_detection,
        security=security,
        override_host_statuses=_override_host_statuses(c),
        lrs_metrics=_lrs_metrics(c),
    )


def _logical_dns(c: Any, errs: Errors) -> tuple[str | None, int | None]:
    if not c.HasField("load_assignment"):
        errs.add("load_assignment", "field not present for LOGICAL_DNS cluster")
        return None, None
    eps = c.load_assignment.endpoints
    if len(eps) != 1:
        errs.add(
            "load_assignment.endpoints",
            f"must contain exactly one locality for LOGICAL_DNS cluster, found {len(eps)}",
        )
        return None, None
    lbes = eps[0].lb_endpoints
    if len(lbes) != 1:
        errs.add(
            "load_assignment.endpoints[0].lb_endpoints",
            f"must contain exactly one endpoint for LOGICAL_DNS cluster, found {len(lbes)}",
        )
        return None, None
    lbe = lbes[0]
    p = "load_assignment.endpoints[0].lb_endpoints[0].endpoint"
    if not lbe.HasField("endpoint"):
        errs.add(p, "field not present")
        return None, None
    if not lbe.endpoint.HasField("address"):
        errs.add(f"{p}.address", "field not present")
        return None, None
    if not lbe.endpoint.address.HasField("socket_address"):
        errs.add(f"{p}.address.socket_address", "field not present")
        return None, None
    sa = lbe.endpoint.address.socket_address
    p = f"{p}.address.socket_address"
    ok = True
    if sa.resolver_name:
        errs.add(
            f"{p}.resolver_name", "LOGICAL_DNS clusters must NOT have a custom resolver name set"
        )
        ok = False
    if not sa.address:
        errs.add(f"{p}.address", "field not present")
        ok = False
    if sa.WhichOneof("port_specifier") != "port_value":
        errs.add(f"{p}.port_value", "field not present")
        ok = False
    return (sa.address, sa.port_value) if ok else (None, None)


def _outlier_detection(od: Any, errs: Errors) -> str | None:
    """Validate ``outlier_detection`` as C-core does (A50 "xDS Validation")
    and map it to the ``outlier_detection_experimental`` JSON config (A50
    "xDS Integration"): ``enforcing_success_rate`` 0 disables success rate
    (unset means 100, enabled); ``enforcing_failure_percentage`` 0 or unset
    disables failure percentage.  Canonical JSON text (sorted keys), so
    equal messages give equal clusters."""
    config: dict[str, Any] = {}
    for field, key in (
        ("interval", "interval"),
        ("base_ejection_time", "baseEjectionTime"),
        ("max_ejection_time", "maxEjectionTime"),
    ):
        if od.HasField(field):
            d = getattr(od, field)
            if duration(d, f"outlier_detection.{field}", errs) is not None:
                config[key] = f"{d.seconds}.{d.nanos:09d}s" if d.nanos else f"{d.seconds}s"
    for field in (
        "max_ejection_percent",
        "enforcing_success_rate",
        "failure_percentage_threshold",
        "enforcing_failure_percentage",
    ):
        if od.HasField(field) and getattr(od, field).value > 100:
            errs.add(f"outlier_detection.{field}", "value must be <= 100")
    if od.HasField("max_ejection_percent"):
        config["maxEjectionPercent"] = min(od.max_ejection_percent.value, 100)

    def value(field: str) -> int | None:
        return getattr(od, field).value if od.HasField(field) else None

    enforcing_sr = value("enforcing_success_rate")
    if enforcing_sr != 0:
        sr: dict[str, Any] = {}
        for field, key in (
            ("success_rate_stdev_factor", "stdevFactor"),
            ("enforcing_success_rate", "enforcementPercentage"),
            ("success_rate_minimum_hosts", "minimumHosts"),
            ("success_rate_request_volume", "requestVolume"),
        ):
            v = value(field)
            if v is not None:
                sr[key] = min(v, 100) if key == "enforcementPercentage" else v
        config["successRateEjection"] = sr
    enforcing_fp = value("enforcing_failure_percentage")
    if enforcing_fp:
        fp: dict[str, Any] = {}
        for field, key in (
            ("failure_percentage_threshold", "threshold"),
            ("enforcing_failure_percentage", "enforcementPercentage"),
            ("failure_percentage_minimum_hosts", "minimumHosts"),
            ("failure_percentage_request_volume", "requestVolume"),
        ):
            v = value(field)
            if v is not None:
                fp[key] = min(v, 100) if key in ("threshold", "enforcementPercentage") else v
        config["failurePercentageEjection"] = fp
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def _validate_with_registry(lb: list[dict[str, Any]], path: str, errs: Errors) -> None:
    """A52: a converted config the gRPC LB policy registry cannot parse is a NACK."""
    from pyxds.lb import registry
    from pyxds.lb.errors import LBConfigError

    try:
        registry.select(json.loads(json.dumps(lb)))
    except LBConfigError as err:
        errs.add(path, f"errors validating LB policy config: {err}")


def _has_typed_config(extension: Any, path: str, errs: Errors) -> bool:
    """A TransportSocket / TypedExtensionConfig needs a ``typed_config``
    whose type URL names a type (C-core: "field not present" at
    ``typed_config`` or ``typed_config.type_url``)."""
    if not extension.HasField("typed_config"):
        errs.add(f"{path}.typed_config", "field not present")
        return False
    return valid_type_url(extension.typed_config.type_url, f"{path}.typed_config.type_url", errs)


def _refuse_typed_struct(value: bytes, path: str, wanted: str, what: str, errs: Errors) -> None:
    """A TypedStruct where a typed message is needed holds JSON, never the
    message's bytes: refused naming the type inside, as C-core does."""
    inner = typed_struct_type(value)
    if inner is None:
        errs.add(path, "could not parse")
    elif inner != wanted:
        errs.add(f"{path}.value[{inner}].type_url", f"unsupported {what} type")
    else:
        errs.add(f"{path}.value[{inner}]", f"can't decode {wanted.rpartition('.')[2]}")


def _idle_timeout(any_msg: Any, errs: Errors) -> float:
    """A75's idle timeout from ``upstream_config``; errors in C-core's fields
    and words (UpstreamConfigTest): the path names the Any's type, and a
    TypedStruct's named type after it."""
    tname = type_name(any_msg.typed_config.type_url)
    path = f"upstream_config.typed_config.value[{tname}]"
    if tname in TYPED_STRUCT_TYPES:
        _refuse_typed_struct(
            any_msg.typed_config.value, path, HTTP_PROTOCOL_OPTIONS, "upstream config", errs
        )
        return DEFAULT_IDLE_TIMEOUT
    if tname != HTTP_PROTOCOL_OPTIONS:
        errs.add(f"{path}.type_url", "unsupported upstream config type")
        return DEFAULT_IDLE_TIMEOUT
    from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

    opts = http_protocol_options_pb2.HttpProtocolOptions()
    try:
        opts.ParseFromString(any_msg.typed_config.value)
    except Exception:  # google.protobuf.message.DecodeError
        errs.add(path, "can't decode HttpProtocolOptions")
        return DEFAULT_IDLE_TIMEOUT
    if not opts.HasField("common_http_protocol_options"):
        return DEFAULT_IDLE_TIMEOUT
    chpo = opts.common_http_protocol_options
    if not chpo.HasField("idle_timeout"):
        return DEFAULT_IDLE_TIMEOUT
    v = duration(chpo.idle_timeout, f"{path}.common_http_protocol_options.idle_timeout", errs)
    return DEFAULT_IDLE_TIMEOUT if v is None else v
