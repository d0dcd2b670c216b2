"""pyxds: gRPC's client-side xDS stack in pure Python.

``pyxds.insecure_channel("xds:///name")`` and ``pyxds.secure_channel`` return
a real ``grpc.Channel``; ``pyxds.aio`` has the asyncio variants;
``pyxds.lb.registry.register`` adds custom LB policies.
``pyxds.secure_channel(target, grpc.xds_channel_credentials(fallback))`` (or
``pyxds.xds_channel_credentials``) uses the control plane's TLS config (A29).
``pyxds.xds_server(executor)`` is an xDS-enabled ``grpc.Server`` (A36, A29,
A41); ``pyxds.aio.xds_server()`` its asyncio twin.

Start-up: ``import pyxds`` (and so the import of any ``pyxds.*`` module,
e.g. the xDS client's bootstrap) loads nothing but the version; every name
below loads on first use (PEP 562): the channel with ``insecure_channel``,
``pyxds.aio`` (the asyncio channel) when named, and the xDS client with
its protos only when the first ``xds:`` channel resolves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyxds._version import __version__

if TYPE_CHECKING:
    from pyxds import aio
    from pyxds._api import insecure_channel, secure_channel
    from pyxds.channel.channel import XdsChannel
    from pyxds.security.credentials import xds_channel_credentials
    from pyxds.serving.server import XdsServer, xds_server

__all__ = [
    "XdsChannel",
    "XdsServer",
    "__version__",
    "aio",
    "insecure_channel",
    "secure_channel",
    "xds_channel_credentials",
    "xds_server",
]


def __getattr__(name: str) -> Any:
    import importlib

    if name in ("insecure_channel", "secure_channel"):
        value: Any = getattr(importlib.import_module("pyxds._api"), name)
    elif name == "aio":
        value = importlib.import_module("pyxds.aio")
    elif name == "XdsChannel":
        value = importlib.import_module("pyxds.channel.channel").XdsChannel
    elif name in ("XdsServer", "xds_server"):
        value = getattr(importlib.import_module("pyxds.serving.server"), name)
    elif name == "xds_channel_credentials":
        value = importlib.import_module("pyxds.security.credentials").xds_channel_credentials
    else:
        raise AttributeError(f"module 'pyxds' has no attribute {name!r}")
    globals()[name] = value
    return value
