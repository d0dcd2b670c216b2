"""``pyxds.aio``: the asyncio channel and xDS-enabled server (ARCHITECTURE.md
"The public API").

``pyxds.aio.insecure_channel("xds:///greeter")`` returns a real
``grpc.aio.Channel`` usable with async generated stubs;
``pyxds.aio.xds_server()`` an xDS-enabled ``grpc.aio.Server`` (A36).

Start-up (issue 18): importing ``pyxds.aio`` loads the asyncio channel only;
the server side (``xds_server``, ``AioXdsServer``, and with them the
server's Listener validators and the envoy protos) loads when first named
(PEP 562), so a client program never pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyxds.channel.aio import AioXdsChannel, insecure_channel, secure_channel

if TYPE_CHECKING:
    from pyxds.serving.aio_server import AioXdsServer, xds_server

__all__ = ["AioXdsChannel", "AioXdsServer", "insecure_channel", "secure_channel", "xds_server"]


def __getattr__(name: str) -> Any:
    if name in ("AioXdsServer", "xds_server"):
        import importlib

        value = getattr(importlib.import_module("pyxds.serving.aio_server"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pyxds.aio' has no attribute {name!r}")
