"""xDS security (gRFC A29) end to end: a real pyxds.server, backends that
require client certificates (grpcio ``ssl_server_credentials``), pyxds
channels made with grpcio's own ``grpc.xds_channel_credentials``, and
grpcio's C-core on the same bootstrap (differential).  Certificates are made
in the test (:mod:`pyxds.testing.certs`)."""

from __future__ import annotations

import os

import grpc
import grpc.experimental
import pytest
from channel_fixtures import (
    SERVICE,
    TARGET,
    Backend,
    CoreXdsClient,
    pyxds_calls,
    wait_until,
)

import pyxds
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot
from pyxds.testing.certs import CertAuthority, write_files

FAST_BACKOFF = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 300)]
SPIFFE_SERVER = "spiffe://test.example/ns/default/sa/backend"
SPIFFE_CLIENT = "spiffe://test.example/ns/default/sa/client"
MESH = "mesh"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca, other_ca = CertAuthority("mesh CA"), CertAuthority("other CA")
    folder = str(tmp_path_factory.mktemp("pki"))
    client = ca.issue("client", uris=(SPIFFE_CLIENT,))
    return {
        "ca": ca,
        "other_ca": other_ca,
        "folder": folder,
        "client_config": write_files(folder, ca.pem, client, prefix="client-"),
        "server": ca.issue("backend", dns=("backend.test.example",), uris=(SPIFFE_SERVER,)),
        "expired": ca.issue("backend", dns=("backend.test.example",), expired=True),
        "foreign": other_ca.issue("backend", dns=("backend.test.example",)),
    }


def mtls_backend(name: str, pki: dict, leaf_key: str = "server") -> Backend:
    leaf = pki[leaf_key]
    creds = grpc.ssl_server_credentials(
        [(leaf.key, leaf.cert)], root_certificates=pki["ca"].pem, require_client_auth=True
    )
    return Backend(name, credentials=creds).start()


def bootstrap(server: ManagementServer, node: str, provider_config: dict) -> dict:
    config = dict(provider_config)
    config.setdefault("refresh_interval", "0.2s")
    return server.bootstrap(
        node_id=node,
        certificate_providers={MESH: {"plugin_name": "file_watcher", "config": config}},
    )


def secure_snapshot(clusters: dict, routes: list | None = None, version: str | None = None):
    """``clusters``: name -> (address, UpstreamTlsContext or None)."""
    routes = routes or [b.route(prefix="", cluster=next(iter(clusters)))]
    return Snapshot(
        listeners=[b.listener("echo-service")],
        routes=[b.route_config("echo-service-route", [b.virtual_host("vh", routes=routes)])],
        clusters=[b.cluster(name, upstream_tls=tls) for name, (_, tls) in clusters.items()],
        endpoints=[
            b.endpoints(name, [b.locality(zone="z", endpoints=[address])])
            for name, (address, _) in clusters.items()
        ],
        version=version,
    )


def tls(*matchers: dict, ca: str = MESH, identity: str | None = MESH):
    return b.upstream_tls_context(ca, identity, list(matchers))


def xds_creds():
    return grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())


def details_of(channel, n: int = 1) -> set[str]:
    return set(pyxds_calls(channel, n, wait_for_ready=False, details=True, timeout=3.0))


@pytest.fixture
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def backends():
    started: list[Backend] = []
    yield started
    for backend in started:
        backend.stop()


def test_mtls_with_grpcio_xds_credentials_serves_every_rpc(server, pki, backends):
    backend = mtls_backend("secure", pki)
    backends.append(backend)
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls({"exact": SPIFFE_SERVER}))}))
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "sec-1", pki["client_config"])
    )
    try:
        assert pyxds_calls(channel, 50) == {"secure": 50}
        assert backend.served["secure"] == 50
        # The SANs checked are those of the connection that carried the RPCs.
        (sub,) = channel.config_dump()["subchannels"].values()
        assert f"uri:{SPIFFE_SERVER}" in sub["security"]["peer_sans"]
        assert sub["security"]["san_matchers"] == [f"exact:{SPIFFE_SERVER}"]
    finally:
        channel.close()


