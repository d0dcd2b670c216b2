"""Conformance cases for an xDS-enabled server's serving state and Listener
updates (gRFC A36 "Serving and Not Serving", "xDS Protocol"; A88 data
errors as a server's Listener and RDS see them), taken from other gRPC
implementations' test suites and replayed sans-IO: ServedAddress and
ListenerWatch over FakeXdsClient, a recording grpcio backend and FakeClock.

Each test names its source (repository, file, test name).  Where the
sources disagree, C-core (grpcio) decides.
"""

from __future__ import annotations

import ipaddress

import grpc

from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.serving.core import DEFAULT_DRAIN_GRACE, drain_grace
from pyxds.serving.listener_watch import ServingConfig
from pyxds.serving.ports import ListeningAddress
from pyxds.serving.served_address import BIND_RETRY, BindError, ServedAddress
from pyxds.status import Status
from pyxds.testing import FakeXdsClient
from pyxds.testing.fake_clock import FakeClock
from pyxds.testing.fake_xds_client import LISTENER_TYPE_URL, ROUTE_CONFIG_TYPE_URL
from pyxds.xds.resources import LISTENER, ROUTE_CONFIG

TEMPLATE = "grpc/server?xds.resource.listening_address=%s"
ADDRESS = "127.0.0.1:8080"
NAME = TEMPLATE.replace("%s", ADDRESS)
GRACE = 600.0
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def decoded(proto, kind=LISTENER):
    result = kind.decode(proto.SerializeToString(), use_memo=False)
    assert result.error is None, result.error
    return result.resource


def lis(*chains, address=ADDRESS, default=None):
    return decoded(ib.server_listener(NAME, address, chains or [ib.filter_chain()], default))


def rds(name, *routes):
    return decoded(ib.inbound_route_config(name, list(routes) or None), ROUTE_CONFIG)


class Backend:
    """Records grpcio servers started and stopped; ``bind_failures`` start
    attempts fail as a port another program holds."""

    def __init__(self):
        self.started = []
        self.stopped = []
        self.attempts = 0
        self.bind_failures = 0

    def start_server(self, address, credentials, gate):
        self.attempts += 1
        if self.bind_failures:
            self.bind_failures -= 1
            raise BindError(f"cannot listen on {address}")
        self.started.append(len(self.started))
        return self.started[-1]

    def stop_server(self, handle, grace):
        self.stopped.append((handle, grace))


class Harness:
    def __init__(self):
        self.client = FakeXdsClient()
        self.backend = Backend()
        self.clock = FakeClock()
        self.events = []
        self.served = ServedAddress(
            ListeningAddress(ipaddress.ip_address("127.0.0.1"), 8080),
            reservation=None,  # type: ignore[arg-type]  # not used
            credentials=None,
            backend=self.backend,
            clock=self.clock,
            run=lambda fn: fn(),
            notify=lambda *event: self.events.append(event),
            drain_grace=GRACE,
        )
        self.served.start(self.client, TEMPLATE)

    @property
    def watch(self):
        return self.served.watch

    @property
    def config(self) -> ServingConfig:
        config = self.served.config
        assert config is not None
        return config

    def route_failure(self, chain_name):
        """The failure of an RPC on the chain named ``chain_name`` (None: it
        is routed)."""
        config = self.config
        for chain in config.listener.all_chains():
            if chain.name == chain_name:
                return config.router_for(chain).route("a", "/s/m", ()).failure
        raise AssertionError(f"no chain {chain_name}")


# ---------------------------------------------------------------- not serving until ready


def test_nothing_listens_until_the_listener_and_every_rds_it_names_arrived():
    """grpc-java XdsServerWrapperTest.discoverState_rds: a Listener whose
    chains (and default chain) name RDS resources is applied only once all
    of them arrived; no server listens and no serving callback before."""
    h = Harness()
    first = lis(ib.filter_chain(name="f0", source_ports=[1]), ib.filter_chain(name="f1", rds="r0"))
    h.client.push(first)
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"r0"}
    second = lis(
        ib.filter_chain(name="f0", source_ports=[1]),
        ib.filter_chain(name="f2", rds="r1"),
        default=ib.filter_chain(name="f3", rds="r2"),
    )
    h.client.push(second)  # replaces the pending one: r0 is no longer wanted
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"r1", "r2"}
    h.client.push(rds("r1"))
    assert h.backend.started == [] and h.events == []
    h.client.push(rds("r2"))
    assert h.backend.started == [0] and h.events == [(ADDRESS, True, None)]
    assert [c.name for c in h.config.listener.all_chains()] == ["f0", "f2", "f3"]
    assert all(h.route_failure(n) is None for n in ("f0", "f2", "f3"))


