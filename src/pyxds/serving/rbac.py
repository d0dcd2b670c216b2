"""The RBAC engine (gRFC A41): decide one RPC against one RBAC filter config.

Rules, as A41 maps RBAC onto gRPC and C-core (``matchers.cc``,
``evaluate_args.cc``) evaluates them:

* A policy matches when one of its permissions and one of its principals
  match (an empty list matches nothing).  ``ALLOW``: the RPC is allowed
  when some policy matches; ``DENY``: it is denied when some policy
  matches.  A config without an action (no ``rules``, ``LOG``) allows all.
* ``header``: the RPC's metadata, several values joined with ``,``;
  ``:path`` is the method path, ``:method`` is ``POST``, ``:authority`` and
  ``host`` are the request's authority, ``content-type`` is what gRPC
  clients send (``application/grpc``; grpcio hides the real header), ``te``
  is never present, binary (``-bin``) values are the unpadded base64 text
  gRPC sends on the wire (A41 "base64-encoded form", as grpc-java; C-core
  1.85 matches the raw bytes).  ``host`` and ``te`` are recognised in any
  case, as C-core compares them.  An absent header matches nothing but
  ``present_match: false`` (the matcher's own rule,
  :class:`~pyxds.xds.resources.types.HeaderMatcher`).
* ``url_path``: the method path.  ``destination_ip`` / ``destination_port``:
  the connection's local address; ``source_ip``, ``direct_remote_ip``,
  ``remote_ip``: its peer address.  ``metadata`` never matches (its
  ``invert`` is the result); ``requested_server_name`` matches what matches
  the empty string.
* ``authenticated``: only on TLS connections; without a name it matches any
  of them; a name is tried on the first kind of name the peer certificate
  has, as A41 lists them: its URI SANs if it has any, else its DNS SANs if
  it has any, else its subject (RFC 2253 text); no certificate: the empty
  string (as grpc-go and grpc-java; C-core 1.85 tries every kind, which lets
  a DNS SAN or the subject match when the URI SAN does not).  On a port
  that verifies client certificates without requiring them grpcio does not
  ask for one, so the name is unknown there.

Unknown inputs.  grpcio does not show ``:authority`` to ``grpc.aio``
servicers (grpc/grpc#38906), and a connection's local address can be
unknown.  A rule that needs an unknown input evaluates to *unknown*, carried
through ``and``/``or``/``not`` with three-valued logic; a policy that is
unknown counts against the RPC: an ``ALLOW`` filter allows only on a
definite match, a ``DENY`` filter denies on a definite or an unknown match
(fail closed: what pyxds cannot see never lets an RPC through that C-core
would refuse).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

from pyxds._values import dataclass
from pyxds.serving.filter_chains import IpAddress
from pyxds.xds.resources.rbac import RbacConfig, Rule

__all__ = ["RbacEngine", "RequestInfo", "UNAUTHORIZED"]

UNAUTHORIZED = "Unauthorized RPC rejected"
"""C-core's PERMISSION_DENIED details for an RPC an RBAC filter refused."""

GRPC_CONTENT_TYPE = "application/grpc"

Tri = bool | None  # True, False, or None for "unknown"


@dataclass(slots=True)
class RequestInfo:
    """What one RPC shows the RBAC engine.  ``authority`` / ``local_ip`` None:
    unknown; ``peer_ip`` None: not an IP peer (never matches an IP rule)."""

    path: str
    metadata: Sequence[tuple[str, Any]]
    authority: str | None
    peer_ip: IpAddress | None
    local_ip: IpAddress | None
    local_port: int
    secure: bool = False
    uri_sans: tuple[str, ...] = ()
    dns_sans: tuple[str, ...] = ()
    subject: str = ""
    identity_unknown: bool = False
    _headers: dict[str, str | None] | None = field(default=None, repr=False)

    def header(self, name: str) -> str | bool | None:
        """The value a header matcher sees (None: absent); False when it
        cannot be known (the authority of an aio RPC)."""
        special = _special(name)
        if special == ":authority":
            return False if self.authority is None else self.authority
        if special == ":path":
            return self.path
        if special == ":method":
            return "POST"
        if special == "content-type":
            return GRPC_CONTENT_TYPE
        if special == "te":
            return None
        return self.metadata_value(name)

    def metadata_value(self, name: str) -> str | None:
        """A custom header's value as RBAC sees it (None: absent)."""
        headers = self._headers
        if headers is None:
            headers = self._headers = _join(self.metadata)
        return headers.get(name)


_FIXED_HEADERS = frozenset({":authority", ":path", ":method", "content-type", "te"})


def _special(name: str) -> str | None:
    """The name of a header RBAC does not read from the metadata (``host`` is
    ``:authority``; ``host`` and ``te`` in any case, as C-core's
    ``EqualsIgnoreCase``), else None."""
    if name in _FIXED_HEADERS:
        return name
    lower = name.lower()
    if lower == "host":
        return ":authority"
    if lower == "te":
        return "te"
    return None


def _join(metadata: Sequence[tuple[str, Any]]) -> dict[str, str | None]:
    out: dict[str, list[str]] = {}
    for key, value in metadata:
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode("ascii").rstrip("=")
        out.setdefault(key, []).append(value)
    return {k: v[0] if len(v) == 1 else ",".join(v) for k, v in out.items()}


Matcher = Callable[[RequestInfo], Tri]


