"""pyxds: gRPC's client-side xDS stack in pure Python.

``pyxds.insecure_channel("xds:///name")`` and ``pyxds.secure_channel`` return
a real ``grpc.Channel``; ``pyxds.aio`` has the asyncio variants;
``pyxds.lb.registry.register`` adds custom LB policies.
``pyxds.secure_channel(target, grpc.xds_channel_credentials(fallback))`` (or
``pyxds.xds_channel_credentials``) uses the control plane's TLS config (A29).
``pyxds.xds_server(executor)`` is an xDS-enabled ``grpc.Server`` (A36, A29,
A41); ``pyxds.aio.xds_server()`` its asyncio twin.
"""

from pyxds import aio
from pyxds._api import insecure_channel, secure_channel
from pyxds.channel.channel import XdsChannel
from pyxds.security.credentials import xds_channel_credentials
from pyxds.serving.server import XdsServer, xds_server

__version__ = "0.1.0"
__all__ = [
    "XdsChannel",
    "XdsServer",
    "aio",
    "insecure_channel",
    "secure_channel",
    "xds_channel_credentials",
    "xds_server",
]
