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
2. The attempt never reached the server application and the RPC has not
   committed: sent again at once, without counting as an attempt nor as a
   throttle failure (A6 "Transparent Retries").  One that never left the
   client (:func:`never_left_client`: its subchannel's connection was gone)
   is sent again until the deadline, and :attr:`RetryState.wait_for_new_picker`
   tells the adapter not to pick with the picker that chose that connection
   again (it was built before the loss was known); one the server refused
   unseen (:func:`refused_unseen`) is sent again once.  A failed pick is not
   a transparent retry: A6 hands it to the policy (a drop is never retried).
   A GOAWAY refusal from the transport (subchannel connection) that
   refused the RPC's previous attempt with a GOAWAY too: the attempt was
   started on a connection known to be going away, so it never left the
   client, as the first case (C-core fails such a stream before it goes on
   the wire and retries it until the deadline; the grpcio channels under
   pyxds's subchannels, retries off, word it as the refusal of a sent one).
3. Committed (response headers received, or the request buffer overflowed):
   never retried.
4. No policy, or a code the policy does not list: not retried.
5. A retryable code counts as a failure for the throttle; a throttle at or
   below half its tokens stops retries.  A pushback saying "do not retry"
   counts as a failure whatever the code (A6 "Throttling Retry Attempts":
   "or that receive a pushback response indicating not to retry"; grpc-go
   and grpc-java count it too, grpcio 1.85's C-core only with a retryable
   code: ``docs/differences-from-c-core.md``).
6. Server pushback ``grpc-retry-pushback-ms``: negative or unparsable means
   "do not retry"; otherwise the retry waits exactly that long and the
   backoff starts over from ``initial_backoff``.
7. ``max_attempts`` reached: not retried.
8. Otherwise wait ``current_backoff * uniform(0.8, 1.2)`` (A6 "Exponential
   Backoff": jitter of plus or minus 0.2, as C-core's and grpc-go's), then
   ``current_backoff = min(current_backoff * multiplier, max_backoff)``.

The adapters keep the deadline: a wait that would end past it ends the RPC
with DEADLINE_EXCEEDED at the deadline instead (the RPC never outlives it).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import grpc

from pyxds.resolver.retry_policy import RetryPolicy, RetryThrottle
from pyxds.status import Status

__all__ = [
    "PREVIOUS_ATTEMPTS_KEY",
    "PUSHBACK_KEY",
    "RetryState",
    "goaway_refused",
    "never_left_client",
    "not_sent",
    "pushback_of",
    "refused_unseen",
]

#: A6 "Exposed Retry Metadata"
PREVIOUS_ATTEMPTS_KEY = "grpc-previous-rpc-attempts"
#: A6 "Pushback"
PUSHBACK_KEY = "grpc-retry-pushback-ms"

#: UNAVAILABLE texts of an attempt that never left the client (A6
#: "Transparent Retries", case 2): the subchannel's grpcio channel had no
#: connection, or was closed, when the attempt was handed to it.
NEVER_LEFT_CLIENT = (
    "failed to connect to all addresses",
    "Cannot invoke RPC",
    "Channel closed!",
)
#: grpcio's text of a stream its connection's GOAWAY refused
GOAWAY = "GOAWAY received"
#: UNAVAILABLE texts of an attempt the server refused before its application
#: saw it (A6 case 3).
REFUSED_UNSEEN = (
    "REFUSED_STREAM",
    # C-core's text for RST_STREAM(REFUSED_STREAM)
    "Received RST_STREAM with error code 7)",
    "Stream refused",
    # a stream above the GOAWAY's last-stream-id
    GOAWAY,
)


def never_left_client(code: grpc.StatusCode | None, details: str | None) -> bool:
    """A6 case 2: the attempt never left the client."""
    return code is grpc.StatusCode.UNAVAILABLE and any(
        marker in (details or "") for marker in NEVER_LEFT_CLIENT
    )


def refused_unseen(code: grpc.StatusCode | None, details: str | None) -> bool:
    """A6 case 3: the server refused the attempt before its application saw it."""
    return code is grpc.StatusCode.UNAVAILABLE and any(
        marker in (details or "") for marker in REFUSED_UNSEEN
    )


def goaway_refused(code: grpc.StatusCode | None, details: str | None) -> bool:
    """The attempt's connection refused it with a GOAWAY (A6 case 3, or case
    2 when that connection had refused the RPC so before)."""
    return code is grpc.StatusCode.UNAVAILABLE and GOAWAY in (details or "")


def not_sent(code: grpc.StatusCode | None, details: str | None) -> bool:
    """Whether a failed subchannel call never reached the server application."""
    return never_left_client(code, details) or refused_unseen(code, details)


#: A6 "Exponential Backoff": "Jitter of plus or minus 0.2 is applied to the
#: backoff delay"
_JITTER_LOW = 0.8
_JITTER_HIGH = 1.2

_NO_PUSHBACK = -2.0
_STOP = -1.0


def pushback_of(trailing_metadata: Sequence[tuple[str, Any]] | None) -> float:
    """The server's pushback in seconds; ``-1.0``: do not retry; ``-2.0``:
    none given.  A6: "an ASCII encoded signed 32-bit integer ... negative or
    unparseable ... [means] not to retry at all".  Given more than once, the
    last value counts (A6 says nothing; grpcio 1.85's C-core and grpc-java
    read the last one, seen live: "-1" then "10" is retried after 10 ms)."""
    if not trailing_metadata:
        return _NO_PUSHBACK
    value: Any = None
    for key, item in trailing_metadata:
        if key == PUSHBACK_KEY:
            value = item
    if value is None:
        return _NO_PUSHBACK
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return _STOP
    text = str(value)
    if not text.isascii() or not (text.isdigit() or (text[:1] == "-" and text[1:].isdigit())):
        return _STOP
    ms = int(text)
    if ms < 0 or ms > 2**31 - 1:
        return _STOP
    return ms / 1000.0


class RetryState:
    """See the module docstring."""

    __slots__ = (
        "policy",
        "throttle",
        "rng",
        "attempts",
        "refusals_left",
        "wait_for_new_picker",
        "_backoff",
    )

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
        self.refusals_left = 1
        #: the last answer was a transparent retry of an attempt that never
        #: left the client: the next pick needs a newer picker
        self.wait_for_new_picker = False
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
        going_away: bool = False,
    ) -> float | None:
        """Seconds to wait before the next attempt, or None: the RPC ends
        with ``status``.  ``pick_failed``: the attempt's pick failed (A6:
        handled by the policy, never a transparent retry).  ``going_away``:
        the attempt went to a connection that had refused this RPC with a
        GOAWAY before (rule 2)."""
        code = status.code
        self.wait_for_new_picker = False
        if code is grpc.StatusCode.OK:
            if self.throttle is not None:
                self.throttle.record_success()
            return None
        if not committed and not pick_failed:
            if never_left_client(code, status.details) or (
                going_away and goaway_refused(code, status.details)
            ):
                self.wait_for_new_picker = True
                return 0.0
            if self.refusals_left > 0 and refused_unseen(code, status.details):
                self.refusals_left -= 1
                return 0.0
        policy = self.policy
        if policy is None or code not in policy.retryable_codes:
            # A6 "Throttling": besides retryable codes, only "a pushback
            # response indicating not to retry" counts as a failure
            if self.throttle is not None and pushback_of(trailing_metadata) == _STOP:
                self.throttle.record_failure()
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
        delay = self._backoff * self.rng.uniform(_JITTER_LOW, _JITTER_HIGH)
        self._backoff = min(self._backoff * policy.backoff_multiplier, policy.max_backoff)
        return delay
