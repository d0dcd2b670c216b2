"""pyxds.channel: the channel users touch (docs/channel.md).

:class:`XdsChannel` (a ``grpc.Channel``) and :class:`AioXdsChannel` (a
``grpc.aio.Channel``) over the pyxds resolver and LB policy tree, with one
grpcio channel per backend address as subchannels.  Build them with
``pyxds.insecure_channel`` / ``pyxds.secure_channel`` and
``pyxds.aio.insecure_channel`` / ``pyxds.aio.secure_channel``.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyxds.channel.aio import AioXdsChannel
    from pyxds.channel.channel import XdsChannel

__all__ = ["XdsChannel", "AioXdsChannel"]


def __getattr__(name: str) -> object:
    """Each channel loads on first use: the asyncio one loads grpc.aio, and
    an asyncio program never loads the sync one (its multicallables and
    calls) nor a sync one the asyncio one (issue 18, start-up)."""
    if name == "XdsChannel":
        from pyxds.channel.channel import XdsChannel

        return XdsChannel
    if name == "AioXdsChannel":
        from pyxds.channel.aio import AioXdsChannel

        return AioXdsChannel
    raise AttributeError(name)
