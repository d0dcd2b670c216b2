"""The RBAC HTTP filter's config, validated as C-core validates it (gRFC A41).

Rules (each violation NACKs the Listener, or the RouteConfiguration for a
``typed_per_filter_config`` override, naming the field in C-core's words):

* ``RBAC.rules`` absent, or ``rules.action: LOG``: the filter does nothing
  (A41: LOG is as if RBAC were not configured); ``shadow_rules`` are not
  supported and not read (A41).
* ``Policy.condition`` / ``checked_condition``: "condition not supported" /
  "checked condition not supported" (CEL is not supported).
* A ``Permission`` / ``Principal`` must set one of the rules gRPC knows:
  ``and_rules``/``or_rules``/``not_rule`` (``and_ids``/``or_ids``/``not_id``),
  ``any``, ``header``, ``url_path``, ``destination_ip``,
  ``destination_port``, ``metadata``, ``requested_server_name``;
  ``authenticated``, ``source_ip``, ``direct_remote_ip``, ``remote_ip``.
  Anything else (``destination_port_range``, ``filter_state``, ``matcher``,
  ``uri_template``, ``custom``, unset) is "invalid rule".
* ``header`` matchers: a name ``:scheme`` or starting with ``grpc-`` is
  refused ("':scheme' not allowed in header", "'grpc-' prefixes not allowed
  in header"); the match type must be set ("invalid route header matcher
  specified"); ``string_match`` must set a pattern ("invalid match
  pattern"); regexes compile with RE2; a range needs ``start <= end``.
* ``url_path`` needs ``path`` ("field not present"); string matchers need a
  pattern; ``ignore_case`` with a regex is refused; otherwise it folds
  ASCII letters only, as C-core's matchers do.
* CIDR ranges: the prefix length is clamped to 32 / 128 and the address
  masked; one whose address is not an IP literal is accepted and never
  matches (as C-core: its matcher compares against an empty address).

The result is frozen values (:class:`RbacConfig` and the rule tree) with
structural equality; :mod:`pyxds.serving.rbac` evaluates them per RPC.
"""

from __future__ import annotations

import ipaddress
from dataclasses import field
from typing import Any

from pyxds._values import dataclass
from pyxds.xds.resources._common import (
    RBAC_FILTER_TYPE,
    RBAC_PER_ROUTE_TYPE,
    Errors,
    compile_regex,
)
from pyxds.xds.resources.types import HeaderMatcher, ascii_lower

__all__ = [
    "NO_RBAC",
    "rbac_override_of",
    "RBAC_FILTER_TYPE",
    "RBAC_PER_ROUTE_TYPE",
    "CidrRange",
    "RbacConfig",
    "RbacPolicy",
    "Rule",
    "StringMatch",
    "parse_cidr",
    "parse_rbac",
    "parse_rbac_override",
    "parse_string_matcher",
]

_ACTIONS = {0: "ALLOW", 1: "DENY", 2: "LOG"}


@dataclass(frozen=True)
class StringMatch:
    """An ``envoy.type.matcher.v3.StringMatcher``: ``kind`` is exact, prefix,
    suffix, contains or safe_regex (RE2 full match, compiled ``regex``
    excluded from equality)."""

    kind: str
    value: str
    ignore_case: bool = False
    regex: Any = field(default=None, compare=False, hash=False, repr=False)

    def matches(self, text: str) -> bool:
        kind = self.kind
        if kind == "safe_regex":
            return self.regex.fullmatch(text) is not None
        value = self.value
        if self.ignore_case:  # ASCII letters only, as C-core
            text = ascii_lower(text)
            value = ascii_lower(value)
        if kind == "exact":
            return text == value
        if kind == "prefix":
            return text.startswith(value)
        if kind == "suffix":
            return text.endswith(value)
        return value in text  # contains


