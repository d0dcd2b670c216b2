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
4. only then relays bytes both ways: grpcio's HTTP/2 frames travel inside
   the very TLS session that was verified.  Any failure closes grpcio's
   side before a byte is relayed, so the subchannel goes TRANSIENT_FAILURE
   and :attr:`TlsRelay.last_error` says why (the subchannel's status).  A
   server that refuses the client certificate does so after the client's
   handshake ends (TLS 1.3): a connection that fails or closes before the
   backend's first byte counts as a failed attempt too.

What is enforced is exactly: chain to the provider's CA, validity period,
the SAN matchers of the cluster (exact/prefix/suffix/contains/safe_regex,
ignore_case; DNS wildcard rules for exact on DNS SANs), the client
certificate sent when configured.  The plaintext leg is a Unix socket in a
private (0700) directory, never a network port.

All relays share one event loop on one daemon thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import ssl
import tempfile
import threading
from typing import Any

from pyxds.security import san
from pyxds.security.providers import CertificateError, Certificates, get_provider
from pyxds.security.tls_config import UpstreamTlsConfig

_log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 20.0
_CHUNK = 256 * 1024

SAN_MISMATCH = "SANs from certificate did not match SANs from xDS control plane"


class _Loop:
    """The relays' event loop thread (started on first use)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="pyxds-tls-relay", daemon=True
                ).start()
                cls._loop = loop
            return cls._loop


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

    def context(self) -> ssl.SSLContext:
        tls = self._tls
        ca = _snapshot(tls.ca) if tls.ca is not None else None
        ident = _snapshot(tls.identity) if tls.identity is not None else None
        ca_name = tls.ca.instance_name if tls.ca is not None else ""
        ident_name = tls.identity.instance_name if tls.identity is not None else ""
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
        elif ca is not None:
            if ca.ca_pem is None:
                raise CertificateError(f"certificate provider {ca_name!r}: {ca.ca_error}")
            try:
                ctx.load_verify_locations(cadata=ca.ca_pem.decode("ascii", "replace"))
            except (ssl.SSLError, ValueError) as err:
                raise CertificateError(
                    f"certificate provider {ca_name!r}: ca_certificate_file "
                    f"holds no usable PEM certificate: {err}"
                ) from None
        if ident is not None:
            if ident.cert_pem is None or ident.key_pem is None:
                raise CertificateError(
                    f"certificate provider {ident_name!r}: {ident.identity_error}"
                )
            _load_identity(ctx, ident.cert_pem, ident.key_pem, ident_name)
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
        self._host, self._port = split_host_port(backend)
        self._dir = tempfile.mkdtemp(prefix="pyxds-tls-")
        self._path = os.path.join(self._dir, "s")
        self._loop = _Loop.get()
        self._server: asyncio.AbstractServer | None = None
        self._closed = False
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_unix_server(self._handle, path=self._path), self._loop
        )
        self._server = future.result(10)

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
        server = self._server
        if server is not None:
            self._loop.call_soon_threadsafe(server.close)
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- the loop thread ------------------------------------------------

    def _fail(self, message: str) -> None:
        if message != self.last_error:
            _log.warning("pyxds TLS to %s: %s", self.backend, message)
        self.last_error = message

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_writer = None
        try:
            try:
                ctx = self._contexts.context()
            except CertificateError as err:
                self._fail(str(err))
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        self._host, self._port, ssl=ctx, server_hostname=self._host
                    ),
                    HANDSHAKE_TIMEOUT,
                )
            except ssl.SSLCertVerificationError as err:
                self._fail(f"certificate verification failed: {err.verify_message}")
                return
            except (TimeoutError, ssl.SSLError, OSError) as err:
                self._fail(f"TLS handshake with {self.backend} failed: {err!r}")
                return
            ssl_object = up_writer.get_extra_info("ssl_object")
            peer = ssl_object.getpeercert() if ssl_object is not None else None
            if not san.check(self.tls.san_matchers, peer):
                self._fail(SAN_MISMATCH)
                return
            self.peer_sans = san.sans_of(peer or {})
            await asyncio.gather(
                _pipe(reader, up_writer),
                self._downstream(up_reader, writer),
                return_exceptions=True,
            )
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()

    async def _downstream(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Backend -> grpcio.  A TLS connection that fails or closes before
        its first byte was refused by the server after the handshake (TLS
        1.3 reports a rejected client certificate only then): that is a
        failed connection attempt, with its reason."""
        first = True
        try:
            while True:
                try:
                    data = await src.read(_CHUNK)
                except (ssl.SSLError, OSError) as err:
                    if first:
                        reason = getattr(err, "reason", None) or repr(err)
                        self._fail(f"TLS connection with {self.backend} failed: {reason}")
                    return
                if not data:
                    if first:
                        self._fail(
                            f"TLS connection with {self.backend} closed by the server right "
                            "after the handshake (e.g. the client certificate was refused)"
                        )
                    return
                if first:
                    first = False
                    self.last_error = None
                dst.write(data)
                await dst.drain()
        finally:
            with contextlib.suppress(Exception):
                dst.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await src.read(_CHUNK)
            if not data:
                break
            dst.write(data)
            await dst.drain()
    finally:
        with contextlib.suppress(Exception):
            dst.close()
