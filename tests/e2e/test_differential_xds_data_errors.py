"""Differential: gRFC A88's server features against grpcio's C-core.

A88 "Temporary environment variable protection": the ``fail_on_data_errors``
and ``resource_timer_is_transient_error`` server features, the xRFC TP3
``resource_errors`` and the ambient default for LDS/CDS deletions are all
guarded by ``GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING``.  C-core's own tests
say the same (test/core/xds/xds_client_test.cc
ResourceValidationFailureForCachedResourceWithFailOnDataErrorsDisabled,
ResourceErrorFromServerIgnoredIfNotEnabled,
ResourceTimerIsTransientErrorIgnoredUnlessEnabled).  Here the bootstrap
names ``fail_on_data_errors`` and the cached Cluster is replaced by an
invalid one (NACK) or deleted: the RPCs of pyxds and of grpcio's
``xds:///`` channel (a subprocess, env var unset or ``true``) must agree.
"""

from __future__ import annotations

import time

import pytest
from channel_fixtures import (
    TARGET,
    Backend,
    CoreXdsClient,
    call_until,
    pyxds_calls,
    route,
    snapshot,
)
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server.snapshot import Snapshot
from pyxds.xds.ads_state import DATA_ERROR_HANDLING_ENV
from pyxds.xds.resources import CLUSTER_TYPE_URL

CLUSTER = "data-errors-cluster"


@pytest.fixture(scope="module")
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backend():
    started = Backend("data-errors-backend").start()
    yield started
    started.stop()


def _good(backend: Backend) -> Snapshot:
    return snapshot([route(prefix="", cluster=CLUSTER)], {CLUSTER: [[backend.address]]})


def _with_invalid_cluster(snap: Snapshot) -> Snapshot:
    """The same snapshot with the Cluster replaced by one every client NACKs
    (a ring_hash policy with MURMUR_HASH_2)."""
    (bad,) = (cluster_pb2.Cluster.FromString(c.SerializeToString()) for c in snap.clusters)
    bad.ClearField("lb_policy")
    policy = bad.load_balancing_policy.policies.add().typed_extension_config
    murmur = ring_hash_pb2.RingHash(hash_function=ring_hash_pb2.RingHash.MURMUR_HASH_2)
    policy.typed_config.Pack(murmur)
    return Snapshot(snap.listeners, snap.routes, [bad], snap.endpoints)


def _without_cluster(snap: Snapshot) -> Snapshot:
    return Snapshot(snap.listeners, snap.routes, [], snap.endpoints)


def _both(server, backend, monkeypatch, node: str, features, env_on: bool):
    """Start pyxds and C-core on ``node`` with the bootstrap ``features``, the
    env var set or not; both serve ``backend`` first.  Returns (channel, core)."""
    env = {DATA_ERROR_HANDLING_ENV: "true"} if env_on else {}
    if env_on:
        monkeypatch.setenv(DATA_ERROR_HANDLING_ENV, "true")
    else:
        monkeypatch.delenv(DATA_ERROR_HANDLING_ENV, raising=False)
    bootstrap = server.bootstrap(node_id=node, features=features)
    server.set_snapshot(_good(backend), node_id=node)
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
    core = CoreXdsClient(bootstrap, env=env)
    assert call_until(channel, backend.name, 10) < 10
    assert core.until(backend.name, 10)[backend.name] == 1
    return channel, core


def _after(server, node: str, update, acks_before: int) -> None:
    """Publish ``update`` for ``node`` and wait until both clients answered
    the Cluster response (two ACKs or NACKs more)."""
    server.set_snapshot(update, node_id=node)

    def answered() -> bool:
        acks = server.acks(CLUSTER_TYPE_URL, node_id=node)
        nacks = server.nacks(CLUSTER_TYPE_URL, node_id=node)
        return len(acks) + len(nacks) >= acks_before + 2

    server.wait_until(answered, timeout=10)


