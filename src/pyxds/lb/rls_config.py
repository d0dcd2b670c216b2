"""The ``rls_experimental`` policy's config and its gRPC key builders.

The config is ``{"routeLookupConfig": RouteLookupConfig (proto3 JSON of
grpc/lookup/v1/rls_config.proto), "routeLookupChannelServiceConfig": {...},
"childPolicy": [...], "childPolicyConfigTargetFieldName": "..."}``; the xDS
RouteLookupClusterSpecifier plugin produces it (C-core's JSON: child policy
``cds_experimental {"isDynamic": true}``, target field ``cluster``).  The
rules are C-core's (``RlsLbConfig`` in rls.cc), in its order, where the
proto comments leave room:

* ``routeLookupConfig`` (required object):

  - ``grpcKeybuilders`` (required, may be empty): each has ``names``
    (required, non-empty; each ``{"service", "method"?}``, ``service``
    required), ``headers`` (each ``{"key", "names"}``: key non-empty, names
    non-empty and each non-empty, ``requiredMatch`` must not be present),
    ``extraKeys`` (``host``/``service``/``method``: non-empty if set) and
    ``constantKeys`` (keys non-empty).  A key may appear once across
    headers, constant keys and extra keys; a ``/service/method`` path once
    across all builders (``duplicate entry for "/s/m"``).
  - ``lookupService`` (required): a valid gRPC target (a registered scheme
    whose URI is valid, else ``dns:///`` + the text; :func:`is_valid_target`).
  - ``lookupServiceTimeout``: default 10 s.  ``maxAge``: default 5 min,
    capped at 5 min unless ``staleAge`` is set.  ``staleAge``: default
    ``maxAge``; requires ``maxAge``; capped at 5 min, then clamped to
    ``maxAge`` (rls_config.proto; grpcio 1.85, grpc-go, grpc-java).  A
    zero ``lookupServiceTimeout`` or ``maxAge`` means unset (the proto's
    "If omitted or zero"; C-core takes zero literally:
    docs/differences-from-c-core.md).
  - ``cacheSizeBytes`` (required): > 0, capped at 5 MiB.
  - ``defaultTarget``: non-empty if set.  ``validTargets`` and
    ``httpKeybuilders`` are ignored (gRPC uses neither).

* ``routeLookupChannelServiceConfig``: a valid service config, used as the
  RLS channel's default service config.
* ``childPolicyConfigTargetFieldName`` (required, non-empty).
* ``childPolicy`` (required): each entry a one-key object whose config is an
  object; the target field is set in each (to ``defaultTarget``, else a
  placeholder) and the list is selected as a ``loadBalancingConfig`` list;
  only the chosen entry is kept.

Key builders (``KeyBuilderMap.build``, C-core ``BuildKeyMap``): the builder
for ``/service/method``, else for ``/service/``; none: an empty key map.
Each header key takes the first listed header present in the RPC's metadata
(several values joined with ``,``; ``-bin`` headers never; ``:path`` is the
RPC's path, as C-core's pick sees it among the request headers; other
pseudo-headers and the headers gRPC adds after the pick, ``user-agent``,
``content-type``, ``te``, are absent), then the constant keys, then
``host`` (the channel's authority), ``service`` and ``method`` extra keys.
C-core also shows ``grpc-timeout`` (the time left, re-encoded per call, so
useless as a key); pyxds does not (docs/differences-from-c-core.md).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import field
from typing import Any

from pyxds._values import dataclass
from pyxds.lb.errors import LBConfigError, decimal_string, describe, expect_duration, key_path
from pyxds.lb.registry import PolicySelection, select_policy

__all__ = [
    "DEFAULT_LOOKUP_SERVICE_TIMEOUT",
    "MAX_MAX_AGE",
    "MAX_CACHE_SIZE_BYTES",
    "KeyBuilder",
    "KeyBuilderMap",
    "RouteLookupConfig",
    "RlsConfig",
    "parse_rls_config",
    "is_valid_target",
    "child_policy_json",
    "make_key",
    "key_map",
]

DEFAULT_LOOKUP_SERVICE_TIMEOUT = 10.0
MAX_MAX_AGE = 300.0  # 5 minutes
MAX_CACHE_SIZE_BYTES = 5 * 1024 * 1024
#: C-core's placeholder target for validating the child policy config
#: when there is no default target.
FAKE_TARGET_FIELD_VALUE = "fake_target_field_value"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):(.*)$", re.DOTALL)
#: Resolver schemes grpcio 1.85's C-core registers (the RLS channel is a
#: grpcio channel); ``vsock`` is not among them (``vsock:x`` is a DNS name).
_CORE_SCHEMES = frozenset({"dns", "ipv4", "ipv6", "unix", "unix-abstract", "xds", "google-c2p"})

Key = str
"""A request key: the key map as text (:func:`make_key`), one object per
distinct key map so that pickers hash it once (str hashes are cached)."""


def make_key(pairs: Iterable[tuple[str, str]]) -> Key:
    """The request key of a key map (JSON of its pairs sorted by key)."""
    return json.dumps(sorted(pairs), separators=(",", ":"))


def key_map(key: Key) -> dict[str, str]:
    """The key map of a request key."""
    return {k: v for k, v in json.loads(key)}


# -- key builders -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyBuilder:
    """One ``GrpcKeyBuilder`` (for every path its ``names`` list)."""

    header_keys: tuple[tuple[str, tuple[str, ...]], ...] = ()
    constant_keys: tuple[tuple[str, str], ...] = ()
    host_key: str = ""
    service_key: str = ""
    method_key: str = ""


@dataclass(frozen=True)
class KeyBuilderMap:
    """``/service/method`` or ``/service/`` -> :class:`KeyBuilder`."""

    builders: tuple[tuple[str, KeyBuilder], ...] = ()
    _map: dict[str, KeyBuilder] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._map.update(self.builders)

    def build(self, path: str, metadata: Sequence[tuple[str, str | bytes]], host: str) -> Key:
        """The request key of an RPC (module docstring)."""
        builders = self._map
        builder = builders.get(path)
        slash = path.rfind("/")
        if builder is None:
            if slash < 0:
                return _EMPTY_KEY
            builder = builders.get(path[: slash + 1])
            if builder is None:
                return _EMPTY_KEY
        out: dict[str, str] = {}
        for key, names in builder.header_keys:
            for name in names:
                value = path if name == PATH_HEADER else _header_value(metadata, name)
                if value is not None:
                    out[key] = value
                    break
        for key, value in builder.constant_keys:
            out[key] = value
        if builder.host_key:
            out[builder.host_key] = host
        if builder.service_key:
            out[builder.service_key] = path[1:slash] if slash > 0 else ""
        if builder.method_key:
            out[builder.method_key] = path[slash + 1 :]
        return make_key(out.items())


_EMPTY_KEY = make_key(())
#: The one pseudo-header a key builder can read: C-core's pick sees the
#: request's ``:path`` among its headers (``:authority`` is not there yet).
PATH_HEADER = ":path"


def _header_value(metadata: Sequence[tuple[str, str | bytes]], name: str) -> str | None:
    """The metadata value(s) of ``name``, joined with ``,`` (None: absent).
    Binary (``-bin``) headers and pseudo-headers other than ``:path``
    (handled by the caller) are never used as keys."""
    if name.endswith("-bin") or name.startswith(":"):
        return None
    values = [v for k, v in metadata if k == name]
    if not values:
        return None
    text = [v.decode("latin-1") if isinstance(v, bytes) else v for v in values]
    return text[0] if len(text) == 1 else ",".join(text)


# -- the config -------------------------------------------------------------------


@dataclass(frozen=True)
class RouteLookupConfig:
    """A validated ``RouteLookupConfig`` (durations in seconds)."""

    key_builders: KeyBuilderMap
    lookup_service: str
    lookup_service_timeout: float = DEFAULT_LOOKUP_SERVICE_TIMEOUT
    max_age: float = MAX_MAX_AGE
    stale_age: float = MAX_MAX_AGE
    cache_size_bytes: int = 0
    default_target: str = ""


@dataclass(frozen=True)
class RlsConfig:
    """The parsed ``rls_experimental`` config.

    ``child_policy`` is the chosen child policy entry as JSON text
    (``[{"name": {config}}]``); :meth:`child_config` makes a target's.
    ``default_child`` is the default target's parsed child config.
    """

    route_lookup: RouteLookupConfig
    child_policy: str
    target_field: str
    channel_service_config: str | None = None
    default_child: PolicySelection | None = None

    def child_config(self, target: str) -> PolicySelection:
        """The child policy config of ``target`` (LBConfigError if the
        child policy rejects it: a bad target name from the RLS server)."""
        entries = json.loads(self.child_policy)
        for entry in entries:
            for config in entry.values():
                config[self.target_field] = target
        return select_policy(entries, "childPolicy")


def child_policy_json(child_policy: Any, target_field: str, target: str) -> list[Any]:
    """``childPolicy`` with ``target_field`` set to ``target`` in every
    entry (C-core ``InsertOrUpdateChildPolicyField``); LBConfigError for a
    malformed list."""
    if not isinstance(child_policy, list):
        raise LBConfigError("childPolicy", f"expected array, got {describe(child_policy)}")
    out = []
    for i, entry in enumerate(child_policy):
        path = f"childPolicy[{i}]"
        if not isinstance(entry, dict):
            raise LBConfigError(path, "is not an object")
        if len(entry) != 1:
            raise LBConfigError(path, "child policy object contains more than one field")
        ((name, config),) = entry.items()
        if not isinstance(config, dict):
            raise LBConfigError(key_path(path, name), "child policy config is not an object")
        out.append({name: {**config, target_field: target}})
    return out


def is_valid_target(target: str) -> bool:
    """Whether grpcio's C-core can build a channel for ``target``
    (``ResolverRegistry::IsValidTarget``): the target parsed as a URI whose
    scheme is registered, else ``dns:///`` + ``target``; then that scheme's
    resolver judges the URI (``IsValidUri``).  Rules measured against
    grpcio 1.85 (tests/e2e/test_differential_rls.py):

    * a URI parses unless its scheme is missing or malformed or its query
      (when there is a ``?``) is empty or its query or fragment has a
      character RFC 3986 does not allow there; authority and path are
      percent-decoded and never refused (spaces included);
    * ``dns``: the path without one leading ``/`` is non-empty;
    * ``xds``: the path is non-empty and does not end with ``/``;
    * ``google-c2p``: no authority;
    * ``ipv4``, ``ipv6``, ``unix``, ``unix-abstract``: no authority, and
      every non-empty comma-separated entry of the path is an address
      (``host:port`` with a port in [0, 65535]; a socket path of at most
      107 characters).  ``vsock`` is not registered in grpcio's build.
    """
    target = target.encode("utf-8", "surrogatepass").decode("latin-1")  # C-core counts bytes
    uri = _parse_uri(target)
    if uri is None or uri[0] not in _CORE_SCHEMES:
        uri = _parse_uri("dns:///" + target)
        if uri is None:
            return False
    scheme, authority, path = uri
    if scheme == "dns":
        return bool(path.removeprefix("/"))
    if scheme == "xds":
        return bool(path) and not path.endswith("/")
    if authority:
        return False
    if scheme == "google-c2p":
        return True
    parse = _ADDRESS_PARSERS[scheme]
    return all(parse(entry) for entry in path.split(",") if entry)


def _parse_uri(text: str) -> tuple[str, str, str] | None:
    """(lower-case scheme, authority, path) of ``text`` as C-core's
    ``URI::Parse`` reads it, or None where it fails."""
    match = _SCHEME.match(text)
    if match is None:
        return None
    scheme, rest = match.group(1), match.group(2)
    authority = ""
    if rest.startswith("//"):
        end = _first_of(rest, "/?#", 2)
        authority, rest = _percent_decode(rest[2:end]), rest[end:]
    end = _first_of(rest, "?#", 0)
    path, rest = _percent_decode(rest[:end]), rest[end:]
    if rest.startswith("?"):
        query, hash_, rest = rest[1:].partition("#")
        if not query or not _QUERY_OR_FRAGMENT.fullmatch(query):
            return None
        rest = hash_ + rest
    if rest.startswith("#") and not _QUERY_OR_FRAGMENT.fullmatch(rest[1:]):
        return None
    return scheme.lower(), authority, path


#: RFC 3986 query / fragment characters (and ``%``), as C-core checks them.
_QUERY_OR_FRAGMENT = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")


def _first_of(text: str, chars: str, start: int) -> int:
    found = [i for i in (text.find(c, start) for c in chars) if i >= 0]
    return min(found) if found else len(text)


def _percent_decode(text: str) -> str:
    """``%XY`` with two hex digits decoded, anything else kept (C-core)."""
    if "%" not in text:
        return text
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def _split_host_port(text: str) -> tuple[str, str] | None:
    """C-core's ``SplitHostPort``: (host, port), port "" when absent."""
    if text.startswith("["):
        close = text.find("]", 1)
        if close < 0:
            return None
        host, after = text[1:close], text[close + 1 :]
        if after and not after.startswith(":"):
            return None
        if ":" not in host:  # brackets are for IPv6 literals only
            return None
        return host, after[1:]
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, port
    return text, ""


