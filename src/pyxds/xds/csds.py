"""CSDS data: the XdsClient's cache as an ``envoy.service.status.v3.ClientConfig``
(gRFC A40, with A88's cache entry states).

:func:`client_config` builds a JSON-able dict with the proto field names of
``ClientConfig``::

    {"node": {...},
     "generic_xds_configs": [
        {"type_url": ..., "name": ..., "version_info": ...,
         "xds_config": {"@type": ..., ...},          # omitted without a resource
         "last_updated": "2026-01-02T03:04:05.000Z", # omitted before any update
         "client_status": "REQUESTED" | "DOES_NOT_EXIST" | "ACKED" | "NACKED"
                          | "RECEIVED_ERROR" | "TIMEOUT",
         "error_state": {"details": ..., "version_info": ...,
                         "last_update_attempt": ...},    # NACKs, and below
         "xds_server": "host:port",    # A71: the server it came from (not in the proto)
         "serving": {"address": ..., "serving": ..., "error": ...}},
                                       # an xDS-enabled server's use of a Listener
                                       # (A36; not in the proto)
        ...]}

A Listener an xDS-enabled server does not serve for a reason of its own (a
Listener for another address, TLS the port cannot give, missing
certificates) has that reason in ``error_state`` when the resource itself
has none, so CSDS clients (grpcdebug, ``pyxds inspect``) show why; its
``client_status`` stays what the XdsClient says (ACKED).

:func:`client_config_proto` turns that dict into the real proto (for a CSDS
service or for checking the shape).
"""

from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Iterable
from typing import Any

from envoy.config.core.v3 import base_pb2
from google.protobuf import any_pb2

from pyxds.xds.ads_state import EntrySnapshot


def rfc3339(seconds: float) -> str:
    """A wall-clock time as a protobuf Timestamp's JSON string (UTC, ms)."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def any_to_json(raw: any_pb2.Any) -> dict[str, Any]:
    """The JSON form of a resource; opaque bytes when its type is unknown here."""
    from google.protobuf import json_format  # with the first dump (start-up)

    try:
        return json_format.MessageToDict(raw, preserving_proto_field_name=True)
    except (TypeError, KeyError, json_format.Error):
        return {"@type": raw.type_url, "value": base64.b64encode(raw.value).decode("ascii")}


def generic_xds_config(entry: EntrySnapshot) -> dict[str, Any]:
    """One ``ClientConfig.GenericXdsConfig`` as a dict."""
    out: dict[str, Any] = {
        "type_url": entry.type_url,
        "name": entry.name,
        "version_info": entry.version_info,
    }
    if entry.raw is not None:
        out["xds_config"] = any_to_json(entry.raw)
    if entry.last_updated is not None:
        out["last_updated"] = rfc3339(entry.last_updated)
    out["client_status"] = entry.state.value
    if entry.error_state is not None:
        out["error_state"] = {
            "details": entry.error_state.details,
            "version_info": entry.error_state.version_info,
            "last_update_attempt": rfc3339(entry.error_state.last_update_attempt),
        }
    if entry.server is not None:
        out["xds_server"] = entry.server
    return out


def client_config(node: base_pb2.Node | None, entries: Iterable[EntrySnapshot]) -> dict[str, Any]:
    """The whole ``ClientConfig`` dict, entries sorted by (type_url, name)."""
    from google.protobuf import json_format

    configs = [generic_xds_config(e) for e in sorted(entries, key=lambda e: (e.type_url, e.name))]
    out: dict[str, Any] = {}
    if node is not None:
        out["node"] = json_format.MessageToDict(node, preserving_proto_field_name=True)
    out["generic_xds_configs"] = configs
    return out


def add_serving_notes(config: dict[str, Any], notes: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Add xDS-enabled servers' notes to a :func:`client_config` dict."""
    import time

    for entry in config.get("generic_xds_configs", []):
        note = notes.get((entry.get("type_url", ""), entry.get("name", "")))
        if note is None:
            continue
        entry["serving"] = {k: v for k, v in note.items() if k != "since"}
        if not note.get("serving") and note.get("error") and "error_state" not in entry:
            entry["error_state"] = {
                "details": f"xDS server not serving on {note.get('address')}: {note['error']}",
                "version_info": entry.get("version_info", ""),
                "last_update_attempt": rfc3339(note.get("since", time.time())),
            }


def client_config_proto(config: dict[str, Any]) -> Any:
    """Parse a :func:`client_config` dict into ``envoy.service.status.v3.ClientConfig``."""
    from envoy.service.status.v3 import csds_pb2
    from google.protobuf import json_format

    config = dict(config)
    config["generic_xds_configs"] = [
        {k: v for k, v in c.items() if k not in ("xds_server", "serving")}
        for c in config.get("generic_xds_configs", [])
    ]
    # a resource :func:`any_to_json` left opaque (it names a type this
    # process never loaded, such as the router filter's) goes in as its
    # bytes: protobuf's JSON parser cannot read it back
    raw = {}
    for i, entry in enumerate(config["generic_xds_configs"]):
        opaque = _opaque_any(entry.get("xds_config"))
        if opaque is not None:
            raw[i] = opaque
            config["generic_xds_configs"][i] = {k: v for k, v in entry.items() if k != "xds_config"}
    out = json_format.ParseDict(config, csds_pb2.ClientConfig(), ignore_unknown_fields=False)
    for i, opaque in raw.items():
        out.generic_xds_configs[i].xds_config.CopyFrom(opaque)
    return out


def _opaque_any(value: Any) -> any_pb2.Any | None:
    """The Any of :func:`any_to_json`'s opaque form, else None."""
    if not isinstance(value, dict) or value.keys() != {"@type", "value"}:
        return None
    type_url, data = value["@type"], value["value"]
    if not isinstance(data, str) or type_url.startswith("type.googleapis.com/google.protobuf."):
        return None  # a well-known type's JSON has a "value" too
    try:
        return any_pb2.Any(type_url=type_url, value=base64.b64decode(data, validate=True))
    except binascii.Error:
        return None
