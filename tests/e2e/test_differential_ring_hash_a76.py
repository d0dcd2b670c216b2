"""Differential, gRFC A76 ring_hash improvements, pyxds vs grpcio's C-core
(each key must land on the same backend in both):

* endpoint hash keys: a RING_HASH cluster whose EDS endpoints carry
  ``envoy.lb`` / ``hash_key`` metadata, through ``xds:///`` channels;
* ``requestHashHeader`` in a service config (no xDS) with
  GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY=true in both clients;
  without the variable both fail the RPC INTERNAL "hash attribute not
  present" (there is no xDS ConfigSelector to set a hash).
C-core runs in a subprocess (its env-var bootstrap and experiments are per
process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from channel_fixtures import (
    SERVICE,
    TARGET,
    Backend,
    CoreXdsClient,
    pyxds_calls,
    route,
    snapshot,
    wait_until,
)
from google.protobuf import struct_pb2

import pyxds._api as pyxds
from pyxds.lb.ring_hash import REQUEST_HASH_HEADER_ENV
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

NODE = "differential-ring-hash-a76"
USERS = [f"user-{i}" for i in range(16)]
WHO = f"/{SERVICE}/Who"


@pytest.fixture(scope="module")
def backends():
    started = [Backend(f"k{i}").start() for i in range(4)]
    yield started
    for backend in started:
        backend.stop()


# ---------------------------------------------------------------- EDS hash_key


def keyed_endpoint(address: str, key: str):
    lb = b.endpoint(address)
    metadata = struct_pb2.Struct()
    metadata.update({"hash_key": key})
    lb.metadata.filter_metadata["envoy.lb"].CopyFrom(metadata)
    return lb


def keyed_snapshot(backends, keys: list[str]) -> Snapshot:
    base = snapshot(
        [route(prefix="", cluster="rhk", hash_policies=[b.hash_policy(header="user")])],
        {"rhk": []},
    )
    listener_t, route_t, _cluster_t, _eds_t = list(base._by_type)
    endpoints = [keyed_endpoint(x.address, k) for x, k in zip(backends, keys, strict=True)]
    return Snapshot(
        listeners=list(base.resources(listener_t).values()),
        routes=list(base.resources(route_t).values()),
        clusters=[b.cluster("rhk", lb_policy="RING_HASH")],
        endpoints=[b.endpoints("rhk", [b.locality(zone="z", endpoints=endpoints)])],
    )


def landing(client, user: str, n: int = 2) -> dict:
    metadata = [("user", user)]
    if isinstance(client, CoreXdsClient):
        return dict(client.call(n, metadata=metadata, timeout=10.0, wait_for_ready=True))
    return dict(pyxds_calls(client, n, metadata=metadata, timeout=10.0, wait_for_ready=True))


def test_eds_hash_keys_place_endpoints_as_c_core_does(backends, monkeypatch):
    """With GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT=false in both clients."""
    monkeypatch.setenv("GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT", "false")
    server = ManagementServer().start()
    core = CoreXdsClient(server.bootstrap(node_id=NODE))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=NODE))
    try:
        keys = ["pod-a", "pod-b", "pod-c", "pod-d"]
        server.set_snapshot(keyed_snapshot(backends, keys))
        assert wait_until(lambda: len(landing(channel, USERS[0])) == 1, 10)
        assert wait_until(lambda: len(landing(core, USERS[0])) == 1, 10)
        first = {}
        for user in USERS:
            mine, theirs = landing(channel, user), landing(core, user)
            assert len(mine) == 1 and mine == theirs, (user, mine, theirs)
            first[user] = next(iter(mine))
        # Rotate the keys over the backends: each key's users follow the key
        # to its new backend (the ring is by key, not address), in both.
        rotated = keys[1:] + keys[:1]
        server.set_snapshot(keyed_snapshot(backends, rotated))
        names = [x.name for x in backends]
        moved = {u: names[(names.index(n) - 1) % len(names)] for u, n in first.items()}
        probe = USERS[0]
        assert wait_until(lambda: landing(channel, probe) == {moved[probe]: 2}, 10)
        assert wait_until(lambda: landing(core, probe) == {moved[probe]: 2}, 10)
        for user in USERS:
            mine, theirs = landing(channel, user), landing(core, user)
            assert mine == theirs == {moved[user]: 2}, (user, mine, theirs)
    finally:
        channel.close()
        core.close()
        server.stop()


def test_eds_hash_keys_are_ignored_by_default_as_c_core_does(backends, monkeypatch):
    """grpcio 1.85's C-core still defaults the backward-compatibility switch
    to true: rotating the keys moves nobody, in both clients."""
    monkeypatch.delenv("GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT", raising=False)
    server = ManagementServer().start()
    core = CoreXdsClient(server.bootstrap(node_id=NODE))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id=NODE))
    try:
        keys = ["pod-a", "pod-b", "pod-c", "pod-d"]
        server.set_snapshot(keyed_snapshot(backends, keys))
        assert wait_until(lambda: len(landing(channel, USERS[0])) == 1, 10)
        assert wait_until(lambda: len(landing(core, USERS[0])) == 1, 10)
        first = {user: landing(channel, user) for user in USERS}
        assert first == {user: landing(core, user) for user in USERS}
        server.set_snapshot(keyed_snapshot(backends, keys[1:] + keys[:1]))

        def applied() -> bool:  # pyxds's xDS client holds the rotated keys
            return '"version_info": "2"' in json.dumps(channel.config_dump(), default=str)

        assert wait_until(applied, 10)
        # The landing of every user is unchanged (the ring is by address).
        for user in USERS:
            assert landing(channel, user) == landing(core, user) == first[user], user
    finally:
        channel.close()
        core.close()
        server.stop()


# ---------------------------------------------------------------- requestHashHeader

_CORE_STATIC = r"""
import json, sys, grpc
cfg = json.loads(sys.argv[1])
ch = grpc.insecure_channel(cfg["target"], options=[("grpc.service_config", cfg["sc"])])
call = ch.unary_unary(cfg["method"])
out = {}
for user in cfg["users"]:
    got = []
    for _ in range(2):
        md = [("x-user", user)] if user else None
        try:
            got.append(call(b"", timeout=5, metadata=md, wait_for_ready=cfg["wfr"]).decode())
        except grpc.RpcError as e:
            got.append("error:" + e.code().name + ": " + (e.details() or ""))
    out[user] = got
