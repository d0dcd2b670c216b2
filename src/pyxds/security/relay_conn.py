"""One relayed connection: grpcio's plaintext Unix-socket side and the
verified TLS connection to the backend (gRFC A29 "Server Authorization";
the relay's design is in :mod:`pyxds.security.relay`).

States, each entered on the connection's loop thread only:

1. *connecting*: a non-blocking TCP connect to the backend (``TCP_NODELAY``).
   Until step 4 grpcio's socket is watched only for grpcio closing it (its
   own connect deadline passed): the attempt is then abandoned at once.
2. *handshaking*: ``ssl`` drives the handshake over the non-blocking socket
   (``SSL_do_handshake``); the chain is verified by OpenSSL against the
   context's roots while it runs.
3. *checking*: the owner's ``check`` runs on the certificate of this very
   connection (SAN matchers, SPIFFE, SNI); it may ask for one more
   handshake with other roots (:class:`Retry`, A87: roots chosen by the
   peer's trust domain), on a new TCP connection, still before a byte of
   grpcio's flows.
4. *relaying*: grpcio's bytes are read from the Unix socket only now.
   Each direction: read as much as is there (up to the loop's buffer) and
   write it at once; what the other side cannot take yet is kept (the only
   copy) and the reading side is paused until it drained (backpressure
   both ways, no unbounded buffering).
5. *closed*: both sockets closed, timers cancelled, the loop's count
   decremented; reached from any state on any error or end of stream.

The first failure of a connection is reported once to the owner
(``failed(reason)``) *before* grpcio's socket is closed, so grpcio's
subchannel sees the reason when it sees the connection fail.  A TLS
connection that ends or fails before the backend's first byte is a failed
attempt too (TLS 1.3 servers refuse a client certificate after the client's
handshake ends).
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol

from pyxds.security.relay_loop import ERR, IN, OUT, RDHUP, RelayLoop, Timer

_log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 20.0
"""Seconds from the start of the TCP connect to a verified TLS session."""

STREAMING = 8 * 1024
"""A read this large means the peer is streaming: read again at once."""

_BURST = 64  # reads per wake-up per direction at most (fairness between connections)
_PLAIN_SNDBUF = 1 << 20
_SMALL_RECORD = 4096  # a record this small is likely the last of a burst


class Retry(Exception):
    """Raised by a check: handshake again with ``context`` (and check again)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__("retry")
        self.context = context


class Owner(Protocol):
    """What a connection needs from its relay."""

    backend: str
    host: str
    port: int

    def server_hostname(self) -> str | None: ...
    def check(self, conn: RelayConnection, tls: ssl.SSLSocket) -> str | None: ...
    def verified(self, conn: RelayConnection, tls: ssl.SSLSocket) -> None: ...
    def first_byte(self) -> None: ...
    def failed(self, reason: str) -> None: ...


