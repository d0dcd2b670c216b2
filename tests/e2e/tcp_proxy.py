"""A TCP proxy for end-to-end tests whose connections can be frozen (a peer
gone silent without FIN or RST: what keepalive must notice)."""

from __future__ import annotations

import socket
import threading
import time


class FreezingProxy:
    """A TCP proxy on 127.0.0.1 whose open connections can be frozen: bytes stop
    flowing but the sockets stay open, like a control plane that vanished
    without a FIN or RST.  ``opened``: when each connection was accepted;
    ``ended`` / ``dropped``: when its server / client side ended one
    (``time.monotonic()``); ``bytes_up``: bytes passed from clients to the
    server; ``upstream_ports``: the local port of each connection's server
    side (a server sees the client's RPCs from ``ipv4:127.0.0.1:<port>``).
    """

    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._frozen: list[threading.Event] = []
        self._sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self.opened: list[float] = []
        self.ended: list[float] = []
        self.dropped: list[float] = []
        self.bytes_up = 0
        self.upstream_ports: list[int] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            self.opened.append(time.monotonic())
            upstream = socket.create_connection(self._target, timeout=5)
            self.upstream_ports.append(upstream.getsockname()[1])
            frozen = threading.Event()
            self._frozen.append(frozen)
            self._sockets += [conn, upstream]
            for src, dst, server_side in ((conn, upstream, False), (upstream, conn, True)):
                threading.Thread(
                    target=self._pump, args=(src, dst, frozen, server_side), daemon=True
                ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, frozen: threading.Event, server_side: bool
    ) -> None:
        try:
            src.settimeout(0.1)
        except OSError:
            return  # closed already
        while not self._stop.is_set():
            if frozen.is_set():
                time.sleep(0.05)  # hold the socket open, pass nothing
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                (self.ended if server_side else self.dropped).append(time.monotonic())
                return
            if not server_side:
                self.bytes_up += len(data)
            try:
                dst.sendall(data)
            except OSError:
                return

    def freeze_all(self) -> None:
        for frozen in self._frozen:
            frozen.set()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass
