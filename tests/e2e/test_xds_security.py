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
    at_once,
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


def tls_snapshot(*addresses: str, version: str | None = None, context=None) -> Snapshot:
    """One secured EDS cluster "c" over ``addresses`` (default: the mesh CA
    and identity, no SAN matchers)."""
    route = b.route_config(
        "echo-service-route", [b.virtual_host("vh", routes=[b.route(prefix="", cluster="c")])]
    )
    return Snapshot(
        listeners=[b.listener("echo-service")],
        routes=[route],
        clusters=[b.cluster("c", upstream_tls=context if context is not None else tls())],
        endpoints=[b.endpoints("c", [b.locality(zone="z", endpoints=list(addresses))])],
        version=version,
    )


def core_and_pyxds(server: ManagementServer, node: str, provider_config: dict, cleanup=None):
    """C-core's xds:/// channel (a subprocess) and a pyxds channel, both with
    xDS credentials, on the same bootstrap; added to ``cleanup`` if given."""
    config = bootstrap(server, node, provider_config)
    core = CoreXdsClient(config, xds_credentials=True)
    channel = pyxds.secure_channel(TARGET, xds_creds(), bootstrap=config)
    if cleanup is not None:
        cleanup += [core, channel]
    return core, channel


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
        assert "unrecognized certificate provider instance name: nowhere" in str(nack)
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


def _core_nack_errors(message: str) -> dict[str, set[tuple[str, str]]]:
    """C-core's NACK text: per resource, its (field, error) pairs."""
    out: dict[str, set[tuple[str, str]]] = {}
    body = message[message.index("[") + 1 : message.rindex("]")]
    for part in body.split("resource index ")[1:]:
        _, name, rest = part.rstrip("; ").split(": ", 2)
        inner = rest[rest.index("[") + 1 : rest.rindex("]")]
        pairs = set()
        for item in inner.split("; field:"):
            field, _, error = item.removeprefix("field:").partition(" error:")
            pairs.add((field, error))
        out[name] = pairs
    return out


def _pyxds_nack_errors(message: str) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = {}
    body = message[message.index("[") + 1 : message.rindex("]")]
    for part in body.split("resource index ")[1:]:
        _, name, rest = part.rstrip("; ").split(": ", 2)
        out[name] = {tuple(item.split(": ", 1)) for item in rest.split("; ")}
    return out


def _bad_contexts() -> dict[str, object]:
    from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

    def base():
        return b.upstream_tls_context(MESH, MESH)

    cases: dict[str, object] = {}
    c = base()
    c.common_tls_context.tls_params.SetInParent()
    cases["tls-params"] = c
    c = base()
    c.common_tls_context.custom_handshaker.SetInParent()
    cases["custom-handshaker"] = c
    c = b.upstream_tls_context(MESH)
    c.common_tls_context.tls_certificates.add()
    cases["tls-certificates"] = c
    c = b.upstream_tls_context(MESH)
    c.common_tls_context.tls_certificate_sds_secret_configs.add()
    cases["identity-sds"] = c
    c = tls_pb2.UpstreamTlsContext()
    c.common_tls_context.validation_context_sds_secret_config.SetInParent()
    cases["validation-sds"] = c
    c = tls_pb2.UpstreamTlsContext()
    combined = c.common_tls_context.combined_validation_context
    combined.validation_context_sds_secret_config.SetInParent()
    combined.default_validation_context.ca_certificate_provider_instance.instance_name = MESH
    cases["combined-sds-accepted"] = c
    cases["unknown-identity"] = b.upstream_tls_context(MESH, "nowhere")
    cases["unknown-ca"] = b.upstream_tls_context("nowhere")
    cases["no-ca"] = b.upstream_tls_context(None, MESH)
    cases["regex-ignore-case"] = b.upstream_tls_context(
        MESH, None, [{"safe_regex": "a.*", "ignore_case": True}]
    )
    cases["bad-regex"] = b.upstream_tls_context(MESH, None, [{"safe_regex": "a("}])
    c = base()
    c.common_tls_context.validation_context.match_subject_alt_names.add()
    cases["empty-matcher"] = c
    c = base()
    c.common_tls_context.validation_context.verify_certificate_spki.append("x")
    cases["spki"] = c
    c = base()
    c.common_tls_context.validation_context.verify_certificate_hash.append("x")
    cases["hash"] = c
    c = base()
    c.common_tls_context.validation_context.require_signed_certificate_timestamp.value = True
    cases["sct"] = c
    c = base()
    c.common_tls_context.validation_context.require_signed_certificate_timestamp.SetInParent()
    cases["sct-false-accepted"] = c
    c = base()
    c.common_tls_context.validation_context.crl.filename = "/crl"
    cases["crl"] = c
    c = base()
    c.common_tls_context.validation_context.custom_validator_config.SetInParent()
    cases["custom-validator"] = c
    c = tls_pb2.UpstreamTlsContext()
    c.common_tls_context.validation_context.system_root_certs.SetInParent()
    cases["system-roots-accepted"] = c
    cases["sni-too-long"] = b.upstream_tls_context(MESH, MESH, sni="s" * 256)  # A101
    cases["sni-255-accepted"] = b.upstream_tls_context(MESH, MESH, sni="s" * 255)
    c = b.upstream_tls_context(MESH, MESH, sni="s" * 300)
    c.common_tls_context.tls_params.SetInParent()
    cases["sni-too-long-and-more"] = c
    return cases