def test_streams_of_large_messages_cross_the_tls_relay_intact(server, pki, backends):
    backend = mtls_backend("secure", pki)
    backends.append(backend)
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls({"exact": SPIFFE_SERVER}))}))
    channel = pyxds.secure_channel(
        TARGET,
        xds_creds(),
        bootstrap=bootstrap(server, "sec-big", pki["client_config"]),
        options=[("grpc.max_receive_message_length", 8 << 20)],
    )
    try:
        chat = channel.stream_stream(f"/{SERVICE}/Chat")
        payloads = [bytes([i]) * (1 << 20) for i in range(1, 6)]
        replies = list(chat(iter(payloads), timeout=20, wait_for_ready=True))
        assert replies == [b"secure:" + p for p in payloads]
    finally:
        channel.close()


def test_xds_credentials_on_a_target_without_xds_use_the_fallback(backends):
    plain = Backend("plain").start()
    backends.append(plain)
    channel = pyxds.secure_channel(f"ipv4:{plain.address}", xds_creds())
    try:
        assert pyxds_calls(channel, 3) == {"plain": 3}
    finally:
        channel.close()


def test_tls_without_identity_serves_a_backend_not_asking_for_client_certs(server, pki, backends):
    leaf = pki["server"]
    creds = grpc.ssl_server_credentials([(leaf.key, leaf.cert)])
    backend = Backend("tls-only", credentials=creds).start()
    backends.append(backend)
    server.set_snapshot(
        secure_snapshot({"c": (backend.address, tls({"exact": SPIFFE_SERVER}, identity=None))})
    )
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "sec-tls", pki["client_config"])
    )
    try:
        assert pyxds_calls(channel, 5) == {"tls-only": 5}
    finally:
        channel.close()


def test_pyxds_spelling_of_xds_credentials_is_the_same(server, pki, backends):
    backend = mtls_backend("secure", pki)
    backends.append(backend)
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls({"prefix": "spiffe://"}))}))
    creds = pyxds.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    channel = pyxds.secure_channel(
        TARGET, creds, bootstrap=bootstrap(server, "sec-2", pki["client_config"])
    )
    try:
        assert pyxds_calls(channel, 5) == {"secure": 5}
    finally:
        channel.close()


def test_cluster_without_tls_context_uses_the_fallback_credentials(server, pki, backends):
    plain = Backend("plain").start()
    backends.append(plain)
    server.set_snapshot(secure_snapshot({"c": (plain.address, None)}))
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "sec-3", pki["client_config"])
    )
    try:
        assert pyxds_calls(channel, 5) == {"plain": 5}
    finally:
        channel.close()


def test_tls_context_is_ignored_without_xds_credentials(server, pki, backends):
    plain = Backend("plain").start()
    backends.append(plain)
    server.set_snapshot(secure_snapshot({"c": (plain.address, tls())}))
    channel = pyxds.insecure_channel(
        TARGET, bootstrap=bootstrap(server, "sec-4", pki["client_config"])
    )
    try:
        assert pyxds_calls(channel, 3) == {"plain": 3}
    finally:
        channel.close()


@pytest.mark.parametrize(
    "matcher",
    [
        {"exact": SPIFFE_SERVER},
        {"exact": "BACKEND.test.example"},  # DNS SANs compare case-insensitively
        {"prefix": "SPIFFE://TEST.", "ignore_case": True},
        {"suffix": "sa/backend"},
        {"contains": "/ns/default/"},
        {"safe_regex": r"spiffe://test\.example/ns/[a-z]+/sa/backend"},
        {"exact": "127.0.0.1"},
    ],
)
def test_each_san_matcher_kind_authorizes_a_matching_server(server, pki, backends, matcher):
    backend = mtls_backend("secure", pki)
    backends.append(backend)
    if matcher == {"exact": "127.0.0.1"}:
        backends.pop().stop()
        leaf = pki["ca"].issue("backend", ips=("127.0.0.1",))
        creds = grpc.ssl_server_credentials(
            [(leaf.key, leaf.cert)], root_certificates=pki["ca"].pem, require_client_auth=True
        )
        backend = Backend("secure", credentials=creds).start()
        backends.append(backend)
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls(matcher))}))
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "sec-m", pki["client_config"])
    )
    try:
        assert pyxds_calls(channel, 2) == {"secure": 2}
    finally:
        channel.close()


