"""SPIFFE IDs and SPIFFE trust bundle maps (gRFC A87), with C-core's rules
and words (grpcio 1.85 ``spiffe_utils.cc``, ``ssl_transport_security.cc``).

SPIFFE ID (:func:`parse_spiffe_id`): ASCII, at most 2048 bytes, no
``#`` or ``?``, starts with ``spiffe://`` (any case), does not end with
``/``; the trust domain (up to the first ``/``) is 1..255 characters of
``a-z 0-9 . - _``; each path segment is non-empty, not ``.`` or ``..``,
of ``a-z A-Z 0-9 . - _``.

A peer's SPIFFE ID (:func:`peer_spiffe_id`): its leaf certificate has
exactly one URI SAN (DNS, IP and email SANs do not count) and it parses.

Bundle map file (:func:`load_bundle_map`), the JSON shape C-core reads::

    {"trust_domains": {"example.org": {"keys": [
        {"use": "x509-svid", "kty": "EC", "x5c": ["<base64 DER certificate>"]}]}}}

``trust_domains`` and each bundle's ``keys`` must be present; each key
needs ``use`` (exactly ``x509-svid``), ``kty`` (``RSA`` or ``EC``) and
``x5c`` (exactly one base64 DER certificate: the root); every trust
domain name must be valid; a key repeated in a JSON object is an error (as
C-core's JSON reader).  Other fields (``spiffe_sequence``,
``spiffe_refresh_hint``, ...) are ignored.  Any error rejects the whole
map, as C-core (A87: "we ignore the whole trust bundle").
"""

from __future__ import annotations

import base64
import binascii
import ssl
from collections.abc import Mapping
from typing import Any

from pyxds import _json
from pyxds._values import dataclass

MAX_ID_LENGTH = 2048
MAX_TRUST_DOMAIN_LENGTH = 255
_TRUST_DOMAIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-_")
_PATH_CHARS = _TRUST_DOMAIN_CHARS | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_PREFIX = "spiffe://"
_ALLOWED_USE = "x509-svid"
_ALLOWED_KTY = ("EC", "RSA")


@dataclass(frozen=True)
class SpiffeId:
    trust_domain: str
    path: str  # "" or "/a/b"

    def __str__(self) -> str:
        return f"spiffe://{self.trust_domain}{self.path}"


def validate_trust_domain(domain: str) -> None:
    """Raises ValueError (C-core's words) unless ``domain`` is a valid trust domain."""
    if not domain:
        raise ValueError("Trust domain cannot be empty")
    if len(domain) > MAX_TRUST_DOMAIN_LENGTH:
        raise ValueError(f"Trust domain maximum length is {MAX_TRUST_DOMAIN_LENGTH} characters")
    for ch in domain:
        if ch not in _TRUST_DOMAIN_CHARS:
            raise ValueError(
                f"Trust domain contains invalid character '{ch}'. MUST contain only "
                "lowercase letters, numbers, dots, dashes, and underscores"
            )


def _validate_path(path: str) -> None:
    if not path:
        return
    for segment in path.split("/"):
        if not segment:
            raise ValueError("Path segment cannot be empty")
        if segment in (".", ".."):
            raise ValueError("Path segment cannot be a relative modifier (. or ..)")
        for ch in segment:
            if ch not in _PATH_CHARS:
                raise ValueError(
                    f"Path segment contains invalid character '{ch}'. MUST contain only "
                    "letters, numbers, dots, dashes, and underscores"
                )


def parse_spiffe_id(uri: str) -> SpiffeId:
    """The SPIFFE ID in ``uri``; ValueError with C-core's reason otherwise."""
    if not uri:
        raise ValueError("SPIFFE ID cannot be parsed from empty URI")
    # C-core works on the URI's UTF-8 bytes: the length counts bytes, and a
    # non-ASCII character is named by its first byte (U+00B5 is 0xc2).
    raw = uri.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_ID_LENGTH:
        raise ValueError(
            f"URI length is {len(raw)}, maximum allowed for SPIFFE ID is {MAX_ID_LENGTH}"
        )
    if "#" in uri:
        raise ValueError("SPIFFE ID cannot contain query fragments")
    if "?" in uri:
        raise ValueError("SPIFFE ID cannot contain query parameters")
    if not uri.isascii():
        byte = next(b for b in raw if b > 0x7F)
        raise ValueError(f"SPIFFE ID URI cannot contain non-ascii characters. Contains {byte:#x}")
    if not uri[: len(_PREFIX)].lower() == _PREFIX:
        raise ValueError("SPIFFE ID must start with spiffe://")
    if uri.endswith("/"):
        raise ValueError("SPIFFE ID cannot end with a /")
    rest = uri[len(_PREFIX) :]
    if rest.startswith("/"):
        raise ValueError("The trust domain cannot be empty")
    domain, slash, path = rest.partition("/")
    validate_trust_domain(domain)
    _validate_path(path)
    return SpiffeId(domain, "/" + path if slash else "")


