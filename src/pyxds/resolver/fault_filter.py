"""The xDS fault injection filter on the client (gRFC A33), an A39 filter.

Config: ``envoy.extensions.filters.http.fault.v3.HTTPFault`` (already
validated by LDS/RDS: valid durations; an unknown percentage denominator
is HUNDRED, as C-core 1.85 reads it), turned into a frozen
:class:`FaultConfig`:

* abort: ``grpc_status``, or ``http_status`` mapped to gRPC as in gRPC's
  "HTTP to gRPC Status Code Mapping" (A33 "Status Code Mapping"; 200 is
  UNKNOWN, A33 "200/OK Error Injection", as grpc-go and grpc-java: C-core
  1.85 injects nothing for it), or ``header_abort``: the code comes from the
  RPC's ``x-envoy-fault-abort-request`` (an HTTP status, mapped the same
  way; it wins over the other, as in grpc-go and grpc-java) or
  ``x-envoy-fault-abort-grpc-request`` metadata (A33 "Header matching";
  C-core 1.85 reads only the second).  A gRPC code header that is a number
  but no code (17, -1) aborts with UNKNOWN, as all three do; one that is no
  number is ignored (A33: "invalid headers will be ignored"; grpc-go,
  grpc-java; C-core 1.85 aborts with UNKNOWN).  An abort code OK
  (``grpc_status`` 0, or a header of 0) ends the RPC at once with OK, no
  response and no call made (A33 "200/OK Error Injection", as grpc-go and
  grpc-java; ``channel.calls.OkEndCall``, ``channel.ok_end``); C-core 1.85
  injects nothing;
* delay: ``fixed_delay`` (zero: no delay, as C-core), or ``header_delay``
  (milliseconds from ``x-envoy-fault-delay-request``);
* each with a ``percentage`` (numerator over HUNDRED, TEN_THOUSAND or
  MILLION; unset: 0, never).  With header control a percentage header sets
  the numerator (over the config's denominator), capped at the config's
  (A33 "Header matching"); invalid headers are ignored.  The header names
  are A33's (and Envoy's, grpc-go's, grpc-java's):
  ``x-envoy-fault-abort-request-percentage`` and
  ``x-envoy-fault-delay-request-percentage`` (C-core 1.85 reads
  ``x-envoy-fault-abort-percentage`` for aborts instead);
* ``max_active_faults``: at most that many RPCs of the whole process are
  under an injected fault at once (A33 "Maximum active faults"); an RPC
  drawn for a fault while the limit is reached gets none, neither delay
  nor abort (grpc-go, grpc-java; C-core 1.85 still aborts one drawn for
  both).

Per RPC (:meth:`FaultInjector.on_call`): abort and delay are drawn
independently, each from its own random number (A33 "Evaluate Possibility
Fraction"); the RPC waits the delay, then fails with the abort code and
C-core's text "Fault injected", before any pick.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.resolver.http_filters import CallFilter, FilterVerdict, HttpFilter, register_built_in
from pyxds.status import Status

__all__ = ["FAULT_TYPE", "FaultConfig", "FaultFilter", "FaultInjector", "http_to_grpc"]

FAULT_TYPE = "envoy.extensions.filters.http.fault.v3.HTTPFault"
#: C-core's details of an injected abort
FAULT_MESSAGE = "Fault injected"

ABORT_HTTP_HEADER = "x-envoy-fault-abort-request"
ABORT_GRPC_HEADER = "x-envoy-fault-abort-grpc-request"
#: A33's name (C-core 1.85 reads x-envoy-fault-abort-percentage instead)
ABORT_PERCENT_HEADER = "x-envoy-fault-abort-request-percentage"
DELAY_HEADER = "x-envoy-fault-delay-request"
DELAY_PERCENT_HEADER = "x-envoy-fault-delay-request-percentage"

_DENOMINATORS = (100, 10_000, 1_000_000)


def _denominator(value: int) -> int:
    """A FractionalPercent denominator; a value past MILLION (the enum is
    open) is HUNDRED, as C-core 1.85 reads it."""
    return _DENOMINATORS[value] if 0 <= value < len(_DENOMINATORS) else 100


_CODES = {code.value[0]: code for code in grpc.StatusCode}
_OK = grpc.StatusCode.OK
_OK_END = Status(_OK, "")


def http_to_grpc(http_status: int) -> grpc.StatusCode:
    """gRPC's HTTP-to-gRPC status mapping (doc/http-grpc-status-mapping.md):
    200 too is UNKNOWN (A33 "200/OK Error Injection": what a client makes of
    an HTTP 200 without ``grpc-status``)."""
    if http_status == 400:
        return grpc.StatusCode.INTERNAL
    if http_status == 401:
        return grpc.StatusCode.UNAUTHENTICATED
    if http_status == 403:
        return grpc.StatusCode.PERMISSION_DENIED
    if http_status == 404:
        return grpc.StatusCode.UNIMPLEMENTED
    if http_status in (429, 502, 503, 504):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.UNKNOWN


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """An HTTPFault as the client applies it (module docstring)."""

    abort_code: grpc.StatusCode | None = None
    abort_from_headers: bool = False
    abort_numerator: int = 0
    abort_denominator: int = 100
    delay: float | None = None
    delay_from_headers: bool = False
    delay_numerator: int = 0
    delay_denominator: int = 100
    max_active_faults: int | None = None

    @property
    def injects(self) -> bool:
        abort = self.abort_code is not None or self.abort_from_headers
        delay = self.delay is not None or self.delay_from_headers
        return (abort and self.abort_numerator > 0) or (delay and self.delay_numerator > 0)

    @classmethod
    def parse(cls, data: bytes) -> FaultConfig:
        from envoy.extensions.filters.http.fault.v3 import fault_pb2

        fault = fault_pb2.HTTPFault()
        fault.ParseFromString(data)
        kwargs: dict[str, Any] = {}
        if fault.HasField("abort"):
            abort = fault.abort
            which = abort.WhichOneof("error_type")
            if which == "grpc_status":
                kwargs["abort_code"] = _CODES.get(abort.grpc_status, grpc.StatusCode.UNKNOWN)
            elif which == "http_status":
                kwargs["abort_code"] = http_to_grpc(abort.http_status)
            elif which == "header_abort":
                kwargs["abort_from_headers"] = True
            if abort.HasField("percentage"):
                kwargs["abort_numerator"] = abort.percentage.numerator
                kwargs["abort_denominator"] = _denominator(abort.percentage.denominator)
        if fault.HasField("delay"):
            delay = fault.delay
            which = delay.WhichOneof("fault_delay_secifier")
            if which == "fixed_delay":
                d = delay.fixed_delay
                if d.seconds or d.nanos:  # zero: no delay (C-core)
                    kwargs["delay"] = d.seconds + d.nanos / 1e9
            elif which == "header_delay":
                kwargs["delay_from_headers"] = True
            if delay.HasField("percentage"):
                kwargs["delay_numerator"] = delay.percentage.numerator
                kwargs["delay_denominator"] = _denominator(delay.percentage.denominator)
        if fault.HasField("max_active_faults"):
            kwargs["max_active_faults"] = fault.max_active_faults.value
        return cls(**kwargs)


class _ActiveFaults:
    """The process-wide count of RPCs under an injected fault (A33)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def try_enter(self, limit: int | None) -> bool:
        with self._lock:
            if limit is not None and self.count >= limit:
                return False
            self.count += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


