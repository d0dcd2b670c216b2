"""TLS backends for the security e2e tests that grpcio's server cannot be:

* :class:`TlsFront` terminates TLS with Python's ``ssl`` (ALPN ``h2``,
  client certificate required unless told otherwise) and relays the
  plaintext to a grpcio backend, so RPCs through it are real gRPC.  It picks
  its certificate by the SNI the client sent (``certs`` maps a server name,
  or None for "no SNI / unknown name", to a certificate) and records every
  SNI it saw.  It can also misbehave: ``mode="stall"`` reads the
  ClientHello and never answers, ``"close"`` completes the handshake then
  closes, ``"no-alpn"`` does not negotiate ALPN.

Everything listens on 127.0.0.1; every thread is a daemon and every socket
is closed by :meth:`TlsFront.close`.
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
import threading

from pyxds.testing.certs import Pem


def _context(leaf: Pem, client_ca: bytes | None, alpn: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    folder = tempfile.mkdtemp(prefix="pyxds-front-")
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    with open(cert, "wb") as f:
        f.write(leaf.cert)
    with open(key, "wb") as f:
        f.write(leaf.key)
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=client_ca.decode())
    if alpn:
        ctx.set_alpn_protocols(["h2"])
    return ctx


class TlsFront:
    """See the module docstring."""

    def __init__(
        self,
        upstream: str,
        certs: dict[str | None, Pem],
        client_ca: bytes | None = None,
        mode: str = "relay",
    ) -> None:
        self.upstream = upstream
        self.mode = mode
        self.sni_seen: list[str | None] = []
        self.handshakes = 0
        self._contexts = {
            name: _context(pem, client_ca, alpn=mode != "no-alpn") for name, pem in certs.items()
        }
        default = self._contexts.get(None) or next(iter(self._contexts.values()))
        self._default = default
        default.sni_callback = self._pick
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="tls-front")
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _pick(self, tls: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: object) -> None:
        self.sni_seen.append(name)
        ctx = self._contexts.get(name) or self._contexts.get(None)
        if ctx is not None and ctx is not self._default:
            tls.context = ctx
        return None

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.append(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._track(conn)
            threading.Thread(
                target=self._serve, args=(conn,), daemon=True, name="tls-front-conn"
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        if self.mode == "stall":
            try:
                conn.recv(65536)  # the ClientHello; never answered
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            return
        try:
            tls = self._default.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            conn.close()
            return
        self.handshakes += 1
        self._track(tls)
        if self.mode == "close":
            tls.close()
            return
        host, _, port = self.upstream.rpartition(":")
        try:
            up = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            tls.close()
            return
        up.settimeout(None)
        self._track(up)
        _relay(tls, up)

    def close(self) -> None:
        self._closed = True
        # close() alone wakes no accept() on Linux (the thread would stay
        # blocked and the port listening): shutdown() makes it return
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._acceptor.join(5)
        with self._lock:
            for sock in self._open:
                try:
                    sock.close()
                except OSError:
                    pass


def _relay(tls: ssl.SSLSocket, up: socket.socket) -> None:
    """Both directions on one thread (one SSL object is never used by two)."""
    import select

    try:
        while True:
            if not tls.pending():
                readable, _, _ = select.select([tls, up], [], [], 30)
                if not readable:
                    continue
            else:
                readable = [tls]
            if tls in readable:
                data = tls.recv(65536)
                if not data:
                    break
                up.sendall(data)
            if up in readable:
                data = up.recv(65536)
                if not data:
                    break
                tls.sendall(data)
    except OSError:
        pass
    finally:
        for s in (tls, up):
            try:
                s.close()
            except OSError:
                pass
