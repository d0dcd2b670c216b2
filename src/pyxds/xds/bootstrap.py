"""The xDS bootstrap config (A27 "XdsClient and Bootstrap File", A47 federation,
A53/A88 server features), loaded into frozen, hashable values.

Where it comes from (:func:`load_bootstrap`):

* an explicit source: a dict, JSON text (a string whose first non-blank
  character is ``{``), or a path (``str`` or ``os.PathLike``) to a JSON file;
* else the file named by ``GRPC_XDS_BOOTSTRAP``;
* else the inline JSON in ``GRPC_XDS_BOOTSTRAP_CONFIG``.

Every problem is reported in one :class:`BootstrapError` whose message names
the source (file path or environment variable) and each offending field, e.g.
``bootstrap file /etc/xds.json: xds_servers[0].server_uri: field not present``.
Unknown fields are ignored (A27).

Channel credentials: the first supported entry of ``channel_creds`` wins
(``insecure`` or ``tls``; ``google_default`` and others are skipped); a
server with none supported is an error.

Listener names (:func:`listener_resource_name`) follow A47: the target's
authority picks a template from ``authorities`` (default
``xdstp://<authority>/envoy.config.listener.v3.Listener/%s``), no authority
uses ``client_default_listener_resource_name_template`` (default ``%s``), and
the service name is percent-encoded when the template is an ``xdstp:`` name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import field
from typing import Any, Union, overload

from pyxds import _json, _uri
from pyxds._values import dataclass
from pyxds.xds.resources.types import LocalityName

__all__ = [
    "BootstrapError",
    "Bootstrap",
    "XdsServerConfig",
    "Node",
    "Locality",
    "Authority",
    "FrozenJson",
    "load_bootstrap",
    "parse_bootstrap",
    "listener_resource_name",
    "SUPPORTED_CHANNEL_CREDS",
    "CLIENT_FEATURES",
]

ENV_BOOTSTRAP_FILE = "GRPC_XDS_BOOTSTRAP"
ENV_BOOTSTRAP_CONFIG = "GRPC_XDS_BOOTSTRAP_CONFIG"
SUPPORTED_CHANNEL_CREDS = ("insecure", "tls")
CERTIFICATE_PROVIDER_PLUGINS = frozenset({"file_watcher"})
"""Certificate provider plugins gRPC knows (C-core rejects a bootstrap naming another)."""
CLIENT_FEATURES = ("envoy.lb.does_not_support_overprovisioning", "xds.config.resource-in-sotw")
XDSTP_LISTENER_TEMPLATE = "xdstp://{authority}/envoy.config.listener.v3.Listener/%s"

# The bootstrap node's locality is the same (region, zone, sub_zone) value
# that EDS localities use.
Locality = LocalityName


class BootstrapError(ValueError):
    """A missing or malformed bootstrap; the message names the source and field."""


class FrozenJson(Mapping[str, Any]):
    """An immutable, hashable JSON object (nested objects frozen, arrays as tuples)."""

    __slots__ = ("_d", "_h")

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._d = {k: _freeze(v) for k, v in (data or {}).items()}
        self._h: int | None = None

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(tuple(sorted(self._d.items())))
        return self._h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenJson):
            return self._d == other._d
        if isinstance(other, Mapping):
            return self._d == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenJson({self._d!r})"

    def to_json(self) -> dict[str, Any]:
        """A plain, mutable copy (dicts and lists)."""
        return {k: _thaw(v) for k, v in self._d.items()}


def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping) and not isinstance(v, FrozenJson):
        return FrozenJson(v)
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def _thaw(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _thaw(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


_EMPTY = FrozenJson()


@dataclass(frozen=True)
class XdsServerConfig:
    """One entry of ``xds_servers``."""

    server_uri: str
    channel_creds_type: str = "insecure"
    channel_creds_config: Mapping[str, Any] = field(default_factory=FrozenJson)
    server_features: tuple[str, ...] = ()

    @property
    def ignore_resource_deletion(self) -> bool:
        """A53's server feature (A88 deprecates it: data errors are ambient anyway)."""
        return "ignore_resource_deletion" in self.server_features

    @property
    def fail_on_data_errors(self) -> bool:
        """A88: drop cached resources on data errors (deletion, NOT_FOUND...)."""
        return "fail_on_data_errors" in self.server_features

    @property
    def resource_timer_is_transient_error(self) -> bool:
        """A88: the resource timer is 30 s and reports UNAVAILABLE / TIMEOUT."""
        return "resource_timer_is_transient_error" in self.server_features

    @property
    def trusted_xds_server(self) -> bool:
        """A81 "Server Feature in Bootstrap Config": the server may rewrite the
        ``:authority`` of RPCs (its routes' ``auto_host_rewrite`` is read)."""
        return "trusted_xds_server" in self.server_features