@dataclass(frozen=True, slots=True)
class CidrRange:
    """A ``CidrRange``: the masked network (prefix length clamped)."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network

    def contains(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        network = self.network
        return ip.version == network.version and ip in network

    def __str__(self) -> str:
        return f"{self.network.network_address}/{self.network.prefixlen}"


@dataclass(frozen=True, slots=True)
class Rule:
    """One node of a Permission or Principal tree.

    ``kind``: ``and``/``or`` (``rules``), ``not`` (``rules[0]``), ``any``,
    ``header`` (``header``), ``url_path`` (``string``), ``destination_ip``
    (``cidr``), ``destination_port`` (``port``), ``metadata`` (``invert``),
    ``requested_server_name`` (``string``), ``authenticated`` (``string``,
    None: any authenticated peer), ``source_ip`` / ``direct_remote_ip`` /
    ``remote_ip`` (``cidr``, all the peer address in gRPC, A41).  An IP rule
    whose ``cidr`` is None never matches (its address was not an IP).
    """

    kind: str
    rules: tuple[Rule, ...] = ()
    header: HeaderMatcher | None = None
    string: StringMatch | None = None
    cidr: CidrRange | None = None
    port: int = 0
    invert: bool = False


@dataclass(frozen=True, slots=True)
class RbacPolicy:
    """A named policy: it matches when a permission and a principal match."""

    name: str
    permissions: tuple[Rule, ...]
    principals: tuple[Rule, ...]


@dataclass(frozen=True, slots=True)
class RbacConfig:
    """One RBAC filter config (or per-route override).

    ``action`` is ``ALLOW`` or ``DENY``; None means the filter does nothing
    (``rules`` absent, ``LOG``, or an ``RBACPerRoute`` without ``rbac``).
    ``policies`` are sorted by name (the decision does not depend on order).
    """

    action: str | None
    policies: tuple[RbacPolicy, ...] = ()


NO_RBAC = RbacConfig(None)


def parse_rbac(value: bytes, path: str, errs: Errors) -> RbacConfig | None:
    """Validate a serialized ``envoy.extensions.filters.http.rbac.v3.RBAC``."""
    from envoy.extensions.filters.http.rbac.v3 import rbac_pb2

    msg = rbac_pb2.RBAC()
    try:
        msg.ParseFromString(value)
    except Exception:
        errs.add(path, "could not parse HTTP RBAC filter config")
        return None
    return _parse_rbac_message(msg, path, errs)


def parse_rbac_override(value: bytes, path: str, errs: Errors) -> RbacConfig | None:
    """Validate a serialized ``RBACPerRoute`` (the per-route override)."""
    from envoy.extensions.filters.http.rbac.v3 import rbac_pb2

    msg = rbac_pb2.RBACPerRoute()
    try:
        msg.ParseFromString(value)
    except Exception:
        errs.add(path, "could not parse RBACPerRoute")
        return None
    if not msg.HasField("rbac"):
        return NO_RBAC
    return _parse_rbac_message(msg.rbac, f"{path}.rbac", errs)


def _parse_rbac_message(msg: Any, path: str, errs: Errors) -> RbacConfig | None:
    if not msg.HasField("rules"):
        return NO_RBAC
    rules = msg.rules
    action = _ACTIONS.get(rules.action)
    p = f"{path}.rules"
    if action == "LOG":
        return NO_RBAC
    if action is None:
        errs.add(f"{p}.action", "unknown action")
        return None
    before = len(errs)
    policies = []
    for name in sorted(rules.policies):
        policy = rules.policies[name]
        pp = f"{p}.policies[{name}]"
        permissions = tuple(
            _rule(perm, f"{pp}.permissions[{i}]", errs, True)
            for i, perm in enumerate(policy.permissions)
        )
        principals = tuple(
            _rule(prin, f"{pp}.principals[{i}]", errs, False)
            for i, prin in enumerate(policy.principals)
        )
        if policy.HasField("condition"):
            errs.add(f"{pp}.condition", "condition not supported")
        if policy.HasField("checked_condition"):
            errs.add(f"{pp}.checked_condition", "checked condition not supported")
        policies.append(RbacPolicy(name, permissions, principals))
    if len(errs) != before:
        return None
    return RbacConfig(action, tuple(policies))


_ANY = Rule("any")
_INVALID = Rule("any")  # placeholder for a rule that failed validation (never used)


def _rule(msg: Any, path: str, errs: Errors, permission: bool) -> Rule:
    """A Permission (``permission``) or Principal message as a Rule."""
    which = msg.WhichOneof("rule" if permission else "identifier")
    if permission:
        if which in ("and_rules", "or_rules"):
            field_name = "and_permission" if which == "and_rules" else "or_permission"
            rules = tuple(
                _rule(r, f"{path}.{field_name}.rules[{i}]", errs, True)
                for i, r in enumerate(getattr(msg, which).rules)
            )
            return Rule("and" if which == "and_rules" else "or", rules)
        if which == "not_rule":
            return Rule("not", (_rule(msg.not_rule, f"{path}.not_rule", errs, True),))
        if which == "destination_ip":
            return Rule("destination_ip", cidr=_rule_cidr(msg.destination_ip))
        if which == "destination_port":
            return Rule("destination_port", port=msg.destination_port)
        if which == "requested_server_name":
            return Rule(
                "requested_server_name",
                string=parse_string_matcher(
                    msg.requested_server_name, f"{path}.requested_server_name", errs
                ),
            )
    else:
        if which in ("and_ids", "or_ids"):
            rules = tuple(
                _rule(r, f"{path}.{which}.ids[{i}]", errs, False)
                for i, r in enumerate(getattr(msg, which).ids)
            )
            return Rule("and" if which == "and_ids" else "or", rules)
        if which == "not_id":
            return Rule("not", (_rule(msg.not_id, f"{path}.not_id", errs, False),))
        if which == "authenticated":
            auth = msg.authenticated
            string = None
            if auth.HasField("principal_name"):
                string = parse_string_matcher(
                    auth.principal_name, f"{path}.authenticated.principal_name", errs
                )
            return Rule("authenticated", string=string)
        if which in ("source_ip", "direct_remote_ip", "remote_ip"):
            return Rule(which, cidr=_rule_cidr(getattr(msg, which)))
    if which == "any":
        return _ANY
    if which == "header":
        return Rule("header", header=_header(msg.header, f"{path}.header", errs))
    if which == "url_path":
        url_path = msg.url_path
        p = f"{path}.url_path.path"
        if not url_path.HasField("path"):
            errs.add(p, "field not present")
            return _INVALID
        return Rule("url_path", string=parse_string_matcher(url_path.path, p, errs))
    if which == "metadata":
        return Rule("metadata", invert=msg.metadata.invert)
    errs.add(path, "invalid rule")
    return _INVALID


def _regex(pattern: str, path: str, errs: Errors, prefix: str = "") -> Any:
    """RE2 for a matcher, with C-core's words for a bad pattern."""
    problems = Errors()
    rx = compile_regex(pattern, "", problems)
    if rx is None:
        detail = problems[0].split(": ", 1)[-1] if problems else pattern
        errs.add(path, f"{prefix}Invalid regex string specified in matcher: {detail}")
    return rx


