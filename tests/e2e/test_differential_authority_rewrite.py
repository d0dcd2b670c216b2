"""Differential: gRFC A81 xDS authority rewriting, pyxds against grpcio 1.85's
C-core ``xds:///`` channel on one pyxds.server, backends that reply the
``:authority`` each RPC reached them with.

What C-core 1.85 does (live, here): a route's ``auto_host_rewrite`` sets an
RPC's ``:authority`` to the picked endpoint's EDS ``hostname`` when the
bootstrap server has the ``trusted_xds_server`` feature, whatever
``GRPC_EXPERIMENTAL_XDS_AUTHORITY_REWRITE`` says (A81's temporary env var
is gone from 1.85: ``false`` changes nothing); without the feature, or for
an endpoint without hostname, the channel's authority stays; each retry
attempt takes its own pick's hostname; ``host_rewrite_literal`` is not
read.  With TLS the handshake still checks the channel's name, and the
rewritten authority is checked per call against the server's certificate
(UNAUTHENTICATED "call host does not match SSL server name").  The asyncio
channel differs there (docs/differences-from-c-core.md): its rewritten
attempts go on a connection whose handshake checks the hostname, so a
certificate without it fails them unsent, not UNAUTHENTICATED.
A route through the RLS cluster specifier plugin rewrites as any other
(the plugin's target cluster's endpoint names the authority).  With xDS
credentials (A29) C-core checks no call host (``XdsCredentials`` sets
``check_call_host`` false): the hostname goes out even where the
certificate does not name it, on every pyxds channel too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import grpc.experimental
import pytest
from core_channel import PEER_SERVICE, WHO_AM_I, CoreChannels, PeerBackend, decoded, outcome

import pyxds._api as pyxds
import pyxds.aio
from pyxds.server import ManagementServer, RouteLookupServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot
from pyxds.testing.certs import CertAuthority, write_files

TRUSTED = ["xds_v3", "trusted_xds_server"]
#: listener -> what (backend, authority) its RPCs reach with a trusted server
#: (the weighted split may show either or both)
EXPECTED = {
    "auto": {("p0", "a0.example")},
    "no-hostname": {("p1", "no-hostname")},
    "off": {("p0", "off")},
    "literal": {("p0", "literal")},
    "weighted": {("p0", "a0.example"), ("p1", "b0.example")},
    # the RLS cluster specifier plugin (its server answers cluster "a")
    "rls": {("p0", "a0.example")},
}
TLS_OK, TLS_BAD_HOST, TLS_HANDSHAKE = "tls-ok", "tls-bad-host", "tls-handshake"
#: the listener whose cluster is secured by xDS credentials (A29), and the
#: bootstrap's certificate provider instance
XDS_TLS, MESH = "xds-tls", "mesh"


def routes_to(cluster: str, **kwargs: Any) -> list[Any]:
    return [b.route(prefix="", cluster=cluster, **kwargs)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    ca = CertAuthority("A81 CA")
    leaf = ca.issue("backend", dns=(TLS_OK, TLS_BAD_HOST, "good.example"))
    tls_server = grpc.ssl_server_credentials([(leaf.key, leaf.cert)])
    p0, p1 = PeerBackend("p0"), PeerBackend("p1")
    t0 = PeerBackend("t0", credentials=tls_server)
    # mTLS by xDS credentials: the backend's certificate names neither the
    # channel's authority nor the endpoint's hostname
    mesh = CertAuthority("A81 mesh CA")
    mesh_leaf = mesh.issue("backend", dns=("backend.mesh.example",))
    x0 = PeerBackend(
        "x0",
        credentials=grpc.ssl_server_credentials(
            [(mesh_leaf.key, mesh_leaf.cert)], root_certificates=mesh.pem, require_client_auth=True
        ),
    )
    files = write_files(
        str(tmp_path_factory.mktemp("a81-pki")), mesh.pem, mesh.issue("client"), prefix="client-"
    )
    providers = {MESH: {"plugin_name": "file_watcher", "config": files}}
    rls = RouteLookupServer().start()
    rls.set({}, ["a"])
    rls_plugin = b.rls_plugin(
        "rls", b.route_lookup_config(rls.target, [b.rls_key_builder(PEER_SERVICE)])
    )
    failing = PeerBackend("f0", failing=True)
    literal = b.route(prefix="", cluster="a")
    literal.route.host_rewrite_literal = "literal.example"
    retry = b.retry_policy("unavailable", num_retries=3, base_interval=0.01, max_interval=0.02)
    routes = {
        "auto": routes_to("a", auto_host_rewrite=True),
        "no-hostname": routes_to("c", auto_host_rewrite=True),
        "off": routes_to("a"),
        "literal": [literal],
        "weighted": [
            b.route(prefix="", weighted_clusters={"a": 1, "b": 1}, auto_host_rewrite=True)
        ],
        "retry": routes_to("r", auto_host_rewrite=True, retry_policy=retry),
        "logical-dns": routes_to("d", auto_host_rewrite=True),
        TLS_OK: routes_to("tls-good", auto_host_rewrite=True),
        TLS_BAD_HOST: routes_to("tls-bad", auto_host_rewrite=True),
        TLS_HANDSHAKE: routes_to("tls-good", auto_host_rewrite=True),
        XDS_TLS: routes_to(XDS_TLS, auto_host_rewrite=True),
        "rls": [b.route(prefix="", cluster_specifier_plugin="rls", auto_host_rewrite=True)],
    }

    def eds(cluster: str, *endpoints: Any) -> Any:
        return b.endpoints(cluster, [b.locality(zone="z", endpoints=list(endpoints))])

    server = ManagementServer().start()
    server.set_snapshot(
        Snapshot(
            listeners=[b.listener(n) for n in routes],
            routes=[
                b.route_config(
                    f"{n}-route",
                    [b.virtual_host("vh", routes=r)],
                    [rls_plugin] if n == "rls" else [],
                )
                for n, r in routes.items()
            ],
            clusters=[
                *(b.cluster(c) for c in ("a", "b", "c", "r", "tls-good", "tls-bad")),
                b.cluster(XDS_TLS, upstream_tls=b.upstream_tls_context(MESH, MESH)),
                b.cluster("d", kind="LOGICAL_DNS", dns_host="localhost", dns_port=p0.port),
            ],
            endpoints=[
                eds("a", b.endpoint(p0.address, hostname="a0.example")),
                eds("b", b.endpoint(p1.address, hostname="b0.example")),
                eds("c", b.endpoint(p1.address)),
                eds(
                    "r",
                    b.endpoint(failing.address, hostname="f0.example"),
                    b.endpoint(p0.address, hostname="a0.example"),
                ),
                eds("tls-good", b.endpoint(t0.address, hostname="good.example")),
                eds("tls-bad", b.endpoint(t0.address, hostname="bad.example")),
                eds(XDS_TLS, b.endpoint(x0.address, hostname="x0.example")),
            ],
        )
    )
    trusted = server.bootstrap(node_id="a81", features=TRUSTED, certificate_providers=providers)
    untrusted = server.bootstrap(node_id="a81", certificate_providers=providers)
    cores = {
        "trusted": CoreChannels(trusted),
        "untrusted": CoreChannels(untrusted),
    }
    try:
        # A81: a LOGICAL_DNS cluster's endpoints are named by its DNS name
        dns = {"logical-dns": {("p0", f"localhost:{p0.port}")}}
        yield {
            "expected": {**EXPECTED, **dns},
            "bootstrap": {"trusted": trusted, "untrusted": untrusted},
            "cores": cores,
            "failing": failing,
            "ca": ca.pem,
        }
    finally:
        for core in cores.values():
            core.close()
        server.stop()
        rls.stop()
        for backend in (p0, p1, t0, x0, failing):
            backend.stop()


def seen(result: dict) -> tuple[str, str] | dict:
    """(backend, authority) of a successful call; the error otherwise."""
    reply = decoded(result)
    if isinstance(reply, dict) and "name" in reply:
        return (reply["name"], reply["authority"])
    return {k: v for k, v in result.items() if k != "elapsed"}


def core_seen(core: CoreChannels, listener: str, n: int = 4, timeout: float = 5.0) -> set:
    core.open(listener, f"xds:///{listener}", [])
    return {seen(core.calls(listener, WHO_AM_I, timeout=timeout)[0]) for _ in range(n)}


def ours_seen(bootstrap: dict, listener: str, n: int = 4) -> set:
    with pyxds.insecure_channel(f"xds:///{listener}", bootstrap=bootstrap) as channel:
        return {seen(outcome(channel, WHO_AM_I, timeout=5)) for _ in range(n)}


def expected(world: dict, trust: str, listener: str) -> set:
    pairs = world["expected"][listener]
    if trust == "trusted":
        return pairs
    return {(name, listener) for name, _ in pairs}


@pytest.mark.parametrize("trust", ["trusted", "untrusted"])
def test_the_authority_backends_see_agrees_with_c_core(world, trust):
    """Per listener, the (backend, :authority) pairs of 4 RPCs (a LOGICAL_DNS
    cluster's endpoint is named ``host:port``, its DNS name): C-core's and
    the sync channel's are among the expected ones (all of them but for the
    weighted split, whose draws may land on one side only)."""
    core = world["cores"][trust]
    bootstrap = world["bootstrap"][trust]
    for listener in world["expected"]:
        want = expected(world, trust, listener)
        theirs, ours = core_seen(core, listener), ours_seen(bootstrap, listener)
        if listener == "weighted":
            assert theirs <= want and ours <= want, (theirs, ours)
        else:
            assert theirs == ours == want, (listener, theirs, ours)


def test_the_asyncio_channel_rewrites_as_the_sync_one(world):
    bootstrap = world["bootstrap"]["trusted"]

    async def run() -> dict[str, set]:
        out: dict[str, set] = {}
        for listener in world["expected"]:
            async with pyxds.aio.insecure_channel(
                f"xds:///{listener}", bootstrap=bootstrap
            ) as channel:
                call = channel.unary_unary(WHO_AM_I)
                replies = [
                    json.loads(await call(b"", timeout=5, wait_for_ready=True)) for _ in range(4)
                ]
                out[listener] = {(r["name"], r["authority"]) for r in replies}
        return out

    got = asyncio.run(run())
    for listener, pairs in got.items():
        if listener == "weighted":
            assert pairs <= world["expected"][listener], pairs
        else:
            assert pairs == world["expected"][listener], (listener, pairs)


def test_the_env_var_of_a81_no_longer_gates_it_in_c_core(world):
    """GRPC_EXPERIMENTAL_XDS_AUTHORITY_REWRITE=false: grpcio 1.85's C-core
    rewrites all the same (the gate is gone; pyxds has none)."""
    env = {"GRPC_EXPERIMENTAL_XDS_AUTHORITY_REWRITE": "false"}
    gated = CoreChannels(world["bootstrap"]["trusted"], env=env)
    try:
        assert core_seen(gated, "auto", n=1) == EXPECTED["auto"]
    finally:
        gated.close()


def test_each_retry_attempt_carries_its_own_picks_hostname(world):
    """Round robin over a failing endpoint (f0.example) and p0 (a0.example),
    retried on UNAVAILABLE: every RPC ends on p0 with a0.example, and the
    failing endpoint saw only its own hostname (A81: the authority is the
    pick's, per attempt).  Up to 12 RPCs until an attempt failed there."""
    failing = world["failing"]
    core = world["cores"]["trusted"]
    core.open("retry", "xds:///retry", [])
    with pyxds.insecure_channel("xds:///retry", bootstrap=world["bootstrap"]["trusted"]) as channel:
        for call in (
            lambda: seen(core.calls("retry", WHO_AM_I, timeout=5)[0]),
            lambda: seen(outcome(channel, WHO_AM_I, timeout=5)),
        ):
            failing.authorities.clear()
            for _ in range(12):
                assert call() == ("p0", "a0.example")
                if failing.authorities:
                    break
            assert failing.authorities and set(failing.authorities) == {"f0.example"}


def test_tls_checks_the_rewritten_authority_per_call_as_c_core(world):
    """The certificate names tls-ok, tls-bad-host and good.example: a
    rewrite to good.example serves; to bad.example C-core and the sync
    channel refuse the call UNAUTHENTICATED (the per-call host check of a
    TLS channel, A81); the handshake still checks the channel's name
    (tls-handshake, not in the certificate: no connection, though its
    endpoint's hostname is).  The asyncio channel refuses bad.example too,
    before sending (a documented difference: its rewritten attempts'
    connection checks the hostname in the handshake)."""
    core = world["cores"]["trusted"]
    bootstrap = world["bootstrap"]["trusted"]
    creds = grpc.ssl_channel_credentials(root_certificates=world["ca"])
    results = {}
    # a first RPC resolves and connects (TLS) in its deadline: 1 s only where
    # the deadline is the expected end (no connection ever comes), 10 s for
    # the others (beside two busy loops 1 s was not always enough)
    timeouts = {TLS_OK: 10.0, TLS_BAD_HOST: 10.0, TLS_HANDSHAKE: 1.0}
    for listener, timeout in timeouts.items():
        core.open(listener, f"xds:///{listener}", [], ca=world["ca"])
        theirs = seen(core.calls(listener, WHO_AM_I, timeout=timeout)[0])
        with pyxds.secure_channel(f"xds:///{listener}", creds, bootstrap=bootstrap) as channel:
            ours = seen(outcome(channel, WHO_AM_I, timeout=timeout))
        assert ours == theirs, (listener, ours, theirs)
        results[listener] = ours
    assert results[TLS_OK] == ("t0", "good.example")
    assert results[TLS_BAD_HOST] == {
        "code": "UNAUTHENTICATED",
        "details": "call host does not match SSL server name",
    }
    assert results[TLS_HANDSHAKE] == {"code": "DEADLINE_EXCEEDED", "details": "Deadline Exceeded"}

    async def aio(listener: str, timeout: float) -> Any:
        async with pyxds.aio.secure_channel(
            f"xds:///{listener}", creds, bootstrap=bootstrap
        ) as channel:
            try:
                call = channel.unary_unary(WHO_AM_I)
                reply = await call(b"", timeout=timeout, wait_for_ready=True)
            except grpc.RpcError as err:
                return err.code()
            data = json.loads(reply)
            return (data["name"], data["authority"])

    assert asyncio.run(aio(TLS_OK, 10.0)) == ("t0", "good.example")
    assert asyncio.run(aio(TLS_BAD_HOST, 1.0)) == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize("trust", ["trusted", "untrusted"])
def test_xds_credentials_send_the_rewritten_authority_unchecked_like_c_core(world, trust):
    """A29 + A81: with xDS credentials the cluster's TLS context decides the
    handshake (the mesh CA; no SAN matchers), and C-core turns the per-call
    host check off (``XdsCredentials``: ``check_call_host`` false), so an
    endpoint hostname the certificate does not name (x0.example) is sent as
    the ``:authority``, as the channel's own name would be.  The sync and
    asyncio channels agree."""
    bootstrap = world["bootstrap"][trust]
    want = {("x0", "x0.example" if trust == "trusted" else XDS_TLS)}
    core = world["cores"][trust]
    core.open(XDS_TLS, f"xds:///{XDS_TLS}", [], xds=True)
    theirs = {seen(core.calls(XDS_TLS, WHO_AM_I, timeout=5)[0]) for _ in range(2)}
    creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    with pyxds.secure_channel(f"xds:///{XDS_TLS}", creds, bootstrap=bootstrap) as channel:
        ours = {seen(outcome(channel, WHO_AM_I, timeout=5)) for _ in range(2)}

    async def aio() -> set:
        async with pyxds.aio.secure_channel(
            f"xds:///{XDS_TLS}", creds, bootstrap=bootstrap
        ) as channel:
            call = channel.unary_unary(WHO_AM_I)
            replies = [
                json.loads(await call(b"", timeout=5, wait_for_ready=True)) for _ in range(2)
            ]
            return {(r["name"], r["authority"]) for r in replies}

    assert theirs == ours == want, (theirs, ours)
    assert asyncio.run(aio()) == want