_PORT = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _valid_port(port: str) -> bool:
    """``sscanf("%d")`` then 0..65535 (leading blanks and a sign allowed,
    anything after the digits ignored)."""
    match = _PORT.match(port)
    return match is not None and 0 <= int(match.group(1)) <= 65535


def _valid_ipv4(entry: str) -> bool:
    return _valid_host_port(entry, socket.AF_INET)


def _valid_ipv6(entry: str) -> bool:
    return _valid_host_port(entry, socket.AF_INET6)


def _valid_host_port(entry: str, family: socket.AddressFamily) -> bool:
    """C-core's ``grpc_parse_ipv4_hostport`` / ``grpc_parse_ipv6_hostport``:
    an address of ``family`` (IPv6: with an optional ``%zone``, a number or
    an interface name) and a port."""
    split = _split_host_port(entry.removeprefix("/"))
    if split is None:
        return False
    address, port = split
    if family is socket.AF_INET6 and "%" in address:
        address, _, zone = address.rpartition("%")
        if len(address) > _INET6_ADDRSTRLEN or not _valid_zone(zone):
            return False
    try:
        socket.inet_pton(family, address)
    except (OSError, ValueError):
        return False
    return bool(port) and _valid_port(port)


def _valid_zone(zone: str) -> bool:
    if zone.isascii() and zone.isdigit():
        return int(zone) < 2**32
    try:
        return socket.if_nametoindex(zone) != 0
    except (OSError, ValueError):
        return False