def test_one_rds_resource_named_by_every_chain_is_watched_once():
    """grpc-java XdsServerWrapperTest.discoverState_oneRdsToMultipleFilterChain:
    three chains naming one RouteConfiguration: one watch, one arrival
    serves them all; an update naming another one for some chains waits
    for it, keeps the one already there, and starts no second server."""
    h = Harness()
    h.client.push(
        lis(
            ib.filter_chain(name="f0", rds="r0", source_ports=[1]),
            ib.filter_chain(name="f1", rds="r0", source_ports=[2]),
            default=ib.filter_chain(name="f2", rds="r0"),
        )
    )
    assert h.client.watcher_count(ROUTE_CONFIG_TYPE_URL, "r0") == 1
    h.client.push(rds("r0"))
    assert h.events == [(ADDRESS, True, None)] and h.backend.started == [0]
    old = h.config
    h.client.push(
        lis(
            ib.filter_chain(name="f3", rds="r0", source_ports=[1]),
            ib.filter_chain(name="f4", rds="r1", source_ports=[2]),
            default=ib.filter_chain(name="f5", rds="r1"),
        )
    )
    assert h.config is old  # pending on r1
    h.client.push(rds("r1"))
    assert [c.name for c in h.config.listener.all_chains()] == ["f3", "f4", "f5"]
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"r0", "r1"}
    assert h.backend.started == [0] and h.events == [(ADDRESS, True, None)]


# ------------------------------------------------------------------ RDS errors (A36, A88)


def test_an_rds_error_serves_the_listener_and_fails_only_that_chain():
    """grpc-java XdsServerWrapperTest.discoverState_rds_onError_and_resourceNotExist,
    grpc-go internal/xds/server/listener_wrapper_test.go
    TestHandleRDSUpdate_ErrorBeforeUpdate / TestHandleRDSUpdate_ErrorAfterSuccess:
    an RDS error before any version counts as attempted (the Listener
    serves; RPCs on that chain fail UNAVAILABLE); a version then routes;
    an ambient error keeps it (A88); does-not-exist drops it (RPCs fail
    again), and the server keeps serving the other chain throughout."""
    h = Harness()
    h.client.push(
        lis(
            ib.filter_chain(name="inline", source_ports=[1]),
            ib.filter_chain(name="by-rds", rds="r0"),
        )
    )
    h.client.error(ROUTE_CONFIG_TYPE_URL, "r0", "connection lost")
    assert h.events == [(ADDRESS, True, None)]
    assert h.route_failure("inline") is None
    failure = h.route_failure("by-rds")
    assert failure is not None and failure.code is UNAVAILABLE
    assert "r0" in failure.details
    h.client.push(rds("r0"))
    assert h.route_failure("by-rds") is None
    h.client.error(ROUTE_CONFIG_TYPE_URL, "r0", "NACK: bad")  # ambient now
    assert h.route_failure("by-rds") is None
    h.client.does_not_exist(ROUTE_CONFIG_TYPE_URL, "r0")
    failure = h.route_failure("by-rds")
    assert failure is not None and failure.code is UNAVAILABLE
    assert "RDS resource r0 does not exist" in failure.details
    assert h.route_failure("inline") is None
    assert h.events == [(ADDRESS, True, None)] and h.backend.stopped == []


def test_rds_updates_reach_the_served_chain_without_a_new_server():
    """grpc-go internal/xds/server/listener_wrapper_test.go
    TestHandleRDSUpdate_Success; A36: an RDS update is no Listener update
    (nothing drains)."""
    h = Harness()
    h.client.push(lis(ib.filter_chain(name="c", rds="r0")))
    h.client.push(rds("r0", b.route(prefix="/other.")))
    failure = h.route_failure("c")
    assert failure is not None and failure.code is UNAVAILABLE  # no route for /s/m
    h.client.push(rds("r0"))
    assert h.route_failure("c") is None
    assert h.backend.started == [0] and h.backend.stopped == []


# ---------------------------------------------------------------- LDS errors (A36, A88)


def test_a_listener_that_does_not_exist_is_not_serving_until_one_arrives():
    """grpc-java XdsServerWrapperTest.error (first part) and
    discoverState_restart_afterResourceNotExist: does-not-exist before any
    Listener calls the callback with not serving (and the reason), nothing
    listens; a Listener later serves."""
    h = Harness()
    h.client.does_not_exist(LISTENER_TYPE_URL, NAME)
    assert h.events == [(ADDRESS, False, f"LDS resource {NAME} does not exist")]
    assert h.backend.attempts == 0
    h.client.push(lis())
    assert h.events[-1] == (ADDRESS, True, None) and h.backend.started == [0]


