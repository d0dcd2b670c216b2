"""DNS for LOGICAL_DNS clusters (gRFC A37 "Logical DNS", A61, A74).

The dependency manager never blocks its work serializer on DNS: a
:class:`DnsResolver` runs the lookup elsewhere and calls back with the
addresses (``"host:port"``, IPv6 bracketed) or a :class:`Status`.  The
caller hops the callback back onto its serializer.

:class:`ThreadedDnsResolver` calls ``socket.getaddrinfo`` (injectable, for
tests) on a small worker pool (:class:`pyxds._lingering.LingeringPool`: at most
``max_workers`` threads, started as lookups wait, each gone once idle for
``LINGER`` seconds, so a program that resolved a name once keeps no pyxds
thread after its channels are closed: issue 18, "nothing leaks after the
channel closes").  :class:`FakeDnsResolver` lets a test complete lookups by
hand.
"""

from __future__ import annotations

import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import field
from typing import Any

import grpc

from pyxds._lingering import LingeringPool
from pyxds._values import dataclass
from pyxds.status import Status

__all__ = [
    "DnsResult",
    "DnsResolver",
    "ThreadedDnsResolver",
    "FakeDnsResolver",
    "format_address",
    "default_dns_resolver",
]


#: seconds a DNS worker thread waits for a lookup before it exits
LINGER = 1.0

DnsResult = "tuple[str, ...] | Status"
DnsCallback = Callable[[Any], None]  # called with tuple[str, ...] | Status


def format_address(host: str, port: int) -> str:
    """``host:port`` with IPv6 literals bracketed."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


class DnsResolver(ABC):
    """Resolves ``host``/``port`` off the caller's thread."""

    @abstractmethod
    def resolve(self, host: str, port: int, callback: DnsCallback) -> Callable[[], None]:
        """Start a lookup; ``callback`` gets a tuple of addresses or a Status
        (on an arbitrary thread).  Returns a cancel function: after it, the
        callback is not called."""


class ThreadedDnsResolver(DnsResolver):
    """``getaddrinfo`` on a worker pool; never on the calling thread."""

    def __init__(
        self,
        getaddrinfo: Callable[..., Any] = socket.getaddrinfo,
        max_workers: int = 4,
        linger: float = LINGER,
    ) -> None:
        self._getaddrinfo = getaddrinfo
        self._pool = LingeringPool(max_workers, "pyxds-dns", linger, "DNS lookup callback")

    def resolve(self, host: str, port: int, callback: DnsCallback) -> Callable[[], None]:
        cancelled = threading.Event()

        def work() -> None:
            try:
                infos = self._getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except (OSError, UnicodeError) as err:
                result: Any = Status(
                    grpc.StatusCode.UNAVAILABLE,
                    f"DNS resolution failed for {format_address(host, port)}: {err}",
                )
            else:
                seen: list[str] = []
                for info in infos:
                    addr = format_address(info[4][0], info[4][1])
                    if addr not in seen:
                        seen.append(addr)
                if seen:
                    result = tuple(seen)
                else:
                    result = Status(
                        grpc.StatusCode.UNAVAILABLE,
                        f"DNS resolution for {format_address(host, port)} returned no addresses",
                    )
            if not cancelled.is_set():
                callback(result)

        self._pool.submit(work)
        return cancelled.set

    @property
    def threads(self) -> int:
        """Worker threads alive now (introspection, tests)."""
        return self._pool.threads

    def shutdown(self) -> None:
        """Drop queued lookups (their callbacks are never called)."""
        self._pool.shutdown()


_default: ThreadedDnsResolver | None = None
_default_lock = threading.Lock()


def default_dns_resolver() -> ThreadedDnsResolver:
    """The process-wide threaded resolver."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ThreadedDnsResolver()
        return _default


@dataclass
class _PendingLookup:
    host: str
    port: int
    callback: DnsCallback
    cancelled: bool = False


@dataclass
class FakeDnsResolver(DnsResolver):
    """Lookups wait until the test calls :meth:`complete` (sans-IO)."""

    pending: list[_PendingLookup] = field(default_factory=list)
    requests: list[tuple[str, int]] = field(default_factory=list)

    def resolve(self, host: str, port: int, callback: DnsCallback) -> Callable[[], None]:
        lookup = _PendingLookup(host, port, callback)
        self.pending.append(lookup)
        self.requests.append((host, port))

        def cancel() -> None:
            lookup.cancelled = True

        return cancel

    def complete(self, host: str, result: Any) -> int:
        """Answer every pending lookup of ``host`` with ``result`` (a tuple of
        addresses, a list, or a Status / error string).  Returns how many."""
        if isinstance(result, str):
            result = Status(grpc.StatusCode.UNAVAILABLE, result)
        elif isinstance(result, list):
            result = tuple(result)
        done = [p for p in self.pending if p.host == host]
        self.pending = [p for p in self.pending if p.host != host]
        count = 0
        for lookup in done:
            if not lookup.cancelled:
                lookup.callback(result)
                count += 1
        return count
