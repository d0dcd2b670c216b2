"""A program's first ``xds:`` RPC loads what its config needs and nothing
else (issue 18, start-up: a short-lived program pays every module it loads).

A real program in a fresh interpreter, written as the README shows
(``pyxds.insecure_channel`` / ``pyxds.aio.insecure_channel``), makes one
RPC over a plain config (LDS api_listener -> RDS -> an EDS round_robin
cluster) from a real management server to a real backend, then prints the
modules it has loaded.  What such a config does not name must not be
among them: the xDS server side (``pyxds.serving``, the server Listener
validators, RBAC), DNS for LOGICAL_DNS clusters, RE2 (no regex in the
config), XXH64 (no hash policy), the fault and stateful session filters
and their validators (no listener names them), SPIFFE bundle maps, protobuf's JSON module,
the LRS stream and its protos (no cluster reports load), ORCA (no backend
metrics asked for), the LB policies no config names, and the generated
modules of the xds-protos and protobuf files it does need, nor protobuf's
pure-Python runtime (their descriptors load from
pyxds's bundle).  What it does need is loaded (so the
check is not vacuous).  Counts of modules, never times; the decoders give
the same results either way (tests/unit/test_lazy_resource_modules.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
from channel_fixtures import SERVICE, TARGET, Backend, route, snapshot

from pyxds.server import ManagementServer
from pyxds.xds import descriptors

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")

#: not needed by a plain client config (module doc)
NOT_LOADED = (
    "pyxds.serving",
    "pyxds.server",
    "pyxds.xds.resources.server_types",
    "pyxds.xds.resources.server_listener",
    "pyxds.xds.resources.rbac",
    "pyxds.resolver.dns",
    "pyxds.resolver.request_hash",
    "pyxds.resolver.fault_filter",
    "pyxds.resolver.stateful_session",
    "pyxds.xds.resources.stateful_session",
    "pyxds.security.spiffe",
    "pyxds.lb.orca",
    "xds.data.orca",
    "pyxds.xds.lrs_transport",
    "pyxds.xds.lrs_client",
    "pyxds.xds.lrs_state",
    "pyxds.xds.load_store",
    "envoy.service.load_stats",
    "envoy.config.endpoint.v3.load_report_pb2",
    "pyxds.lb.ring_hash",
    "pyxds.lb.weighted_round_robin",
    "pyxds.lb.least_request",
    "pyxds.lb.rls",
    "pyxds.xds.resources.cluster_specifier",  # no RouteConfiguration declares a plugin
    "re2",
    "xxhash",
    "google.protobuf.json_format",
    "envoy.extensions.filters.http.rbac",
    "envoy.config.rbac",
    "envoy.service.status",
)
#: not needed by one kind of program either: a sync one never loads the
#: asyncio channel nor its lean grpc.aio call, an asyncio one never the sync
#: channel, its multicallables and calls, nor grpcio's sync channel module;
#: neither loads a config dump
#: (channel or CSDS) nobody asked for, nor interceptors no channel was given
NOT_LOADED_BY = {
    "sync": ("pyxds.channel.aio", "pyxds.channel.grpc_aio_unary"),
    "aio": (
        "pyxds.channel.channel",
        "pyxds.channel.multicallables",
        "pyxds.channel.calls",
        "grpc._channel",  # loaded ahead only for the sync channel's transports
    ),
}
NOT_ASKED_FOR = ("pyxds.channel.dump", "pyxds.xds.csds", "pyxds.channel.aio_interceptors")
#: the lean calls' grpcio fingerprint takes CPython's built-in SHA-512
#: (loaded by random), not hashlib's (OpenSSL's digest list) nor another
#: built-in one (3.11's ``_sha256``: ~0.8 M instructions to load)
NOT_LOADED_BY_FINGERPRINT = ("hashlib", "_hashlib", "_sha256")
#: plain targets and resource names are split and quoted without
#: urllib.parse, which imports ipaddress (pyxds._uri)
NOT_LOADED_BY_PLAIN_NAMES = ("urllib.parse", "ipaddress")
#: the xds-protos and protobuf files a plain config needs load from pyxds's
#: bundle of their descriptors, without their generated modules and
#: packages (pyxds.xds.descriptors), and so without protobuf's pure-Python
#: runtime, which any generated module imports
NOT_LOADED_BY_DESCRIPTORS = (
    "envoy",
    "xds",
    "udpa",
    "validate",
    "google.rpc",
    "google.protobuf.duration_pb2",
    "google.protobuf.any_pb2",
    "google.protobuf.descriptor_pb2",
    "google.protobuf.descriptor_pool",
    "google.protobuf.symbol_database",
    "google.protobuf.internal.builder",
    "google.protobuf.internal.python_message",
    "google.protobuf.text_format",
)
#: what it does need
LOADED = (
    "pyxds.xds.client",
    "pyxds.xds.resources.listener",
    "pyxds.resolver.xds_resolver",
    "pyxds.lb.round_robin",
    "pyxds.xds.descriptors",
    "google._upb._message",
)

PROGRAMS = {
    "sync": """
import pyxds
channel = pyxds.insecure_channel(TARGET)
assert channel.unary_unary(WHO)(b"", timeout=10, wait_for_ready=True) == b"lazy-a"
channel.close()
""",
    "aio": """
import asyncio, pyxds.aio
async def main():
    channel = pyxds.aio.insecure_channel(TARGET)
    assert await channel.unary_unary(WHO)(b"", timeout=10, wait_for_ready=True) == b"lazy-a"
    await channel.close()
asyncio.run(main())
""",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    backend = Backend("lazy-a").start()
    server = ManagementServer().start()
    server.set_snapshot(snapshot([route(prefix="", cluster="c")], {"c": [[backend.address]]}))
    bootstrap = tmp_path_factory.mktemp("lazy") / "bootstrap.json"
    bootstrap.write_text(json.dumps(server.bootstrap()))
    yield str(bootstrap)
    server.stop()
    backend.release()


def _loaded_by(program: str, bootstrap: str) -> set[str]:
    code = (
        f"import json, sys\nTARGET = {TARGET!r}\nWHO = '/{SERVICE}/Who'\n"
        + textwrap.dedent(program)
        + "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "GRPC_XDS_BOOTSTRAP": bootstrap,
    }
    env.pop("GRPC_XDS_BOOTSTRAP_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def _families(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in loaded)]


@pytest.mark.parametrize("kind", sorted(PROGRAMS))
def test_a_plain_xds_config_loads_only_what_it_names(kind: str, world: str) -> None:
    loaded = _loaded_by(PROGRAMS[kind], world)
    assert _families(loaded, LOADED) == list(LOADED)
    assert _families(loaded, NOT_LOADED) == []
    assert _families(loaded, NOT_LOADED_BY[kind] + NOT_ASKED_FOR) == []
    assert _families(loaded, NOT_LOADED_BY_FINGERPRINT) == []
    assert _families(loaded, NOT_LOADED_BY_PLAIN_NAMES) == []
    header, _ = descriptors.read()
    if not descriptors._usable(header):
        used = sorted(set(header["distributions"].values()))
        pytest.skip(f"the descriptor bundle (from {used}) is not used here")
    assert _families(loaded, NOT_LOADED_BY_DESCRIPTORS) == []
