"""Resource files: Envoy's JSON form of xDS resources, in YAML or JSON.

A file is either a list of resources or a mapping with a ``resources`` list
(and optionally a ``version``). Each resource is an object whose ``"@type"`` is
the v3 type URL of a Listener, RouteConfiguration, Cluster or
ClusterLoadAssignment; the rest is the message in protobuf's JSON mapping,
parsed with ``google.protobuf.json_format`` (nested ``Any`` values, such as the
HttpConnectionManager inside a Listener, carry their own ``"@type"``).

Example (YAML)::

    version: "1"
    resources:
    - "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
      name: backend
      type: EDS
      edsClusterConfig: {edsConfig: {ads: {}, resourceApiVersion: V3}}
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

from google.protobuf import json_format

from pyxds._values import dataclass
from pyxds.server.file_lines import field_path, locate
from pyxds.server.lint import Entry
from pyxds.server.snapshot import Snapshot
from pyxds.server.types import CLUSTER_LOAD_ASSIGNMENT, FIELD_OF_TYPE, resource_name

# Messages that appear inside Any fields of the resources gRPC understands; importing
# them registers them in the default descriptor pool so json_format can resolve "@type".
_ANY_MODULES = (
    "envoy.config.listener.v3.listener_pb2",
    "envoy.config.route.v3.route_pb2",
    "envoy.config.cluster.v3.cluster_pb2",
    "envoy.config.endpoint.v3.endpoint_pb2",
    "envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2",
    "envoy.extensions.filters.http.router.v3.router_pb2",
    "envoy.extensions.filters.http.fault.v3.fault_pb2",
    "envoy.extensions.filters.http.rbac.v3.rbac_pb2",
    "envoy.extensions.filters.http.stateful_session.v3.stateful_session_pb2",
    "envoy.extensions.filters.http.gcp_authn.v3.gcp_authn_pb2",
    "envoy.extensions.clusters.aggregate.v3.cluster_pb2",
    "envoy.extensions.load_balancing_policies.round_robin.v3.round_robin_pb2",
    "envoy.extensions.load_balancing_policies.pick_first.v3.pick_first_pb2",
    "envoy.extensions.load_balancing_policies.wrr_locality.v3.wrr_locality_pb2",
    "envoy.extensions.load_balancing_policies.ring_hash.v3.ring_hash_pb2",
    "envoy.extensions.load_balancing_policies.least_request.v3.least_request_pb2",
    "envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3.client_side_weighted_round_robin_pb2",
    "envoy.extensions.transport_sockets.tls.v3.tls_pb2",
    "envoy.extensions.upstreams.http.v3.http_protocol_options_pb2",
    "xds.type.v3.typed_struct_pb2",
    "pyxds.protos.rls_config_pb2",
    "udpa.type.v1.typed_struct_pb2",
)


def register_any_types() -> None:
    """Import the envoy modules whose messages may sit inside an Any (idempotent)."""
    for name in _ANY_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # an older xds-protos without this extension
            pass


class ResourceFileError(ValueError):
    """A resource file could not be read; the message names the file and the entry.

    ``index`` is the failing entry of ``resources`` and ``field`` the field path
    inside it (when known); :func:`load_resources` adds the line number.
    """

    def __init__(self, message: str, index: int | None = None, field: list[str] | None = None):
        super().__init__(message)
        self.index = index
        self.field = field


def _parse_text(text: str, path: str) -> Any:
    if path.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ResourceFileError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        problem = getattr(e, "problem", None) or str(e).split("\n", 1)[0]
        context = getattr(e, "context", None)
        detail = f"{context}: {problem}" if context else problem
        raise ResourceFileError(f"{where}: invalid YAML: {detail}") from None


def parse_resources(
    data: Any,
    source: str = "<resources>",
    validate: bool = False,
    entries: list[Entry] | None = None,
) -> Snapshot:
    """Build a Snapshot from already-decoded JSON/YAML ``data`` (see module doc).

    With ``validate`` every resource must also pass the checks a gRPC client
    applies (pyxds's own resource validation, gRFC A27/A28/...), so a file a
    client would NACK is refused before it is served.  ``entries`` (if given)
    receives each resource with its place in the file, for the lint.
    """
    from google.protobuf import descriptor_pool, message_factory

    register_any_types()
    version = None
    if data is None:
        raise ResourceFileError(f"{source}: empty file: expected a list of resources")
    if isinstance(data, dict):
        if "resources" not in data:
            raise ResourceFileError(f"{source}: expected a list or a mapping with 'resources'")
        unknown = sorted(str(k) for k in data if k not in ("resources", "version"))
        if unknown:
            raise ResourceFileError(
                f"{source}: unknown key {unknown[0]!r}: expected 'resources' and 'version'"
            )
        version = data.get("version")
        if version is not None and (
            isinstance(version, bool) or not isinstance(version, str | int)
        ):
            raise ResourceFileError(f"{source}: version: expected a string, got {version!r}")
        version = None if version is None else str(version)
        data = data["resources"]
    if not isinstance(data, list):
        raise ResourceFileError(f"{source}: resources: expected a list, got {type(data).__name__}")
    by_type: dict[str, list[Any]] = {field: [] for field in FIELD_OF_TYPE.values()}
    seen: dict[tuple[str, str], int] = {}
    pool = descriptor_pool.Default()  # the pool of symbol_database.Default()
    for i, entry in enumerate(data):
        where = f"{source}: resources[{i}]"
        if not isinstance(entry, dict):
            raise ResourceFileError(
                f"{where}: expected an object, got {type(entry).__name__}", index=i
            )
        type_url = entry.get("@type")
        if type_url not in FIELD_OF_TYPE:
            raise ResourceFileError(
                f"{where}: @type: expected one of {', '.join(FIELD_OF_TYPE)}, got {type_url!r}",
                index=i,
                field=["@type"],
            )
        descriptor = pool.FindMessageTypeByName(type_url.rsplit("/", 1)[1])
        cls = message_factory.GetMessageClass(descriptor)
        body = {k: v for k, v in entry.items() if k != "@type"}
        try:
            msg = json_format.ParseDict(body, cls())
        except json_format.ParseError as e:
            path, reason = field_path(str(e))
            dotted = "".join("." + p for p in path)
            raise ResourceFileError(f"{where}{dotted}: {reason}", index=i, field=path) from None
        # Clients subscribe by name: a nameless resource could never be asked for.
        name = resource_name(type_url, msg)
        name_field = "clusterName" if type_url == CLUSTER_LOAD_ASSIGNMENT else "name"
        if not name:
            raise ResourceFileError(
                f"{where}: {name_field}: missing (resources are named)", index=i
            )
        if (type_url, name) in seen:
            raise ResourceFileError(
                f"{where}: {name_field}: duplicate resource name {name!r} "
                f"(also resources[{seen[type_url, name]}])",
                index=i,
                field=[name_field],
            )
        if validate:
            problem = validation_error(type_url, msg)
            if problem is not None:
                raise ResourceFileError(
                    f"{where} ({name}): {problem} (a gRPC client would NACK it)", index=i
                )
        seen[type_url, name] = i
        by_type[FIELD_OF_TYPE[type_url]].append(msg)
        if entries is not None:
            entries.append(Entry(source, i, type_url, msg))
    try:
        return Snapshot(version=version, **by_type)
    except (TypeError, ValueError) as e:
        raise ResourceFileError(f"{source}: {e}") from None


def validation_error(type_url: str, resource: Any) -> str | None:
    """Why a gRPC client would reject ``resource`` (pyxds's validation), or None."""
    from pyxds.xds.resources import RESOURCE_TYPES

    kind = RESOURCE_TYPES.get(type_url)
    if kind is None:
        return None
    return kind.decode(resource.SerializeToString(), use_memo=False).error


def load_resources(path: str | os.PathLike[str], validate: bool = False) -> Snapshot:
    """Read a YAML (``.yaml``/``.yml``/other) or JSON (``.json``) resource file.

    Errors name the file, the line and the field: ``r.yaml:14: resources[2].type: ...``.
    """
    return read_resource_file(path, validate).snapshot


@dataclass(frozen=True)
class ResourceFile:
    """A loaded resource file: its text, its Snapshot and its resources in order."""

    path: str
    text: str
    snapshot: Snapshot
    entries: tuple[Entry, ...]


def read_resource_file(path: str | os.PathLike[str], validate: bool = False) -> ResourceFile:
    """:func:`load_resources`, keeping the text and the entries (for the lint)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ResourceFileError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ResourceFileError(f"{path}: not UTF-8 text: byte {e.start}: {e.reason}") from None
    entries: list[Entry] = []
    try:
        snapshot = parse_resources(_parse_text(text, path), path, validate, entries)
        return ResourceFile(path, text, snapshot, tuple(entries))
    except ResourceFileError as e:
        line = locate(text, e.index, e.field) if e.index is not None else None
        if line is None:
            raise
        message = str(e).replace(f"{path}: ", f"{path}:{line}: ", 1)
        raise ResourceFileError(message, e.index, e.field) from None


def merge_snapshots(snapshots: list[tuple[str, Snapshot]]) -> Snapshot:
    """One Snapshot of several files' resources; a name defined twice is an error.

    The version is the files' explicit versions joined with ``+`` (None when
    no file has one, so the server numbers versions itself).
    """
    if len(snapshots) == 1:
        return snapshots[0][1]
    merged: dict[str, dict[str, Any]] = {field: {} for field in FIELD_OF_TYPE.values()}
    owner: dict[tuple[str, str], str] = {}
    versions = []
    for source, snapshot in snapshots:
        if snapshot.version is not None:
            versions.append(snapshot.version)
        for type_url, field in FIELD_OF_TYPE.items():
            for name, resource in snapshot.resources(type_url).items():
                if (type_url, name) in owner:
                    raise ResourceFileError(
                        f"{source}: resource {name!r} ({type_url.rsplit('.', 1)[1]}) "
                        f"is also defined in {owner[type_url, name]}"
                    )
                owner[type_url, name] = source
                merged[field][name] = resource
    return Snapshot(version="+".join(versions) if versions else None, **merged)


def dump_resources(snapshot: Snapshot) -> dict[str, Any]:
    """The inverse of parse_resources: a ``{"version", "resources"}`` dict in JSON form."""
    resources = []
    for type_url in FIELD_OF_TYPE:
        for resource in snapshot.resources(type_url).values():
            body = json_format.MessageToDict(resource)
            resources.append({"@type": type_url, **body})
    out: dict[str, Any] = {"resources": resources}
    if snapshot.version is not None:
        out["version"] = snapshot.version
    return out
