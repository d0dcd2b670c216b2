"""A management server (and the test RLS server) asked for a port that is
taken fails loudly, as a user expects, instead of silently sharing the port
(grpcio enables SO_REUSEPORT by default, so a second grpcio server would
bind it too, and the kernel would split the connections between the two)."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
from concurrent import futures

import grpc
import pytest

from pyxds.server import ManagementServer, PortInUseError, RouteLookupServer

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")


def _port_of(server: ManagementServer) -> int:
    return int(server.address.rsplit(":", 1)[1])


def test_a_second_embedded_server_on_a_taken_port_raises_naming_the_address():
    first = ManagementServer().start()
    try:
        port = _port_of(first)
        with pytest.raises(PortInUseError, match=rf"127\.0\.0\.1:{port}: .*in use"):
            ManagementServer(port=port).start()
    finally:
        first.stop()
    again = ManagementServer(port=port).start()  # free again: binds
    assert _port_of(again) == port
    again.stop()


def test_a_port_held_by_another_program_is_refused_too():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError, match="in use"):
            ManagementServer(port=port).start()


def test_pyxds_server_on_a_taken_port_prints_one_line_and_exits_1(tmp_path):
    resources = tmp_path / "r.yaml"
    resources.write_text("resources: []\n")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop("GRPC_VERBOSITY", None)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pyxds.cli",
                "server",
                "--file",
                str(resources),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
    assert proc.returncode == 1, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_route_lookup_server_on_a_port_another_grpc_server_holds_raises_instead_of_sharing():
    other = grpc.server(futures.ThreadPoolExecutor(1))  # grpcio's default: SO_REUSEPORT
    port = other.add_insecure_port("127.0.0.1:0")
    other.start()
    try:
        with pytest.raises(PortInUseError, match=rf"127\.0\.0\.1:{port}"):
            RouteLookupServer(port=port).start()
    finally:
        other.stop(None)
