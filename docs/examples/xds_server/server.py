"""An xDS-enabled server (docs/xds-server.md): serves demo.Greeter on
127.0.0.1:PORT (default 50051) as its Listener says.

The bootstrap is the one ``pyxds serve`` prints (GRPC_XDS_BOOTSTRAP_CONFIG),
plus the template that names the server's Listener.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent import futures

import grpc

import pyxds

port = int(sys.argv[1]) if len(sys.argv) > 1 else 50051
bootstrap = json.loads(os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"])
bootstrap["server_listener_resource_name_template"] = (
    "grpc/server?xds.resource.listening_address=%s"
)


def on_serving_changed(address: str, serving: bool, error: str | None) -> None:
    print(f"{address}: {'serving' if serving else 'not serving: ' + str(error)}", flush=True)


handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
    "Hello": grpc.unary_unary_rpc_method_handler(lambda request, context: b"hello " + request),
    "Secret": grpc.unary_unary_rpc_method_handler(lambda request, context: b"the secret"),
}
server = pyxds.xds_server(
    futures.ThreadPoolExecutor(4), bootstrap=bootstrap, on_serving_changed=on_serving_changed
)
server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("demo.Greeter", handlers)])
server.add_insecure_port(f"127.0.0.1:{port}")  # plaintext unless the Listener says TLS
server.start()
server.wait_for_termination()
