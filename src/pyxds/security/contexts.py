"""Client TLS contexts built from a cluster's certificate providers (gRFC
A29 "CommonTlsContext Processing", A87 SPIFFE verification).

:class:`ClientContexts` turns the providers' current certificates into a
:class:`Trust`: the ``ssl.SSLContext`` objects a connection may handshake
with, rebuilt only when a provider's content changes (``version``).
Every context: TLS >= 1.2, ALPN ``h2``, ``CERT_REQUIRED`` (chain,
signatures, validity period checked by OpenSSL), hostname check off (A29:
SAN matching replaces it), the identity certificate and key when the
cluster names an identity provider.

Roots:

* CA certificates (``ca_certificate_file``) or the system roots (A82): one
  context.
* A SPIFFE trust bundle map (A87): the roots must be those of the *peer's*
  trust domain, which is known only once the peer's certificate is.  So a
  connection first handshakes with the union of every domain's roots
  (:attr:`Trust.first`): a chain that does not verify against the union
  verifies against no single domain either (refused at once).  If it
  verifies, the peer's SPIFFE ID names its domain; when that domain's roots
  are not the whole union, the connection handshakes again, on a new TCP
  connection, with that domain's roots only (:meth:`Trust.for_domain`) and
  is accepted only if the same domain comes back.  The verification that
  counts is always OpenSSL's, with exactly the domain's roots, on the
  connection that then carries the bytes.
"""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile
import threading

from pyxds.security.providers import CertificateError, Certificates, get_provider
from pyxds.security.spiffe import SpiffeBundleMap
from pyxds.security.tls_config import ProviderRef, UpstreamTlsConfig

__all__ = ["ClientContexts", "Trust"]


def _base_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # A29: SAN matching instead of hostname checks
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    return ctx


class Trust:
    """The contexts of one provider snapshot (see the module docstring)."""

    def __init__(
        self,
        tls: UpstreamTlsConfig,
        ca: Certificates | None,
        identity: Certificates | None,
    ) -> None:
        self._tls = tls
        self._identity = identity
        self.spiffe: SpiffeBundleMap | None = ca.spiffe if ca is not None else None
        self._domains: dict[str, ssl.SSLContext] = {}
        self._union: frozenset[bytes] = frozenset()
        self._lock = threading.Lock()
        ctx = self._new_context()
        if tls.system_root_certs:
            ctx.load_default_certs()
        elif self.spiffe is not None:
            union = {der for roots in self.spiffe.bundles.values() for der in roots}
            self._union = frozenset(union)
            if union:
                ctx.load_verify_locations(cadata=b"".join(sorted(union)))
        elif ca is not None and tls.ca is not None:
            if ca.ca_pem is None:
                raise CertificateError(
                    f"certificate provider {tls.ca.instance_name!r}: {ca.ca_error}"
                )
            try:
                ctx.load_verify_locations(cadata=ca.ca_pem.decode("ascii"))
            except (ssl.SSLError, ValueError, TypeError) as err:  # UnicodeDecodeError too
                raise CertificateError(
                    f"certificate provider {tls.ca.instance_name!r}: ca_certificate_file "
                    f"holds no usable PEM certificate: {getattr(err, 'reason', None) or err}"
                ) from None
        self.first = ctx

    def _new_context(self) -> ssl.SSLContext:
        ctx = _base_context()
        ident, ref = self._identity, self._tls.identity
        if ident is not None and ref is not None:
            if ident.cert_pem is None or ident.key_pem is None:
                raise CertificateError(
                    f"certificate provider {ref.instance_name!r}: {ident.identity_error}"
                )
            _load_identity(ctx, ident.cert_pem, ident.key_pem, ref.instance_name)
        return ctx

    def for_domain(self, domain: str) -> ssl.SSLContext:
        """SPIFFE: the context whose roots are exactly ``domain``'s; KeyError
        ("No spiffe bundle found for trust domain X") when the map has none."""
        assert self.spiffe is not None
        roots = self.spiffe.roots(domain)
        if frozenset(roots) == self._union:
            return self.first
        with self._lock:
            ctx = self._domains.get(domain)
            if ctx is None:
                ctx = self._new_context()
                if roots:
                    ctx.load_verify_locations(cadata=b"".join(roots))
                self._domains[domain] = ctx
            return ctx


class ClientContexts:
    """A cluster's :class:`Trust`, rebuilt when a provider's content changes."""

    def __init__(self, tls: UpstreamTlsConfig) -> None:
        self._tls = tls
        self._key: tuple[int | None, int | None] | None = None
        self._trust: Trust | None = None
        self._lock = threading.Lock()

    def trust(self) -> Trust:
        """The contexts for a new connection; CertificateError if the
        providers cannot give what the cluster needs."""
        tls = self._tls
        ca = _snapshot(tls.ca) if tls.ca is not None else None
        ident = _snapshot(tls.identity) if tls.identity is not None else None
        key = (ca.version if ca else None, ident.version if ident else None)
        with self._lock:
            if key != self._key or self._trust is None:
                self._trust = None
                self._key = key
                self._trust = Trust(tls, ca, ident)
            return self._trust


def _snapshot(ref: ProviderRef) -> Certificates:
    return get_provider(ref.plugin_name, ref.config).certificates()


def _load_identity(ctx: ssl.SSLContext, cert: bytes, key: bytes, instance: str) -> None:
    # ssl loads a chain only from files: a private directory, removed at once.
    folder = tempfile.mkdtemp(prefix="pyxds-id-")
    try:
        cert_path = os.path.join(folder, "cert.pem")
        key_path = os.path.join(folder, "key.pem")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        try:
            ctx.load_cert_chain(cert_path, key_path)
        except (ssl.SSLError, ValueError) as err:
            raise CertificateError(
                f"certificate provider {instance!r}: identity certificate and key "
                f"do not load: {getattr(err, 'reason', None) or err}"
            ) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