def peer_spiffe_id(peer_cert: Mapping[str, Any] | None) -> SpiffeId:
    """The SPIFFE ID of a leaf certificate (``ssl.getpeercert()``): exactly
    one URI SAN, a valid SPIFFE ID.  ValueError with C-core's reason."""
    uris = [v for kind, v in (peer_cert or {}).get("subjectAltName", ()) if kind == "URI"]
    if len(uris) > 1:
        raise ValueError(
            "spiffe: more than one SAN URI found while doing SPIFFE validation. Must have "
            "exactly one URI SAN that is the SPIFFE ID."
        )
    if not uris:
        raise ValueError("spiffe: no SPIFFE ID found in leaf certificate.")
    if not uris[0]:
        raise ValueError("spiffe: no URI SAN found in leaf certificate")
    return parse_spiffe_id(uris[0])


@dataclass(frozen=True)
class SpiffeBundleMap:
    """Trust domain -> its roots (DER certificates)."""

    bundles: Mapping[str, tuple[bytes, ...]]

    def roots(self, trust_domain: str) -> tuple[bytes, ...]:
        """The roots of ``trust_domain``; KeyError (C-core's words) if absent."""
        try:
            return self.bundles[trust_domain]
        except KeyError:
            raise KeyError(f"No spiffe bundle found for trust domain {trust_domain}") from None


class _Errors(list[str]):
    def add(self, field: str, error: str) -> None:
        self.append(f"field:{field} error:{error}")


def parse_bundle_map(text: str | bytes) -> SpiffeBundleMap:
    """A bundle map from its JSON text; ValueError listing every problem as
    ``field:<path> error:<problem>`` (C-core's shape)."""
    try:
        doc = _json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"JSON parse error: {err}") from None
    errs = _Errors()
    bundles: dict[str, tuple[bytes, ...]] = {}
    if not isinstance(doc, dict):
        raise ValueError("errors validating JSON: [field: error:is not an object]")
    domains = doc.get("trust_domains")
    if domains is None:
        errs.add("trust_domains", "field not present")
    elif not isinstance(domains, dict):
        errs.add("trust_domains", "is not an object")
    else:
        for domain, bundle in domains.items():
            path = f'trust_domains["{domain}"]'
            try:
                validate_trust_domain(domain)
            except ValueError as err:
                errs.add(path, f"invalid trust domain: INVALID_ARGUMENT: {err}")
            roots = _bundle_roots(bundle, path, errs)
            if roots is not None:
                bundles[domain] = roots
    if errs:
        raise ValueError("errors validating JSON: [" + "; ".join(errs) + "]")
    return SpiffeBundleMap(bundles)


def _bundle_roots(bundle: Any, path: str, errs: _Errors) -> tuple[bytes, ...] | None:
    if not isinstance(bundle, dict):
        errs.add(path, "is not an object")
        return None
    keys = bundle.get("keys")
    if keys is None:
        errs.add(f"{path}.keys", "field not present")
        return None
    if not isinstance(keys, list):
        errs.add(f"{path}.keys", "is not an array")
        return None
    roots: list[bytes] = []
    for i, key in enumerate(keys):
        kpath = f"{path}.keys[{i}]"
        if not isinstance(key, dict):
            errs.add(kpath, "is not an object")
            continue
        for name, allowed in (("use", (_ALLOWED_USE,)), ("kty", _ALLOWED_KTY)):
            value = key.get(name)
            if value is None:
                errs.add(f"{kpath}.{name}", "field not present")
            elif not isinstance(value, str):
                errs.add(f"{kpath}.{name}", "is not a string")
            elif value not in allowed:
                expected = ", ".join(f'"{a}"' for a in allowed)
                which = "" if len(allowed) == 1 else "one of "
                errs.add(f"{kpath}.{name}", f'value must be {which}{expected}, got "{value}"')
        x5c = key.get("x5c")
        if x5c is None:
            errs.add(f"{kpath}.x5c", "field not present")
            continue
        if not isinstance(x5c, list) or not all(isinstance(c, str) for c in x5c):
            errs.add(f"{kpath}.x5c", "is not an array of strings")
            continue
        if len(x5c) != 1:
            errs.add(f"{kpath}.x5c", f"array length must be 1, got {len(x5c)}")
        if x5c:
            der = _certificate(x5c[0])
            if der is None:
                errs.add(f"{kpath}.x5c[0]", "not a base64 DER X.509 certificate")
            else:
                roots.append(der)
    return tuple(roots)


def _certificate(text: str) -> bytes | None:
    try:
        der = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        return None
    if not der:
        return None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=der)
    except (ssl.SSLError, ValueError):
        return None
    return der


def load_bundle_map(path: str) -> SpiffeBundleMap:
    """Read and parse a bundle map file; OSError or ValueError."""
    with open(path, "rb") as f:
        return parse_bundle_map(f.read())
