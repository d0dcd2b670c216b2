"""Listening addresses of an xDS-enabled server, and holding their ports
while nothing serves them (gRFC A36 "Serving and Not Serving").

A36 prefers "not serving" to mean no ``listen()`` on the port.  grpcio binds
and listens in one call and cannot stop listening without stopping its
server, so pyxds serves each port with its own grpcio server, started when
the port may serve and stopped when it may not.  In between, the port number
stays reserved by a socket that is bound but never listens, with
``SO_REUSEPORT`` (as grpcio binds by default): connections are refused (no
byte is sent), ``add_insecure_port("0.0.0.0:0")`` can answer the real port at
once, the grpcio servers of this process bind the same port, and another
program cannot take it.

Addresses: ``host:port`` with an IP literal (``[::]`` for IPv6), or a name
resolved now to its IPv4/IPv6 addresses, each served (and watched) on its
own as C-core does; the canonical ``ip:port`` text names the Listener
resource (A36 ``%s``).
"""

from __future__ import annotations

import socket

from pyxds._values import dataclass
from pyxds.serving.filter_chains import IpAddress, parse_ip, unmapped
from pyxds.xds.resources.server_listener import join_host_port

__all__ = ["ListeningAddress", "PortReservation", "resolve_listening_address"]


@dataclass(frozen=True, slots=True)
class ListeningAddress:
    """One address to listen on: ``ip`` (unspecified: a wildcard) and port."""

    ip: IpAddress
    port: int

    @property
    def text(self) -> str:
        """``ip:port`` as C-core writes a listening address."""
        return join_host_port(str(self.ip), self.port)

    @property
    def wildcard(self) -> bool:
        return self.ip.is_unspecified

    @property
    def local_ip(self) -> IpAddress | None:
        """The local IP of every connection (IPv4-mapped: as IPv4), or None
        for a wildcard address."""
        return None if self.ip.is_unspecified else unmapped(self.ip)


def resolve_listening_address(address: str) -> tuple[list[IpAddress], int]:
    """The IPs and port of ``address`` (``host:port``); ValueError naming the
    problem otherwise."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"listening address {address!r}: expected host:port")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"listening address {address!r}: invalid port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ip = parse_ip(host)
    if ip is not None:
        return [ip], port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise ValueError(f"listening address {address!r}: cannot resolve {host}: {err}") from None
    ips: list[IpAddress] = []
    for info in infos:
        candidate = parse_ip(str(info[4][0]))
        if candidate is not None and candidate not in ips:
            ips.append(candidate)
    if not ips:
        raise ValueError(f"listening address {address!r}: {host} has no IP address")
    return ips, port


class PortReservation:
    """A bound, never listening ``SO_REUSEPORT`` socket on ``ip:port``
    (port 0: the kernel picks one, see :attr:`port`)."""

    def __init__(self, ip: IpAddress, port: int) -> None:
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((str(ip), port))
        except OSError as err:
            sock.close()
            raise OSError(
                err.errno, f"cannot bind {join_host_port(str(ip), port)}: {err.strerror}"
            ) from None
        self._sock: socket.socket | None = sock
        self.port: int = sock.getsockname()[1]

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
