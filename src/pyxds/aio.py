"""``pyxds.aio``: the asyncio channel (ARCHITECTURE.md "The public API").

``pyxds.aio.insecure_channel("xds:///greeter")`` returns a real
``grpc.aio.Channel`` usable with async generated stubs.
"""

from pyxds.channel.aio import AioXdsChannel, insecure_channel, secure_channel

__all__ = ["AioXdsChannel", "insecure_channel", "secure_channel"]
