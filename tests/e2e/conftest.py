"""Shared end-to-end fixtures: a running pyxds management server and Echo backends.

Everything binds 127.0.0.1 only; every wait in these helpers is bounded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from backends import Blackhole, EchoBackend
from ports import HeldPortManagementServer, PortHolds, held_ports

from pyxds.server import ManagementServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def xds_server() -> Iterator[ManagementServer]:
    """A started ManagementServer on 127.0.0.1 (random port), stopped after the
    test; a test that stops it finds its port held until it starts it again."""
    server = HeldPortManagementServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def ports() -> Iterator[PortHolds]:
    """Ports held for this test (tests/e2e/ports.py): ``ports.dead_address()``
    refuses every connection and no other program can take it;
    ``ports.hold(shared=True)`` for an SO_REUSEPORT server that binds later."""
    with held_ports() as holds:
        yield holds


@pytest.fixture
def echo_backends() -> Iterator[Callable[..., list[EchoBackend]]]:
    """Factory: ``echo_backends(2)`` or ``echo_backends(["a", "b"])`` starts Echo backends.

    Backends named ``prefix + index`` unless names are given; all stopped after the test.
    """
    started: list[EchoBackend] = []

    def start(n: int | Sequence[str], prefix: str = "backend-") -> list[EchoBackend]:
        names = [f"{prefix}{len(started) + i}" for i in range(n)] if isinstance(n, int) else list(n)
        new = [EchoBackend(name) for name in names]
        started.extend(new)
        return [b.start() for b in new]

    try:
        yield start
    finally:
        for backend in started:
            backend.release()


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    """A TCP listener that accepts and never answers."""
    hole = Blackhole()
    try:
        yield hole
    finally:
        hole.close()


@pytest.fixture
def control() -> Iterator[ManagementServer]:
    """The control plane of the xDS-enabled server tests (as ``xds_server``)."""
    server = ManagementServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    """The mesh PKI of the xDS-enabled server tests (one per test module)."""
    from xds_server_fixtures import Pki

    return Pki(str(tmp_path_factory.mktemp("xds-server-pki")))
