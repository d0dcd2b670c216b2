"""The TLS relay: Python's ``ssl`` as the TLS layer under a grpcio subchannel
(gRFC A29 "Server Authorization").

grpcio offers no certificate-verification hook to Python: its
``ssl_channel_credentials`` verify the chain and the *hostname*, and nothing
can check ``match_subject_alt_names``.  So a subchannel of a cluster with an
``UpstreamTlsContext`` does not give grpcio the backend address: it gives it
a per-subchannel Unix socket served by a :class:`TlsRelay`.  For every
connection grpcio opens there, the relay

1. takes the certificates of the cluster's providers now (a rotated file is
   used by the next connection);
2. opens TCP to the backend and runs the TLS handshake with ``ssl``: the
   identity certificate and key when the cluster names one (mTLS), the
   chain verified against the provider's CA (``CERT_REQUIRED``; expiry,
   signature and purpose checked by OpenSSL), hostname verification off
   (A29: SAN matching replaces it), ALPN ``h2``;
3. checks ``match_subject_alt_names`` against the leaf certificate of *this*
   TLS connection (:mod:`pyxds.security.san`);
4. only then reads grpcio's bytes and relays both ways: grpcio's HTTP/2
   frames travel inside the very TLS session that was verified.  Any
   failure closes grpcio's side before a byte is relayed, so the subchannel
   goes TRANSIENT_FAILURE and :attr:`TlsRelay.last_error` says why (the
   subchannel's status).  A server that refuses the client certificate does
   so after the client's handshake ends (TLS 1.3): a connection that fails
   or closes before the backend's first byte counts as a failed attempt too.

What is enforced is exactly: chain to the provider's CA, validity period,
the SAN matchers of the cluster (exact/prefix/suffix/contains/safe_regex,
ignore_case; DNS wildcard rules for exact on DNS SANs), the client
certificate sent when configured.  The plaintext leg is a Unix socket in a
private (0700) directory, never a network port.

Speed: the bytes move on a few epoll threads shared by every relay of the
process (:mod:`pyxds.security.relay_loop`, at most
:data:`~pyxds.security.relay_loop.LOOP_THREADS`), over non-blocking
``ssl.SSLSocket`` objects whose ``SSL_read``/``SSL_write`` and socket calls
run in C with the GIL released; each wake-up moves everything that is
there (up to 256 KiB) with one read and one write per direction
(:mod:`pyxds.security.relay_conn`).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import socket
import ssl
import tempfile
import threading
from typing import Any

from pyxds.security import san
from pyxds.security.providers import CertificateError, Certificates, get_provider
from pyxds.security.relay_conn import HANDSHAKE_TIMEOUT, RelayConnection
from pyxds.security.relay_loop import IN, RelayLoop, least_loaded
from pyxds.security.tls_config import UpstreamTlsConfig

_log = logging.getLogger(__name__)

__all__ = ["HANDSHAKE_TIMEOUT", "SAN_MISMATCH", "TlsRelay", "split_host_port"]

SAN_MISMATCH = "SANs from certificate did not match SANs from xDS control plane"


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class _ContextCache:
    """SSLContexts built from provider snapshots, rebuilt when one changes."""

    def __init__(self, tls: UpstreamTlsConfig) -> None:
        self._tls = tls
        self._key: Any = None
        self._ctx: ssl.SSLContext | None = None
        self._lock = threading.Lock()

    def context(self) -> ssl.SSLContext:
        with self._lock:
            return self._context()

    def _context(self) -> ssl.SSLContext:
        tls = self._tls
        ca_ref, id_ref = tls.ca, tls.identity
        ca = _snapshot(ca_ref) if ca_ref is not None else None
        ident = _snapshot(id_ref) if id_ref is not None else None
        key = (ca.version if ca else None, ident.version if ident else None)
        if key == self._key and self._ctx is not None:
            return self._ctx
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False  # A29: SAN matching instead of hostname checks
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["h2"])
        if tls.system_root_certs:
            ctx.load_default_certs()
        elif ca is not None and ca_ref is not None:
            if ca.ca_pem is None:
                raise CertificateError(
                    f"certificate provider {ca_ref.instance_name!r}: {ca.ca_error}"
                )
            try:
                ctx.load_verify_locations(cadata=ca.ca_pem.decode("ascii", "replace"))
            except (ssl.SSLError, ValueError) as err:
                raise CertificateError(
                    f"certificate provider {ca_ref.instance_name!r}: ca_certificate_file "
                    f"holds no usable PEM certificate: {err}"
                ) from None
        if ident is not None and id_ref is not None:
            if ident.cert_pem is None or ident.key_pem is None:
                raise CertificateError(
                    f"certificate provider {id_ref.instance_name!r}: {ident.identity_error}"
                )
            _load_identity(ctx, ident.cert_pem, ident.key_pem, id_ref.instance_name)
        self._key, self._ctx = key, ctx
        return ctx


def _snapshot(ref: Any) -> Certificates:
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
        except ssl.SSLError as err:
            raise CertificateError(
                f"certificate provider {instance!r}: identity certificate and key "
                f"do not load: {err.reason or err}"
            ) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class TlsRelay:
    """One subchannel's relay to ``backend`` under ``tls`` (see module doc)."""

    def __init__(self, backend: str, tls: UpstreamTlsConfig) -> None:
        self.backend = backend
        self.tls = tls
        self.last_error: str | None = None
        self.peer_sans: list[tuple[str, str]] | None = None  # of the last verified peer
        self._contexts = _ContextCache(tls)
        self.host, self.port = split_host_port(backend)
        self._dir = tempfile.mkdtemp(prefix="pyxds-tls-")
        self._path = os.path.join(self._dir, "s")
        self._closed = False
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self._path)
            listener.listen(64)
            listener.setblocking(False)
        except OSError:
            listener.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._listener = listener
        self._loop: RelayLoop = least_loaded()
        self._loop.call_soon(lambda: self._loop.register(listener.fileno(), IN, self._accept))

    @property
    def address(self) -> str:
        """The grpcio target of this relay."""
        return f"unix:{self._path}"

    def info(self) -> dict[str, Any]:
        """For config_dump: what the last connection verified, or why it failed."""
        out: dict[str, Any] = {
            "ca_provider": self.tls.ca.instance_name if self.tls.ca else None,
            "identity_provider": self.tls.identity.instance_name if self.tls.identity else None,
            "san_matchers": [f"{m.kind}:{m.value}" for m in self.tls.san_matchers],
        }
        if self.peer_sans is not None:
            out["peer_sans"] = [f"{kind}:{value}" for kind, value in self.peer_sans]
        if self.last_error is not None:
            out["last_error"] = self.last_error
        return out

    def close(self) -> None:
        """Stop accepting; connections already relayed run until they end."""
        if self._closed:
            return
        self._closed = True
        listener, loop = self._listener, self._loop

        def stop() -> None:
            loop.unregister(listener.fileno())
            listener.close()

        loop.call_soon(stop)
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- the loop threads -------------------------------------------------

    def _accept(self, mask: int) -> None:
        while True:
            try:
                plain, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                _log.warning("pyxds TLS relay for %s: accept failed: %s", self.backend, err)
                return
            loop = least_loaded()
            loop.connections += 1
            loop.call_soon(functools.partial(self._start, loop, plain))

    def _start(self, loop: RelayLoop, plain: socket.socket) -> None:
        conn = RelayConnection(loop, self, plain)
        try:
            ctx = self._contexts.context()
        except CertificateError as err:
            conn.fail(str(err))
            return
        conn.start(ctx)

    # RelayConnection's owner interface (called on a loop thread).

    def server_hostname(self) -> str | None:
        return self.host

    def check(self, tls: ssl.SSLSocket, attempt: int) -> str | None:
        peer = tls.getpeercert()
        if not san.check(self.tls.san_matchers, peer):
            return SAN_MISMATCH
        return None

    def verified(self, tls: ssl.SSLSocket) -> None:
        self.peer_sans = san.sans_of(tls.getpeercert() or {})

    def first_byte(self) -> None:
        self.last_error = None

    def failed(self, reason: str) -> None:
        if reason != self.last_error:
            _log.warning("pyxds TLS to %s: %s", self.backend, reason)
        self.last_error = reason