def _valid_socket_path(entry: str) -> bool:
    return len(entry) <= _MAX_SOCKET_PATH


_INET6_ADDRSTRLEN = 46
#: ``sizeof(sockaddr_un.sun_path) - 1`` on Linux.
_MAX_SOCKET_PATH = 107
_ADDRESS_PARSERS: dict[str, Callable[[str], bool]] = {
    "ipv4": _valid_ipv4,
    "ipv6": _valid_ipv6,
    "unix": _valid_socket_path,
    "unix-abstract": _valid_socket_path,
}


def parse_rls_config(json_config: Any) -> RlsConfig:
    """Validate an ``rls_experimental`` config (module docstring); raises
    :class:`LBConfigError` naming the JSON path."""
    if not isinstance(json_config, dict):
        raise LBConfigError("", f"expected object, got {describe(json_config)}")
    if "routeLookupConfig" not in json_config:
        raise LBConfigError("routeLookupConfig", "field not present")
    rlc = _route_lookup_config(json_config["routeLookupConfig"], "routeLookupConfig")
    service_config = None
    if "routeLookupChannelServiceConfig" in json_config:
        raw = json_config["routeLookupChannelServiceConfig"]
        from pyxds.resolver.service_config import parse_service_config

        try:
            service_config = parse_service_config(raw).json
        except ValueError as err:
            raise LBConfigError("routeLookupChannelServiceConfig", str(err)) from None
    name = json_config.get("childPolicyConfigTargetFieldName")
    if name is None:
        raise LBConfigError("childPolicyConfigTargetFieldName", "field not present")
    if not isinstance(name, str):
        raise LBConfigError("childPolicyConfigTargetFieldName", "is not a string")
    if not name:
        raise LBConfigError("childPolicyConfigTargetFieldName", "must be non-empty")
    if "childPolicy" not in json_config:
        raise LBConfigError("childPolicy", "field not present")
    target = rlc.default_target or FAKE_TARGET_FIELD_VALUE
    entries = child_policy_json(json_config["childPolicy"], name, target)
    selection = select_policy(entries, "childPolicy")
    chosen = next(e for e in entries if selection.name in e)
    return RlsConfig(
        route_lookup=rlc,
        child_policy=json.dumps([chosen], sort_keys=True),
        target_field=name,
        channel_service_config=service_config,
        default_child=selection if rlc.default_target else None,
    )


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LBConfigError(path, "is not an object")
    return value


