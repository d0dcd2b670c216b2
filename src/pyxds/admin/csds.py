"""The CSDS service over every pyxds XdsClient of the process (gRFC A40, A71).

``FetchClientStatus`` (unary) and ``StreamClientStatus`` (one response per
request) answer a ``ClientStatusResponse`` with one ``ClientConfig`` per
(XdsClient, channel target): the bootstrap node, ``client_scope`` set to the
target that uses the client (A71 "Update CSDS to aggregate configs from
multiple XdsClient instances"), and a ``GenericXdsConfig`` per resource with
its ``client_status`` (REQUESTED, DOES_NOT_EXIST, ACKED, NACKED, and A88's
RECEIVED_ERROR / TIMEOUT), version, ``last_updated`` and, after a NACK,
``error_state`` (A40 "Client Status"). pyxds shares one XdsClient between
channels with the same bootstrap, so a client used by two targets appears
twice, once per scope, as C-core's per-target clients would.
``exclude_resource_contents`` drops ``xds_config``. A request with
``node_matchers`` fails INVALID_ARGUMENT (A40 "Detail: Node Matching", as
grpc-java and grpc-go; C-core ignores them); on ``StreamClientStatus`` that
ends the stream after the answers already sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc

from pyxds.xds import csds
from pyxds.xds.client import XdsClient


def client_status_response(exclude_resource_contents: bool = False) -> Any:
    """The ``ClientStatusResponse`` of every open pyxds XdsClient, sorted by scope."""
    response = csds_pb2.ClientStatusResponse()
    configs = []
    for client, scopes in XdsClient.instances():
        try:
            dump = client.dump()
        except Exception:  # closed meanwhile: nothing to report for it
            continue
        if exclude_resource_contents:
            for entry in dump.get("generic_xds_configs", []):
                entry.pop("xds_config", None)
        for scope in scopes or ("",):
            config = csds.client_config_proto(dump)
            config.client_scope = scope
            configs.append(config)
    configs.sort(key=lambda c: (c.client_scope, c.node.id))
    response.config.extend(configs)
    return response


def _excluded(request: Any) -> bool:
    return bool(getattr(request, "exclude_resource_contents", False))


#: A40 "Detail: Node Matching": node matchers are refused, not applied.
NODE_MATCHERS_REFUSED = "node_matchers not supported"


def _refused(request: Any) -> bool:
    """Whether A40 says to fail ``request`` INVALID_ARGUMENT (it has node matchers)."""
    return len(request.node_matchers) > 0


# grpcio-csds' generated servicer base has no stubs (it is Any to mypy)
class CsdsServicer(csds_pb2_grpc.ClientStatusDiscoveryServiceServicer):  # type: ignore[misc]  # no stubs
    """CSDS for a ``grpc.server`` (threads)."""

    def FetchClientStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        if _refused(request):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, NODE_MATCHERS_REFUSED)
        return client_status_response(_excluded(request))

    def StreamClientStatus(
        self, request_iterator: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[Any]:  # ClientStatusRequest/Response (no stubs)
        for request in request_iterator:
            if _refused(request):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, NODE_MATCHERS_REFUSED)
            yield client_status_response(_excluded(request))


class AioCsdsServicer(csds_pb2_grpc.ClientStatusDiscoveryServiceServicer):  # type: ignore[misc]  # no stubs
    """CSDS for a ``grpc.aio.server``: the dump runs off the event loop."""

    async def FetchClientStatus(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        if _refused(request):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NODE_MATCHERS_REFUSED)
        return await asyncio.to_thread(client_status_response, _excluded(request))

    async def StreamClientStatus(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        async for request in request_iterator:
            if _refused(request):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NODE_MATCHERS_REFUSED)
            yield await asyncio.to_thread(client_status_response, _excluded(request))


def add_csds_servicer(server: Any) -> None:
    """Register CSDS on ``server`` (``grpc.Server`` or ``grpc.aio.Server``)."""
    servicer: Any = AioCsdsServicer() if isinstance(server, grpc.aio.Server) else CsdsServicer()
    csds_pb2_grpc.add_ClientStatusDiscoveryServiceServicer_to_server(servicer, server)
