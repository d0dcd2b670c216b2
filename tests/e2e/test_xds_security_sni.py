"""A101 SNI end to end, each case differential against grpcio's C-core
``xds:///`` channel: a TLS backend (:class:`tls_backends.TlsFront`) that
picks its certificate by the SNI it receives and records it, in front of a
grpcio backend.  Both clients must send the same SNI and get the same
served / refused outcome."""

from __future__ import annotations

import pytest
from channel_fixtures import Backend, CoreXdsClient, pyxds_calls
from test_xds_security import MESH, details_of, xds_creds
from tls_backends import TlsFront

import pyxds
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot
from pyxds.testing.certs import CertAuthority, write_files


@pytest.fixture
def server(xds_server):
    return xds_server


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = CertAuthority("mesh CA")
    folder = str(tmp_path_factory.mktemp("sni"))
    return {
        "ca": ca,
        "client": write_files(folder, ca.pem, ca.issue("client", uris=("spiffe://t/client",))),
        "certs": {
            None: ca.issue("default", dns=("default.example",)),
            "a.example": ca.issue("a", dns=("a.example",)),
            "x.b.example": ca.issue("b", dns=("*.b.example",)),
        },
    }


@pytest.fixture(scope="module")
def front(pki):
    plain = Backend("plain").start()
    tls_front = TlsFront(plain.address, pki["certs"], client_ca=pki["ca"].pem)
    yield tls_front
    tls_front.close()
    plain.stop()


def snapshot(address: str, tls, hostname: str = "", kind: str = "EDS") -> Snapshot:
    route = b.route_config(
        "echo-service-route", [b.virtual_host("vh", routes=[b.route(prefix="", cluster="c")])]
    )
    if kind == "LOGICAL_DNS":
        host, _, port = address.rpartition(":")
        cluster = b.cluster(
            "c", kind="LOGICAL_DNS", dns_host=host, dns_port=int(port), upstream_tls=tls
        )
        return Snapshot(listeners=[b.listener("echo-service")], routes=[route], clusters=[cluster])
    return Snapshot(
        listeners=[b.listener("echo-service")],
        routes=[route],
        clusters=[b.cluster("c", upstream_tls=tls)],
        endpoints=[
            b.endpoints(
                "c", [b.locality(zone="z", endpoints=[b.endpoint(address, hostname=hostname)])]
            )
        ],
    )


def both(server, pki, front, node: str, tls, hostname: str = "", kind: str = "EDS", address=None):
    """(C-core outcome, SNI C-core sent, pyxds outcome, SNI pyxds sent, pyxds detail)."""
    server.set_snapshot(snapshot(address or front.address, tls, hostname, kind))
    bootstrap = server.bootstrap(
        node_id=node,
        certificate_providers={MESH: {"plugin_name": "file_watcher", "config": pki["client"]}},
    )
    front.sni_seen.clear()
    core = CoreXdsClient(bootstrap, xds_credentials=True)
    try:
        theirs = core.call(2, wait_for_ready=False, timeout=5.0)
    finally:
        core.close()
    their_sni = set(front.sni_seen)
    front.sni_seen.clear()
    channel = pyxds.secure_channel("xds:///echo-service", xds_creds(), bootstrap=bootstrap)
    try:
        ours = pyxds_calls(channel, 2, wait_for_ready=False, timeout=5.0)
        detail = " ".join(details_of(channel))
    finally:
        channel.close()
    return theirs, their_sni, ours, set(front.sni_seen), detail


SERVED = {"plain": 2}
REFUSED = {"error:UNAVAILABLE": 2}


