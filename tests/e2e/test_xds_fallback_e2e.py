"""xDS server fallback (gRFC A71) end to end: two real pyxds.server
control planes, real backends, pyxds channels, and grpcio's C-core
``xds:///`` channel on the same bootstrap (differential)."""

from __future__ import annotations

import threading
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
    who,
)
from ports import HeldPortManagementServer

import pyxds._api as pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

FAST_BACKOFF = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 300)]


def two_server_bootstrap(primary: ManagementServer, secondary: ManagementServer, node: str) -> dict:
    config = secondary.bootstrap(node_id=node)
    config["xds_servers"] = [
        {"server_uri": primary.address, "channel_creds": [{"type": "insecure"}]},
        {"server_uri": secondary.address, "channel_creds": [{"type": "insecure"}]},
    ]
    return config


def serving(backend: Backend):
    return snapshot([route(prefix="", cluster="c")], {"c": [[backend.address]]})


@pytest.fixture
def planes():
    """A primary (not started) and a running secondary; each routes to its own
    backend.  The primary's port is held whenever it is down (ports.py)."""
    primary = HeldPortManagementServer(hold_now=True)
    secondary = ManagementServer().start()
    backends = {name: Backend(name).start() for name in ("primary", "secondary")}
    primary.set_snapshot(serving(backends["primary"]))
    secondary.set_snapshot(serving(backends["secondary"]))
    yield primary, secondary
    for backend in backends.values():
        backend.release()
    primary.close()
    secondary.stop()


def test_primary_down_at_start_serves_from_secondary_then_returns_to_primary(planes):
    primary, secondary = planes
    channel = pyxds.insecure_channel(
        TARGET, bootstrap=two_server_bootstrap(primary, secondary, "fb-1"), options=FAST_BACKOFF
    )
    try:
        assert call_until(channel, "secondary", 10.0) < 10.0
        streams_before = secondary.stream_count
        assert streams_before >= 1
        primary.start()
        assert call_until(channel, "primary", 15.0) < 15.0
        dump = channel.config_dump()
        servers = {c["xds_server"] for c in dump["xds_client"]["generic_xds_configs"]}
        assert servers == {primary.address}
        # The fallback server's stream is closed once the primary took over.
        assert secondary.wait_until(lambda: secondary.stream_count == 0, timeout=5.0)
    finally:
        channel.close()


def test_primary_dying_after_serving_keeps_cached_resources_without_fallback(planes):
    primary, secondary = planes
    primary.start()
    channel = pyxds.insecure_channel(
        TARGET, bootstrap=two_server_bootstrap(primary, secondary, "fb-2"), options=FAST_BACKOFF
    )
    try:
        assert call_until(channel, "primary", 10.0) < 10.0
        primary.stop()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert who(channel) == "primary"
        assert secondary.total_streams == 0
    finally:
        channel.close()


def test_fallback_of_one_target_leaves_other_targets_on_the_primary(planes):
    """A71: XdsClients are per data-plane target, so a new channel whose
    resources are not cached falls back alone; a channel with everything
    cached keeps the primary's config."""
    primary, secondary = planes
    for plane in (primary, secondary):
        one = plane.snapshot()
        plane.set_snapshot(
            Snapshot(
                listeners=[*one.listeners, b.listener("echo-other", "echo-service-route")],
                routes=one.routes,
                clusters=one.clusters,
                endpoints=one.endpoints,
            )
        )
    primary.start()
    bootstrap = two_server_bootstrap(primary, secondary, "fb-scope")
    first = pyxds.insecure_channel(TARGET, bootstrap=bootstrap, options=FAST_BACKOFF)
    second = None
    try:
        assert call_until(first, "primary", 10.0) < 10.0
        primary.stop()
        # Another target needs resources nobody cached: only its client falls back.
        second = pyxds.insecure_channel(
            "xds:///echo-other", bootstrap=bootstrap, options=FAST_BACKOFF
        )
        assert call_until(second, "secondary", 10.0) < 10.0
        assert secondary.stream_count == 1
        assert who(first) == "primary"
        scopes = {first.config_dump()["xds_client"]["client_scope"]}
        scopes.add(second.config_dump()["xds_client"]["client_scope"])
        assert len(scopes) == 2
    finally:
        first.close()
        if second is not None:
            second.close()


def test_fallback_and_return_agree_with_c_core(planes):
    """grpcio 1.85's C-core serves from the secondary at once when the primary
    is down, and returns to the primary after it comes up (its ADS backoff);
    pyxds does the same, measured side by side."""
    primary, secondary = planes
    bootstrap = two_server_bootstrap(primary, secondary, "fb-core")
    core = CoreXdsClient(bootstrap)
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap, options=FAST_BACKOFF)
    try:
        theirs = core.until("secondary", 10.0)
        assert theirs["__elapsed__"] < 10_000, theirs
        assert call_until(channel, "secondary", 10.0) < 2.0
        primary.start()
        ours: list[float] = []
        thread = threading.Thread(target=lambda: ours.append(call_until(channel, "primary", 20.0)))
        thread.start()
        theirs = core.until("primary", 20.0)
        thread.join(25.0)
        assert "__elapsed__" in theirs, theirs
        assert ours and ours[0] < 20.0
        # Both back within their ADS backoff of each other (1 s initial, x1.6, jitter).
        assert abs(ours[0] - theirs["__elapsed__"] / 1000) < 3.0, (ours, theirs)
        assert core.call(5) == pyxds_calls(channel, 5) == {"primary": 5}
    finally:
        channel.close()
        core.close()


def test_primary_dying_after_serving_agrees_with_c_core(planes):
    """Everything cached: neither C-core nor pyxds contacts the fallback."""
    primary, secondary = planes
    primary.start()
    bootstrap = two_server_bootstrap(primary, secondary, "fb-core-2")
    core = CoreXdsClient(bootstrap)
    channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap, options=FAST_BACKOFF)
    try:
        assert core.call(3) == pyxds_calls(channel, 3) == {"primary": 3}
        primary.stop()
        time.sleep(1.5)  # real C-core in a subprocess: its ADS retry runs on wall time
        assert core.call(10) == pyxds_calls(channel, 10) == {"primary": 10}
        assert secondary.total_streams == 0
    finally:
        channel.close()
        core.close()
