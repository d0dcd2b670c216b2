"""CSDS data: the XdsClient's cache as an ``envoy.service.status.v3.ClientConfig``
(gRFC A40, with A88's cache entry states).

:func:`client_config` builds a JSON-able dict with the proto field names of
``ClientConfig``::

    {"node": {...},
     "generic_xds_configs": [
        {"type_url": ..., "name": ...,
         "version_info": ...,                        # "" without a resource
         "xds_config": {"@type": ..., ...},          # omitted without a resource
         "last_updated": "2026-01-02T03:04:05.000Z", # omitted without a resource
         "client_status": "REQUESTED" | "DOES_NOT_EXIST" | "ACKED" | "NACKED"
                          | "RECEIVED_ERROR" | "TIMEOUT",
         "error_state": {"details": ..., "version_info": ...,
                         "last_update_attempt": ...},
                         # the entry's error (A88): NACKs, server errors,
                         # deletions; a timer's has only "details"
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

from pyxds.xds.ads_state import CacheState, EntrySnapshot


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


class GenericEntry(dict[str, Any]):
    """A ``GenericXdsConfig`` dict that also holds the resource as it was
    received (``raw``, not part of the dict): :func:`client_config_proto`
    puts those bytes in ``xds_config``, since the JSON form loses what this
    process's protos do not know (fields of a newer xDS API) and need not
    serialize the way the server did (A40 "Expose xDS Config As Is")."""

    raw: any_pb2.Any | None = None


def generic_xds_config(entry: EntrySnapshot) -> dict[str, Any]:
    """One ``ClientConfig.GenericXdsConfig`` as a dict (a :class:`GenericEntry`)."""
    out = GenericEntry(
        type_url=entry.type_url,
        name=entry.name,
        version_info=entry.version_info,
    )
    out.raw = entry.raw
    # The version and time are those of the cached resource: none without
    # one (REQUESTED, a deleted or dropped resource), as C-core and grpc-java.
    if entry.raw is not None:
        out["xds_config"] = any_to_json(entry.raw)
        if entry.last_updated is not None:
            out["last_updated"] = rfc3339(entry.last_updated)
    else:
        out["version_info"] = ""
    out["client_status"] = entry.state.value
    error = entry.error_state
    if error is not None:
        # A88 "Cache Entry States": the entry's error; a timer's has no
        # version or time (C-core writes neither then).
        details = error.details
        if entry.state is CacheState.NACKED:
            details = f"invalid resource: {details}"  # as C-core frames a NACK's
        out["error_state"] = {"details": details}
        if error.version_info and error.last_update_attempt is not None:
            out["error_state"]["version_info"] = error.version_info
            out["error_state"]["last_update_attempt"] = rfc3339(error.last_update_attempt)
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

    entries = list(config.get("generic_xds_configs", []))
    config = dict(config)
    config["generic_xds_configs"] = [
        {k: v for k, v in c.items() if k not in ("xds_server", "serving")} for c in entries
    ]
    # The resource goes in as the bytes it was received as (A40 "Expose xDS
    # Config As Is", as C-core): the JSON form drops fields this process's
    # protos do not know.  Without them (a dict made elsewhere), a resource
    # :func:`any_to_json` left opaque (it names a type this process never
    # loaded, such as the router filter's) goes in as its bytes: protobuf's
    # JSON parser cannot read it back.
    raw = {}
    for i, entry in enumerate(config["generic_xds_configs"]):
        if "xds_config" not in entry:
            continue  # none, or exclude_resource_contents dropped it
        received = getattr(entries[i], "raw", None)
        opaque = received if received is not None else _opaque_any(entry["xds_config"])
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
