"""Ports that no other program on this machine can share with a test.

Why: grpcio binds its servers with ``SO_REUSEPORT`` unless told otherwise
(``grpc.so_reuseport`` defaults to 1).  Linux lets any number of
``SO_REUSEPORT`` sockets of one user bind the same port and splits new
connections between their listeners, so a test's server can silently share
its port with another test run's server, or with another engineer's bench on
this machine: RPCs then reach the wrong server (seen: a bench RPC answered
"Unauthorized RPC rejected" by someone else's xDS server).  Two kernel facts
make a port safe:

* binding port 0 never lands on a port that is bound, whatever the flags (the
  kernel's search counts every bound socket as a conflict);
* a socket bound without ``SO_REUSEPORT`` cannot be joined by another
  listener (nor, while ``SO_REUSEADDR`` is off too, by any socket).

So a port number is safe exactly while some socket of ours keeps it bound.
The usual "free port" helper (bind port 0, close, return the number) breaks
that: the number is free for anyone until the test binds it again, and if
the test's server binds with ``SO_REUSEPORT`` it joins whoever took the port
meanwhile (a C-core xDS server in a subprocess binds only once its Listener
arrives, seconds later under load).  The rules of the e2e tests and benches:

1. A test server that binds port 0 binds exclusively (:data:`EXCLUSIVE`): a
   port it cannot have is then a loud error, never a shared port.
2. A port number a test needs apart from a running server is held by a
   :class:`HeldPort`: a bound socket that never listens.  A connection to it
   is refused at once, exactly as to a free port, and nobody else can bind
   it.  Held exclusively (the default) for "dead" addresses and for a server
   of this process that binds the number later (:meth:`HeldPort.release`
   right before it binds: a window of microseconds, and an exclusive server
   that loses it fails loudly).  Held ``shared`` (``SO_REUSEPORT``) for a
   server that binds with ``SO_REUSEPORT`` on purpose, possibly late
   (``pyxds.serving``'s xDS-enabled servers, grpcio's
   ``grpc.server(xds=True)``): the server joins the hold, which is released
   only once the server is gone, so the number is never free in between.
3. A server stopped to be restarted on its port holds the port meanwhile
   (:meth:`HeldPort.again`), or any program's next bind to port 0 may take it.

Left open: a program that learnt a number from its own closed probe before we
bound it can still bind it with ``SO_REUSEADDR`` beside a re-held port (rule
3 needs ``SO_REUSEADDR`` to bind over the stopped server's TIME_WAIT
connections) or with ``SO_REUSEPORT`` beside a shared hold; the tests and
benches of this repository no longer do that.
"""

from __future__ import annotations

import socket
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from pyxds.server import ManagementServer

#: grpcio server option: bind without SO_REUSEPORT (rule 1).
EXCLUSIVE: tuple[str, int] = ("grpc.so_reuseport", 0)


class HeldPort:
    """A bound, never listening TCP socket on ``host:port`` (port 0: the
    kernel picks a port nobody holds; :attr:`port` says which).

    ``shared``: with ``SO_REUSEPORT``, so a ``SO_REUSEPORT`` server (of any
    process) can bind the port beside it.  A non-zero ``port`` (holding a
    stopped server's port again) binds with ``SO_REUSEADDR`` past the old
    connections' TIME_WAIT, retrying for up to ``timeout`` seconds while the
    old listener closes; OSError if the port stays taken."""

    def __init__(
        self,
        port: int = 0,
        *,
        shared: bool = False,
        host: str = "127.0.0.1",
        timeout: float = 5.0,
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                if shared:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                break
            except OSError:
                sock.close()
                if not port or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        self.host = host
        self.port: int = sock.getsockname()[1]
        self.shared = shared
        self._sock: socket.socket | None = sock
        self._finalizer = weakref.finalize(self, sock.close)

    @classmethod
    def again(cls, port: int, *, host: str = "127.0.0.1") -> HeldPort:
        """Hold the port a server of ours just stopped listening on."""
        return cls(port, host=host)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def held(self) -> bool:
        return self._sock is not None

    def release(self) -> int:
        """Close the socket (idempotent); the port number."""
        self._sock = None
        self._finalizer()
        return self.port

    close = release

    def __enter__(self) -> HeldPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"HeldPort({self.address}, {'shared' if self.shared else 'exclusive'}, {state})"


class PortHolds:
    """The ports one test (or fixture) holds, all released by :meth:`release_all`."""

    def __init__(self) -> None:
        self._holds: list[HeldPort] = []

    def hold(self, *, shared: bool = False) -> HeldPort:
        held = HeldPort(shared=shared)
        self._holds.append(held)
        return held

    def dead_address(self) -> str:
        """``127.0.0.1:<port>`` where every connection is refused, until the end."""
        return self.hold().address

    def release_all(self) -> None:
        holds, self._holds = self._holds, []
        for held in holds:
            held.release()


@contextmanager
def held_ports() -> Iterator[PortHolds]:
    holds = PortHolds()
    try:
        yield holds
    finally:
        holds.release_all()


class HoldsItsPort:
    """A test server that holds its port while stopped (rule 3);
    :meth:`release` stops it and lets the port go.  Its ``stop`` holds the
    port in ``_held``."""

    _held: HeldPort | None = None

    def stop(self, grace: float | None = None) -> None:
        raise NotImplementedError

    def release(self) -> None:
        """Stop, and let the port go."""
        self.stop()
        self._let_go()

    def _let_go(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()


class HeldPortManagementServer(ManagementServer):
    """A ``pyxds.server.ManagementServer`` whose port stays held (rule 3)
    whenever it is not running: after each stop() until the next start(), and
    with ``hold_now=True`` from construction to the first start() (a control
    plane that comes up late).  Clients dialling it meanwhile are refused, as
    with nothing on the port, and no other program's server can answer them.
    :meth:`close` stops it and lets the port go."""

    def __init__(self, *args: object, hold_now: bool = False, **kwargs: object) -> None:
        held = HeldPort() if hold_now else None
        if held is not None:
            kwargs["port"] = held.port
        super().__init__(*args, **kwargs)
        self._held: HeldPort | None = held

    def start(self) -> HeldPortManagementServer:
        self._let_go()
        super().start()
        return self

    def stop(self, grace: float | None = None) -> None:
        was_running = self.running
        super().stop(grace)
        if was_running and self._held is None:
            self._held = HeldPort.again(self.port, host=self.host)

    def close(self) -> None:
        self.stop()
        self._let_go()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _let_go(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()