def parse_string_matcher(sm: Any, path: str, errs: Errors) -> StringMatch | None:
    """A StringMatcher, C-core 1.85's checks (its RBAC filter checks the
    pattern twice, so an unset one has two errors)."""
    kind = sm.WhichOneof("match_pattern")
    ic = sm.ignore_case
    if kind in ("exact", "prefix", "suffix", "contains"):
        return StringMatch(kind, getattr(sm, kind), ic)
    if kind == "safe_regex":
        pattern = sm.safe_regex.regex
        rx = _regex(pattern, path, errs)
        if ic:
            errs.add(f"{path}.ignore_case", "not supported for regex matcher")
            return None
        if rx is None:
            return None
        return StringMatch("safe_regex", pattern, regex=rx)
    errs.add(path, "invalid match pattern")
    errs.add(path, "invalid string matcher")
    return None


def _header(h: Any, path: str, errs: Errors) -> HeaderMatcher | None:
    name = h.name
    if name == ":scheme":
        errs.add(f"{path}.name", "':scheme' not allowed in header")
    elif name.startswith("grpc-"):
        errs.add(f"{path}.name", "'grpc-' prefixes not allowed in header")
    invert = h.invert_match
    kind = h.WhichOneof("header_match_specifier")
    if kind == "exact_match":
        return HeaderMatcher(name, "exact", h.exact_match, invert)
    if kind == "prefix_match":
        return HeaderMatcher(name, "prefix", h.prefix_match, invert)
    if kind == "suffix_match":
        return HeaderMatcher(name, "suffix", h.suffix_match, invert)
    if kind == "contains_match":
        return HeaderMatcher(name, "contains", h.contains_match, invert)
    if kind == "present_match":
        return HeaderMatcher(name, "present", None, invert, present_match=h.present_match)
    if kind == "safe_regex_match":
        pattern = h.safe_regex_match.regex
        rx = _regex(pattern, path, errs, "cannot create header matcher: ")
        return HeaderMatcher(name, "safe_regex", pattern, invert, regex=rx)
    if kind == "range_match":
        start, end = h.range_match.start, h.range_match.end
        if end < start:
            errs.add(
                path,
                "cannot create header matcher: Invalid range specifier specified: "
                "end cannot be smaller than start.",
            )
        return HeaderMatcher(name, "range", None, invert, range_start=start, range_end=end)
    if kind == "string_match":
        sm = parse_string_matcher(h.string_match, f"{path}.string_match", errs)
        if sm is None:
            return None
        return HeaderMatcher(
            name, sm.kind, sm.value, invert, ignore_case=sm.ignore_case, regex=sm.regex
        )
    errs.add(path, "invalid header matcher")
    errs.add(path, "invalid route header matcher specified")
    return None


def _rule_cidr(msg: Any) -> CidrRange | None:
    """An RBAC rule's CidrRange; None (never matches) when not an IP."""
    return parse_cidr(msg, "", Errors())


def parse_cidr(msg: Any, path: str, errs: Errors) -> CidrRange | None:
    """A ``CidrRange`` message (address masked, prefix length clamped)."""
    text = msg.address_prefix
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        host = f"[{text}]" if ":" in text else text
        errs.add(f"{path}.address_prefix", f"Failed to parse address:{host}:0")
        return None
    plen = msg.prefix_len.value if msg.HasField("prefix_len") else 0
    plen = min(plen, 32 if ip.version == 4 else 128)
    return CidrRange(ipaddress.ip_network(f"{ip}/{plen}", strict=False))


def rbac_override_of(value: bytes) -> RbacConfig | None:
    """A validated ``RBACPerRoute`` override of an RBAC filter (the bytes of
    the ``typed_per_filter_config`` entry); None if invalid."""
    errs = Errors()
    config = parse_rbac_override(value, "", errs)
    return None if errs else config
