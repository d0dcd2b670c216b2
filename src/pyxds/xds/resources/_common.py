"""Helpers shared by the resource decoders: errors with field paths, durations,
Any unwrapping, RE2 compilation.

Validation collects every problem it finds (as C-core does) into an
:class:`Errors` list of ``"<field path>: <problem>"`` strings; a resource with
any error is rejected (NACKed) with all of them joined by ``"; "``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import Message

if TYPE_CHECKING:  # RE2 loads with the first regex a resource names
    import re2

_M = TypeVar("_M", bound=Message)

TYPE_PREFIX = "type.googleapis.com/"
TYPED_STRUCT_TYPES = frozenset({"xds.type.v3.TypedStruct", "udpa.type.v1.TypedStruct"})
MAX_DURATION_SECONDS = 315_576_000_000
ROUTER_FILTER_TYPE = "envoy.extensions.filters.http.router.v3.Router"
FAULT_FILTER_TYPE = "envoy.extensions.filters.http.fault.v3.HTTPFault"
FILTER_CONFIG_TYPE = "envoy.config.route.v3.FilterConfig"
#: prefix of the config type of a ``filter_overrides`` entry that came in a
#: ``FilterConfig`` with ``disabled: true`` (its config kept: see
#: :func:`effective_override`)
DISABLED_PREFIX = "disabled:"

#: the A55 stateful session filter's config types (listener; override)
STATEFUL_SESSION_TYPE = "envoy.extensions.filters.http.stateful_session.v3.StatefulSession"
STATEFUL_SESSION_PER_ROUTE_TYPE = (
    "envoy.extensions.filters.http.stateful_session.v3.StatefulSessionPerRoute"
)
# Client HTTP filter config types this client accepts in a listener's
# http_filters (A39): type name -> is terminal.
HTTP_FILTER_TYPES: dict[str, bool] = {
    ROUTER_FILTER_TYPE: True,
    FAULT_FILTER_TYPE: False,
    STATEFUL_SESSION_TYPE: False,
}
# The config types accepted in typed_per_filter_config (RDS): a filter's own
# type (the fault filter) or its per-route type (StatefulSessionPerRoute; a
# StatefulSession there is an unsupported filter type, as in C-core).
FILTER_OVERRIDE_TYPES: set[str] = {FAULT_FILTER_TYPE, STATEFUL_SESSION_PER_ROUTE_TYPE}
# type name -> validator(Any, path of the Any, errors) -> valid; the Any may
# be a TypedStruct naming the type (then it has no protobuf bytes).
FilterValidator = Callable[[Any, str, "Errors"], bool]


def _stateful_session(name: str) -> FilterValidator:
    """The A55 filter's validator ``name`` in
    :mod:`pyxds.xds.resources.stateful_session`, which loads with the first
    config naming the filter (issue 18, start-up)."""

    def validate(any_msg: Any, path: str, errs: Errors) -> bool:
        from pyxds.xds.resources import stateful_session

        validator: FilterValidator = getattr(stateful_session, name)
        return validator(any_msg, path, errs)

    return validate


FILTER_VALIDATORS: dict[str, FilterValidator] = {
    STATEFUL_SESSION_TYPE: _stateful_session("validate_top_level"),
    STATEFUL_SESSION_PER_ROUTE_TYPE: _stateful_session("validate_override"),
}
#: the one cluster specifier plugin gRPC implements (A28, RLS), and the
#: variable that turns it off (:func:`rls_enabled`).  Here, not in
#: ``cluster_specifier``: every RDS parse asks, and that module loads only
#: with a RouteConfiguration that declares a plugin (issue 18, start-up)
RLS_PLUGIN_TYPE = "grpc.lookup.v1.RouteLookupClusterSpecifier"
RLS_ENV = "GRPC_EXPERIMENTAL_XDS_RLS_LB"
_TRUE = frozenset({"true", "yes", "1"})


def rls_enabled() -> bool:
    """C-core's ``XdsRlsEnabled()``: unset is on; a value must parse as true."""
    value = os.environ.get(RLS_ENV)
    if value is None:
        return True
    return value.strip().lower() in _TRUE


