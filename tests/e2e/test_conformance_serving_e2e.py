"""Serving-state conformance cases where the other implementations'
suites disagree, settled by grpcio's ``grpc.server(xds=True)`` (C-core, in
a subprocess) next to pyxds's server on the same control plane (gRFC A36
"xDS Protocol": the Listener's address must match the listening one)."""

from __future__ import annotations

import time

import pytest
from xds_server_fixtures import (
    TEMPLATE,
    Client,
    CoreXdsServer,
    PyxdsServer,
    listener_name,
    wait_until,
)

from pyxds.server import Snapshot
from pyxds.server import inbound as ib


def plain(address, listener_address=None):
    return ib.server_listener(
        listener_name(address), listener_address or address, [ib.filter_chain()]
    )


def outcome(address):
    with Client(address) as client:
        return client.code()


@pytest.fixture
def both(control):
    ours = PyxdsServer(
        control.bootstrap("ours", server_listener_resource_name_template=TEMPLATE),
        secure=False,
    )
    core = CoreXdsServer(
        control.bootstrap("core", server_listener_resource_name_template=TEMPLATE),
        secure=False,
    )
    try:
        yield ours.start(), core.start()
    finally:
        ours.stop()
        core.stop()


def publish(control, ours, core, make):
    control.set_snapshot(Snapshot(listeners=[make(ours.address)]), node_id="ours")
    control.set_snapshot(Snapshot(listeners=[make(core.address)]), node_id="core")


def served_in_both(ours, core, code):
    got = {}
    for server in (ours, core):
        wait_until(lambda s=server: outcome(s.address) == code, 15)
        got[server.kind] = outcome(server.address)
    return got


def test_a_listener_with_port_zero_is_served_and_one_for_another_ip_is_not(control, both):
    """grpc-java XdsServerWrapperTest.onChanged_listenerAddressWildcardPort
    serves a Listener with port 0 on any port; grpc-go (listener_wrapper.go)
    compares host and port.  grpcio 1.85 (C-core) serves it, as pyxds does;
    a Listener for another IP with port 0, or for 0.0.0.0 while the server
    listens on 127.0.0.1, is served by neither (A36: the address must
    match)."""
    ours, core = both
    publish(control, ours, core, plain)
    assert served_in_both(ours, core, "OK") == {ours.kind: "OK", "core": "OK"}
    port_zero = {}
    for server in (ours, core):
        name = "ours" if server is ours else "core"
        acked = len(control.acks("LDS", node_id=name))
        zero = plain(server.address, server.address.rpartition(":")[0] + ":0")
        control.set_snapshot(Snapshot(listeners=[zero]), node_id=name)
        wait_until(lambda n=name, a=acked: len(control.acks("LDS", node_id=n)) > a, 10)
    time.sleep(1.0)  # a server that stops serving closes at once
    for server in (ours, core):
        port_zero[server.kind] = outcome(server.address)
    assert port_zero == {ours.kind: "OK", "core": "OK"}
    assert ours.events == [(ours.address, True, None)]

    for other in ("10.0.0.1:0", "0.0.0.0:{port}"):  # another IP, port 0; the wildcard IP

        def elsewhere(address, other=other):
            return plain(address, other.format(port=address.rpartition(":")[2]))

        publish(control, ours, core, elsewhere)
        gone = served_in_both(ours, core, "UNAVAILABLE")
        assert gone == {ours.kind: "UNAVAILABLE", "core": "UNAVAILABLE"}, other
        assert ours.events[-1][1] is False
        assert "does not match listening address" in ours.events[-1][2]
        publish(control, ours, core, plain)
        assert served_in_both(ours, core, "OK") == {ours.kind: "OK", "core": "OK"}
