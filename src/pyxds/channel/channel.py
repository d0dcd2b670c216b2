"""``XdsChannel``: a real ``grpc.Channel`` whose RPCs go through the pyxds
resolver and LB policy tree (ARCHITECTURE.md "The public API").

Works wherever a grpcio channel does: generated stubs, ``grpc.intercept_channel``,
``with`` blocks.  See :mod:`pyxds.channel.core` for the pick rules and idleness.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from pyxds.channel import lifecycle
from pyxds.channel.core import ChannelCore, subchannel_authority
from pyxds.channel.multicallables import (
    StreamStreamMultiCallable,
    StreamUnaryMultiCallable,
    UnaryStreamMultiCallable,
    UnaryUnaryMultiCallable,
)
from pyxds.channel.subchannel import SyncTransport, subchannel_options
from pyxds.lb.api import ConnectivityState
from pyxds.resolver.service_config import ServiceConfigSource, from_channel_args

if TYPE_CHECKING:  # the bootstrap loads the xDS resource types: only an xds: target needs them
    from pyxds.xds.bootstrap import BootstrapSource

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")

CLOSE_WAIT = 5.0
"""At most this long, ``close()`` waits for the channel's connections to close
(it returns as soon as they are; on a loaded machine that took over 1 s)."""


class XdsChannel(grpc.Channel):
    """A grpc.Channel over the pyxds stack.  Build it with
    :func:`pyxds.insecure_channel` / :func:`pyxds.secure_channel`."""

    def __init__(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None = None,
        bootstrap: BootstrapSource = None,
        options: Sequence[tuple[str, Any]] | None = None,
        compression: grpc.Compression | None = None,
        service_config: ServiceConfigSource = None,
    ) -> None:
        options, parsed, sub_extra = from_channel_args(options, service_config)
        sub_options = subchannel_options(options, subchannel_authority(target)) + sub_extra

        def make_transport(
            address: str, creds: Any, on_state: Callable[[grpc.ChannelConnectivity], None]
        ) -> SyncTransport:
            return SyncTransport(address, creds, sub_options, compression, on_state)

        self._core = ChannelCore(
            target, make_transport, credentials, bootstrap, options, service_config=parsed
        )
        #: (callback, watcher) per subscribe(); as grpcio, one callback may be
        #: subscribed more than once, and each unsubscribe() ends one of them
        self._subscriptions: list[
            tuple[Callable[[grpc.ChannelConnectivity], None], Callable[[ConnectivityState], None]]
        ] = []
        self._sub_lock = threading.Lock()

    @property
    def target(self) -> str:
        return self._core.target

    # -- multicallables --------------------------------------------------
    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None = None,
        response_deserializer: Callable[[bytes], _Response] | None = None,
        _registered_method: bool | None = False,
    ) -> UnaryUnaryMultiCallable[_Request, _Response]:
        if _registered_method:
            self._core.registered_methods.add(method)
        return UnaryUnaryMultiCallable(
            self._core, method, request_serializer, response_deserializer, self
        )

    def unary_stream(
        self,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None = None,
        response_deserializer: Callable[[bytes], _Response] | None = None,
        _registered_method: bool | None = False,
    ) -> UnaryStreamMultiCallable[_Request, _Response]:
        if _registered_method:
            self._core.registered_methods.add(method)
        return UnaryStreamMultiCallable(
            self._core, method, request_serializer, response_deserializer, self
        )

    def stream_unary(
        self,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None = None,
        response_deserializer: Callable[[bytes], _Response] | None = None,
        _registered_method: bool | None = False,
    ) -> StreamUnaryMultiCallable[_Request, _Response]:
        if _registered_method:
            self._core.registered_methods.add(method)
        return StreamUnaryMultiCallable(
            self._core, method, request_serializer, response_deserializer, self
        )

    def stream_stream(
        self,
        method: str,
        request_serializer: Callable[[_Request], bytes] | None = None,
        response_deserializer: Callable[[bytes], _Response] | None = None,
        _registered_method: bool | None = False,
    ) -> StreamStreamMultiCallable[_Request, _Response]:
        if _registered_method:
            self._core.registered_methods.add(method)
        return StreamStreamMultiCallable(
            self._core, method, request_serializer, response_deserializer, self
        )

    # -- connectivity ----------------------------------------------------
    def subscribe(
        self,
        callback: Callable[[grpc.ChannelConnectivity], None],
        try_to_connect: bool = False,
    ) -> None:
        """Like grpcio: ``callback`` gets the current state at once and every
        change after, on a pyxds thread (never the caller's; where no thread
        can start, Python 3.12's atexit hooks closing a channel the program
        left open, on the thread that changed the state)."""
        delivery = _Delivery(callback)

        def on_state(state: ConnectivityState) -> None:
            delivery.push(self._core.grpc_state())

        with self._sub_lock:
            self._subscriptions.append((callback, on_state))
        self._core.add_state_watcher(on_state)
        delivery.push(self._core.grpc_state())
        if try_to_connect:
            self._core.exit_idle()

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        on_state = None
        with self._sub_lock:
            for index, (subscribed, watcher) in enumerate(self._subscriptions):
                if subscribed == callback:
                    on_state = watcher
                    del self._subscriptions[index]
                    break
        if on_state is not None:
            self._core.remove_state_watcher(on_state)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        """The channel's connectivity now (as grpc.aio channels offer)."""
        if try_to_connect:
            self._core.exit_idle()
        return self._core.grpc_state()

    # -- lifecycle -------------------------------------------------------
    def close(self) -> None:
        """Cancel every RPC in flight, fail queued ones, release everything.
        Like grpcio, subscriptions end here: no callback sees SHUTDOWN; an RPC
        invoked after close raises ValueError."""
        with self._sub_lock:
            subscriptions, self._subscriptions = self._subscriptions, []
        for _, on_state in subscriptions:
            self._core.remove_state_watcher(on_state)
        self._core.close(wait=CLOSE_WAIT)

    def __enter__(self) -> XdsChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None:
            lifecycle.release(core)  # never closes here: see channel/lifecycle.py

    # -- introspection ---------------------------------------------------
    def config_dump(self) -> dict[str, Any]:
        """CSDS-style dump: xDS resources plus the channel's LB state."""
        from pyxds.channel.dump import config_dump  # loaded when asked for

        return config_dump(self._core)


class _Delivery:
    """Delivers connectivity callbacks in order on a short-lived thread, so
    a slow user callback never stalls the channel.  Where no thread can
    start (Python 3.12 refuses them in atexit hooks, where pyxds closes the
    channels left open: the SHUTDOWN of such a channel), the pushing thread
    delivers them itself; it raised into the channel's state watchers
    (a logged traceback at exit), and the callback got nothing more."""

    def __init__(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        self._callback = callback
        self._lock = threading.Lock()
        self._pending: list[grpc.ChannelConnectivity] = []
        self._running = False
        self._last: grpc.ChannelConnectivity | None = None

    def push(self, state: grpc.ChannelConnectivity) -> None:
        with self._lock:
            self._pending.append(state)
            if self._running:
                return
            self._running = True
        try:
            threading.Thread(target=self._run, name="pyxds-connectivity", daemon=True).start()
        except RuntimeError:  # no thread can start: delivered here, in order
            self._run()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._running = False
                    return
                state = self._pending.pop(0)
            if state is self._last:
                continue
            self._last = state
            try:
                self._callback(state)
            except Exception:
                pass
