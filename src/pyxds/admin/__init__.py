"""Admin services for a process using pyxds (gRFC A40).

    server = grpc.server(ThreadPoolExecutor())          # or grpc.aio.server()
    pyxds.admin.add_admin_servicers(server)
    server.add_insecure_port("127.0.0.1:50051")

registers ``envoy.service.status.v3.ClientStatusDiscoveryService`` (CSDS),
which reports the xDS resources of every pyxds XdsClient in the process, so
tools such as grpcdebug can read a running application's xDS state.
"""

from pyxds.admin.csds import CsdsServicer, add_csds_servicer, client_status_response

__all__ = ["CsdsServicer", "add_admin_servicers", "add_csds_servicer", "client_status_response"]


def add_admin_servicers(server: object) -> None:
    """Register every pyxds admin service (today: CSDS) on a grpc or grpc.aio server."""
    add_csds_servicer(server)
