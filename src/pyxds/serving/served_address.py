"""One listening address of an xDS-enabled server: its Listener, its grpcio
server generations and its serving state (gRFC A36 "Serving and Not
Serving", A29 server side).  Every method runs on the xDS server's
serializer.

Theory of operation (docs/xds-server.md):

* Not serving: no grpcio server listens on the port (connections are
  refused; the port stays reserved, :mod:`pyxds.serving.ports`).
* A :class:`~pyxds.serving.listener_watch.ServingConfig` arrives: the port
  needs one transport (:func:`~pyxds.serving.filter_chains.port_security`):
  TLS from the Listener, or the application's credentials (the fallback)
  when its chains have no TLS.  If a grpcio server with that transport runs,
  the new config applies in place to its gate (routes, RBAC: the next RPC
  uses it).  Otherwise a new grpcio server (a *generation*) starts on the
  port with the new credentials and its own gate, and the previous one is
  stopped with the drain grace time: it stops listening at once (new
  connections reach the new server, which already listens on the same port
  through ``SO_REUSEPORT``), sends GOAWAY, and its RPCs in flight finish
  within the grace time with the config they started under (as C-core's
  connections keep their filter chain).
* A Status (no Listener, deleted, not ours), a refused Listener, missing
  certificates or a port another program holds: not serving, with the
  reason; a generation that was serving drains.  Missing certificates and a
  taken port are retried on a timer.
* Each change of serving state (and each new reason) is reported once to
  ``notify(address, serving, error)``.
* A36 "configuration error logging": each config that will fail RPCs (a
  broken RDS resource, a route whose action is not
  ``non_forwarding_action``) logs its warnings; the first config after them
  without any logs one warning that they are gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from pyxds._values import dataclass
from pyxds.clock import Clock, Timer
from pyxds.serving.credentials import CredentialsError, ServerTls, refresh_interval
from pyxds.serving.gate import Gate
from pyxds.serving.listener_watch import ListenerWatch, ServingConfig, listener_resource_name
from pyxds.serving.ports import ListeningAddress, PortReservation
from pyxds.status import Status
from pyxds.xds.resources import LISTENER_TYPE_URL

__all__ = ["Backend", "BindError", "ServedAddress", "BIND_RETRY"]

_log = logging.getLogger(__name__)

BIND_RETRY = 10.0
"""Seconds between attempts to listen on a port another program holds (A36)."""


class BindError(Exception):
    """grpcio could not listen on the port."""


class Backend(Protocol):
    """Starts and stops the grpcio servers of one xDS server (sync or aio)."""

    def start_server(
        self, address: str, credentials: grpc.ServerCredentials | None, gate: Gate
    ) -> Any: ...

    def stop_server(self, handle: Any, grace: float | None) -> None: ...


@dataclass
class _Generation:
    handle: Any
    gate: Gate
    key: Any


class ServedAddress:
    """See module docstring.  ``credentials`` None: the fallback is plaintext
    (``add_insecure_port``)."""

    def __init__(
        self,
        address: ListeningAddress,
        reservation: PortReservation,
        credentials: grpc.ServerCredentials | None,
        backend: Backend,
        clock: Clock,
        run: Callable[[Callable[[], None]], None],
        notify: Callable[[str, bool, str | None], None],
        drain_grace: float | None,
        local_lookup: Callable[[str], Any] | None = None,
    ) -> None:
        self.address = address
        self.reservation = reservation
        self._credentials = credentials
        self._backend = backend
        self._clock = clock
        self._run = run
        self._notify = notify
        self._drain_grace = drain_grace
        self._lookup = local_lookup
        self.watch: ListenerWatch | None = None
        self.config: ServingConfig | None = None
        self._generation: _Generation | None = None
        self._retry: Timer | None = None
        self.serving = False
        self.reason: str | None = "waiting for the Listener"
        self._reported: tuple[bool, str | None] | None = None
        self._closed = False
        self._config_errors = False

    @property
    def text(self) -> str:
        return self.address.text

    def start(self, client: Any, template: str) -> None:
        name = listener_resource_name(template, self.text)
        self.watch = ListenerWatch(
            client,
            name,
            self.text,
            self.address.local_ip,
            lambda value: self._run(lambda: self._on_change(value)),
            executor=self._run,
        )
        self.watch.start()

    def stop(self, grace: float | None) -> None:
        self._closed = True
        self._note(None)
        self._cancel_retry()
        if self.watch is not None:
            self.watch.stop()
        self._drop_generation(grace)
        self.serving = False

    # -- updates -------------------------------------------------------------
    def _on_change(self, value: ServingConfig | Status) -> None:
        if self._closed:
            return
        if isinstance(value, Status):
            self.config = None
            self._cancel_retry()  # nothing left to retry for
            self._not_serving(str(value.details) or value.code.name)
            return
        self.config = value
        # A36 "configuration error logging": a warning on each update while
        # the config will fail RPCs, then one once it no longer does.
        warnings = value.config_errors()
        for warning in warnings:
            _log.warning("xDS server %s: %s", self.text, warning)
        if self._config_errors and not warnings:
            _log.warning("xDS server %s: no configuration errors any more", self.text)
        self._config_errors = bool(warnings)
        self._apply()

    def _cancel_retry(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def _apply(self) -> None:
        self._cancel_retry()
        config = self.config
        if config is None or self._closed:
            return
        security = config.security
        if security.refusal is not None:
            self._not_serving(security.refusal)
            return
        key = ("tls", security.tls) if security.tls is not None else ("fallback",)
        generation = self._generation
        if generation is not None and generation.key == key:
            generation.gate.set_config(config)
            self._serving()
            return
        credentials = self._credentials
        if security.tls is not None:
            try:
                credentials = ServerTls(security.tls).credentials
            except CredentialsError as err:
                self._not_serving(str(err))
                self._schedule(refresh_interval(security.tls))
                return
        tls = security.tls
        gate = Gate(
            self.address.port,
            self.address.local_ip,
            self._lookup,
            identity_unknown=tls is not None
            and tls.ca is not None
            and not tls.require_client_certificate,
        )
        gate.set_config(config)
        try:
            handle = self._backend.start_server(self.text, credentials, gate)
        except BindError as err:
            self._not_serving(str(err))
            self._schedule(BIND_RETRY)
            return
        old, self._generation = self._generation, _Generation(handle, gate, key)
        if old is not None:
            self._backend.stop_server(old.handle, self._drain_grace)
        self._serving()

    def _schedule(self, delay: float) -> None:
        def retry() -> None:
            self._retry = None
            self._apply()

        self._retry = self._clock.call_later(delay, lambda: self._run(retry))

    def _drop_generation(self, grace: float | None) -> None:
        old, self._generation = self._generation, None
        if old is not None:
            self._backend.stop_server(old.handle, grace)

    # -- state -----------------------------------------------------------------
    def _serving(self) -> None:
        self.serving = True
        self.reason = None
        self._report()

    def _not_serving(self, reason: str) -> None:
        self._drop_generation(self._drain_grace)
        self.serving = False
        self.reason = reason
        self._report()

    def _note(self, note: dict[str, Any] | None) -> None:
        """Tell the XdsClient (CSDS) what this address does with its Listener."""
        watch = self.watch
        setter = getattr(watch.client, "set_serving_note", None) if watch is not None else None
        if setter is not None and watch is not None:
            setter(LISTENER_TYPE_URL, watch.resource_name, note)

    def _report(self) -> None:
        state = (self.serving, self.reason)
        if state == self._reported:
            return
        resumed = self._reported is not None
        self._reported = state
        self._note(
            {
                "address": self.text,
                "serving": self.serving,
                "error": self.reason,
                "since": time.time(),
            }
        )
        self._notify(self.text, self.serving, self.reason)
        if self.serving:
            log = _log.warning if resumed else _log.info
            log("xDS server: serving on %s", self.text)
        else:
            _log.warning("xDS server: not serving on %s: %s", self.text, self.reason)
