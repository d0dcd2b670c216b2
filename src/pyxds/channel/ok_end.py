"""An RPC the channel ends with status OK before any attempt: gRFC A33's
``grpc_status`` OK abort ("200/OK Error Injection": gRPC "will react as if it
has immediately received trailing metadata from the server with the status
OK").

:class:`AioOkEndCall` stands in for the grpc.aio call that was never made,
finished as grpc.aio's own call is when a server answers OK with trailers
only: a unary response of None (what grpcio returns then), no streamed
responses, empty metadata, details "".  The asyncio adapters (``aio.py``) put
one where the attempt's call would be, so every reader of the call sees that
end (the sync adapters' twin is ``calls.OkEndCall``).
"""

from __future__ import annotations

from typing import Any

import grpc.aio

from pyxds.channel.aio_interceptors import _ResponseCall

__all__ = ["AioOkEndCall"]


class AioOkEndCall(_ResponseCall):
    """A finished grpc.aio call: OK, no response (see the module docstring):
    an interceptor's answered call (awaited: None; code OK, details "";
    written to: grpc.aio's "RPC already finished."), read as a stream with
    nothing in it, with grpc.aio's empty metadata."""

    def __init__(self) -> None:
        super().__init__(None)

    async def read(self) -> Any:
        return grpc.aio.EOF

    async def initial_metadata(self) -> Any:
        return grpc.aio.Metadata()

    async def trailing_metadata(self) -> Any:
        return grpc.aio.Metadata()
