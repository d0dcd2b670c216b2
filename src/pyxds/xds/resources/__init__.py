"""Validated xDS resources, sans-IO (A27, A28, A31, A37, A52, A61, A62, A75).

Each xDS v3 resource type has a :class:`ResourceType` whose ``decode(bytes)``
parses and validates one serialized resource into a :class:`DecodeResult`:
the resource name (None only when the bytes do not parse at all) and either a
frozen value from :mod:`pyxds.xds.resources.types` or an error naming the
offending field(s).  Decoding the same bytes twice gives equal values.

The XdsClient uses ``RESOURCE_TYPES[type_url]`` to pick the decoder for a
DiscoveryResponse and ``decode_any`` for each of its ``resources`` entries
(which may be wrapped in ``envoy.service.discovery.v3.Resource``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import field
from typing import Any

from pyxds._values import dataclass
from pyxds.xds.resources.cluster import decode_cluster
from pyxds.xds.resources.endpoints import decode_cluster_load_assignment
from pyxds.xds.resources.listener import decode_listener
from pyxds.xds.resources.route_config import decode_route_configuration
from pyxds.xds.resources.types import *  # noqa: F403
from pyxds.xds.resources.types import DecodeResult
from pyxds.xds.resources.types import __all__ as _types_all

_TP = "type.googleapis.com/"
LISTENER_TYPE_URL = _TP + "envoy.config.listener.v3.Listener"
ROUTE_CONFIG_TYPE_URL = _TP + "envoy.config.route.v3.RouteConfiguration"
CLUSTER_TYPE_URL = _TP + "envoy.config.cluster.v3.Cluster"
ENDPOINTS_TYPE_URL = _TP + "envoy.config.endpoint.v3.ClusterLoadAssignment"
RESOURCE_WRAPPER_TYPE_URL = _TP + "envoy.service.discovery.v3.Resource"


MEMO_MIN_BYTES = 16 * 1024
MEMO_MAX_ENTRIES = 256


@dataclass(frozen=True)
class ResourceType:
    """One xDS resource type: its type URL, short name and decoder.

    With ``memoize`` (EDS and RDS, whose validation depends only on their
    bytes), results for serialized resources of at least
    :data:`MEMO_MIN_BYTES` are remembered (the last :data:`MEMO_MAX_ENTRIES`),
    so a server re-sending a big unchanged resource (every stream restart
    does) costs a hash and a memcmp instead of a full validation.
    """

    type_url: str
    short_name: str
    all_resources_required_in_sotw: bool
    _decoder: Callable[..., tuple[str | None, Any, str | None]] = field(repr=False, compare=False)
    memoize: bool = False
    _memo: dict[bytes, DecodeResult] = field(default_factory=dict, repr=False, compare=False)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def decode(self, serialized: bytes, *, use_memo: bool = True) -> DecodeResult:
        """Parse and validate one serialized resource of this type."""
        memo = self._memo if (use_memo and self.memoize) else None
        if memo is not None and len(serialized) >= MEMO_MIN_BYTES:
            key = bytes(serialized)
            hit = memo.get(key)
            if hit is not None:
                return hit
            result = self._decode(key, True)
            with self._memo_lock:
                if len(memo) >= MEMO_MAX_ENTRIES:
                    memo.pop(next(iter(memo)), None)  # oldest first
                memo[key] = result
            return result
        return self._decode(serialized, use_memo)

    def _decode(self, serialized: bytes, use_memo: bool) -> DecodeResult:
        try:
            if self.memoize:
                name, resource, error = self._decoder(serialized, use_memo)
            else:
                name, resource, error = self._decoder(serialized)
        except Exception as err:  # bad input never crashes the client
            return DecodeResult(None, None, f"internal error decoding {self.short_name}: {err!r}")
        return DecodeResult(name, resource, error)

    def clear_memo(self) -> None:
        """Forget remembered results (tests; after changing supported extensions)."""
        with self._memo_lock:
            self._memo.clear()
        if self is ENDPOINTS:
            from pyxds.xds.resources.endpoints import clear_locality_memo

            clear_locality_memo()

    def decode_any(self, any_msg: Any) -> DecodeResult:
        """Decode a ``google.protobuf.Any`` (possibly wrapping a discovery ``Resource``)."""
        type_url = any_msg.type_url
        value = any_msg.value
        if type_url == RESOURCE_WRAPPER_TYPE_URL:
            from pyxds.xds import descriptors

            discovery_pb2 = descriptors.module("envoy.service.discovery.v3.discovery_pb2")
            wrapper = discovery_pb2.Resource()
            try:
                wrapper.ParseFromString(value)
            except Exception as err:
                return DecodeResult(None, None, f"could not parse Resource wrapper: {err}")
            if not wrapper.HasField("resource"):
                return DecodeResult(
                    wrapper.name or None, None, "resource: field not present in Resource wrapper"
                )
            type_url = wrapper.resource.type_url
            value = wrapper.resource.value
        if type_url != self.type_url:
            return DecodeResult(
                None, None, f"resource type {type_url!r} does not match {self.type_url!r}"
            )
        return self.decode(value)


LISTENER = ResourceType(LISTENER_TYPE_URL, "LDS", True, decode_listener)
ROUTE_CONFIG = ResourceType(
    ROUTE_CONFIG_TYPE_URL, "RDS", False, decode_route_configuration, memoize=True
)
CLUSTER = ResourceType(CLUSTER_TYPE_URL, "CDS", True, decode_cluster)
ENDPOINTS = ResourceType(
    ENDPOINTS_TYPE_URL, "EDS", False, decode_cluster_load_assignment, memoize=True
)

RESOURCE_TYPES: dict[str, ResourceType] = {
    rt.type_url: rt for rt in (LISTENER, ROUTE_CONFIG, CLUSTER, ENDPOINTS)
}


def decode_any(any_msg: Any) -> DecodeResult:
    """Decode an Any of any of the four types (dispatching on its type URL)."""
    type_url = any_msg.type_url
    if type_url == RESOURCE_WRAPPER_TYPE_URL:
        from pyxds.xds import descriptors

        discovery_pb2 = descriptors.module("envoy.service.discovery.v3.discovery_pb2")
        wrapper = discovery_pb2.Resource()
        try:
            wrapper.ParseFromString(any_msg.value)
        except Exception as err:
            return DecodeResult(None, None, f"could not parse Resource wrapper: {err}")
        type_url = wrapper.resource.type_url
    rt = RESOURCE_TYPES.get(type_url)
    if rt is None:
        return DecodeResult(None, None, f"unknown resource type {type_url!r}")
    return rt.decode_any(any_msg)


__all__ = [
    *_types_all,
    "LISTENER_TYPE_URL",
    "ROUTE_CONFIG_TYPE_URL",
    "CLUSTER_TYPE_URL",
    "ENDPOINTS_TYPE_URL",
    "RESOURCE_WRAPPER_TYPE_URL",
    "ResourceType",
    "LISTENER",
    "ROUTE_CONFIG",
    "CLUSTER",
    "ENDPOINTS",
    "RESOURCE_TYPES",
    "decode_any",
    "MEMO_MIN_BYTES",
    "MEMO_MAX_ENTRIES",
]
