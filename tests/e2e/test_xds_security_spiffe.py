"""A87 SPIFFE verification end to end, each case differential against
grpcio's C-core ``xds:///`` channel on the same bootstrap and cluster (same
served / refused outcome): the file_watcher provider's
``spiffe_bundle_map_file`` (GRPC_EXPERIMENTAL_XDS_MTLS_SPIFFE=true for both
clients), backends whose certificates carry SPIFFE IDs of one or another
trust domain, signed by one or another CA, directly or through an
intermediate."""

from __future__ import annotations

import grpc
import pytest
from channel_fixtures import Backend, pyxds_calls
from test_xds_security import (
    MESH,
    core_and_pyxds,
    details_of,
    secure_snapshot,
    tls,
    xds_creds,
)

import pyxds
from pyxds.security import experiments
from pyxds.testing.certs import (
    CertAuthority,
    Pem,
    spiffe_bundle_map,
    write_files,
    write_spiffe_bundle_map,
)

ID_A = "spiffe://a.example/ns/default/sa/backend"
ID_B = "spiffe://b.example/ns/default/sa/backend"


@pytest.fixture
def server(xds_server):
    return xds_server


@pytest.fixture(scope="module")
def cas():
    a, b = CertAuthority("domain a CA"), CertAuthority("domain b CA")
    return {"a": a, "b": b, "a-int": a.intermediate("domain a intermediate")}


@pytest.fixture
def spiffe_on(monkeypatch):
    monkeypatch.setenv(experiments.SPIFFE_ENV, "true")


def backend_with(leaf: Pem, client_ca: CertAuthority) -> Backend:
    creds = grpc.ssl_server_credentials(
        [(leaf.key, leaf.cert)], root_certificates=client_ca.pem, require_client_auth=True
    )
    return Backend("secure", credentials=creds).start()


def provider_config(folder: str, cas: dict, bundles: dict[str, list[str]], ca: str = "b") -> dict:
    """Client files: identity from CA a (the backends trust it), the CA
    file ``ca`` (ignored when the map is read), the map ``bundles``."""
    config = write_files(folder, cas[ca].pem, cas["a"].issue("client", uris=(ID_A + "-client",)))
    path = write_spiffe_bundle_map(
        f"{folder}/map.json",
        spiffe_bundle_map({d: [cas[n] for n in names] for d, names in bundles.items()}),
    )
    config["spiffe_bundle_map_file"] = path
    config["refresh_interval"] = "1s"
    return config


def outcome_of_both(server, config: dict, backend: Backend, node: str, matchers=()):
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls(*matchers))}))
    core, channel = core_and_pyxds(server, node, config)
    try:
        theirs = core.call(3, wait_for_ready=False, timeout=5.0)
        ours = pyxds_calls(channel, 3, wait_for_ready=False, timeout=5.0)
        detail = " ".join(details_of(channel))
        return theirs, ours, detail
    finally:
        channel.close()
        core.close()


SERVED = {"secure": 3}
REFUSED = {"error:UNAVAILABLE": 3}


@pytest.mark.parametrize(
    ("case", "leaf", "bundles", "outcome", "reason"),
    [
        ("domain-trusted", ("a", (ID_A,)), {"a.example": ["a"]}, SERVED, None),
        (
            "domain-missing",
            ("a", (ID_A,)),
            {"b.example": ["a"]},
            REFUSED,
            "No spiffe bundle found for trust domain a.example",
        ),
        (
            "root-of-another-domain",
            ("a", (ID_A,)),
            {"a.example": ["b"], "b.example": ["a"]},
            REFUSED,
            "certificate verification failed",
        ),
        (
            "second-domain-of-two",
            ("b", (ID_B,)),
            {"a.example": ["a"], "b.example": ["b"]},
            SERVED,
            None,
        ),
        ("through-intermediate", ("a-int", (ID_A,)), {"a.example": ["a"]}, SERVED, None),
        (
            "two-uri-sans",
            ("a", (ID_A, ID_A + "-2")),
            {"a.example": ["a"]},
            REFUSED,
            "more than one SAN URI",
        ),
        ("no-uri-san", ("a", ()), {"a.example": ["a"]}, REFUSED, "no SPIFFE ID found"),
        (
            "not-a-spiffe-uri",
            ("a", ("https://a.example/x",)),
            {"a.example": ["a"]},
            REFUSED,
            "must start with spiffe://",
        ),
        (
            "uppercase-trust-domain",
            ("a", ("spiffe://A.example/x",)),
            {"a.example": ["a"]},
            REFUSED,
            "invalid character 'A'",
        ),
        ("empty-map", ("a", (ID_A,)), {}, REFUSED, None),
    ],
)
def test_spiffe_outcome_agrees_with_c_core(
    server, cas, tmp_path, spiffe_on, case, leaf, bundles, outcome, reason
):
    issuer, uris = leaf
    backend = backend_with(cas[issuer].issue("backend", dns=("backend",), uris=uris), cas["a"])
    try:
        config = provider_config(str(tmp_path), cas, bundles)
        theirs, ours, detail = outcome_of_both(server, config, backend, f"spiffe-{case}")
        assert theirs == ours == outcome, (theirs, ours, detail)
        if reason is not None:
            assert reason in detail
        if outcome == REFUSED:
            assert backend.served["secure"] == 0
    finally:
        backend.stop()


