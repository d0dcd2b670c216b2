"""The channel to a Route Lookup Service (the ``rls_experimental`` policy's
:class:`pyxds.lb.rls.RouteLookupChannel`).

A grpcio channel of its own to ``lookupService`` (any gRPC target: grpcio's
C-core resolves it), as C-core builds it: the parent channel's credentials
(the fallback credentials of xDS credentials, which is what C-core's
xDS credentials do for a target that is not xDS), the parent channel's
authority as ``:authority``, and ``routeLookupChannelServiceConfig`` as its
service config (resolution then gives none).  Lookups are unary
``RouteLookup`` calls with ``target_type`` "grpc", sent with ``future()``;
their completions and the channel's connectivity changes are handed to the
channel's serializer.  A response that does not parse is INTERNAL "cannot
parse RLS response" (C-core's words).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import grpc

from pyxds import connectivity
from pyxds.lb.api import ConnectivityState, Status
from pyxds.lb.rls import LookupReason, LookupResult, RouteLookupChannel
from pyxds.protos import ROUTE_LOOKUP_METHOD

__all__ = ["GrpcRouteLookupChannel"]

_log = logging.getLogger(__name__)

_STATES = {
    grpc.ChannelConnectivity.IDLE: ConnectivityState.IDLE,
    grpc.ChannelConnectivity.CONNECTING: ConnectivityState.CONNECTING,
    grpc.ChannelConnectivity.READY: ConnectivityState.READY,
    grpc.ChannelConnectivity.TRANSIENT_FAILURE: ConnectivityState.TRANSIENT_FAILURE,
    grpc.ChannelConnectivity.SHUTDOWN: ConnectivityState.SHUTDOWN,
}


def _identity(data: bytes) -> bytes:
    return data


class GrpcRouteLookupChannel(RouteLookupChannel):
    """See the module docstring."""

    def __init__(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None,
        authority: str,
        service_config: str | None,
        run: Callable[[Callable[[], None]], None],
    ) -> None:
        from pyxds.protos import rls_pb2

        self._request_type = rls_pb2.RouteLookupRequest
        self._response_type = rls_pb2.RouteLookupResponse
        self.target = target
        self._run = run
        options: list[tuple[str, Any]] = []
        if authority:
            options.append(("grpc.default_authority", authority))
        if service_config:
            options.append(("grpc.service_config", service_config))
            options.append(("grpc.service_config_disable_resolution", 1))
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options)
        self._call = self._channel.unary_unary(
            ROUTE_LOOKUP_METHOD,
            request_serializer=self._request_type.SerializeToString,
            response_deserializer=_identity,
        )
        self._watchers: list[Callable[[ConnectivityState], None]] = []
        self._closed = False
        # Polled with the subchannels (pyxds.connectivity): no thread per RLS channel.
        self._watch = connectivity.watch_channel(self._channel, self._on_connectivity)

    # -- RouteLookupChannel ----------------------------------------------------
    def lookup(
        self,
        key_map: Mapping[str, str],
        reason: LookupReason,
        stale_header_data: str,
        timeout: float,
        on_done: Callable[[LookupResult], None],
    ) -> Callable[[], None]:
        request = self._request_type(
            target_type="grpc",
            key_map=dict(key_map),
            reason=cast(Any, int(reason)),
            stale_header_data=stale_header_data,
        )
        future = self._call.future(request, timeout=timeout)
        cancelled = False

        def done(f: Any) -> None:
            if cancelled:
                return
            result = self._result(f)
            self._run(lambda: None if cancelled else on_done(result))

        def cancel() -> None:
            nonlocal cancelled
            cancelled = True
            future.cancel()

        future.add_done_callback(done)
        return cancel

    def watch_state(self, fn: Callable[[ConnectivityState], None]) -> Callable[[], None]:
        self._watchers.append(fn)

        def unwatch() -> None:
            if fn in self._watchers:
                self._watchers.remove(fn)

        return unwatch

    def reset_backoff(self) -> None:
        try:  # grpcio has no public reset: ask C-core to connect now
            connectivity.request_connection(self._channel)
        except Exception:
            return
        self._watch.expect_change()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._watchers.clear()
        self._watch.cancel()
        connectivity.monitor().close_soon(self._channel.close)

    # -- internals -----------------------------------------------------------
    def _result(self, future: Any) -> LookupResult:
        try:
            data = future.result()
        except grpc.RpcError as err:
            code = err.code() if callable(getattr(err, "code", None)) else None
            details = err.details() if callable(getattr(err, "details", None)) else str(err)
            return LookupResult(Status(code or grpc.StatusCode.UNKNOWN, details or ""))
        except grpc.FutureCancelledError:
            return LookupResult(Status(grpc.StatusCode.CANCELLED, "RLS request cancelled"))
        except Exception as err:  # never let a lookup crash the channel
            return LookupResult(Status(grpc.StatusCode.UNKNOWN, str(err)))
        response = self._response_type()
        try:
            response.ParseFromString(data)
        except Exception:
            return LookupResult(Status(grpc.StatusCode.INTERNAL, "cannot parse RLS response"))
        return LookupResult(targets=tuple(response.targets), header_data=response.header_data)

    def _on_connectivity(self, connectivity: grpc.ChannelConnectivity) -> None:
        state = _STATES.get(connectivity)
        if state is None or self._closed:
            return

        def deliver() -> None:
            for fn in list(self._watchers):
                try:
                    fn(state)
                except Exception:
                    _log.exception("pyxds: RLS channel state watcher raised")

        self._run(deliver)