def test_upstream_tls_context_nacks_agree_with_c_core(server, pki):
    """Every UpstreamTlsContext case: the same resources NACKed, each with the
    same (field, error) pairs as grpcio 1.85's C-core."""
    cases = _bad_contexts()
    names = list(cases)
    weighted = {name: 1 for name in names}
    server.set_snapshot(
        Snapshot(
            listeners=[b.listener("echo-service")],
            routes=[
                b.route_config(
                    "echo-service-route",
                    [b.virtual_host("vh", routes=[b.route(prefix="", weighted_clusters=weighted)])],
                )
            ],
            clusters=[b.cluster(name, upstream_tls=cases[name]) for name in names],
        )
    )
    core = CoreXdsClient(bootstrap(server, "nack-core", pki["client_config"]), xds_credentials=True)
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "nack-pyxds", pki["client_config"])
    )
    try:
        at_once(  # an RPC each (each may wait out its 3 s deadline): both clients subscribe
            lambda: core.call(1, wait_for_ready=False, timeout=3.0),
            lambda: pyxds_calls(channel, 1, wait_for_ready=False, timeout=3.0),
        )
        theirs = server.wait_for_nack("CDS", node_id="nack-core", timeout=10.0)
        ours = server.wait_for_nack("CDS", node_id="nack-pyxds", timeout=10.0)
        core_errors = _core_nack_errors(theirs.error_message)
        our_errors = _pyxds_nack_errors(ours.error_message)
        assert set(core_errors) == {n for n in names if not n.endswith("-accepted")}
        assert our_errors == core_errors
    finally:
        channel.close()
        core.close()


def test_rotation_is_picked_up_like_c_core(server, pki, backends, tmp_path):
    """Both start with a CA that cannot verify the backend; after the files
    rotate, both serve without a new channel."""
    backend = mtls_backend("secure", pki)
    backends.append(backend)
    folder = str(tmp_path)
    config = write_files(folder, pki["other_ca"].pem, pki["ca"].issue("client"))
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls({"exact": SPIFFE_SERVER}))}))
    core = CoreXdsClient(bootstrap(server, "rot-core", config), xds_credentials=True)
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(server, "rot-pyxds", config), options=FAST_BACKOFF
    )
    try:
        assert core.call(2, wait_for_ready=False, timeout=3.0) == {"error:UNAVAILABLE": 2}
        assert pyxds_calls(channel, 2, wait_for_ready=False, timeout=3.0) == {
            "error:UNAVAILABLE": 2
        }
        write_files(folder, pki["ca"].pem, pki["ca"].issue("client"))
        theirs = core.until("secure", 20.0)
        assert "__elapsed__" in theirs, theirs
        assert wait_until(lambda: details_of(channel) == {"secure"}, 20.0)
    finally:
        channel.close()
        core.close()


@pytest.mark.parametrize(
    ("matcher", "core_serves", "pyxds_serves"),
    [
        # C-core applies DNS rules (any case) to URI SANs for exact; A29 does not.
        ({"exact": SPIFFE_SERVER.upper()}, True, False),
        # A29 matches email SANs; C-core looks at DNS, URI and IP SANs only.
        ({"exact": "backend@test.example"}, False, True),
        # Where A29 and C-core agree, so do the clients.
        ({"exact": SPIFFE_SERVER}, True, True),
    ],
)
def test_san_matching_differences_from_c_core_are_a29s(
    server, pki, backends, matcher, core_serves, pyxds_serves
):
    """The documented differences (docs/differences-from-c-core.md), shown
    side by side so that a change on either side is noticed."""
    leaf = pki["ca"].issue("backend", uris=(SPIFFE_SERVER,), emails=("backend@test.example",))
    creds = grpc.ssl_server_credentials(
        [(leaf.key, leaf.cert)], root_certificates=pki["ca"].pem, require_client_auth=True
    )
    backend = Backend("secure", credentials=creds).start()
    backends.append(backend)
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls(matcher))}))
    config = bootstrap(server, f"san-diff-{len(str(matcher))}", pki["client_config"])
    core = CoreXdsClient(config, xds_credentials=True)
    channel = pyxds.secure_channel(TARGET, xds_creds(), bootstrap=config)
    try:
        theirs = core.call(2, wait_for_ready=False, timeout=5.0)
        ours = pyxds_calls(channel, 2, wait_for_ready=False, timeout=5.0)
        assert theirs == ({"secure": 2} if core_serves else {"error:UNAVAILABLE": 2})
        assert ours == ({"secure": 2} if pyxds_serves else {"error:UNAVAILABLE": 2})
    finally:
        channel.close()
        core.close()