def test_the_ca_file_is_ignored_when_the_map_is_read_like_c_core(server, cas, tmp_path, spiffe_on):
    """A87 forward compatibility: ca_certificate_file (here a CA that cannot
    verify the backend) is ignored when a bundle map is configured."""
    backend = backend_with(cas["a"].issue("backend", uris=(ID_A,)), cas["a"])
    try:
        config = provider_config(str(tmp_path), cas, {"a.example": ["a"]}, ca="b")
        theirs, ours, _ = outcome_of_both(server, config, backend, "spiffe-ca-ignored")
        assert theirs == ours == SERVED
    finally:
        backend.stop()


def test_without_the_switch_the_ca_file_is_used_like_c_core(server, cas, tmp_path, monkeypatch):
    monkeypatch.delenv(experiments.SPIFFE_ENV, raising=False)
    backend = backend_with(cas["a"].issue("backend", uris=(ID_A,)), cas["a"])
    try:
        # The map would refuse (no domain a); the CA file (CA b) refuses too...
        config = provider_config(str(tmp_path), cas, {"b.example": ["b"]}, ca="b")
        theirs, ours, _ = outcome_of_both(server, config, backend, "spiffe-off-1")
        assert theirs == ours == REFUSED
        # ...and a CA file that trusts the backend serves: the map was not read.
        config = provider_config(str(tmp_path / "2"), cas, {"b.example": ["b"]}, ca="a")
        theirs, ours, _ = outcome_of_both(server, config, backend, "spiffe-off-2")
        assert theirs == ours == SERVED
    finally:
        backend.stop()


def test_san_matchers_still_apply_to_spiffe_peers_like_c_core(server, cas, tmp_path, spiffe_on):
    backend = backend_with(cas["a"].issue("backend", uris=(ID_A,)), cas["a"])
    try:
        config = provider_config(str(tmp_path), cas, {"a.example": ["a"]})
        theirs, ours, detail = outcome_of_both(
            server, config, backend, "spiffe-san", matchers=({"exact": ID_B},)
        )
        assert theirs == ours == REFUSED
        assert "SANs from certificate did not match" in detail
        theirs, ours, _ = outcome_of_both(
            server, config, backend, "spiffe-san-ok", matchers=({"prefix": "spiffe://a.example/"},)
        )
        assert theirs == ours == SERVED
    finally:
        backend.stop()


def test_config_dump_shows_the_verified_spiffe_id(server, cas, tmp_path, spiffe_on):
    backend = backend_with(cas["a"].issue("backend", uris=(ID_A,)), cas["a"])
    config = provider_config(str(tmp_path), cas, {"a.example": ["a"], "b.example": ["b"]})
    server.set_snapshot(secure_snapshot({"c": (backend.address, tls())}))
    bootstrap = server.bootstrap(
        node_id="spiffe-dump",
        certificate_providers={MESH: {"plugin_name": "file_watcher", "config": config}},
    )
    channel = pyxds.secure_channel("xds:///echo-service", xds_creds(), bootstrap=bootstrap)
    try:
        assert pyxds_calls(channel, 2) == {"secure": 2}
        (sub,) = channel.config_dump()["subchannels"].values()
        assert sub["security"]["peer_spiffe_id"] == ID_A
    finally:
        channel.close()
        backend.stop()