def _pyxds_until(channel, want: str, timeout: float) -> None:
    """Fast-failing RPCs until one answers ``want`` (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pyxds_calls(channel, 1, wait_for_ready=False, timeout=1)[want]:
            return
        time.sleep(0.02)


def _answers(server, node: str) -> int:
    return len(server.acks(CLUSTER_TYPE_URL, node_id=node)) + len(
        server.nacks(CLUSTER_TYPE_URL, node_id=node)
    )


def _update_and_compare(server, backend, monkeypatch, node, features, env_on, update, want):
    """Both clients serve ``backend``; after ``update`` both answer ``want``."""
    channel, core = _both(server, backend, monkeypatch, node, features, env_on)
    try:
        before = _answers(server, node)
        _after(server, node, update, before)
        # C-core applies the update on its serializer after answering it:
        # ask until the outcome is seen (bounded), then compare single RPCs.
        core.until(want, 5)
        _pyxds_until(channel, want, 5)
        ours = pyxds_calls(channel, 3, wait_for_ready=False, timeout=2)
        theirs = core.call(3, wait_for_ready=False, timeout=2)
        assert ours == theirs == {want: 3}, (ours, theirs)
    finally:
        channel.close()
        core.close()


@pytest.mark.parametrize(("env_on", "served"), [(False, True), (True, False)])
def test_nack_of_cached_cluster_with_fail_on_data_errors_agrees_with_c_core(
    server, backend, monkeypatch, env_on, served
):
    """Env var unset (grpcio 1.85's default): ``fail_on_data_errors`` is not
    looked at, the NACKed Cluster's previous version keeps serving.  Env var
    ``true``: the cached Cluster is dropped and RPCs fail UNAVAILABLE."""
    want = backend.name if served else "error:UNAVAILABLE"
    update = _with_invalid_cluster(_good(backend))
    node = f"data-errors-nack-{env_on}"
    _update_and_compare(
        server, backend, monkeypatch, node, ("fail_on_data_errors",), env_on, update, want
    )
    assert server.nacks(CLUSTER_TYPE_URL, node_id=node)


@pytest.mark.parametrize(("env_on", "served"), [(False, True), (True, False)])
def test_cds_deletion_with_ignore_and_fail_features_agrees_with_c_core(
    server, backend, monkeypatch, env_on, served
):
    """Bootstrap with both ``ignore_resource_deletion`` and
    ``fail_on_data_errors``.  Env var unset: A53 alone decides, the deletion
    is ignored.  Env var ``true``: A88 ignores ``ignore_resource_deletion``
    and ``fail_on_data_errors`` drops the Cluster."""
    want = backend.name if served else "error:UNAVAILABLE"
    features = ("ignore_resource_deletion", "fail_on_data_errors")
    update = _without_cluster(_good(backend))
    node = f"data-errors-delete-{env_on}"
    _update_and_compare(server, backend, monkeypatch, node, features, env_on, update, want)


def test_nack_version_when_part_of_the_response_was_valid_differs_from_c_core(server, backend):
    """A documented difference (docs/differences-from-c-core.md): a Cluster
    response where one watched Cluster is invalid and another valid is
    NACKed by both, and both apply the valid one; grpcio 1.85's NACK carries
    the *new* version_info (C-core xds_client_test.cc
    ResourceValidationFailureMultipleResources: "There was one good resource,
    so the version will be updated"), pyxds's the last fully accepted one
    (the xDS protocol's rule, as grpc-go and grpc-java)."""
    other = "data-errors-other"
    routes = [route(prefix="/other", cluster=other), route(prefix="", cluster=CLUSTER)]
    good = snapshot(routes, {CLUSTER: [[backend.address]], other: [[backend.address]]})
    invalid = _with_invalid_cluster(snapshot(routes[1:], {CLUSTER: [[backend.address]]}))
    (other_cluster,) = (c for c in good.clusters if c.name == other)
    bad = Snapshot(good.listeners, good.routes, [*invalid.clusters, other_cluster], good.endpoints)
    nack_versions = {}
    for who in ("pyxds", "grpcio"):
        node = f"data-errors-nack-version-{who}"
        server.set_snapshot(Snapshot(*_parts(good), version="1"), node_id=node)
        bootstrap = server.bootstrap(node_id=node)
        if who == "pyxds":
            channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
            assert call_until(channel, backend.name, 10) < 10
            close = channel.close
        else:
            core = CoreXdsClient(bootstrap)
            assert core.until(backend.name, 10)[backend.name] == 1
            close = core.close
        try:
            server.set_snapshot(Snapshot(*_parts(bad), version="2"), node_id=node)
            nack = server.wait_for_nack(CLUSTER_TYPE_URL, node_id=node, timeout=10)
            nack_versions[who] = nack.version_info
        finally:
            close()
    assert nack_versions == {"pyxds": "1", "grpcio": "2"}, nack_versions


def _parts(snap: Snapshot) -> tuple:
    return snap.listeners, snap.routes, snap.clusters, snap.endpoints
