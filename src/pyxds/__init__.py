"""pyxds: gRPC's client-side xDS stack in pure Python.

``pyxds.insecure_channel("xds:///name")`` and ``pyxds.secure_channel`` return
a real ``grpc.Channel``; ``pyxds.aio`` has the asyncio variants;
``pyxds.lb.registry.register`` adds custom LB policies.
"""

from pyxds import aio
from pyxds._api import insecure_channel, secure_channel
from pyxds.channel.channel import XdsChannel

__version__ = "0.1.0"
__all__ = ["XdsChannel", "aio", "insecure_channel", "secure_channel"]
