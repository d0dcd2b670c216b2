"""One listening address's serving state (gRFC A36 "Serving and Not
Serving", "configuration error logging"), sans-IO: ServedAddress over
FakeXdsClient with a fake grpcio backend and FakeClock."""

from __future__ import annotations

import ipaddress
import logging

from pyxds.server import builders as b
from pyxds.server import inbound as ib
from pyxds.serving.ports import ListeningAddress
from pyxds.serving.served_address import ServedAddress
from pyxds.testing import FakeXdsClient
from pyxds.testing.fake_clock import FakeClock
from pyxds.testing.fake_xds_client import LISTENER_TYPE_URL, ROUTE_CONFIG_TYPE_URL
from pyxds.xds.resources import LISTENER, ROUTE_CONFIG

TEMPLATE = "lds/%s"
ADDRESS = "127.0.0.1:8080"
NAME = f"lds/{ADDRESS}"
GRACE = 600.0


def decoded(proto, kind=LISTENER):
    result = kind.decode(proto.SerializeToString(), use_memo=False)
    assert result.error is None, result.error
    return result.resource


def lis(*chains, address=ADDRESS):
    return decoded(ib.server_listener(NAME, address, chains or [ib.filter_chain()]))


class Backend:
    """Records grpcio servers started and stopped (handles are numbers)."""

    def __init__(self):
        self.started = []
        self.stopped = []

    def start_server(self, address, credentials, gate):
        self.started.append(len(self.started))
        return self.started[-1]

    def stop_server(self, handle, grace):
        self.stopped.append((handle, grace))


class Harness:
    def __init__(self):
        self.client = FakeXdsClient()
        self.backend = Backend()
        self.events = []
        self.served = ServedAddress(
            ListeningAddress(ipaddress.ip_address("127.0.0.1"), 8080),
            reservation=None,  # type: ignore[arg-type]  # not used
            credentials=None,
            backend=self.backend,
            clock=FakeClock(),
            run=lambda fn: fn(),
            notify=lambda *event: self.events.append(event),
            drain_grace=GRACE,
        )
        self.served.start(self.client, TEMPLATE)


def test_serving_changes_are_reported_once_each_with_the_reason():
    """A36: the callback on each change of serving state, with the error
    when not serving; a NACK of a later version keeps the good Listener (no
    call); deletion stops serving; the Listener coming back serves again."""
    h = Harness()
    assert h.events == [] and h.backend.started == []
    h.client.push(lis())
    assert h.events == [(ADDRESS, True, None)] and h.backend.started == [0]
    h.client.error(LISTENER_TYPE_URL, NAME, "NACK: something invalid")  # ambient
    h.client.push(lis())  # the same Listener again
    assert h.events == [(ADDRESS, True, None)] and h.backend.stopped == []
    h.client.does_not_exist(LISTENER_TYPE_URL, NAME)
    assert h.events[-1] == (ADDRESS, False, f"LDS resource {NAME} does not exist")
    assert h.backend.stopped == [(0, GRACE)]  # drained: started RPCs do not fail
    h.client.push(lis())
    assert h.events[-1] == (ADDRESS, True, None) and h.backend.started == [0, 1]
    h.client.push(lis(address="127.0.0.1:9"))
    serving, error = h.events[-1][1:]
    assert not serving and "Address in LDS update does not match listening address" in error
    assert h.backend.stopped[-1] == (1, GRACE)
    assert len(h.events) == 4


def test_a_listener_update_that_keeps_the_transport_reports_nothing():
    h = Harness()
    h.client.push(lis())
    deny = ib.rbac_filter("rbac", "DENY", {"all": ib.rbac_policy()})
    h.client.push(lis(ib.filter_chain(http_filters=[deny])))
    assert h.events == [(ADDRESS, True, None)]
    assert h.backend.started == [0] and h.backend.stopped == []


def test_configuration_errors_are_logged_on_each_update_then_once_when_gone(caplog):
    """A36 "configuration error logging": a warning on each update while a
    route's action is not non_forwarding_action (or an RDS resource is
    broken), then a single warning once there are no such errors."""
    caplog.set_level(logging.WARNING, logger="pyxds.serving.served_address")
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="routes")))
    bad = ib.inbound_route_config("routes", [b.route(prefix="/", cluster="c")])
    h.client.push(decoded(bad, ROUTE_CONFIG))
    h.client.push(
        decoded(
            ib.inbound_route_config(
                "routes", [b.route(prefix="/a", cluster="c"), b.route(prefix="/")]
            ),
            ROUTE_CONFIG,
        )
    )
    errors = [r.getMessage() for r in caplog.records if "non_forwarding_action" in r.getMessage()]
    assert len(errors) == 2
    caplog.clear()
    h.client.push(decoded(ib.inbound_route_config("routes"), ROUTE_CONFIG))
    h.client.push(decoded(ib.inbound_route_config("routes", [b.route(prefix="/x")]), ROUTE_CONFIG))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "no configuration errors" in messages[0], messages
    assert h.events == [(ADDRESS, True, None)]


def test_a_broken_rds_resource_is_a_configuration_error_until_it_is_fixed(caplog):
    caplog.set_level(logging.WARNING, logger="pyxds.serving.served_address")
    h = Harness()
    h.client.push(lis(ib.filter_chain(rds="routes")))
    h.client.does_not_exist(ROUTE_CONFIG_TYPE_URL, "routes")
    assert any("RDS resource routes" in r.getMessage() for r in caplog.records)
    caplog.clear()
    h.client.push(decoded(ib.inbound_route_config("routes"), ROUTE_CONFIG))
    assert [r.getMessage() for r in caplog.records] == [
        f"xDS server {ADDRESS}: no configuration errors any more"
    ]
