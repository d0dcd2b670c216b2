"""An attempt's own ``:authority`` on a subchannel's grpcio channel (gRFC A81
"xds_cluster_impl LB Policy Changes": the picker sets the ``:authority`` of
the RPC; the connection, and the name its TLS handshake checks, stay the
channel's).

Sync: C-core takes a per-call host (``grpc_channel_create_call``'s
``host``), which grpcio's multicallables always pass as None.  A
multicallable of the transport's own channel is made to pass the host: its
cygrpc channel (``_channel``, whose ``segregated_call`` the blocking calls
use) and its ``_managed_call`` (futures and streams) are wrapped to put the
host in that argument.  Same connection, same C-core call; the host is
checked against the server's certificate by a TLS channel (C-core's
per-call host check), as in C-core's xDS channel.

``grpc.aio``: grpcio's asyncio calls have no host at all (``_AioCall``
passes NULL).  The attempt goes on a ``grpc.aio`` channel of its own to the
transport's address (a second connection), with ``grpc.default_authority``
set to the host and no ``grpc.ssl_target_name_override``: with TLS its
handshake checks the server's certificate against the host (and sends it as
SNI), where C-core's per-call check refuses the call UNAUTHENTICATED "call
host does not match SSL server name".  Pinning the handshake to the
channel's name instead (the override) would turn C-core's per-call check
off, sending the host unchecked.  Both differences are in
docs/differences-from-c-core.md.

Made only for an attempt whose pick set an authority (a route with
``auto_host_rewrite`` to an endpoint with a host name): other RPCs never
come here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from pyxds.channel.grpc_aio_twin import public_channel

__all__ = ["with_host", "authority_options", "aio_channel"]


class _HostCalls:
    """A cygrpc channel whose ``segregated_call`` passes ``host``."""

    __slots__ = ("_channel", "_host")

    def __init__(self, channel: Any, host: bytes) -> None:
        self._channel = channel
        self._host = host

    def segregated_call(self, flags: int, method: bytes, host: Any, *rest: Any) -> Any:
        return self._channel.segregated_call(flags, method, self._host, *rest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


def _managed_with_host(managed_call: Callable[..., Any], host: bytes) -> Callable[..., Any]:
    def call(flags: int, method: bytes, _host: Any, *rest: Any) -> Any:
        return managed_call(flags, method, host, *rest)

    return call


def with_host(mc: Any, authority: str) -> Any:
    """``mc``, a sync grpcio multicallable just made, sending ``authority``
    as the ``:authority`` of its calls (see the module docstring)."""
    host = authority.encode()
    mc._channel = _HostCalls(mc._channel, host)
    mc._managed_call = _managed_with_host(mc._managed_call, host)
    return mc


_NAMING = frozenset({"grpc.default_authority", "grpc.ssl_target_name_override"})


def authority_options(
    options: Sequence[tuple[str, Any]], authority: str
) -> tuple[tuple[str, Any], ...]:
    """A ``grpc.aio`` channel's options for attempts with ``authority``: the
    transport's ``options`` with ``grpc.default_authority`` set to it, and no
    TLS name override (the handshake checks ``authority``)."""
    out = [(k, v) for k, v in options if k not in _NAMING]
    out.append(("grpc.default_authority", authority))
    return tuple(out)


def aio_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]],
    compression: grpc.Compression | None,
    authority: str,
) -> Any:
    """A ``grpc.aio`` channel to ``target`` whose calls carry ``authority``."""
    return public_channel(target, credentials, authority_options(options, authority), compression)
