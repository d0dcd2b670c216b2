"""Server authorization: the peer certificate's SANs against a cluster's
``match_subject_alt_names`` (gRFC A29 "Server Authorization aka
Subject-Alt-Name Checks").

* No matchers: the check succeeds.
* Every DNS, URI, email and IP SAN is tried against every matcher; one match
  is enough.  An empty SAN never matches.  IP SANs are compared in their
  canonical text (RFC 5952 for IPv6: ``2001:DB8:0::01`` is ``2001:db8::1``).
* ``exact`` against a DNS SAN follows DNS rules (as C-core): case-insensitive,
  absolute names (trailing dot) equal relative ones, and a wildcard SAN
  ``*.example.com`` matches exactly one label (``a.example.com``, not
  ``a.b.example.com`` nor ``example.com``).
* ``ignore_case`` lower-cases both sides; ``safe_regex`` is a full RE2 match.
* Case folding (``ignore_case``, DNS names) is ASCII only, as C-core's
  ``absl::AsciiStrToLower``: U+212A KELVIN SIGN is not ``k`` here, though
  Python's ``str.lower()`` makes it one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from pyxds.security.tls_config import SanMatcher
from pyxds.xds.resources.types import ascii_lower

SAN_KINDS = {"DNS": "dns", "URI": "uri", "email": "email", "IP Address": "ip"}


def sans_of(peer_cert: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(kind, value) of the DNS/URI/email/IP SANs of ``ssl.getpeercert()``."""
    out = []
    for kind, value in peer_cert.get("subjectAltName", ()):
        mapped = SAN_KINDS.get(kind)
        if mapped is None:
            continue
        if mapped == "ip":
            try:
                value = ipaddress.ip_address(value.strip()).compressed
            except ValueError:
                pass
        out.append((mapped, value))
    return out


def matches(matcher: SanMatcher, kind: str, san: str) -> bool:
    if not san:
        return False
    if matcher.kind == "exact" and kind == "dns":
        return dns_exact(san, matcher.value)
    if matcher.kind == "safe_regex":
        return matcher.regex is not None and matcher.regex.fullmatch(san) is not None
    value = matcher.value
    if matcher.ignore_case:
        san, value = ascii_lower(san), ascii_lower(value)
    if matcher.kind == "exact":
        return san == value
    if matcher.kind == "prefix":
        return san.startswith(value)
    if matcher.kind == "suffix":
        return san.endswith(value)
    if matcher.kind == "contains":
        return value in san
    return False


def dns_exact(san: str, name: str) -> bool:
    """DNS-rule equality of a SAN (possibly ``*.`` wildcard) and a name."""
    if not san or san.startswith(".") or not name or name.startswith("."):
        return False
    san = ascii_lower(san if san.endswith(".") else san + ".")
    name = ascii_lower(name if name.endswith(".") else name + ".")
    if "*" not in san:
        return san == name
    if not san.startswith("*.") or san == "*." or "*" in san[1:]:
        return False
    suffix = san[1:]  # ".example.com."
    if len(name) <= len(suffix) or not name.endswith(suffix):
        return False
    return "." not in name[: len(name) - len(suffix)]


def check(matchers: Iterable[SanMatcher], peer_cert: Mapping[str, Any] | None) -> bool:
    """A29's check of the leaf certificate; True when authorized."""
    matchers = tuple(matchers)
    if not matchers:
        return True
    if not peer_cert:
        return False
    return any(matches(m, kind, san) for kind, san in sans_of(peer_cert) for m in matchers)