RBAC_FILTER_TYPE = "envoy.extensions.filters.http.rbac.v3.RBAC"
RBAC_PER_ROUTE_TYPE = "envoy.extensions.filters.http.rbac.v3.RBACPerRoute"
# Filter config types xDS-enabled servers accept in ``http_filters`` (A36,
# A41): type name -> is terminal.  RDS overrides of the RBAC filter
# (``RBACPerRoute``; its top-level ``RBAC`` type is no override, A39 and
# C-core: "unsupported filter type") are validated for every
# RouteConfiguration: RDS does not know whether a client or a server reads it.
SERVER_HTTP_FILTER_TYPES: dict[str, bool] = {ROUTER_FILTER_TYPE: True, RBAC_FILTER_TYPE: False}
RBAC_OVERRIDE_TYPES = frozenset({RBAC_PER_ROUTE_TYPE})

#: RE2's options (logging off; case-sensitive or not), made with the first regex
_RE2_OPTIONS: dict[bool, re2.Options] = {}


class Errors(list[str]):
    """A list of ``"path: problem"`` strings."""

    def add(self, path: str, problem: str) -> None:
        self.append(f"{path}: {problem}" if path else problem)

    def text(self) -> str:
        return "; ".join(self)


def type_name(type_url: str) -> str:
    """The message type name of a type URL (the part after the last ``/``)."""
    return type_url.rpartition("/")[2]


def _type_url_problem(type_url: str) -> str | None:
    """What is wrong with an Any's ``type_url`` in C-core's words
    (ExtractXdsExtension): missing, or no type after a last ``/``."""
    if not type_url:
        return "field not present"
    pos = type_url.rfind("/")
    if pos < 0 or pos == len(type_url) - 1:
        return f'invalid value "{type_url}"'
    return None


def valid_type_url(type_url: str, path: str, errs: Errors) -> bool:
    """An extension's type URL must name a type after its last ``/``; else
    an error at ``path`` (the ``.type_url`` field) in C-core's words
    (ExtractXdsExtension)."""
    problem = _type_url_problem(type_url)
    if problem is not None:
        errs.add(path, problem)
    return problem is None


def any_type(type_url: str, path: str, errs: Errors) -> str | None:
    """The type an Any (at ``path``) names, checked as C-core's
    ExtractXdsExtension does: a missing ``type_url`` is an error and None; one
    without a ``/`` or ending in one is an error, and the whole text is the
    type (so it names no known type)."""
    problem = _type_url_problem(type_url)
    if problem is not None:
        errs.add(f"{path}.type_url", problem)
        return type_url or None
    return type_url[type_url.rfind("/") + 1 :]


def typed_struct_inner_type(value: bytes, path: str, errs: Errors) -> str | None:
    """The type a serialized TypedStruct (the value of the Any at ``path``,
    named ``...value[<TypedStruct type>]``) names, checked as C-core's
    ExtractXdsExtension does; None (and an error) when it cannot say."""
    from xds.type.v3 import typed_struct_pb2

    ts = typed_struct_pb2.TypedStruct()
    try:
        ts.ParseFromString(value)
    except Exception:  # google.protobuf.message.DecodeError
        errs.add(path, "could not parse")
        return None
    return any_type(ts.type_url, path, errs)


def duration(d: Any, path: str, errs: Errors) -> float | None:
    """A google.protobuf.Duration as seconds, validated as C-core does."""
    seconds = d.seconds
    nanos = d.nanos
    ok = True
    if not 0 <= seconds <= MAX_DURATION_SECONDS:
        errs.add(f"{path}.seconds", f"value must be in the range [0, {MAX_DURATION_SECONDS}]")
        ok = False
    if not 0 <= nanos <= 999_999_999:
        errs.add(f"{path}.nanos", "value must be in the range [0, 999999999]")
        ok = False
    return seconds + nanos / 1e9 if ok else None


def re2_compile(pattern: str, case_sensitive: bool = True) -> tuple[re2._Regexp | None, str]:
    """Compile with RE2 (never Python's ``re``): (regex, "") or (None, RE2's
    own words for the problem, e.g. ``missing ]: [``)."""
    import re2

    options = _RE2_OPTIONS.get(case_sensitive)
    if options is None:
        options = re2.Options()
        options.log_errors = False
        options.case_sensitive = case_sensitive
        _RE2_OPTIONS[case_sensitive] = options
    try:
        return re2.compile(pattern, options), ""
    except Exception as err:  # re2.error
        detail = err.args[0] if err.args else err
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        return None, str(detail)


def compile_regex(
    pattern: str, path: str, errs: Errors, case_sensitive: bool = True
) -> re2._Regexp | None:
    """Compile with RE2 (never Python's ``re``); an error names ``path``."""
    rx, detail = re2_compile(pattern, case_sensitive)
    if rx is None:
        errs.add(path, f"invalid regex {pattern!r}: {detail}")
    return rx


