"""The ``dns:`` resolver of a channel (gRPC's naming doc; C-core's polling DNS
resolver): ``dns:///host:port`` (port 443 by default).

* Lookups run off the work serializer (:mod:`pyxds.resolver.dns`'s threaded
  resolver); the result is delivered on it.
* Re-resolution on the LB policy's request (pick_first or round_robin losing
  a connection) is rate limited as C-core's: no sooner than
  ``grpc.dns_min_time_between_resolutions_ms`` (default 30 s) after the
  previous lookup started; an earlier request schedules the lookup for that
  moment, and requests meanwhile are merged into it.
* A failed lookup is reported to the channel and retried with exponential
  backoff (1 s, x1.6, jitter 0.2, at most 120 s; as C-core); requests while
  the retry is pending are merged into it.
* Optionally (pyxds only, off by default as C-core has no such thing)
  ``pyxds.dns_refresh_interval_ms`` re-resolves periodically, so a name whose
  address list grows is noticed without a connection failure.

Time comes from the channel's clock (``args.clock``), randomness from
``args.random``; a test injects a :class:`pyxds.resolver.dns.FakeDnsResolver`.
"""

from __future__ import annotations

from typing import Any

from pyxds.clock import Timer
from pyxds.lb.api import Endpoint
from pyxds.resolver.api import ResolverArgs, ResolverResult
from pyxds.resolver.dns import DnsResolver, default_dns_resolver
from pyxds.resolver.static_resolver import StaticResolver
from pyxds.status import Status
from pyxds.xds.backoff import ExponentialBackoff

MIN_TIME_OPTION = "grpc.dns_min_time_between_resolutions_ms"
REFRESH_OPTION = "pyxds.dns_refresh_interval_ms"
DEFAULT_MIN_TIME = 30.0


def _seconds(options: Any, key: str, default: float) -> float:
    value = dict(options or {}).get(key)
    if value is None:
        return default
    try:
        ms = int(value)
    except (TypeError, ValueError):
        return default
    return max(0.0, ms / 1000.0)


class DnsTargetResolver(StaticResolver):
    """See the module docstring."""

    def __init__(
        self, args: ResolverArgs, host: str, port: int, dns: DnsResolver | None = None
    ) -> None:
        super().__init__(args, [])
        self._host, self._port = host, port
        self._dns = dns or default_dns_resolver()
        self._min_time = _seconds(args.options, MIN_TIME_OPTION, DEFAULT_MIN_TIME)
        self._refresh = _seconds(args.options, REFRESH_OPTION, 0.0)
        self._backoff = ExponentialBackoff(args.random)
        self._last_start: float | None = None
        self._busy = False
        self._cancel_lookup: Any = None
        self._next: Timer | None = None  # rate-limited request or failure retry
        self._refresh_timer: Timer | None = None
        self.lookups = 0  # how many lookups started (config_dump, tests)

    # -- Resolver API (any thread): hop onto the serializer ----------------------

    def start(self) -> None:
        self._args.serializer.run(self._resolve_now)

    def request_reresolution(self) -> None:
        self._args.serializer.run(self._on_request)

    def shutdown(self) -> None:
        self._shutdown = True
        self._args.serializer.run(self._stop)

    # -- on the serializer ---------------------------------------------------------

    def _on_request(self) -> None:
        if self._shutdown or self._busy or self._next is not None:
            return  # merged into the lookup running or scheduled
        now = self._args.clock.now()
        wait = 0.0 if self._last_start is None else self._last_start + self._min_time - now
        if wait <= 0:
            self._resolve_now()
        else:
            self._next = self._args.clock.call_later(wait, self._timer_fired)

    def _timer_fired(self) -> None:
        self._next = None
        self._resolve_now()

    def _refresh_fired(self) -> None:
        self._refresh_timer = None
        if not self._busy and self._next is None:
            self._resolve_now()

    def _resolve_now(self) -> None:
        if self._shutdown or self._busy:
            return
        if self._refresh_timer is not None:
            self._refresh_timer.cancel()
            self._refresh_timer = None
        self._busy = True
        self._last_start = self._args.clock.now()
        self.lookups += 1
        run = self._args.serializer.run
        self._cancel_lookup = self._dns.resolve(
            self._host, self._port, lambda result: run(lambda: self._done(result))
        )

    def _done(self, result: Any) -> None:
        self._busy = False
        self._cancel_lookup = None
        if self._shutdown:
            return
        if isinstance(result, Status):
            self._args.on_result(ResolverResult(endpoints=result))
            self._next = self._args.clock.call_later(self._backoff.next_delay(), self._timer_fired)
            return
        self._backoff.reset()
        self._addresses = list(result)
        resolved = self._result()
        if isinstance(resolved.endpoints, list):
            resolved = ResolverResult(
                endpoints=[Endpoint((a,)) for a in self._addresses],
                lb_policy=resolved.lb_policy,
                config_selector=resolved.config_selector,
            )
        self._args.on_result(resolved)
        if self._refresh > 0:
            self._refresh_timer = self._args.clock.call_later(self._refresh, self._refresh_fired)

    def _stop(self) -> None:
        for timer in (self._next, self._refresh_timer):
            if timer is not None:
                timer.cancel()
        self._next = self._refresh_timer = None
        if self._cancel_lookup is not None:
            self._cancel_lookup()
            self._cancel_lookup = None

    def config_dump(self) -> dict[str, Any]:
        return {
            "resolver": "dns",
            "host": self._host,
            "port": self._port,
            "addresses": list(self._addresses),
            "lookups": self.lookups,
            "min_time_between_resolutions_s": self._min_time,
            "refresh_interval_s": self._refresh,
        }
