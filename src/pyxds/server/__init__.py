"""pyxds.server: an embedded xDS v3 management server (ADS, State of the World).

For tests, demos and local development: serve Envoy v3 resources to any gRPC
xDS client (grpcio's C-core, grpc-go, grpc-java, pyxds) from Python objects or a
YAML/JSON resource file, and see what each client ACKed and NACKed.

    from pyxds.server import ManagementServer, Snapshot, builders as b

    with ManagementServer() as server:
        server.set_snapshot(Snapshot(
            listeners=[b.listener("echo", route_config_name="echo-route")],
            routes=[b.route_config("echo-route", [b.virtual_host("all", ["*"],
                                   [b.route(prefix="", cluster="backend")])])],
            clusters=[b.cluster("backend")],
            endpoints=[b.endpoints("backend", [b.locality(endpoints=["127.0.0.1:50051"])])],
        ))
        bootstrap = server.bootstrap(node_id="my-node")

Load reports (LRS) from clusters built with ``lrs_server=True`` are recorded
in ``server.lrs`` (:class:`LrsService`: ``reports()``, ``totals()``).

Routes that use a Route Lookup Service (RLS, ``builders.rls_plugin``) can be
tested against :class:`RouteLookupServer`, a table of key maps to targets.
"""

from pyxds.server import builders
from pyxds.server.files import ResourceFileError, dump_resources, load_resources, parse_resources
from pyxds.server.lrs import LoadReportRecord, LoadTotals, LrsService
from pyxds.server.records import AckRecord, NackRecord, RequestRecord
from pyxds.server.rls import LookupAnswer, LookupRecord, RouteLookupServer
from pyxds.server.server import ManagementServer, PortInUseError
from pyxds.server.snapshot import RawResource, Snapshot
from pyxds.server.types import (
    CLUSTER,
    CLUSTER_LOAD_ASSIGNMENT,
    LISTENER,
    ROUTE_CONFIGURATION,
    TYPE_URLS,
)

__all__ = [
    "CLUSTER",
    "CLUSTER_LOAD_ASSIGNMENT",
    "LISTENER",
    "ROUTE_CONFIGURATION",
    "TYPE_URLS",
    "AckRecord",
    "LoadReportRecord",
    "LoadTotals",
    "LookupAnswer",
    "LookupRecord",
    "LrsService",
    "ManagementServer",
    "NackRecord",
    "PortInUseError",
    "RawResource",
    "RequestRecord",
    "RouteLookupServer",
    "ResourceFileError",
    "Snapshot",
    "builders",
    "dump_resources",
    "load_resources",
    "parse_resources",
]
