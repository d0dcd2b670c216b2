"""pyxds: gRPC's client-side xDS stack in pure Python.

``pyxds.insecure_channel("xds:///name")`` and ``pyxds.secure_channel`` return
a real ``grpc.Channel``; ``pyxds.aio`` has the asyncio variants;
``pyxds.lb.registry.register`` adds custom LB policies.
"""

from pyxds._api import insecure_channel, secure_channel

__version__ = "0.1.0"
__all__ = ["insecure_channel", "secure_channel"]
