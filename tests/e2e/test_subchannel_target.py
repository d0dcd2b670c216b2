"""What a subchannel's grpcio channel is given as its target is invisible to
the peer and the user (issue 18): an IP-literal address goes to grpcio as an
``ipv4:``/``ipv6:`` target (channel/subchannel.py ``grpcio_target``, less
C-core work per failed attempt than its dns resolver), and RPCs still carry
the ``:authority`` a plain grpcio channel to that address sends, TLS still
checks the server's certificate against that address, and a failed
connection is still named by the plain address.  Each case is compared with
a plain ``grpc`` channel to the same address (C-core's own choice)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from ports import EXCLUSIVE, held_ports

import pyxds
import pyxds.aio
from pyxds.testing.certs import CertAuthority

METHOD = "/Authority/Echo"


class AuthorityServer:
    """A grpcio server on ``host`` answering :data:`METHOD` with the
    ``:authority`` each RPC arrived with (grpcio's call details)."""

    def __init__(self, host: str, credentials: grpc.ServerCredentials | None = None) -> None:
        def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
            host = context._rpc_event.call_details.host  # type: ignore[attr-defined]
            return bytes(host or b"")

        handler = grpc.method_handlers_generic_handler(
            "Authority", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[EXCLUSIVE])
        self.server.add_generic_rpc_handlers([handler])
        if credentials is None:
            port = self.server.add_insecure_port(f"{host}:0")
        else:
            port = self.server.add_secure_port(f"{host}:0", credentials)
        self.server.start()
        self.address = f"{host}:{port}"

    def stop(self) -> None:
        self.server.stop(None)


@pytest.fixture(params=["127.0.0.1", "[::1]"])
def server(request: pytest.FixtureRequest) -> Iterator[AuthorityServer]:
    try:
        srv = AuthorityServer(request.param)
    except RuntimeError:
        pytest.skip(f"cannot listen on {request.param}")
    try:
        yield srv
    finally:
        srv.stop()


def authority_of(channel: grpc.Channel) -> bytes:
    return channel.unary_unary(METHOD)(b"", timeout=10, wait_for_ready=True)


def grpcio_authority(target: str, options: list[tuple[str, str]] | None = None) -> bytes:
    with grpc.insecure_channel(target, options) as plain:
        return authority_of(plain)


def test_rpcs_carry_the_authority_a_grpcio_channel_to_the_address_sends(server):
    with pyxds.insecure_channel(server.address) as channel:
        seen = authority_of(channel)
    assert seen == grpcio_authority(server.address) == server.address.encode()


def test_aio_rpcs_carry_the_authority_a_grpcio_channel_to_the_address_sends(server):
    async def main() -> bytes:
        async with pyxds.aio.insecure_channel(server.address) as channel:
            call = channel.unary_unary(METHOD)
            return bytes(await call(b"", timeout=10, wait_for_ready=True))

    assert asyncio.run(main()) == server.address.encode()


def test_the_applications_default_authority_still_wins(server):
    options = [("grpc.default_authority", "svc.example")]
    with pyxds.insecure_channel(server.address, options=options) as channel:
        seen = authority_of(channel)
    assert seen == grpcio_authority(server.address, options) == b"svc.example"


def tls_server(host: str, **sans: tuple[str, ...]) -> tuple[AuthorityServer, CertAuthority]:
    ca = CertAuthority("authority test CA")
    leaf = ca.issue("backend", **sans)
    creds = grpc.ssl_server_credentials([(leaf.key, leaf.cert)])
    return AuthorityServer(host, creds), ca


def tls_outcome(channel: grpc.Channel) -> tuple[str, bytes | grpc.StatusCode]:
    try:
        return "ok", channel.unary_unary(METHOD)(b"", timeout=5)
    except grpc.RpcError as err:
        return "failed", err.code()


@pytest.mark.parametrize(
    ("host", "sans", "override", "expect_ok"),
    [
        ("127.0.0.1", {"ips": ("127.0.0.1",)}, None, True),
        ("127.0.0.1", {"dns": ("backend.example",)}, None, False),  # names another host
        ("127.0.0.1", {"dns": ("backend.example",)}, "backend.example", True),
        ("[::1]", {"ips": ("::1",)}, None, True),
        ("[::1]", {"ips": ("127.0.0.1",)}, None, False),
    ],
)
def test_tls_checks_the_certificate_against_the_address_as_grpcio_does(
    host, sans, override, expect_ok
):
    try:
        srv, ca = tls_server(host, **sans)
    except RuntimeError:
        pytest.skip(f"cannot listen on {host}")
    creds = grpc.ssl_channel_credentials(root_certificates=ca.pem)
    options = [("grpc.ssl_target_name_override", override)] if override else []
    try:
        with pyxds.secure_channel(srv.address, creds, options=options) as channel:
            ours = tls_outcome(channel)
        with grpc.secure_channel(srv.address, creds, options) as plain:
            theirs = tls_outcome(plain)
    finally:
        srv.stop()
    assert ours == theirs
    if expect_ok:
        # the override is the authority too (C-core's rule)
        assert ours == ("ok", (override or srv.address).encode())
    else:
        assert ours == ("failed", grpc.StatusCode.UNAVAILABLE)


def test_a_refused_connection_is_named_by_its_plain_address():
    with held_ports() as holds:
        dead = holds.dead_address()
        with pyxds.insecure_channel(dead) as channel, pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary(METHOD)(b"", timeout=5)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert f"failed to connect to {dead}" in caught.value.details()
    assert "ipv4:" not in caught.value.details()


def test_tls_to_a_static_address_list_checks_each_backend_against_its_address():
    """pyxds's ``static:///A,B`` (no C-core scheme): each subchannel keeps
    its address as authority, so a certificate for 127.0.0.1 serves both
    backends (grpcio's ``ipv4:A,B`` sends ``A,B`` as the authority and fails
    the check; the channel's authority is given to subchannels only for
    targets C-core names the same way, test_differential_channel_options.py)."""
    ca = CertAuthority("static list CA")
    leaf = ca.issue("backend", ips=("127.0.0.1",))
    servers = [
        AuthorityServer("127.0.0.1", grpc.ssl_server_credentials([(leaf.key, leaf.cert)]))
        for _ in range(2)
    ]
    creds = grpc.ssl_channel_credentials(root_certificates=ca.pem)
    target = "static:///" + ",".join(s.address for s in servers)
    options = [("grpc.lb_policy_name", "round_robin")]
    try:
        with pyxds.secure_channel(target, creds, options=options) as channel:
            seen = {authority_of(channel) for _ in range(4)}
    finally:
        for srv in servers:
            srv.stop()
    assert seen == {s.address.encode() for s in servers}
