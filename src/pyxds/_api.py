"""``pyxds.insecure_channel`` / ``pyxds.secure_channel`` (ARCHITECTURE.md
"The public API"): grpcio's channel constructors, plus ``bootstrap``.

``bootstrap`` is a path, a dict, or JSON text; when None the xds resolver
reads ``GRPC_XDS_BOOTSTRAP`` (a file) or ``GRPC_XDS_BOOTSTRAP_CONFIG``
(inline JSON), as grpcio does.  Targets: ``xds:///name`` (and
``xds://authority/name``), plus ``static:///a:1,b:2``, ``ipv4:``/``ipv6:``
lists and ``dns:///host:port`` for use without a control plane.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from pyxds.channel.channel import XdsChannel
from pyxds.resolver.service_config import ServiceConfigSource
from pyxds.xds.bootstrap import BootstrapSource


def insecure_channel(
    target: str,
    bootstrap: BootstrapSource = None,
    options: Sequence[tuple[str, Any]] | None = None,
    compression: grpc.Compression | None = None,
    service_config: ServiceConfigSource = None,
) -> XdsChannel:
    """A plaintext grpc.Channel to ``target`` over the pyxds stack.
    ``service_config``: a gRPC service config (dict or JSON text:
    loadBalancingConfig, methodConfig, retryThrottling), ValueError naming
    the JSON path when invalid; for ``xds:`` targets the xDS config wins."""
    return XdsChannel(target, None, bootstrap, options, compression, service_config)


def secure_channel(
    target: str,
    credentials: grpc.ChannelCredentials,
    bootstrap: BootstrapSource = None,
    options: Sequence[tuple[str, Any]] | None = None,
    compression: grpc.Compression | None = None,
    service_config: ServiceConfigSource = None,
) -> XdsChannel:
    """A grpc.Channel to ``target`` whose subchannels use ``credentials``.

    ``grpc.xds_channel_credentials(fallback)`` (grpcio's own object) or
    :func:`pyxds.xds_channel_credentials` opt in to the control plane's
    security config (gRFC A29): clusters with an ``UpstreamTlsContext`` use
    TLS/mTLS from the bootstrap's certificate providers, with the server's
    SANs checked; every other connection uses ``fallback``.

    ``service_config`` as for :func:`insecure_channel`.
    """
    if credentials is None:
        raise ValueError("secure_channel needs credentials (use insecure_channel)")
    return XdsChannel(target, credentials, bootstrap, options, compression, service_config)
