"""Differential: the application's channel options reach every endpoint's
connection as they do through grpcio's C-core channel, and RPCs carry what
C-core's carry (``:authority``, ``user-agent``, message limits, TLS name
checks).  The same options and scenario through a pyxds channel and a
grpcio channel in a subprocess (tests/e2e/core_channel.py), against the
same pyxds.server and backends.

C-core's rule (src/core/client_channel/client_channel.cc, the channel's
default authority: ``grpc.default_authority``, else the resolver's default
authority for the target, i.e. the URI path: ``name`` of ``xds:///name``,
``host:port`` of a dns target; src/core/ext/transport/chttp2/client
``grpc.ssl_target_name_override`` is the authority when none is given): the
subchannels take the channel's authority, never the endpoint's address.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from channel_fixtures import ANSWERED_WITHIN, TARGET, route, snapshot, until_answered, wait_until
from core_channel import BIG, WHO_AM_I, CoreChannels, PeerBackend, decoded, outcome

import pyxds
import pyxds.aio
from pyxds.server import ManagementServer
from pyxds.testing.certs import CertAuthority

LISTENER = TARGET.removeprefix("xds:///")


@pytest.fixture(scope="module")
def backends() -> Iterator[list[PeerBackend]]:
    started = [PeerBackend("p0"), PeerBackend("p1")]
    yield started
    for backend in started:
        backend.stop()


@pytest.fixture(scope="module")
def server(backends: list[PeerBackend]) -> Iterator[ManagementServer]:
    srv = ManagementServer().start()
    srv.set_snapshot(
        snapshot([route(prefix="", cluster="c")], {"c": [[b.address for b in backends]]})
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def bootstrap(server: ManagementServer) -> dict:
    return server.bootstrap(node_id="channel-options")


@pytest.fixture(scope="module")
def core(bootstrap: dict) -> Iterator[CoreChannels]:
    channels = CoreChannels(bootstrap)
    yield channels
    channels.close()


def seen_by_backends(calls: list[dict]) -> dict[str, set[tuple[str, str]]]:
    """Per backend name: the (authority, user agent) pairs its RPCs carried."""
    out: dict[str, set[tuple[str, str]]] = {}
    for result in calls:
        reply = decoded(result)
        assert isinstance(reply, dict), result
        out.setdefault(reply["name"], set()).add((reply["authority"], reply["user_agent"]))
    return out


def pyxds_who(channel: grpc.Channel, n: int) -> list[dict]:
    return [outcome(channel, WHO_AM_I) for _ in range(n)]


def both_answered(results: list[dict]) -> bool:
    return set(seen_by_backends(results)) == {"p0", "p1"}


def name_of(result: dict) -> Any:
    reply = decoded(result)
    return reply.get("name") if isinstance(reply, dict) else None


def until_both_answered(call: Any) -> list[dict]:
    """``call()``'s results (a list of RPC outcomes each time) until both
    backends have answered (round_robin picks READY endpoints only, and the
    second one's connection may still be coming up while the first RPCs go,
    in C-core's client as in pyxds's), bounded."""
    return until_answered(call, {"p0", "p1"}, name_of)


OPTION_SETS = {
    "none": [],
    "user-agents": [
        ("grpc.primary_user_agent", "app/1.0"),
        ("grpc.secondary_user_agent", "tail/2.0"),
    ],
    "default-authority": [("grpc.default_authority", "svc.example")],
}


@pytest.mark.parametrize("name", sorted(OPTION_SETS))
def test_every_endpoint_sees_the_authority_and_user_agent_c_core_sends(
    name, backends, bootstrap, core
):
    """C-core: RPCs of an ``xds:///echo-service`` channel carry ``:authority``
    ``echo-service`` (the channel's default authority) on every endpoint, and
    ``grpc.primary_user_agent`` / ``grpc.secondary_user_agent`` /
    ``grpc.default_authority`` reach every endpoint's connection (C-core
    test/core/end2end/tests/default_host.cc, grpc-go
    test/authority_test.go).  pyxds sent the endpoint's address as the
    authority before its subchannels were given the channel's."""
    options = OPTION_SETS[name]
    core.open(name, TARGET, options)
    theirs = seen_by_backends(until_both_answered(lambda: core.calls(name, WHO_AM_I, n=2)))
    with pyxds.insecure_channel(TARGET, bootstrap=bootstrap, options=options) as channel:
        ours = seen_by_backends(until_both_answered(lambda: pyxds_who(channel, 2)))
    assert set(ours) == set(theirs) == {"p0", "p1"}
    assert ours == theirs
    authority = dict(options).get("grpc.default_authority", LISTENER)
    assert {pair[0] for pairs in ours.values() for pair in pairs} == {authority}


