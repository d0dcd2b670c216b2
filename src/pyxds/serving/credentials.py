"""Server credentials from a filter chain's ``DownstreamTlsContext`` and the
bootstrap's certificate providers (gRFC A29 "Server Side").

* The identity (key and certificate chain) comes from the identity provider
  instance, the CA certificates that verify clients from the CA instance
  (:mod:`pyxds.security.providers`, ``file_watcher``).
* ``require_client_certificate``: grpcio's ``require_client_authentication``
  (the handshake fails without a client certificate the CA verifies).
  Without it grpcio does not ask for a client certificate at all (grpcio has
  no "request but do not require"); the peer identity is then unknown to
  RBAC, which fails closed on it (:mod:`pyxds.serving.rbac`).
* Rotation: the credentials are ``grpc.dynamic_ssl_server_credentials``
  whose fetcher grpcio calls at each new connection's handshake; it hands
  grpcio the providers' current files when they changed, so new connections
  use rotated certificates and established ones keep theirs.
* A provider that cannot read its files: at the start the port cannot serve
  (:class:`CredentialsError`, the reason names the file); later, grpcio keeps
  the last good certificates (its fetcher cannot fail a handshake) and the
  error is logged once per change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from pyxds._values import dataclass
from pyxds.security.providers import CertificateError, Certificates, get_provider
from pyxds.security.tls_config import ProviderRef
from pyxds.xds.resources.server_types import DownstreamTlsConfig

__all__ = ["CredentialsError", "ServerTls", "refresh_interval"]

_log = logging.getLogger(__name__)


class CredentialsError(Exception):
    """The certificates a Listener's TLS needs are not available."""


def _certificates(ref: ProviderRef) -> Certificates:
    try:
        provider = get_provider(ref.plugin_name or "file_watcher", ref.config)
    except CertificateError as err:
        raise CredentialsError(f"certificate provider {ref.instance_name!r}: {err}") from None
    return provider.certificates()


def refresh_interval(tls: DownstreamTlsConfig) -> float:
    """The shortest refresh interval of the TLS config's providers (when to
    try again after a read failed)."""
    intervals = []
    for ref in (tls.identity, tls.ca):
        if ref is None:
            continue
        try:
            intervals.append(
                get_provider(ref.plugin_name or "file_watcher", ref.config).refresh_interval
            )
        except CertificateError:
            continue
    return min(intervals, default=60.0)


@dataclass(frozen=True)
class _Files:
    key: bytes
    cert: bytes
    ca: bytes | None
    versions: tuple[int, int]


class ServerTls:
    """The grpcio credentials of one port for one ``DownstreamTlsConfig``."""

    def __init__(self, tls: DownstreamTlsConfig, on_error: Callable[[str], None] | None = None):
        self.tls = tls
        self._on_error = on_error
        self._files = self._read()  # raises CredentialsError
        self._last_error: str | None = None
        config = self._configuration(self._files)
        self.credentials = grpc.dynamic_ssl_server_credentials(
            config,
            self._fetch,  # type: ignore[arg-type]  # grpcio's fetcher returns None for "unchanged"; the stub omits None
            require_client_authentication=tls.require_client_certificate,
        )

    def _read(self) -> _Files:
        ident = _certificates(self.tls.identity)
        if ident.identity_error is not None or ident.cert_pem is None or ident.key_pem is None:
            raise CredentialsError(
                f"certificate provider {self.tls.identity.instance_name!r}: "
                f"{ident.identity_error or 'no identity certificate'}"
            )
        ca_pem = None
        ca_version = 0
        if self.tls.ca is not None:
            ca = _certificates(self.tls.ca)
            if ca.ca_error is not None or ca.ca_pem is None:
                raise CredentialsError(
                    f"certificate provider {self.tls.ca.instance_name!r}: "
                    f"{ca.ca_error or 'no CA certificates'}"
                )
            ca_pem, ca_version = ca.ca_pem, ca.version
        return _Files(ident.key_pem, ident.cert_pem, ca_pem, (ident.version, ca_version))

    @staticmethod
    def _configuration(files: _Files) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(files.key, files.cert)], root_certificates=files.ca
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """grpcio's per-handshake hook: new files, or None to keep the current."""
        try:
            files = self._read()
        except CredentialsError as err:
            text = str(err)
            if text != self._last_error:
                self._last_error = text
                _log.warning(
                    "xDS server TLS: %s; new connections keep the last good certificates", text
                )
                if self._on_error is not None:
                    self._on_error(text)
            return None
        self._last_error = None
        if files.versions == self._files.versions:
            return None
        self._files = files
        return self._configuration(files)
