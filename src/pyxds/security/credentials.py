"""xDS channel credentials (gRFC A29 "Programming API").

``pyxds.secure_channel(target, grpc.xds_channel_credentials(fallback))``
takes grpcio's own object: a ``grpc.ChannelCredentials`` wrapping a cygrpc
``XDSChannelCredentials``, whose ``_fallback_credentials`` attribute holds
the fallback's cygrpc credentials (read once, at channel construction;
:func:`xds_info` fails loudly if a grpcio release hides it).
:func:`xds_channel_credentials` is pyxds's own spelling: the same grpcio
object (so it works with grpcio channels too), remembering the fallback
itself.

With xDS credentials a cluster with an ``UpstreamTlsContext`` uses TLS/mTLS
from its providers (:mod:`pyxds.security.relay`); any other subchannel uses
the fallback credentials (None: insecure).
"""

from __future__ import annotations

from typing import Any

import grpc

from pyxds._values import dataclass


class XdsChannelCredentials(grpc.ChannelCredentials):
    """grpcio's xDS credentials with the fallback kept by pyxds."""

    def __init__(self, fallback: grpc.ChannelCredentials | None) -> None:
        grpc_creds = grpc.xds_channel_credentials(fallback)
        # grpcio's cygrpc credentials: private, so absent from the stubs
        super().__init__(grpc_creds._credentials)  # type: ignore[attr-defined]  # private
        self.fallback = fallback


def xds_channel_credentials(
    fallback_credentials: grpc.ChannelCredentials | None = None,
) -> grpc.ChannelCredentials:
    """As ``grpc.xds_channel_credentials`` (default fallback: TLS with the
    system roots, as grpcio)."""
    if fallback_credentials is None:
        fallback_credentials = grpc.ssl_channel_credentials()
    return XdsChannelCredentials(fallback_credentials)


@dataclass(frozen=True)
class XdsCredentialsInfo:
    """The fallback of xDS credentials; None means insecure."""

    fallback: grpc.ChannelCredentials | None


def _insecure(creds: Any) -> bool:
    inner = getattr(creds, "_credentials", creds)
    return type(inner).__name__ == "InsecureChannelCredentials"


def xds_info(credentials: Any) -> XdsCredentialsInfo | None:
    """The xDS side of ``credentials``; None when they are not xDS credentials."""
    if credentials is None:
        return None
    if isinstance(credentials, XdsChannelCredentials):
        fb = credentials.fallback
        return XdsCredentialsInfo(None if fb is None or _insecure(fb) else fb)
    inner = getattr(credentials, "_credentials", None)
    if type(inner).__name__ != "XDSChannelCredentials":
        return None
    fb_inner = getattr(inner, "_fallback_credentials", None)
    if fb_inner is None:
        raise ValueError(
            "pyxds cannot read the fallback credentials of this grpc.xds_channel_credentials "
            "object (grpcio changed); use pyxds.xds_channel_credentials(fallback) instead"
        )
    if _insecure(fb_inner):
        return XdsCredentialsInfo(None)
    return XdsCredentialsInfo(grpc.ChannelCredentials(fb_inner))