ACTIVE_FAULTS = _ActiveFaults()


def _header(metadata: Sequence[tuple[str, Any]], key: str) -> str | None:
    for k, v in metadata:
        if k == key:
            return v.decode("ascii", "replace") if isinstance(v, bytes) else str(v)
    return None


def _uint(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def _int(text: str | None) -> int | None:
    """A signed decimal integer, else None (not a number: an invalid header)."""
    if text is None:
        return None
    text = text.strip()
    digits = text[1:] if text[:1] in ("-", "+") else text
    return int(text) if digits.isascii() and digits.isdigit() else None


class FaultInjector(CallFilter):
    """One route's fault injection (module docstring)."""

    __slots__ = ("config", "_active")

    def __init__(self, config: FaultConfig, active: _ActiveFaults = ACTIVE_FAULTS) -> None:
        self.config = config
        self._active = active

    def on_call(
        self, metadata: Sequence[tuple[str, Any]], rng: random.Random
    ) -> FilterVerdict | None:
        cfg = self.config
        abort_code = cfg.abort_code
        abort_numerator = cfg.abort_numerator
        if cfg.abort_from_headers:
            abort_code = None
            http_status = _uint(_header(metadata, ABORT_HTTP_HEADER))
            if http_status is not None and 200 <= http_status < 600:
                abort_code = http_to_grpc(http_status)  # it wins (grpc-go, grpc-java)
            else:  # absent or invalid: ignored (A33)
                grpc_code = _int(_header(metadata, ABORT_GRPC_HEADER))
                if grpc_code is not None:
                    # 0 is OK (A33's OK abort); a number that is no code is
                    # UNKNOWN (C-core, grpc-go, grpc-java); one that is no
                    # number is ignored (A33)
                    abort_code = _CODES.get(grpc_code, grpc.StatusCode.UNKNOWN)
            percent = _uint(_header(metadata, ABORT_PERCENT_HEADER))
            if percent is not None:
                abort_numerator = min(percent, abort_numerator)
        delay = cfg.delay
        delay_numerator = cfg.delay_numerator
        if cfg.delay_from_headers:
            ms = _uint(_header(metadata, DELAY_HEADER))
            delay = ms / 1000.0 if ms else None  # 0: no delay, as C-core
            percent = _uint(_header(metadata, DELAY_PERCENT_HEADER))
            if percent is not None:
                delay_numerator = min(percent, delay_numerator)
        # each fault its own draw (A33 "Evaluate Possibility Fraction")
        do_abort = abort_code is not None and rng.randrange(cfg.abort_denominator) < abort_numerator
        do_delay = delay is not None and rng.randrange(cfg.delay_denominator) < delay_numerator
        if not (do_abort or do_delay):
            return None
        if not self._active.try_enter(cfg.max_active_faults):
            return None
        abort = None
        if do_abort and abort_code is not None:
            # OK: the RPC ends at once with OK and no details (A33)
            abort = _OK_END if abort_code is _OK else Status(abort_code, FAULT_MESSAGE)
        return FilterVerdict(
            delay=delay if do_delay and delay else 0.0,
            abort=abort,
            done=_Once(self._active.leave),
        )


class _Once:
    __slots__ = ("_fn",)

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def __call__(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn()


class FaultFilter(HttpFilter):
    """The A33 filter type."""

    type_urls = (FAULT_TYPE,)

    def call_filter(self, config: bytes) -> CallFilter | None:
        parsed = FaultConfig.parse(config)
        if not parsed.injects:
            return None
        return FaultInjector(parsed)


# loaded at the first route chain naming the type (http_filters._ON_FIRST_USE)
register_built_in(FaultFilter())