def config_source_is_ads_or_self(cs: Any) -> bool:
    """True when a ConfigSource says ``ads`` or ``self`` (A27)."""
    return cs.WhichOneof("config_source_specifier") in ("ads", "self")


def unpack(any_msg: Any, message_cls: type[_M], path: str, errs: Errors) -> _M | None:
    """Parse ``any_msg.value`` as ``message_cls``; None (and an error) if it fails."""
    msg = message_cls()
    try:
        msg.ParseFromString(any_msg.value)
    except Exception as err:  # google.protobuf.message.DecodeError
        errs.add(path, f"could not parse {message_cls.DESCRIPTOR.full_name}: {err}")
        return None
    return msg


def valid_fault_config(any_msg: Any, path: str, errs: Errors) -> bool:
    """An HTTPFault config (A33) must parse, abort with a gRPC status code
    gRPC has and use valid durations (C-core 1.85's checks; an unknown
    percentage denominator is HUNDRED).  A TypedStruct form is not looked
    into."""
    if type_name(any_msg.type_url) != FAULT_FILTER_TYPE:
        return True
    from envoy.extensions.filters.http.fault.v3 import fault_pb2

    fault = fault_pb2.HTTPFault()
    try:
        fault.ParseFromString(any_msg.value)
    except Exception:  # google.protobuf.message.DecodeError
        errs.add(path, "could not parse fault injection filter config")  # C-core's words
        return False
    # An unknown percentage denominator is read as HUNDRED (C-core 1.85
    # accepts it; pyxds.resolver.fault_filter).
    ok = True
    if fault.HasField("abort") and fault.abort.WhichOneof("error_type") == "grpc_status":
        status = fault.abort.grpc_status
        if not 0 <= status <= 16:  # C-core's grpc_status_code_from_int
            errs.add(f"{path}.abort.grpc_status", f"invalid gRPC status code: {status}")
            ok = False
    delay = fault.delay
    if (
        fault.HasField("delay")
        and delay.HasField("fixed_delay")
        and duration(delay.fixed_delay, f"{path}.delay.fixed_delay", errs) is None
    ):
        ok = False
    return ok


def typed_struct_type(value: bytes) -> str | None:
    """The type a serialized TypedStruct names (its ``type_url`` without the
    prefix), or None when the bytes do not parse."""
    from xds.type.v3 import typed_struct_pb2

    ts = typed_struct_pb2.TypedStruct()
    try:
        ts.ParseFromString(value)
    except Exception:  # google.protobuf.message.DecodeError
        return None
    return type_name(ts.type_url)


def validate_filter_config(tname: str, any_msg: Any, path: str, errs: Errors) -> bool:
    """Run the registered validator of config type ``tname`` (if any)."""
    validator = FILTER_VALIDATORS.get(tname)
    return True if validator is None else validator(any_msg, path, errs)


def filter_overrides(overrides: Any) -> tuple[tuple[str, str, bytes], ...]:
    """A validated ``typed_per_filter_config`` map as (filter name, config
    type, config bytes), sorted by name: a ``FilterConfig`` wrapper and a
    TypedStruct are unwrapped (a TypedStruct's bytes are not the typed
    config: kept as empty, the filter's default config); types this client
    does not know (optional ones) are left out.

    A ``FilterConfig`` with ``disabled: true`` around a config is
    ``(name, DISABLED_PREFIX + type, config)`` (read by
    :func:`effective_override`, on clients and servers)."""
    out = []
    for key, any_msg in overrides.items():
        tname = type_name(any_msg.type_url)
        disabled = False
        if tname == FILTER_CONFIG_TYPE:
            from pyxds.xds import descriptors

            route_components_pb2 = descriptors.module("envoy.config.route.v3.route_components_pb2")
            fc = route_components_pb2.FilterConfig()
            fc.ParseFromString(any_msg.value)
            disabled = fc.disabled
            any_msg = fc.config
            tname = type_name(any_msg.type_url)
        value = any_msg.value
        if tname in TYPED_STRUCT_TYPES:
            from xds.type.v3 import typed_struct_pb2

            ts = typed_struct_pb2.TypedStruct()
            ts.ParseFromString(value)
            tname, value = type_name(ts.type_url), b""
        if tname in FILTER_OVERRIDE_TYPES or tname in RBAC_OVERRIDE_TYPES:
            out.append((key, DISABLED_PREFIX + tname if disabled else tname, bytes(value)))
    return tuple(sorted(out))