@pytest.mark.parametrize(
    ("case", "fields", "matchers", "hostname", "sni", "outcome"),
    [
        ("no-sni-fields", {}, [], "", None, SERVED),
        ("sni", {"sni": "a.example"}, [{"exact": "a.example"}], "", "a.example", SERVED),
        (
            "sni-picks-cert-matcher-fails",
            {"sni": "a.example"},
            [{"exact": "default.example"}],
            "",
            "a.example",
            REFUSED,
        ),
        ("hostname-ignored-without-auto", {}, [], "x.b.example:443", None, SERVED),
        ("auto-host-sni", {"auto_host_sni": True}, [], "x.b.example:8080", "x.b.example", SERVED),
        (
            "auto-host-sni-no-hostname",
            {"auto_host_sni": True, "sni": "a.example"},
            [],
            "",
            "a.example",
            SERVED,
        ),
        (
            "auto-host-sni-wins",
            {"auto_host_sni": True, "sni": "a.example"},
            [],
            "x.b.example:1",
            "x.b.example",
            SERVED,
        ),
        (
            "san-validation",
            {"sni": "a.example", "auto_sni_san_validation": True},
            [],
            "",
            "a.example",
            SERVED,
        ),
        (
            "san-validation-replaces-matchers",
            {"sni": "a.example", "auto_sni_san_validation": True},
            [{"exact": "nothing.example"}],
            "",
            "a.example",
            SERVED,
        ),
        (
            "san-validation-wrong-cert",
            {"sni": "c.example", "auto_sni_san_validation": True},
            [],
            "",
            "c.example",
            REFUSED,
        ),
        (
            "san-validation-wildcard",
            {"auto_host_sni": True, "auto_sni_san_validation": True},
            [],
            "x.b.example:443",
            "x.b.example",
            SERVED,
        ),
        ("sni-ip-not-sent", {"sni": "127.0.0.1"}, [], "", None, SERVED),
    ],
)
def test_sni_and_outcome_agree_with_c_core(
    server, pki, front, case, fields, matchers, hostname, sni, outcome
):
    tls = b.upstream_tls_context(MESH, MESH, matchers, **fields)
    theirs, their_sni, ours, our_sni, detail = both(
        server, pki, front, f"sni-{case}", tls, hostname
    )
    assert theirs == ours == outcome, (theirs, ours, detail)
    assert their_sni == our_sni == {sni}
    if outcome == REFUSED:
        assert "SANs from certificate did not match" in detail


def test_san_validation_without_an_sni_uses_the_san_matchers_where_c_core_refuses(
    server, pki, front
):
    """A101: "If auto_sni_san_validation is true but no SNI was sent, then
    validation will use any SAN matchers specified in the validation context
    instead" (grpc-go TestClientSideXDS_FallbackSANMatchers).  C-core 1.85
    compares with an empty name and refuses; pyxds follows A101
    (differences-from-c-core.md)."""
    tls = b.upstream_tls_context(
        MESH, MESH, [{"exact": "default.example"}], auto_sni_san_validation=True
    )
    theirs, their_sni, ours, our_sni, detail = both(server, pki, front, "sni-no-sni", tls)
    assert theirs == REFUSED, (theirs, detail)
    assert ours == SERVED, (ours, detail)
    assert their_sni == our_sni == {None}
    wrong = b.upstream_tls_context(
        MESH, MESH, [{"exact": "nothing.example"}], auto_sni_san_validation=True
    )
    theirs, _, ours, _, detail = both(server, pki, front, "sni-no-sni-wrong", wrong)
    assert theirs == ours == REFUSED, (theirs, ours, detail)


def test_logical_dns_cluster_sends_its_host_name_like_c_core(server, pki, front):
    """A LOGICAL_DNS cluster's endpoint name is ``host:port``: auto_host_sni
    sends the host."""
    tls = b.upstream_tls_context(MESH, MESH, auto_host_sni=True)
    address = f"localhost:{front.port}"
    theirs, their_sni, ours, our_sni, detail = both(
        server, pki, front, "sni-dns", tls, kind="LOGICAL_DNS", address=address
    )
    assert theirs == ours == SERVED, (theirs, ours, detail)
    assert their_sni == our_sni == {"localhost"}


def test_config_dump_shows_the_sni(server, pki, front):
    server.set_snapshot(
        snapshot(front.address, b.upstream_tls_context(MESH, MESH, sni="a.example"))
    )
    bootstrap = server.bootstrap(
        node_id="sni-dump",
        certificate_providers={MESH: {"plugin_name": "file_watcher", "config": pki["client"]}},
    )
    channel = pyxds.secure_channel("xds:///echo-service", xds_creds(), bootstrap=bootstrap)
    try:
        assert pyxds_calls(channel, 1) == {"plain": 1}
        (sub,) = channel.config_dump()["subchannels"].values()
        assert sub["security"]["sni"] == "a.example"
        assert "dns:a.example" in sub["security"]["peer_sans"]
    finally:
        channel.close()