def _string(obj: dict[str, Any], name: str, path: str, required: bool = False) -> str | None:
    if name not in obj or obj[name] is None:
        if required:
            raise LBConfigError(f"{path}.{name}", "field not present")
        return None
    value = obj[name]
    if not isinstance(value, str):
        raise LBConfigError(f"{path}.{name}", "is not a string")
    return value


def _list(obj: dict[str, Any], name: str, path: str, required: bool = False) -> list[Any] | None:
    if name not in obj or obj[name] is None:
        if required:
            raise LBConfigError(f"{path}.{name}", "field not present")
        return None
    value = obj[name]
    if not isinstance(value, list):
        raise LBConfigError(f"{path}.{name}", "is not an array")
    return value


def _int64(value: Any, path: str) -> int:
    """An int64 as proto3 JSON writes it: a number or a decimal string, read
    as grpcio 1.85 reads one (``1000``, ``"1000"``, ``" 1000"``, ``"+1000"``,
    ``"-5"``; not ``1000.0`` or ``1e3``, seen live)."""
    if isinstance(value, bool):
        raise LBConfigError(path, "is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        number = decimal_string(value)
        if number is not None:
            return number
        text = value.strip(" \t\n\v\f\r")
        if text[:1] == "-" and text[1:].isascii() and text[1:].isdigit():
            return -int(text[1:])
    raise LBConfigError(path, f"failed to parse number: {describe(value)}")


def _route_lookup_config(value: Any, path: str) -> RouteLookupConfig:
    obj = _object(value, path)
    builders = _key_builders(obj, path)
    lookup_service = _string(obj, "lookupService", path, required=True)
    assert lookup_service is not None
    if not is_valid_target(lookup_service):
        raise LBConfigError(f"{path}.lookupService", "must be valid gRPC target URI")
    timeout = DEFAULT_LOOKUP_SERVICE_TIMEOUT
    if obj.get("lookupServiceTimeout") is not None:
        timeout = expect_duration(obj["lookupServiceTimeout"], f"{path}.lookupServiceTimeout")
        timeout = timeout or DEFAULT_LOOKUP_SERVICE_TIMEOUT
    max_age = MAX_MAX_AGE
    has_max_age = obj.get("maxAge") is not None
    if has_max_age:
        max_age = expect_duration(obj["maxAge"], f"{path}.maxAge") or MAX_MAX_AGE
    stale_age = MAX_MAX_AGE
    if obj.get("staleAge") is not None:
        # rls_config.proto: staleAge is capped at 5 minutes, and then maxAge
        # is not (stale data is refreshed before it expires); grpcio 1.85
        stale_age = min(expect_duration(obj["staleAge"], f"{path}.staleAge"), MAX_MAX_AGE)
        if not has_max_age:
            raise LBConfigError(f"{path}.maxAge", "must be set if staleAge is set")
    else:
        max_age = min(max_age, MAX_MAX_AGE)
    stale_age = min(stale_age, max_age)
    if obj.get("cacheSizeBytes") is None:
        raise LBConfigError(f"{path}.cacheSizeBytes", "field not present")
    cache_size = _int64(obj["cacheSizeBytes"], f"{path}.cacheSizeBytes")
    if cache_size <= 0:
        raise LBConfigError(f"{path}.cacheSizeBytes", "must be greater than 0")
    cache_size = min(cache_size, MAX_CACHE_SIZE_BYTES)
    default_target = _string(obj, "defaultTarget", path)
    if default_target is not None and not default_target:
        raise LBConfigError(f"{path}.defaultTarget", "must be non-empty if set")
    return RouteLookupConfig(
        key_builders=builders,
        lookup_service=lookup_service,
        lookup_service_timeout=timeout,
        max_age=max_age,
        stale_age=stale_age,
        cache_size_bytes=cache_size,
        default_target=default_target or "",
    )


def _key_builders(obj: dict[str, Any], path: str) -> KeyBuilderMap:
    entries = _list(obj, "grpcKeybuilders", path, required=True)
    assert entries is not None
    by_path: dict[str, KeyBuilder] = {}
    for i, entry in enumerate(entries):
        p = f"{path}.grpcKeybuilders[{i}]"
        builder, names = _key_builder(_object(entry, p), p)
        for service, method in names:
            route = f"/{service}/{method}"
            if route in by_path:
                raise LBConfigError(p, f'duplicate entry for "{route}"')
            by_path[route] = builder
    return KeyBuilderMap(tuple(by_path.items()))


def _key_builder(obj: dict[str, Any], path: str) -> tuple[KeyBuilder, list[tuple[str, str]]]:
    names_json = _list(obj, "names", path, required=True)
    assert names_json is not None
    if not names_json:
        raise LBConfigError(f"{path}.names", "must be non-empty")
    names = []
    for i, name in enumerate(names_json):
        p = f"{path}.names[{i}]"
        name_obj = _object(name, p)
        service = _string(name_obj, "service", p, required=True)
        method = _string(name_obj, "method", p) or ""
        assert service is not None
        names.append((service, method))
    seen: set[str] = set()

    def claim(key: str, where: str) -> None:
        if key in seen:
            raise LBConfigError(where, f'duplicate key "{key}"')
        seen.add(key)

    header_keys = []
    for i, header in enumerate(_list(obj, "headers", path) or ()):
        p = f"{path}.headers[{i}]"
        hobj = _object(header, p)
        key = _string(hobj, "key", p, required=True)
        header_names = _list(hobj, "names", p, required=True)
        assert key is not None and header_names is not None
        if not key:
            raise LBConfigError(f"{p}.key", "must be non-empty")
        if not header_names:
            raise LBConfigError(f"{p}.names", "must be non-empty")
        for j, hname in enumerate(header_names):
            if not isinstance(hname, str):
                raise LBConfigError(f"{p}.names[{j}]", "is not a string")
            if not hname:
                raise LBConfigError(f"{p}.names[{j}]", "must be non-empty")
        if hobj.get("requiredMatch") is not None:
            raise LBConfigError(f"{p}.requiredMatch", "must not be present")
        claim(key, f"{p}.key")
        header_keys.append((key, tuple(header_names)))
    constant: dict[str, str] = {}
    if obj.get("constantKeys") is not None:
        cobj = _object(obj["constantKeys"], f"{path}.constantKeys")
        for key, value in cobj.items():
            where = key_path(f"{path}.constantKeys", key)
            if not isinstance(value, str):
                raise LBConfigError(where, "is not a string")
            if not key:
                raise LBConfigError(where, "key must be non-empty")
            claim(key, where)
            constant[key] = value
    extra = {"host": "", "service": "", "method": ""}
    if obj.get("extraKeys") is not None:
        eobj = _object(obj["extraKeys"], f"{path}.extraKeys")
        for which in ("host", "service", "method"):
            value = _string(eobj, which, f"{path}.extraKeys")
            if value is None:
                continue
            if not value:
                raise LBConfigError(f"{path}.extraKeys.{which}", "must be non-empty if set")
            claim(value, f"{path}.extraKeys.{which}")
            extra[which] = value
    builder = KeyBuilder(
        header_keys=tuple(header_keys),
        constant_keys=tuple(sorted(constant.items())),
        host_key=extra["host"],
        service_key=extra["service"],
        method_key=extra["method"],
    )
    return builder, names
