"""weighted_round_robin's out-of-band ORCA reports (A51, A58) from backends
that require mutual TLS, on a sync channel with xDS credentials (A29): the
sync channel reads each endpoint's OpenRcaService on a grpc.aio twin of the
subchannel's grpcio channel (channel/grpc_aio_twin.py: on the subchannel's
own connection to its TLS relay, so one TLS connection per backend; a second
one through the same relay on a grpcio the twin was not checked against).
A twin that skipped the relay would fail the backends' handshake: no report
would arrive and the split would stay round robin."""

from __future__ import annotations

import collections
from concurrent import futures

import grpc
import pytest
from channel_fixtures import TARGET, _handlers, connections_to, wait_until
from orca_backends import HEAVY, LIGHT, wrr_policy
from ports import EXCLUSIVE
from test_xds_security import bootstrap, tls, xds_creds

import pyxds
from pyxds.orca import ServerMetricRecorder, add_orca_service
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot
from pyxds.testing.certs import CertAuthority, write_files

SPIFFE = "spiffe://t.example/backend"


@pytest.fixture(scope="module")
def pki():
    ca = CertAuthority("mesh CA")
    return {"ca": ca, "server": ca.issue("backend", uris=(SPIFFE,)), "client": ca.issue("client")}


def mtls_orca_backend(name: str, cpu: float, pki: dict) -> tuple[grpc.Server, str]:
    """A backend answering Who with ``name`` and serving OpenRcaService
    (cpu ``cpu``, qps 100, at most every 0.1 s), mutual TLS only."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[EXCLUSIVE])
    server.add_generic_rpc_handlers((_handlers(name, collections.Counter()),))
    recorder = ServerMetricRecorder()
    recorder.set_cpu_utilization(cpu)
    recorder.set_qps(100.0)
    add_orca_service(server, recorder, min_report_interval=0.1)
    leaf = pki["server"]
    creds = grpc.ssl_server_credentials(
        [(leaf.key, leaf.cert)], root_certificates=pki["ca"].pem, require_client_auth=True
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return server, f"127.0.0.1:{port}"


def test_sync_channel_reads_oob_reports_of_mtls_backends_through_the_relay(
    xds_server, pki, tmp_path
):
    started = [mtls_orca_backend("heavy", HEAVY, pki), mtls_orca_backend("light", LIGHT, pki)]
    addresses = [address for _server, address in started]
    route = b.route_config(
        "echo-service-route", [b.virtual_host("vh", routes=[b.route(prefix="", cluster="c")])]
    )
    cluster = b.cluster(
        "c", upstream_tls=tls(), load_balancing_policy=[("wrr_locality", wrr_policy(True, 0.1))]
    )
    xds_server.set_snapshot(
        Snapshot(
            listeners=[b.listener("echo-service")],
            routes=[route],
            clusters=[cluster],
            endpoints=[b.endpoints("c", [b.locality(zone="z", endpoints=addresses)])],
        )
    )
    config = write_files(str(tmp_path), pki["ca"].pem, pki["client"])
    channel = pyxds.secure_channel(
        TARGET, xds_creds(), bootstrap=bootstrap(xds_server, "wrr-oob-tls", config)
    )
    who = channel.unary_unary("/pyxds.test.Echo/Who")

    def heavy_share(n: int) -> float:
        names = [who(b"", timeout=10, wait_for_ready=True) for _ in range(n)]
        return names.count(b"heavy") / n

    try:
        assert wait_until(lambda: heavy_share(100) > 0.8, 20)  # reports arrived
        assert heavy_share(2000) == pytest.approx(0.9, abs=0.04)
        subchannels = channel.config_dump()["subchannels"].values()
        assert sum(1 for s in subchannels if "peer_sans" in s.get("security", {})) == 2
        # the twin shares the subchannel's plaintext connection to its relay, so
        # the relay makes one TLS connection per backend (grpc_aio_twin)
        assert [connections_to(address) for address in addresses] == [1, 1]
    finally:
        channel.close()
        for server, _address in started:
            server.stop(None)
