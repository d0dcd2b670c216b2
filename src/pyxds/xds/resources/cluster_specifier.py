"""Cluster specifier plugins of a RouteConfiguration (C-core's
``XdsClusterSpecifierPluginRegistry`` and ``ClusterSpecifierPluginParse``).

The one plugin gRPC implements is RLS: a ``grpc.lookup.v1.RouteLookupClusterSpecifier``
becomes the LB policy config of the cluster_manager child that the routes
naming the plugin go to (C-core's JSON)::

    [{"rls_experimental": {"routeLookupConfig": <route_lookup_config, proto3 JSON>,
                           "childPolicy": [{"cds_experimental": {"isDynamic": true}}],
                           "childPolicyConfigTargetFieldName": "cluster"}}]

Rules, per ``cluster_specifier_plugins[i]``:

* ``extension`` must be present; names must be unique (``duplicate name``).
* ``extension.typed_config`` must be present with a type URL.  An unknown
  type is an error unless ``is_optional`` (routes naming an optional
  unknown plugin are ignored).  A TypedStruct is not a RouteLookupClusterSpecifier
  (``could not parse plugin config``).
* RLS: the message must parse and have ``route_lookup_config``; the
  generated config must be valid for the ``rls_experimental`` policy
  (``ClusterSpecifierPlugin returned invalid LB policy config: ...``; the
  rules are :mod:`pyxds.lb.rls_config`'s: this module asks the LB registry,
  as C-core's parser does, hence its place among the xDS layer's allowed
  imports of ``pyxds.lb``).
* Plugins no route names are left out of the resource.

``GRPC_EXPERIMENTAL_XDS_RLS_LB``: as in grpcio's C-core, RLS is on unless
the variable says otherwise (``false``/``no``/``0``, or a value that is not a
boolean); when off, plugins are not parsed and routes naming one are ignored.
"""

from __future__ import annotations

import json
from typing import Any

from pyxds.xds.resources._common import (
    RLS_ENV,
    RLS_PLUGIN_TYPE,
    TYPED_STRUCT_TYPES,
    Errors,
    any_type,
    rls_enabled,
    typed_struct_inner_type,
)
from pyxds.xds.resources.types import ClusterSpecifierPlugin

__all__ = [
    "RLS_PLUGIN_TYPE",
    "RLS_ENV",
    "rls_enabled",
    "ParsedPlugins",
    "parse_cluster_specifier_plugins",
    "rls_lb_config",
]


class ParsedPlugins:
    """The plugins of one RouteConfiguration, for its routes.

    ``supported``: name -> plugin; ``optional_unsupported``: names whose
    routes are ignored; ``declared``: every name (also of plugins that had
    errors, so their routes add no second error)."""

    def __init__(self) -> None:
        self.supported: dict[str, ClusterSpecifierPlugin] = {}
        self.optional_unsupported: set[str] = set()
        self.declared: set[str] = set()


def parse_cluster_specifier_plugins(rc: Any, errs: Errors, pre: str) -> ParsedPlugins:
    """Validate ``rc.cluster_specifier_plugins`` (module docstring)."""
    out = ParsedPlugins()
    for i, csp in enumerate(rc.cluster_specifier_plugins):
        p = f"{pre}cluster_specifier_plugins[{i}].extension"
        if not csp.HasField("extension"):
            errs.add(p, "field not present")
            continue
        ext = csp.extension
        name = ext.name
        if name in out.declared:
            errs.add(f"{p}.name", f'duplicate name "{name}"')
        out.declared.add(name)
        if not ext.HasField("typed_config"):
            errs.add(f"{p}.typed_config", "field not present")
            continue
        # C-core's fields: the Any's type names the value (a TypedStruct's
        # named type too), except for the LB config's own verdict.
        tp = f"{p}.typed_config"
        tname = any_type(ext.typed_config.type_url, tp, errs)
        if tname is None:
            continue
        vp = f"{tp}.value[{tname}]"
        value: bytes | None = bytes(ext.typed_config.value)
        if tname in TYPED_STRUCT_TYPES:
            tname = typed_struct_inner_type(value or b"", vp, errs)
            if tname is None:
                continue
            vp, value = f"{vp}.value[{tname}]", None
        if tname != RLS_PLUGIN_TYPE:
            if csp.is_optional:
                out.optional_unsupported.add(name)
            else:
                errs.add(vp, "unsupported ClusterSpecifierPlugin type")
            continue
        lb_config = rls_lb_config(value, vp, errs, tp)
        if lb_config is not None:
            out.supported[name] = ClusterSpecifierPlugin(
                name, tname, value or b"", csp.is_optional, lb_config
            )
    return out


def rls_lb_config(
    value: bytes | None, path: str, errs: Errors, verdict_path: str | None = None
) -> str | None:
    """The ``rls_experimental`` config (JSON text) of a serialized
    RouteLookupClusterSpecifier, validated by the policy; None and an error
    when it is not usable.  ``path`` names the config, ``verdict_path`` (by
    default ``path``) the policy's verdict on it, as C-core's fields do."""
    from pyxds.lb.errors import LBConfigError
    from pyxds.lb.registry import select_policy
    from pyxds.protos import rls_config_pb2

    if value is None:
        errs.add(path, "could not parse plugin config")
        return None
    specifier = rls_config_pb2.RouteLookupClusterSpecifier()
    try:
        specifier.ParseFromString(value)
    except Exception:
        errs.add(path, "could not parse plugin config")
        return None
    if not specifier.HasField("route_lookup_config"):
        errs.add(f"{path}.route_lookup_config", "field not present")
        return None
    from google.protobuf import json_format  # with the first RLS plugin

    try:
        route_lookup = json_format.MessageToDict(specifier.route_lookup_config)
    except Exception as err:  # e.g. a Duration out of range
        errs.add(path, f"failed to dump proto to JSON: {err}")
        return None
    config = [
        {
            "rls_experimental": {
                "routeLookupConfig": route_lookup,
                "childPolicy": [{"cds_experimental": {"isDynamic": True}}],
                "childPolicyConfigTargetFieldName": "cluster",
            }
        }
    ]
    try:
        select_policy(config)
    except (LBConfigError, ValueError) as err:
        errs.add(
            verdict_path or path,
            f"ClusterSpecifierPlugin returned invalid LB policy config: {err}",
        )
        return None
    return json.dumps(config, sort_keys=True)