@dataclass(frozen=True)
class Node:
    """The bootstrap ``node`` (an envoy.config.core.v3.Node in JSON form)."""

    id: str = ""
    cluster: str = ""
    locality: LocalityName | None = None
    metadata: Mapping[str, Any] = field(default_factory=FrozenJson)
    user_agent_name: str = "pyxds"
    user_agent_version: str = ""

    def to_proto(self) -> Any:
        """The ``envoy.config.core.v3.Node`` sent on the first ADS request."""
        from pyxds._version import __version__
        from pyxds.xds import descriptors

        base_pb2 = descriptors.module("envoy.config.core.v3.base_pb2")

        node = base_pb2.Node(
            id=self.id,
            cluster=self.cluster,
            user_agent_name=self.user_agent_name,
            user_agent_version=self.user_agent_version or __version__,
            client_features=list(CLIENT_FEATURES),
        )
        if self.locality is not None:
            node.locality.region = self.locality.region
            node.locality.zone = self.locality.zone
            node.locality.sub_zone = self.locality.sub_zone
        if self.metadata:
            node.metadata.update(_thaw(self.metadata))
        return node


@dataclass(frozen=True)
class Authority:
    """One entry of ``authorities`` (A47); empty ``xds_servers`` means the top-level ones."""

    client_listener_resource_name_template: str
    xds_servers: tuple[XdsServerConfig, ...] = ()


@dataclass(frozen=True)
class Bootstrap:
    """A validated bootstrap config."""

    xds_servers: tuple[XdsServerConfig, ...]
    node: Node = field(default_factory=Node)
    authorities: Mapping[str, Authority] = field(default_factory=FrozenJson)
    client_default_listener_resource_name_template: str = "%s"
    certificate_providers: Mapping[str, Any] = field(default_factory=FrozenJson)
    server_listener_resource_name_template: str | None = None

    def servers_for(self, authority: str | None) -> tuple[XdsServerConfig, ...]:
        """The xDS servers for a resource's authority (None: the old-style names).

        Raises :class:`LookupError` for an authority not in ``authorities``.
        """
        if authority is None:
            return self.xds_servers
        entry = self.authorities.get(authority)
        if entry is None:
            raise LookupError(f'authority "{authority}" not present in bootstrap config')
        return entry.xds_servers or self.xds_servers


#: What a channel's ``bootstrap`` argument may be: a file path, JSON text, a
#: dict, or None (the environment: ``GRPC_XDS_BOOTSTRAP`` /
#: ``GRPC_XDS_BOOTSTRAP_CONFIG``, as grpcio); see :func:`load_bootstrap`.
BootstrapSource = Union[str, "os.PathLike[str]", Mapping[str, Any], None]


# --------------------------------------------------------------------------- loading


def load_bootstrap(source: BootstrapSource = None) -> Bootstrap:
    """Load and validate a bootstrap from ``source`` or the environment."""
    if isinstance(source, Mapping):
        return parse_bootstrap(source, "bootstrap config")
    if isinstance(source, os.PathLike):
        return _load_file(os.fspath(source), f"bootstrap file {os.fspath(source)}")
    if isinstance(source, str):
        if source.lstrip().startswith("{"):
            return _load_text(source, "bootstrap config")
        return _load_file(source, f"bootstrap file {source}")
    if source is not None:
        raise BootstrapError(
            f"bootstrap: expected a path, a dict or JSON text, got {type(source).__name__}"
        )
    path = os.environ.get(ENV_BOOTSTRAP_FILE)
    if path:
        return _load_file(path, f"{ENV_BOOTSTRAP_FILE}={path}")
    text = os.environ.get(ENV_BOOTSTRAP_CONFIG)
    if text:
        return _load_text(text, ENV_BOOTSTRAP_CONFIG)
    raise BootstrapError(
        f"Environment variables {ENV_BOOTSTRAP_FILE} or {ENV_BOOTSTRAP_CONFIG} not defined"
    )


def _load_file(path: str, origin: str) -> Bootstrap:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise BootstrapError(f"{origin}: cannot read file: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise BootstrapError(f"{origin}: not UTF-8 JSON: byte {err.start}: {err.reason}") from None
    return _load_text(text, origin)


def _load_text(text: str, origin: str) -> Bootstrap:
    try:
        data = _json.loads(text)
    except ValueError as err:
        raise BootstrapError(f"{origin}: invalid JSON: {err}") from None
    return parse_bootstrap(data, origin)


class _Errs(list[str]):
    def add(self, path: str, problem: str) -> None:
        self.append(f"{path}: {problem}")


def _type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(v), type(v).__name__)


