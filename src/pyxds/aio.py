"""``pyxds.aio``: the asyncio channel and xDS-enabled server (ARCHITECTURE.md
"The public API").

``pyxds.aio.insecure_channel("xds:///greeter")`` returns a real
``grpc.aio.Channel`` usable with async generated stubs;
``pyxds.aio.xds_server()`` an xDS-enabled ``grpc.aio.Server`` (A36).
"""

from pyxds.channel.aio import AioXdsChannel, insecure_channel, secure_channel
from pyxds.serving.aio_server import AioXdsServer, xds_server

__all__ = ["AioXdsChannel", "AioXdsServer", "insecure_channel", "secure_channel", "xds_server"]