class RelayConnection:
    """See the module docstring."""

    __slots__ = (
        "loop",
        "owner",
        "plain",
        "tcp",
        "tls",
        "context",
        "trust",
        "attempt",
        "timer",
        "up_pending",
        "down_pending",
        "plain_events",
        "tls_events",
        "got_first_byte",
        "closed",
        "tls_eof",
        "plain_eof",
        "read_wants_write",
        "_read_tls",
        "_write_tls",
    )

    def __init__(self, loop: RelayLoop, owner: Owner, plain: socket.socket) -> None:
        self.loop = loop
        self.owner = owner
        self.plain = plain
        self.tcp: socket.socket | None = None
        self.tls: ssl.SSLSocket | None = None
        self.context: ssl.SSLContext | None = None
        self.trust: Any = None  # the owner's per-connection data
        self.attempt = 0
        self.timer: Timer | None = None
        self.up_pending: bytes | None = None  # read from grpcio, not yet taken by TLS
        self.down_pending: memoryview | None = None  # from the backend, not yet sent
        self.plain_events = 0
        self.tls_events = 0
        self.got_first_byte = False
        self.closed = False
        self.tls_eof = False
        self.plain_eof = False
        self.read_wants_write = False
        self._read_tls: Callable[[int, memoryview], int] | None = None
        self._write_tls: Callable[[bytes | memoryview], int] | None = None

    def _guarded(self, handler: Callable[[int], None]) -> Callable[[int], None]:
        """``handler`` for the loop: an unexpected exception fails this
        connection (grpcio's side closed, the reason kept) instead of leaving
        a socket that the level-triggered loop would report forever."""

        def run(mask: int) -> None:
            try:
                handler(mask)
            except Exception as err:
                _log.exception("pyxds TLS relay to %s: unexpected error", self.owner.backend)
                self.fail(f"TLS relay error: {err!r}")

        return run

    # -- setup -----------------------------------------------------------
    def start(self, context: ssl.SSLContext) -> None:
        """Begin (on the loop thread): connect, then handshake with ``context``."""
        self.plain.setblocking(False)
        try:  # room for a whole burst towards grpcio (capped by net.core.wmem_max)
            self.plain.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _PLAIN_SNDBUF)
        except OSError:
            pass
        self.timer = self.loop.call_at(time.monotonic() + HANDSHAKE_TIMEOUT, self._timed_out)
        # Until verified, grpcio's side is watched only for grpcio giving up
        # (its connect deadline): then the handshake is abandoned at once.
        self.plain_events = RDHUP
        self.loop.register(self.plain.fileno(), RDHUP, self._guarded(self._on_plain_closed))
        self._connect(context)

    def _on_plain_closed(self, mask: int) -> None:
        self.close()

    def _connect(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.attempt += 1
        host, port = self.owner.host, self.owner.port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            tcp = socket.socket(family, socket.SOCK_STREAM)
        except OSError as err:
            self.fail(f"cannot create a socket: {err.strerror or err}")
            return
        self.tcp = tcp
        tcp.setblocking(False)
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = tcp.connect_ex((host, port))
        if code not in (0, errno.EINPROGRESS):
            self.fail(f"connect to {self.owner.backend} failed: {errno.errorcode.get(code, code)}")
            return
        self.loop.register(tcp.fileno(), OUT, self._guarded(self._on_connected))

    def _on_connected(self, mask: int) -> None:
        tcp = self.tcp
        assert tcp is not None and self.context is not None
        code = tcp.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self.fail(
                f"connect to {self.owner.backend} failed: {errno.errorcode.get(code, code)} "
                f"({_strerror(code)})"
            )
            return
        try:
            self.tls = self.context.wrap_socket(
                tcp,
                server_hostname=self.owner.server_hostname(),
                do_handshake_on_connect=False,
            )
        except (ssl.SSLError, ValueError, OSError) as err:
            self.fail(f"TLS setup for {self.owner.backend} failed: {err}")
            return
        # wrap_socket keeps the descriptor: the registration stays valid.
        self.tcp = None
        self.loop.unregister(self.tls.fileno())
        self.tls_events = OUT
        self.loop.register(self.tls.fileno(), OUT, self._guarded(self._on_handshake))
        self._handshake()

    def _on_handshake(self, mask: int) -> None:
        self._handshake()

    def _handshake(self) -> None:
        tls = self.tls
        assert tls is not None
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            self._tls_interest(IN)
            return
        except ssl.SSLWantWriteError:
            self._tls_interest(OUT)
            return
        except ssl.SSLCertVerificationError as err:
            self.fail(f"certificate verification failed: {err.verify_message}")
            return
        except ssl.SSLError as err:
            self.fail(f"TLS handshake with {self.owner.backend} failed: {_ssl_reason(err)}")
            return
        except OSError as err:
            self.fail(f"TLS handshake with {self.owner.backend} failed: {err.strerror or err}")
            return
        try:
            problem = self.owner.check(self, tls)
        except Retry as again:
            fd = tls.fileno()
            self.loop.unregister(fd)
            _close(tls)
            self.tls = None
            self._connect(again.context)
            return
        if problem is not None:
            self.fail(problem)
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.owner.verified(self, tls)
        self._relay()

    def _timed_out(self) -> None:
        self.timer = None
        if not self.closed and self._read_tls is None:
            self.fail(
                f"TLS handshake with {self.owner.backend} did not finish in {HANDSHAKE_TIMEOUT:g} s"
            )

    # -- relaying --------------------------------------------------------
    def _relay(self) -> None:
        tls = self.tls
        assert tls is not None
        # The C object's read/write skip a Python frame per call; the public
        # methods (same signatures) are the fallback.
        target: Any = getattr(tls, "_sslobj", None) or tls
        self._read_tls = target.read
        self._write_tls = target.write
        self.loop.unregister(tls.fileno())
        self.tls_events = IN
        self.loop.register(tls.fileno(), IN, self._guarded(self._on_tls))
        self.plain_events = IN
        self.loop.unregister(self.plain.fileno())
        self.loop.register(self.plain.fileno(), IN, self._guarded(self._on_plain))
        # The handshake may have brought application data with it.
        if tls.pending():
            self._tls_readable()

    def _on_plain(self, mask: int) -> None:
        if mask & OUT and self.down_pending is not None:
            self._flush_down()
            if self.closed:
                return
        if mask & (IN | ERR) and self.up_pending is None and not self.plain_eof:
            self._plain_readable()

    def _on_tls(self, mask: int) -> None:
        if mask & OUT:
            if self.up_pending is not None:
                self._flush_up()
                if self.closed:
                    return
            if self.read_wants_write:
                self.read_wants_write = False
                if self.up_pending is None:
                    self._tls_interest(self.tls_events & ~OUT)
                mask |= IN
        if mask & (IN | ERR) and self.down_pending is None:
            self._tls_readable()

    def _plain_readable(self) -> None:
        """grpcio -> backend.  While grpcio streams (a read of at least
        :data:`STREAMING` bytes), read again before sleeping: a thread
        wake-up costs more than a read that finds nothing."""
        buf = self.loop.up_view
        write = self._write_tls
        assert write is not None
        for _ in range(_BURST):
            try:
                n = self.plain.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                n = 0
            if n == 0:
                self.plain_eof = True
                if self.up_pending is None:
                    self.close()
                return
            data = buf[:n]
            try:
                write(data)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                self.up_pending = bytes(data)  # SSL_write is retried with the same bytes
                self._plain_interest(self.plain_events & ~IN)
                self._tls_interest(self.tls_events | OUT)
                return
            except (ssl.SSLError, OSError) as err:
                self._tls_broken(err)
                return
            if n < STREAMING:
                return

    def _flush_up(self) -> None:
        write = self._write_tls
        data = self.up_pending
        assert write is not None and data is not None
        try:
            write(data)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return
        except (ssl.SSLError, OSError) as err:
            self._tls_broken(err)
            return
        self.up_pending = None
        if self.plain_eof:
            self.close()
            return
        self._tls_interest(self.tls_events & ~OUT)
        self._plain_interest(self.plain_events | IN)

    def _tls_readable(self) -> None:
        """backend -> grpcio: as many records as are there, then one send;
        again while the backend streams (see :meth:`_plain_readable`)."""
        for _ in range(_BURST):
            if self._tls_batch() < STREAMING or self.down_pending is not None or self.closed:
                return

    def _tls_batch(self) -> int:
        read = self._read_tls
        tls = self.tls
        assert read is not None and tls is not None
        view = self.loop.down_view
        size = len(view)
        got = 0
        eof = False
        try:
            while got < size:
                n = read(size - got, view[got:])
                if n == 0:
                    eof = True
                    break
                got += n
                if n < _SMALL_RECORD and not tls.pending():
                    break  # most likely all that was sent; epoll says if not
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLWantWriteError:
            # A post-handshake message waits for room in the socket: read
            # again when it is writable.
            self.read_wants_write = True
            self._tls_interest(self.tls_events | OUT)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            eof = True
        except (ssl.SSLError, OSError) as err:
            if got == 0:
                self._tls_broken(err)
                return 0
            eof = True
        if got:
            if not self.got_first_byte:
                self.got_first_byte = True
                self.owner.first_byte()
            try:
                sent = self.plain.send(view[:got])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close()
                return 0
            if sent < got:
                self.down_pending = memoryview(bytes(view[sent:got]))
                self._tls_interest(self.tls_events & ~IN)
                self._plain_interest(self.plain_events | OUT)
        if eof:
            self.tls_eof = True
            if not self.got_first_byte:
                self.fail(
                    f"TLS connection with {self.owner.backend} closed by the server right "
                    "after the handshake (e.g. the client certificate was refused)"
                )
            elif self.down_pending is None:
                self.close()
            return 0
        return got

    def _flush_down(self) -> None:
        data = self.down_pending
        assert data is not None
        try:
            sent = self.plain.send(data)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if sent < len(data):
            self.down_pending = data[sent:]
            return
        self.down_pending = None
        if self.tls_eof:
            self.close()
            return
        self._plain_interest(self.plain_events & ~OUT)
        self._tls_interest(self.tls_events | IN)
        tls = self.tls
        if tls is not None and tls.pending():
            self._tls_readable()  # records OpenSSL already holds: epoll will not say

    def _tls_broken(self, err: BaseException) -> None:
        if not self.got_first_byte:
            reason = _ssl_reason(err) if isinstance(err, ssl.SSLError) else (str(err) or repr(err))
            self.fail(f"TLS connection with {self.owner.backend} failed: {reason}")
        else:
            self.close()

    # -- interest bookkeeping ----------------------------------------------
    def _plain_interest(self, events: int) -> None:
        if events != self.plain_events:
            self.plain_events = events
            self.loop.modify(self.plain.fileno(), events)

    def _tls_interest(self, events: int) -> None:
        tls = self.tls
        if tls is not None and events != self.tls_events:
            self.tls_events = events
            self.loop.modify(tls.fileno(), events)

    # -- the end -----------------------------------------------------------
    def fail(self, reason: str) -> None:
        """Report ``reason`` (before grpcio's side closes), then close."""
        if self.closed:
            return
        self.owner.failed(reason)
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for sock in (self.tls, self.tcp, self.plain):
            if sock is not None:
                try:
                    fd = sock.fileno()
                except OSError:
                    fd = -1
                if fd >= 0:
                    self.loop.unregister(fd)
                _close(sock)
        self.tls = self.tcp = None
        self.up_pending = self.down_pending = None
        self._read_tls = self._write_tls = None
        self.loop.connection_ended()


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _strerror(code: int) -> str:
    import os

    return os.strerror(code)


def _ssl_reason(err: BaseException) -> str:
    reason = getattr(err, "reason", None)
    if reason:
        return str(reason)
    return str(err) or repr(err)
