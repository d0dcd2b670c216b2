"""The hand-written test servers of this folder leave nothing behind when
closed: their accepting thread ends and their port refuses connections.

A listening socket closed while a thread is blocked in ``accept()`` on it
stays listening on Linux (the blocked call keeps it open) and the thread
stays blocked: a later connection was still accepted (and, for
RefusingServer, served), and every instance left a thread for the rest of
the run (ten after test_conformance_channel_streams.py)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from channel_fixtures import Blackhole, RefusingServer, wait_until
from tls_backends import TlsFront

from pyxds.testing.certs import CertAuthority


def _accepted(server: Blackhole | RefusingServer | TlsFront) -> list[socket.socket]:
    return server._open if isinstance(server, TlsFront) else server._conns


def _tls_front() -> TlsFront:
    ca = CertAuthority("fixture CA")
    return TlsFront("127.0.0.1:1", {None: ca.issue("default", dns=("default.example",))})


@pytest.mark.parametrize("make", [Blackhole, RefusingServer, _tls_front], ids=lambda m: m.__name__)
def test_a_closed_test_server_ends_its_thread_and_refuses_connections(make):
    before = set(threading.enumerate())
    server = make()
    port = server.port
    # one connection accepted: the accepting thread is in its accept() loop
    client = socket.create_connection(("127.0.0.1", port), timeout=2)
    assert wait_until(lambda: len(_accepted(server)) == 1, 5)
    client.close()
    server.close()
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
