"""The stateful session filter on the client call path (gRFC A55
"StatefulSessionFilter Processing", A60 "StatefulSessionFilter Changes"),
an A39 filter, with C-core's cookie (stateful_session_filter.cc).

Config: a listener's ``StatefulSession`` (cookie name, path, TTL), replaced
per virtual host, route or weighted cluster by a ``StatefulSessionPerRoute``
(another cookie, or disabled), validated by
:mod:`pyxds.xds.resources.stateful_session`.  A route whose effective config
has a cookie carries a :class:`SessionCookie` in its filter chain; the
xds ConfigSelector takes it out of the chain and applies it while it routes
the RPC, because A60 lets the cookie choose the cluster (and the cluster's
reference must be the chosen one's, A31).

Per RPC (:meth:`SessionCookie.start`):

1. The RPC's path must match the cookie's ``path`` (RFC 6265 5.1.4: the
   cookie path is a prefix of the RPC path, and they are equal, or the
   cookie path ends with ``/``, or the next character of the RPC path is
   ``/``); otherwise the filter does nothing for this RPC.
2. The ``cookie`` metadata (all values joined with ``,``, as C-core reads
   a header) is split on ``"; "``; the first cookie named ``name`` is
   base64-decoded as absl does (standard alphabet, padding absent or
   complete, ASCII whitespace skipped); its length is not capped (C-core
   has no cap; a long A61 address list is read to its end).  A value that
   is not base64 counts as no cookie.  The decoded text is ``"<address list>;<cluster>"``; the
   address list (A61: an endpoint's addresses, comma-separated) goes into
   the RPC's :class:`SessionCall`, the ``xds_override_host`` call attribute
   that the LB picker reads (an address not in the cluster is ignored there:
   normal pick).
3. A60: when the cookie names a cluster of the RPC's route (a cluster or
   one of its weighted clusters), the RPC goes to that cluster; otherwise
   to the cluster the route chose.

On the response (:meth:`SessionCall.response_metadata`, called by the
channel when the committed attempt's response headers arrive): when the
RPC had no cookie, or the endpoint picked (its address list, written by the
picker) or the cluster differ from the cookie's, the response gets
``set-cookie: <name>=<base64 "<address list>;<cluster>">; HttpOnly``
followed by ``; Path=<path>`` when the path is set and ``; Max-Age=<ttl
seconds>`` when the TTL is positive: C-core's exact text, so a cookie set
by one client works in the other.  The TTL is only written into the
cookie, never enforced (A55).

Several stateful session filters on one route (A39 runs each, in order;
A55 is silent on how they combine; :class:`SessionChain`): C-core's way.
Each filter whose path matches reads its own cookie and may move the RPC
to its cookie's cluster (A60, in filter order); the last of them gives the
picker its address list (C-core's later attribute replaces the earlier),
even when its cookie is absent; each answers with its own ``set-cookie``,
the last filter's first (C-core's response runs the filters backwards).
An earlier filter's cookie names the endpoint picked and the cluster
used, as A55 and A60 say (C-core writes an empty address and the cluster
that filter chose: docs/differences-from-c-core.md).

Parsed cookies are remembered by their header text (a bounded map), so a
session's RPCs decode their cookie once.
"""

from __future__ import annotations

import base64
import binascii
import random
from collections.abc import Sequence
from typing import Any

from pyxds.lb.xds_override_host import OverrideHostAttribute
from pyxds.resolver.http_filters import CallFilter, FilterVerdict, HttpFilter, register_built_in
from pyxds.xds.resources._common import Errors
from pyxds.xds.resources.stateful_session import (
    STATEFUL_SESSION_PER_ROUTE_TYPE,
    STATEFUL_SESSION_TYPE,
    CookieConfig,
    parse_stateful_session,
    parse_stateful_session_per_route,
)

__all__ = [
    "COOKIE_HEADER",
    "SET_COOKIE_HEADER",
    "SessionCall",
    "SessionChain",
    "SessionChainCall",
    "SessionCookie",
    "StatefulSessionFilter",
    "cookie_value",
    "path_matches",
    "set_cookie_value",
]

