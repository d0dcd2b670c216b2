"""Certificate rotation under load (A29 file_watcher), differential against
grpcio's C-core ``xds:///`` channel: the provider's files are replaced
(new CA bundle, client certificate from a new CA) while unary RPCs and a
long bidi stream run.  Running RPCs finish; new connections use the new
certificates (a backend that only trusts the new client CA, added after the
rotation, serves); no RPC fails, in either client."""

from __future__ import annotations

import collections
import threading
import time

import grpc
import pytest
from channel_fixtures import SERVICE, Backend, CoreXdsClient, wait_until
from test_xds_security import MESH, tls_snapshot, xds_creds

import pyxds
from pyxds.testing.certs import CertAuthority, write_files


@pytest.fixture
def server(xds_server):
    return xds_server


def test_rotation_under_load_fails_nothing_and_new_connections_use_new_files(server, tmp_path):
    old, new = CertAuthority("old mesh CA"), CertAuthority("new mesh CA")
    # "old" serves with an old-CA certificate and trusts both client CAs;
    # "new" serves with a new-CA certificate and trusts new-CA clients only.
    leaf_old, leaf_new = old.issue("old", uris=("spiffe://m/old",)), new.issue("new")
    backend_old = Backend(
        "old",
        credentials=grpc.ssl_server_credentials(
            [(leaf_old.key, leaf_old.cert)],
            root_certificates=old.pem + new.pem,
            require_client_auth=True,
        ),
    ).start()
    backend_new = Backend(
        "new",
        credentials=grpc.ssl_server_credentials(
            [(leaf_new.key, leaf_new.cert)], root_certificates=new.pem, require_client_auth=True
        ),
    ).start()
    folder = str(tmp_path)
    config = write_files(folder, old.pem, old.issue("client"))
    config["refresh_interval"] = "1s"
    server.set_snapshot(tls_snapshot(backend_old.address, version="1"))
    boot = server.bootstrap(
        node_id="rotation",
        certificate_providers={MESH: {"plugin_name": "file_watcher", "config": config}},
    )
    core = CoreXdsClient(boot, xds_credentials=True)
    channel = pyxds.secure_channel("xds:///echo-service", xds_creds(), bootstrap=boot)
    stop = threading.Event()
    ours: collections.Counter = collections.Counter()
    theirs: collections.Counter = collections.Counter()
    stream_replies: list[bytes] = []

    def pyxds_load() -> None:
        who = channel.unary_unary(f"/{SERVICE}/Who")
        while not stop.is_set():
            try:
                ours[who(b"", timeout=5).decode()] += 1
            except grpc.RpcError as err:
                ours[f"error:{err.code().name}: {err.details()}"] += 1

    def core_load() -> None:
        while not stop.is_set():
            theirs.update(core.call(5, wait_for_ready=False, timeout=5.0, details=True))

    def long_stream() -> None:
        def requests():
            for i in range(40):
                time.sleep(0.1)
                yield str(i).encode()

        chat = channel.stream_stream(f"/{SERVICE}/Chat")
        stream_replies.extend(chat(requests(), timeout=30))

    try:
        assert core.call(1) == {"old": 1}
        loads = [threading.Thread(target=f) for f in (pyxds_load, pyxds_load, core_load)]
        streamer = threading.Thread(target=long_stream)
        for t in [*loads, streamer]:
            t.start()
        time.sleep(1.0)
        write_files(folder, old.pem + new.pem, new.issue("client"))  # the rotation
        time.sleep(2.5)  # past the refresh interval, RPCs running all along
        server.set_snapshot(tls_snapshot(backend_old.address, backend_new.address, version="2"))
        assert wait_until(lambda: ours["new"] > 0 and theirs["new"] > 0, 20.0), (ours, theirs)
        streamer.join(30)
        assert stream_replies == [f"old:{i}".encode() for i in range(40)]  # it ran to the end
    finally:
        stop.set()
        for t in loads:
            t.join(30)
        channel.close()
        core.close()
        backend_old.stop()
        backend_new.stop()
    assert not [k for k in ours if k.startswith("error")], ours
    assert not [k for k in theirs if k.startswith("error")], theirs
