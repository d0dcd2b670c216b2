"""The stateful session HTTP filter's configs (gRFC A55 "Listener and Route
Configuration through xDS"), validated as grpcio 1.85's C-core does.

* ``envoy.extensions.filters.http.stateful_session.v3.StatefulSession`` in a
  listener's ``http_filters``: ``session_state`` unset is a filter that does
  nothing; set, its ``typed_config`` must be a
  ``envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState``
  ("unsupported session state type" otherwise) with a ``cookie`` ("field
  not present") whose ``name`` is not empty; ``ttl`` a valid, non-negative
  duration (0 when unset); ``path`` as given ("" when unset: every path).
* ``...StatefulSessionPerRoute`` in ``typed_per_filter_config`` (the only
  override type: a StatefulSession there is an "unsupported filter type",
  as in C-core): ``disabled``, or a ``stateful_session`` validated as above;
  neither is a filter that does nothing on that route.
* A config that does not parse, or comes as a TypedStruct (it has no
  protobuf bytes), is an error ("could not parse stateful session filter
  [override ]config").

Errors name the field the way C-core does
(``...typed_config.value[<type>].session_state.typed_config.value[<type>].cookie.name``).
The parsed form is a frozen :class:`CookieConfig`; a filter that does
nothing has an empty ``name``.
"""

from __future__ import annotations

from typing import Any

from pyxds._values import dataclass
from pyxds.xds.resources._common import (
    STATEFUL_SESSION_PER_ROUTE_TYPE,
    STATEFUL_SESSION_TYPE,
    TYPED_STRUCT_TYPES,
    Errors,
    duration,
    type_name,
)

__all__ = [
    "STATEFUL_SESSION_TYPE",
    "STATEFUL_SESSION_PER_ROUTE_TYPE",
    "COOKIE_SESSION_STATE_TYPE",
    "CookieConfig",
    "DISABLED",
    "parse_stateful_session",
    "parse_stateful_session_per_route",
]

COOKIE_SESSION_STATE_TYPE = (
    "envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState"
)


@dataclass(frozen=True, slots=True)
class CookieConfig:
    """The session cookie: its ``name`` ("" = the filter does nothing),
    ``path`` ("" = every path) and ``ttl`` in seconds (0 = no Max-Age)."""

    name: str = ""
    path: str = ""
    ttl: float = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.name)


DISABLED = CookieConfig()


def _session_state(message: Any, path: str, errs: Errors) -> CookieConfig:
    """C-core's ParseCookieConfig over a StatefulSession message."""
    if not message.HasField("session_state"):
        return DISABLED
    p = f"{path}.session_state.typed_config"
    state = message.session_state
    if not state.HasField("typed_config"):
        errs.add(p, "field not present")
        return DISABLED
    any_msg = state.typed_config
    tname = type_name(any_msg.type_url)
    value: bytes | None = any_msg.value
    if tname in TYPED_STRUCT_TYPES:
        from xds.type.v3 import typed_struct_pb2

        ts = typed_struct_pb2.TypedStruct()
        try:
            ts.ParseFromString(any_msg.value)
        except Exception:
            errs.add(f"{p}.value[{tname}]", "could not parse TypedStruct")
            return DISABLED
        p = f"{p}.value[{tname}]"
        tname = type_name(ts.type_url)
        value = None  # JSON, not protobuf bytes
    p = f"{p}.value[{tname}]"
    if tname != COOKIE_SESSION_STATE_TYPE:
        errs.add(p, "unsupported session state type")
        return DISABLED
    if value is None:
        errs.add(p, "could not parse session state config")
        return DISABLED
    from envoy.extensions.http.stateful_session.cookie.v3 import cookie_pb2

    cookie_state = cookie_pb2.CookieBasedSessionState()
    try:
        cookie_state.ParseFromString(value)
    except Exception:
        errs.add(p, "could not parse session state config")
        return DISABLED
    if not cookie_state.HasField("cookie"):
        errs.add(f"{p}.cookie", "field not present")
        return DISABLED
    cookie = cookie_state.cookie
    ok = True
    if not cookie.name:
        errs.add(f"{p}.cookie.name", "field not present")
        ok = False
    ttl = 0.0
    if cookie.HasField("ttl"):
        parsed = duration(cookie.ttl, f"{p}.cookie.ttl", errs)
        if parsed is None:
            ok = False
        else:
            ttl = parsed
    if not ok:
        return DISABLED
    return CookieConfig(cookie.name, cookie.path, ttl)


def _parsed(message: Any, value: bytes | None, path: str, errs: Errors, what: str) -> bool:
    """Parse ``value`` (None: a TypedStruct, which has no protobuf bytes)
    into ``message``; False, with C-core's error at ``path``, if it fails."""
    try:
        if value is None:
            raise ValueError("TypedStruct")
        message.ParseFromString(value)
    except Exception:
        errs.add(path, f"could not parse stateful session filter {what}")
        return False
    return True


def parse_stateful_session(value: bytes | None, path: str, errs: Errors) -> CookieConfig:
    """A listener's StatefulSession (``value``: its bytes, None for a
    TypedStruct); ``path`` names its ``typed_config``."""
    from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2

    p = f"{path}.value[{STATEFUL_SESSION_TYPE}]"
    message = stateful_session_pb2.StatefulSession()
    if not _parsed(message, value, p, errs, "config"):
        return DISABLED
    return _session_state(message, p, errs)


def parse_stateful_session_per_route(value: bytes | None, path: str, errs: Errors) -> CookieConfig:
    """A StatefulSessionPerRoute override (``value`` None for a TypedStruct);
    ``path`` names the override's Any."""
    from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2

    p = f"{path}.value[{STATEFUL_SESSION_PER_ROUTE_TYPE}]"
    message = stateful_session_pb2.StatefulSessionPerRoute()
    if not _parsed(message, value, p, errs, "override config"):
        return DISABLED
    if message.disabled or not message.HasField("stateful_session"):
        return DISABLED
    return _session_state(message.stateful_session, f"{p}.stateful_session", errs)


def _bytes_of(any_msg: Any) -> bytes | None:
    return None if type_name(any_msg.type_url) in TYPED_STRUCT_TYPES else bytes(any_msg.value)


def validate_top_level(any_msg: Any, path: str, errs: Errors) -> bool:
    """The LDS validator of a listener's StatefulSession (declared to it by
    :mod:`pyxds.xds.resources._common`, which loads this module with the
    first config naming the filter)."""
    n = len(errs)
    parse_stateful_session(_bytes_of(any_msg), _typed_struct_path(any_msg, path), errs)
    return len(errs) == n


def validate_override(any_msg: Any, path: str, errs: Errors) -> bool:
    """The RDS validator of a StatefulSessionPerRoute override."""
    n = len(errs)
    parse_stateful_session_per_route(_bytes_of(any_msg), _typed_struct_path(any_msg, path), errs)
    return len(errs) == n


def _typed_struct_path(any_msg: Any, path: str) -> str:
    tname = type_name(any_msg.type_url)
    return f"{path}.value[{tname}]" if tname in TYPED_STRUCT_TYPES else path
