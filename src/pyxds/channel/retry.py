"""The retry decision of one RPC, sans I/O (gRFC A6 "Retry Policy", A44).

One :class:`RetryState` per RPC that needs one (made on its first failed
attempt, so a successful RPC never builds it).  The call adapters (sync
blocking, sync non-blocking, asyncio) feed it each attempt's end and do
what it answers: ``None`` = the RPC ends with that attempt's status, a
number = start a new attempt (a fresh pick) after that many seconds.  It
never sleeps, reads no clock and draws randomness only from the injected
``rng``.

Rules, in order (A6 "Summary of Retry and Hedging Logic", "Transparent
Retries", "When Retries are Valid", "Pushback"):

1. OK: the RPC succeeded (the throttle gets its ``token_ratio``).
2. The attempt never reached the server application (:func:`not_sent`)
   and the RPC has not committed: sent again at once, without counting as
   an attempt nor as a throttle failure (transparent retry; once, as C-core
   retries a refused stream once).  A failed pick is not a transparent
   retry: A6 hands it to the policy (a drop is never retried).
3. Committed (response headers received, or the request buffer overflowed):
   never retried.
4. No policy, or a code the policy does not list: not retried.
5. A retryable code counts as a failure for the throttle; a throttle at or
   below half its tokens stops retries.
6. Server pushback ``grpc-retry-pushback-ms``: negative or unparsable means
   "do not retry"; otherwise the retry waits exactly that long and the
   backoff starts over from ``initial_backoff``.
7. ``max_attempts`` reached: not retried.
8. Otherwise wait ``uniform(0, current_backoff)``, then
   ``current_backoff = min(current_backoff * multiplier, max_backoff)``.

The adapters keep the deadline: a wait that would end past it ends the RPC
with DEADLINE_EXCEEDED at the deadline instead (the RPC never outlives it).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import grpc

from pyxds.lb.api import Status
from pyxds.resolver.retry_policy import RetryPolicy, RetryThrottle

__all__ = ["PREVIOUS_ATTEMPTS_KEY", "PUSHBACK_KEY", "RetryState", "not_sent", "pushback_of"]

#: A6 "Exposed Retry Metadata"
PREVIOUS_ATTEMPTS_KEY = "grpc-previous-rpc-attempts"
#: A6 "Pushback"
PUSHBACK_KEY = "grpc-retry-pushback-ms"

#: UNAVAILABLE texts that mean the RPC never left the client, or the server
#: refused the stream before its application saw it, so sending it again on
#: a new pick is safe (A6 "Transparent Retries").
_NOT_SENT_MARKERS = (
    "failed to connect to all addresses",
    "Cannot invoke RPC",
    "REFUSED_STREAM",
    # C-core's text for RST_STREAM(REFUSED_STREAM): the server never saw it
    "Received RST_STREAM with error code 7)",
    "Stream refused",
    "Channel closed!",
    # a stream above the GOAWAY's last-stream-id: the server never saw it
    "GOAWAY received",
)


def not_sent(code: grpc.StatusCode | None, details: str | None) -> bool:
    """Whether a failed subchannel call never reached the server application."""
    if code is not grpc.StatusCode.UNAVAILABLE:
        return False
    text = details or ""
    return any(marker in text for marker in _NOT_SENT_MARKERS)


_NO_PUSHBACK = -2.0
_STOP = -1.0


def pushback_of(trailing_metadata: Sequence[tuple[str, Any]] | None) -> float:
    """The server's pushback in seconds; ``-1.0``: do not retry; ``-2.0``:
    none given.  A6: "an ASCII encoded signed 32-bit integer ... negative or
    unparseable ... [means] not to retry at all"."""
    if not trailing_metadata:
        return _NO_PUSHBACK
    for key, value in trailing_metadata:
        if key != PUSHBACK_KEY:
            continue
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                return _STOP
        text = str(value)
        if not text or not (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
            return _STOP
        ms = int(text)
        if ms < 0 or ms > 2**31 - 1:
            return _STOP
        return ms / 1000.0
    return _NO_PUSHBACK


class RetryState:
    """See the module docstring."""

    __slots__ = ("policy", "throttle", "rng", "attempts", "transparent_left", "_backoff")

    def __init__(
        self,
        policy: RetryPolicy | None,
        throttle: RetryThrottle | None,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy
        self.throttle = throttle
        self.rng = rng or random.Random()
        #: attempts counted against ``max_attempts`` so far (transparent
        #: retries are not counted)
        self.attempts = 1
        self.transparent_left = 1
        self._backoff = policy.initial_backoff if policy is not None else 0.0

    @property
    def previous_attempts(self) -> int:
        """The ``grpc-previous-rpc-attempts`` value of the next attempt."""
        return self.attempts - 1

    def on_attempt_end(
        self,
        status: Status,
        trailing_metadata: Sequence[tuple[str, Any]] | None = None,
        committed: bool = False,
        pick_failed: bool = False,
    ) -> float | None:
        """Seconds to wait before the next attempt, or None: the RPC ends
        with ``status``.  ``pick_failed``: the attempt's pick failed (A6:
        handled by the policy, never a transparent retry)."""
        code = status.code
        if code is grpc.StatusCode.OK:
            if self.throttle is not None:
                self.throttle.record_success()
            return None
        if (
            not committed
            and not pick_failed
            and self.transparent_left > 0
            and not_sent(code, status.details)
        ):
            self.transparent_left -= 1
            return 0.0
        policy = self.policy
        if policy is None or code not in policy.retryable_codes:
            # A6: only retryable codes (and pushback) count for throttling
            return None
        allowed = self.throttle.record_failure() if self.throttle is not None else True
        if committed or not allowed:
            return None
        pushback = pushback_of(trailing_metadata)
        if pushback == _STOP:
            return None
        if self.attempts >= policy.max_attempts:
            return None
        self.attempts += 1
        if pushback >= 0:
            self._backoff = policy.initial_backoff
            return pushback
        delay = self.rng.uniform(0, self._backoff)
        self._backoff = min(self._backoff * policy.backoff_multiplier, policy.max_backoff)
        return delay