def test_a_nacked_first_listener_is_not_serving_and_a_later_nack_keeps_the_good_one():
    """A88 (a data error with nothing cached goes to OnResourceChanged, one
    with a cached resource is ambient); grpc-go test/xds
    xds_server_integration_test / C-core xds_enabled_server_end2end_test
    BadLdsUpdate*: a NACKed Listener never serves; after a good one a
    NACK changes nothing."""
    h = Harness()
    h.client.error(LISTENER_TYPE_URL, NAME, "use_original_dst: field not supported")
    assert len(h.events) == 1
    assert h.events[0][1] is False and "use_original_dst" in h.events[0][2]
    assert h.backend.attempts == 0
    h.client.push(lis())
    h.client.error(LISTENER_TYPE_URL, NAME, "use_original_dst: field not supported")
    assert h.events[1:] == [(ADDRESS, True, None)]
    assert h.backend.stopped == [] and h.served.serving


def test_an_ambient_error_while_an_update_is_pending_keeps_both():
    """A88: an ambient error neither drops the served Listener nor the
    pending one (it is promoted once its RDS arrives)."""
    h = Harness()
    h.client.push(lis(ib.filter_chain(name="old")))
    h.client.push(lis(ib.filter_chain(name="new", rds="r0")))
    h.client.error(LISTENER_TYPE_URL, NAME, "xDS channel: connection refused")
    assert [c.name for c in h.config.listener.all_chains()] == ["old"]
    h.client.push(rds("r0"))
    assert [c.name for c in h.config.listener.all_chains()] == ["new"]
    assert h.events == [(ADDRESS, True, None)]


def test_a_pending_listener_dropped_by_an_error_unwatches_its_rds_and_ignores_it_late():
    """grpc-java XdsServerWrapperTest.error (second part): a Listener
    waiting for its RDS, then the Listener fails: not serving, the RDS
    watch is cancelled, and an RDS update delivered late changes nothing."""
    h = Harness()
    h.client.does_not_exist(LISTENER_TYPE_URL, NAME)
    h.client.push(lis(ib.filter_chain(rds="rds")))
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == {"rds"}
    h.client.does_not_exist(LISTENER_TYPE_URL, NAME)
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == set()
    assert len(h.events) == 1  # the same reason again is no new state
    h.watch._on_rds("rds", rds("rds"))  # a callback that was already queued
    assert h.backend.attempts == 0 and h.served.config is None and len(h.events) == 1


def test_deletion_after_serving_drains_and_unwatches_rds():
    """grpc-java XdsServerWrapperTest.error ("not serving after serving");
    A36: not serving closes existing connections without failing started
    RPCs (the grpcio server stops with the drain grace time)."""
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="rds")))
    h.client.push(rds("rds"))
    h.client.does_not_exist(LISTENER_TYPE_URL, NAME)
    assert h.events == [
        (ADDRESS, True, None),
        (ADDRESS, False, f"LDS resource {NAME} does not exist"),
    ]
    assert h.backend.stopped == [(0, GRACE)]
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == set()


# ----------------------------------------------------------------- listening address


def test_listener_address_must_equal_the_listening_address():
    """grpc-java XdsServerWrapperTest.onChanged_listenerAddressMismatch /
    onChanged_listenerAddressPortMismatch; A36 "matching address and
    port_value": another IP or another port is not served, with C-core's
    reason."""
    for other in ("10.0.0.1:8080", "127.0.0.1:8081"):
        h = Harness()
        h.client.push(lis(address=other))
        assert len(h.events) == 1 and h.events[0][1] is False
        assert "Address in LDS update does not match listening address" in h.events[0][2]
        assert h.backend.attempts == 0


def test_a_listener_with_port_zero_matches_the_listening_port_of_its_ip():
    """grpc-java XdsServerWrapperTest.onChanged_listenerAddressWildcardPort
    (a Listener with port 0 serves on any port) against grpc-go
    listener_wrapper.go (host and port compared): C-core (grpcio 1.85)
    serves it too, as the differential
    tests/e2e/test_conformance_serving_e2e.py shows; its IP must still match
    (grpc-java onChanged_listenerAddressMismatch: ``20.3.4.5:0``)."""
    h = Harness()
    h.client.push(lis(address="127.0.0.1:0"))
    assert h.events == [(ADDRESS, True, None)] and h.backend.started == [0]
    h.client.push(lis(address="10.0.0.1:0"))
    assert h.events[-1][1] is False
    assert "does not match listening address" in h.events[-1][2]