def test_aio_channel_sends_the_authority_c_core_sends(backends, bootstrap, core):
    """The same for a ``pyxds.aio`` channel (its subchannels are
    ``grpc.aio`` channels)."""
    core.open("aio-compare", TARGET, [])
    theirs = seen_by_backends(until_both_answered(lambda: core.calls("aio-compare", WHO_AM_I, n=2)))

    async def main() -> list[dict]:
        async with pyxds.aio.insecure_channel(TARGET, bootstrap=bootstrap) as channel:
            out: list[dict] = []
            deadline = time.monotonic() + ANSWERED_WITHIN
            while time.monotonic() < deadline and not both_answered(out):
                reply = await channel.unary_unary(WHO_AM_I)(b"", timeout=10, wait_for_ready=True)
                out.append({"ok": base64.b64encode(reply).decode()})
            return out

    ours = seen_by_backends(asyncio.run(main()))
    assert set(ours) == {"p0", "p1"}
    assert (
        {a for pairs in ours.values() for a, _ in pairs}
        == {a for pairs in theirs.values() for a, _ in pairs}
        == {LISTENER}
    )


def test_a_dns_target_sends_its_host_name_as_authority(backends, core):
    """C-core: a ``localhost:PORT`` target's RPCs carry ``localhost:PORT``,
    whichever address it resolved to (the dns resolver's default authority
    is the target's path).  pyxds sent ``127.0.0.1:PORT``."""
    target = f"localhost:{backends[0].port}"
    core.open("dns", target, [])
    theirs = seen_by_backends(core.calls("dns", WHO_AM_I))
    with pyxds.insecure_channel(target) as channel:
        ours = seen_by_backends(pyxds_who(channel, 1))
    assert ours == theirs
    assert {a for pairs in ours.values() for a, _ in pairs} == {target}


@pytest.mark.parametrize(
    ("sans", "expect"), [(("localhost",), "ok"), (("other.example",), "DEADLINE_EXCEEDED")]
)
def test_tls_checks_the_certificate_against_the_targets_host_name(sans, expect, core):
    """C-core checks a backend's certificate against the channel's authority
    (the target's host name), not against the address it resolved to: a
    certificate for ``localhost`` serves ``localhost:PORT`` (grpc-go
    credentials/tls tests; C-core's ssl security connector takes the
    channel's default authority as the target name).  pyxds checked it
    against ``127.0.0.1`` and refused it.  A certificate for another name
    fails the handshake in both: the wait_for_ready RPC waits out its
    deadline."""
    ca = CertAuthority("channel options CA")
    leaf = ca.issue("backend", dns=sans)
    backend = PeerBackend("tls", credentials=grpc.ssl_server_credentials([(leaf.key, leaf.cert)]))
    target = f"localhost:{backend.port}"
    try:
        key = f"tls-{sans[0]}"
        core.open(key, target, [], ca=ca.pem)
        (theirs,) = core.calls(key, WHO_AM_I, timeout=2)
        creds = grpc.ssl_channel_credentials(root_certificates=ca.pem)
        with pyxds.secure_channel(target, creds) as channel:
            ours = outcome(channel, WHO_AM_I, timeout=2)
    finally:
        backend.stop()
    if expect == "ok":
        assert decoded(ours) == decoded(theirs)
        assert decoded(ours)["authority"] == target
    else:
        assert ours.get("code") == theirs.get("code") == expect, (ours, theirs)


def test_max_receive_message_length_holds_on_every_endpoint(backends, bootstrap, core):
    """``grpc.max_receive_message_length`` reaches every endpoint's
    connection: a reply over the limit fails RESOURCE_EXHAUSTED with
    C-core's text on each endpoint, one under it passes (C-core
    test/core/end2end/tests/max_message_length.cc, client-side receive
    limit from a channel argument)."""
    options = [("grpc.max_receive_message_length", 1000)]
    core.open("limit", TARGET, options)
    theirs = core.calls("limit", BIG, b"2000", n=4) + core.calls("limit", BIG, b"900", n=4)
    with pyxds.insecure_channel(TARGET, bootstrap=bootstrap, options=options) as channel:
        ours = [outcome(channel, BIG, b"2000") for _ in range(4)]
        ours += [outcome(channel, BIG, b"900") for _ in range(4)]
    strip = [{k: v for k, v in r.items() if k != "elapsed"} for r in ours]
    strip_theirs = [{k: v for k, v in r.items() if k != "elapsed"} for r in theirs]
    assert strip == strip_theirs
    assert strip[0] == {
        "code": "RESOURCE_EXHAUSTED",
        "details": "Stream removed (CLIENT: Received message larger than max (2000 vs. 1000))",
    }
    assert len(backends[0].peers) and len(backends[1].peers)