@overload
def _get(
    obj: Mapping[str, Any],
    key: str,
    kind: type[str],
    path: str,
    errs: _Errs,
    required: bool = False,
) -> str | None: ...
@overload
def _get(
    obj: Mapping[str, Any],
    key: str,
    kind: type[list[Any]],
    path: str,
    errs: _Errs,
    required: bool = False,
) -> list[Any] | None: ...
@overload
def _get(
    obj: Mapping[str, Any],
    key: str,
    kind: type[dict[str, Any]],
    path: str,
    errs: _Errs,
    required: bool = False,
) -> Mapping[str, Any] | None: ...
def _get(
    obj: Mapping[str, Any],
    key: str,
    kind: type,
    path: str,
    errs: _Errs,
    required: bool = False,
) -> Any:
    """``obj[key]`` when it is a ``kind`` (a JSON string, array or object);
    else None, and an error when present or required."""
    if key not in obj:
        if required:
            errs.add(path, "field not present")
        return None
    v = obj[key]
    if kind is str and not isinstance(v, str):
        errs.add(path, f"is not a string (got {_type(v)})")
        return None
    if kind is list and not isinstance(v, list):
        errs.add(path, f"is not an array (got {_type(v)})")
        return None
    if kind is dict and not isinstance(v, Mapping):
        errs.add(path, f"is not an object (got {_type(v)})")
        return None
    return v


def parse_bootstrap(data: Any, origin: str = "bootstrap config") -> Bootstrap:
    """Validate bootstrap JSON (already decoded); ``origin`` prefixes error messages."""
    errs = _Errs()
    if not isinstance(data, Mapping):
        raise BootstrapError(f"{origin}: top level is not an object (got {_type(data)})")
    servers = _parse_servers(data, "xds_servers", errs, required=True)
    node = _parse_node(data, errs)
    template = _get(
        data,
        "client_default_listener_resource_name_template",
        str,
        "client_default_listener_resource_name_template",
        errs,
    )
    server_template = _get(
        data,
        "server_listener_resource_name_template",
        str,
        "server_listener_resource_name_template",
        errs,
    )
    authorities = _parse_authorities(data, errs)
    providers = _parse_certificate_providers(data, errs)
    if errs:
        raise BootstrapError(f"{origin}: " + "; ".join(errs))
    return Bootstrap(
        xds_servers=servers,
        node=node,
        authorities=authorities,
        client_default_listener_resource_name_template=template if template is not None else "%s",
        certificate_providers=providers,
        server_listener_resource_name_template=server_template,
    )


def _parse_servers(
    obj: Mapping[str, Any], path: str, errs: _Errs, required: bool
) -> tuple[XdsServerConfig, ...]:
    raw = _get(obj, "xds_servers", list, path, errs, required=required)
    if raw is None:
        return ()
    if required and not raw:
        errs.add(path, "must be non-empty")
    out = []
    for i, s in enumerate(raw):
        p = f"{path}[{i}]"
        if not isinstance(s, Mapping):
            errs.add(p, f"is not an object (got {_type(s)})")
            continue
        uri = _get(s, "server_uri", str, f"{p}.server_uri", errs, required=True)
        if uri == "":
            errs.add(f"{p}.server_uri", "must be non-empty")
        creds = _get(s, "channel_creds", list, f"{p}.channel_creds", errs, required=True)
        creds_type = creds_config = None
        if creds is not None:
            for ci, c in enumerate(creds):
                cp = f"{p}.channel_creds[{ci}]"
                if not isinstance(c, Mapping):
                    errs.add(cp, f"is not an object (got {_type(c)})")
                    continue
                ctype = _get(c, "type", str, f"{cp}.type", errs, required=True)
                cconfig = _get(c, "config", dict, f"{cp}.config", errs)
                if ctype in SUPPORTED_CHANNEL_CREDS and creds_type is None:
                    creds_type, creds_config = ctype, cconfig or {}
            if creds_type is None:
                errs.add(f"{p}.channel_creds", "no known creds type found")
        features = _get(s, "server_features", list, f"{p}.server_features", errs) or []
        for fi, f in enumerate(features):
            if not isinstance(f, str):  # C-core loads a set of strings
                errs.add(f"{p}.server_features[{fi}]", f"is not a string (got {_type(f)})")
        feats = tuple(f for f in features if isinstance(f, str))
        if uri and creds_type:
            out.append(XdsServerConfig(uri, creds_type, FrozenJson(creds_config), feats))
    return tuple(out)