print(json.dumps(out), flush=True)
"""


def service_config() -> str:
    return json.dumps(
        {"loadBalancingConfig": [{"ring_hash_experimental": {"requestHashHeader": "x-user"}}]}
    )


def core_static(target: str, users: list[str], enabled: bool, wfr: bool) -> dict:
    env = dict(os.environ)
    env.pop(REQUEST_HASH_HEADER_ENV, None)
    if enabled:
        env[REQUEST_HASH_HEADER_ENV] = "true"
    cfg = {"target": target, "sc": service_config(), "method": WHO, "users": users, "wfr": wfr}
    out = subprocess.run(
        [sys.executable, "-c", _CORE_STATIC, json.dumps(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).resolve().parent),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def pyxds_static(target: str, users: list[str], wfr: bool) -> dict:
    channel = pyxds.insecure_channel(target, options=[("grpc.service_config", service_config())])
    try:
        call = channel.unary_unary(WHO)
        out = {}
        for user in users:
            got = []
            for _ in range(2):
                md = [("x-user", user)] if user else None
                try:
                    got.append(call(b"", timeout=5, metadata=md, wait_for_ready=wfr).decode())
                except grpc.RpcError as e:
                    got.append("error:" + e.code().name + ": " + (e.details() or ""))
            out[user] = got
        return out
    finally:
        channel.close()


def test_request_hash_header_sends_each_key_where_c_core_does(backends, monkeypatch):
    target = "ipv4:" + ",".join(x.address for x in backends)
    monkeypatch.setenv(REQUEST_HASH_HEADER_ENV, "true")
    theirs = core_static(target, USERS, enabled=True, wfr=True)
    ours = pyxds_static(target, USERS, wfr=True)
    assert ours == theirs
    assert all(len(set(v)) == 1 for v in ours.values())  # sticky per key
    assert len({v[0] for v in ours.values()}) >= 3  # and spread


def test_without_the_env_var_both_fail_internal_for_lack_of_a_hash(backends, monkeypatch):
    target = "ipv4:" + ",".join(x.address for x in backends)
    monkeypatch.delenv(REQUEST_HASH_HEADER_ENV, raising=False)
    theirs = core_static(target, USERS[:2], enabled=False, wfr=False)
    ours = pyxds_static(target, USERS[:2], wfr=False)
    assert (
        ours == theirs == {u: ["error:INTERNAL: hash attribute not present"] * 2 for u in USERS[:2]}
    )
