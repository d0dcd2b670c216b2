"""The checks of a server certificate after the TLS handshake verified its
chain (gRFC A29 "Server Authorization", A87 SPIFFE verification, A101 SAN
validation against SNI), in C-core's order and words (grpcio 1.85
``tls_security_connector.cc``, ``xds_credentials.cc``):

1. The server selected ALPN ``h2`` ("Cannot check peer: missing selected
   ALPN property.").
2. With a SPIFFE bundle map (A87): the leaf has exactly one URI SAN, a
   valid SPIFFE ID, whose trust domain the map has; the chain must have
   been verified with exactly that domain's roots (the caller is told which
   context that is, and handshakes again if it used another).
3. ``auto_sni_san_validation`` (A101) and an SNI: a DNS SAN matches the
   SNI by DNS rules (any case, trailing dot, ``*.`` wildcard), and the SAN
   matchers are not used.
4. Otherwise (also ``auto_sni_san_validation`` with no SNI, A101: "validation
   will use any SAN matchers specified in the validation context instead",
   as grpc-go; C-core 1.85 refuses every peer there) the cluster's
   ``match_subject_alt_names`` (:mod:`.san`).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from typing import Any

from pyxds.security import san
from pyxds.security.spiffe import SpiffeBundleMap, peer_spiffe_id
from pyxds.security.tls_config import UpstreamTlsConfig

SAN_MISMATCH = "SANs from certificate did not match SANs from xDS control plane"
SNI_MISMATCH = "SANs from certificate did not match SNI from xDS control plane"
ALPN_MISSING = "Cannot check peer: missing selected ALPN property."


def check_peer(
    tls: UpstreamTlsConfig,
    sni: str | None,
    spiffe: SpiffeBundleMap | None,
    domain_context: Callable[[str], ssl.SSLContext],
    alpn: str | None,
    peer_cert: Mapping[str, Any] | None,
) -> str | ssl.SSLContext | None:
    """None when the peer is authorized; the reason (str) when not; with a
    SPIFFE map and a good peer, the context of the peer's trust domain
    (``domain_context(domain)``) that the chain must have been verified
    with."""
    if alpn != "h2":
        return ALPN_MISSING
    wanted: ssl.SSLContext | None = None
    if spiffe is not None:
        try:
            spiffe_id = peer_spiffe_id(peer_cert)
            wanted = domain_context(spiffe_id.trust_domain)
        except (ValueError, KeyError) as err:
            return f"SPIFFE verification failed: {err.args[0]}"
    if tls.auto_sni_san_validation and sni:
        sans = san.sans_of(peer_cert or {})
        if not any(kind == "dns" and san.dns_exact(value, sni) for kind, value in sans):
            return SNI_MISMATCH
    elif not san.check(tls.san_matchers, peer_cert):
        return SAN_MISMATCH
    return wanted