def effective_override(
    name: str,
    levels: Sequence[Sequence[tuple[str, str, bytes]]],
    override_types: tuple[str, ...],
    disabled_in_listener: bool,
) -> tuple[bool, tuple[str, bytes] | None]:
    """Whether the HTTP filter instance ``name`` runs on a route, and the
    (type, config) override it runs with (None: its listener config).
    ``levels``: the ``filter_overrides`` from least to most specific
    (virtual host, route, weighted cluster).

    A39 "Filter Config Overrides": the most specific override of the
    instance's name applies.  A39 names neither ``disabled`` flag nor an
    entry of another filter's type under the name; C-core 1.85 (measured
    live, client and server alike: tests/e2e/test_differential_http_filters.py,
    test_differential_server_http_filters.py):

    * the most specific entry of the name, of whatever type, decides
      whether the filter runs: a disabled ``FilterConfig`` turns it off; any
      other entry turns on a filter disabled in the listener; with no entry
      the listener's ``disabled`` stands;
    * the config is that of the most specific entry of one of the filter's
      ``override_types``, a disabled wrapper's config included; entries of
      other types are passed over; none: the listener's config.
    """
    top: str | None = None
    config: tuple[str, bytes] | None = None
    for level in reversed(levels):
        for key, type_url, value in level:
            if key != name:
                continue
            if top is None:
                top = type_url
            inner = type_url.removeprefix(DISABLED_PREFIX)
            if config is None and inner in override_types:
                config = (inner, value)
    if top is None:
        return not disabled_in_listener, None
    if top.startswith(DISABLED_PREFIX):
        return False, None
    return True, config


def check_filter_overrides(overrides: Any, path: str, errs: Errors) -> None:
    """Validate a ``typed_per_filter_config`` map as C-core 1.85 does (A39):
    a non-empty key; the config (possibly in a ``FilterConfig`` wrapper,
    whose ``is_optional`` applies, or a TypedStruct) of an override type a
    filter registers, else "unsupported filter type" unless optional (a
    filter's top-level type, the router's included, is no override type);
    errors name each Any's type as C-core's fields do."""
    for key, any_msg in overrides.items():
        p = f"{path}[{key}]"
        if not key:
            errs.add(p, "filter name must be non-empty")
        tname = any_type(any_msg.type_url, p, errs)
        if tname is None:
            continue
        # C-core's field: the key, then each Any's type (a FilterConfig's
        # ``.config``, a TypedStruct's named type) down to the config.
        vp = f"{p}.value[{tname}]"
        optional = False
        if tname == FILTER_CONFIG_TYPE:
            from pyxds.xds import descriptors

            route_components_pb2 = descriptors.module("envoy.config.route.v3.route_components_pb2")
            fc = route_components_pb2.FilterConfig()
            try:
                fc.ParseFromString(any_msg.value)
            except Exception:  # google.protobuf.message.DecodeError
                errs.add(vp, "could not parse FilterConfig")
                continue
            optional = fc.is_optional
            any_msg = fc.config
            vp = f"{vp}.config"
            if not fc.HasField("config"):
                errs.add(vp, "field not present")
                continue
            tname = any_type(any_msg.type_url, vp, errs)
            if tname is None:
                continue
            vp = f"{vp}.value[{tname}]"
        wrapper = tname
        if tname in TYPED_STRUCT_TYPES:
            tname = typed_struct_inner_type(any_msg.value, vp, errs)
            if tname is None:
                continue
            vp = f"{vp}.value[{tname}]"
        if tname == FILTER_CONFIG_TYPE:
            # A FilterConfig wrapper inside a TypedStruct: JSON, which
            # C-core cannot read as the wrapper.
            errs.add(vp, "could not parse FilterConfig")
        elif tname in RBAC_OVERRIDE_TYPES:
            from pyxds.xds.resources.rbac import parse_rbac_override

            if wrapper in TYPED_STRUCT_TYPES:
                errs.add(vp, "could not parse RBACPerRoute")
            else:
                parse_rbac_override(any_msg.value, vp, errs)
        elif tname not in FILTER_OVERRIDE_TYPES:
            # C-core 1.85 looks overrides up among override types only: a
            # filter's top-level type (the router's too) is as unknown as
            # any other, passed over when optional.
            if not optional:
                errs.add(vp, "unsupported filter type")
        elif tname == FAULT_FILTER_TYPE:
            if wrapper in TYPED_STRUCT_TYPES:  # JSON, not HTTPFault's bytes
                errs.add(vp, "could not parse fault injection filter config")
            else:
                valid_fault_config(any_msg, vp, errs)
        else:
            validate_filter_config(tname, any_msg, p, errs)