COOKIE_HEADER = "cookie"
SET_COOKIE_HEADER = "set-cookie"
#: a longer cookie value is not decoded (it counts as no cookie: normal
#: pick, new cookie, as C-core ends up doing with a value that names no
#: endpoint of the cluster)
_CACHE_LIMIT = 4096
#: Headers longer than this are decoded per RPC, never kept in the cache.
_MAX_CACHED_HEADER = 4096
_NOTHING: tuple[tuple[str, str], ...] = ()
_NO_COOKIE: tuple[str, str, tuple[str, ...]] = ("", "", ())


def path_matches(cookie_path: str, path: str) -> bool:
    """RFC 6265 section 5.1.4 path-match, as C-core's IsConfiguredPath."""
    if not cookie_path:
        return True
    if not path.startswith(cookie_path):
        return False
    return len(path) == len(cookie_path) or cookie_path[-1] == "/" or path[len(cookie_path)] == "/"


def _header(metadata: Sequence[tuple[str, Any]]) -> str | None:
    values = []
    for key, value in metadata:
        if key == COOKIE_HEADER:
            values.append(value.decode("latin-1") if isinstance(value, bytes) else str(value))
    if not values:
        return None
    return values[0] if len(values) == 1 else ",".join(values)


_ASCII_SPACE = str.maketrans("", "", " \t\n\v\f\r")


def _b64decode(text: str) -> str | None:
    """absl::Base64Unescape, as C-core decodes the cookie: the standard
    alphabet; ASCII whitespace anywhere is skipped; the padding is absent
    or complete (``QQ=`` is refused, ``QQ`` and ``QQ==`` are "A")."""
    text = text.translate(_ASCII_SPACE)
    body = text.rstrip("=")
    rest = len(body) % 4
    if rest == 1 or "=" in body:
        return None
    padding = len(text) - len(body)
    if padding and padding != (4 - rest) % 4:
        return None
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.decode("latin-1")


def cookie_value(header: str, name: str) -> tuple[str, str]:
    """(address list, cluster) of the first cookie ``name`` in a ``cookie``
    header; ("", "") when absent or not decodable (module docstring)."""
    for part in header.split("; "):
        key, _, value = part.partition("=")
        if key == name:
            decoded = _b64decode(value)
            if decoded is None:
                return "", ""
            host, _, cluster = decoded.partition(";")
            return host, cluster
    return "", ""


def set_cookie_value(config: CookieConfig, address_list: str, cluster: str) -> str:
    """The ``set-cookie`` header value C-core writes."""
    encoded = base64.b64encode(f"{address_list};{cluster}".encode("latin-1")).decode("ascii")
    parts = [f"{config.name}={encoded}; HttpOnly"]
    if config.path:
        parts.append(f"Path={config.path}")
    if config.ttl > 0:
        parts.append(f"Max-Age={int(config.ttl)}")
    return "; ".join(parts)


class SessionCall(OverrideHostAttribute):
    """One RPC's session: the ``xds_override_host`` call attribute (the
    cookie's address list in, the picked endpoint's out) and the channel's
    :class:`pyxds.resolver.api.CallState` (the ``set-cookie`` to add)."""

    __slots__ = ("config", "cluster", "cluster_changed")

    def __init__(
        self,
        config: CookieConfig,
        cookie_address_list: str,
        cluster: str,
        cluster_changed: bool,
        cookie_addresses: tuple[str, ...] | None = None,
    ) -> None:
        # (the attribute's fields set here: one call fewer per RPC)
        self.cookie_address_list = cookie_address_list
        if cookie_addresses is None:
            cookie_addresses = tuple(cookie_address_list.split(",")) if cookie_address_list else ()
        self.cookie_addresses = cookie_addresses
        self.actual_address_list = ""
        self.config = config
        self.cluster = cluster
        self.cluster_changed = cluster_changed

    def response_metadata(self) -> tuple[tuple[str, str], ...]:
        actual = self.actual_address_list
        if actual == self.cookie_address_list and not self.cluster_changed:
            return _NOTHING
        return ((SET_COOKIE_HEADER, set_cookie_value(self.config, actual, self.cluster)),)