def _parse_node(data: Mapping[str, Any], errs: _Errs) -> Node:
    raw = _get(data, "node", dict, "node", errs)
    if raw is None:
        return Node()
    node_id = _get(raw, "id", str, "node.id", errs) or ""
    cluster = _get(raw, "cluster", str, "node.cluster", errs) or ""
    locality = None
    loc = _get(raw, "locality", dict, "node.locality", errs)
    if loc is not None:
        parts = [
            _get(loc, key, str, f"node.locality.{key}", errs) or ""
            for key in ("region", "zone", "sub_zone")
        ]
        locality = LocalityName(*parts)
    metadata = _get(raw, "metadata", dict, "node.metadata", errs) or {}
    return Node(node_id, cluster, locality, FrozenJson(metadata))


def _parse_authorities(data: Mapping[str, Any], errs: _Errs) -> FrozenJson:
    raw = _get(data, "authorities", dict, "authorities", errs)
    if raw is None:
        return _EMPTY
    out: dict[str, Authority] = {}
    for name, a in raw.items():
        p = f"authorities[{json.dumps(name)}]"
        if not isinstance(a, Mapping):
            errs.add(p, f"is not an object (got {_type(a)})")
            continue
        template = _get(
            a,
            "client_listener_resource_name_template",
            str,
            f"{p}.client_listener_resource_name_template",
            errs,
        )
        if not template:  # absent or "": A47's default, authority percent-encoded
            template = XDSTP_LISTENER_TEMPLATE.format(
                authority=_uri.quote(name, safe=_AUTHORITY_SAFE)
            )
        elif not template.startswith(f"xdstp://{name}/"):
            errs.add(
                f"{p}.client_listener_resource_name_template",
                f'field must begin with "xdstp://{name}/"',
            )
        servers = _parse_servers(a, f"{p}.xds_servers", errs, required=False)
        out[name] = Authority(template, servers)
    return _FrozenMap(out)


class _FrozenMap(FrozenJson):
    """A FrozenJson whose values are already immutable (no re-freezing)."""

    __slots__ = ()

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._d = dict(data)
        self._h = None


def _parse_certificate_providers(data: Mapping[str, Any], errs: _Errs) -> FrozenJson:
    raw = _get(data, "certificate_providers", dict, "certificate_providers", errs)
    if raw is None:
        return _EMPTY
    for name, prov in raw.items():
        p = f"certificate_providers[{json.dumps(name)}]"
        if not isinstance(prov, Mapping):
            errs.add(p, f"is not an object (got {_type(prov)})")
            continue
        plugin = _get(prov, "plugin_name", str, f"{p}.plugin_name", errs, required=True)
        if plugin is not None and plugin not in CERTIFICATE_PROVIDER_PLUGINS:
            errs.add(f"{p}.plugin_name", f"Unrecognized plugin name: {plugin}")  # C-core
        config = _get(prov, "config", dict, f"{p}.config", errs)
        if plugin == "file_watcher":
            from pyxds.security.providers import validate_file_watcher_config

            for problem in validate_file_watcher_config(config or {}, f"{p}.config"):
                path, _, text = problem.partition(": ")
                errs.add(path, text)
    return FrozenJson(raw)


# --------------------------------------------------------------------------- names

# Characters kept as-is when percent-encoding a service name into an xdstp
# path (RFC 3986 pchar plus "/"), as gRPC's URI path encoding does.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"
# ... and an authority (RFC 3986 reg-name plus ":" and "@" ... as userinfo/port).
_AUTHORITY_SAFE = ":@!$&'()*+,;=-._~[]"


def listener_resource_name(
    bootstrap: Bootstrap, target_authority: str | None, service_name: str
) -> str:
    """The LDS resource name for a channel target (A47).

    ``target_authority`` is the authority of the ``xds:`` target URI (None or
    "" for ``xds:///name``).  Raises :class:`LookupError` when the authority
    is not in the bootstrap's ``authorities``.
    """
    if target_authority:
        entry = bootstrap.authorities.get(target_authority)
        if entry is None:
            raise LookupError(f'authority "{target_authority}" not present in bootstrap config')
        template = entry.client_listener_resource_name_template
    else:
        template = bootstrap.client_default_listener_resource_name_template
    if template.startswith("xdstp:"):
        service_name = _uri.quote(service_name, safe=_PATH_SAFE)
    return template.replace("%s", service_name)