def test_application_options_do_not_reach_the_control_plane_connection():
    """C-core's XdsClient is the process's, made from the bootstrap alone
    (src/core/xds/grpc/xds_transport_grpc.cc): the application's channel
    options (user agent, default authority) never reach the ADS stream,
    whose ``:authority`` is the bootstrap's ``server_uri``.  The same through
    pyxds (its XdsClient is shared per bootstrap).  Live, grpcio 1.85: the
    user agents differ only in grpcio's own prefix (pyxds's ADS channel is a
    ``grpc.aio`` one: ``grpc-python-asyncio/...``; C-core's: ``grpc-c/...``)."""
    from concurrent import futures

    def recording_control_plane() -> tuple[grpc.Server, list[tuple[str, str]], dict]:
        """A control plane of its own per client (each client retries its
        failed ADS stream, which would land in the other's records): it
        records each stream's (:authority, user agent) and fails it."""
        seen: list[tuple[str, str]] = []

        def ads(requests: Any, context: grpc.ServicerContext) -> Any:
            host = context._rpc_event.call_details.host  # type: ignore[attr-defined]
            agent = dict(context.invocation_metadata()).get("user-agent", "")
            seen.append((host.decode(), agent))
            context.abort(grpc.StatusCode.UNAVAILABLE, "recorded")

        control = grpc.server(futures.ThreadPoolExecutor(2))
        control.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "envoy.service.discovery.v3.AggregatedDiscoveryService",
                    {"StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(ads)},
                )
            ]
        )
        port = control.add_insecure_port("127.0.0.1:0")
        control.start()
        server = {
            "server_uri": f"localhost:{port}",
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }
        boot = {"xds_servers": [server], "node": {"id": "control-plane-options"}}
        return control, seen, boot

    options = [("grpc.primary_user_agent", "app/1.0"), ("grpc.default_authority", "svc.example")]
    core_control, core_seen, core_boot = recording_control_plane()
    our_control, our_seen, our_boot = recording_control_plane()
    core = CoreChannels(core_boot)
    try:
        core.open("ads", "xds:///anything", options)
        core.calls("ads", WHO_AM_I, timeout=1)
        assert wait_until(lambda: core_seen, 10)
        with pyxds.insecure_channel("xds:///anything", bootstrap=our_boot, options=options) as ch:
            outcome(ch, WHO_AM_I, timeout=1)
            assert wait_until(lambda: our_seen, 10)
    finally:
        core.close()
        core_control.stop(None)
        our_control.stop(None)
    theirs, ours = core_seen[0], our_seen[0]
    assert theirs[0] == core_boot["xds_servers"][0]["server_uri"]
    assert ours[0] == our_boot["xds_servers"][0]["server_uri"]
    assert "app/1.0" not in ours[1] and "app/1.0" not in theirs[1]
    assert theirs[1].startswith("grpc-c/") and ours[1].startswith("grpc-python-asyncio/")


@pytest.mark.parametrize("how", ["option", "argument", "none"])
def test_channel_compression_reaches_every_endpoints_connection(how, server):
    """The channel's default compression (``grpc.default_compression_algorithm``,
    or grpcio's ``compression=`` argument, which is that option) compresses
    the requests sent to every endpoint, as C-core's channel does (C-core
    test/core/end2end/tests/compressed_payload.cc, channel default
    algorithm): 64 KB of hex digits cross each endpoint's connection as
    ~33 KB per RPC (gzip), in pyxds as in C-core; without it, as 64 KB."""
    import random

    from tcp_proxy import FreezingProxy

    backends = [PeerBackend("z0"), PeerBackend("z1")]
    proxies = [FreezingProxy(backend.port) for backend in backends]
    node = f"compression-{how}"
    addresses = [f"127.0.0.1:{p.port}" for p in proxies]
    server.set_snapshot(snapshot([route(prefix="", cluster="c")], {"c": [addresses]}), node_id=node)
    boot = server.bootstrap(node_id=node)
    gzip = [("grpc.default_compression_algorithm", 2)] if how != "none" else []
    request = random.Random(1).randbytes(32768).hex().encode()

    def per_rpc() -> list[float]:
        """Bytes sent to each endpoint per RPC it served; then reset."""
        out = [p.bytes_up / max(1, len(b.peers)) for p, b in zip(proxies, backends, strict=True)]
        assert all(b.peers for b in backends), "an endpoint served no RPC"
        for p, b in zip(proxies, backends, strict=True):
            p.bytes_up = 0
            b.peers.clear()
        return out

    try:
        core = CoreChannels(boot)
        try:
            core.open("z", TARGET, gzip)  # grpcio's compression= is this option
            for _ in range(50):  # until both endpoints served (round_robin)
                assert "ok" in core.calls("z", WHO_AM_I, request)[0]
                if all(len(b.peers) >= 2 for b in backends):
                    break
        finally:
            core.close()
        theirs = per_rpc()
        options = gzip if how == "option" else []
        compression = grpc.Compression.Gzip if how == "argument" else None
        with pyxds.insecure_channel(
            TARGET, bootstrap=boot, options=options, compression=compression
        ) as channel:
            for _ in range(50):
                assert "ok" in outcome(channel, WHO_AM_I, request)
                if all(len(b.peers) >= 2 for b in backends):
                    break
        ours = per_rpc()
    finally:
        for p in proxies:
            p.close()
        for backend in backends:
            backend.stop()
    if how == "none":
        assert all(n > 65536 for n in ours + theirs), (ours, theirs)
    else:
        assert all(20000 < n < 45000 for n in ours + theirs), (ours, theirs)