def test_san_mismatch_refuses_the_backend_then_a_matching_update_serves(server, pki, backends):
    backend = mtls_backend("secure", pki)
    backends.append(backend)
    server.set_snapshot(
        secure_snapshot({"c": (backend.address, tls({"exact": "spiffe://elsewhere"}))})
    )
    channel = pyxds.secure_channel(
        TARGET,
        xds_creds(),
        bootstrap=bootstrap(server, "sec-5", pki["client_config"]),
        options=FAST_BACKOFF,
    )
    try:
        assert wait_until(
            lambda: any("SANs from certificate did not match" in d for d in details_of(channel)),
            10.0,
        ), details_of(channel)
        assert backend.served["secure"] == 0
        server.set_snapshot(
            secure_snapshot(
                {"c": (backend.address, tls({"exact": SPIFFE_SERVER}))}, version="fixed"
            )
        )
        assert wait_until(lambda: details_of(channel) == {"secure"}, 10.0)
    finally:
        channel.close()


@pytest.mark.parametrize(
    ("leaf", "reason"),
    [("foreign", "unable to get local issuer certificate"), ("expired", "certificate has expired")],
)
def test_server_certificate_not_trusted_fails_with_the_reason(server, pki, backends, leaf, reason):
    leaf_pem = pki[leaf]
    creds = grpc.ssl_server_credentials(
        [(leaf_pem.key, leaf_pem.cert)], root_certificates=pki["ca"].pem, require_client_auth=True
    )
    backend = Backend("bad", credentials=creds).start()
    backends.append(backend)
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls())}))
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "sec-6", pki["client_config"])
    )
    try:
        assert wait_until(
            lambda: any("certificate verification failed" in d for d in details_of(channel)),
            10.0,
        ), details_of(channel)
        text = " ".join(details_of(channel))
        assert text.startswith("error:UNAVAILABLE")
        assert f"certificate verification failed: {reason}" in text, text
        assert backend.served["bad"] == 0
    finally:
        channel.close()


def test_rotated_provider_files_are_used_by_new_connections(server, pki, backends, tmp_path):
    backend = mtls_backend("secure", pki)
    backends.append(backend)
    folder = str(tmp_path)
    # Start with the wrong CA: the server's chain cannot verify.
    config = write_files(folder, pki["other_ca"].pem, pki["ca"].issue("client"))
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls())}))
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "sec-7", config), options=FAST_BACKOFF
    )
    try:
        assert wait_until(
            lambda: any("certificate verification failed" in d for d in details_of(channel)), 10.0
        )
        write_files(folder, pki["ca"].pem, pki["ca"].issue("client"))  # rotation
        assert wait_until(lambda: details_of(channel) == {"secure"}, 10.0)
    finally:
        channel.close()


def test_rotated_identity_certificate_is_presented_by_new_connections(
    server, pki, backends, tmp_path
):
    backend = mtls_backend("secure", pki)
    backends.append(backend)
    folder = str(tmp_path)
    # A client certificate the backend does not trust: the backend refuses it.
    config = write_files(folder, pki["ca"].pem, pki["other_ca"].issue("client"))
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls())}))
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "sec-id", config), options=FAST_BACKOFF
    )
    try:
        assert wait_until(
            lambda: any("client certificate was refused" in d for d in details_of(channel)), 10.0
        ), details_of(channel)
        assert backend.served["secure"] == 0
        write_files(folder, pki["ca"].pem, pki["ca"].issue("client"))  # rotation
        assert wait_until(lambda: details_of(channel) == {"secure"}, 10.0)
    finally:
        channel.close()


