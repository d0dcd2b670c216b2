"""An RPC the channel ends with status OK before any attempt: gRFC A33's
``grpc_status`` OK abort ("200/OK Error Injection": gRPC "will react as if it
has immediately received trailing metadata from the server with the status
OK").

The call objects stand in for the grpcio call that was never made, finished
as grpcio's own call is when a server answers OK with trailers only: a unary
response of None (what grpcio returns then), no streamed responses, empty
metadata, details "".  The sync adapters (``calls.py``) and the asyncio ones
(``aio.py``) put one where the attempt's call would be, so every reader of
the call sees that end.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import grpc
import grpc.aio

from pyxds.channel import grpc_generic

__all__ = ["AioOkEndCall", "OkEndCall"]

_OK = grpc.StatusCode.OK


class OkEndCall(grpc_generic.CallFuture[None]):
    """A finished sync call: OK, no response (see the module docstring)."""

    # grpc.Call / grpc.RpcContext
    def initial_metadata(self) -> Any:
        return ()

    def trailing_metadata(self) -> Any:
        return ()

    def code(self) -> grpc.StatusCode:
        return _OK

    def details(self) -> str:
        return ""

    def debug_error_string(self) -> str:
        return ""

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:  # type: ignore[override]  # None: no deadline, as grpcio
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    # grpc.Future
    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> None:
        return None

    def exception(self, timeout: float | None = None) -> None:
        return None

    def traceback(self, timeout: float | None = None) -> None:
        return None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)

    # a response stream with nothing in it
    def __iter__(self) -> OkEndCall:
        return self

    def __next__(self) -> Any:
        raise StopIteration


class AioOkEndCall:
    """A finished grpc.aio call: OK, no response (see the module docstring)."""

    def __await__(self) -> Generator[Any, None, None]:
        return None
        yield  # a generator: awaiting it returns None at once

    async def read(self) -> Any:
        return grpc.aio.EOF

    async def write(self, request: Any) -> None:
        # grpc.aio's words for a write to a finished call
        import asyncio

        raise asyncio.InvalidStateError("RPC already finished.")

    async def done_writing(self) -> None:
        return None

    async def initial_metadata(self) -> Any:
        return grpc.aio.Metadata()

    async def trailing_metadata(self) -> Any:
        return grpc.aio.Metadata()

    async def code(self) -> grpc.StatusCode:
        return _OK

    async def details(self) -> str:
        return ""

    async def wait_for_connection(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        callback(self)
