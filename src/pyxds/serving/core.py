"""What the sync and the aio xDS-enabled servers share (gRFC A36): the
bootstrap, the process's XdsClient, the serializer every xDS and timer
callback runs on, the listening addresses and the serving-state callback.

* The bootstrap comes from where the channel's does (``bootstrap=`` or
  ``GRPC_XDS_BOOTSTRAP`` / ``GRPC_XDS_BOOTSTRAP_CONFIG``); one without
  ``server_listener_resource_name_template`` fails ``xds_server()`` at once,
  naming the field (A36 prefers failing startup to a permanent not serving).
* ``start()`` joins the process's shared XdsClient under
  :data:`~pyxds.xds.client.SERVER_SCOPE` (the same ADS stream as the
  process's pyxds channels, :meth:`XdsClient.get_or_create`) and watches each
  address's Listener; it never waits for the control plane (A36: start must
  not fail on transient xDS problems).  ``resource_timeout`` is that
  client's does-not-exist timer when ``start()`` makes it (None: A57's 15 s);
  tests shorten it before ``start()``, as the channel's pass
  ``XdsClient(resource_timeout=)``.  Not part of the public API.
* ``on_serving_changed(address, serving, error)`` is called on every change
  of an address's serving state (and each new not-serving reason), from the
  server's serializer; without it the changes are logged (A36).
* The drain grace time of a Listener update is the
  ``grpc.server_config_change_drain_grace_time_ms`` option (C-core's channel
  argument), 10 minutes by default (A36).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from pyxds.clock import RealClock
from pyxds.serializer import WorkSerializer
from pyxds.serving.channelz import local_ip_of
from pyxds.serving.ports import ListeningAddress, PortReservation, resolve_listening_address
from pyxds.serving.served_address import Backend, ServedAddress

if TYPE_CHECKING:
    from pyxds.xds.client import ClientClosing

__all__ = ["DRAIN_GRACE_OPTION", "DEFAULT_DRAIN_GRACE", "XdsServerCore", "ServingCallback"]

_log = logging.getLogger(__name__)

DRAIN_GRACE_OPTION = "grpc.server_config_change_drain_grace_time_ms"
DEFAULT_DRAIN_GRACE = 600.0
#: At most this long, ``stop()`` waits for the xDS client it released to
#: close (its ADS connection; each of the close's two waits is bounded at 5 s).
_RELEASE_WAIT = 10.0
ServingCallback = Callable[[str, bool, "str | None"], None]


def _load_bootstrap(bootstrap: Any) -> Any:
    from pyxds.xds.bootstrap import load_bootstrap

    loaded = load_bootstrap(bootstrap)
    if not getattr(loaded, "server_listener_resource_name_template", None):
        raise ValueError(
            "xDS bootstrap: server_listener_resource_name_template is not set "
            "(an xDS-enabled server needs it to name its Listener, gRFC A36)"
        )
    return loaded


def drain_grace(options: Sequence[tuple[str, Any]] | None) -> float:
    for key, value in options or ():
        if key == DRAIN_GRACE_OPTION:
            return max(0.0, float(value) / 1000.0)
    return DEFAULT_DRAIN_GRACE


class XdsServerCore:
    """See module docstring.  ``backend`` starts and stops grpcio servers."""

    def __init__(
        self,
        backend: Backend,
        bootstrap: Any,
        options: Sequence[tuple[str, Any]] | None,
        on_serving_changed: ServingCallback | None,
    ) -> None:
        self.bootstrap = _load_bootstrap(bootstrap)
        self.template: str = self.bootstrap.server_listener_resource_name_template
        self._backend = backend
        self._callback = on_serving_changed
        self.drain_grace = drain_grace(options)
        self.serializer = WorkSerializer()
        self._clock: RealClock | None = None
        self.addresses: list[ServedAddress] = []
        self._client: Any = None
        self._release: Callable[[], ClientClosing | threading.Event] | None = None
        #: the does-not-exist timer of the client ``start()`` makes (None: 15 s)
        self.resource_timeout: float | None = None
        self._lock = threading.Lock()
        self.started = False
        self.stopped = False

    # -- ports ---------------------------------------------------------------
    def add_port(self, address: str, credentials: grpc.ServerCredentials | None) -> int:
        """Reserve ``address`` (each IP it resolves to) and return its port."""
        with self._lock:
            if self.started:
                raise RuntimeError("add ports before start() (as grpcio requires)")
            ips, port = resolve_listening_address(address)
            reservations: list[tuple[ListeningAddress, PortReservation]] = []
            try:
                for ip in ips:
                    reservation = PortReservation(ip, port)
                    port = reservation.port  # port 0: every IP gets the first one's
                    reservations.append((ListeningAddress(ip, port), reservation))
            except OSError as err:
                for _, r in reservations:
                    r.close()
                raise RuntimeError(f"xDS server: {err.strerror or err}") from None
            for listening, reservation in reservations:
                if any(a.address == listening for a in self.addresses):
                    reservation.close()
                    continue
                self.addresses.append(self._served(listening, reservation, credentials))
            return port

    def _served(
        self,
        listening: ListeningAddress,
        reservation: PortReservation,
        credentials: grpc.ServerCredentials | None,
    ) -> ServedAddress:
        port = listening.port
        return ServedAddress(
            listening,
            reservation,
            credentials,
            self._backend,
            self._timer_clock(),
            self.serializer.run,
            self._notify,
            self.drain_grace,
            local_lookup=lambda peer: local_ip_of(peer, port),
        )

    def _timer_clock(self) -> RealClock:
        if self._clock is None:
            self._clock = RealClock()
        return self._clock

    # -- lifecycle --------------------------------------------------------------
    def start(self) -> None:
        from pyxds.xds.client import RESOURCE_TIMEOUT, SERVER_SCOPE, XdsClient

        timeout = RESOURCE_TIMEOUT if self.resource_timeout is None else self.resource_timeout
        with self._lock:
            if self.started:
                raise ValueError("Cannot start an already started server")
            self.started = True
            self._client, self._release = XdsClient.get_or_create(
                self.bootstrap, SERVER_SCOPE, resource_timeout=timeout
            )
            client = self._client
            for address in self.addresses:
                self.serializer.run(functools.partial(address.start, client, self.template))

    def stop(self, grace: float | None) -> None:
        """Stop watching and stop every grpcio server (``grace`` as grpcio's)."""
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
        done = threading.Event()

        def stop_all() -> None:
            try:
                for address in self.addresses:
                    address.stop(grace)
                    address.reservation.close()
            finally:
                done.set()

        self.serializer.run(stop_all)
        done.wait(30)
        if self._release is not None:
            # the xDS client closes on its own threads (it never blocks the
            # releaser); stop() returns once its ADS connection is closed
            self._release().wait(_RELEASE_WAIT)
            self._release = None
        if self._clock is not None:
            self._clock.close()

    # -- state ---------------------------------------------------------------
    def _notify(self, address: str, serving: bool, error: str | None) -> None:
        callback = self._callback
        if callback is None:
            return
        try:
            callback(address, serving, error)
        except Exception:
            _log.exception("xDS server: on_serving_changed raised")

    def serving_state(self) -> list[dict[str, Any]]:
        """Per listening address: its Listener name, whether it serves, why not."""
        out = []
        for a in self.addresses:
            config = a.config
            out.append(
                {
                    "address": a.text,
                    "listener": a.watch.resource_name if a.watch is not None else None,
                    "serving": a.serving,
                    "error": a.reason,
                    "listener_version": config.version if config is not None else None,
                }
            )
        return out

    def config_dump(self) -> dict[str, Any]:
        """CSDS-style dump: the XdsClient's resources and the serving state."""
        dump: dict[str, Any] = {}
        if self._client is not None:
            dump = dict(self._client.dump())
        dump["xds_server"] = self.serving_state()
        return dump
