"""Retry policy and retry throttling as the channel applies them (gRFC A6, A44).

Data only, shared by the two places a policy comes from:

* an xDS route (or its virtual host) ``retry_policy`` (A44
  "Configuration"): ``retry_on`` codes, ``num_retries`` (attempts =
  num_retries + 1), ``retry_back_off`` base/max, multiplier 2;
* a service config ``methodConfig[].retryPolicy`` (A6 "Retry Policy").

Either way the attempt count is capped at :data:`MAX_ATTEMPTS_CAP` (A6
"Limits on Retries and Hedges": a client-side maximum of 5).

:class:`RetryThrottle` is A6's per-channel token bucket
("Throttling Retry Attempts and Hedged RPCs").  It is shared by the RPCs
of one channel from any thread; its state is one float guarded by a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import grpc

from pyxds._values import dataclass

__all__ = ["MAX_ATTEMPTS_CAP", "RetryPolicy", "RetryThrottle", "XDS_RETRY_CODES"]

#: A6: "maxAttempts ... a client-side maximum value of 5".
MAX_ATTEMPTS_CAP = 5

#: A44: the ``retry_on`` names gRPC honours (others are ignored).
XDS_RETRY_CODES: dict[str, grpc.StatusCode] = {
    "cancelled": grpc.StatusCode.CANCELLED,
    "deadline-exceeded": grpc.StatusCode.DEADLINE_EXCEEDED,
    "internal": grpc.StatusCode.INTERNAL,
    "resource-exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
}


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """One RPC's retry policy (A6 ``retryPolicy``).

    ``max_attempts`` counts the first attempt and is already capped.
    Backoff (A6 "Exponential Backoff"): the n-th retry waits
    ``min(initial_backoff * multiplier**(n-1), max_backoff) * random(0.8,
    1.2)`` (so slightly below ``initial_backoff`` or above ``max_backoff``
    at times, as A6 says).
    """

    max_attempts: int
    initial_backoff: float
    max_backoff: float
    backoff_multiplier: float
    retryable_codes: frozenset[grpc.StatusCode]

    @classmethod
    def from_xds(
        cls,
        retry_on: Iterable[str],
        num_retries: int,
        base_interval: float,
        max_interval: float,
    ) -> RetryPolicy | None:
        """A44's mapping of an RDS ``RetryPolicy``; None when no listed
        code is one gRPC supports (nothing would ever be retried).  A44:
        intervals under 1 ms are treated as 1 ms."""
        codes = frozenset(XDS_RETRY_CODES[c] for c in retry_on if c in XDS_RETRY_CODES)
        if not codes:
            return None
        return cls(
            max_attempts=min(num_retries + 1, MAX_ATTEMPTS_CAP),
            initial_backoff=max(base_interval, 0.001),
            max_backoff=max(max_interval, 0.001),
            backoff_multiplier=2.0,
            retryable_codes=codes,
        )


class RetryThrottle:
    """A6 retry throttling: ``token_count`` starts at ``max_tokens``; a
    failed RPC (a retryable code, or pushback saying stop) takes 1, a
    successful one adds ``token_ratio``; retries are allowed only while
    ``token_count > max_tokens / 2``."""

    __slots__ = ("max_tokens", "token_ratio", "_tokens", "_threshold", "_lock")

    def __init__(self, max_tokens: int, token_ratio: float) -> None:
        self.max_tokens = float(max_tokens)
        # A6: "Decimal places beyond 3 are ignored."
        self.token_ratio = int(token_ratio * 1000) / 1000
        self._tokens = float(max_tokens)
        self._threshold = self.max_tokens / 2
        self._lock = threading.Lock()

    @property
    def tokens(self) -> float:
        return self._tokens

    def record_success(self) -> None:
        with self._lock:
            self._tokens = min(self.max_tokens, self._tokens + self.token_ratio)

    def record_failure(self) -> bool:
        """Take a token for a failure; True while retries stay allowed."""
        with self._lock:
            self._tokens = max(0.0, self._tokens - 1)
            return self._tokens > self._threshold

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RetryThrottle)
            and other.max_tokens == self.max_tokens
            and other.token_ratio == self.token_ratio
        )

    def __hash__(self) -> int:
        return hash((self.max_tokens, self.token_ratio))
