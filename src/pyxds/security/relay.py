"""The TLS relay: Python's ``ssl`` as the TLS layer under a grpcio subchannel
(gRFC A29 "Server Authorization", A87 SPIFFE, A101 SNI).

grpcio offers no certificate-verification hook to Python: its
``ssl_channel_credentials`` verify the chain and the *hostname*, and nothing
can check ``match_subject_alt_names``.  So a subchannel of a cluster with an
``UpstreamTlsContext`` does not give grpcio the backend address: it gives it
a per-subchannel Unix socket served by a :class:`TlsRelay`.  For every
connection grpcio opens there, the relay

1. takes the certificates of the cluster's providers now (a rotated file is
   used by the next connection; :mod:`pyxds.security.contexts`);
2. opens TCP to the backend and runs the TLS handshake with ``ssl``: the
   identity certificate and key when the cluster names one (mTLS), the
   chain verified by OpenSSL against the provider's CA, or with a SPIFFE
   bundle map against the roots of the peer's trust domain (A87), expiry,
   signature and purpose included; hostname verification off (A29: SAN
   matching replaces it); ALPN ``h2``; SNI as A101 (:func:`server_name`);
3. checks the certificate of *this* TLS connection (:meth:`TlsRelay.check`,
   C-core's order): the server selected ALPN ``h2``; with a bundle map, the
   leaf has exactly one URI SAN, a valid SPIFFE ID whose trust domain the
   map has; then either (``auto_sni_san_validation``) a DNS SAN matches the
   SNI by DNS rules, or the SAN matchers of the cluster match
   (:mod:`pyxds.security.san`);
4. only then reads grpcio's bytes and relays both ways: grpcio's HTTP/2
   frames travel inside the very TLS session that was verified.  Any
   failure closes grpcio's side before a byte is relayed, so the subchannel
   goes TRANSIENT_FAILURE and :attr:`TlsRelay.last_error` says why (the
   subchannel's status).  A server that refuses the client certificate does
   so after the client's handshake ends (TLS 1.3): a connection that fails
   or closes before the backend's first byte counts as a failed attempt too.

The plaintext leg is a Unix socket in a private (0700) directory, never a
network port and never an abstract socket (which any local user could
reach).

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
from typing import Any

from pyxds.security import san
from pyxds.security.contexts import ClientContexts, Trust
from pyxds.security.peer_check import ALPN_MISSING, SAN_MISMATCH, SNI_MISMATCH, check_peer
from pyxds.security.providers import CertificateError
from pyxds.security.relay_conn import HANDSHAKE_TIMEOUT, RelayConnection, Retry
from pyxds.security.relay_loop import IN, RelayLoop, least_loaded
from pyxds.security.spiffe import peer_spiffe_id
from pyxds.security.tls_config import UpstreamTlsConfig, server_name

_log = logging.getLogger(__name__)

__all__ = [
    "ALPN_MISSING",
    "HANDSHAKE_TIMEOUT",
    "SAN_MISMATCH",
    "SNI_MISMATCH",
    "TlsRelay",
    "server_name",
    "split_host_port",
]


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class TlsRelay:
    """One subchannel's relay to ``backend`` under ``tls`` (see module doc);
    ``sni`` is the name of :func:`server_name` for this endpoint (None: no
    SNI)."""

    def __init__(self, backend: str, tls: UpstreamTlsConfig, sni: str | None = None) -> None:
        self.backend = backend
        self.tls = tls
        self.sni = sni
        self.last_error: str | None = None
        self.peer_sans: list[tuple[str, str]] | None = None  # of the last verified peer
        self.peer_spiffe_id: str | None = None
        self._contexts = ClientContexts(tls)
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
        self._loop: RelayLoop = least_loaded(count=False)
        self._loop.call_soon(lambda: self._loop.register(listener.fileno(), IN, self._accept))

    @property
    def address(self) -> str:
        """The grpcio target of this relay."""
        return f"unix:{self._path}"

    def info(self) -> dict[str, Any]:
        """For config_dump: what the last connection verified, or why it failed."""
        tls = self.tls
        out: dict[str, Any] = {
            "ca_provider": tls.ca.instance_name if tls.ca else None,
            "identity_provider": tls.identity.instance_name if tls.identity else None,
            "san_matchers": [f"{m.kind}:{m.value}" for m in tls.san_matchers],
        }
        if self.sni is not None:
            out["sni"] = self.sni
        if tls.auto_sni_san_validation:
            out["auto_sni_san_validation"] = True
        if self.peer_sans is not None:
            out["peer_sans"] = [f"{kind}:{value}" for kind, value in self.peer_sans]
        if self.peer_spiffe_id is not None:
            out["peer_spiffe_id"] = self.peer_spiffe_id
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
            loop = least_loaded()  # counted there now; RelayConnection.close() ends it
            loop.call_soon(functools.partial(self._start, loop, plain))

    def _start(self, loop: RelayLoop, plain: socket.socket) -> None:
        conn = RelayConnection(loop, self, plain)
        try:
            trust = self._contexts.trust()
        except CertificateError as err:
            conn.fail(str(err))
            return
        except Exception as err:  # never leave grpcio's socket open and unanswered
            _log.exception("pyxds TLS relay for %s: cannot build the TLS context", self.backend)
            conn.fail(f"cannot build the TLS context: {err!r}")
            return
        conn.trust = trust
        conn.start(trust.first)

    # RelayConnection's owner interface (called on a loop thread).

    def server_hostname(self) -> str | None:
        return self.sni

    def check(self, conn: RelayConnection, tls: ssl.SSLSocket) -> str | None:
        trust: Trust = conn.trust
        wanted = check_peer(
            self.tls,
            self.sni,
            trust.spiffe,
            trust.for_domain,
            tls.selected_alpn_protocol(),
            tls.getpeercert(),
        )
        if isinstance(wanted, str) or wanted is None:
            return wanted
        if conn.context is wanted:
            return None
        if conn.attempt > 1:
            return "SPIFFE verification failed: the peer's trust domain changed between handshakes"
        raise Retry(wanted)  # A87: again, with exactly the peer's trust domain's roots

    def verified(self, conn: RelayConnection, tls: ssl.SSLSocket) -> None:
        peer = tls.getpeercert() or {}
        self.peer_sans = san.sans_of(peer)
        if conn.trust is not None and conn.trust.spiffe is not None:
            self.peer_spiffe_id = str(peer_spiffe_id(peer))

    def first_byte(self) -> None:
        self.last_error = None

    def failed(self, reason: str) -> None:
        if reason != self.last_error:
            _log.warning("pyxds TLS to %s: %s", self.backend, reason)
        self.last_error = reason