def test_unreadable_certificate_file_fails_the_cluster_naming_the_file(
    server, pki, backends, tmp_path
):
    backend = mtls_backend("secure", pki)
    backends.append(backend)
    config = write_files(str(tmp_path), pki["ca"].pem, pki["ca"].issue("client"))
    os.remove(config["certificate_file"])
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls())}))
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "sec-8", config)
    )
    try:
        assert wait_until(
            lambda: any(config["certificate_file"] in d for d in details_of(channel)), 10.0
        ), details_of(channel)
        assert any("No such file" in d for d in details_of(channel))
    finally:
        channel.close()


def test_tls_context_naming_a_missing_instance_is_nacked_and_the_rest_serves(server, pki, backends):
    plain = Backend("plain").start()
    backends.append(plain)
    routes = [
        b.route(path=f"/{SERVICE}/Sleep", cluster="broken"),
        b.route(prefix="", cluster="ok"),
    ]
    server.set_snapshot(
        secure_snapshot(
            {"ok": (plain.address, None), "broken": (plain.address, tls(ca="nowhere"))},
            routes=routes,
        )
    )
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "sec-9", pki["client_config"])
    )
    try:
        assert pyxds_calls(channel, 3) == {"plain": 3}
        nack = server.wait_for_nack("CDS", timeout=10.0)
        assert "ca_certificate_provider_instance" in str(nack)
        assert 'unrecognized certificate provider instance name: "nowhere"' in str(nack)
    finally:
        channel.close()


def test_aio_secure_channel_takes_grpcio_xds_credentials(server, pki, backends):
    import asyncio

    backend = mtls_backend("secure", pki)
    backends.append(backend)
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls({"exact": SPIFFE_SERVER}))}))
    config = bootstrap(server, "sec-aio", pki["client_config"])

    async def run() -> list[bytes]:
        async with pyxds.aio.secure_channel(TARGET, xds_creds(), bootstrap=config) as channel:
            call = channel.unary_unary(f"/{SERVICE}/Who")
            return [await call(b"", timeout=10, wait_for_ready=True) for _ in range(5)]

    assert asyncio.run(run()) == [b"secure"] * 5


# --------------------------------------------------------------------------- C-core


@pytest.mark.parametrize(
    ("case", "matcher", "leaf"),
    [
        ("success", {"exact": SPIFFE_SERVER}, "server"),
        ("san_mismatch", {"exact": "spiffe://elsewhere"}, "server"),
        ("wrong_ca", {"exact": SPIFFE_SERVER}, "foreign"),
        ("expired", {}, "expired"),
    ],
)
def test_security_outcome_agrees_with_c_core(server, pki, backends, case, matcher, leaf):
    leaf_pem = pki[leaf]
    creds = grpc.ssl_server_credentials(
        [(leaf_pem.key, leaf_pem.cert)], root_certificates=pki["ca"].pem, require_client_auth=True
    )
    backend = Backend("secure", credentials=creds).start()
    backends.append(backend)
    matchers = [matcher] if matcher else []
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls(*matchers))}))
    config = bootstrap(server, f"sec-core-{case}", pki["client_config"])
    core = CoreXdsClient(config, xds_credentials=True)
    channel = pyxds.secure_channel(TARGET, xds_creds(), bootstrap=config)
    try:
        if case == "success":
            assert core.call(50) == {"secure": 50}
            assert pyxds_calls(channel, 50) == {"secure": 50}
        else:
            theirs = core.call(3, wait_for_ready=False, timeout=5.0)
            ours = pyxds_calls(channel, 3, wait_for_ready=False, timeout=5.0)
            assert theirs == ours == {"error:UNAVAILABLE": 3}, (theirs, ours)
            assert backend.served["secure"] == 0
    finally:
        channel.close()
        core.close()
