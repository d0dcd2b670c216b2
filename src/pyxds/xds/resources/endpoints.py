"""ClusterLoadAssignment validation (A27 "ClusterLoadAssignment Proto", A61).

Rules (the LB policies never see what is dropped here; TRAPS.md
"weighted_target and EDS shaping"):

* A locality whose ``load_balancing_weight`` is unset or 0 is dropped (its
  name is kept in ``ignored_localities``, so tools can say why a cluster has
  no endpoints).
* Priorities must be contiguous from 0 once dropped localities are gone; a
  gap is an error.  The same locality twice in one priority is an error; the
  sum of locality weights of one priority above uint32 max is an error.
* An lb_endpoint whose ``health_status`` is not UNKNOWN, HEALTHY or
  DRAINING (UNHEALTHY, TIMEOUT, DEGRADED) is excluded (and counted in
  ``excluded_endpoints``) before anything else is looked at, as in C-core:
  its address is neither validated nor part of the duplicate check.
* A DRAINING endpoint is validated like any other and kept, with its
  health status (A55 "XdsClient to Include Endpoint Health Status"): the
  ``xds_override_host`` policy keeps the sessions pinned to it and passes
  only the other endpoints to the cluster's LB policy.  It is not a
  usable endpoint (``endpoint_count``, ``all_endpoints_unhealthy``).
* Each endpoint needs ``endpoint.address.socket_address`` with an IPv4 or
  IPv6 ``address`` (an IPv6 one may carry an RFC 6874 zone, as C-core
  reads it: ``%<interface index or name>``) and a ``port_value`` <= 65535 (unset is 0, accepted as
  C-core, grpc-go and grpc-java do); the same for every
  ``additional_addresses`` entry (A61), which become extra addresses of the
  endpoint.  IPv6 addresses are written in their canonical form, so the
  same address spelled two ways is caught.  An address used twice in the
  cluster is an error.
* Endpoint ``load_balancing_weight``: unset means 1, an explicit 0 is an error.
* ``policy.drop_overloads``: each category's ``drop_percentage`` converted to
  parts per million (HUNDRED / TEN_THOUSAND / MILLION), clamped to 1,000,000.

Hot loop note: the per-endpoint path reads each field once into a local,
asks ``HasField`` only when a cheap read is ambiguous, and builds error
paths only when there is an error.

Locality memo: a locality with at least :data:`LOCALITY_MEMO_MIN_ENDPOINTS`
endpoints that validated without error is remembered by its serialized
bytes (which include its weight and priority).  When the next EDS update
carries the same locality bytes, its :class:`Locality` is reused after one
C-level check that its addresses do not collide with the rest of the
cluster (on a collision the locality is parsed again, so the error names the
endpoint).  A big EDS resource where one locality changed thus costs about a
protobuf serialization of the unchanged localities instead of their
validation.  Bounded by :data:`LOCALITY_MEMO_MAX_BYTES` of keys, oldest
first.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyxds.xds import descriptors
from pyxds.xds.resources._common import Errors
from pyxds.xds.resources.types import (
    UINT32_MAX,
    ClusterLoadAssignment,
    DropOverload,
    EndpointAddress,
    Locality,
    LocalityName,
)

if TYPE_CHECKING:
    from envoy.config.endpoint.v3 import endpoint_pb2
else:  # loaded on first use without the generated modules (pyxds.xds.descriptors)
    endpoint_pb2 = descriptors.module("envoy.config.endpoint.v3.endpoint_pb2")

__all__ = ["decode_cluster_load_assignment", "parse_cluster_load_assignment"]

LOCALITY_MEMO_MIN_ENDPOINTS = 16
LOCALITY_MEMO_MAX_BYTES = 32 * 1024 * 1024
# serialized LocalityLbEndpoints -> (Locality, every address seen, excluded count)
_locality_memo: dict[bytes, tuple[Locality, tuple[str, ...], int]] = {}
_locality_memo_size = 0
_locality_memo_lock = threading.Lock()

_PER_MILLION = (10_000, 100, 1)  # HUNDRED, TEN_THOUSAND, MILLION
_HEALTH_NAMES = ("UNKNOWN", "HEALTHY", "", "DRAINING")
_inet_pton = socket.inet_pton
_inet_ntop = socket.inet_ntop
_new = object.__new__
# Frozen slotted dataclasses: build hot-loop instances through the slot
# descriptors (same value as calling the class, half the cost).
_set_addresses: Callable[[EndpointAddress, tuple[str, ...]], None] = vars(EndpointAddress)[
    "addresses"
].__set__
_set_weight: Callable[[EndpointAddress, int], None] = vars(EndpointAddress)["weight"].__set__
_set_health: Callable[[EndpointAddress, str], None] = vars(EndpointAddress)["health_status"].__set__
_set_hostname: Callable[[EndpointAddress, str], None] = vars(EndpointAddress)["hostname"].__set__
_set_hash_key: Callable[[EndpointAddress, str], None] = vars(EndpointAddress)["hash_key"].__set__


_AF_INET = socket.AF_INET
_AF_INET6 = socket.AF_INET6


def _hash_key(lbe: Any) -> str:
    """A76: ``metadata.filter_metadata["envoy.lb"].fields["hash_key"]`` when
    it is a string, else ""."""
    lb = lbe.metadata.filter_metadata.get("envoy.lb")
    if lb is None:
        return ""
    value = lb.fields.get("hash_key")
    if value is None or value.WhichOneof("kind") != "string_value":
        return ""
    hash_key: str = value.string_value
    return hash_key


def decode_cluster_load_assignment(
    data: bytes, memo: bool = True
) -> tuple[str | None, Any, str | None]:
    """Parse and validate serialized ClusterLoadAssignment bytes: (name, resource, error).

    ``memo=False`` validates every locality afresh (benchmarks, tests).
    """
    cla = endpoint_pb2.ClusterLoadAssignment()
    try:
        cla.ParseFromString(data)
    except Exception as err:
        return None, None, f"could not parse ClusterLoadAssignment: {err}"
    errs = Errors()
    resource = parse_cluster_load_assignment(cla, errs, memo)
    if errs:
        return cla.cluster_name, None, errs.text()
    return cla.cluster_name, resource, None


def _address(sa: Any, path: str, errs: Errors) -> str | None:
    """``host:port`` of a SocketAddress (IPv6 bracketed), or None with an error."""
    host = sa.address
    port = sa.port_value
    try:
        if "%" in host:
            text = f"[{_scoped_ipv6(host)}]:{port}"
        elif ":" in host:
            text = f"[{_inet_ntop(_AF_INET6, _inet_pton(_AF_INET6, host))}]:{port}"
        else:
            _inet_pton(_AF_INET, host)
            text = f"{host}:{port}"
    except (OSError, ValueError):
        # C-core's words (the address is not an IPv4 or IPv6 literal).
        errs.add(f"{path}.socket_address", f"Failed to parse address:{host}:{port}")
        return None
    # An unset port (or a named_port) is port 0, as in C-core, grpc-go and
    # grpc-java: accepted, and connecting to it fails.
    if port > 65535:
        errs.add(f"{path}.socket_address.port_value", "invalid port")
        return None
    return text


def _scoped_ipv6(host: str) -> str:
    """An IPv6 address with an RFC 6874 zone (``fe80::1%eth0``,
    ``fe80::1%2``) in canonical form with the zone as its interface index,
    as C-core's grpc_parse_ipv6_hostport reads it (a zone that is neither a
    number nor an interface name fails), so one address spelled with the
    name and with the index is caught as a duplicate.  Raises OSError or
    ValueError when it is not one."""
    address, _, zone = host.rpartition("%")
    canonical = _inet_ntop(_AF_INET6, _inet_pton(_AF_INET6, address))
    if zone.isascii() and zone.isdigit():
        scope = int(zone)
        if scope > 0xFFFFFFFF:
            raise ValueError(zone)
    else:
        scope = socket.if_nametoindex(zone)  # OSError for an unknown name
    return f"{canonical}%{scope}"


def clear_locality_memo() -> None:
    """Forget every remembered locality."""
    global _locality_memo_size
    with _locality_memo_lock:
        _locality_memo.clear()
        _locality_memo_size = 0


def _remember(key: bytes, value: tuple[Locality, tuple[str, ...], int]) -> None:
    global _locality_memo_size
    with _locality_memo_lock:
        if key in _locality_memo:
            return
        _locality_memo[key] = value
        _locality_memo_size += len(key)
        while _locality_memo_size > LOCALITY_MEMO_MAX_BYTES and _locality_memo:
            old = next(iter(_locality_memo))
            del _locality_memo[old]
            _locality_memo_size -= len(old)


def parse_cluster_load_assignment(
    cla: Any, errs: Errors, memo: bool = True
) -> ClusterLoadAssignment:
    """Validate a ``envoy.config.endpoint.v3.ClusterLoadAssignment`` message."""
    priorities: dict[int, list[Locality]] = {}
    seen_localities: dict[int, set[LocalityName]] = {}
    weight_sums: dict[int, int] = {}
    seen_addresses: set[str] = set()
    excluded = 0
    ignored: list[LocalityName] = []
    address_of = _address
    seen_add = seen_addresses.add
    new = _new
    set_addresses, set_weight, set_health = _set_addresses, _set_weight, _set_health
    set_hostname = _set_hostname
    set_hash_key = _set_hash_key
    health_names = _HEALTH_NAMES
    inet_pton = _inet_pton
    inet_ntop = _inet_ntop
    af_inet, af_inet6 = _AF_INET, _AF_INET6
    memo_get = _locality_memo.get
    memo_min = LOCALITY_MEMO_MIN_ENDPOINTS if memo else None
    for li, lep in enumerate(cla.endpoints):
        lweight = lep.load_balancing_weight.value
        if not lweight:  # unset or 0: the locality is dropped (A27)
            loc = lep.locality
            ignored.append(LocalityName(loc.region, loc.zone, loc.sub_zone))
            continue
        if not lep.HasField("locality"):
            errs.add(f"endpoints[{li}].locality", "field not present")
            continue
        loc = lep.locality
        lname = LocalityName(loc.region, loc.zone, loc.sub_zone)
        prio = lep.priority
        seen = seen_localities.get(prio)
        if seen is None:
            seen = seen_localities[prio] = set()
            priorities[prio] = []
            weight_sums[prio] = 0
        if lname in seen:
            errs.add(  # C-core's words and field
                f"endpoints[{li}]",
                f'duplicate locality {{region="{lname.region}", zone="{lname.zone}", '
                f'sub_zone="{lname.sub_zone}"}} found in priority {prio}',
            )
        seen.add(lname)
        weight_sums[prio] += lweight
        key = None
        if memo_min is not None and len(lep.lb_endpoints) >= memo_min:
            key = lep.SerializeToString()
            hit = memo_get(key)
            if hit is not None:
                locality, all_addrs, n_excluded = hit
                if seen_addresses.isdisjoint(all_addrs):
                    seen_addresses.update(all_addrs)
                    excluded += n_excluded
                    priorities[prio].append(locality)
                    continue
                # An address collides with another locality: parse it again
                # below so the error names the endpoint.
        n_errors = len(errs)
        excluded_before = excluded
        n_seen_before = len(seen_addresses)
        endpoints: list[EndpointAddress] = []
        append = endpoints.append
        for ei, lbe in enumerate(lep.lb_endpoints):
            health = lbe.health_status
            if health > 1 and health != 3:
                # Neither UNKNOWN, HEALTHY nor DRAINING: skipped before any
                # validation, and out of the duplicate check (as C-core).
                excluded += 1
                continue
            ep = lbe.endpoint
            sa = ep.address.socket_address
            host = sa.address
            port = sa.port_value
            # Fast path: a plain IPv4 address and a port (the common case).
            addr: str | None
            try:
                if ":" in host:
                    addr = f"[{inet_ntop(af_inet6, inet_pton(af_inet6, host))}]:{port}"
                else:
                    inet_pton(af_inet, host)
                    addr = f"{host}:{port}"
                if port > 65535:
                    raise ValueError
            except (OSError, ValueError):
                addr = _slow_address(lbe, li, ei, errs)
                if addr is None:
                    continue
            if addr in seen_addresses:
                errs.add(_lbe_path(li, ei), f'duplicate endpoint address "{addr}"')
            seen_add(addr)
            addrs: tuple[str, ...] = (addr,)
            if len(ep.additional_addresses):
                extra = []
                for ai, aa in enumerate(ep.additional_addresses):
                    p = f"{_lbe_path(li, ei)}.endpoint.additional_addresses[{ai}].address"
                    if not aa.HasField("address"):
                        errs.add(p, "field not present")
                        continue
                    if not aa.address.HasField("socket_address"):
                        errs.add(f"{p}.socket_address", "field not present")
                        continue
                    a = address_of(aa.address.socket_address, p, errs)
                    if a is not None:
                        extra.append(a)
                for a in extra:
                    if a in seen_addresses:
                        errs.add(_lbe_path(li, ei), f'duplicate endpoint address "{a}"')
                    seen_add(a)
                addrs = (addr, *extra)
            weight = 1
            if lbe.HasField("load_balancing_weight"):
                weight = lbe.load_balancing_weight.value
                if not weight:
                    errs.add(f"{_lbe_path(li, ei)}.load_balancing_weight", "must be greater than 0")
                    weight = 1
            # EndpointAddress(addrs, weight, health) through its slot descriptors.
            e = new(EndpointAddress)
            set_addresses(e, addrs)
            set_weight(e, weight)
            set_health(e, health_names[health])
            set_hostname(e, ep.hostname)
            set_hash_key(e, _hash_key(lbe) if lbe.HasField("metadata") else "")
            append(e)
        locality = Locality(lname, lweight, tuple(endpoints), prio)
        priorities[prio].append(locality)
        if key is not None and len(errs) == n_errors:
            all_addrs = tuple(a for e in endpoints for a in e.addresses)
            if len(all_addrs) == len(seen_addresses) - n_seen_before:
                _remember(key, (locality, all_addrs, excluded - excluded_before))

    for prio, total in weight_sums.items():
        if total > UINT32_MAX:
            errs.add(
                "endpoints",
                f"sum of locality weights for priority {prio} exceeds uint32 max",
            )
    n = max(priorities) + 1 if priorities else 0
    for prio in range(n):
        if prio not in priorities:
            errs.add("endpoints", f"priority {prio} empty")
    ordered = tuple(tuple(priorities[p]) for p in range(n) if p in priorities)

    drops = []
    if cla.HasField("policy"):
        for di, d in enumerate(cla.policy.drop_overloads):
            if not d.category:
                errs.add(f"policy.drop_overloads[{di}].category", "empty drop category name")
            if not d.HasField("drop_percentage"):
                errs.add(f"policy.drop_overloads[{di}].drop_percentage", "field not present")
                continue
            dp = d.drop_percentage
            den = dp.denominator
            if not 0 <= den < 3:
                errs.add(
                    f"policy.drop_overloads[{di}].drop_percentage.denominator",
                    "unknown denominator type",
                )
                continue
            ppm = min(dp.numerator * _PER_MILLION[den], 1_000_000)
            drops.append(DropOverload(d.category, ppm))
    return ClusterLoadAssignment(cla.cluster_name, ordered, tuple(drops), excluded, tuple(ignored))


def _lbe_path(li: int, ei: int) -> str:
    return f"endpoints[{li}].lb_endpoints[{ei}]"


def _slow_address(lbe: Any, li: int, ei: int, errs: Errors) -> str | None:
    """The endpoint's address when the fast path failed, naming the absent or bad field."""
    p = _lbe_path(li, ei)
    if not lbe.HasField("endpoint"):
        errs.add(f"{p}.endpoint", "field not present")
    elif not lbe.endpoint.HasField("address"):
        errs.add(f"{p}.endpoint.address", "field not present")
    elif not lbe.endpoint.address.HasField("socket_address"):
        errs.add(f"{p}.endpoint.address.socket_address", "field not present")
    else:
        return _address(lbe.endpoint.address.socket_address, f"{p}.endpoint.address", errs)
    return None