VHOST_OPTIONS = {
    "none": ([], "any"),
    "default-authority": ([("grpc.default_authority", "svc.example")], "named"),
    "ssl-override": ([("grpc.ssl_target_name_override", "svc.example")], "named"),
}


@pytest.mark.parametrize("name", sorted(VHOST_OPTIONS))
def test_the_virtual_host_is_chosen_by_the_channels_default_authority(name):
    """A74 ("a virtual host matching the channel's default authority") and
    C-core's xds resolver (its data-plane authority is the channel's default
    authority: ``grpc.default_authority``, else
    ``grpc.ssl_target_name_override`` (C-core's channel creation makes it
    the default authority), else the target's name; grpc-go likewise takes
    the channel's authority): with either option naming ``svc.example`` the
    ``svc.example`` virtual host serves, without them the ``*`` one.  pyxds
    matched the target's name whatever the options said (TLS backends with
    a certificate for both names, so the override is used as it is meant)."""
    from pyxds.server import Snapshot
    from pyxds.server import builders as b

    options, expected = VHOST_OPTIONS[name]
    ca = CertAuthority("virtual host CA")
    leaf = ca.issue("backend", dns=("svc.example", LISTENER))
    server_creds = grpc.ssl_server_credentials([(leaf.key, leaf.cert)])
    named = PeerBackend("named", credentials=server_creds)
    anyone = PeerBackend("any", credentials=server_creds)
    vhosts = [
        b.virtual_host("named", domains=["svc.example"], routes=[route(prefix="", cluster="cn")]),
        b.virtual_host("any", routes=[route(prefix="", cluster="ca")]),
    ]
    control = ManagementServer().start()
    control.set_snapshot(
        Snapshot(
            listeners=[b.listener(LISTENER)],
            routes=[b.route_config(f"{LISTENER}-route", vhosts)],
            clusters=[b.cluster("cn"), b.cluster("ca")],
            endpoints=[
                b.endpoints(cluster, [b.locality(zone="z", endpoints=[backend.address])])
                for cluster, backend in (("cn", named), ("ca", anyone))
            ],
        )
    )
    boot = control.bootstrap(node_id="vhost-authority")
    core = CoreChannels(boot)
    creds = grpc.ssl_channel_credentials(root_certificates=ca.pem)
    try:
        core.open("vh", TARGET, options, ca=ca.pem)
        theirs = decoded(core.calls("vh", WHO_AM_I)[0])
        with pyxds.secure_channel(TARGET, creds, bootstrap=boot, options=options) as channel:
            ours = decoded(outcome(channel, WHO_AM_I))
    finally:
        core.close()
        control.stop()
        named.stop()
        anyone.stop()
    assert ours == theirs
    assert ours["name"] == expected


def test_max_send_message_length_holds_on_every_endpoint(backends, bootstrap, core):
    """``grpc.max_send_message_length`` reaches every endpoint's connection:
    a request over it fails RESOURCE_EXHAUSTED with C-core's text before
    reaching a backend, one under it is served (C-core
    test/core/end2end/tests/max_message_length.cc, client-side send limit)."""
    options = [("grpc.max_send_message_length", 1000)]
    core.open("send-limit", TARGET, options)
    over, under = b"1" * 2000, b"1" * 900
    bodies = [over] * 4 + [under] * 4
    # both endpoints READY first (round_robin picks READY ones only)
    until_both_answered(lambda: core.calls("send-limit", WHO_AM_I, n=2))
    theirs = [core.calls("send-limit", WHO_AM_I, body)[0] for body in bodies]
    with pyxds.insecure_channel(TARGET, bootstrap=bootstrap, options=options) as channel:
        until_both_answered(lambda: pyxds_who(channel, 2))
        ours = [outcome(channel, WHO_AM_I, body) for body in bodies]
    assert [r.get("code") for r in ours] == [r.get("code") for r in theirs]
    assert [r.get("details") for r in ours] == [r.get("details") for r in theirs]
    assert ours[0]["code"] == "RESOURCE_EXHAUSTED"
    assert {decoded(r)["name"] for r in ours[4:]} == {"p0", "p1"}