class SessionChainCall:
    """The :class:`SessionCall` of each of a route's session filters that
    applies to one RPC, in filter order (module docstring): the last one
    is the picker's attribute; the others' cookies name the endpoint it
    picked."""

    __slots__ = ("calls",)

    def __init__(self, calls: tuple[SessionCall, ...]) -> None:
        self.calls = calls
        # an earlier filter's cookie names the cluster used (A60's
        # "clusterUsed"): the last filter's, which the RPC went to
        final = calls[-1].cluster
        for call in calls[:-1]:
            if call.cluster != final:
                call.cluster, call.cluster_changed = final, True

    def response_metadata(self) -> tuple[tuple[str, str], ...]:
        last = self.calls[-1]
        out: list[tuple[str, str]] = []
        for call in reversed(self.calls):
            if call is not last:
                call.actual_address_list = last.actual_address_list
            out.extend(call.response_metadata())
        return tuple(out)


class SessionCookie(CallFilter):
    """A route's stateful session config in its filter chain.  The xds
    ConfigSelector applies it (:meth:`start`); it never runs as a pre-pick
    filter."""

    __slots__ = ("config", "_paths", "_cookies")

    def __init__(self, config: CookieConfig) -> None:
        self.config = config
        self._paths: dict[str, bool] = {}
        #: header text -> (address list, cluster, the addresses split)
        self._cookies: dict[str, tuple[str, str, tuple[str, ...]]] = {}

    def on_call(
        self, metadata: Sequence[tuple[str, Any]], rng: random.Random
    ) -> FilterVerdict | None:
        return None

    def applies_to(self, path: str) -> bool:
        hit = self._paths.get(path)
        if hit is None:
            if len(self._paths) >= _CACHE_LIMIT:
                self._paths.clear()
            hit = self._paths[path] = path_matches(self.config.path, path)
        return hit

    def read(self, metadata: Sequence[tuple[str, Any]]) -> tuple[str, str]:
        """(address list, cluster) of the RPC's cookie, ("", "") without one."""
        address_list, cluster, _addresses = self.read_split(metadata)
        return address_list, cluster

    def read_split(self, metadata: Sequence[tuple[str, Any]]) -> tuple[str, str, tuple[str, ...]]:
        """:meth:`read` plus the address list split into addresses."""
        header = _header(metadata)
        if header is None:
            return _NO_COOKIE
        got = self._cookies.get(header)
        if got is None:
            address_list, cluster = cookie_value(header, self.config.name)
            split = tuple(address_list.split(",")) if address_list else ()
            got = (address_list, cluster, split)
            if len(header) <= _MAX_CACHED_HEADER:
                if len(self._cookies) >= _CACHE_LIMIT:
                    self._cookies.clear()
                self._cookies[header] = got
        return got

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionCookie) and other.config == self.config

    def __hash__(self) -> int:
        return hash(self.config)

    def __repr__(self) -> str:
        return f"SessionCookie({self.config})"


class SessionChain:
    """Two or more :class:`SessionCookie` of one route's filter chain, in
    chain order (module docstring); the xds ConfigSelector applies each."""

    __slots__ = ("cookies",)

    def __init__(self, cookies: tuple[SessionCookie, ...]) -> None:
        self.cookies = cookies

    def __repr__(self) -> str:
        return f"SessionChain{self.cookies}"


class StatefulSessionFilter(HttpFilter):
    """The A55 filter type: StatefulSession in listeners,
    StatefulSessionPerRoute in overrides."""

    type_urls = (STATEFUL_SESSION_TYPE,)
    override_type_urls = (STATEFUL_SESSION_PER_ROUTE_TYPE,)

    def call_filter(self, config: bytes) -> CallFilter | None:
        return _session(parse_stateful_session(config, "", Errors()))

    def override_filter(self, config: bytes) -> CallFilter | None:
        return _session(parse_stateful_session_per_route(config, "", Errors()))


def _session(config: CookieConfig) -> SessionCookie | None:
    return SessionCookie(config) if config.enabled else None


register_built_in(StatefulSessionFilter())