def test_a_mismatched_address_after_serving_stops_serving_and_a_good_one_resumes():
    """C-core xds_enabled_server_end2end_test / grpc-go
    xds/server_serving_mode_ext_test.go (serving mode changes): a good
    Listener, then one for another address (not serving, connections
    drained), then the good one again (serving, a new server)."""
    h = Harness()
    h.client.push(lis())
    h.client.push(lis(address="127.0.0.1:9"))
    h.client.push(lis())
    assert [e[1] for e in h.events] == [True, False, True]
    assert h.backend.started == [0, 1] and h.backend.stopped == [(0, GRACE)]


# ---------------------------------------------------------------- ports, retries, stop


def test_a_port_that_cannot_be_opened_is_retried_and_serves_later():
    """grpc-java XdsServerWrapperTest.error ("start throws, retried after
    the delay"); A36: a port that cannot be opened is not serving and is
    retried automatically."""
    h = Harness()
    h.backend.bind_failures = 1
    h.client.push(lis())
    assert h.events == [(ADDRESS, False, f"cannot listen on {ADDRESS}")]
    h.clock.advance(BIND_RETRY)
    assert h.events[-1] == (ADDRESS, True, None) and h.backend.started == [0]


def test_listener_deletion_cancels_a_pending_port_retry():
    """grpc-java XdsServerWrapperTest.error ("cancel retry": after the
    Listener is gone no retry task is left)."""
    h = Harness()
    h.backend.bind_failures = 1
    h.client.push(lis())
    h.client.does_not_exist(LISTENER_TYPE_URL, NAME)
    assert h.clock.pending == []
    h.clock.advance(BIND_RETRY)
    assert h.backend.attempts == 1 and h.backend.started == []


def test_stop_cancels_a_pending_port_retry():
    """grpc-java XdsServerWrapperTest.shutdown_pendingRetry."""
    h = Harness()
    h.backend.bind_failures = 1
    h.client.push(lis())
    h.served.stop(None)
    assert h.clock.pending == []
    h.clock.advance(BIND_RETRY)
    assert h.backend.attempts == 1 and h.backend.started == []


def test_stop_while_the_listener_waits_for_rds_starts_nothing_later():
    """grpc-java XdsServerWrapperTest.shutdown (while start waits), grpc-go
    xds/server_test.go TestServeAndCloseDoNotRace: stop with a Listener
    pending on RDS cancels every watch; updates queued before the cancel
    change nothing."""
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="r0")))
    watch = h.watch
    h.served.stop(None)
    assert h.client.watched(LISTENER_TYPE_URL) == set()
    assert h.client.watched(ROUTE_CONFIG_TYPE_URL) == set()
    watch._on_rds("r0", rds("r0"))
    watch.on_resource_changed(lis(ib.filter_chain(name="late")))
    assert h.backend.attempts == 0 and h.events == [] and not h.served.serving


def test_stop_after_serving_stops_the_server_with_the_callers_grace():
    """grpc-java XdsServerWrapperTest.shutdown_afterResourceNotExist /
    shutdown: stop ends the grpcio server with stop()'s grace (not the
    drain grace), and reports no serving change afterwards."""
    h = Harness()
    h.client.push(lis())
    h.served.stop(1.5)
    assert h.backend.stopped == [(0, 1.5)]
    h.client.push(lis(ib.filter_chain(name="late")))
    assert h.events == [(ADDRESS, True, None)]


# ----------------------------------------------------------------------- drain grace


def test_drain_grace_time_is_c_cores_channel_argument_in_milliseconds():
    """A36 "drain grace time" (GRPC_ARG_SERVER_CONFIG_CHANGE_DRAIN_GRACE_TIME_MS,
    10 minutes by default); C-core xds_enabled_server_end2end_test
    (drain grace time set through the channel argument)."""
    assert drain_grace(None) == DEFAULT_DRAIN_GRACE == 600.0
    assert drain_grace([("grpc.server_config_change_drain_grace_time_ms", 2500)]) == 2.5
    assert drain_grace([("grpc.server_config_change_drain_grace_time_ms", -1)]) == 0.0


def test_not_serving_is_a_status_the_watch_reports_once_per_reason():
    """C-core XdsServerConfigFetcher reports each fatal error to the
    serving-status notifier; pyxds reports each new state or reason once
    (the same Status twice is no new call)."""
    h = Harness()
    reason = Status(grpc.StatusCode.FAILED_PRECONDITION, "LDS resource is not a TCP listener")
    h.client.push(decoded(b.listener(NAME)))
    h.client.push(decoded(b.listener(NAME)))
    assert h.events == [(ADDRESS, False, reason.details)]
