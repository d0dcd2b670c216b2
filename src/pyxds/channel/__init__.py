"""pyxds.channel: the channel users touch (docs/channel.md).

:class:`XdsChannel` (a ``grpc.Channel``) and :class:`AioXdsChannel` (a
``grpc.aio.Channel``) over the pyxds resolver and LB policy tree, with one
grpcio channel per backend address as subchannels.  Build them with
``pyxds.insecure_channel`` / ``pyxds.secure_channel`` and
``pyxds.aio.insecure_channel`` / ``pyxds.aio.secure_channel``.
"""

from typing import TYPE_CHECKING

from pyxds.channel.channel import XdsChannel

if TYPE_CHECKING:
    from pyxds.channel.aio import AioXdsChannel

__all__ = ["XdsChannel", "AioXdsChannel"]


def __getattr__(name: str) -> object:  # the asyncio channel loads grpc.aio on first use
    if name == "AioXdsChannel":
        from pyxds.channel.aio import AioXdsChannel

        return AioXdsChannel
    raise AttributeError(name)