def _and(matchers: Sequence[Matcher]) -> Matcher:
    if len(matchers) == 1:
        return matchers[0]

    def match(info: RequestInfo) -> Tri:
        unknown = False
        for m in matchers:
            r = m(info)
            if r is False:
                return False
            if r is None:
                unknown = True
        return None if unknown else True

    return match


def _or(matchers: Sequence[Matcher]) -> Matcher:
    if len(matchers) == 1:
        return matchers[0]
    if not matchers:
        return _never

    def match(info: RequestInfo) -> Tri:
        unknown = False
        for m in matchers:
            r = m(info)
            if r is True:
                return True
            if r is None:
                unknown = True
        return None if unknown else False

    return match


def _not(matcher: Matcher) -> Matcher:
    def match(info: RequestInfo) -> Tri:
        r = matcher(info)
        return None if r is None else not r

    return match


def _always(info: RequestInfo) -> Tri:
    return True


def _never(info: RequestInfo) -> Tri:
    return False


def _header(name: str, matches: Callable[[str | None], bool]) -> Matcher:
    """A header rule, its lookup chosen once (A41's special names)."""
    special = _special(name)
    if special == ":authority":

        def authority(info: RequestInfo) -> Tri:
            value = info.authority
            return None if value is None else bool(matches(value))

        return authority
    if special is not None:
        return lambda info: bool(matches(info.header(name)))  # type: ignore[arg-type]

    def header(info: RequestInfo) -> Tri:
        return bool(matches(info.metadata_value(name)))

    return header


def _compile(rule: Rule) -> Matcher:
    kind = rule.kind
    if kind == "and":
        return _and([_compile(r) for r in rule.rules])
    if kind == "or":
        return _or([_compile(r) for r in rule.rules])
    if kind == "not":
        return _not(_compile(rule.rules[0]))
    if kind == "any":
        return _always
    if kind == "header":
        matcher = rule.header
        assert matcher is not None
        return _header(matcher.name, matcher.matches)
    if kind == "url_path":
        string = rule.string
        assert string is not None
        path_matches = string.matches
        return lambda info: bool(info.path) and path_matches(info.path)
    if kind == "destination_ip":
        cidr = rule.cidr
        if cidr is None:
            return _never

        def destination_ip(info: RequestInfo) -> Tri:
            ip = info.local_ip
            return None if ip is None else cidr.contains(ip)

        return destination_ip
    if kind == "destination_port":
        port = rule.port
        return lambda info: info.local_port == port
    if kind in ("source_ip", "direct_remote_ip", "remote_ip"):
        peer_cidr = rule.cidr
        if peer_cidr is None:
            return _never

        def peer_ip(info: RequestInfo) -> Tri:
            ip = info.peer_ip
            return ip is not None and peer_cidr.contains(ip)

        return peer_ip
    if kind == "metadata":
        invert = rule.invert
        return lambda info: invert
    if kind == "requested_server_name":
        assert rule.string is not None
        result = rule.string.matches("")
        return lambda info: result
    if kind == "authenticated":
        principal = rule.string
        if principal is None:
            return lambda info: info.secure
        name_matches = principal.matches
        if principal.kind == "exact" and not principal.ignore_case:
            wanted = principal.value

            def authenticated_exact(info: RequestInfo) -> Tri:
                if not info.secure:
                    return False
                if info.identity_unknown:
                    return None
                if info.uri_sans:
                    return wanted in info.uri_sans
                if info.dns_sans:
                    return wanted in info.dns_sans
                return wanted == info.subject

            return authenticated_exact

        def authenticated(info: RequestInfo) -> Tri:
            if not info.secure:
                return False
            if info.identity_unknown:
                return None
            names = info.uri_sans or info.dns_sans
            if names:
                return any(name_matches(name) for name in names)
            return name_matches(info.subject)

        return authenticated
    raise ValueError(f"unknown RBAC rule kind {kind!r}")  # validated away


class RbacEngine:
    """One RBAC filter config, compiled: :meth:`allows` per RPC."""

    __slots__ = ("config", "_deny", "_policies", "_checks", "_noop")

    def __init__(self, config: RbacConfig) -> None:
        self.config = config
        self._noop = config.action is None
        self._deny = config.action == "DENY"
        self._policies = [
            (
                policy.name,
                _or([_compile(p) for p in policy.permissions]),
                _or([_compile(p) for p in policy.principals]),
            )
            for policy in config.policies
        ]
        # Policies whose permissions are all ``any`` need only their principals.
        self._checks = [
            (
                None
                if all(p.kind == "any" for p in policy.permissions) and policy.permissions
                else permissions,
                principals,
            )
            for policy, (_, permissions, principals) in zip(
                config.policies, self._policies, strict=True
            )
        ]

    @property
    def noop(self) -> bool:
        """True when the config lets every RPC through (no action)."""
        return self._noop

    def allows(self, info: RequestInfo) -> bool:
        """Whether the RPC may go on (module docstring, "Unknown inputs")."""
        if self._noop:
            return True
        matched: Tri = False
        for permissions, principals in self._checks:
            r = True if permissions is None else permissions(info)
            if r is False:
                continue
            p = principals(info)
            if p is False:
                continue
            if r is True and p is True:
                matched = True
                break
            matched = None
        if self._deny:
            return matched is False
        return matched is True

    def decision(self, info: RequestInfo) -> tuple[bool, str | None]:
        """(allowed, name of the policy that decided, if one matched)."""
        allowed = self.allows(info)
        for name, permissions, principals in self._policies:
            if permissions(info) is True and principals(info) is True:
                return allowed, name
        return allowed, None
